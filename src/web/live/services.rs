//! The service and instance pages (the service → instance → logs drill-down), and the service
//! list of the overview.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use brownout_protocol::{Category, EngineStats, Tier, now_ms};

use super::{
    HOUR_MS, LOG_LINES, LOG_SCAN, LiveDataSource, SERVICE_CACHE_MS, SERVICE_SCAN, host_state,
    instance_id, lock, tier_of, unavailable,
};
use crate::ingest::hosts::HostView;
use crate::store::{CountQuery, FailurePage, FailureQuery, RequestCount};
use crate::web::model::{
    HostState, InstanceSummary, InstanceView, LogLine, Point, ServiceSummary, ServiceView, UiError,
};

/// Window of the rates and ratios shown for services.
const RATE_WINDOW_MS: u64 = 5 * 60_000;
/// Bucket of the services' error trend.
const TREND_BUCKET_MS: u64 = 5 * 60_000;

/// Services seen in the last hour, with their golden signals and where they run.
#[derive(Debug, Default, Clone)]
pub(super) struct ServiceIndex {
    pub(super) services: BTreeMap<String, ServiceFacts>,
}

#[derive(Debug, Default, Clone)]
pub(super) struct ServiceFacts {
    /// Request spans in the rate window.
    total: u64,
    good: u64,
    /// Failures in the rate window, all and per host.
    failures: u64,
    failures_by_host: BTreeMap<String, u64>,
    /// Hosts it reported failures from in the last hour.
    pub(super) hosts: BTreeSet<String>,
    /// Per trend bucket start: (good, total, failures).
    buckets: BTreeMap<u64, (u64, u64, u64)>,
}

