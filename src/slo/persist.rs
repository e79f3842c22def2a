//! SLI counts in the store: error budgets that survive restarts and agree across replicas
//! (docs/SLO.md "Stored SLI buckets").
//!
//! ```text
//! ingest accept ─> SliCounter.count(spans, failures) ─> Batch.sli (per SLO × minute)
//!                    └─> stored with the batch's rows, in its exactly-once write
//!                        (SQLite: same transaction; ClickHouse: sli_rows, replay-checked,
//!                         summed by a materialized view into the SummingMergeTree sli_buckets)
//! start ─> load: every stored minute of the longest period ─> seed the counters in memory,
//!                the stored view, the alert states (docs `slo_alerts`)
//! run (every few s) ─> refresh the last 10 minutes (all of it every minute) ─> evaluate
//!                  ─> report, gauges; alert states stored when they change
//! ```
//!
//! Windows of 5 minutes and more, the period and the history are counted from the stored
//! buckets (the same for every replica reading the store); the seconds-scale window of the
//! fast-burn pair and time-slice SLOs from the counters in memory, which the store seeds at
//! start. While the store does not answer, every window is counted in memory.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::eval::{Observation, SavedAlert, classify, outcome_of_refusal};
use super::spec::{Period, SloSpec};
use super::task::{FUTURE_SLACK_MS, SloHandle, SloMetrics};
use crate::store::{FailureRow, SliBucket, SliCounts, SliRow, SpanRow, Store, add_sli};

/// A stored request span as an SLO observation: its end, its duration, ERROR status as bad,
/// and `brownout.deliberate = true` as a refusal on purpose (counted for no SLI).
pub fn span_observation(span: &SpanRow) -> Observation<'_> {
    let end_ms = (span.start_us + span.duration_us) / 1000;
    let attr = |k: &str| {
        span.attributes
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    };
    Observation::from_span(
        &span.service,
        end_ms,
        span.duration_us as f64 / 1000.0,
        span.status == crate::store::STATUS_ERROR,
        attr,
    )
}

/// Counts one batch's SLIs at ingest, the way the evaluator counts them: request spans, and
/// failure events without a trace id (one with a trace id is counted through its span).
pub struct SliCounter {
    specs: Vec<SloSpec>,
    by_service: HashMap<String, Vec<usize>>,
}

impl SliCounter {
    pub fn new(specs: &[SloSpec]) -> SliCounter {
        let mut by_service: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, s) in specs.iter().enumerate() {
            by_service.entry(s.service.clone()).or_default().push(i);
        }
        SliCounter {
            specs: specs.to_vec(),
            by_service,
        }
    }

    /// Adds one observation's outcome for every SLO it belongs to.
    fn add(&self, obs: &Observation<'_>, limit_ms: u64, rows: &mut Vec<SliRow>) {
        if obs.ts_ms > limit_ms {
            // Dated too far ahead: refused by the evaluator too.
            return;
        }
        let Some(ids) = self.by_service.get(obs.service) else {
            return;
        };
        let minute = obs.ts_ms - obs.ts_ms % 60_000;
        for &i in ids {
            let spec = &self.specs[i];
            let c = if obs.deliberate {
                if !outcome_of_refusal(spec, obs) {
                    continue;
                }
                SliCounts {
                    refused: 1,
                    ..SliCounts::default()
                }
            } else {
                match classify(spec, obs) {
                    Some(good) => SliCounts {
                        good: u64::from(good),
                        total: 1,
                        refused: 0,
                    },
                    None => continue,
                }
            };
            add_sli(rows, &spec.name, minute, c);
        }
    }

    /// The SLI rows of these spans and failures, summed per SLO and minute.
    pub fn count_rows(&self, spans: &[SpanRow], failures: &[FailureRow]) -> Vec<SliRow> {
        let mut rows = Vec::new();
        let limit = brownout_protocol::now_ms() + FUTURE_SLACK_MS;
        for s in spans.iter().filter(|s| s.is_request) {
            if self.by_service.contains_key(s.service.as_str()) {
                self.add(&span_observation(s), limit, &mut rows);
            }
        }
        for f in failures.iter().filter(|f| f.event.trace_id.is_empty()) {
            self.add(&Observation::from_failure(&f.event), limit, &mut rows);
        }
        rows
    }
}

impl crate::ingest::SliCounter for SliCounter {
    fn count(&self, spans: &[SpanRow], failures: &[FailureRow]) -> Vec<SliRow> {
        self.count_rows(spans, failures)
    }
}

/// How far back the stored buckets are read: the longest period of these SLOs and a day.
fn lookback_ms(specs: &[SloSpec]) -> u64 {
    let days = specs
        .iter()
        .map(|s| match s.period {
            Period::Rolling { days } => days,
            Period::CalendarMonth => 31,
        })
        .max()
        .unwrap_or(1);
    (u64::from(days) + 1) * 86_400_000
}

