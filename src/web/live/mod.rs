//! [`LiveDataSource`]: the UI's [`UiDataSource`] over the real control-plane components.
//!
//! | page | module | read from |
//! |---|---|---|
//! | overview | [`overview`] | everything below, summarised |
//! | hosts, host detail | [`hosts`] | [`HostRegistry::list`] (latest snapshot per host) + the sampled history |
//! | services and instances (the drill-down of docs/REQUIREMENTS.md R7) | [`services`] | one bounded failure query and one request-count query of the last hour, cached for [`SERVICE_CACHE_MS`]; instances are the engines (`host/engine`) on the hosts the service reported from; an instance's logs are the service's recent failures from the store (one query, [`LOG_SCAN`] rows), filtered to the instance's host |
//! | patterns | [`patterns`] | the latest ranking the pattern feed published ([`crate::patterns::feed`]: 24 h, recomputed every few seconds by one task); examples from the store, once per publication |
//! | SLOs | [`slos`] | [`SloHandle::latest`]; burn-down from a ring of sampled reports |
//! | degradation | [`degradation`] | [`DegradeHandle`] status and decisions, plus decisions persisted as store docs of kind `decision` |
//! | `/debug/resource` | [`resource`] | snapshots + the sampled queue history |
//! | agents | here | [`crate::agents::AgentGuards::view`] (breakers, transitions, loop kills; all bounded) |
//!
//! History (VRAM, KV usage, queues, budgets, alert transitions) is kept by [`sampler`]: sampled
//! at most every [`SAMPLE_EVERY_MS`] when a page is viewed, or continuously by
//! [`LiveDataSource::run_sampler`]. In each page module the async function only gathers (store
//! queries, component handles); what the page shows is computed by plain functions from what
//! was gathered. Nothing here blocks on a lock across an `.await`.

pub mod degradation;
mod hosts;
mod overview;
mod patterns;
mod resource;
mod sampler;
mod services;
mod slos;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use brownout_protocol::Tier;
use futures::FutureExt;
use futures::future::BoxFuture;

use super::model::*;
use crate::degrade::DegradeHandle;
use crate::ingest::hosts::{HostRegistry, HostState as RegistryHostState, HostView};
use crate::patterns::feed::PatternsRx;
use crate::slo::task::SloHandle;
use crate::store::Store;

/// Minimum time between two history samples.
pub const SAMPLE_EVERY_MS: u64 = 5_000;
/// History kept per series (one hour at [`SAMPLE_EVERY_MS`]).
pub const HISTORY_LEN: usize = 720;
/// How long the service index (failures + request counts of the last hour) is reused.
pub const SERVICE_CACHE_MS: u64 = 3_000;
/// Failures read for the service index (the newest of the last hour).
pub const SERVICE_SCAN: usize = 2_000;
/// Failures of one service read for an instance's logs (then filtered to its host).
pub const LOG_SCAN: usize = 500;
/// Log lines shown for an instance.
pub const LOG_LINES: usize = 100;
const HOUR_MS: u64 = 3_600_000;
/// Alert transitions kept per SLO.
const ALERT_EVENTS_KEPT: usize = 200;

/// The real components the live source reads.
#[derive(Clone)]
pub struct LiveParts {
    pub store: Arc<dyn Store>,
    pub hosts: HostRegistry,
    pub slo: SloHandle,
    pub degrade: DegradeHandle,
    /// The pattern feed's latest ranking.
    pub patterns: PatternsRx,
    /// [`DataOrigin::Live`], or [`DataOrigin::Simulated`] under `brownout-demo`.
    pub origin: DataOrigin,
}

/// The UI's data source over the running control plane. Cheap to clone (shared caches).
#[derive(Clone)]
pub struct LiveDataSource {
    parts: LiveParts,
    caches: Arc<Mutex<Caches>>,
    /// The agent guards (`None`: the Agents page says they are off).
    agents: Option<Arc<crate::agents::AgentGuards>>,
    /// The external trace viewer's link template (`web.trace_url`), with `{trace_id}`.
    trace_url: Option<String>,
}

