//! [`DegradeHandle`]: the degradation component's shared state (inputs, decisions, the command
//! in force, acks) and its metrics. The HTTP routes ([`super::http`]) and the controller loop
//! ([`super::run`]) both work through it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use brownout_protocol::{AgentSnapshot, Command, Tier};
use prometheus::Registry;
use serde::{Deserialize, Serialize};

use super::acks::{
    AckLedger, AckView, InstanceAckRecord, InstanceActionView, Unacked, action_keys, instance_views,
};
use super::controller::{
    Crossing, Decision, Inputs, InstanceAction, InstanceOverride, Override, PatternRate, SloAlert,
    Transition,
};
use super::metrics::DegradeMetrics;
use super::policy::Policy;
use super::redis::AckEntry;

/// Static configuration of the controller.
#[derive(Debug, Clone)]
pub struct DegradeConfig {
    /// Cluster name (the Redis hash tag).
    pub cluster: String,
    /// This replica's id in the leader lease.
    pub replica_id: String,
    /// What commands are signed with (the Ed25519 private key, or the HMAC compatibility key),
    /// what stored commands and acks are verified with, and the seal of the operator override.
    /// These are the keys at start; a reload hands new ones to the running controller with
    /// [`DegradeHandle::replace_keys`].
    pub keys: brownout_protocol::PlaneKeys,
    pub policy: Policy,
    /// Leader lease period: a dead leader is replaced within it.
    pub leader_lease_ms: u64,
    /// Per Redis operation.
    pub redis_timeout: Duration,
}

impl DegradeConfig {
    /// `keys`: [`brownout_protocol::PlaneKeys`]; a bare byte string is the HMAC compatibility key.
    pub fn new(
        cluster: &str,
        keys: impl Into<brownout_protocol::PlaneKeys>,
        policy: Policy,
    ) -> DegradeConfig {
        DegradeConfig {
            cluster: cluster.to_string(),
            replica_id: format!("cp-{}", uuid::Uuid::new_v4().simple()),
            keys: keys.into(),
            policy,
            leader_lease_ms: 5000,
            redis_timeout: Duration::from_millis(500),
        }
    }
}

/// A stored decision (kept in memory, and passed to the persistence hook).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecisionRecord {
    pub at_ms: u64,
    pub tier: Tier,
    pub previous: Tier,
    pub transition: Transition,
    pub trigger: String,
    pub detail: String,
    pub reasons: Vec<Crossing>,
    pub dry_run: bool,
    /// `(epoch, version)` of the command that carried it, once published.
    pub published: Option<(u64, u64)>,
    /// Per-instance actions in force with this decision (stop-bleed, operator, ramp, retry
    /// waves).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instance_actions: Vec<InstanceAction>,
    /// The acks of those actions' entries by instance (`"*"` included), updated while this is
    /// the latest decision and stored again when they change (the weekly report reads them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub instance_acks: BTreeMap<String, InstanceAckRecord>,
}

/// `GET /api/v1/degrade`.
#[derive(Debug, Clone, Serialize)]
pub struct DegradeStatus {
    pub cluster: String,
    pub replica_id: String,
    pub tier: Tier,
    pub leader_epoch: Option<u64>,
    pub dry_run: bool,
    pub command: Option<Command>,
    pub operator_override: Option<Override>,
    pub step_down_at_ms: Option<u64>,
    pub decisions: Vec<DecisionRecord>,
    pub acks: Vec<AckView>,
    /// Per-instance actions in force and their acks.
    pub instances: Vec<InstanceActionView>,
    /// Operator per-instance actions by instance id (active ones).
    pub instance_overrides: BTreeMap<String, InstanceOverride>,
    /// Set while commands this replica published more than [`UNACKED_WARN_MS`] ago have no
    /// ack from any serving instance (nothing obeys: wrong cluster, key or Redis).
    pub unacked: Option<Unacked>,
}

type PersistHook = Arc<dyn Fn(&DecisionRecord) + Send + Sync>;

/// One alert of an Alertmanager webhook, as the handle keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertChange {
    /// The alert's fingerprint (or its labels, when Alertmanager sent none).
    pub key: String,
    /// `labels.alertname`.
    pub name: String,
    /// `firing` (else `resolved`).
    pub firing: bool,
    /// `endsAt` in ms, 0 when unset.
    pub ends_at_ms: u64,
}

#[derive(Debug, Clone)]
struct AmAlert {
    name: String,
    /// 0 when unset.
    ends_at_ms: u64,
}

