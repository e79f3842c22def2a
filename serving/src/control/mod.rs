//! Degradation state inside the serving tier: what command is in force, and how it arrives.
//!
//! [`ControlHandle`] is the one shared handle the API consults on every request (cheap: an `Arc`
//! load from a `watch` channel) and the one place commands are applied, whichever way they come
//! (Redis subscriber in a later module, or the in-process bus of `brownout-demo`).
//!
//! Applying is idempotent and ordered by `(epoch, version)`: an older or equal command changes
//! nothing.
//!
//! - [`receive`]: the one verification path every transport uses (signature, cluster, version);
//! - [`subscriber`]: the Redis subscriber (docs/PROTOCOL.md) and its config from the env;
//! - [`inproc`]: the in-process subscriber of `brownout-demo`;
//! - [`http`]: `/v1/features`, its SSE stream and the grey-out demo page.

use std::sync::Arc;

use brownout_protocol::{Command, FeatureState, Reason, SignedCommand, Tier, VerifyError};
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use tokio::sync::watch;

pub mod http;
pub mod inproc;
pub mod subscriber;

pub use http::FeatureCatalog;
pub use subscriber::{SubscriberConfig, SubscriberConfigError, spawn_subscriber};

/// Counters of the command path (`brownout_serving_commands_*`).
#[derive(Debug, Clone)]
pub struct ControlMetrics {
    /// Commands refused, by reason (`bad_signature`, `malformed_signature`, `invalid_json`,
    /// `wrong_cluster`, `older_version`).
    pub refused_total: IntCounterVec,
    /// Commands applied.
    pub applied_total: IntCounter,
    /// Local one-tier step-downs after a command lease expired unrefreshed.
    pub lease_stepdowns_total: IntCounter,
}

impl ControlMetrics {
    /// Every refusal reason, exported at 0 from the start so dashboards and rate() see the series.
    pub const REFUSAL_REASONS: [&'static str; 5] = [
        "bad_signature",
        "malformed_signature",
        "invalid_json",
        "wrong_cluster",
        "older_version",
    ];

    fn new() -> ControlMetrics {
        let m = ControlMetrics::unset();
        for r in ControlMetrics::REFUSAL_REASONS {
            m.refused_total.with_label_values(&[r]);
        }
        m
    }

    fn unset() -> ControlMetrics {
        ControlMetrics {
            refused_total: IntCounterVec::new(
                Opts::new(
                    "brownout_serving_commands_refused_total",
                    "Degradation commands refused, by reason.",
                ),
                &["reason"],
            )
            .expect("valid metric"),
            applied_total: IntCounter::new(
                "brownout_serving_commands_applied_total",
                "Degradation commands applied.",
            )
            .expect("valid metric"),
            lease_stepdowns_total: IntCounter::new(
                "brownout_serving_command_lease_stepdowns_total",
                "One-tier step-downs taken locally because the command lease expired unrefreshed.",
            )
            .expect("valid metric"),
        }
    }

    /// Registers the counters on `registry` (the serving tier's `/metrics`).
    ///
    /// # Errors
    /// When they are already registered there.
    pub fn register(&self, registry: &Registry) -> Result<(), prometheus::Error> {
        registry.register(Box::new(self.refused_total.clone()))?;
        registry.register(Box::new(self.applied_total.clone()))?;
        registry.register(Box::new(self.lease_stepdowns_total.clone()))?;
        Ok(())
    }

    /// Refusals counted for `reason`.
    pub fn refused(&self, reason: &str) -> u64 {
        self.refused_total.with_label_values(&[reason]).get()
    }
}

/// What receiving one signed command did.
#[derive(Debug, Clone, PartialEq)]
pub enum Receipt {
    /// Newer than the state in force: applied.
    Applied {
        epoch: u64,
        version: u64,
        applied_at_ms: u64,
    },
    /// The same `(epoch, version)` as in force: nothing to do (idempotent).
    Unchanged,
    /// Refused (never applied): counted under `reason`.
    Refused {
        reason: &'static str,
        epoch: u64,
        version: u64,
        detail: String,
    },
}

/// Best effort `(epoch, version)` of bytes that failed verification, for the NACK.
fn peek_order(json: &str) -> (u64, u64) {
    let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
    (
        v["epoch"].as_u64().unwrap_or(0),
        v["version"].as_u64().unwrap_or(0),
    )
}

