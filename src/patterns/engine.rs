//! The online pattern engine: failure events in, ranked failure patterns out. Pure (no IO, no
//! clock: time comes from the events and the query).
//!
//! ```text
//!  observe(&FailureEvent) ─> miner (message -> TemplateId) ─> per-template stats, bucketed by hour
//!  patterns(since, until) ─> templates active in the window ─> cluster (linfa DBSCAN) ─> Pattern
//!                              ranked by budget impact (share of the window's failures)
//! ```
//!
//! Memory: templates are capped by the miner (evicted ones drop their stats), buckets older than
//! `retention_ms` are dropped, user/request sets per bucket are capped.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use brownout_protocol::{Category, FailureEvent};
use serde::{Deserialize, Serialize};

use super::cluster::{ClusterConfig, ClusterItem, cluster};
use super::hash::stable_hash;
use super::miner::{MinerConfig, MinerError, MinerState, TemplateId, TemplateMiner};
use super::trace::{MinerInput, miner_input};

/// What the miner mines for `ev` ([`miner_input`]): keyed by its `error_type` (else the type
/// its trace names) and the fingerprint of its stack frames (in the message, or in the
/// `exception.stacktrace` attribute OTLP carries).
pub fn miner_input_of(ev: &FailureEvent) -> MinerInput<'_> {
    miner_input(
        &ev.error_type,
        &ev.message,
        ev.attributes
            .get("exception.stacktrace")
            .map(String::as_str),
    )
}

/// Engine knobs.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    pub miner: MinerConfig,
    pub cluster: ClusterConfig,
    /// Width of a counting bucket.
    pub bucket_ms: u64,
    /// Buckets older than this (before the newest event) are dropped.
    pub retention_ms: u64,
    /// Distinct users (and requests) remembered per template per bucket.
    pub max_ids_per_bucket: usize,
    /// Example trace ids kept per template.
    pub num_examples: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            miner: MinerConfig::default(),
            cluster: ClusterConfig::default(),
            bucket_ms: 3_600_000,
            retention_ms: 35 * 86_400_000,
            max_ids_per_bucket: 5_000,
            num_examples: 3,
        }
    }
}

#[derive(Debug, Default, Clone)]
struct Bucket {
    count: u64,
    users: HashSet<u64>,
    requests: HashSet<u64>,
}

#[derive(Debug, Clone)]
struct TemplateStats {
    first_seen_ms: u64,
    last_seen_ms: u64,
    category_counts: BTreeMap<Category, u64>,
    error_type: String,
    service: String,
    feature: String,
    model: String,
    features: BTreeSet<String>,
    buckets: BTreeMap<u64, Bucket>,
    examples: VecDeque<String>,
}

/// A failure pattern's id: `p` + 16 hex digits, derived from its oldest template's id, so it
/// stays the same while the pattern grows.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PatternId(pub String);

impl PatternId {
    pub fn from_template(t: TemplateId) -> PatternId {
        PatternId(format!(
            "p{:016x}",
            stable_hash(&[b"pattern", &t.0.to_le_bytes()])
        ))
    }
}

impl std::fmt::Display for PatternId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Failures in one time window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowCount {
    pub start_ms: u64,
    pub count: u64,
}

/// Direction of a pattern against the previous window of the same length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrendDirection {
    New,
    Rising,
    Steady,
    Falling,
}

/// Trend against the previous window of the same length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trend {
    pub direction: TrendDirection,
    pub previous_count: u64,
    /// count / previous_count − 1 (None when there was nothing before).
    pub change_ratio: Option<f64>,
}

