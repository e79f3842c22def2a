//! [`DegradeHandle`]: the degradation component's shared state (inputs, decisions, the command
//! in force, acks) and its metrics. The HTTP routes ([`super::http`]) and the controller loop
//! ([`super::run`]) both work through it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use brownout_protocol::{Ack, AgentSnapshot, Command, Tier};
use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGaugeVec, Opts, Registry};
use serde::{Deserialize, Serialize};

use super::controller::{
    Crossing, Decision, Inputs, InstanceAction, InstanceOverride, Override, PatternRate, SloAlert,
    Transition,
};
use super::http::AlertmanagerWebhook;
use super::policy::Policy;
use super::redis::AckEntry;
use crate::error::ApiError;

/// Static configuration of the controller.
#[derive(Debug, Clone)]
pub struct DegradeConfig {
    /// Cluster name (the Redis hash tag).
    pub cluster: String,
    /// This replica's id in the leader lease.
    pub replica_id: String,
    /// What commands are signed with (the Ed25519 private key, or the HMAC compatibility key),
    /// what stored commands and acks are verified with, and the seal of the operator override.
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

/// The ack of one instance's entry, as a stored decision keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceAckRecord {
    /// `applied`, `pending` or `unknown_instance` (as in [`InstanceActionView::ack`]).
    pub status: String,
    /// Decision → applied, when known (for `"*"`: the slowest instance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_ms: Option<u64>,
}

/// One serving instance's ack, as shown by the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AckView {
    pub instance: String,
    pub status: String,
    pub epoch: u64,
    pub version: u64,
    pub at_ms: u64,
    /// Decision (issue) → applied, when the acked version is one this replica published.
    pub lag_ms: Option<u64>,
    /// True when the instance is behind the command in force.
    pub behind: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Which `instances` entries the instance applied (`own`, `*`, `own+*`), when any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<String>,
}

/// One per-instance action with its ack, in `GET /api/v1/degrade`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceActionView {
    #[serde(flatten)]
    pub action: InstanceAction,
    /// The entry the command in force carries for it (`None` for watches and retry waves).
    pub entry: Option<brownout_protocol::InstanceEntry>,
    /// `applied` (the instance acked the command in force with this entry), `pending`, or
    /// `unknown_instance` (no ack from that id: no serving tier answers to it). For `"*"`:
    /// `applied` once every acking instance applied it.
    pub ack: String,
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

/// How long a published command may stay without any ack before the warning (log line,
/// [`DegradeStatus::unacked`], `brownout_degradation_unacked_commands`).
pub const UNACKED_WARN_MS: u64 = 5_000;

/// Published commands that no serving instance acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unacked {
    /// Issue time of the oldest command without an ack at or above its version.
    pub since_ms: u64,
    /// Commands published since then.
    pub commands: u64,
    /// What to check, for the log and the UI.
    pub hint: String,
}

/// Metrics of the component (`brownout_degradation_*`).
#[derive(Debug, Clone)]
pub struct DegradeMetrics {
    pub tier: IntGaugeVec,
    pub decisions_total: IntCounterVec,
    pub publish_seconds: Histogram,
    pub ack_lag_seconds: prometheus::GaugeVec,
    pub unacked_commands: IntGaugeVec,
    /// Per-instance actions in force by action (`halve`, `drain`, `operator`, `ramp`, `watch`,
    /// `recovery_storm`).
    pub instance_actions: IntGaugeVec,
    /// Retry waves detected (counted once per wave).
    pub recovery_storms_total: prometheus::IntCounter,
    /// The `"*"` entry's `admit_rps` while the admission ramp runs (0 otherwise).
    pub admit_rps: prometheus::Gauge,
}

