//! Error-budget arithmetic. Pure: numbers in, numbers out, no clock and no IO.
//!
//! Words used throughout:
//! - *error ratio* of a window = bad / total events in it;
//! - *burn rate* = error ratio / (1 − objective): 1× spends exactly the budget over the period,
//!   10× spends it in a tenth of the period;
//! - a *multi-window pair* fires when both its long and its short window burn faster than its
//!   factor (SRE Workbook ch. 5): the long window proves it matters, the short one that it is
//!   still happening, so the alert resets soon after the cause is fixed.
//!
//! Factors are derived from the period rather than copied: a pair meant to catch "fraction `f`
//! of the budget spent within the long window `L`" over a period `P` has factor `f · P / L`.
//! For 30 days that gives the Workbook's 14.4 / 6 / 3 / 1; for 28 days 13.44 / 5.6 / 2.8 / 0.93.

use super::spec::Period;

/// Good and total event counts of one window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counts {
    pub good: u64,
    pub total: u64,
}

impl Counts {
    pub fn bad(self) -> u64 {
        self.total.saturating_sub(self.good)
    }
    /// bad / total; 0 when there were no events (no traffic burns no budget).
    pub fn error_ratio(self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.bad() as f64 / self.total as f64
        }
    }
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.good += o.good;
        self.total += o.total;
    }
}

/// How loud an alert is.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Wake someone up / let the degradation controller act now.
    Page,
    /// Look at it during working hours.
    Ticket,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Page => "page",
            Severity::Ticket => "ticket",
        }
    }
}

/// Which family a pair belongs to (selects its [`AlertConfig`](super::spec::AlertConfig)).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum PairKind {
    Page,
    Ticket,
    /// docs/REQUIREMENTS.md R2.9: 20% of the monthly budget within 30 minutes.
    FastBurn,
}

impl PairKind {
    pub fn severity(self) -> Severity {
        match self {
            PairKind::Page | PairKind::FastBurn => Severity::Page,
            PairKind::Ticket => Severity::Ticket,
        }
    }
}

/// One multi-window burn-rate condition.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct WindowPair {
    pub kind: PairKind,
    pub long_secs: u64,
    pub short_secs: u64,
    /// Fraction of the period's budget this pair is meant to catch being spent in `long_secs`.
    pub budget_fraction: f64,
    /// Burn-rate threshold both windows must exceed: `budget_fraction · period / long`.
    pub factor: f64,
}

impl WindowPair {
    /// `1h/5m`: the label used in the API, metrics, rules and degradation reasons.
    pub fn label(&self) -> String {
        format!(
            "{}/{}",
            super::duration::format_secs(self.long_secs),
            super::duration::format_secs(self.short_secs)
        )
    }
}

/// The SRE Workbook's four pairs, as (kind, long, short, budget fraction).
pub const WORKBOOK_PAIRS: [(PairKind, u64, u64, f64); 4] = [
    (PairKind::Page, 3_600, 300, 0.02),
    (PairKind::Page, 21_600, 1_800, 0.05),
    (PairKind::Ticket, 86_400, 7_200, 0.10),
    (PairKind::Ticket, 259_200, 21_600, 0.10),
];

/// The alert of docs/REQUIREMENTS.md R2.9: "20% of the monthly budget burnt within 30 minutes",
/// with the Workbook's short window of 1/12 of the long one.
pub const FAST_BURN_PAIR: (PairKind, u64, u64, f64) = (PairKind::FastBurn, 1_800, 150, 0.20);

/// `budget_fraction · period / long_window`.
pub fn burn_rate_factor(budget_fraction: f64, period_secs: u64, long_secs: u64) -> f64 {
    budget_fraction * period_secs as f64 / long_secs as f64
}

