//! [`LiveDataSource`]: the UI's [`UiDataSource`] over the real control-plane components.
//!
//! | page | read from |
//! |---|---|
//! | hosts, engines, `/debug/resource` | [`HostRegistry::list`] (latest snapshot per host) + an in-memory history ring |
//! | services and instances (seed 003) | one bounded failure query and one request-count query of the last hour, cached for [`SERVICE_CACHE_MS`]; instances are the engines (`host/engine`) on the hosts the service reported from |
//! | an instance's logs | the service's recent failures from the store (one query, [`LOG_SCAN`] rows), filtered to the instance's host |
//! | patterns | [`PatternEngine::patterns`] over 24 h, cached for [`PATTERN_CACHE_MS`] (clustering is not free) |
//! | SLOs | [`SloHandle::latest`]; burn-down from a ring of sampled reports |
//! | degradation | [`DegradeHandle`] status and decisions, plus decisions persisted as store docs of kind `decision` |
//!
//! History (VRAM, KV usage, queues, budgets, alert transitions) is sampled at most every
//! [`SAMPLE_EVERY_MS`] when a page is viewed, or continuously by [`LiveDataSource::run_sampler`].
//! Nothing here blocks on a lock across an `.await`.
//!
//! [`PatternEngine::patterns`]: crate::patterns::engine::PatternEngine::patterns

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use brownout_protocol::{Category, EngineStats, Reason, Tier, now_ms};
use futures::FutureExt;
use futures::future::BoxFuture;

use super::model::*;
use crate::degrade::{DecisionRecord, DegradeHandle};
use crate::ingest::hosts::{HostRegistry, HostState as RegistryHostState, HostView};
use crate::patterns::api::SharedEngine;
use crate::patterns::engine::{Pattern, PatternId};
use crate::slo::task::{SloHandle, SloReport};
use crate::slo::{AlertState as SloAlertState, Severity};
use crate::store::{CountQuery, FailureQuery, FailureRow, Store};

/// Minimum time between two history samples.
pub const SAMPLE_EVERY_MS: u64 = 5_000;
/// History kept per series (one hour at [`SAMPLE_EVERY_MS`]).
pub const HISTORY_LEN: usize = 720;
/// How long a computed pattern list is reused.
pub const PATTERN_CACHE_MS: u64 = 5_000;
/// How long the service index (failures + request counts of the last hour) is reused.
pub const SERVICE_CACHE_MS: u64 = 3_000;
/// Failures read for the service index (the newest of the last hour).
pub const SERVICE_SCAN: usize = 2_000;
/// Failures of one service read for an instance's logs (then filtered to its host).
pub const LOG_SCAN: usize = 500;
/// Log lines shown for an instance.
pub const LOG_LINES: usize = 100;
/// Window of the rates and ratios shown for services.
const RATE_WINDOW_MS: u64 = 5 * 60_000;
/// Bucket of the services' error trend.
const TREND_BUCKET_MS: u64 = 5 * 60_000;
const HOUR_MS: u64 = 3_600_000;
/// Window of the degradation timeline.
const TIER_WINDOW_MS: u64 = 6 * HOUR_MS;
/// Patterns whose examples are looked up in the store (one query each).
const PATTERNS_WITH_EXAMPLES: usize = 20;
/// Alert transitions kept per SLO.
const ALERT_EVENTS_KEPT: usize = 200;

/// The real components the live source reads.
#[derive(Clone)]
pub struct LiveParts {
    pub store: Arc<dyn Store>,
    pub hosts: HostRegistry,
    pub slo: SloHandle,
    pub degrade: DegradeHandle,
    pub patterns: SharedEngine,
    /// [`DataOrigin::Live`], or [`DataOrigin::Simulated`] under `brownout demo`.
    pub origin: DataOrigin,
}

/// The UI's data source over the running control plane. Cheap to clone (shared caches).
#[derive(Clone)]
pub struct LiveDataSource {
    parts: LiveParts,
    caches: Arc<Mutex<Caches>>,
}

/// One sample of a host.
#[derive(Debug, Clone)]
struct HostSample {
    ts_ms: u64,
    max_vram: f64,
    queue: u64,
    /// Engine id → (KV usage, waiting requests).
    engines: Vec<(String, f64, u64)>,
}

