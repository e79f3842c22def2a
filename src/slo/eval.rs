//! The in-process evaluator: events in, [`SloStatus`] out. Pure (no clock, no IO): the caller
//! passes every timestamp, which is what makes it testable to the millisecond.
//!
//! ```text
//! Observation ──> service index ──> SLOs of that service ──> classify (selector + SLI kind)
//!                                                              │ good / bad
//!                                                              v
//!                                   [timeslices: open slices ─ close ─> 1 good|bad slice]
//!                                                              v
//!                                                    Rings (10 s / 1 m / 1 h buckets)
//! evaluate(now) ──> per SLO: window sums ─> burn rates, budget, alert pairs ─> AlertMachine
//! ```

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::alert::{AlertMachine, AlertState};
use super::budget::{self, Counts, PairKind, Severity, WindowPair};
use super::duration::format_secs;
use super::ring::Rings;
use super::spec::{Budgeting, Period, SloSpec};
use crate::store::{SliBucket, SliCounts};

pub use super::observe::{EventKind, Observation, classify, outcome_of_refusal};
use super::observe::{classify_kind, matches_selector};

/// Index of an SLO inside an [`Evaluator`], for [`Evaluator::record_outcome`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SloId(pub usize);

/// One window's burn rate.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WindowBurn {
    /// `5m`, `1h`, …
    pub window: String,
    pub window_secs: u64,
    pub burn_rate: f64,
    /// Events (or, with timeslices, slices) counted in the window.
    pub events: u64,
}

/// One alert pair's state.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AlertStatus {
    /// The alert name (as in the generated Prometheus rules).
    pub alert: String,
    pub kind: PairKind,
    pub severity: Severity,
    /// `1h/5m`.
    pub window: String,
    pub factor: f64,
    pub long_burn_rate: f64,
    pub short_burn_rate: f64,
    #[serde(flatten)]
    pub state: AlertState,
}

/// Everything known about one SLO at one instant: what the API shows and the degradation
/// controller reads.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SloStatus {
    pub name: String,
    pub service: String,
    pub objective: f64,
    /// `28d` or `calendar_month`.
    pub period: String,
    /// The period's length (a calendar month: this month's).
    #[serde(default)]
    pub period_secs: u64,
    /// Events (or slices) good / total over the period so far.
    pub period_events: Counts,
    /// How much of the period the evaluator has seen, from its first event for this SLO (or
    /// the period's start) to now: at most the period. The budget figures below are about this
    /// history; while it is shorter than the period they are projections from it.
    #[serde(default)]
    pub history_secs: u64,
    /// Share of the whole period's error budget spent by the history: the period's burn rate ×
    /// history / period (occurrences; the period's traffic is taken to continue at the
    /// history's rate), or bad slices over the period's slice budget (timeslices). 0 untouched,
    /// 1 all of it, above 1 overspent.
    #[serde(default)]
    pub budget_spent_ratio: f64,
    /// `1 − budget_spent_ratio`: 1 = untouched, 0 = spent, negative = overspent.
    pub budget_remaining_ratio: f64,
    /// Until the rest of the budget is spent at the 1 h burn rate; `None` when nothing burns.
    pub time_to_exhaustion_secs: Option<f64>,
    /// Requests that matched this SLO but that brownout refused on purpose: not in the SLI.
    #[serde(default)]
    pub refused: RefusedCounts,
    /// Every window any alert pair uses, shortest first.
    pub burn_rates: Vec<WindowBurn>,
    pub alerts: Vec<AlertStatus>,
    pub evaluated_at_ms: u64,
    /// The budget as users felt it: the same SLI with every refusal on purpose counted as a
    /// bad event (the cost of shedding). The figures above are the *real-failure* view
    /// (refusals left out), which the alerts and the degradation triggers read. `None` for
    /// time-slice SLOs (docs/SLO.md "Two views of one budget").
    #[serde(default)]
    pub user_felt: Option<BudgetView>,
    /// Where the windows of 5 minutes and more, the period and the history were counted:
    /// `store` (the stored SLI buckets every replica reads) or `memory` (this process's
    /// counters: no store attached, a time-slice SLO, or the store did not answer).
    #[serde(default)]
    pub source: CountSource,
}

/// One view of an SLO's budget (see [`SloStatus::user_felt`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BudgetView {
    /// Good / total events of the view over the period (refusals counted as bad).
    pub period_events: Counts,
    pub budget_spent_ratio: f64,
    pub budget_remaining_ratio: f64,
    pub burn_rates: Vec<WindowBurn>,
}