/// The handle's mutable state, behind one mutex (never held across an `.await`).
#[derive(Default)]
pub(super) struct Shared {
    snapshots: BTreeMap<String, AgentSnapshot>,
    slo_alerts: Vec<SloAlert>,
    am_alerts: BTreeMap<String, AmAlert>,
    patterns: Vec<PatternRate>,
    pub(super) operator_override: Option<Override>,
    /// An override change not yet written to Redis (`Some(None)`: a removal).
    pub(super) override_to_share: Option<Option<Override>>,
    /// Counts operator override changes made here (set or removed).
    pub(super) override_seq: u64,
    last: Option<Decision>,
    history: VecDeque<DecisionRecord>,
    pub(super) command: Option<Command>,
    leader_epoch: Option<u64>,
    /// Acks, issued commands, the "nothing acks" warning.
    ledger: AckLedger,
    /// Operator per-instance actions (`POST /api/v1/degrade/instances/{id}`).
    pub(super) instance_overrides: BTreeMap<String, InstanceOverride>,
    /// Per-instance override changes not yet written to Redis.
    pub(super) instance_overrides_dirty: bool,
}

struct Inner {
    cfg: DegradeConfig,
    shared: Mutex<Shared>,
    /// The latest `override_seq` written to Redis (or every one, without Redis sharing).
    override_shared: tokio::sync::watch::Sender<u64>,
    /// Whether changes are shared through Redis (set by the controller loop).
    override_sharing: std::sync::atomic::AtomicBool,
    /// Wakes the controller loop to share an override change at once.
    override_wake: Arc<tokio::sync::Notify>,
    metrics: DegradeMetrics,
    hook: Mutex<Option<PersistHook>>,
    /// Loop kills and tool breakers merged into every command (`crate::agents`).
    agents: std::sync::OnceLock<Arc<crate::agents::AgentGuards>>,
    /// Wakes the controller loop for an evaluation and publish now (operator actions).
    wake: tokio::sync::Notify,
    /// Keys from a reload, and how long the replaced ones stay accepted.
    key_reload: tokio::sync::watch::Sender<Option<(brownout_protocol::PlaneKeys, Duration)>>,
}

/// Shared handle on the degradation component. Cheap to clone.
#[derive(Clone)]
pub struct DegradeHandle {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DegradeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DegradeHandle")
            .field("cluster", &self.inner.cfg.cluster)
            .finish()
    }
}