impl ServiceFacts {
    /// Bad events: failed spans, or the failures reported, whichever is more (an error span
    /// also becomes a failure, so the two are not added).
    pub(super) fn ratio(good: u64, total: u64, failures: u64) -> (f64, f64) {
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

impl ServiceIndex {
    /// The index with the hosts of a service that only sent spans so far. A service learns its
    /// hosts from its failure reports (request counts carry no host), so a fresh deployment
    /// showed `chat 0 instances` beside its engines listed under their model name (`default 2
    /// instances`) until the first failure. When exactly one service has traffic and no known
    /// host, the hosts with engines that no service reports from are its own; with several
    /// such services nothing is guessed.
    pub(super) fn attributed(&self, hosts: &[HostView]) -> ServiceIndex {
        let mut idx = self.clone();
        let hostless: Vec<String> = idx
            .services
            .iter()
            .filter(|(_, f)| f.hosts.is_empty() && f.buckets.values().any(|b| b.1 > 0))
            .map(|(n, _)| n.clone())
            .collect();
        let [only] = hostless.as_slice() else {
            return idx;
        };
        let claimed: BTreeSet<&String> = self.services.values().flat_map(|f| &f.hosts).collect();
        let unclaimed: Vec<String> = hosts
            .iter()
            .filter(|h| !h.snapshot.engines.is_empty() && !claimed.contains(&h.host))
            .map(|h| h.host.clone())
            .collect();
        if let Some(f) = idx.services.get_mut(only) {
            f.hosts.extend(unclaimed);
        }
        idx
    }
}

/// An instance of a service: `(instance id, host, its engine when it has one)`.
pub(super) type Instance = (String, String, Option<EngineStats>);

/// The index over one hour's request counts and failures.
fn build_index(counts: &[RequestCount], failures: &FailurePage, now: u64) -> ServiceIndex {
    let mut idx = ServiceIndex::default();
    let rate_since = now.saturating_sub(RATE_WINDOW_MS);
    for c in counts {
        let f = idx.services.entry(c.service.clone()).or_default();
        let b = f.buckets.entry(c.bucket_ms).or_default();
        // Requests refused on purpose are traffic, not errors (docs/SLO.md "Deliberate
        // refusals").
        b.0 += c.good + c.refused;
        b.1 += c.total + c.refused;
        // A bucket counts for the rate when it overlaps the rate window.
        if c.bucket_ms + TREND_BUCKET_MS > rate_since {
            f.good += c.good + c.refused;
            f.total += c.total + c.refused;
        }
    }
    for r in &failures.items {
        let e = &r.event;
        let f = idx.services.entry(e.service.clone()).or_default();
        if !e.host.is_empty() {
            f.hosts.insert(e.host.clone());
        }
        if e.is_deliberate() {
            continue;
        }
        let bucket = e.ts_ms - e.ts_ms % TREND_BUCKET_MS;
        f.buckets.entry(bucket).or_default().2 += 1;
        if e.ts_ms >= rate_since {
            f.failures += 1;
            *f.failures_by_host.entry(e.host.clone()).or_default() += 1;
        }
    }
    idx
}

/// The instances of `service`: every engine on the hosts it reported from, and every engine
/// serving a model named like the service; a reporting host without engines is an instance by
/// itself.
pub(super) fn instances_of(
    facts: Option<&ServiceFacts>,
    service: &str,
    hosts: &[HostView],
) -> Vec<Instance> {
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
    instances: &[Instance],
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
        .map(|(b, (good, total, failures))| {
            Point::new(*b, ServiceFacts::ratio(*good, *total, *failures).1)
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
    (id, host, engine): &Instance,
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

/// Every service to list: those in the index, and the models of engines on hosts no service
/// reported from (they still show, under their model's name).
pub(super) fn service_list(
    idx: &ServiceIndex,
    hosts: &[HostView],
    now: u64,
) -> Vec<ServiceSummary> {
    let mut names: BTreeSet<String> = idx.services.keys().cloned().collect();
    for h in hosts {
        for e in &h.snapshot.engines {
            if !e.model.is_empty() && !idx.services.values().any(|f| f.hosts.contains(&h.host)) {
                names.insert(e.model.clone());
            }
        }
    }
    names
        .iter()
        .map(|n| {
            let f = idx.services.get(n);
            let inst = instances_of(f, n, hosts);
            service_summary(n, f, &inst, now)
        })
        .collect()
}

/// A service's summary, its instances' summaries and the instances themselves; `None` when
/// nothing is known of it.
fn service_parts(
    idx: &ServiceIndex,
    name: &str,
    hosts: &[HostView],
    now: u64,
) -> Option<(ServiceSummary, Vec<InstanceSummary>, Vec<Instance>)> {
    let facts = idx.services.get(name);
    let insts = instances_of(facts, name, hosts);
    if facts.is_none() && insts.is_empty() {
        return None;
    }
    let svc = service_summary(name, facts, &insts, now);
    let summaries = insts
        .iter()
        .map(|i| instance_summary(&svc, facts, i, hosts))
        .collect();
    Some((svc, summaries, insts))
}

/// Failures are errors, except refusals the system chose on purpose (rate limits,
/// degradation): warnings.
fn level_of(c: Category) -> &'static str {
    match c {
        Category::RateLimited | Category::Degraded => "warn",
        _ => "error",
    }
}

/// The newest [`LOG_LINES`] of a service's failures that came from `host`.
fn log_lines(page: FailurePage, host: &str) -> Vec<LogLine> {
    page.items
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
        .collect()
}

impl LiveDataSource {
    /// The service index of the last hour (two store queries), cached for
    /// [`SERVICE_CACHE_MS`].
    pub(super) async fn service_index(&self, now: u64) -> Result<Arc<ServiceIndex>, UiError> {
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
        let idx = Arc::new(build_index(&counts, &failures, now));
        lock(&self.caches).services = Some((now, idx.clone()));
        Ok(idx)
    }

    pub(super) async fn service_view(&self, name: &str) -> Result<ServiceView, UiError> {
        let now = now_ms();
        let hosts = self.registry().list(now);
        let idx = self.service_index(now).await?.attributed(&hosts);
        let (service, instances, _) = service_parts(&idx, name, &hosts, now)
            .ok_or_else(|| UiError::not_found("service", name))?;
        Ok(ServiceView {
            origin: self.parts.origin,
            generated_at_ms: now,
            service,
            instances,
        })
    }

    pub(super) async fn instance_view(
        &self,
        service: &str,
        instance: &str,
    ) -> Result<InstanceView, UiError> {
        let now = now_ms();
        let hosts = self.registry().list(now);
        let idx = self.service_index(now).await?.attributed(&hosts);
        let (_, summaries, insts) = service_parts(&idx, service, &hosts, now)
            .ok_or_else(|| UiError::not_found("service", service))?;
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
        Ok(InstanceView {
            origin: self.parts.origin,
            generated_at_ms: now,
            service: service.to_string(),
            instance: summaries[pos].clone(),
            engine,
            logs: log_lines(page, &host),
        })
    }
}