/// See [`SloStatus::source`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CountSource {
    #[default]
    Memory,
    Store,
}

/// Windows shorter than this are always counted in memory (10 s buckets): the stored buckets
/// are minutes. With a store attached, the fast-burn pair's 2m30s short window is the only one.
pub const STORE_MIN_WINDOW_MS: u64 = 5 * 60_000;

/// The stored SLI buckets of one SLO, as the evaluator reads them: minutes for the recent
/// days, hours before (keyed by bucket start).
#[derive(Debug, Default)]
struct Stored {
    buckets: BTreeMap<u64, (SliCounts, u64)>,
}

impl Stored {
    /// Sum of the buckets starting in `[from_ms, now_ms]`.
    fn sum(&self, from_ms: u64, now_ms: u64) -> SliCounts {
        let mut c = SliCounts::default();
        if from_ms <= now_ms {
            for (v, _) in self.buckets.range(from_ms..=now_ms).map(|(_, v)| v) {
                c += *v;
            }
        }
        c
    }
    /// The window `(now − window, now]`, minute-aligned like the rings: the minute holding
    /// `now` and the `window / 1 m − 1` before it (an hour bucket counts when it starts there).
    fn window(&self, now_ms: u64, window_ms: u64) -> SliCounts {
        let minute = now_ms - now_ms % 60_000;
        let n = (window_ms / 60_000).max(1);
        self.sum(minute.saturating_sub((n - 1) * 60_000), now_ms)
    }
    fn first_ms(&self) -> Option<u64> {
        self.buckets.values().next().map(|(_, f)| *f)
    }
}

fn real(c: SliCounts) -> Counts {
    Counts {
        good: c.good,
        total: c.total,
    }
}

/// The user-felt counts: refusals are bad events.
fn felt(c: SliCounts) -> Counts {
    Counts {
        good: c.good,
        total: c.total + c.refused,
    }
}

/// One SLO's stored alert states (what a restarted process restores).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SavedAlert {
    pub kind: PairKind,
    /// `1h/5m`.
    pub window: String,
    #[serde(flatten)]
    pub state: AlertState,
}

impl SloStatus {
    /// The burn rate over a window, if the SLO tracks it.
    pub fn burn_rate(&self, window_secs: u64) -> Option<f64> {
        self.burn_rates
            .iter()
            .find(|w| w.window_secs == window_secs)
            .map(|w| w.burn_rate)
    }
    /// The alerts firing now.
    pub fn firing(&self) -> impl Iterator<Item = &AlertStatus> {
        self.alerts.iter().filter(|a| a.state.is_firing())
    }
}

/// Deliberate refusals counted for one SLO (requests it would otherwise have counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RefusedCounts {
    /// Over the budget period (hour-aligned).
    pub period: u64,
    /// Over the last hour (minute-aligned).
    pub last_1h: u64,
}

/// Refusals per SLO, in rings like the SLI's (every window of the user-felt view needs them).
#[derive(Debug)]
struct RefusedRings {
    rings: Rings,
}

impl RefusedRings {
    fn new(period_ms: u64) -> RefusedRings {
        RefusedRings {
            rings: Rings::new(period_ms),
        }
    }
    fn add(&mut self, ts_ms: u64, n: u64) -> bool {
        self.rings.add(ts_ms, 0, n)
    }
    fn window(&self, now_ms: u64, window_ms: u64) -> u64 {
        self.rings.window(now_ms, window_ms).total
    }
    fn since(&self, from_ms: u64, now_ms: u64) -> u64 {
        self.rings.since(from_ms, now_ms).total
    }
    fn heap_bytes(&self) -> usize {
        self.rings.heap_bytes()
    }
}

/// Closing slack for time slices: a slice is final this long after it ends, so events a few
/// seconds late still land in it.
pub const SLICE_GRACE_MS: u64 = 5_000;

#[derive(Debug)]
struct Slicer {
    slice_ms: u64,
    good_ratio: f64,
    /// Slices still accepting events, oldest first.
    open: VecDeque<(u64, Counts)>,
    /// Slices with an epoch below this are final.
    closed_below: u64,
}