#[derive(Default)]
struct Caches {
    last_sample_ms: u64,
    hosts: HashMap<String, VecDeque<HostSample>>,
    /// SLO name → (evaluated at, budget remaining).
    budgets: HashMap<String, VecDeque<Point>>,
    last_report_ms: u64,
    /// SLO name → alert transitions, newest first, deduplicated.
    alert_events: HashMap<String, VecDeque<AlertEvent>>,
    patterns: Option<(u64, Arc<Vec<PatternDetail>>)>,
    services: Option<(u64, Arc<ServiceIndex>)>,
}

/// Services seen in the last hour, with their golden signals and where they run.
#[derive(Debug, Default)]
struct ServiceIndex {
    services: BTreeMap<String, ServiceFacts>,
}

#[derive(Debug, Default)]
struct ServiceFacts {
    /// Request spans in the rate window.
    total: u64,
    good: u64,
    /// Failures in the rate window, all and per host.
    failures: u64,
    failures_by_host: BTreeMap<String, u64>,
    /// Hosts it reported failures from in the last hour.
    hosts: BTreeSet<String>,
    /// Per trend bucket start: (good, total, failures).
    buckets: BTreeMap<u64, (u64, u64, u64)>,
}

impl ServiceFacts {
    /// Bad events: failed spans, or the failures reported, whichever is more (an error span
    /// also becomes a failure, so the two are not added).
    fn ratio(good: u64, total: u64, failures: u64) -> (f64, f64) {
        let bad = total.saturating_sub(good).max(failures);
        let total = total.max(bad);
        let ratio = if total == 0 {
            0.0
        } else {
            bad as f64 / total as f64
        };
        (total as f64, ratio)
    }
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

impl LiveDataSource {
    pub fn new(parts: LiveParts) -> LiveDataSource {
        LiveDataSource {
            parts,
            caches: Arc::default(),
        }
    }

    /// Samples the history every [`SAMPLE_EVERY_MS`] until `shutdown` resolves, so charts
    /// fill in even while nobody looks.
    pub async fn run_sampler(self, shutdown: impl std::future::Future<Output = ()>) {
        let mut tick = tokio::time::interval(Duration::from_millis(SAMPLE_EVERY_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = tick.tick() => self.sample(now_ms()),
            }
        }
    }

    fn store(&self) -> &Arc<dyn Store> {
        &self.parts.store
    }

    fn registry(&self) -> &HostRegistry {
        &self.parts.hosts
    }

    /// Records one history sample if the last is older than [`SAMPLE_EVERY_MS`]; new SLO
    /// reports are always recorded.
    fn sample(&self, now: u64) {
        let report = self.parts.slo.latest();
        let hosts = self.registry().list(now);
        let mut c = lock(&self.caches);
        if c.last_sample_ms == 0 || now >= c.last_sample_ms + SAMPLE_EVERY_MS {
            c.last_sample_ms = now;
            for h in &hosts {
                let s = &h.snapshot;
                let ring = c.hosts.entry(h.host.clone()).or_default();
                ring.push_back(HostSample {
                    ts_ms: now,
                    max_vram: s.max_vram_ratio(),
                    queue: s.queue_depth(),
                    engines: s
                        .engines
                        .iter()
                        .map(|e| (e.id.clone(), e.kv.usage_ratio, e.num_requests_waiting))
                        .collect(),
                });
                while ring.len() > HISTORY_LEN {
                    ring.pop_front();
                }
            }
        }
        record_report(&mut c, &report);
    }

    fn host_history(&self, host: &str) -> Vec<HostSample> {
        lock(&self.caches)
            .hosts
            .get(host)
            .map(|r| r.iter().cloned().collect())
            .unwrap_or_default()
    }

    // ---- services ----------------------------------------------------------------------