/// A failure pattern over a window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Pattern {
    pub id: PatternId,
    /// The pattern's most frequent template in the window.
    pub label: String,
    pub category: Category,
    pub templates: Vec<TemplateId>,
    pub first_seen_ms: u64,
    pub last_seen_ms: u64,
    pub count: u64,
    pub counts: Vec<WindowCount>,
    pub affected_users: u64,
    pub affected_requests: u64,
    pub services: Vec<String>,
    pub features: Vec<String>,
    pub error_types: Vec<String>,
    /// Share of the window's bad events it explains: of the SLOs' bad events when they are
    /// given ([`PatternEngine::patterns_by_slo_impact`]: the failures of the pattern on the
    /// SLOs' services over all their bad events), else of all failures.
    pub budget_impact: f64,
    /// Per SLO with bad events in the window: the share of them this pattern explains (empty
    /// when no SLO-bad events were given).
    #[serde(default)]
    pub slo_impact: Vec<SloImpact>,
    pub example_trace_ids: Vec<String>,
    pub trend: Trend,
    /// First seen inside the window.
    #[serde(rename = "new")]
    pub is_new: bool,
}

/// One SLO's bad events in a window: defined beside the SLI buckets it is read from.
pub use crate::slo::persist::SloBad;

/// A pattern's share of one SLO's bad events in the window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SloImpact {
    pub slo: String,
    /// Failures of the pattern counted for the SLO / the SLO's bad events (at most 1).
    pub share: f64,
    /// Failures of the pattern counted for the SLO.
    pub events: u64,
}

/// The engine as shared between ingest (observe) and the API (query).
pub type SharedEngine = std::sync::Arc<std::sync::Mutex<PatternEngine>>;

/// The engine. Not `Sync` by itself: share it as `Arc<Mutex<PatternEngine>>`.
#[derive(Debug)]
pub struct PatternEngine {
    config: EngineConfig,
    miner: TemplateMiner,
    stats: HashMap<TemplateId, TemplateStats>,
    newest_ms: u64,
    pruned_at_bucket: u64,
    num_observed: u64,
}

impl Default for PatternEngine {
    fn default() -> Self {
        PatternEngine::new(EngineConfig::default())
    }
}

impl PatternEngine {
    pub fn new(config: EngineConfig) -> Self {
        let miner = TemplateMiner::new(config.miner.clone());
        PatternEngine {
            config,
            miner,
            stats: HashMap::new(),
            newest_ms: 0,
            pruned_at_bucket: 0,
            num_observed: 0,
        }
    }

    /// An engine whose miner continues from saved state (template ids survive restarts).
    ///
    /// # Errors
    /// The state is refused by [`TemplateMiner::from_state`].
    pub fn with_miner_state(config: EngineConfig, state: MinerState) -> Result<Self, MinerError> {
        let mut e = PatternEngine::new(config);
        e.miner = TemplateMiner::from_state(state)?;
        Ok(e)
    }

    /// The miner's state, to persist.
    pub fn miner_state(&self) -> MinerState {
        self.miner.state()
    }

    pub fn miner(&self) -> &TemplateMiner {
        &self.miner
    }

    /// Timestamp of the newest event observed (unix ms; 0 before any).
    pub fn newest_ms(&self) -> u64 {
        self.newest_ms
    }

    pub fn num_observed(&self) -> u64 {
        self.num_observed
    }

    /// The template id [`PatternEngine::observe`] would give `ev` now, without taking it into
    /// account ([`TemplateMiner::lookup`]).
    pub fn lookup(&self, ev: &FailureEvent) -> TemplateId {
        let input = miner_input_of(ev);
        self.miner.lookup_keyed(&input.key, &input.text)
    }

