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

use std::sync::{Arc, OnceLock};

use brownout_protocol::{
    Command, EntryApplied, FeatureState, Reason, ResolvedInstance, SignedCommand, Tier, VerifyError,
};
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
        /// Which `instances` entries addressed this instance (reported in the ack).
        entry: Option<EntryApplied>,
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

/// Verifies `signed` (its signature over the exact bytes with `verifier`: Ed25519 public keys by
/// key id, or the HMAC compatibility key; then the cluster) and applies it when newer.
/// Refusals are counted in the handle's metrics and logged.
pub fn receive(
    handle: &ControlHandle,
    verifier: &brownout_protocol::CommandVerifier,
    signed: &SignedCommand,
    now_ms: u64,
) -> Receipt {
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
    let cmd = match verifier.verify_for(signed, handle.cluster()) {
        Ok(c) => c,
        Err(e) => {
            let reason = match &e {
                VerifyError::MalformedSignature => "malformed_signature",
                VerifyError::BadSignature => "bad_signature",
                VerifyError::InvalidJson(_) => "invalid_json",
                VerifyError::WrongCluster { .. } => "wrong_cluster",
                VerifyError::SchemeNotAccepted(_) => "scheme_not_accepted",
                VerifyError::UnknownKey(_) => "unknown_key",
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
    let entry_before = handle.instance_entry();
    match handle.apply(cmd, now_ms) {
        Ok(true) => {
            handle.metrics().applied_total.inc();
            let a = handle.current();
            let entry = a.command.instance_entry(handle.instance_id());
            // A lease refresh re-sends the tier in force every few seconds: log changes only.
            if a.command.tier == tier_before {
                tracing::debug!(tier = %a.command.tier, epoch = key_new.0, version = key_new.1, "degradation command refreshed");
            } else {
                tracing::info!(tier = %a.command.tier, from = %tier_before, epoch = key_new.0, version = key_new.1, "degradation command applied");
            }
            if entry.as_ref().map(|e| &e.entry) != entry_before.as_ref().map(|e| &e.entry) {
                let e = entry.clone().unwrap_or_default();
                tracing::info!(
                    instance = handle.instance_id(),
                    drain = e.draining(),
                    max_num_seqs = ?e.entry.max_num_seqs,
                    admit_rps = ?e.entry.admit_rps,
                    reason = %e.entry.reason,
                    "instance entry applied"
                );
            }
            Receipt::Applied {
                epoch: key_new.0,
                version: key_new.1,
                applied_at_ms: now_ms,
                entry: entry.map(|e| e.applied),
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

/// Whether a T0 command still holds something a lost control plane must not keep in force
/// (an instance entry, a closed feature or tool breaker, limits).
fn holds_actions(cmd: &Command) -> bool {
    !cmd.instances.is_empty()
        || cmd.features.values().any(|s| !s.is_open())
        || cmd.limits != Default::default()
        || cmd.shed.is_some()
        || !cmd.model_route.is_empty()
}

/// The command one tier below `cmd`, as the serving tier derives it locally when a lease runs
/// out: T3→T2 drops shedding, T2→T1 drops the fallback route and limits, T1→T0 re-enables all.
/// The first step down also drops the `instances` entries (a drain, a ramp or a per-instance
/// `max_num_seqs` must not outlive the control plane that set it). `abort` entries stay: each
/// carries its own deadline.
fn stepped_down(cmd: &Command, now_ms: u64) -> Command {
    let period = cmd.expires_at_ms.saturating_sub(cmd.issued_at_ms).max(1000);
    let mut c = cmd.clone();
    c.tier = cmd.tier.step_down();
    c.issued_at_ms = now_ms;
    c.expires_at_ms = now_ms.saturating_add(period);
    c.shed = None;
    c.instances.clear();
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
        detail: if cmd.tier == Tier::T0 {
            format!(
                "command {}:{} expired without a refresh; its instance entries, breakers and limits were dropped",
                cmd.epoch, cmd.version
            )
        } else {
            format!(
                "command {}:{} expired without a refresh; stepped down from {} to {}",
                cmd.epoch, cmd.version, cmd.tier, c.tier
            )
        },
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

/// Checks an instance id (`--instance-id`, `BROWNOUT_INSTANCE_ID`): 1–128 bytes of visible
/// ASCII, not `*` (the key of the entry for every instance).
///
/// # Errors
/// A message saying what is wrong.
pub fn validate_instance_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > 128 {
        return Err(format!(
            "instance id must be 1-128 bytes (got {})",
            id.len()
        ));
    }
    if !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("instance id must be visible ASCII without spaces".into());
    }
    if id == brownout_protocol::ALL_INSTANCES {
        return Err("instance id `*` is reserved (the entry for every instance)".into());
    }
    Ok(())
}

/// Shared, cloneable handle on the degradation state.
#[derive(Debug, Clone)]
pub struct ControlHandle {
    cluster: Arc<str>,
    /// The id commands address this instance by (`instances` keys, the acks hash field).
    instance: Arc<OnceLock<Arc<str>>>,
    tx: Arc<watch::Sender<Arc<Applied>>>,
    metrics: ControlMetrics,
}

impl ControlHandle {
    /// Starts at T0 (everything enabled, primary route, no limits), with no instance id yet: the
    /// first subscriber started on it binds the id it acks under ([`ControlHandle::bind_instance`]).
    pub fn new(cluster: &str) -> ControlHandle {
        let initial = Applied {
            command: Command::normal(cluster, 0, 0, 0, u64::MAX / 2),
            applied_at_ms: 0,
        };
        let (tx, _rx) = watch::channel(Arc::new(initial));
        ControlHandle {
            cluster: cluster.into(),
            instance: Arc::new(OnceLock::new()),
            tx: Arc::new(tx),
            metrics: ControlMetrics::new(),
        }
    }

    /// As [`ControlHandle::new`], addressed as `instance_id`.
    pub fn with_instance(cluster: &str, instance_id: &str) -> ControlHandle {
        let h = ControlHandle::new(cluster);
        h.bind_instance(instance_id);
        h
    }

    /// Sets the instance id if none is set yet (the first binding wins; a different later one is
    /// logged and ignored).
    pub fn bind_instance(&self, instance_id: &str) {
        let got = self.instance.get_or_init(|| instance_id.into());
        if &**got != instance_id {
            tracing::warn!(
                bound = %got, ignored = instance_id,
                "control handle already bound to another instance id"
            );
        }
    }

    /// The instance id (empty when unbound: then only the `"*"` entry applies).
    pub fn instance_id(&self) -> &str {
        self.instance.get().map_or("", |s| s)
    }

    /// This instance's `instances` entry under the command in force.
    pub fn instance_entry(&self) -> Option<ResolvedInstance> {
        self.current().command.instance_entry(self.instance_id())
    }

    /// `max_num_seqs` for this instance: `configured`, lowered by its instance entry's
    /// `max_num_seqs` or else by `limits.max_num_seqs`.
    pub fn max_num_seqs(&self, configured: usize) -> usize {
        self.current()
            .command
            .max_num_seqs_for(self.instance_id())
            .map_or(configured, |m| configured.min(m as usize))
            .max(1)
    }

    /// The command-path counters (register them with [`ControlMetrics::register`]).
    pub fn metrics(&self) -> &ControlMetrics {
        &self.metrics
    }

    /// When the command in force is past its lease (and above T0, or at T0 holding instance
    /// entries, closed features or limits), replaces it with the one tier lower (keeping its `(epoch, version)`, so any newer command still supersedes it) with a new
    /// lease of the same period. Atomic against a concurrent [`ControlHandle::apply`]. Returns the
    /// new tier when it stepped down.
    pub fn step_down_if_expired(&self, now_ms: u64) -> Option<Tier> {
        let mut out = None;
        self.tx.send_if_modified(|cur| {
            let c = &cur.command;
            if (c.tier == Tier::T0 && !holds_actions(c)) || !c.is_expired(now_ms) {
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
            // A T0 command that held instance entries or breakers "steps down" to plain T0.
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