impl DegradeMetrics {
    fn new() -> DegradeMetrics {
        DegradeMetrics {
            tier: IntGaugeVec::new(
                Opts::new(
                    "brownout_degradation_tier",
                    "Degradation tier in force (0-3).",
                ),
                &["cluster"],
            )
            .expect("valid metric"),
            decisions_total: IntCounterVec::new(
                Opts::new(
                    "brownout_degradation_decisions_total",
                    "Recorded degradation decisions by trigger.",
                ),
                &["trigger"],
            )
            .expect("valid metric"),
            publish_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "brownout_degradation_publish_seconds",
                    "Time to publish one command to Redis.",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                ]),
            )
            .expect("valid metric"),
            ack_lag_seconds: prometheus::GaugeVec::new(
                Opts::new(
                    "brownout_degradation_ack_lag_seconds",
                    "Decision to applied lag of the latest ack per serving instance.",
                ),
                &["cluster", "engine_instance"],
            )
            .expect("valid metric"),
            unacked_commands: IntGaugeVec::new(
                Opts::new(
                    "brownout_degradation_unacked_commands",
                    "Commands this replica published more than 5 s ago that no serving instance \
                     has acknowledged (0 while some instance acks).",
                ),
                &["cluster"],
            )
            .expect("valid metric"),
            instance_actions: IntGaugeVec::new(
                Opts::new(
                    "brownout_degrade_instance_actions",
                    "Per-instance actions in force, by action (halve, drain, operator, ramp, watch, recovery_storm).",
                ),
                &["cluster", "action"],
            )
            .expect("valid metric"),
            recovery_storms_total: prometheus::IntCounter::new(
                "brownout_degrade_recovery_storms_total",
                "Retry waves (recovery storms) detected in the arrival rate.",
            )
            .expect("valid metric"),
            admit_rps: prometheus::Gauge::new(
                "brownout_degrade_admit_rps",
                "Admission rate per instance of the ramp after T3 (0 when no ramp runs).",
            )
            .expect("valid metric"),
        }
    }

    fn register(&self, r: &Registry) -> Result<(), prometheus::Error> {
        r.register(Box::new(self.tier.clone()))?;
        r.register(Box::new(self.decisions_total.clone()))?;
        r.register(Box::new(self.publish_seconds.clone()))?;
        r.register(Box::new(self.ack_lag_seconds.clone()))?;
        r.register(Box::new(self.unacked_commands.clone()))?;
        r.register(Box::new(self.instance_actions.clone()))?;
        r.register(Box::new(self.recovery_storms_total.clone()))?;
        r.register(Box::new(self.admit_rps.clone()))?;
        Ok(())
    }
}

type PersistHook = Arc<dyn Fn(&DecisionRecord) + Send + Sync>;

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
    acks: Vec<AckView>,
    /// version → issued_at_ms of commands this replica published (bounded).
    issued: VecDeque<(u64, u64)>,
    unacked: Option<Unacked>,
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