    /// Takes one failure into account; returns its template id.
    pub fn observe(&mut self, ev: &FailureEvent) -> TemplateId {
        self.num_observed += 1;
        let input = miner_input_of(ev);
        let id = self.miner.add_keyed(&input.key, &input.text);
        for gone in self.miner.drain_evicted() {
            self.stats.remove(&gone);
        }
        let cfg = &self.config;
        let bucket_start = ev.ts_ms - ev.ts_ms % cfg.bucket_ms.max(1);
        let st = self.stats.entry(id).or_insert_with(|| TemplateStats {
            first_seen_ms: ev.ts_ms,
            last_seen_ms: ev.ts_ms,
            category_counts: BTreeMap::new(),
            error_type: String::new(),
            service: String::new(),
            feature: String::new(),
            model: String::new(),
            features: BTreeSet::new(),
            buckets: BTreeMap::new(),
            examples: VecDeque::new(),
        });
        st.first_seen_ms = st.first_seen_ms.min(ev.ts_ms);
        st.last_seen_ms = st.last_seen_ms.max(ev.ts_ms);
        *st.category_counts.entry(ev.category).or_default() += 1;
        for (slot, v) in [
            (&mut st.error_type, &input.error_type),
            (&mut st.service, &ev.service),
            (&mut st.feature, &ev.feature),
        ] {
            if !v.is_empty() && slot != v {
                v.clone_into(slot);
            }
        }
        if let Some(m) = ev.attributes.get("model") {
            m.clone_into(&mut st.model);
        }
        if !ev.feature.is_empty() && st.features.len() < 32 && !st.features.contains(&ev.feature) {
            st.features.insert(ev.feature.clone());
        }
        let b = st.buckets.entry(bucket_start).or_default();
        b.count += 1;
        if !ev.user_id.is_empty() && b.users.len() < cfg.max_ids_per_bucket {
            b.users.insert(stable_hash(&[ev.user_id.as_bytes()]));
        }
        let req = if ev.request_id.is_empty() {
            &ev.trace_id
        } else {
            &ev.request_id
        };
        if !req.is_empty() && b.requests.len() < cfg.max_ids_per_bucket {
            b.requests.insert(stable_hash(&[req.as_bytes()]));
        }
        if !ev.trace_id.is_empty() && !st.examples.contains(&ev.trace_id) {
            st.examples.push_back(ev.trace_id.clone());
            if st.examples.len() > cfg.num_examples {
                st.examples.pop_front();
            }
        }
        if ev.ts_ms > self.newest_ms {
            self.newest_ms = ev.ts_ms;
            self.prune();
        }
        id
    }

    /// Drops buckets older than the retention (runs when a new bucket starts).
    fn prune(&mut self) {
        let horizon = self.newest_ms.saturating_sub(self.config.retention_ms);
        let bucket = self.config.bucket_ms.max(1);
        let newest_bucket = self.newest_ms - self.newest_ms % bucket;
        if newest_bucket <= self.pruned_at_bucket {
            return; // once per new bucket
        }
        self.pruned_at_bucket = newest_bucket;
        self.stats.retain(|_, st| {
            st.buckets = st.buckets.split_off(&(horizon - horizon % bucket));
            !st.buckets.is_empty()
        });
    }

    /// Patterns active in `[since_ms, until_ms)`, ranked by budget impact (share of all failures
    /// in the window).
    pub fn patterns(&self, since_ms: u64, until_ms: u64) -> Vec<Pattern> {
        self.patterns_with_bad_events(since_ms, until_ms, None)
    }

    /// Patterns of `[since_ms, until_ms)` ranked by their real impact: the share of the SLOs'
    /// bad events in the window (`slos`, from the stored SLI buckets) that their failures
    /// explain, per SLO ([`Pattern::slo_impact`]) and overall ([`Pattern::budget_impact`]: the
    /// pattern's failures counted for the SLOs over all their bad events; a failure counts
    /// once per SLO whose service and feature it is on). A pattern on no SLO's service has
    /// impact 0. Ties: by count, then id. The criticality selector of an SLO is not applied
    /// (the engine does not keep it per template).
    pub fn patterns_by_slo_impact(
        &self,
        since_ms: u64,
        until_ms: u64,
        slos: &[SloBad],
    ) -> Vec<Pattern> {
        let mut out = self.patterns_with_bad_events(since_ms, until_ms, None);
        let total_bad: u64 = slos.iter().map(|s| s.bad).sum();
        for p in &mut out {
            let mut matched = vec![0u64; slos.len()];
            for t in &p.templates {
                let Some(st) = self.stats.get(t) else {
                    continue;
                };
                let count: u64 = st
                    .buckets
                    .range(since_ms..until_ms.max(since_ms))
                    .map(|(_, b)| b.count)
                    .sum();
                for (m, slo) in matched.iter_mut().zip(slos) {
                    let feature_ok = slo
                        .feature
                        .as_deref()
                        .is_none_or(|f| st.feature == f || st.features.contains(f));
                    if st.service == slo.service && feature_ok {
                        *m += count;
                    }
                }
            }
            p.slo_impact = slos
                .iter()
                .zip(&matched)
                .filter(|(s, _)| s.bad > 0)
                .map(|(s, &m)| SloImpact {
                    slo: s.slo.clone(),
                    share: (m as f64 / s.bad as f64).min(1.0),
                    events: m,
                })
                .collect();
            let explained: u64 = slos
                .iter()
                .zip(&matched)
                .filter(|(s, _)| s.bad > 0)
                .map(|(_, &m)| m)
                .sum();
            p.budget_impact = if total_bad == 0 {
                0.0
            } else {
                (explained as f64 / total_bad as f64).min(1.0)
            };
        }
        out.sort_by(|a, b| {
            b.budget_impact
                .total_cmp(&a.budget_impact)
                .then(b.count.cmp(&a.count))
                .then(a.id.cmp(&b.id))
        });
        out
    }