    async fn service_index(&self, now: u64) -> Result<Arc<ServiceIndex>, UiError> {
        if let Some((at, idx)) = &lock(&self.caches).services
            && now < at + SERVICE_CACHE_MS
        {
            return Ok(idx.clone());
        }
        let since = now.saturating_sub(HOUR_MS);
        let fq = FailureQuery {
            since_ms: since,
            until_ms: now + 1,
            limit: SERVICE_SCAN,
            ..FailureQuery::default()
        };
        let failures = self
            .store()
            .failures(&fq)
            .await
            .map_err(|e| unavailable("store", e))?;
        let cq = CountQuery {
            since_ms: since - since % TREND_BUCKET_MS,
            until_ms: now + 1,
            bucket_ms: TREND_BUCKET_MS,
            service: None,
            latency_threshold_ms: None,
        };
        let counts = self
            .store()
            .request_counts(&cq)
            .await
            .map_err(|e| unavailable("store", e))?;
        let mut idx = ServiceIndex::default();
        let rate_since = now.saturating_sub(RATE_WINDOW_MS);
        for c in &counts {
            let f = idx.services.entry(c.service.clone()).or_default();
            let b = f.buckets.entry(c.bucket_ms).or_default();
            b.0 += c.good;
            b.1 += c.total;
            // A bucket counts for the rate when it overlaps the rate window.
            if c.bucket_ms + TREND_BUCKET_MS > rate_since {
                f.good += c.good;
                f.total += c.total;
            }
        }
        for r in &failures.items {
            let e = &r.event;
            let f = idx.services.entry(e.service.clone()).or_default();
            if !e.host.is_empty() {
                f.hosts.insert(e.host.clone());
            }
            let bucket = e.ts_ms - e.ts_ms % TREND_BUCKET_MS;
            f.buckets.entry(bucket).or_default().2 += 1;
            if e.ts_ms >= rate_since {
                f.failures += 1;
                *f.failures_by_host.entry(e.host.clone()).or_default() += 1;
            }
        }
        let idx = Arc::new(idx);
        lock(&self.caches).services = Some((now, idx.clone()));
        Ok(idx)
    }

    /// The instances of `service`: every engine on the hosts it reported from, and every
    /// engine serving a model named like the service; a reporting host without engines is an
    /// instance by itself.
    fn instances_of(
        facts: Option<&ServiceFacts>,
        service: &str,
        hosts: &[HostView],
    ) -> Vec<(String, String, Option<EngineStats>)> {
        let mut out = Vec::new();
        let mut covered: BTreeSet<&str> = BTreeSet::new();
        let reporting = facts.map(|f| &f.hosts);
        for h in hosts {
            let from_here = reporting.is_some_and(|r| r.contains(&h.host));
            let mut any = false;
            for e in &h.snapshot.engines {
                if from_here || e.model == service {
                    any = true;
                    let id = instance_id(&h.host, Some(&e.id));
                    out.push((id, h.host.clone(), Some(e.clone())));
                }
            }
            if from_here && !any {
                out.push((h.host.clone(), h.host.clone(), None));
            }
            if from_here || any {
                covered.insert(&h.host);
            }
        }
        // Hosts that reported failures but send no snapshots.
        if let Some(r) = reporting {
            for host in r {
                if !covered.contains(host.as_str()) {
                    out.push((host.clone(), host.clone(), None));
                }
            }
        }
        out
    }

    fn service_summary(
        name: &str,
        facts: Option<&ServiceFacts>,
        instances: &[(String, String, Option<EngineStats>)],
        now: u64,
    ) -> ServiceSummary {
        let empty = ServiceFacts::default();
        let f = facts.unwrap_or(&empty);
        let (total, error_ratio) = ServiceFacts::ratio(f.good, f.total, f.failures);
        let start = now.saturating_sub(HOUR_MS);
        let error_trend = f
            .buckets
            .iter()
            .filter(|(b, _)| **b + TREND_BUCKET_MS > start)
            .map(|(b, (good, total, failures))| Point {
                ts_ms: *b,
                value: ServiceFacts::ratio(*good, *total, *failures).1,
            })
            .collect();
        ServiceSummary {
            name: name.to_string(),
            requests_per_s: total / (RATE_WINDOW_MS as f64 / 1000.0),
            error_ratio,
            ttft_p99_s: instances
                .iter()
                .filter_map(|(_, _, e)| e.as_ref().map(|e| e.ttft_p99_s))
                .fold(0.0, f64::max),
            num_instances: u32::try_from(instances.len()).unwrap_or(u32::MAX),
            error_trend,
        }
    }