impl DegradeHandle {
    /// Builds the handle and registers its metrics on `registry`.
    ///
    /// # Errors
    /// When the metrics are already registered there.
    pub fn new(
        cfg: DegradeConfig,
        registry: &Registry,
    ) -> Result<DegradeHandle, prometheus::Error> {
        let metrics = DegradeMetrics::new();
        metrics.register(registry)?;
        metrics
            .tier
            .with_label_values(&[cfg.cluster.as_str()])
            .set(0);
        let dry_run = cfg.policy.dry_run;
        metrics
            .unacked_commands
            .with_label_values(&[cfg.cluster.as_str()])
            .set(0);
        Ok(DegradeHandle {
            inner: Arc::new(Inner {
                cfg,
                shared: Mutex::new(Shared::default()),
                override_shared: tokio::sync::watch::channel(0).0,
                // Until the controller loop says which transport it has: a change waits for it
                // unless in dry run (where nothing is shared).
                override_sharing: std::sync::atomic::AtomicBool::new(!dry_run),
                override_wake: Arc::new(tokio::sync::Notify::new()),
                metrics,
                hook: Mutex::new(None),
                agents: std::sync::OnceLock::new(),
                wake: tokio::sync::Notify::new(),
                key_reload: tokio::sync::watch::channel(None).0,
            }),
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, Shared> {
        self.inner
            .shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn config(&self) -> &DegradeConfig {
        &self.inner.cfg
    }

    /// Hands reloaded keys to the running controller (a rotation of the signing key or the ack
    /// master): commands are signed with `keys` from its next round; what the replaced keys
    /// sealed (the operator override, instance actions) and the acks engines made under the
    /// old ack master are still accepted for `overlap`, and stored commands signed with the
    /// old key still verify.
    pub fn replace_keys(&self, keys: brownout_protocol::PlaneKeys, overlap: Duration) {
        self.inner.key_reload.send_replace(Some((keys, overlap)));
    }

    /// Key reloads from now on ([`DegradeHandle::replace_keys`]).
    pub(super) fn key_reloads(
        &self,
    ) -> tokio::sync::watch::Receiver<Option<(brownout_protocol::PlaneKeys, Duration)>> {
        self.inner.key_reload.subscribe()
    }

    pub fn metrics(&self) -> &DegradeMetrics {
        &self.inner.metrics
    }

    /// Called with every stored decision (the lead wires the store here).
    pub fn on_decision(&self, hook: impl Fn(&DecisionRecord) + Send + Sync + 'static) {
        *self
            .inner
            .hook
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(hook));
    }

    /// Installs the agent guards whose breakers and loop kills every command carries (once;
    /// a second call is ignored).
    pub fn set_agent_guards(&self, guards: Arc<crate::agents::AgentGuards>) {
        let _ = self.inner.agents.set(guards);
    }

    /// The agent guards, when installed.
    pub fn agent_guards(&self) -> Option<&Arc<crate::agents::AgentGuards>> {
        self.inner.agents.get()
    }

    /// Latest snapshot of a host (from `POST /v1/agents/snapshot`).
    pub fn push_snapshot(&self, s: AgentSnapshot) {
        self.lock().snapshots.insert(s.host.clone(), s);
    }

    /// The SLO engine's current alerts (replaces the previous set).
    pub fn set_slo_alerts(&self, alerts: Vec<SloAlert>) {
        self.lock().slo_alerts = alerts;
    }

    /// New failure patterns and their rates (replaces the previous set).
    pub fn set_new_patterns(&self, patterns: Vec<PatternRate>) {
        self.lock().patterns = patterns;
    }

    /// Pins a tier until `until_ms` (shared with the other replicas through Redis); returns
    /// the change's number for [`DegradeHandle::override_shared_within`].
    pub fn set_override(&self, o: Override) -> u64 {
        let seq = {
            let mut s = self.lock();
            s.operator_override = Some(o.clone());
            s.override_to_share = Some(Some(o));
            s.override_seq += 1;
            s.override_seq
        };
        self.changed_override(seq);
        seq
    }

    /// Removes the pin; returns whether there was one, and the change's number.
    pub fn clear_override(&self) -> (bool, u64) {
        let (had, seq) = {
            let mut s = self.lock();
            s.override_to_share = Some(None);
            s.override_seq += 1;
            (s.operator_override.take().is_some(), s.override_seq)
        };
        self.changed_override(seq);
        (had, seq)
    }

    fn changed_override(&self, seq: u64) {
        // Decided and published at once, not at the next evaluation tick.
        self.inner.wake.notify_one();
        if self
            .inner
            .override_sharing
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            self.inner.override_wake.notify_one();
        } else {
            self.override_shared(seq);
        }
    }

    /// Whether override changes go through Redis (the controller loop says so at start).
    pub(super) fn set_override_sharing(&self, on: bool) {
        self.inner
            .override_sharing
            .store(on, std::sync::atomic::Ordering::Relaxed);
        if !on {
            let seq = self.lock().override_seq;
            self.override_shared(seq);
        }
    }

    pub(super) fn override_wake(&self) -> Arc<tokio::sync::Notify> {
        Arc::clone(&self.inner.override_wake)
    }

    /// Change `seq` (and every one before it) is now written where the replicas read it.
    pub(super) fn override_shared(&self, seq: u64) {
        self.inner.override_shared.send_if_modified(|v| {
            let newer = seq > *v;
            if newer {
                *v = seq;
            }
            newer
        });
    }

    /// Waits until override change `seq` is written to Redis (at once without Redis sharing);
    /// false when that did not happen within `limit`.
    pub async fn override_shared_within(&self, seq: u64, limit: std::time::Duration) -> bool {
        let mut rx = self.inner.override_shared.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|v| *v >= seq))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Everything the controller looks at, now.
    pub fn inputs(&self, now_ms: u64) -> Inputs {
        let s = self.lock();
        let alertmanager_firing: BTreeSet<String> = s
            .am_alerts
            .values()
            .filter(|a| a.ends_at_ms == 0 || a.ends_at_ms > now_ms)
            .map(|a| a.name.clone())
            .collect();
        Inputs {
            now_ms,
            snapshots: s.snapshots.values().cloned().collect(),
            slo_alerts: s.slo_alerts.clone(),
            alertmanager_firing,
            new_patterns: s.patterns.clone(),
            operator_override: s.operator_override.clone().filter(|o| o.until_ms > now_ms),
            instance_overrides: s
                .instance_overrides
                .iter()
                .filter(|(_, o)| o.until_ms > now_ms)
                .map(|(k, o)| (k.clone(), o.clone()))
                .collect(),
        }
    }

    /// Applies the alerts of an Alertmanager webhook (translated by
    /// `AlertmanagerWebhook::changes`); returns how many alerts are firing afterwards.
    pub fn apply_alertmanager(&self, parsed: Vec<AlertChange>, now_ms: u64) -> usize {
        let mut s = self.lock();
        for AlertChange {
            key,
            name,
            firing,
            ends_at_ms,
        } in parsed
        {
            if firing {
                s.am_alerts.insert(key, AmAlert { name, ends_at_ms });
            } else {
                s.am_alerts.remove(&key);
            }
        }
        s.am_alerts
            .retain(|_, a| a.ends_at_ms == 0 || a.ends_at_ms > now_ms);
        s.am_alerts.len()
    }

    /// The status the operator API shows.
    pub fn status(&self) -> DegradeStatus {
        let now = brownout_protocol::now_ms();
        let s = self.lock();
        DegradeStatus {
            cluster: self.inner.cfg.cluster.clone(),
            replica_id: self.inner.cfg.replica_id.clone(),
            tier: s.last.as_ref().map_or(Tier::T0, |d| d.tier),
            leader_epoch: s.leader_epoch,
            dry_run: self.inner.cfg.policy.dry_run,
            command: s.command.clone(),
            operator_override: s.operator_override.clone(),
            step_down_at_ms: s.last.as_ref().and_then(|d| d.step_down_at_ms),
            decisions: s.history.iter().rev().cloned().collect(),
            acks: s.ledger.acks.clone(),
            unacked: s.ledger.unacked.clone(),
            instances: instance_views(s.last.as_ref(), s.command.as_ref(), &s.ledger.acks),
            instance_overrides: s
                .instance_overrides
                .iter()
                .filter(|(_, o)| o.until_ms > now)
                .map(|(k, o)| (k.clone(), o.clone()))
                .collect(),
        }
    }

    /// The stored decisions, oldest first.
    pub fn decisions(&self) -> Vec<DecisionRecord> {
        self.lock().history.iter().cloned().collect()
    }

    /// The latest command published by this replica.
    pub fn command(&self) -> Option<Command> {
        self.lock().command.clone()
    }

    /// The epoch of the lease this replica holds.
    pub fn leader_epoch(&self) -> Option<u64> {
        self.lock().leader_epoch
    }

    /// Records the decision if it changed the tier or the set of triggers; returns whether it
    /// was recorded.
    pub(super) fn record(&self, d: &Decision) -> bool {
        let dry_run = self.inner.cfg.policy.dry_run;
        let rec = {
            let mut s = self.lock();
            let changed = match &s.last {
                None => true,
                Some(prev) => {
                    prev.tier != d.tier
                        || triggers(&prev.reasons) != triggers(&d.reasons)
                        || prev.reason.trigger != d.reason.trigger
                        || action_keys(&prev.instance_actions) != action_keys(&d.instance_actions)
                        || prev.instances != d.instances
                }
            };
            let new_storm = d
                .instance_actions
                .iter()
                .any(|a| a.action == "recovery_storm")
                && !s.last.as_ref().is_some_and(|p| {
                    p.instance_actions
                        .iter()
                        .any(|a| a.action == "recovery_storm")
                });
            if new_storm {
                self.inner.metrics.recovery_storms_total.inc();
            }
            self.inner
                .metrics
                .set_actions(self.inner.cfg.cluster.as_str(), d);
            s.last = Some(d.clone());
            if !changed {
                return false;
            }
            let rec = DecisionRecord {
                at_ms: d.at_ms,
                tier: d.tier,
                previous: d.previous,
                transition: d.transition,
                trigger: d.reason.trigger.clone(),
                detail: d.reason.detail.clone(),
                reasons: d.reasons.clone(),
                dry_run,
                published: None,
                instance_actions: d.instance_actions.clone(),
                instance_acks: BTreeMap::new(),
            };
            s.history.push_back(rec.clone());
            while s.history.len() > self.inner.cfg.policy.decision_history {
                s.history.pop_front();
            }
            rec
        };
        self.inner
            .metrics
            .decisions_total
            .with_label_values(&[rec.trigger.as_str()])
            .inc();
        self.inner
            .metrics
            .tier
            .with_label_values(&[self.inner.cfg.cluster.as_str()])
            .set(i64::from(d.tier.as_u8()));
        self.persist(&rec);
        true
    }

    /// Hands a (new or updated) decision to the persistence hook; an update has the same
    /// `at_ms`, so the store's copy is replaced.
    fn persist(&self, rec: &DecisionRecord) {
        let hook = self
            .inner
            .hook
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(h) = hook {
            h(rec);
        }
    }

    pub(super) fn published(&self, cmd: &Command, elapsed: Option<Duration>) {
        if let Some(e) = elapsed {
            self.inner.metrics.publish_seconds.observe(e.as_secs_f64());
        }
        let updated = {
            let mut s = self.lock();
            s.ledger.issued(cmd.version, cmd.issued_at_ms);
            s.command = Some(cmd.clone());
            match s.history.back_mut() {
                Some(last) if last.published.is_none() && last.tier == cmd.tier => {
                    last.published = Some((cmd.epoch, cmd.version));
                    Some(last.clone())
                }
                _ => None,
            }
        };
        // The store's copy was written before the command went out: say which one carried it.
        if let Some(rec) = updated {
            self.persist(&rec);
        }
    }

    pub(super) fn set_leader(&self, epoch: Option<u64>) {
        self.lock().leader_epoch = epoch;
    }

    /// Takes the acks read from the transport: the views, the lag metric, the "nothing acks"
    /// warning, and the latest decision's per-instance acks (stored again when they change).
    pub(super) fn set_acks(&self, acks: BTreeMap<String, AckEntry>) {
        let views = {
            let s = self.lock();
            s.ledger.views(acks, s.command.as_ref())
        };
        let cluster = self.inner.cfg.cluster.as_str();
        for v in &views {
            if let Some(lag) = v.lag_ms {
                self.inner
                    .metrics
                    .ack_lag_seconds
                    .with_label_values(&[cluster, v.instance.as_str()])
                    .set(lag as f64 / 1000.0);
            }
        }
        let updated = {
            let mut s = self.lock();
            s.ledger.acks = views;
            s.ledger.check_unacked(cluster, brownout_protocol::now_ms());
            let unacked = s.ledger.unacked.as_ref().map_or(0, |u| u.commands as i64);
            self.inner
                .metrics
                .unacked_commands
                .with_label_values(&[cluster])
                .set(unacked);
            record_instance_acks(&mut s)
        };
        if let Some(rec) = updated {
            self.persist(&rec);
        }
    }
}

impl DegradeHandle {
    /// Pins fields of one instance's `instances` entry until `o.until_ms` and wakes the
    /// controller so the command goes out now, not at the next interval.
    pub fn set_instance_override(&self, instance: &str, o: InstanceOverride) {
        {
            let mut s = self.lock();
            s.instance_overrides.insert(instance.to_string(), o);
            s.instance_overrides_dirty = true;
        }
        self.inner.wake.notify_one();
    }

