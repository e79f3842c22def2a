//! The SLO page: each SLO's budget, burn rates per window against their alert pair's factor,
//! the sampled budget series and the alert transitions.

use brownout_protocol::now_ms;

use super::{Caches, LiveDataSource, finite, lock};
use crate::slo::Severity;
use crate::slo::task::SloReport;
use crate::web::model::{AlertState, BurnRate, SloDetail, SloSummary, SloView};

pub(super) fn slo_summary(s: &crate::slo::SloStatus) -> SloSummary {
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
        budget_note: budget_note(s),
        refused_1h: s.refused.last_1h,
        user_budget_remaining_ratio: s
            .user_felt
            .as_ref()
            .map(|u| finite(u.budget_remaining_ratio)),
        refused_period: s.refused.period,
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

/// How much history the budget figure stands on, when it is less than the period.
fn budget_note(s: &crate::slo::SloStatus) -> String {
    if s.period_secs == 0 || s.history_secs >= s.period_secs {
        return String::new();
    }
    // Whole minutes past the first hour: "3h12m", not "3h12m7s".
    let h = if s.history_secs >= 3_600 {
        s.history_secs / 60 * 60
    } else {
        s.history_secs.max(1)
    };
    format!(
        "from {} of data in a {} period",
        crate::slo::duration::format_secs(h),
        s.period
    )
}

/// Each SLO of `report` with its sampled history.
fn slo_details(report: &SloReport, c: &Caches) -> Vec<SloDetail> {
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

impl LiveDataSource {
    pub(super) fn slos_view(&self) -> SloView {
        let now = now_ms();
        self.sample(now);
        let report = self.parts.slo.latest();
        let slos = slo_details(&report, &lock(&self.caches));
        SloView {
            origin: self.parts.origin,
            generated_at_ms: now,
            slos,
        }
    }
}
