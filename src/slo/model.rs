//! The validated SLO model every input format converts into ([`SloSpec`] and its parts, the
//! errors), and the validation helpers the three converters share. Loading and telling the
//! formats apart is [`super::spec`]'s.

use std::collections::BTreeMap;

use brownout_protocol::Criticality;

use super::duration;

/// One service level objective, validated.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SloSpec {
    /// Unique id: lowercase letters, digits and `-`, at most 63 characters (DNS label rules,
    /// like OpenSLO's `metadata.name`). Used as the `slo` label everywhere.
    pub name: String,
    pub description: String,
    /// The service the SLO belongs to (`service` label; matched against events' `service`).
    pub service: String,
    /// Which events of that service count.
    pub selector: Selector,
    /// Fraction of good events (or good time slices) promised, in (0, 1): 0.999 for 99.9%.
    pub objective_ratio: f64,
    pub period: Period,
    pub budgeting: Budgeting,
    pub sli: Sli,
    /// Low-traffic guard: a burn-rate alert needs at least this many events in its long window
    /// (and a proportional share, at least one, in its short window). 0 turns the guard off.
    pub min_events: u64,
    /// Extra labels on every generated series and alert (team, tier…).
    pub labels: BTreeMap<String, String>,
    pub alerting: Alerting,
    /// Where the spec came from (file and format), for error messages and the API.
    pub source: SpecSource,
}

impl SloSpec {
    /// The error budget as a fraction of events: `1 − objective`.
    pub fn error_budget_ratio(&self) -> f64 {
        1.0 - self.objective_ratio
    }
}

/// The subset of a service's events an SLO counts. Empty fields match anything.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Selector {
    /// Only events of this feature (e.g. `pdf_analysis`).
    pub feature: Option<String>,
    /// Only events of these criticalities; empty = all.
    pub criticality: Vec<Criticality>,
}

/// The accounting period of the error budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    /// The last `days` days, sliding (7, 28, 30…). 1 to 31 days.
    Rolling { days: u32 },
    /// The current UTC calendar month, from its first day 00:00.
    CalendarMonth,
}

impl Period {
    /// Nominal length in seconds. A calendar month counts as 30 days here: this is the length
    /// burn-rate factors are derived from (SRE Workbook), not the budget's denominator.
    pub fn nominal_secs(self) -> u64 {
        match self {
            Period::Rolling { days } => u64::from(days) * 86_400,
            Period::CalendarMonth => 30 * 86_400,
        }
    }

    /// `28d` or `calendar_month`.
    pub fn label(self) -> String {
        match self {
            Period::Rolling { days } => format!("{days}d"),
            Period::CalendarMonth => "calendar_month".into(),
        }
    }
}

/// How the budget is counted.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Budgeting {
    /// Request-weighted: every event counts once (the default).
    Occurrences,
    /// Time-weighted: the period is cut into slices; a slice is good when at least
    /// `good_slice_ratio` of its events are good. Slices without events are not counted.
    Timeslices {
        slice_secs: u64,
        good_slice_ratio: f64,
    },
}

/// What makes an event good.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Sli {
    pub kind: SliKind,
    /// The Prometheus form, used by rule generation. `None` when the source gave none that we
    /// can use (e.g. an OpenSLO SLI on another data source); rule generation then refuses.
    pub promql: Option<PromSli>,
}

/// The in-process meaning of an SLI.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum SliKind {
    /// A request is good unless it failed (span status ERROR, or a failure event).
    Availability,
    /// A request is good when it succeeded and `metric` was at most `threshold_ms`.
    Latency {
        metric: LatencyMetric,
        threshold_ms: f64,
    },
    /// An agent task is good unless it failed.
    TaskSuccess,
}

/// Which latency a latency SLI measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LatencyMetric {
    /// Time to first token.
    Ttft,
    /// End-to-end request latency.
    E2e,
}

/// PromQL for an SLI. Queries contain `{{.window}}` (Sloth's placeholder) where the range goes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PromSli {
    /// Bad and total event rates; the SLI error ratio is `errors / total`.
    Events {
        error_query: String,
        total_query: String,
    },
    /// An error ratio computed elsewhere (0–1). No event counts, so no low-traffic guard.
    Raw { error_ratio_query: String },
}