/// Verifies `signed` (HMAC over the exact bytes, cluster) and applies it when newer.
/// Refusals are counted in the handle's metrics and logged.
pub fn receive(handle: &ControlHandle, key: &[u8], signed: &SignedCommand, now_ms: u64) -> Receipt {
    let refused = |reason: &'static str, detail: String, (epoch, version): (u64, u64)| {
        handle
            .metrics()
            .refused_total
            .with_label_values(&[reason])
            .inc();
        tracing::warn!(reason, epoch, version, detail = %detail, "degradation command refused");
        Receipt::Refused {
            reason,
            epoch,
            version,
            detail,
        }
    };
    let cmd = match signed.verify_for(key, handle.cluster()) {
        Ok(c) => c,
        Err(e) => {
            let reason = match &e {
                VerifyError::MalformedSignature => "malformed_signature",
                VerifyError::BadSignature => "bad_signature",
                VerifyError::InvalidJson(_) => "invalid_json",
                VerifyError::WrongCluster { .. } => "wrong_cluster",
            };
            return refused(reason, e.to_string(), peek_order(&signed.json));
        }
    };
    let cur = handle.current().command.order_key();
    let key_new = cmd.order_key();
    if key_new < cur {
        return refused(
            "older_version",
            format!(
                "command {}:{} is older than {}:{} in force",
                key_new.0, key_new.1, cur.0, cur.1
            ),
            key_new,
        );
    }
    let tier_before = handle.tier();
    match handle.apply(cmd, now_ms) {
        Ok(true) => {
            handle.metrics().applied_total.inc();
            let a = handle.current();
            // A lease refresh re-sends the tier in force every few seconds: log changes only.
            if a.command.tier == tier_before {
                tracing::debug!(tier = %a.command.tier, epoch = key_new.0, version = key_new.1, "degradation command refreshed");
            } else {
                tracing::info!(tier = %a.command.tier, from = %tier_before, epoch = key_new.0, version = key_new.1, "degradation command applied");
            }
            Receipt::Applied {
                epoch: key_new.0,
                version: key_new.1,
                applied_at_ms: now_ms,
            }
        }
        Ok(false) => {
            // Equal, or lost a race with a newer one: either way nothing older is in force.
            if handle.current().command.order_key() > key_new {
                refused(
                    "older_version",
                    "a newer command was applied concurrently".into(),
                    key_new,
                )
            } else {
                Receipt::Unchanged
            }
        }
        Err(e) => refused("wrong_cluster", e.to_string(), key_new),
    }
}

/// The command one tier below `cmd`, as the serving tier derives it locally when a lease runs
/// out: T3→T2 drops shedding, T2→T1 drops the fallback route and limits, T1→T0 re-enables all.
fn stepped_down(cmd: &Command, now_ms: u64) -> Command {
    let period = cmd.expires_at_ms.saturating_sub(cmd.issued_at_ms).max(1000);
    let mut c = cmd.clone();
    c.tier = cmd.tier.step_down();
    c.issued_at_ms = now_ms;
    c.expires_at_ms = now_ms.saturating_add(period);
    c.shed = None;
    if c.tier < Tier::T2 {
        c.model_route.clear();
        c.limits = Default::default();
    }
    if c.tier == Tier::T0 {
        for v in c.features.values_mut() {
            *v = FeatureState::Enabled;
        }
    }
    c.reason = Reason {
        trigger: "lease_expired".into(),
        detail: format!(
            "command {}:{} expired without a refresh; stepped down from {} to {}",
            cmd.epoch, cmd.version, cmd.tier, c.tier
        ),
        ..Reason::default()
    };
    c
}

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
    metrics: ControlMetrics,
}

impl ControlHandle {
    /// Starts at T0 (everything enabled, primary route, no limits).
    pub fn new(cluster: &str) -> ControlHandle {
        let initial = Applied {
            command: Command::normal(cluster, 0, 0, 0, u64::MAX / 2),
            applied_at_ms: 0,
        };
        let (tx, _rx) = watch::channel(Arc::new(initial));
        ControlHandle {
            cluster: cluster.into(),
            tx: Arc::new(tx),
            metrics: ControlMetrics::new(),
        }
    }

    /// The command-path counters (register them with [`ControlMetrics::register`]).
    pub fn metrics(&self) -> &ControlMetrics {
        &self.metrics
    }

    /// When the command in force is past its lease (and above T0), replaces it with the one tier
    /// lower (keeping its `(epoch, version)`, so any newer command still supersedes it) with a new
    /// lease of the same period. Atomic against a concurrent [`ControlHandle::apply`]. Returns the
    /// new tier when it stepped down.
    pub fn step_down_if_expired(&self, now_ms: u64) -> Option<Tier> {
        let mut out = None;
        self.tx.send_if_modified(|cur| {
            let c = &cur.command;
            if c.tier == Tier::T0 || !c.is_expired(now_ms) {
                return false;
            }
            let next = stepped_down(c, now_ms);
            out = Some(next.tier);
            *cur = Arc::new(Applied {
                command: next,
                applied_at_ms: now_ms,
            });
            true
        });
        if let Some(t) = out {
            self.metrics.lease_stepdowns_total.inc();
            tracing::warn!(tier = %t, "degradation lease expired without refresh: stepped down one tier");
        }
        out
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
            return Err(ApplyError::WrongCluster {
                expected: self.cluster.to_string(),
                got: cmd.cluster,
            });
        }
        let mut changed = false;
        self.tx.send_if_modified(|cur| {
            if cmd.order_key() > cur.command.order_key() {
                *cur = Arc::new(Applied {
                    command: cmd,
                    applied_at_ms: now_ms,
                });
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
        assert!(
            !h.apply(cmd.clone(), 12).unwrap(),
            "same version twice changes nothing"
        );
        let mut older = cmd.clone();
        older.version = 4;
        older.tier = Tier::T0;
        assert!(!h.apply(older, 13).unwrap());
        assert_eq!(h.tier(), Tier::T2);
        assert!(!rx.has_changed().unwrap());
        assert!(h.apply(Command::normal("other", 9, 9, 0, 1), 0).is_err());
    }
}