impl Slicer {
    fn add(&mut self, ts_ms: u64, good: u64, n: u64, rings: &mut Rings) -> bool {
        let epoch = ts_ms / self.slice_ms;
        if epoch < self.closed_below {
            return false;
        }
        match self.open.iter().position(|(e, _)| *e >= epoch) {
            Some(i) if self.open[i].0 == epoch => self.open[i].1 += Counts { good, total: n },
            Some(i) => self.open.insert(i, (epoch, Counts { good, total: n })),
            None => self.open.push_back((epoch, Counts { good, total: n })),
        }
        self.close(ts_ms, rings);
        true
    }

    /// Closes every slice that ended at least [`SLICE_GRACE_MS`] before `now_ms`.
    fn close(&mut self, now_ms: u64, rings: &mut Rings) {
        let final_below = now_ms.saturating_sub(SLICE_GRACE_MS) / self.slice_ms;
        while let Some(&(epoch, c)) = self.open.front() {
            if epoch >= final_below {
                break;
            }
            self.open.pop_front();
            let good = c.total > 0 && c.good as f64 >= self.good_ratio * c.total as f64;
            rings.add(epoch * self.slice_ms, u64::from(good), 1);
        }
        self.closed_below = self.closed_below.max(final_below);
    }
}

#[derive(Debug)]
struct SloState {
    spec: SloSpec,
    pairs: Vec<WindowPair>,
    /// Per pair, `None` when that pair's alert group is disabled.
    machines: Vec<Option<AlertMachine>>,
    alert_names: Vec<String>,
    windows: Vec<u64>,
    rings: Rings,
    slicer: Option<Slicer>,
    refused: RefusedRings,
    /// Timestamp of the first event (counted or refused) seen for this SLO.
    first_ms: Option<u64>,
    /// The stored buckets, once a store is attached ([`Evaluator::attach_store`]; occurrence
    /// SLOs only).
    stored: Option<Stored>,
    /// Whether the last refresh of the stored buckets succeeded.
    store_fresh: bool,
}

/// Counters about what the evaluator was fed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct EvalStats {
    /// Observations passed to [`Evaluator::record`].
    pub observed: u64,
    /// (observation, SLO) pairs counted.
    pub counted: u64,
    /// Refused: older than the rings (or a closed time slice) hold.
    pub dropped_late: u64,
    /// Refused by [`SloHandle`](super::task::SloHandle): dated too far ahead of the wall clock.
    pub dropped_future: u64,
}

/// Burn-rate alert names, as in the generated rules.
pub fn alert_name(spec: &SloSpec, kind: PairKind) -> String {
    let base = spec.alerting.name.as_deref();
    match (kind, base) {
        (PairKind::Page | PairKind::Ticket, Some(b)) => b.to_string(),
        (PairKind::Page | PairKind::Ticket, None) => "SLOErrorBudgetBurn".into(),
        (PairKind::FastBurn, Some(b)) => format!("{b}FastBurn"),
        (PairKind::FastBurn, None) => "SLOErrorBudgetFastBurn".into(),
    }
}

/// The absent-data alert's name.
pub fn absent_alert_name(spec: &SloSpec) -> String {
    match spec.alerting.name.as_deref() {
        Some(b) => format!("{b}SLIAbsent"),
        None => "SLOSLIAbsent".into(),
    }
}

/// What one replica counted for one SLO in one second: the unit replicas share so that each
/// one's counters hold every replica's events (`slo::share`, docs/SCALING.md). One second
/// divides every ring bucket and every time slice, so a replica that applies another's deltas
/// ends with exactly the counters it would have had from the events themselves.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SharedDelta {
    /// The SLO's name (stable across replicas; indexes may differ).
    pub slo: String,
    /// Unix seconds.
    pub sec: u64,
    pub good: u64,
    pub total: u64,
    /// Deliberate refusals.
    pub refused: u64,
    /// The earliest event in this second, unix ms (the SLO's history starts there).
    pub first_ms: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct DeltaCounts {
    good: u64,
    total: u64,
    refused: u64,
    first_ms: u64,
}

/// All SLOs' counters and alert states.
#[derive(Debug, Default)]
pub struct Evaluator {
    slos: Vec<SloState>,
    service_to_slos: HashMap<String, Vec<u32>>,
    stats: EvalStats,
    /// `Some` once sharing is on: what this replica counted since the last
    /// [`Evaluator::take_shared`], by (SLO index, second).
    outbox: Option<HashMap<(u32, u64), DeltaCounts>>,
    /// The oldest timestamp recorded since [`Evaluator::take_oldest_recorded`]: how far back
    /// the stored view must be reread (events arrive late).
    oldest_recorded: Option<u64>,
}