    fn instance_summary(
        svc: &ServiceSummary,
        facts: Option<&ServiceFacts>,
        (id, host, engine): &(String, String, Option<EngineStats>),
        hosts: &[HostView],
    ) -> InstanceSummary {
        let n = f64::from(svc.num_instances.max(1));
        let share = svc.requests_per_s * (RATE_WINDOW_MS as f64 / 1000.0) / n;
        let bad = facts
            .and_then(|f| f.failures_by_host.get(host))
            .copied()
            .unwrap_or(0) as f64;
        let total = share.max(bad);
        let state = hosts
            .iter()
            .find(|h| &h.host == host)
            .map_or(HostState::Down, |h| host_state(h.state));
        InstanceSummary {
            instance: id.clone(),
            host: host.clone(),
            state,
            requests_per_s: svc.requests_per_s / n,
            error_ratio: if total > 0.0 { bad / total } else { 0.0 },
            ttft_p99_s: engine.as_ref().map_or(0.0, |e| e.ttft_p99_s),
            kv_usage_ratio: engine.as_ref().map_or(0.0, |e| e.kv.usage_ratio),
            tier: engine.as_ref().map_or(Tier::T0, |e| tier_of(e.tier)),
        }
    }

    async fn services_now(
        &self,
        now: u64,
        hosts: &[HostView],
    ) -> Result<Vec<ServiceSummary>, UiError> {
        let idx = self.service_index(now).await?;
        let mut names: BTreeSet<String> = idx.services.keys().cloned().collect();
        // Engines with no reporting service still show, under their model's name.
        for h in hosts {
            for e in &h.snapshot.engines {
                if !e.model.is_empty() && !idx.services.values().any(|f| f.hosts.contains(&h.host))
                {
                    names.insert(e.model.clone());
                }
            }
        }
        Ok(names
            .iter()
            .map(|n| {
                let f = idx.services.get(n);
                let inst = Self::instances_of(f, n, hosts);
                Self::service_summary(n, f, &inst, now)
            })
            .collect())
    }

    // ---- patterns ----------------------------------------------------------------------

    async fn patterns_now(&self, now: u64) -> Result<Arc<Vec<PatternDetail>>, UiError> {
        if let Some((at, p)) = &lock(&self.caches).patterns
            && now < at + PATTERN_CACHE_MS
        {
            return Ok(p.clone());
        }
        // Clustering takes a while: off the async workers.
        let engine = self.parts.patterns.clone();
        let ranked: Vec<Pattern> = tokio::task::spawn_blocking(move || {
            let e = engine
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            e.patterns(now.saturating_sub(24 * HOUR_MS), now + 1)
        })
        .await
        .map_err(|e| unavailable("patterns", e))?;
        let mut out = Vec::with_capacity(ranked.len());
        for (i, p) in ranked.into_iter().enumerate() {
            let examples = if i < PATTERNS_WITH_EXAMPLES {
                self.examples(&p, now).await
            } else {
                Vec::new()
            };
            out.push(pattern_detail(p, examples, now));
        }
        let out = Arc::new(out);
        lock(&self.caches).patterns = Some((now, out.clone()));
        Ok(out)
    }

    /// Raw messages of a pattern: failures the ingest tagger labelled with one of its
    /// templates' ids; failing that, its example trace ids with the template as the message.
    async fn examples(&self, p: &Pattern, now: u64) -> Vec<PatternExample> {
        let mut rows: Vec<FailureRow> = Vec::new();
        for t in p.templates.iter().take(3) {
            if rows.len() >= 3 {
                break;
            }
            let q = FailureQuery {
                since_ms: p.first_seen_ms.min(now.saturating_sub(24 * HOUR_MS)),
                until_ms: now + 1,
                pattern: Some(PatternId::from_template(*t).0),
                limit: 3 - rows.len(),
                ..FailureQuery::default()
            };
            match self.store().failures(&q).await {
                Ok(page) => rows.extend(page.items),
                Err(e) => {
                    tracing::warn!(error = %e, "web: cannot read pattern examples");
                    break;
                }
            }
        }
        if !rows.is_empty() {
            return rows
                .into_iter()
                .map(|r| PatternExample {
                    ts_ms: r.event.ts_ms,
                    service: r.event.service,
                    message: r.event.message,
                    trace_id: r.event.trace_id,
                    trace_url: None,
                })
                .collect();
        }
        p.example_trace_ids
            .iter()
            .map(|t| PatternExample {
                ts_ms: p.last_seen_ms,
                service: p.services.first().cloned().unwrap_or_default(),
                message: p.label.clone(),
                trace_id: t.clone(),
                trace_url: None,
            })
            .collect()
    }