/// Alert settings for one SLO.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Alerting {
    /// Alert name of the burn-rate alerts; the fast-burn and absent alerts append `FastBurn`
    /// and `SLIAbsent`. Default `SLOErrorBudgetBurn`, `SLOErrorBudgetFastBurn`, `SLOSLIAbsent`.
    pub name: Option<String>,
    /// Labels on every alert of this SLO (they may override `severity`).
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The two page pairs (1h/5m, 6h/30m).
    pub page: AlertConfig,
    /// The two ticket pairs (1d/2h, 3d/6h).
    pub ticket: AlertConfig,
    /// docs/REQUIREMENTS.md R2.9's "20% of the monthly budget burnt within 30 minutes"
    /// (30m/2m30s), a page.
    pub fast_burn: AlertConfig,
    /// No SLI data at all for a while (Prometheus rules only).
    pub absent: AlertConfig,
}

/// One alert group's switch, pending time and extra labels/annotations.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct AlertConfig {
    pub enabled: bool,
    /// How long the condition must hold before the alert fires (Prometheus `for`).
    pub pending_secs: u64,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

impl AlertConfig {
    pub fn on(pending_secs: u64) -> AlertConfig {
        AlertConfig {
            enabled: true,
            pending_secs,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
        }
    }
}

impl Default for Alerting {
    fn default() -> Self {
        Alerting {
            name: None,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            page: AlertConfig::on(0),
            ticket: AlertConfig::on(0),
            fast_burn: AlertConfig::on(0),
            absent: AlertConfig::on(DEFAULT_ABSENT_PENDING_SECS),
        }
    }
}

/// The default `for` of the absent-data alert.
pub const DEFAULT_ABSENT_PENDING_SECS: u64 = 600;
/// The default low-traffic guard.
pub const DEFAULT_MIN_EVENTS: u64 = 30;

/// Which document format a spec came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    Brownout,
    Sloth,
    OpenSlo,
}

/// The file and format a spec was read from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SpecSource {
    pub file: String,
    pub format: Format,
}

/// Why a spec file was refused. Every variant names the file; `Invalid` also the field.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("{file}: cannot read")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: {message}")]
    Parse { file: String, message: String },
    #[error("{file}: {field}: {reason}")]
    Invalid {
        file: String,
        field: String,
        reason: String,
    },
}

impl SpecError {
    pub(crate) fn invalid(
        file: &str,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> SpecError {
        SpecError::Invalid {
            file: file.to_string(),
            field: field.into(),
            reason: reason.into(),
        }
    }
    pub(crate) fn parse(file: &str, message: impl std::fmt::Display) -> SpecError {
        SpecError::Parse {
            file: file.to_string(),
            message: message.to_string(),
        }
    }
}

// ---- shared validation helpers (used by the three format converters) ---------------------------

/// DNS-label rules: `[a-z0-9]([a-z0-9-]*[a-z0-9])?`, at most 63 characters.
pub(crate) fn check_name(file: &str, field: &str, name: &str) -> Result<(), SpecError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    require(ok, file, field, || {
        format!(
            "{name:?} must be 1–63 lowercase letters, digits or '-', not starting or ending with '-'"
        )
    })
}