    /// Like [`PatternEngine::patterns`], with the SLO's bad-event count in the window as the
    /// denominator of `budget_impact` (capped at 1).
    pub fn patterns_with_bad_events(
        &self,
        since_ms: u64,
        until_ms: u64,
        bad_events: Option<u64>,
    ) -> Vec<Pattern> {
        let until_ms = until_ms.max(since_ms);
        let len = until_ms - since_ms;
        let prev_since = since_ms.saturating_sub(len);
        // Templates with failures in the window.
        struct Active<'a> {
            id: TemplateId,
            st: &'a TemplateStats,
            count: u64,
            prev: u64,
            category: Category,
        }
        let mut active: Vec<Active<'_>> = Vec::new();
        for (id, st) in &self.stats {
            let count: u64 = st
                .buckets
                .range(since_ms..until_ms)
                .map(|(_, b)| b.count)
                .sum();
            if count == 0 {
                continue;
            }
            let prev: u64 = st
                .buckets
                .range(prev_since..since_ms)
                .map(|(_, b)| b.count)
                .sum();
            let category = st
                .category_counts
                .iter()
                .max_by_key(|(c, n)| (**n, std::cmp::Reverse(**c)))
                .map_or(Category::Other, |(c, _)| *c);
            active.push(Active {
                id: *id,
                st,
                count,
                prev,
                category,
            });
        }
        active.sort_by(|a, b| b.count.cmp(&a.count).then(a.id.cmp(&b.id)));
        let texts: Vec<String> = active
            .iter()
            .map(|a| self.miner.template(a.id).unwrap_or_default())
            .collect();
        let items: Vec<ClusterItem<'_>> = active
            .iter()
            .zip(&texts)
            .map(|(a, t)| ClusterItem {
                template: t,
                category: a.category.as_str(),
                error_type: &a.st.error_type,
                service: &a.st.service,
                feature: &a.st.feature,
                model: &a.st.model,
                count: a.count,
            })
            .collect();
        let labels = cluster(&items, &self.config.cluster);
        let total: u64 = active.iter().map(|a| a.count).sum();
        let denom = bad_events.unwrap_or(total).max(1) as f64;
        let mut groups: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, l) in labels.iter().enumerate() {
            groups.entry(*l).or_default().push(i);
        }
        let step = {
            let b = self.config.bucket_ms.max(1);
            let n = len.div_ceil(b).max(1);
            b * n.div_ceil(48)
        };
        let mut out: Vec<Pattern> = groups
            .into_values()
            .map(|members| {
                let ms: Vec<&Active<'_>> = members.iter().map(|&i| &active[i]).collect();
                let oldest = ms
                    .iter()
                    .min_by_key(|a| (a.st.first_seen_ms, a.id))
                    .expect("a cluster has members");
                let label_i = members[0]; // active is sorted by count, members keep that order
                let count: u64 = ms.iter().map(|a| a.count).sum();
                let prev: u64 = ms.iter().map(|a| a.prev).sum();
                let first_seen_ms = ms
                    .iter()
                    .map(|a| a.st.first_seen_ms)
                    .min()
                    .unwrap_or(since_ms);
                let mut users: HashSet<u64> = HashSet::new();
                let mut requests: HashSet<u64> = HashSet::new();
                let mut series: BTreeMap<u64, u64> = BTreeMap::new();
                let mut s = since_ms;
                while s < until_ms {
                    series.insert(s, 0);
                    match s.checked_add(step) {
                        Some(next) => s = next,
                        None => break,
                    }
                }
                for a in &ms {
                    for (start, b) in a.st.buckets.range(since_ms..until_ms) {
                        users.extend(&b.users);
                        requests.extend(&b.requests);
                        let k = since_ms + (start.saturating_sub(since_ms) / step) * step;
                        *series.entry(k).or_default() += b.count;
                    }
                }
                let collect = |f: &dyn Fn(&TemplateStats) -> Vec<String>| -> Vec<String> {
                    let set: BTreeSet<String> = ms
                        .iter()
                        .flat_map(|a| f(a.st))
                        .filter(|s| !s.is_empty())
                        .collect();
                    set.into_iter().collect()
                };
                let direction = if first_seen_ms >= since_ms || prev == 0 {
                    TrendDirection::New
                } else if count as f64 > prev as f64 * 1.2 {
                    TrendDirection::Rising
                } else if (count as f64) < prev as f64 * 0.8 {
                    TrendDirection::Falling
                } else {
                    TrendDirection::Steady
                };
                Pattern {
                    id: PatternId::from_template(oldest.id),
                    label: texts[label_i].clone(),
                    category: active[label_i].category,
                    templates: ms.iter().map(|a| a.id).collect(),
                    first_seen_ms,
                    last_seen_ms: ms
                        .iter()
                        .map(|a| a.st.last_seen_ms)
                        .max()
                        .unwrap_or(until_ms),
                    count,
                    counts: series
                        .into_iter()
                        .map(|(start_ms, count)| WindowCount { start_ms, count })
                        .collect(),
                    affected_users: users.len() as u64,
                    affected_requests: requests.len() as u64,
                    services: collect(&|s| vec![s.service.clone()]),
                    features: collect(&|s| s.features.iter().cloned().collect()),
                    error_types: collect(&|s| vec![s.error_type.clone()]),
                    budget_impact: (count as f64 / denom).min(1.0),
                    slo_impact: Vec::new(),
                    example_trace_ids: ms
                        .iter()
                        .flat_map(|a| a.st.examples.iter().cloned())
                        .take(self.config.num_examples)
                        .collect(),
                    trend: Trend {
                        direction,
                        previous_count: prev,
                        change_ratio: (prev > 0).then(|| count as f64 / prev as f64 - 1.0),
                    },
                    is_new: first_seen_ms >= since_ms,
                }
            })
            .collect();
        out.sort_by(|a, b| b.count.cmp(&a.count).then(a.id.cmp(&b.id)));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = 3_600_000;

    fn ev(ts_ms: u64, msg: &str, cat: Category, user: &str, trace: &str) -> FailureEvent {
        FailureEvent {
            ts_ms,
            service: "muse-agent".into(),
            host: String::new(),
            request_id: format!("req-{trace}"),
            trace_id: trace.into(),
            user_id: user.into(),
            feature: "trip_planner".into(),
            criticality: Default::default(),
            category: cat,
            error_type: "AgentExecutionFailed".into(),
            message: msg.into(),
            latency_ms: 0.0,
            attributes: Default::default(),
        }
    }

    #[test]
    fn patterns_are_ranked_by_impact_with_counts_users_and_trend() {
        let mut e = PatternEngine::default();
        let t0 = 100 * H;
        // Previous day: 2 tool timeouts.
        e.observe(&ev(
            t0 - 20 * H,
            "tool call to the weather API timed out after 8000 ms",
            Category::ToolUnavailable,
            "u1",
            "t1",
        ));
        e.observe(&ev(
            t0 - 19 * H,
            "tool call to the hotel API timed out after 5000 ms",
            Category::ToolUnavailable,
            "u2",
            "t2",
        ));
        // This day: 6 tool timeouts, 3 KV exhaustion (new).
        for i in 0..6 {
            let api = ["weather", "hotel", "flights"][i % 3];
            e.observe(&ev(
                t0 + i as u64 * H,
                &format!("tool call to the {api} API timed out after {} ms", 1000 + i),
                Category::ToolUnavailable,
                &format!("u{}", i % 4),
                &format!("a{i}"),
            ));
        }
        for i in 0..3 {
            e.observe(&ev(
                t0 + 2 * H + i,
                &format!("KV cache exhausted: no free blocks for seq {i}"),
                Category::KvCacheExhausted,
                "u9",
                &format!("k{i}"),
            ));
        }
        let ps = e.patterns(t0, t0 + 24 * H);
        assert_eq!(ps.len(), 2, "{ps:#?}");
        let (tool, kv) = (&ps[0], &ps[1]);
        assert_eq!(tool.category, Category::ToolUnavailable);
        assert_eq!(tool.count, 6);
        assert_eq!(
            tool.label,
            "tool call to the <*> API timed out after <*> ms"
        );
        assert_eq!(tool.affected_users, 4);
        assert_eq!(tool.affected_requests, 6);
        assert!((tool.budget_impact - 6.0 / 9.0).abs() < 1e-9);
        assert_eq!(tool.trend.direction, TrendDirection::Rising);
        assert_eq!(tool.trend.previous_count, 2);
        assert!(!tool.is_new);
        assert_eq!(tool.counts.iter().map(|c| c.count).sum::<u64>(), 6);
        assert_eq!(tool.features, vec!["trip_planner".to_string()]);
        assert_eq!(kv.category, Category::KvCacheExhausted);
        assert!(kv.is_new);
        assert_eq!(kv.trend.direction, TrendDirection::New);
        assert_eq!(kv.example_trace_ids.len(), 3);
        // An SLO's bad events as the denominator.
        let ps = e.patterns_with_bad_events(t0, t0 + 24 * H, Some(12));
        assert!((ps[0].budget_impact - 0.5).abs() < 1e-9);
        // Ids are stable over time windows.
        let earlier = e.patterns(t0 - 24 * H, t0);
        assert_eq!(earlier[0].id, tool.id);
        assert!(e.patterns(t0 + 48 * H, t0 + 72 * H).is_empty());
    }

    #[test]
    fn old_buckets_are_dropped_after_retention() {
        let cfg = EngineConfig {
            retention_ms: 48 * H,
            ..EngineConfig::default()
        };
        let mut e = PatternEngine::new(cfg);
        e.observe(&ev(H, "disk full on node 1", Category::Other, "u", "t"));
        e.observe(&ev(
            100 * H,
            "unrelated later thing happened",
            Category::Other,
            "u",
            "t2",
        ));
        assert!(e.patterns(0, 10 * H).is_empty());
        assert_eq!(e.patterns(99 * H, 101 * H).len(), 1);
    }

    proptest::proptest! {
        #[test]
        fn any_events_and_windows_never_panic_and_counts_add_up(
            ts in proptest::collection::vec(0u64..u64::MAX, 1..30),
            since in proptest::num::u64::ANY,
            until in proptest::num::u64::ANY,
        ) {
            let mut e = PatternEngine::default();
            for (i, t) in ts.iter().enumerate() {
                e.observe(&ev(*t, &format!("failure kind {} happened {}", ["a", "b", "c"][i % 3], i), Category::Other, "u", "t"));
            }
            let ps = e.patterns(since, until);
            for p in &ps {
                proptest::prop_assert_eq!(p.counts.iter().map(|c| c.count).sum::<u64>(), p.count);
                proptest::prop_assert!(p.budget_impact <= 1.0);
            }
        }
    }
}