    /// Ends the operator's action on `instance`; returns whether there was one.
    pub fn clear_instance_override(&self, instance: &str) -> bool {
        let removed = {
            let mut s = self.lock();
            let r = s.instance_overrides.remove(instance).is_some();
            s.instance_overrides_dirty = true;
            r
        };
        self.inner.wake.notify_one();
        removed
    }

    /// The operator per-instance actions (active or not yet expired from memory).
    pub fn instance_overrides(&self) -> BTreeMap<String, InstanceOverride> {
        self.lock().instance_overrides.clone()
    }

    /// Resolves when someone asked for an evaluation now ([`Self::set_override`],
    /// [`Self::clear_override`], [`Self::set_instance_override`]).
    pub(super) async fn woken(&self) {
        self.inner.wake.notified().await;
    }
}

/// Copies the acks of the per-instance actions in force into the latest recorded decision;
/// returns it when they changed (to be stored again).
fn record_instance_acks(s: &mut Shared) -> Option<DecisionRecord> {
    let Shared {
        last,
        history,
        command,
        ledger,
        ..
    } = s;
    let rec = history.back_mut()?;
    if rec.dry_run {
        return None;
    }
    ledger
        .record_instance_acks(
            last.as_ref(),
            command.as_ref(),
            &rec.instance_actions,
            &mut rec.instance_acks,
        )
        .then(|| rec.clone())
}

fn triggers(r: &[Crossing]) -> Vec<(Tier, &str, &str)> {
    r.iter()
        .map(|c| (c.tier, c.trigger.as_str(), c.condition.as_str()))
        .collect()
}
