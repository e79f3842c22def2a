//! The degradation component's edge: shared state and metrics ([`DegradeHandle`]), the HTTP
//! router (Alertmanager webhook, operator API) and the controller task ([`run_controller`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use brownout_protocol::{Ack, AgentSnapshot, Command, SignedCommand, Tier, now_ms};
use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGaugeVec, Opts, Registry};
use serde::{Deserialize, Serialize};

use super::bus::InProcBus;
use super::controller::{
    Controller, Crossing, Decision, Inputs, Override, PatternRate, SloAlert, Transition,
};
use super::policy::Policy;
use super::redis::{AckEntry, PublishOutcome, RedisBus};

/// Static configuration of the controller.
#[derive(Debug, Clone)]
pub struct DegradeConfig {
    /// Cluster name (the Redis hash tag).
    pub cluster: String,
    /// This replica's id in the leader lease.
    pub replica_id: String,
    /// HMAC key the commands are signed with (`BROWNOUT_COMMAND_KEY`).
    pub hmac_key: Vec<u8>,
    pub policy: Policy,
    /// Leader lease period: a dead leader is replaced within it.
    pub leader_lease_ms: u64,
    /// Per Redis operation.
    pub redis_timeout: Duration,
}

impl DegradeConfig {
    pub fn new(cluster: &str, hmac_key: &[u8], policy: Policy) -> DegradeConfig {
        DegradeConfig {
            cluster: cluster.to_string(),
            replica_id: format!("cp-{}", uuid::Uuid::new_v4().simple()),
            hmac_key: hmac_key.to_vec(),
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
}

/// Metrics of the component (`brownout_degradation_*`).
#[derive(Debug, Clone)]
pub struct DegradeMetrics {
    pub tier: IntGaugeVec,
    pub decisions_total: IntCounterVec,
    pub publish_seconds: Histogram,
    pub ack_lag_seconds: prometheus::GaugeVec,
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
                &["cluster", "instance"],
            )
            .expect("valid metric"),
        }
    }

    fn register(&self, r: &Registry) -> Result<(), prometheus::Error> {
        r.register(Box::new(self.tier.clone()))?;
        r.register(Box::new(self.decisions_total.clone()))?;
        r.register(Box::new(self.publish_seconds.clone()))?;
        r.register(Box::new(self.ack_lag_seconds.clone()))?;
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

#[derive(Default)]
struct Shared {
    snapshots: BTreeMap<String, AgentSnapshot>,
    slo_alerts: Vec<SloAlert>,
    am_alerts: BTreeMap<String, AmAlert>,
    patterns: Vec<PatternRate>,
    operator_override: Option<Override>,
    /// An override change not yet written to Redis (`Some(None)`: a removal).
    override_to_share: Option<Option<Override>>,
    last: Option<Decision>,
    history: VecDeque<DecisionRecord>,
    command: Option<Command>,
    leader_epoch: Option<u64>,
    acks: Vec<AckView>,
    /// version → issued_at_ms of commands this replica published (bounded).
    issued: VecDeque<(u64, u64)>,
}

struct Inner {
    cfg: DegradeConfig,
    shared: Mutex<Shared>,
    metrics: DegradeMetrics,
    hook: Mutex<Option<PersistHook>>,
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
        Ok(DegradeHandle {
            inner: Arc::new(Inner {
                cfg,
                shared: Mutex::new(Shared::default()),
                metrics,
                hook: Mutex::new(None),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
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

    /// Pins a tier until `until_ms` (shared with the other replicas through Redis).
    pub fn set_override(&self, o: Override) {
        let mut s = self.lock();
        s.operator_override = Some(o.clone());
        s.override_to_share = Some(Some(o));
    }

    /// Removes the pin; returns whether there was one.
    pub fn clear_override(&self) -> bool {
        let mut s = self.lock();
        s.override_to_share = Some(None);
        s.operator_override.take().is_some()
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

    /// Records the decision if it changed the tier or the set of triggers; returns the index in
    /// the history when recorded.
    fn record(&self, d: &Decision) -> bool {
        let dry_run = self.inner.cfg.policy.dry_run;
        let rec = {
            let mut s = self.lock();
            let changed = match &s.last {
                None => true,
                Some(prev) => {
                    prev.tier != d.tier
                        || triggers(&prev.reasons) != triggers(&d.reasons)
                        || prev.reason.trigger != d.reason.trigger
                }
            };
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
        let hook = self
            .inner
            .hook
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some(h) = hook {
            h(&rec);
        }
        true
    }

    fn published(&self, cmd: &Command, elapsed: Option<Duration>) {
        if let Some(e) = elapsed {
            self.inner.metrics.publish_seconds.observe(e.as_secs_f64());
        }
        let mut s = self.lock();
        s.issued.push_back((cmd.version, cmd.issued_at_ms));
        while s.issued.len() > ISSUED_KEPT {
            s.issued.pop_front();
        }
        if let Some(last) = s.history.back_mut()
            && last.published.is_none()
            && last.tier == cmd.tier
        {
            last.published = Some((cmd.epoch, cmd.version));
        }
        s.command = Some(cmd.clone());
    }

    fn set_leader(&self, epoch: Option<u64>) {
        self.lock().leader_epoch = epoch;
    }

    fn set_acks(&self, acks: BTreeMap<String, AckEntry>) {
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
                        ..
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
        self.lock().acks = views;
    }
}

fn triggers(r: &[Crossing]) -> Vec<(Tier, &str, &str)> {
    r.iter()
        .map(|c| (c.tier, c.trigger.as_str(), c.condition.as_str()))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------------------------

/// Alertmanager's webhook payload (version 4). Unknown fields are ignored: Alertmanager adds
/// fields over time.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AlertmanagerWebhook {
    pub version: String,
    #[serde(default)]
    pub group_key: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub receiver: String,
    #[serde(default)]
    pub group_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub common_labels: BTreeMap<String, String>,
    #[serde(default)]
    pub external_url: String,
    pub alerts: Vec<AlertmanagerAlert>,
}

/// One alert of an Alertmanager webhook.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AlertmanagerAlert {
    pub status: String,
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    #[serde(default)]
    pub starts_at: Option<String>,
    #[serde(default)]
    pub ends_at: Option<String>,
    #[serde(default, rename = "generatorURL")]
    pub generator_url: String,
    #[serde(default)]
    pub fingerprint: String,
}

/// The error every handler returns: a stable code and a message, never internals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": {"code": self.code, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code: "invalid_json",
            message: r.body_text(),
        }
    }
}

/// `POST /api/v1/degrade/override` body.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverrideRequest {
    pub tier: u8,
    pub duration_secs: u64,
    pub reason: String,
}

const MAX_OVERRIDE_SECS: u64 = 7 * 24 * 3600;

async fn post_alertmanager(
    State(h): State<DegradeHandle>,
    body: Result<Json<AlertmanagerWebhook>, JsonRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let Json(hook) = body?;
    let firing = h.alertmanager_webhook(&hook, now_ms())?;
    Ok(Json(
        serde_json::json!({"accepted": hook.alerts.len(), "firing": firing}),
    ))
}

async fn post_override(
    State(h): State<DegradeHandle>,
    body: Result<Json<OverrideRequest>, JsonRejection>,
) -> Result<Json<Override>, ApiError> {
    let Json(req) = body?;
    let tier = Tier::try_from(req.tier)
        .map_err(|e| ApiError::bad_request("invalid_tier", e.to_string()))?;
    if req.duration_secs == 0 || req.duration_secs > MAX_OVERRIDE_SECS {
        return Err(ApiError::bad_request(
            "invalid_duration",
            format!("duration_secs must be between 1 and {MAX_OVERRIDE_SECS}"),
        ));
    }
    let reason = req.reason.trim();
    if reason.is_empty() || reason.len() > 512 {
        return Err(ApiError::bad_request(
            "invalid_reason",
            "reason must be 1-512 characters",
        ));
    }
    let o = Override {
        tier,
        until_ms: now_ms() + req.duration_secs * 1000,
        reason: reason.to_string(),
    };
    tracing::info!(tier = %o.tier, until_ms = o.until_ms, reason = %o.reason, "operator override set");
    h.set_override(o.clone());
    Ok(Json(o))
}

async fn delete_override(State(h): State<DegradeHandle>) -> Json<serde_json::Value> {
    let removed = h.clear_override();
    tracing::info!(removed, "operator override cleared");
    Json(serde_json::json!({"removed": removed}))
}

async fn get_status(State(h): State<DegradeHandle>) -> Json<DegradeStatus> {
    Json(h.status())
}

/// `POST /v1/alertmanager`, `POST|DELETE /api/v1/degrade/override`, `GET /api/v1/degrade`.
/// The lead adds the admin-token middleware on the `/api/v1/degrade*` routes.
pub fn router(handle: DegradeHandle) -> Router {
    Router::new()
        .route("/v1/alertmanager", post(post_alertmanager))
        .route("/api/v1/degrade", get(get_status))
        .route(
            "/api/v1/degrade/override",
            post(post_override).delete(delete_override),
        )
        .with_state(handle)
}

// ---------------------------------------------------------------------------------------------
// The controller task
// ---------------------------------------------------------------------------------------------

/// How commands leave the controller.
#[derive(Debug, Clone)]
pub enum Transport {
    /// Real Redis at this URL (leader lease, fenced publish, acks hash).
    Redis { url: String },
    /// The in-process bus of `brownout demo`.
    InProc(InProcBus),
}

/// What the last publish looked like, to decide when the next is due.
struct LastPublish {
    decision: Decision,
    issued_at_ms: u64,
    epoch: u64,
}

fn due(last: Option<&LastPublish>, d: &Decision, epoch: u64, now: u64, lease_ms: u64) -> bool {
    match last {
        None => true,
        Some(l) => {
            l.epoch != epoch || !l.decision.same_effect(d) || now >= l.issued_at_ms + lease_ms / 3
        }
    }
}

/// Runs the controller until `shutdown` resolves: evaluates every policy interval, records
/// decisions, and (unless dry-run) publishes through `transport` while holding the lease.
///
/// Redis being down is not an error: the task retries every interval and republishes the
/// decision in force as soon as Redis answers (with a new epoch if the lease was lost).
///
/// # Errors
/// Only when the cluster name is invalid for Redis keys.
pub async fn run_controller(
    handle: DegradeHandle,
    transport: Transport,
    shutdown: impl Future<Output = ()>,
) -> Result<(), super::redis::RedisBusError> {
    let cfg = handle.config().clone();
    brownout_protocol::RedisKeys::new(&cfg.cluster)?;
    let mut controller = Controller::new(cfg.policy.clone());
    let mut tick = tokio::time::interval(cfg.policy.evaluate_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);

    let mut bus: Option<RedisBus> = None;
    let mut epoch: Option<u64> = None;
    let mut max_epoch_seen: u64 = 0;
    let mut next_version: u64 = 1;
    let mut last_refresh_ms: u64 = 0;
    let mut last: Option<LastPublish> = None;
    let lease_ms = cfg.policy.command_lease_ms;

    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tick.tick() => {}
        }
        let now = now_ms();
        let mut decision = controller.step(&handle.inputs(now));
        handle.record(&decision);
        if cfg.policy.dry_run {
            continue;
        }
        match &transport {
            Transport::InProc(ib) => {
                if due(last.as_ref(), &decision, 1, now, lease_ms) {
                    let cmd = decision.to_command(&cfg.cluster, 1, next_version, now, lease_ms);
                    next_version += 1;
                    ib.publish(SignedCommand::sign(&cmd, &cfg.hmac_key));
                    handle.published(&cmd, None);
                    last = Some(LastPublish {
                        decision: decision.clone(),
                        issued_at_ms: now,
                        epoch: 1,
                    });
                }
                handle.set_leader(Some(1));
                handle.set_acks(
                    ib.acks()
                        .into_iter()
                        .map(|(k, a)| (k, AckEntry::Ok(a)))
                        .collect(),
                );
            }
            Transport::Redis { url } => {
                if bus.is_none() {
                    match RedisBus::connect(
                        url,
                        &cfg.cluster,
                        &cfg.replica_id,
                        cfg.redis_timeout,
                        &cfg.hmac_key,
                    )
                    .await
                    {
                        Ok(b) => bus = Some(b),
                        Err(e) => {
                            tracing::warn!(error = %e, "degrade: redis unreachable; retrying next interval");
                            continue;
                        }
                    }
                }
                let Some(b) = bus.as_mut() else { continue };
                if let Err(e) = redis_round(
                    b,
                    &handle,
                    &cfg,
                    &mut controller,
                    &mut decision,
                    &mut epoch,
                    &mut max_epoch_seen,
                    &mut next_version,
                    &mut last_refresh_ms,
                    &mut last,
                    now,
                )
                .await
                {
                    tracing::warn!(error = %e, "degrade: redis round failed; retrying next interval");
                }
                handle.set_leader(epoch);
            }
        }
    }
    if let (Some(b), Some(e)) = (bus.as_mut(), epoch) {
        match b.release(e).await {
            Ok(true) => tracing::info!(epoch = e, "degrade: leader lease released"),
            Ok(false) => {}
            Err(err) => tracing::warn!(error = %err, "degrade: could not release the lease"),
        }
    }
    handle.set_leader(None);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn redis_round(
    b: &mut RedisBus,
    handle: &DegradeHandle,
    cfg: &DegradeConfig,
    controller: &mut Controller,
    decision: &mut Decision,
    epoch: &mut Option<u64>,
    max_epoch_seen: &mut u64,
    next_version: &mut u64,
    last_refresh_ms: &mut u64,
    last: &mut Option<LastPublish>,
    now: u64,
) -> Result<(), super::redis::RedisBusError> {
    let lease_ms = cfg.policy.command_lease_ms;
    // The operator override is shared through Redis: write a local change, then read the truth.
    let pending = handle.lock().override_to_share.take();
    if let Some(o) = pending
        && let Err(e) = b.put_override(o.as_ref(), now).await
    {
        handle.lock().override_to_share.get_or_insert(o);
        return Err(e);
    }
    match b.get_override().await? {
        // Absent (expired, never set, or lost with Redis's data): share ours again if active.
        None => {
            let mut s = handle.lock();
            if s.override_to_share.is_none()
                && s.operator_override
                    .as_ref()
                    .is_some_and(|o| o.until_ms > now)
            {
                s.override_to_share = Some(s.operator_override.clone());
            }
        }
        Some(shared) => {
            let mut s = handle.lock();
            if s.override_to_share.is_none() && s.operator_override != shared {
                s.operator_override = shared;
                drop(s);
                *decision = controller.step(&handle.inputs(now));
                handle.record(decision);
            }
        }
    }
    // Keep or take the leader lease. Refreshed every round (one cheap script): this is also how
    // a Redis that restarted empty is noticed within one interval.
    if let Some(e) = *epoch {
        if b.refresh(e, cfg.leader_lease_ms).await? {
            *last_refresh_ms = now;
        } else {
            tracing::warn!(epoch = e, "degrade: leader lease lost");
            *epoch = None;
        }
    }
    if epoch.is_none() {
        if let Some(e) = b.try_acquire(cfg.leader_lease_ms, *max_epoch_seen).await? {
            tracing::info!(epoch = e, replica = %cfg.replica_id, "degrade: became leader");
            *epoch = Some(e);
            *max_epoch_seen = (*max_epoch_seen).max(e);
            *last_refresh_ms = now;
            // Continue from the tier in force rather than dropping it on failover.
            if let Some(stored) = b.stored().await?
                && let Ok(cmd) = stored.verify_for(&cfg.hmac_key, &cfg.cluster)
            {
                *next_version = (*next_version).max(cmd.version + 1);
                if cmd.tier > controller.tier() && !cmd.is_expired(now) {
                    controller.resume_at(cmd.tier, now);
                    *decision = controller.step(&handle.inputs(now));
                    handle.record(decision);
                }
            }
        } else {
            // Follower: show the leader's command and acks.
            if let Some(stored) = b.stored().await?
                && let Ok(cmd) = stored.verify_for(&cfg.hmac_key, &cfg.cluster)
            {
                *max_epoch_seen = (*max_epoch_seen).max(cmd.epoch);
                *next_version = (*next_version).max(cmd.version + 1);
                handle.lock().command = Some(cmd);
            }
            handle.set_acks(b.acks().await?);
            return Ok(());
        }
    }
    let Some(e) = *epoch else { return Ok(()) };
    if due(last.as_ref(), decision, e, now, lease_ms) {
        let d = decision.clone();
        let cluster = cfg.cluster.clone();
        let out = b
            .publish(e, *next_version, &cfg.hmac_key, |v| {
                d.to_command(&cluster, e, v, now, lease_ms)
            })
            .await?;
        match out {
            PublishOutcome::Published {
                command, elapsed, ..
            } => {
                tracing::debug!(epoch = e, version = command.version, tier = %command.tier, "degrade: published");
                *next_version = command.version + 1;
                handle.published(&command, Some(elapsed));
                *last = Some(LastPublish {
                    decision: d,
                    issued_at_ms: now,
                    epoch: e,
                });
            }
            PublishOutcome::NotLeader => {
                tracing::warn!(epoch = e, "degrade: publish refused: lease not held");
                *epoch = None;
            }
            PublishOutcome::Fenced { stored_epoch } => {
                tracing::warn!(
                    epoch = e,
                    stored_epoch,
                    "degrade: publish fenced by a newer leader"
                );
                *max_epoch_seen = (*max_epoch_seen).max(stored_epoch);
                *epoch = None;
            }
        }
    }
    handle.set_acks(b.acks().await?);
    Ok(())
}