/// What the source remembers between page views: the sampled history and computed caches.
#[derive(Default)]
struct Caches {
    last_sample_ms: u64,
    hosts: HashMap<String, VecDeque<sampler::HostSample>>,
    /// SLO name → (evaluated at, budget remaining).
    budgets: HashMap<String, VecDeque<Point>>,
    last_report_ms: u64,
    /// SLO name → alert transitions, newest first, deduplicated.
    alert_events: HashMap<String, VecDeque<AlertEvent>>,
    /// (the publication it was built from, the details).
    patterns: Option<(u64, Arc<Vec<PatternDetail>>)>,
    services: Option<(u64, Arc<services::ServiceIndex>)>,
}

fn lock(m: &Mutex<Caches>) -> MutexGuard<'_, Caches> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn unavailable(component: &'static str, e: impl std::fmt::Display) -> UiError {
    tracing::warn!(component, error = %e, "web: live source cannot read");
    UiError::Unavailable {
        component,
        detail: e.to_string(),
    }
}

fn host_state(s: RegistryHostState) -> HostState {
    match s {
        RegistryHostState::Fresh => HostState::Fresh,
        RegistryHostState::Stale => HostState::Stale,
        RegistryHostState::Down => HostState::Down,
    }
}

fn summary(h: &HostView) -> HostSummary {
    HostSummary::new(host_state(h.state), h.last_seen_ms, h.snapshot.clone())
}

/// `host/engine` for an engine, the host alone for a host without engines.
fn instance_id(host: &str, engine: Option<&str>) -> String {
    match engine {
        Some(e) => format!("{host}/{e}"),
        None => host.to_string(),
    }
}

fn tier_of(u: u8) -> Tier {
    Tier::try_from(u).unwrap_or(Tier::T3)
}

fn finite(x: f64) -> f64 {
    if x.is_finite() { x } else { 0.0 }
}

impl LiveDataSource {
    pub fn new(parts: LiveParts) -> LiveDataSource {
        LiveDataSource {
            parts,
            caches: Arc::default(),
            agents: None,
            trace_url: None,
        }
    }

    /// Links traces to this external viewer too (`web.trace_url`: a template with `{trace_id}`).
    pub fn with_trace_url(mut self, template: Option<String>) -> LiveDataSource {
        self.trace_url = template;
        self
    }

    /// Where a pattern example's trace opens: the external viewer when configured, else the
    /// built-in waterfall; `None` without a valid trace id.
    fn trace_link(&self, trace_id: &str) -> Option<String> {
        if !crate::web::traces::is_trace_id(trace_id) {
            return None;
        }
        Some(
            self.external_trace_url(trace_id)
                .unwrap_or_else(|| format!("/traces/{}", trace_id.to_ascii_lowercase())),
        )
    }

    fn external_trace_url(&self, trace_id: &str) -> Option<String> {
        let t = self.trace_url.as_ref()?;
        crate::web::traces::is_trace_id(trace_id)
            .then(|| t.replace("{trace_id}", &trace_id.to_ascii_lowercase()))
    }

    /// Shows these agent guards on the Agents page.
    pub fn with_agents(mut self, agents: Arc<crate::agents::AgentGuards>) -> LiveDataSource {
        self.agents = Some(agents);
        self
    }

    fn store(&self) -> &Arc<dyn Store> {
        &self.parts.store
    }

    fn registry(&self) -> &HostRegistry {
        &self.parts.hosts
    }
}

fn ready<'a, T: Send + 'a>(v: T) -> BoxFuture<'a, T> {
    futures::future::ready(v).boxed()
}