/// The pairs of an SLO with this period and objective: the Workbook's four and the fast burn,
/// minus any that cannot fire because their threshold error ratio (`factor · (1 − objective)`)
/// would be above 100%.
pub fn window_pairs(period: Period, objective_ratio: f64) -> Vec<WindowPair> {
    let period_secs = period.nominal_secs();
    WORKBOOK_PAIRS
        .iter()
        .chain(std::iter::once(&FAST_BURN_PAIR))
        .map(
            |&(kind, long_secs, short_secs, budget_fraction)| WindowPair {
                kind,
                long_secs,
                short_secs,
                budget_fraction,
                factor: round6(burn_rate_factor(budget_fraction, period_secs, long_secs)),
            },
        )
        .filter(|p| p.factor * (1.0 - objective_ratio) <= 1.0)
        .collect()
}

/// Rounds to six decimals, so 0.02 · 672 prints as 13.44 and not 13.440000000000001.
pub fn round6(x: f64) -> f64 {
    (x * 1e6).round() / 1e6
}

/// Every distinct window the pairs use, shortest first.
pub fn pair_windows(pairs: &[WindowPair]) -> Vec<u64> {
    let mut w: Vec<u64> = pairs
        .iter()
        .flat_map(|p| [p.long_secs, p.short_secs])
        .collect();
    w.sort_unstable();
    w.dedup();
    w
}

/// error ratio / (1 − objective).
pub fn burn_rate(c: Counts, objective_ratio: f64) -> f64 {
    c.error_ratio() / (1.0 - objective_ratio)
}

/// Request-weighted budget left over the period: `1 − burn rate over the period`. 1 with no
/// traffic; negative once the SLO is broken (by how much it is overspent).
pub fn budget_remaining_ratio(period_counts: Counts, objective_ratio: f64) -> f64 {
    1.0 - burn_rate(period_counts, objective_ratio)
}

/// Share of the whole period's budget that `history_ms` of events (`period_counts`, all inside
/// the period) have spent: the period's burn rate × history / period. With a full history this
/// is `1 − budget_remaining_ratio`; with minutes of history it is what those minutes cost, not
/// the period's burn rate (a fresh install at 50× has spent 50 × 5 min / 28 d = 0.6 %, not
/// 4 900 %). The period's traffic is taken to continue at the history's rate.
pub fn budget_spent_ratio(
    period_counts: Counts,
    objective_ratio: f64,
    history_ms: u64,
    period_ms: u64,
) -> f64 {
    if period_ms == 0 || period_counts.total == 0 {
        return 0.0;
    }
    let covered = history_ms.min(period_ms) as f64 / period_ms as f64;
    burn_rate(period_counts, objective_ratio) * covered
}

/// Time-weighted budget left: the budget is `(1 − objective)` of all the period's slices, so
/// every bad slice spends `1 / ((1 − objective) · slices_in_period)` of it.
pub fn timeslice_budget_remaining_ratio(
    bad_slices: u64,
    slices_in_period: u64,
    objective_ratio: f64,
) -> f64 {
    let budget = (1.0 - objective_ratio) * slices_in_period as f64;
    if budget <= 0.0 {
        0.0
    } else {
        1.0 - bad_slices as f64 / budget
    }
}

/// How long until the budget is gone at `burn_rate` (budget per period): `remaining · period /
/// burn`. `Some(0)` when nothing is left; `None` when nothing is burning.
pub fn time_to_exhaustion_secs(
    remaining_ratio: f64,
    burn_rate: f64,
    period_secs: u64,
) -> Option<f64> {
    if remaining_ratio <= 0.0 {
        Some(0.0)
    } else if burn_rate <= 0.0 || !burn_rate.is_finite() {
        None
    } else {
        Some(remaining_ratio * period_secs as f64 / burn_rate)
    }
}

/// The low-traffic guard for the short window: the long window's minimum scaled by the
/// windows' ratio, rounded up, at least one event (zero when the guard is off).
pub fn min_events_short(min_events_long: u64, long_secs: u64, short_secs: u64) -> u64 {
    if min_events_long == 0 {
        0
    } else {
        (min_events_long.saturating_mul(short_secs))
            .div_ceil(long_secs)
            .max(1)
    }
}

