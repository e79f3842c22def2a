//! View models: what each page shows, as plain values, and the [`UiDataSource`] that fills them.
//!
//! The web layer is a pure rendering layer: it never reads the store, the SLO engine or Redis
//! itself. [`super::live::LiveDataSource`] implements [`UiDataSource`] over the real components
//! (the composition root builds it); the dev-only `brownout_test_support::ui::SampleDataSource`
//! implements it over fixed sample data for tests and screenshots.
//!
//! Conventions: times are unix milliseconds (`*_ms`), ratios are 0–1 (`*_ratio`), durations carry
//! their unit. Every `String` here may be user-controlled and is escaped when rendered.

use brownout_protocol::{AgentSnapshot, Category, Criticality, EngineStats, Reason, Tier};
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

/// Why a view could not be produced. Rendered as a 404 or 503 page; internals go to the log.
#[derive(Debug, thiserror::Error)]
pub enum UiError {
    /// The thing the URL names does not exist (unknown host, service, instance, SLO).
    #[error("{kind} {name:?} not found")]
    NotFound { kind: &'static str, name: String },
    /// The component behind the view is not reachable right now (store down, not started yet).
    #[error("{component} unavailable: {detail}")]
    Unavailable {
        component: &'static str,
        detail: String,
    },
}

impl UiError {
    /// Shorthand for [`UiError::NotFound`].
    pub fn not_found(kind: &'static str, name: impl Into<String>) -> UiError {
        UiError::NotFound {
            kind,
            name: name.into(),
        }
    }
}

/// The data behind every page. Implemented over the real components by
/// [`super::live::LiveDataSource`] and over sample data by the tests' `SampleDataSource`. Each
/// call is one page view; implementations should answer from in-memory state or one bounded
/// query, never a scan.
pub trait UiDataSource: Send + Sync + 'static {
    /// `/`: tiers, SLOs, hosts, services and the top failure patterns now.
    fn overview(&self) -> BoxFuture<'_, Result<OverviewView, UiError>>;
    /// `/hosts`: every host with its GPUs and engines.
    fn hosts(&self) -> BoxFuture<'_, Result<HostsView, UiError>>;
    /// `/hosts/{host}`: one host with its recent history. [`UiError::NotFound`] when unknown.
    fn host<'a>(&'a self, host: &'a str) -> BoxFuture<'a, Result<HostDetailView, UiError>>;
    /// `/services/{service}`: level 2 of the drill-down, the instances of one service.
    fn service<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<ServiceView, UiError>>;
    /// `/services/{service}/instances/{instance}`: level 3, one instance and its recent logs.
    fn instance<'a>(
        &'a self,
        service: &'a str,
        instance: &'a str,
    ) -> BoxFuture<'a, Result<InstanceView, UiError>>;
    /// `/patterns`: failure patterns ranked by impact.
    fn patterns(&self) -> BoxFuture<'_, Result<PatternsView, UiError>>;
    /// `/slos`: budgets, burn-down series, burn rates, alert history.
    fn slos(&self) -> BoxFuture<'_, Result<SloView, UiError>>;
    /// `/degradation`: tier timeline per cluster, acks and lag per instance.
    fn degradation(&self) -> BoxFuture<'_, Result<DegradationView, UiError>>;
    /// `/debug/resource`: the console of docs/REQUIREMENTS.md R7.4 (queues, model load/warm-up, KV
    /// fragmentation).
    fn resource(&self) -> BoxFuture<'_, Result<ResourceView, UiError>>;
    /// `/agents`: tool circuit breakers and recent loop kills (docs/AGENTS.md). The default is
    /// an empty view marked disabled (a source without agent guards).
    fn agents(&self) -> BoxFuture<'_, Result<AgentsView, UiError>> {
        Box::pin(futures::future::ready(Ok(AgentsView {
            generated_at_ms: brownout_protocol::now_ms(),
            ..AgentsView::default()
        })))
    }
    /// The time the pages are of (sample data: its own clock), unix ms.
    fn now_ms(&self) -> u64 {
        brownout_protocol::now_ms()
    }
    /// Where this source's data comes from (shown on the pages built outside the views above).
    fn origin(&self) -> DataOrigin {
        DataOrigin::Live
    }
    /// `/logs` and the instance page's log records: OTLP log records from the store
    /// ([`crate::store::Store::logs`], one bounded query). The default finds none.
    fn log_search<'a>(
        &'a self,
        _q: &'a crate::store::LogQuery,
    ) -> BoxFuture<'a, Result<crate::store::LogPage, UiError>> {
        Box::pin(futures::future::ready(Ok(crate::store::LogPage {
            items: Vec::new(),
            next_cursor: None,
        })))
    }
    /// `/traces/{trace_id}`: the trace's spans, any order ([`crate::store::Store::trace`]).
    /// The default knows no trace.
    fn trace_spans<'a>(
        &'a self,
        trace_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<crate::store::SpanRow>, UiError>> {
        Box::pin(futures::future::ready(Err(UiError::not_found(
            "trace", trace_id,
        ))))
    }
    /// The configured external trace viewer's link for a trace (`web.trace_url` template), if
    /// any. The built-in `/traces/{trace_id}` is linked whatever this says.
    fn trace_url(&self, _trace_id: &str) -> Option<String> {
        None
    }
}

