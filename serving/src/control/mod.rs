//! Degradation state inside the serving tier: what command is in force, and how it arrives.
//!
//! [`ControlHandle`] is the one shared handle the API consults on every request (cheap: an `Arc`
//! load from a `watch` channel) and the one place commands are applied, whichever way they come
//! (Redis subscriber in a later module, or the in-process bus of `brownout demo`).
//!
//! Applying is idempotent and ordered by `(epoch, version)`: an older or equal command changes
//! nothing.

use std::sync::Arc;

use brownout_protocol::{Command, Tier};
use tokio::sync::watch;

/// The command in force and when it was applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub command: Command,
    /// Unix ms when this process applied it (0 for the initial T0 state).
    pub applied_at_ms: u64,
}

/// Why a command was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    #[error("command for cluster {got:?} refused: this instance is in {expected:?}")]
    WrongCluster { expected: String, got: String },
}

/// Shared, cloneable handle on the degradation state.
#[derive(Debug, Clone)]
pub struct ControlHandle {
    cluster: Arc<str>,
    tx: Arc<watch::Sender<Arc<Applied>>>,
}

impl ControlHandle {
    /// Starts at T0 (everything enabled, primary route, no limits).
    pub fn new(cluster: &str) -> ControlHandle {
        let initial = Applied { command: Command::normal(cluster, 0, 0, 0, u64::MAX / 2), applied_at_ms: 0 };
        let (tx, _rx) = watch::channel(Arc::new(initial));
        ControlHandle { cluster: cluster.into(), tx: Arc::new(tx) }
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// The state in force now.
    pub fn current(&self) -> Arc<Applied> {
        self.tx.borrow().clone()
    }

    /// The tier in force now.
    pub fn tier(&self) -> Tier {
        self.tx.borrow().command.tier
    }

    /// A receiver that sees every change (for SSE and the engine's limits).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Applied>> {
        self.tx.subscribe()
    }

    /// Applies `cmd` if it is newer than the one in force. Returns whether it changed anything.
    ///
    /// # Errors
    /// [`ApplyError::WrongCluster`] when the command is for another cluster.
    pub fn apply(&self, cmd: Command, now_ms: u64) -> Result<bool, ApplyError> {
        if cmd.cluster != *self.cluster {
            return Err(ApplyError::WrongCluster { expected: self.cluster.to_string(), got: cmd.cluster });
        }
        let mut changed = false;
        self.tx.send_if_modified(|cur| {
            if cmd.order_key() > cur.command.order_key() {
                *cur = Arc::new(Applied { command: cmd, applied_at_ms: now_ms });
                changed = true;
            }
            changed
        });
        Ok(changed)
    }

    /// Replaces the state regardless of version (lease-expiry step-down is decided locally and
    /// keeps the version of the command it steps down from).
    pub fn replace(&self, applied: Applied) {
        self.tx.send_replace(Arc::new(applied));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newer_commands_apply_once_older_are_ignored() {
        let h = ControlHandle::new("c");
        let mut rx = h.subscribe();
        let mut cmd = Command::normal("c", 1, 5, 10, 1000);
        cmd.tier = Tier::T2;
        assert!(h.apply(cmd.clone(), 11).unwrap());
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        assert!(!h.apply(cmd.clone(), 12).unwrap(), "same version twice changes nothing");
        let mut older = cmd.clone();
        older.version = 4;
        older.tier = Tier::T0;
        assert!(!h.apply(older, 13).unwrap());
        assert_eq!(h.tier(), Tier::T2);
        assert!(!rx.has_changed().unwrap());
        assert!(h.apply(Command::normal("other", 9, 9, 0, 1), 0).is_err());
    }
}