fn note_delta(
    outbox: &mut Option<HashMap<(u32, u64), DeltaCounts>>,
    id: u32,
    ts_ms: u64,
    good: u64,
    total: u64,
    refused: u64,
) {
    if let Some(o) = outbox {
        let d = o.entry((id, ts_ms / 1000)).or_insert(DeltaCounts {
            first_ms: ts_ms,
            ..DeltaCounts::default()
        });
        d.good += good;
        d.total += total;
        d.refused += refused;
        d.first_ms = d.first_ms.min(ts_ms);
    }
}

impl Evaluator {
    pub fn new(specs: Vec<SloSpec>) -> Evaluator {
        let mut ev = Evaluator::default();
        for spec in specs {
            ev.add(spec);
        }
        ev
    }

    /// Adds an SLO; its counters start empty.
    pub fn add(&mut self, spec: SloSpec) -> SloId {
        let pairs = budget::window_pairs(spec.period, spec.objective_ratio);
        let machines = pairs
            .iter()
            .map(|p| {
                let cfg = match p.kind {
                    PairKind::Page => &spec.alerting.page,
                    PairKind::Ticket => &spec.alerting.ticket,
                    PairKind::FastBurn => &spec.alerting.fast_burn,
                };
                cfg.enabled
                    .then(|| AlertMachine::new(cfg.pending_secs * 1000))
            })
            .collect();
        let alert_names = pairs.iter().map(|p| alert_name(&spec, p.kind)).collect();
        let mut windows = budget::pair_windows(&pairs);
        if !windows.contains(&3_600) {
            windows.push(3_600);
            windows.sort_unstable();
        }
        let period_ms = match spec.period {
            Period::Rolling { days } => u64::from(days) * 86_400_000,
            Period::CalendarMonth => 31 * 86_400_000,
        };
        let slicer = match spec.budgeting {
            Budgeting::Occurrences => None,
            Budgeting::Timeslices {
                slice_secs,
                good_slice_ratio,
            } => Some(Slicer {
                slice_ms: slice_secs * 1000,
                good_ratio: good_slice_ratio,
                open: VecDeque::new(),
                closed_below: 0,
            }),
        };
        let id = self.slos.len();
        self.service_to_slos
            .entry(spec.service.clone())
            .or_default()
            .push(id as u32);
        self.slos.push(SloState {
            spec,
            pairs,
            machines,
            alert_names,
            windows,
            rings: Rings::new(period_ms),
            slicer,
            refused: RefusedRings::new(period_ms),
            first_ms: None,
            stored: None,
            store_fresh: false,
        });
        SloId(id)
    }

    pub fn len(&self) -> usize {
        self.slos.len()
    }
    pub fn is_empty(&self) -> bool {
        self.slos.is_empty()
    }
    pub fn specs(&self) -> impl Iterator<Item = &SloSpec> {
        self.slos.iter().map(|s| &s.spec)
    }
    pub fn find(&self, name: &str) -> Option<SloId> {
        self.slos
            .iter()
            .position(|s| s.spec.name == name)
            .map(SloId)
    }
    pub fn stats(&self) -> EvalStats {
        self.stats
    }
    /// Memory held by the counters.
    pub fn heap_bytes(&self) -> usize {
        self.slos
            .iter()
            .map(|s| s.rings.heap_bytes() + s.refused.heap_bytes())
            .sum()
    }

    /// Counts an event for every SLO it belongs to; returns how many. Events are expected
    /// roughly in time order: one older than a ring holds is dropped (and counted). The core
    /// trusts timestamps; [`SloHandle`](super::task::SloHandle) refuses future-dated ones,
    /// which would otherwise overwrite current buckets.
    #[inline]
    pub fn record(&mut self, obs: &Observation<'_>) -> usize {
        self.stats.observed += 1;
        self.oldest_recorded = Some(self.oldest_recorded.map_or(obs.ts_ms, |o| o.min(obs.ts_ms)));
        let Some(ids) = self.service_to_slos.get(obs.service) else {
            return 0;
        };
        let mut n = 0;
        for &id in ids {
            let slo = &mut self.slos[id as usize];
            if obs.deliberate {
                // A refusal on purpose: reported apart, never good or bad for the SLI.
                if matches_selector(&slo.spec, obs) && classify_kind(&slo.spec, obs) {
                    if slo.refused.add(obs.ts_ms, 1) {
                        note_first(slo, obs.ts_ms);
                        note_delta(&mut self.outbox, id, obs.ts_ms, 0, 0, 1);
                    } else {
                        self.stats.dropped_late += 1;
                    }
                }
                continue;
            }
            if let Some(good) = classify(&slo.spec, obs) {
                if add_to(slo, obs.ts_ms, u64::from(good), 1) {
                    note_delta(&mut self.outbox, id, obs.ts_ms, u64::from(good), 1, 0);
                    n += 1;
                } else {
                    self.stats.dropped_late += 1;
                }
            }
        }
        self.stats.counted += n as u64;
        n
    }