pub use crate::agents::AgentsView;

/// Where the data comes from, shown in the page header so sample data is never mistaken for
/// production.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DataOrigin {
    /// Real components.
    Live,
    /// Fixed sample data (the tests' and screenshots' `SampleDataSource`).
    Sample,
    /// Live control plane, but the GPU figures come from the simulated probe (`brownout-demo`).
    Simulated,
}

/// One point of a time series.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub ts_ms: u64,
    pub value: f64,
}

impl Point {
    pub fn new(ts_ms: u64, value: f64) -> Point {
        Point { ts_ms, value }
    }
}

/// A named time series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Series {
    pub name: String,
    pub points: Vec<Point>,
}

// ---- overview ---------------------------------------------------------------------------------

/// `/`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OverviewView {
    pub origin: DataOrigin,
    pub generated_at_ms: u64,
    pub clusters: Vec<ClusterTier>,
    pub slos: Vec<SloSummary>,
    pub hosts: Vec<HostSummary>,
    /// Level 1 of the drill-down (docs/REQUIREMENTS.md R7.3): services with their golden signals.
    pub services: Vec<ServiceSummary>,
    pub top_patterns: Vec<PatternSummary>,
}

/// The tier in force for one cluster and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterTier {
    pub name: String,
    pub tier: Tier,
    pub reason: Reason,
    /// When this tier was entered.
    pub since_ms: u64,
    /// Instance that holds the decision lease, when known.
    #[serde(default)]
    pub leader: Option<String>,
    /// Set while published commands have no ack from any serving instance (what to check).
    #[serde(default)]
    pub warning: Option<String>,
}

/// Multi-window alert state of an SLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertState {
    Ok,
    /// Slow-burn (ticket) pair above its threshold.
    Ticket,
    /// Fast-burn (page) pair above its threshold.
    Page,
}

/// Burn rate over one window (`5m`, `1h`, `6h`, `3d`…).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BurnRate {
    pub window: String,
    pub rate: f64,
    /// The threshold this window is compared with in its alert pair (14.4, 6, 1…).
    pub threshold: f64,
}

/// One SLO on the overview.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SloSummary {
    pub name: String,
    /// E.g. 0.995.
    pub objective_ratio: f64,
    /// 1 = untouched, 0 = spent, negative = overspent (of the whole period's budget; while the
    /// history is shorter than the period, projected from it: see `budget_note`).
    pub budget_remaining_ratio: f64,
    pub burn_rates: Vec<BurnRate>,
    pub alert_state: AlertState,
    /// `from 5m of data in a 28d period`, when the history is shorter than the period; else
    /// empty.
    pub budget_note: String,
    /// Requests refused on purpose in the last hour (not in the SLI).
    pub refused_1h: u64,
    /// The budget left as users felt it: refusals on purpose counted as bad (the cost of
    /// shedding). `budget_remaining_ratio` is the real-failure budget the alerts read. `None`
    /// for time-slice SLOs.
    pub user_budget_remaining_ratio: Option<f64>,
    /// Requests refused on purpose over the period.
    pub refused_period: u64,
}

/// Heartbeat state of a host: the host registry's own ([`crate::ingest::hosts`]).
pub use crate::ingest::hosts::HostState;