    // ---- SLOs --------------------------------------------------------------------------

    fn slo_details(&self, now: u64) -> Vec<SloDetail> {
        self.sample(now);
        let report = self.parts.slo.latest();
        let c = lock(&self.caches);
        report
            .slos
            .iter()
            .map(|s| SloDetail {
                summary: slo_summary(s),
                description: format!("service {}", s.service),
                period: s.period.clone(),
                budget_series: c
                    .budgets
                    .get(&s.name)
                    .map(|r| r.iter().copied().collect())
                    .unwrap_or_default(),
                alert_history: c
                    .alert_events
                    .get(&s.name)
                    .map(|r| r.iter().cloned().collect())
                    .unwrap_or_default(),
            })
            .collect()
    }

    // ---- degradation -------------------------------------------------------------------

    /// Decisions held in memory, plus those persisted in the store (they survive restarts).
    async fn decisions(&self, since: u64) -> Vec<DecisionRecord> {
        let mut by_ts: BTreeMap<u64, DecisionRecord> = BTreeMap::new();
        match self.store().list_docs("decision", since).await {
            Ok(docs) => {
                for d in docs {
                    match serde_json::from_value::<DecisionRecord>(d.value.clone()) {
                        Ok(r) => {
                            by_ts.insert(r.at_ms, r);
                        }
                        // Older code stored the JSON as a string.
                        Err(_) => {
                            if let Some(r) = d
                                .value
                                .as_str()
                                .and_then(|s| serde_json::from_str::<DecisionRecord>(s).ok())
                            {
                                by_ts.insert(r.at_ms, r);
                            }
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "web: cannot read stored decisions"),
        }
        for r in self.parts.degrade.decisions() {
            by_ts.insert(r.at_ms, r);
        }
        by_ts.into_values().collect()
    }

    async fn cluster(&self, now: u64) -> ClusterDegradation {
        let window_start = now.saturating_sub(TIER_WINDOW_MS);
        let status = self.parts.degrade.status();
        let records = self
            .decisions(window_start.saturating_sub(24 * HOUR_MS))
            .await;
        let command = status.command.clone();
        let change = |r: &DecisionRecord| TierChange {
            ts_ms: r.at_ms,
            tier: r.tier,
            reason: Reason {
                trigger: r.trigger.clone(),
                detail: r.detail.clone(),
                ..Reason::default()
            },
            version: r.published.map_or(0, |(_, v)| v),
        };
        // Tier changes only: the last change before the window, then every change inside.
        let mut changes: Vec<TierChange> = Vec::new();
        let mut last_tier: Option<Tier> = None;
        for r in &records {
            if last_tier == Some(r.tier) {
                continue;
            }
            last_tier = Some(r.tier);
            let c = change(r);
            if r.at_ms < window_start {
                changes.clear();
            }
            changes.push(c);
        }
        let tier = status.tier;
        let last = changes.last().cloned();
        let since_ms = last.as_ref().map_or(window_start, |c| c.ts_ms);
        let reason = match &command {
            Some(c) if c.tier == tier => c.reason.clone(),
            _ => last
                .as_ref()
                .map(|c| c.reason.clone())
                .unwrap_or_else(|| Reason {
                    trigger: "none".into(),
                    detail: "no decision yet".into(),
                    ..Reason::default()
                }),
        };
        if changes.is_empty() {
            changes.push(TierChange {
                ts_ms: window_start,
                tier,
                reason: reason.clone(),
                version: command.as_ref().map_or(0, |c| c.version),
            });
        }
        let acks = status
            .acks
            .iter()
            .map(|a| InstanceAck {
                instance: a.instance.clone(),
                epoch: a.epoch,
                version: a.version,
                applied_at_ms: a.at_ms,
                lag_ms: a.lag_ms.unwrap_or(0),
                nack_reason: (a.status != "applied").then(|| {
                    if a.reason.is_empty() {
                        a.status.clone()
                    } else {
                        a.reason.clone()
                    }
                }),
                lagging: a.behind,
            })
            .collect();
        ClusterDegradation {
            current: ClusterTier {
                name: status.cluster.clone(),
                tier,
                reason,
                since_ms,
                leader: status
                    .leader_epoch
                    .map(|e| format!("{} (epoch {e})", status.replica_id)),
            },
            epoch: command.as_ref().map_or(0, |c| c.epoch),
            version: command.as_ref().map_or(0, |c| c.version),
            timeline: changes,
            window_start_ms: window_start,
            window_end_ms: now,
            acks,
        }
    }

    // ---- pages -------------------------------------------------------------------------

    async fn overview_view(&self) -> Result<OverviewView, UiError> {
        let now = now_ms();
        self.sample(now);
        let hosts = self.registry().list(now);
        let services = self.services_now(now, &hosts).await?;
        let patterns = self.patterns_now(now).await?;
        let cluster = self.cluster(now).await;
        Ok(OverviewView {
            origin: self.parts.origin,
            generated_at_ms: now,
            clusters: vec![cluster.current],
            slos: self
                .parts
                .slo
                .latest()
                .slos
                .iter()
                .map(slo_summary)
                .collect(),
            hosts: hosts.iter().map(summary).collect(),
            services,
            top_patterns: patterns.iter().take(5).map(|p| p.summary.clone()).collect(),
        })
    }

    async fn host_view(&self, name: &str) -> Result<HostDetailView, UiError> {
        let now = now_ms();
        self.sample(now);
        let hosts = self.registry().list(now);
        let h = hosts
            .iter()
            .find(|h| h.host == name)
            .ok_or_else(|| UiError::not_found("host", name))?;
        let hist = self.host_history(name);
        let mut kv: BTreeMap<String, Vec<Point>> = BTreeMap::new();
        for e in &h.snapshot.engines {
            kv.entry(e.id.clone()).or_default();
        }
        for s in &hist {
            for (id, usage, _) in &s.engines {
                kv.entry(id.clone()).or_default().push(Point {
                    ts_ms: s.ts_ms,
                    value: *usage,
                });
            }
        }
        let idx = self.service_index(now).await?;
        let mut instances = Vec::new();
        for (svc, f) in &idx.services {
            for (id, host, _) in Self::instances_of(Some(f), svc, &hosts) {
                if host == name {
                    instances.push(InstanceRef {
                        service: svc.clone(),
                        instance: id,
                    });
                }
            }
        }
        for e in &h.snapshot.engines {
            if !e.model.is_empty()
                && !idx.services.contains_key(&e.model)
                && !instances
                    .iter()
                    .any(|i| i.instance == instance_id(name, Some(&e.id)))
            {
                instances.push(InstanceRef {
                    service: e.model.clone(),
                    instance: instance_id(name, Some(&e.id)),
                });
            }
        }
        Ok(HostDetailView {
            origin: self.parts.origin,
            generated_at_ms: now,
            host: summary(h),
            vram_series: hist
                .iter()
                .map(|s| Point {
                    ts_ms: s.ts_ms,
                    value: s.max_vram,
                })
                .collect(),
            kv_series: kv
                .into_iter()
                .map(|(name, points)| Series { name, points })
                .collect(),
            queue_series: hist
                .iter()
                .map(|s| Point {
                    ts_ms: s.ts_ms,
                    value: s.queue as f64,
                })
                .collect(),
            instances,
        })
    }

    async fn service_parts(
        &self,
        name: &str,
        now: u64,
    ) -> Result<
        (
            ServiceSummary,
            Vec<InstanceSummary>,
            Vec<HostView>,
            Vec<(String, String, Option<EngineStats>)>,
        ),
        UiError,
    > {
        let hosts = self.registry().list(now);
        let idx = self.service_index(now).await?;
        let facts = idx.services.get(name);
        let insts = Self::instances_of(facts, name, &hosts);
        if facts.is_none() && insts.is_empty() {
            return Err(UiError::not_found("service", name));
        }
        let svc = Self::service_summary(name, facts, &insts, now);
        let summaries = insts
            .iter()
            .map(|i| Self::instance_summary(&svc, facts, i, &hosts))
            .collect();
        Ok((svc, summaries, hosts, insts))
    }

    async fn service_view(&self, name: &str) -> Result<ServiceView, UiError> {
        let now = now_ms();
        let (service, instances, _, _) = self.service_parts(name, now).await?;
        Ok(ServiceView {
            origin: self.parts.origin,
            generated_at_ms: now,
            service,
            instances,
        })
    }

    async fn instance_view(&self, service: &str, instance: &str) -> Result<InstanceView, UiError> {
        let now = now_ms();
        let (_, summaries, _, insts) = self.service_parts(service, now).await?;
        let Some(pos) = insts.iter().position(|(id, _, _)| id == instance) else {
            return Err(UiError::not_found("instance", instance));
        };
        let (_, host, engine) = insts[pos].clone();
        let q = FailureQuery {
            since_ms: now.saturating_sub(24 * HOUR_MS),
            until_ms: now + 1,
            service: Some(service.to_string()),
            limit: LOG_SCAN,
            ..FailureQuery::default()
        };
        let page = self
            .store()
            .failures(&q)
            .await
            .map_err(|e| unavailable("store", e))?;
        let logs = page
            .items
            .into_iter()
            .filter(|r| r.event.host == host)
            .take(LOG_LINES)
            .map(|r| {
                let e = r.event;
                LogLine {
                    ts_ms: e.ts_ms,
                    level: level_of(e.category).into(),
                    category: e.category,
                    error_type: e.error_type,
                    message: e.message,
                    request_id: e.request_id,
                    trace_id: e.trace_id,
                    feature: e.feature,
                    criticality: e.criticality,
                }
            })
            .collect();
        Ok(InstanceView {
            origin: self.parts.origin,
            generated_at_ms: now,
            service: service.to_string(),
            instance: summaries[pos].clone(),
            engine,
            logs,
        })
    }

    async fn resource_view(&self) -> ResourceView {
        let now = now_ms();
        self.sample(now);
        let hosts = self.registry().list(now);
        let since = now.saturating_sub(30 * 60_000);
        let mut engines = Vec::new();
        for h in &hosts {
            let hist = self.host_history(&h.host);
            for e in &h.snapshot.engines {
                let queue_series = hist
                    .iter()
                    .filter(|s| s.ts_ms >= since)
                    .filter_map(|s| {
                        s.engines
                            .iter()
                            .find(|(id, _, _)| *id == e.id)
                            .map(|(_, _, q)| Point {
                                ts_ms: s.ts_ms,
                                value: *q as f64,
                            })
                    })
                    .collect();
                engines.push(EngineResource {
                    host: h.host.clone(),
                    engine: e.clone(),
                    // Snapshots do not carry load/warm-up times yet (see docs/DASHBOARDS.md).
                    model_load_s: 0.0,
                    warmup_s: 0.0,
                    queue_series,
                });
            }
        }
        ResourceView {
            origin: self.parts.origin,
            generated_at_ms: now,
            engines,
        }
    }
}

/// Failures are errors, except refusals the system chose on purpose (rate limits,
/// degradation): warnings.
fn level_of(c: Category) -> &'static str {
    match c {
        Category::RateLimited | Category::Degraded => "warn",
        _ => "error",
    }
}

/// Records a new SLO report: budget points and alert transitions.
fn record_report(c: &mut Caches, report: &SloReport) {
    if report.evaluated_at_ms == 0 || report.evaluated_at_ms == c.last_report_ms {
        return;
    }
    c.last_report_ms = report.evaluated_at_ms;
    for s in &report.slos {
        let ring = c.budgets.entry(s.name.clone()).or_default();
        if ring
            .back()
            .is_none_or(|p| report.evaluated_at_ms >= p.ts_ms + SAMPLE_EVERY_MS)
        {
            ring.push_back(Point {
                ts_ms: report.evaluated_at_ms,
                value: finite(s.budget_remaining_ratio),
            });
            while ring.len() > HISTORY_LEN {
                ring.pop_front();
            }
        }
        let events = c.alert_events.entry(s.name.clone()).or_default();
        for a in &s.alerts {
            let firing_state = match a.severity {
                Severity::Page => AlertState::Page,
                Severity::Ticket => AlertState::Ticket,
            };
            let mut push = |ts_ms: u64, state: AlertState| {
                let ev = AlertEvent {
                    ts_ms,
                    state,
                    window: a.window.clone(),
                    burn_rate: finite(a.long_burn_rate),
                };
                if !events
                    .iter()
                    .any(|e| e.ts_ms == ev.ts_ms && e.state == ev.state && e.window == ev.window)
                {
                    let at = events
                        .iter()
                        .position(|e| e.ts_ms < ts_ms)
                        .unwrap_or(events.len());
                    events.insert(at, ev);
                }
            };
            match a.state {
                SloAlertState::Firing { since_ms } => push(since_ms, firing_state),
                SloAlertState::Resolved {
                    since_ms,
                    fired_since_ms,
                } => {
                    push(fired_since_ms, firing_state);
                    push(since_ms, AlertState::Ok);
                }
                SloAlertState::Inactive | SloAlertState::Pending { .. } => {}
            }
        }
        while events.len() > ALERT_EVENTS_KEPT {
            events.pop_back();
        }
    }
}

fn finite(x: f64) -> f64 {
    if x.is_finite() { x } else { 0.0 }
}

fn slo_summary(s: &crate::slo::SloStatus) -> SloSummary {
    let burn_rates = s
        .burn_rates
        .iter()
        .map(|w| {
            // The factor of the alert pair this window belongs to (long or short window).
            let threshold = s
                .alerts
                .iter()
                .filter(|a| a.window.split('/').any(|p| p == w.window))
                .map(|a| a.factor)
                .fold(f64::NAN, f64::max);
            BurnRate {
                window: w.window.clone(),
                rate: finite(w.burn_rate),
                threshold: if threshold.is_finite() {
                    threshold
                } else {
                    1.0
                },
            }
        })
        .collect();
    let firing = |sev: Severity| s.firing().any(|a| a.severity == sev);
    SloSummary {
        name: s.name.clone(),
        objective_ratio: s.objective,
        budget_remaining_ratio: finite(s.budget_remaining_ratio),
        burn_rates,
        alert_state: if firing(Severity::Page) {
            AlertState::Page
        } else if firing(Severity::Ticket) {
            AlertState::Ticket
        } else {
            AlertState::Ok
        },
    }
}

fn pattern_detail(p: Pattern, examples: Vec<PatternExample>, now: u64) -> PatternDetail {
    let hour_ago = now.saturating_sub(HOUR_MS);
    // Buckets overlapping the last hour (the engine counts per bucket).
    let buckets: Vec<_> = p.counts.iter().collect();
    let width = match buckets.as_slice() {
        [.., a, b] => b.start_ms.saturating_sub(a.start_ms),
        _ => HOUR_MS,
    }
    .max(1);
    let count_1h = buckets
        .iter()
        .filter(|c| c.start_ms + width > hour_ago)
        .map(|c| c.count)
        .sum();
    PatternDetail {
        summary: PatternSummary {
            id: p.id.0.clone(),
            template: p.label.clone(),
            category: p.category,
            count_1h,
            impact: finite(p.budget_impact),
            services: p.services.clone(),
            is_new: p.is_new,
        },
        trend: p
            .counts
            .iter()
            .map(|c| Point {
                ts_ms: c.start_ms,
                value: c.count as f64,
            })
            .collect(),
        examples,
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
        let now = now_ms();
        self.sample(now);
        ready(Ok(HostsView {
            origin: self.parts.origin,
            generated_at_ms: now,
            hosts: self.registry().list(now).iter().map(summary).collect(),
        }))
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
        async move {
            let now = now_ms();
            let p = self.patterns_now(now).await?;
            Ok(PatternsView {
                origin: self.parts.origin,
                generated_at_ms: now,
                patterns: p.as_ref().clone(),
            })
        }
        .boxed()
    }
    fn slos(&self) -> BoxFuture<'_, Result<SloView, UiError>> {
        let now = now_ms();
        ready(Ok(SloView {
            origin: self.parts.origin,
            generated_at_ms: now,
            slos: self.slo_details(now),
        }))
    }
    fn degradation(&self) -> BoxFuture<'_, Result<DegradationView, UiError>> {
        async move {
            let now = now_ms();
            Ok(DegradationView {
                origin: self.parts.origin,
                generated_at_ms: now,
                clusters: vec![self.cluster(now).await],
            })
        }
        .boxed()
    }
    fn resource(&self) -> BoxFuture<'_, Result<ResourceView, UiError>> {
        async move { Ok(self.resource_view().await) }.boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