/// Minutes are kept this long in the stored view; older buckets are read by the hour.
const MINUTES_KEPT_MS: u64 = 3 * 86_400_000 + 3_600_000;
/// Every refresh rereads this much of the recent past (late events, the open minute).
const RECENT_MS: u64 = 10 * 60_000;
/// The whole view is reread this often (events dated further back, hours rolled up).
const FULL_EVERY: Duration = Duration::from_secs(60);
/// How long late events are reread after the last one was counted.
const LATE_REREAD: Duration = Duration::from_secs(10);
/// A store read at start or in a refresh gives up after this long (the evaluation goes on
/// from memory).
const STORE_TIMEOUT: Duration = Duration::from_secs(10);

/// Document kind of the stored alert states, one per SLO.
pub const ALERTS_DOC: &str = "slo_alerts";

/// What [`load`] found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Loaded {
    /// Stored minute buckets read.
    pub buckets: usize,
    /// SLOs whose alert states were restored.
    pub alert_states: usize,
}

/// At start, before any event is counted: seeds the counters in memory from every stored
/// minute of the longest period, fills the stored view (with `attach`) and restores the
/// stored alert states.
///
/// # Errors
/// When the store does not answer (the caller goes on from memory).
pub async fn load(
    handle: &SloHandle,
    store: &dyn Store,
    specs: &[SloSpec],
    attach: bool,
    now_ms: u64,
) -> Result<Loaded, crate::store::StoreError> {
    if attach {
        // Before the first read: a store down now is read by the next refresh.
        handle.lock_evaluator().attach_store();
    }
    let from = now_ms.saturating_sub(lookback_ms(specs));
    let to = now_ms + FUTURE_SLACK_MS + 60_000;
    let minutes = timed(store.sli_buckets(from, to, 60_000)).await?;
    let mut alerts = 0;
    handle.lock_evaluator().seed(&minutes);
    if attach {
        refresh(handle, store, specs, now_ms, true).await?;
    }
    for spec in specs {
        if let Some(doc) = timed(store.get_doc(ALERTS_DOC, &spec.name)).await?
            && let Ok(saved) = serde_json::from_value::<Vec<SavedAlert>>(doc.value)
        {
            handle.lock_evaluator().restore_alerts(&spec.name, &saved);
            alerts += 1;
        }
    }
    Ok(Loaded {
        buckets: minutes.len(),
        alert_states: alerts,
    })
}

async fn timed<T>(f: crate::store::StoreFuture<'_, T>) -> Result<T, crate::store::StoreError> {
    tokio::time::timeout(STORE_TIMEOUT, f).await.map_err(|_| {
        crate::store::StoreError::Unsettled("the store did not answer in 10 s".into())
    })?
}

/// Rereads the stored buckets into the view: the last [`RECENT_MS`] (or from `since_ms`, when
/// earlier), or (`full`) the whole lookback — minutes for the last three days, hours before.
///
/// # Errors
/// When the store does not answer (the view is then marked stale: evaluation from memory).
pub async fn refresh(
    handle: &SloHandle,
    store: &dyn Store,
    specs: &[SloSpec],
    now_ms: u64,
    full: bool,
) -> Result<(), crate::store::StoreError> {
    refresh_since(handle, store, specs, now_ms, full, now_ms).await
}

async fn refresh_since(
    handle: &SloHandle,
    store: &dyn Store,
    specs: &[SloSpec],
    now_ms: u64,
    full: bool,
    since_ms: u64,
) -> Result<(), crate::store::StoreError> {
    let to = now_ms + FUTURE_SLACK_MS + 60_000;
    // Minutes older than this are read by the hour (only a full refresh reaches them).
    let full = full || since_ms < now_ms.saturating_sub(MINUTES_KEPT_MS);
    let result: Result<(Vec<SliBucket>, u64), crate::store::StoreError> = async {
        if full {
            let from = now_ms.saturating_sub(lookback_ms(specs));
            let cut = now_ms.saturating_sub(MINUTES_KEPT_MS);
            let cut = cut - cut % 3_600_000;
            let mut b = timed(store.sli_buckets(from - from % 3_600_000, cut, 3_600_000)).await?;
            b.extend(timed(store.sli_buckets(cut, to, 60_000)).await?);
            Ok((b, 0))
        } else {
            let from = now_ms.saturating_sub(RECENT_MS).min(since_ms);
            let from = from - from % 60_000;
            Ok((timed(store.sli_buckets(from, to, 60_000)).await?, from))
        }
    }
    .await;
    match result {
        Ok((buckets, from)) => {
            handle.lock_evaluator().set_stored(&buckets, from);
            Ok(())
        }
        Err(e) => {
            handle.lock_evaluator().store_failed();
            Err(e)
        }
    }
}