const ISSUED_KEPT: usize = 1024;

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

    /// Applies an Alertmanager webhook; returns how many alerts are firing afterwards.
    ///
    /// # Errors
    /// [`ApiError`] 400 when the payload is not a version-4 webhook or an alert lacks `alertname`.
    pub fn alertmanager_webhook(
        &self,
        hook: &AlertmanagerWebhook,
        now_ms: u64,
    ) -> Result<usize, ApiError> {
        if hook.version != "4" {
            return Err(ApiError::bad_request(
                "unsupported_version",
                format!(
                    "Alertmanager webhook version {:?} is not supported (expected \"4\")",
                    hook.version
                ),
            ));
        }
        let mut parsed = Vec::with_capacity(hook.alerts.len());
        for (i, a) in hook.alerts.iter().enumerate() {
            let name = a
                .labels
                .get("alertname")
                .filter(|n| !n.is_empty())
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "missing_alertname",
                        format!("alerts[{i}].labels.alertname is missing"),
                    )
                })?;
            let firing = match a.status.as_str() {
                "firing" => true,
                "resolved" => false,
                other => {
                    return Err(ApiError::bad_request(
                        "bad_status",
                        format!("alerts[{i}].status {other:?} is not firing or resolved"),
                    ));
                }
            };
            let key = if a.fingerprint.is_empty() {
                let labels: Vec<String> =
                    a.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                labels.join(",")
            } else {
                a.fingerprint.clone()
            };
            let ends_at_ms = a
                .ends_at
                .as_deref()
                .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
                .map(|t| t.timestamp_millis())
                .filter(|ms| *ms > 0)
                .map_or(0, |ms| u64::try_from(ms).unwrap_or(0));
            parsed.push((key, name.clone(), firing, ends_at_ms));
        }
        let mut s = self.lock();
        for (key, name, firing, ends_at_ms) in parsed {
            if firing {
                s.am_alerts.insert(key, AmAlert { name, ends_at_ms });
            } else {
                s.am_alerts.remove(&key);
            }
        }
        s.am_alerts
            .retain(|_, a| a.ends_at_ms == 0 || a.ends_at_ms > now_ms);
        Ok(s.am_alerts.len())
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
            acks: s.acks.clone(),
            unacked: s.unacked.clone(),
            instances: instance_views(s.last.as_ref(), s.command.as_ref(), &s.acks),
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
            self.set_action_metrics(d);
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
            s.issued.push_back((cmd.version, cmd.issued_at_ms));
            while s.issued.len() > ISSUED_KEPT {
                s.issued.pop_front();
            }
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

    pub(super) fn set_acks(&self, acks: BTreeMap<String, AckEntry>) {
        let mut views = Vec::with_capacity(acks.len());
        {
            let s = self.lock();
            let cur = s.command.as_ref().map(Command::order_key);
            for (instance, entry) in acks {
                let v = match entry {
                    AckEntry::Ok(Ack::Applied {
                        epoch,
                        version,
                        applied_at_ms,
                        entry,
                    }) => {
                        let lag_ms = s
                            .issued
                            .iter()
                            .rev()
                            .find(|(v, _)| *v == version)
                            .map(|(_, issued)| applied_at_ms.saturating_sub(*issued));
                        AckView {
                            instance,
                            status: "applied".into(),
                            epoch,
                            version,
                            at_ms: applied_at_ms,
                            lag_ms,
                            behind: cur.is_some_and(|c| (epoch, version) < c),
                            reason: String::new(),
                            entry: entry.and_then(|e| e.as_str()).map(str::to_string),
                        }
                    }
                    AckEntry::Ok(Ack::Refused {
                        epoch,
                        version,
                        at_ms,
                        reason,
                    }) => AckView {
                        instance,
                        status: "refused".into(),
                        epoch,
                        version,
                        at_ms,
                        lag_ms: None,
                        behind: true,
                        reason,
                        entry: None,
                    },
                    AckEntry::Malformed(raw) => AckView {
                        instance,
                        status: "malformed".into(),
                        epoch: 0,
                        version: 0,
                        at_ms: 0,
                        lag_ms: None,
                        behind: true,
                        reason: raw,
                        entry: None,
                    },
                    AckEntry::Unverified { raw, reason } => AckView {
                        instance,
                        status: "unverified".into(),
                        epoch: 0,
                        version: 0,
                        at_ms: 0,
                        lag_ms: None,
                        behind: true,
                        reason: format!("{reason}: {raw}"),
                        entry: None,
                    },
                };
                views.push(v);
            }
        }
        for v in &views {
            if let Some(lag) = v.lag_ms {
                self.inner
                    .metrics
                    .ack_lag_seconds
                    .with_label_values(&[self.inner.cfg.cluster.as_str(), v.instance.as_str()])
                    .set(lag as f64 / 1000.0);
            }
        }
        let updated = {
            let mut s = self.lock();
            s.acks = views;
            self.check_unacked(&mut s, brownout_protocol::now_ms());
            record_instance_acks(&mut s)
        };
        if let Some(rec) = updated {
            self.persist(&rec);
        }
    }

    /// Whether the commands this replica published are acknowledged by anyone: sets
    /// `brownout_degradation_unacked_commands` and [`DegradeStatus::unacked`], and logs a
    /// warning once when they become unacknowledged.
    fn check_unacked(&self, s: &mut Shared, now: u64) {
        // The newest version any instance answered (applied or refused: it is listening).
        let answered = s
            .acks
            .iter()
            .filter(|a| a.status == "applied" || a.status == "refused")
            .map(|a| a.version)
            .max()
            .unwrap_or(0);
        let pending: Vec<u64> = s
            .issued
            .iter()
            .filter(|(v, _)| *v > answered)
            .map(|(_, at)| *at)
            .collect();
        let oldest = pending.iter().copied().min();
        let next = match oldest {
            Some(since) if now.saturating_sub(since) >= UNACKED_WARN_MS => Some(Unacked {
                since_ms: since,
                commands: pending.len() as u64,
                hint: format!(
                    "no serving instance acknowledged the commands published for cluster {:?} \
                     in the last {} s: check that the serving tiers use the same cluster \
                     (BROWNOUT_CLUSTER), command key (BROWNOUT_COMMAND_KEY) and Redis",
                    self.inner.cfg.cluster,
                    now.saturating_sub(since) / 1000
                ),
            }),
            _ => None,
        };
        if let Some(u) = &next
            && s.unacked.is_none()
        {
            tracing::warn!(
                cluster = %self.inner.cfg.cluster,
                commands = u.commands,
                "degrade: {}", u.hint
            );
        }
        self.inner
            .metrics
            .unacked_commands
            .with_label_values(&[self.inner.cfg.cluster.as_str()])
            .set(next.as_ref().map_or(0, |u| u.commands as i64));
        s.unacked = next;
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

    fn set_action_metrics(&self, d: &Decision) {
        let m = &self.inner.metrics;
        let cluster = self.inner.cfg.cluster.as_str();
        for action in [
            "watch",
            "halve",
            "drain",
            "operator",
            "ramp",
            "recovery_storm",
        ] {
            let n = d
                .instance_actions
                .iter()
                .filter(|a| a.action == action)
                .count();
            m.instance_actions
                .with_label_values(&[cluster, action])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        m.admit_rps.set(
            d.instances
                .get(brownout_protocol::ALL_INSTANCES)
                .and_then(|e| e.admit_rps)
                .unwrap_or(0.0),
        );
    }
}

/// Copies the acks of the per-instance actions in force into the latest recorded decision;
/// returns it when they changed (to be stored again).
fn record_instance_acks(s: &mut Shared) -> Option<DecisionRecord> {
    let views = instance_views(s.last.as_ref(), s.command.as_ref(), &s.acks);
    let mut acks: BTreeMap<String, InstanceAckRecord> = BTreeMap::new();
    for v in views.iter().filter(|v| v.entry.is_some()) {
        let lag_ms = if v.action.instance == brownout_protocol::ALL_INSTANCES {
            (v.ack == "applied")
                .then(|| s.acks.iter().filter_map(|a| a.lag_ms).max())
                .flatten()
        } else {
            s.acks
                .iter()
                .find(|a| a.instance == v.action.instance)
                .filter(|_| v.ack == "applied")
                .and_then(|a| a.lag_ms)
        };
        acks.insert(
            v.action.instance.clone(),
            InstanceAckRecord {
                status: v.ack.clone(),
                lag_ms,
            },
        );
    }
    let rec = s.history.back_mut()?;
    // Only while the latest decision is the recorded one's continuation (same actions).
    let same = s
        .last
        .as_ref()
        .is_some_and(|d| action_keys(&d.instance_actions) == action_keys(&rec.instance_actions));
    if !same || rec.dry_run {
        return None;
    }
    // An ack once applied stays as it was for this decision (a later "pending" or lag is a
    // republished command's), so the record is stored again only when an ack changes state.
    for (k, old) in &rec.instance_acks {
        if old.status == "applied"
            && let Some(new) = acks.get_mut(k)
        {
            *new = old.clone();
        }
    }
    if acks.is_empty() || acks == rec.instance_acks {
        return None;
    }
    rec.instance_acks = acks;
    Some(rec.clone())
}

/// The per-instance actions of the last decision with the entry in force and its ack.
fn instance_views(
    last: Option<&Decision>,
    command: Option<&Command>,
    acks: &[AckView],
) -> Vec<InstanceActionView> {
    let Some(d) = last else { return Vec::new() };
    let cur = command.map(Command::order_key);
    d.instance_actions
        .iter()
        .map(|a| {
            let entry = command
                .and_then(|c| c.instances.get(&a.instance))
                .cloned()
                .filter(|_| !matches!(a.action.as_str(), "watch" | "recovery_storm"));
            let applied = |v: &AckView, want: &str| {
                v.status == "applied"
                    && cur.is_some_and(|c| (v.epoch, v.version) >= c)
                    && v.entry.as_deref().is_some_and(|e| e.contains(want))
            };
            let ack = if entry.is_none() {
                "-".to_string()
            } else if a.instance == brownout_protocol::ALL_INSTANCES {
                let ok = !acks.is_empty() && acks.iter().all(|v| applied(v, "*"));
                String::from(if ok { "applied" } else { "pending" })
            } else {
                match acks.iter().find(|v| v.instance == a.instance) {
                    None => "unknown_instance".into(),
                    Some(v) if applied(v, "own") => "applied".into(),
                    Some(_) => "pending".into(),
                }
            };
            InstanceActionView {
                action: a.clone(),
                entry,
                ack,
            }
        })
        .collect()
}

fn action_keys(a: &[InstanceAction]) -> Vec<(&str, &str)> {
    a.iter()
        .map(|x| (x.instance.as_str(), x.action.as_str()))
        .collect()
}

fn triggers(r: &[Crossing]) -> Vec<(Tier, &str, &str)> {
    r.iter()
        .map(|c| (c.tier, c.trigger.as_str(), c.condition.as_str()))
        .collect()
}