    /// Counts one event for one SLO directly (the caller already knows it matches).
    pub fn record_outcome(&mut self, id: SloId, ts_ms: u64, good: bool) {
        self.record_counts(id, ts_ms, u64::from(good), 1);
    }

    /// Counts `total` events, `good` of them good, for one SLO (pre-aggregated input).
    pub fn record_counts(&mut self, id: SloId, ts_ms: u64, good: u64, total: u64) {
        let good = good.min(total);
        if add_to(&mut self.slos[id.0], ts_ms, good, total) {
            note_delta(&mut self.outbox, id.0 as u32, ts_ms, good, total, 0);
            self.stats.counted += total;
        } else {
            self.stats.dropped_late += total;
        }
    }

    /// Starts keeping what this evaluator counts from now on for [`Evaluator::take_shared`].
    pub fn enable_sharing(&mut self) {
        self.outbox.get_or_insert_with(HashMap::new);
    }

    /// What was counted here since the last call (empty while sharing is off), by SLO name and
    /// second, in time order.
    pub fn take_shared(&mut self) -> Vec<SharedDelta> {
        let Some(o) = self.outbox.as_mut() else {
            return Vec::new();
        };
        let mut out: Vec<SharedDelta> = o
            .drain()
            .map(|((id, sec), d)| SharedDelta {
                slo: self.slos[id as usize].spec.name.clone(),
                sec,
                good: d.good,
                total: d.total,
                refused: d.refused,
                first_ms: d.first_ms,
            })
            .collect();
        out.sort_by(|a, b| (a.sec, &a.slo).cmp(&(b.sec, &b.slo)));
        out
    }

    /// Adds what another replica counted (never kept for sharing again). Deltas of SLOs this
    /// evaluator does not have are skipped. Returns how many events were counted.
    pub fn apply_shared(&mut self, deltas: &[SharedDelta]) -> u64 {
        let mut n = 0;
        for d in deltas {
            let Some(SloId(id)) = self.find(&d.slo) else {
                continue;
            };
            let slo = &mut self.slos[id];
            let ts_ms = d.first_ms.clamp(d.sec * 1000, d.sec * 1000 + 999);
            let good = d.good.min(d.total);
            if d.total > 0 {
                if add_to(slo, ts_ms, good, d.total) {
                    n += d.total;
                    self.stats.counted += d.total;
                } else {
                    self.stats.dropped_late += d.total;
                }
            }
            if d.refused > 0 {
                if slo.refused.add(ts_ms, d.refused) {
                    note_first(slo, ts_ms);
                } else {
                    self.stats.dropped_late += d.refused;
                }
            }
        }
        n
    }

    /// Evaluates every SLO at `now_ms` and advances the alert state machines. Call it every
    /// few seconds with a non-decreasing clock.
    pub fn evaluate(&mut self, now_ms: u64) -> Vec<SloStatus> {
        self.slos
            .iter_mut()
            .map(|s| evaluate_one(s, now_ms))
            .collect()
    }

    /// From now on the windows of 5 minutes and more, the period and the history of every
    /// occurrence SLO are counted from the stored buckets given to
    /// [`Evaluator::set_stored`] (the store is the truth every replica reads), while a refresh
    /// of them succeeds ([`Evaluator::store_failed`] falls back to the counters in memory).
    /// Time-slice SLOs stay in memory (seeded from the store).
    pub fn attach_store(&mut self) {
        for s in &mut self.slos {
            if s.slicer.is_none() {
                s.stored.get_or_insert_with(Stored::default);
            }
        }
    }