/// Whether a pair holds now: both windows above the factor and, with the guard on, enough
/// events in both.
pub fn pair_condition(
    pair: &WindowPair,
    long: Counts,
    short: Counts,
    objective_ratio: f64,
    min_events: u64,
) -> bool {
    let enough = long.total >= min_events
        && short.total >= min_events_short(min_events, pair.long_secs, pair.short_secs);
    enough
        && burn_rate(long, objective_ratio) > pair.factor
        && burn_rate(short, objective_ratio) > pair.factor
}

/// The first millisecond of the UTC calendar month containing `now_ms`, and that month's
/// length in milliseconds.
pub fn calendar_month_ms(now_ms: u64) -> (u64, u64) {
    use chrono::{Datelike, TimeZone, Utc};
    let now = Utc
        .timestamp_millis_opt(now_ms as i64)
        .single()
        .unwrap_or_default();
    let start = Utc
        .with_ymd_and_hms(now.year(), now.month(), 1, 0, 0, 0)
        .single()
        .unwrap_or_default();
    let (ny, nm) = if now.month() == 12 {
        (now.year() + 1, 1)
    } else {
        (now.year(), now.month() + 1)
    };
    let next = Utc
        .with_ymd_and_hms(ny, nm, 1, 0, 0, 0)
        .single()
        .unwrap_or_default();
    (
        start.timestamp_millis() as u64,
        (next - start).num_milliseconds() as u64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_follow_the_period() {
        let cases: [(Period, [f64; 5]); 3] = [
            (Period::Rolling { days: 30 }, [14.4, 6.0, 3.0, 1.0, 288.0]),
            (
                Period::Rolling { days: 28 },
                [13.44, 5.6, 2.8, 0.933333, 268.8],
            ),
            (
                Period::Rolling { days: 7 },
                [3.36, 1.4, 0.7, 0.233333, 67.2],
            ),
        ];
        for (period, want) in cases {
            let got: Vec<f64> = window_pairs(period, 0.999)
                .iter()
                .map(|p| p.factor)
                .collect();
            assert_eq!(got, want, "{period:?}");
        }
    }

    #[test]
    fn unreachable_pairs_are_dropped() {
        // At 99% the budget is 1%: a 288× burn would need a 288% error ratio.
        let kinds: Vec<PairKind> = window_pairs(Period::Rolling { days: 30 }, 0.99)
            .iter()
            .map(|p| p.kind)
            .collect();
        assert!(!kinds.contains(&PairKind::FastBurn));
        assert_eq!(kinds.len(), 4);
    }

    #[test]
    fn one_percent_errors_at_three_nines_is_a_tenfold_burn() {
        let c = Counts {
            good: 99_000,
            total: 100_000,
        };
        assert!((burn_rate(c, 0.999) - 10.0).abs() < 1e-9);
        assert!((budget_remaining_ratio(c, 0.999) - -9.0).abs() < 1e-9);
    }

    #[test]
    fn time_to_exhaustion_scales_with_the_burn() {
        // Half the budget left, burning at 10× over 30 days: 30 d · 0.5 / 10 = 1.5 d.
        assert_eq!(
            time_to_exhaustion_secs(0.5, 10.0, 30 * 86_400),
            Some(1.5 * 86_400.0)
        );
        assert_eq!(time_to_exhaustion_secs(0.5, 0.0, 30 * 86_400), None);
        assert_eq!(time_to_exhaustion_secs(-0.1, 3.0, 30 * 86_400), Some(0.0));
    }

    #[test]
    fn short_window_guard_is_proportional() {
        assert_eq!(min_events_short(100, 3_600, 300), 9);
        assert_eq!(min_events_short(1, 3_600, 300), 1);
        assert_eq!(min_events_short(0, 3_600, 300), 0);
    }

    #[test]
    fn calendar_month_bounds() {
        // 2026-02-14T12:00:00Z
        let (start, len) = calendar_month_ms(1_771_070_400_000);
        assert_eq!(start, 1_769_904_000_000); // 2026-02-01T00:00:00Z
        assert_eq!(len, 28 * 86_400_000);
    }
}