/// Text that becomes a label value: non-empty, no control characters.
pub(crate) fn check_text(file: &str, field: &str, value: &str) -> Result<(), SpecError> {
    if value.trim().is_empty() {
        return Err(SpecError::invalid(file, field, "must not be empty"));
    }
    if value.chars().any(char::is_control) {
        return Err(SpecError::invalid(
            file,
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// Labels the generator sets itself on recording rules; specs may not set them.
pub(crate) const RESERVED_LABELS: [&str; 4] = ["slo", "service", "long_window", "short_window"];

/// Prometheus label names, minus the reserved ones.
pub(crate) fn check_labels(
    file: &str,
    field: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), SpecError> {
    for (k, v) in labels {
        let valid =
            k.bytes().enumerate().all(|(i, b)| {
                b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit())
            }) && !k.is_empty()
                && !k.starts_with("__");
        if !valid {
            return Err(SpecError::invalid(
                file,
                format!("{field}.{k}"),
                "not a valid Prometheus label name",
            ));
        }
        if RESERVED_LABELS.contains(&k.as_str()) || k == "alertname" {
            return Err(SpecError::invalid(
                file,
                format!("{field}.{k}"),
                "reserved: the rule generator sets this label",
            ));
        }
        if v.chars().any(char::is_control) {
            return Err(SpecError::invalid(
                file,
                format!("{field}.{k}"),
                "value must not contain control characters",
            ));
        }
    }
    Ok(())
}

/// Alert names: Prometheus metric-name characters.
pub(crate) fn check_alert_name(file: &str, field: &str, name: &str) -> Result<(), SpecError> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .enumerate()
            .all(|(i, b)| b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()));
    require(ok, file, field, || {
        format!("{name:?} is not a valid alert name")
    })
}

/// `Ok` when `ok`; else the spec error at `file`/`field` that `why` words.
fn require(
    ok: bool,
    file: &str,
    field: &str,
    why: impl FnOnce() -> String,
) -> Result<(), SpecError> {
    if ok {
        Ok(())
    } else {
        Err(SpecError::invalid(file, field, why()))
    }
}

/// An objective ratio strictly between 0 and 1, at most five nines.
pub(crate) fn check_objective(file: &str, field: &str, ratio: f64) -> Result<f64, SpecError> {
    // 99.9 / 100 is 0.9990000000000001 in binary; ten decimals are more than any SLO needs.
    let ratio = (ratio * 1e10).round() / 1e10;
    if !ratio.is_finite() || ratio <= 0.0 || ratio >= 1.0 {
        return Err(SpecError::invalid(
            file,
            field,
            format!("{ratio} must be strictly between 0 and 1 (as a ratio)"),
        ));
    }
    if ratio > 0.99999 {
        return Err(SpecError::invalid(
            file,
            field,
            "more than five nines cannot be measured over these windows",
        ));
    }
    Ok(ratio)
}

/// A rolling period: whole days, 1 to 31.
pub(crate) fn rolling_period(file: &str, field: &str, text: &str) -> Result<Period, SpecError> {
    let secs =
        duration::parse_secs(text).map_err(|e| SpecError::invalid(file, field, e.to_string()))?;
    if secs % 86_400 != 0 || !(1..=31).contains(&(secs / 86_400)) {
        return Err(SpecError::invalid(
            file,
            field,
            format!("{text:?} must be a whole number of days from 1d to 31d"),
        ));
    }
    Ok(Period::Rolling {
        days: (secs / 86_400) as u32,
    })
}

/// A time slice: 10 s to 1 h, dividing an hour evenly (so slices align with our buckets).
pub(crate) fn timeslice(file: &str, field: &str, text: &str) -> Result<u64, SpecError> {
    let secs =
        duration::parse_secs(text).map_err(|e| SpecError::invalid(file, field, e.to_string()))?;
    if !(10..=3_600).contains(&secs) || 3_600 % secs != 0 || secs % 10 != 0 {
        return Err(SpecError::invalid(
            file,
            field,
            format!(
                "{text:?} must be a multiple of 10s that divides 1h evenly (10s, 30s, 1m, 5m, 15m, 1h…)"
            ),
        ));
    }
    Ok(secs)
}

/// A PromQL query that must contain the `{{.window}}` placeholder.
pub(crate) fn check_query(file: &str, field: &str, q: &str) -> Result<String, SpecError> {
    // One line: multi-line YAML blocks (Sloth examples use them) become single spaces.
    let q = q.split_whitespace().collect::<Vec<_>>().join(" ");
    check_text(file, field, &q)?;
    if !q.contains(WINDOW_PLACEHOLDER) {
        return Err(SpecError::invalid(
            file,
            field,
            "must contain the {{.window}} placeholder where the range goes",
        ));
    }
    Ok(q)
}

/// Sloth's range placeholder, kept for compatibility.
pub const WINDOW_PLACEHOLDER: &str = "{{.window}}";