/// The evaluation loop over the store: every `interval` refreshes the stored view (when
/// `attached`), evaluates, sets the gauges and stores the alert states that changed, until
/// `shutdown`.
pub async fn run(
    handle: SloHandle,
    store: Arc<dyn Store>,
    specs: Arc<Vec<SloSpec>>,
    attached: bool,
    interval: Duration,
    metrics: Option<SloMetrics>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut last_full = tokio::time::Instant::now();
    // Events dated before the recent window were counted in memory: reread from the oldest for
    // a while (with ClickHouse acknowledged from the spool they reach the store a little later).
    let mut late: Option<(u64, tokio::time::Instant)> = None;
    let mut saved: HashMap<String, Vec<SavedAlert>> = HashMap::new();
    let mut warned = false;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = ticker.tick() => {}
        }
        let now_ms = brownout_protocol::now_ms();
        if attached {
            let full = last_full.elapsed() >= FULL_EVERY;
            let oldest = handle.lock_evaluator().take_oldest_recorded();
            if let Some(o) = oldest.filter(|o| *o < now_ms.saturating_sub(RECENT_MS)) {
                let from = late.map_or(o, |(f, _)| f.min(o));
                late = Some((from, tokio::time::Instant::now() + LATE_REREAD));
            }
            if late.is_some_and(|(_, until)| tokio::time::Instant::now() > until) {
                late = None;
            }
            let since = late.map_or(now_ms, |(f, _)| f);
            match refresh_since(&handle, store.as_ref(), &specs, now_ms, full, since).await {
                Ok(()) => {
                    warned = false;
                    if full {
                        last_full = tokio::time::Instant::now();
                    }
                }
                Err(e) if !warned => {
                    warned = true;
                    tracing::warn!(error = %e, "cannot read the stored SLI buckets; evaluating from memory");
                }
                Err(_) => {}
            }
        }
        let report = handle.evaluate(now_ms);
        if let Some(m) = &metrics {
            m.update(&report);
        }
        super::task::log_new_firing(&report, now_ms);
        let states = handle.lock_evaluator().alert_states();
        for (slo, alerts) in states {
            if saved.get(&slo) == Some(&alerts) {
                continue;
            }
            let Ok(json) = serde_json::to_value(&alerts) else {
                continue;
            };
            match timed(store.put_doc(ALERTS_DOC, &slo, &json)).await {
                Ok(()) => {
                    saved.insert(slo, alerts);
                }
                Err(e) => tracing::warn!(error = %e, slo = %slo, "cannot store SLO alert states"),
            }
        }
    }
}

/// One SLO's bad events in a window (from the stored SLI buckets): the denominator of a
/// failure pattern's impact on it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SloBad {
    pub slo: String,
    /// The SLO's service and feature selector: a template's failures count for the SLO when
    /// its service is this one and (with a feature) it was seen on that feature.
    pub service: String,
    pub feature: Option<String>,
    pub bad: u64,
}

/// Each SLO's real bad events (failures; refusals on purpose are not bad) in
/// `[since_ms, until_ms)`, from the stored SLI buckets (minute-aligned): what a failure
/// pattern's impact is measured against (`PatternEngine::patterns_by_slo_impact` in
/// `patterns::engine`).
/// `None` when no SLO has any stored count in the window (no SLO saw traffic, or the data was
/// stored before the buckets existed): the caller ranks by the share of failures then.
///
/// # Errors
/// When the store does not answer.
pub async fn slo_bad_events(
    store: &dyn Store,
    specs: &[SloSpec],
    since_ms: u64,
    until_ms: u64,
) -> Result<Option<Vec<SloBad>>, crate::store::StoreError> {
    let from = since_ms - since_ms % 60_000;
    let span = until_ms.saturating_sub(from).max(1).div_ceil(60_000) * 60_000;
    let rows = timed(store.sli_buckets(from, until_ms, span)).await?;
    if !rows
        .iter()
        .any(|r| specs.iter().any(|s| s.name == r.slo) && r.counts.total + r.counts.refused > 0)
    {
        return Ok(None);
    }
    Ok(Some(
        specs
            .iter()
            .map(|s| SloBad {
                slo: s.name.clone(),
                service: s.service.clone(),
                feature: s.selector.feature.clone(),
                bad: rows
                    .iter()
                    .filter(|r| r.slo == s.name)
                    .map(|r| r.counts.total.saturating_sub(r.counts.good))
                    .sum(),
            })
            .collect(),
    ))
}