/// One host in lists.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostSummary {
    pub host: String,
    pub state: HostState,
    /// Last snapshot received.
    pub last_seen_ms: u64,
    /// The last snapshot (GPUs and engines).
    pub snapshot: AgentSnapshot,
    /// Derived from `snapshot` by [`HostSummary::new`]: the highest VRAM used ratio.
    pub max_vram_ratio: f64,
    /// Derived: the highest KV usage over engines that are up.
    pub max_kv_usage_ratio: f64,
    /// Derived: waiting requests over engines.
    pub queue_depth: u64,
}

impl HostSummary {
    /// A host summary with the derived fields computed from `snapshot`.
    pub fn new(state: HostState, last_seen_ms: u64, snapshot: AgentSnapshot) -> HostSummary {
        HostSummary {
            host: snapshot.host.clone(),
            state,
            last_seen_ms,
            max_vram_ratio: snapshot.max_vram_ratio(),
            max_kv_usage_ratio: snapshot.max_kv_usage(),
            queue_depth: snapshot.queue_depth(),
            snapshot,
        }
    }
}

/// Level 1 of the drill-down: a service and its golden signals.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServiceSummary {
    pub name: String,
    pub requests_per_s: f64,
    pub error_ratio: f64,
    pub ttft_p99_s: f64,
    pub num_instances: u32,
    /// Error ratio over the last hour, for the sparkline.
    pub error_trend: Vec<Point>,
}

/// A failure pattern in lists.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PatternSummary {
    /// Stable id (a hash of the template).
    pub id: String,
    /// Mined template, e.g. `Tool <*> timed out after <*> ms`.
    pub template: String,
    pub category: Category,
    pub count_1h: u64,
    /// Share of the window's SLO-bad events this pattern explains (0…1; docs/SLO.md
    /// "Pattern impact"); the list is ranked by it.
    pub impact: f64,
    pub services: Vec<String>,
    /// First seen in the last hour.
    pub is_new: bool,
}

// ---- hosts ------------------------------------------------------------------------------------

/// `/hosts`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostsView {
    pub origin: DataOrigin,
    pub generated_at_ms: u64,
    pub hosts: Vec<HostSummary>,
}

/// `/hosts/{host}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostDetailView {
    pub origin: DataOrigin,
    pub generated_at_ms: u64,
    pub host: HostSummary,
    /// Max VRAM used ratio over the host's GPUs, recent history.
    pub vram_series: Vec<Point>,
    /// KV usage per engine, recent history (series name = engine id).
    pub kv_series: Vec<Series>,
    /// Queue depth (waiting requests) over engines, recent history.
    pub queue_series: Vec<Point>,
    /// Services with instances on this host (links into the drill-down).
    pub instances: Vec<InstanceRef>,
}

/// A link to one instance of a service.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceRef {
    pub service: String,
    pub instance: String,
}

// ---- drill-down -------------------------------------------------------------------------------

/// `/services/{service}`: level 2.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServiceView {
    pub origin: DataOrigin,
    pub generated_at_ms: u64,
    pub service: ServiceSummary,
    pub instances: Vec<InstanceSummary>,
}

/// One instance of a service.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceSummary {
    pub instance: String,
    pub host: String,
    pub state: HostState,
    pub requests_per_s: f64,
    pub error_ratio: f64,
    pub ttft_p99_s: f64,
    pub kv_usage_ratio: f64,
    pub tier: Tier,
}

/// `/services/{service}/instances/{instance}`: level 3.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceView {
    pub origin: DataOrigin,
    pub generated_at_ms: u64,
    pub service: String,
    pub instance: InstanceSummary,
    /// The engine behind the instance, when it is a serving engine.
    pub engine: Option<EngineStats>,
    /// Newest first.
    pub logs: Vec<LogLine>,
}

/// One failure/log line of an instance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogLine {
    pub ts_ms: u64,
    /// `error`, `warn`, `info`.
    pub level: String,
    pub category: Category,
    pub error_type: String,
    pub message: String,
    pub request_id: String,
    pub trace_id: String,
    pub feature: String,
    pub criticality: Criticality,
}

// ---- patterns ---------------------------------------------------------------------------------

/// `/patterns`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PatternsView {
    pub origin: DataOrigin,
    pub generated_at_ms: u64,
    /// Ranked by impact, highest first.
    pub patterns: Vec<PatternDetail>,
}