    /// Replaces the stored buckets starting at or after `from_ms` of every SLO with store
    /// attached by `buckets` (as [`crate::store::Store::sli_buckets`] returns them; SLOs
    /// not in this evaluator are skipped), and marks them fresh.
    pub fn set_stored(&mut self, buckets: &[SliBucket], from_ms: u64) {
        let mut by_name: HashMap<&str, Vec<&SliBucket>> = HashMap::new();
        for b in buckets {
            by_name.entry(b.slo.as_str()).or_default().push(b);
        }
        for s in &mut self.slos {
            let Some(st) = &mut s.stored else { continue };
            drop(st.buckets.split_off(&from_ms));
            for b in by_name.get(s.spec.name.as_str()).into_iter().flatten() {
                let e = st
                    .buckets
                    .entry(b.start_ms)
                    .or_insert((SliCounts::default(), b.first_ms));
                e.0 += b.counts;
                e.1 = e.1.min(b.first_ms);
            }
            s.store_fresh = true;
        }
    }

    /// The oldest event timestamp recorded since the last call (`None`: nothing recorded).
    pub fn take_oldest_recorded(&mut self) -> Option<u64> {
        self.oldest_recorded.take()
    }

    /// The store did not answer this time: evaluate from memory until the next refresh.
    pub fn store_failed(&mut self) {
        for s in &mut self.slos {
            s.store_fresh = false;
        }
    }

    /// Seeds the counters in memory from stored per-minute buckets (at start, before any
    /// event is counted): each minute's counts land at its first stored minute.
    pub fn seed(&mut self, buckets: &[SliBucket]) {
        let deltas: Vec<SharedDelta> = buckets
            .iter()
            .map(|b| SharedDelta {
                slo: b.slo.clone(),
                sec: b.first_ms / 1000,
                good: b.counts.good,
                total: b.counts.total,
                refused: b.counts.refused,
                first_ms: b.first_ms,
            })
            .collect();
        self.apply_shared(&deltas);
    }

    /// Every SLO's alert states, by SLO name (to store them).
    pub fn alert_states(&self) -> Vec<(String, Vec<SavedAlert>)> {
        self.slos
            .iter()
            .map(|s| {
                let saved = s
                    .pairs
                    .iter()
                    .zip(&s.machines)
                    .filter_map(|(p, m)| {
                        m.as_ref().map(|m| SavedAlert {
                            kind: p.kind,
                            window: p.label(),
                            state: m.state(),
                        })
                    })
                    .collect();
                (s.spec.name.clone(), saved)
            })
            .collect()
    }

    /// Restores stored alert states of one SLO (pairs matched by kind and window; others
    /// are left as they are).
    pub fn restore_alerts(&mut self, slo: &str, saved: &[SavedAlert]) {
        let Some(SloId(id)) = self.find(slo) else {
            return;
        };
        let s = &mut self.slos[id];
        for (p, m) in s.pairs.iter().zip(s.machines.iter_mut()) {
            if let (Some(m), Some(a)) = (
                m.as_mut(),
                saved
                    .iter()
                    .find(|a| a.kind == p.kind && a.window == p.label()),
            ) {
                m.restore(a.state);
            }
        }
    }
}

fn note_first(slo: &mut SloState, ts_ms: u64) {
    slo.first_ms = Some(slo.first_ms.map_or(ts_ms, |f| f.min(ts_ms)));
}

fn add_to(slo: &mut SloState, ts_ms: u64, good: u64, n: u64) -> bool {
    let ok = match &mut slo.slicer {
        None => slo.rings.add(ts_ms, good, n),
        Some(slicer) => slicer.add(ts_ms, good, n, &mut slo.rings),
    };
    if ok {
        note_first(slo, ts_ms);
    }
    ok
}