impl UiDataSource for LiveDataSource {
    fn overview(&self) -> BoxFuture<'_, Result<OverviewView, UiError>> {
        self.overview_view().boxed()
    }
    fn hosts(&self) -> BoxFuture<'_, Result<HostsView, UiError>> {
        ready(Ok(self.hosts_view()))
    }
    fn host<'a>(&'a self, host: &'a str) -> BoxFuture<'a, Result<HostDetailView, UiError>> {
        self.host_view(host).boxed()
    }
    fn service<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<ServiceView, UiError>> {
        self.service_view(service).boxed()
    }
    fn instance<'a>(
        &'a self,
        service: &'a str,
        instance: &'a str,
    ) -> BoxFuture<'a, Result<InstanceView, UiError>> {
        self.instance_view(service, instance).boxed()
    }
    fn patterns(&self) -> BoxFuture<'_, Result<PatternsView, UiError>> {
        self.patterns_view().boxed()
    }
    fn slos(&self) -> BoxFuture<'_, Result<SloView, UiError>> {
        ready(Ok(self.slos_view()))
    }
    fn degradation(&self) -> BoxFuture<'_, Result<DegradationView, UiError>> {
        self.degradation_view().boxed()
    }
    fn resource(&self) -> BoxFuture<'_, Result<ResourceView, UiError>> {
        async move { Ok(self.resource_view()) }.boxed()
    }
    fn origin(&self) -> DataOrigin {
        self.parts.origin
    }
    fn log_search<'a>(
        &'a self,
        q: &'a crate::store::LogQuery,
    ) -> BoxFuture<'a, Result<crate::store::LogPage, UiError>> {
        async move {
            self.store().logs(q).await.map_err(|e| match e {
                crate::store::StoreError::BadQuery(m) => UiError::not_found("log filter", m),
                e => unavailable("store", e),
            })
        }
        .boxed()
    }
    fn trace_spans<'a>(
        &'a self,
        trace_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<crate::store::SpanRow>, UiError>> {
        async move {
            self.store()
                .trace(trace_id)
                .await
                .map_err(|e| unavailable("store", e))
        }
        .boxed()
    }
    fn trace_url(&self, trace_id: &str) -> Option<String> {
        self.external_trace_url(trace_id)
    }
    fn agents(&self) -> BoxFuture<'_, Result<AgentsView, UiError>> {
        let now = brownout_protocol::now_ms();
        ready(Ok(match &self.agents {
            Some(g) => g.view(now),
            None => AgentsView {
                generated_at_ms: now,
                ..AgentsView::default()
            },
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::sampler::record_report;
    use super::services::ServiceFacts;
    use super::slos::slo_summary;
    use super::*;
    use crate::slo::task::SloReport;

    #[test]
    fn ratio_takes_the_larger_bad_count_and_never_divides_by_zero() {
        // (good, total, failures) -> (total', ratio)
        let cases = [
            ((0, 0, 0), (0.0, 0.0)),
            ((90, 100, 0), (100.0, 0.1)),
            ((90, 100, 5), (100.0, 0.1)),
            ((90, 100, 20), (100.0, 0.2)),
            ((0, 0, 7), (7.0, 1.0)),
            ((100, 100, 0), (100.0, 0.0)),
        ];
        for ((g, t, f), want) in cases {
            assert_eq!(ServiceFacts::ratio(g, t, f), want, "{g} {t} {f}");
        }
    }

    #[test]
    fn instance_ids_are_host_slash_engine() {
        assert_eq!(instance_id("gpu-1", Some("engine-0")), "gpu-1/engine-0");
        assert_eq!(instance_id("gpu-1", None), "gpu-1");
    }

    #[test]
    fn unknown_tier_numbers_show_as_the_highest_tier() {
        assert_eq!(tier_of(2), Tier::T2);
        assert_eq!(tier_of(9), Tier::T3);
    }

    /// A report with one SLO whose single page pair (`1h/5m`, factor 14.4) is in `state`.
    fn report(at_ms: u64, budget: f64, state: serde_json::Value) -> SloReport {
        let mut alert = serde_json::json!({
            "alert": "SLOErrorBudgetBurn", "kind": "page", "severity": "page",
            "window": "1h/5m", "factor": 14.4, "long_burn_rate": 20.0, "short_burn_rate": 30.0,
        });
        alert
            .as_object_mut()
            .unwrap()
            .extend(state.as_object().unwrap().clone());
        let mut r: SloReport = serde_json::from_value(serde_json::json!({
            "evaluated_at_ms": at_ms,
            "slos": [{
                "name": "chat-availability", "service": "chat", "objective": 0.995,
                "period": "28d", "period_events": {"good": 90, "total": 100},
                "budget_remaining_ratio": 0.0, "time_to_exhaustion_secs": null,
                "burn_rates": [
                    {"window": "5m", "window_secs": 300, "burn_rate": 30.0, "events": 10},
                    {"window": "1h", "window_secs": 3600, "burn_rate": 20.0, "events": 100},
                    {"window": "3d", "window_secs": 259200, "burn_rate": 0.5, "events": 100}
                ],
                "alerts": [alert], "evaluated_at_ms": at_ms,
            }]
        }))
        .unwrap();
        // Set here: JSON has no NaN.
        r.slos[0].budget_remaining_ratio = budget;
        r
    }

    #[test]
    fn reports_become_a_budget_series_and_alert_transitions() {
        use serde_json::json;
        const T: u64 = 1_764_460_800_000;
        // (report time, budget, alert state) -> budget points so far, alert events (newest first)
        type Step = (u64, f64, serde_json::Value, usize, Vec<(u64, AlertState)>);
        let steps: Vec<Step> = vec![
            (T, 0.9, json!({"state": "inactive"}), 1, vec![]),
            // The same report again records nothing.
            (T, 0.9, json!({"state": "inactive"}), 1, vec![]),
            // Too soon after the last point for the budget series; alert pending: no event.
            (
                T + 1_000,
                0.8,
                json!({"state": "pending", "since_ms": T + 1_000}),
                1,
                vec![],
            ),
            (
                T + 6_000,
                0.7,
                json!({"state": "firing", "since_ms": T + 6_000}),
                2,
                vec![(T + 6_000, AlertState::Page)],
            ),
            // Still firing: no duplicate.
            (
                T + 12_000,
                f64::NAN,
                json!({"state": "firing", "since_ms": T + 6_000}),
                3,
                vec![(T + 6_000, AlertState::Page)],
            ),
            (
                T + 20_000,
                0.5,
                json!({"state": "resolved", "since_ms": T + 18_000, "fired_since_ms": T + 6_000}),
                4,
                vec![(T + 18_000, AlertState::Ok), (T + 6_000, AlertState::Page)],
            ),
        ];
        let mut c = Caches::default();
        for (i, (at, budget, state, points, events)) in steps.into_iter().enumerate() {
            record_report(&mut c, &report(at, budget, state));
            let series = &c.budgets["chat-availability"];
            assert_eq!(series.len(), points, "step {i}");
            assert!(series.iter().all(|p| p.value.is_finite()), "step {i}");
            let got: Vec<(u64, AlertState)> = c
                .alert_events
                .get("chat-availability")
                .map(|e| e.iter().map(|e| (e.ts_ms, e.state)).collect())
                .unwrap_or_default();
            assert_eq!(got, events, "step {i}");
        }
    }

    #[test]
    fn burn_rate_thresholds_come_from_the_pair_the_window_belongs_to() {
        let r = report(
            1,
            0.5,
            serde_json::json!({"state": "firing", "since_ms": 1}),
        );
        let s = slo_summary(&r.slos[0]);
        let got: Vec<(&str, f64)> = s
            .burn_rates
            .iter()
            .map(|b| (b.window.as_str(), b.threshold))
            .collect();
        // 5m and 1h are the page pair (14.4); 3d belongs to no pair here: 1 (on budget).
        assert_eq!(got, vec![("5m", 14.4), ("1h", 14.4), ("3d", 1.0)]);
        assert_eq!(s.alert_state, AlertState::Page);
    }

    #[test]
    fn finite_replaces_nan_and_inf() {
        for (x, want) in [
            (0.5, 0.5),
            (f64::NAN, 0.0),
            (f64::INFINITY, 0.0),
            (-1.0, -1.0),
        ] {
            assert_eq!(finite(x), want);
        }
    }
}