/// A pattern with its trend and examples.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PatternDetail {
    pub summary: PatternSummary,
    /// Occurrences per bucket (e.g. per 5 minutes over 24 h).
    pub trend: Vec<Point>,
    pub examples: Vec<PatternExample>,
}

/// One raw message that matched a pattern.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PatternExample {
    pub ts_ms: u64,
    pub service: String,
    pub message: String,
    pub trace_id: String,
    /// Where the trace can be opened (Jaeger/Tempo), when configured. Only `http(s)://` links are
    /// rendered as links; anything else is shown as text.
    pub trace_url: Option<String>,
    /// The frames of its stack trace, innermost first (`function (file:line)`, `[app]` for
    /// in-app frames; see `patterns::trace::shown_frames`); empty without one.
    pub frames: Vec<String>,
}

// ---- SLOs -------------------------------------------------------------------------------------

/// `/slos`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SloView {
    pub origin: DataOrigin,
    pub generated_at_ms: u64,
    pub slos: Vec<SloDetail>,
}

/// One SLO in full.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SloDetail {
    pub summary: SloSummary,
    pub description: String,
    /// E.g. `30d`.
    pub period: String,
    /// Budget remaining ratio over the period (the burn-down).
    pub budget_series: Vec<Point>,
    /// Alert transitions, newest first.
    pub alert_history: Vec<AlertEvent>,
}

/// A change of an SLO's alert state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AlertEvent {
    pub ts_ms: u64,
    pub state: AlertState,
    /// E.g. `5m/1h`.
    pub window: String,
    pub burn_rate: f64,
}

// ---- degradation ------------------------------------------------------------------------------

/// `/degradation`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DegradationView {
    pub origin: DataOrigin,
    pub generated_at_ms: u64,
    pub clusters: Vec<ClusterDegradation>,
}

/// One cluster's tier history and acks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterDegradation {
    pub current: ClusterTier,
    /// `(epoch, version)` of the command in force.
    pub epoch: u64,
    pub version: u64,
    /// Tier changes in the window shown, oldest first; each lasts until the next.
    pub timeline: Vec<TierChange>,
    /// Start and end of the timeline window.
    pub window_start_ms: u64,
    pub window_end_ms: u64,
    pub acks: Vec<InstanceAck>,
    /// Per-instance actions in force (stop-bleed, operator, ramp, retry waves) with their acks.
    #[serde(default)]
    pub instance_actions: Vec<InstanceActionRow>,
    /// Per-instance actions as the decision log recorded them, newest first (bounded).
    #[serde(default)]
    pub action_log: Vec<InstanceActionRow>,
}

/// One per-instance action (docs/DEGRADATION.md "Per-instance actions").
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceActionRow {
    /// When it started (in force) or when the decision was recorded (log).
    pub ts_ms: u64,
    pub instance: String,
    /// `watch`, `halve`, `drain`, `operator`, `ramp`, `recovery_storm`.
    pub action: String,
    pub detail: String,
    /// The entry's fields in force, e.g. `max_num_seqs 128, drain` (empty for watches).
    pub entry: String,
    /// `applied`, `pending`, `unknown_instance` or `-`.
    pub ack: String,
}

/// A tier change with its reason.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TierChange {
    pub ts_ms: u64,
    pub tier: Tier,
    pub reason: Reason,
    pub version: u64,
}

/// What one serving instance has applied.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceAck {
    pub instance: String,
    pub epoch: u64,
    pub version: u64,
    pub applied_at_ms: u64,
    /// Decision → applied latency of its last ack.
    pub lag_ms: u64,
    /// Refused with this reason (bad signature, stale version…).
    pub nack_reason: Option<String>,
    /// Behind the version in force.
    pub lagging: bool,
}

// ---- /debug/resource --------------------------------------------------------------------------

/// `/debug/resource`: the console of docs/REQUIREMENTS.md R7.4.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResourceView {
    pub origin: DataOrigin,
    pub generated_at_ms: u64,
    pub engines: Vec<EngineResource>,
}

/// One engine's resource figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineResource {
    pub host: String,
    pub engine: EngineStats,
    /// Time to load the weights at start-up.
    pub model_load_s: f64,
    /// Time from loaded to the first request served (warm-up).
    pub warmup_s: f64,
    /// Waiting requests, recent history.
    pub queue_series: Vec<Point>,
}