fn evaluate_one(s: &mut SloState, now_ms: u64) -> SloStatus {
    let objective = s.spec.objective_ratio;
    if let Some(slicer) = &mut s.slicer {
        slicer.close(now_ms, &mut s.rings);
    }
    let slice_ms = s.slicer.as_ref().map(|x| x.slice_ms);
    // With timeslices a window's denominator is its nominal number of slices: slices without
    // events count as good, as time-based budgets do.
    let window_counts = |rings: &Rings, window_ms: u64| -> Counts {
        let c = rings.window(now_ms, window_ms);
        match slice_ms {
            None => c,
            Some(slice) => {
                let nominal = (window_ms / slice).max(1).max(c.total);
                Counts {
                    good: nominal - c.bad(),
                    total: nominal,
                }
            }
        }
    };
    let stored = s.stored.as_ref().filter(|_| s.store_fresh);
    // A window's counts with its refusals: from the store (5 minutes and more, when attached
    // and fresh) or from memory.
    let sli_window = |w_ms: u64| -> SliCounts {
        match stored {
            Some(st) if w_ms >= STORE_MIN_WINDOW_MS => st.window(now_ms, w_ms),
            _ => {
                let c = s.rings.window(now_ms, w_ms);
                SliCounts {
                    good: c.good,
                    total: c.total,
                    refused: s.refused.window(now_ms, w_ms),
                }
            }
        }
    };
    let raw: Vec<(u64, SliCounts)> = s
        .windows
        .iter()
        .map(|&w| (w, sli_window(w * 1000)))
        .collect();
    let counts: Vec<(u64, Counts)> = raw
        .iter()
        .map(|&(w, c)| match slice_ms {
            None => (w, real(c)),
            Some(_) => (w, window_counts(&s.rings, w * 1000)),
        })
        .collect();
    let burn_rates: Vec<WindowBurn> = counts
        .iter()
        .zip(&raw)
        .map(|(&(w, c), &(_, r))| WindowBurn {
            window: format_secs(w),
            window_secs: w,
            burn_rate: budget::round6(budget::burn_rate(c, objective)),
            events: r.total,
        })
        .collect();
    let (period_start, period_ms) = match s.spec.period {
        Period::Rolling { days } => {
            let ms = u64::from(days) * 86_400_000;
            (now_ms.saturating_sub(ms), ms)
        }
        Period::CalendarMonth => budget::calendar_month_ms(now_ms),
    };
    let period_raw = match (stored, s.spec.period) {
        (Some(st), Period::Rolling { .. }) => st.window(now_ms, period_ms),
        (Some(st), Period::CalendarMonth) => st.sum(period_start, now_ms),
        (None, Period::Rolling { .. }) => {
            let c = s.rings.window(now_ms, period_ms);
            SliCounts {
                good: c.good,
                total: c.total,
                refused: s.refused.window(now_ms, period_ms),
            }
        }
        (None, Period::CalendarMonth) => {
            let c = s.rings.since(period_start, now_ms);
            SliCounts {
                good: c.good,
                total: c.total,
                refused: s.refused.since(period_start, now_ms),
            }
        }
    };
    let period_counts = real(period_raw);
    let refused_1h = sli_window(3_600_000).refused;
    // The history: from the first event (or the period's start, when that is later) to now;
    // with the store, from the first stored event.
    let first_ms = match stored {
        Some(st) => st.first_ms(),
        None => s.first_ms,
    };
    let history_ms = first_ms
        .map_or(0, |f| now_ms.saturating_sub(f.max(period_start)))
        .min(period_ms);
    let budget_spent_ratio = match slice_ms {
        None => budget::budget_spent_ratio(period_counts, objective, history_ms, period_ms),
        Some(slice) => {
            1.0 - budget::timeslice_budget_remaining_ratio(
                period_counts.bad(),
                period_ms / slice,
                objective,
            )
        }
    };
    let budget_remaining_ratio = 1.0 - budget_spent_ratio;
    let burn_1h = burn_rates
        .iter()
        .find(|w| w.window_secs == 3_600)
        .map_or(0.0, |w| w.burn_rate);
    let time_to_exhaustion_secs =
        budget::time_to_exhaustion_secs(budget_remaining_ratio, burn_1h, period_ms / 1000);
    let get = |w: u64| {
        counts
            .iter()
            .find(|(x, _)| *x == w)
            .map(|(_, c)| *c)
            .unwrap_or_default()
    };
    let min_events = if slice_ms.is_some() {
        0
    } else {
        s.spec.min_events
    };
    let mut alerts = Vec::new();
    for ((pair, machine), name) in s
        .pairs
        .iter()
        .zip(s.machines.iter_mut())
        .zip(&s.alert_names)
    {
        let Some(machine) = machine else { continue };
        let (long, short) = (get(pair.long_secs), get(pair.short_secs));
        let cond = budget::pair_condition(pair, long, short, objective, min_events);
        let state = machine.step(cond, now_ms);
        alerts.push(AlertStatus {
            alert: name.clone(),
            kind: pair.kind,
            severity: pair.kind.severity(),
            window: pair.label(),
            factor: pair.factor,
            long_burn_rate: budget::round6(budget::burn_rate(long, objective)),
            short_burn_rate: budget::round6(budget::burn_rate(short, objective)),
            state,
        });
    }
    SloStatus {
        name: s.spec.name.clone(),
        service: s.spec.service.clone(),
        objective,
        period: s.spec.period.label(),
        period_secs: period_ms / 1000,
        period_events: period_counts,
        history_secs: history_ms / 1000,
        budget_spent_ratio: budget::round6(budget_spent_ratio),
        budget_remaining_ratio: budget::round6(budget_remaining_ratio),
        time_to_exhaustion_secs: time_to_exhaustion_secs.map(|t| t.round()),
        refused: RefusedCounts {
            period: period_raw.refused,
            last_1h: refused_1h,
        },
        user_felt: slice_ms.is_none().then(|| {
            let felt_period = felt(period_raw);
            let spent = budget::budget_spent_ratio(felt_period, objective, history_ms, period_ms);
            BudgetView {
                period_events: felt_period,
                budget_spent_ratio: budget::round6(spent),
                budget_remaining_ratio: budget::round6(1.0 - spent),
                burn_rates: raw
                    .iter()
                    .map(|&(w, c)| WindowBurn {
                        window: format_secs(w),
                        window_secs: w,
                        burn_rate: budget::round6(budget::burn_rate(felt(c), objective)),
                        events: c.total + c.refused,
                    })
                    .collect(),
            }
        }),
        source: if stored.is_some() {
            CountSource::Store
        } else {
            CountSource::Memory
        },
        burn_rates,
        alerts,
        evaluated_at_ms: now_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brownout_protocol::Criticality;

    fn specs() -> Vec<SloSpec> {
        let text = [
            "version: brownout/v1",
            "slos:",
            "  - name: avail",
            "    service: chat",
            "    objective_percent: 99",
            "    period: 28d",
            "    sli: {kind: availability}",
            "  - name: slices",
            "    service: chat",
            "    objective_percent: 99",
            "    period: 7d",
            "    sli: {kind: availability}",
            "    budgeting: timeslices",
            "    timeslice: {slice: 1m, good_ratio: 0.9}",
        ]
        .join("\n");
        super::super::spec::parse_str(&text, "t.yaml").expect("specs")
    }

    fn obs(ts_ms: u64, ok: bool, deliberate: bool) -> Observation<'static> {
        Observation {
            ts_ms,
            kind: EventKind::Request,
            service: "chat",
            feature: "",
            criticality: Criticality::Default,
            ok,
            deliberate,
            latency_ms: Some(10.0),
            ttft_ms: None,
        }
    }

    #[test]
    fn nothing_is_kept_for_sharing_until_it_is_enabled() {
        let mut e = Evaluator::new(specs());
        e.record(&obs(1_000_000, true, false));
        assert!(e.take_shared().is_empty());
        e.enable_sharing();
        e.record(&obs(1_000_500, false, false));
        e.record(&obs(1_000_900, true, true));
        let d = e.take_shared();
        let avail: Vec<_> = d.iter().filter(|d| d.slo == "avail").collect();
        assert_eq!(avail.len(), 1);
        assert_eq!(
            (
                avail[0].sec,
                avail[0].good,
                avail[0].total,
                avail[0].refused,
                avail[0].first_ms
            ),
            (1_000, 0, 1, 1, 1_000_500)
        );
        assert!(e.take_shared().is_empty(), "taken once");
    }

    #[test]
    fn two_halves_exchanging_deltas_equal_the_whole() {
        let t0 = 1_767_225_600_000u64;
        let (mut whole, mut a, mut b) = (
            Evaluator::new(specs()),
            Evaluator::new(specs()),
            Evaluator::new(specs()),
        );
        a.enable_sharing();
        b.enable_sharing();
        for i in 0..4_000u64 {
            let o = obs(t0 + i * 150, i % 7 != 0 || (i / 400) % 3 != 1, i % 23 == 0);
            whole.record(&o);
            let replica = if i % 5 < 2 { &mut a } else { &mut b };
            replica.record(&o);
            if i % 6 == 5 {
                let (da, db) = (a.take_shared(), b.take_shared());
                a.apply_shared(&db);
                b.apply_shared(&da);
                assert!(
                    a.take_shared().is_empty(),
                    "applied deltas are not shared again"
                );
            }
        }
        let (da, db) = (a.take_shared(), b.take_shared());
        a.apply_shared(&db);
        b.apply_shared(&da);
        let at = t0 + 4_000 * 150 + 1_000;
        let want = whole.evaluate(at);
        assert_eq!(a.evaluate(at), want);
        assert_eq!(b.evaluate(at), want);
        assert!(want[0].burn_rates.iter().any(|w| w.burn_rate > 0.0));
    }
}
