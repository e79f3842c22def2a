//! brownout's own SLO format (`version: brownout/v1`), documented in docs/SLO.md.
//!
//! ```yaml
//! version: brownout/v1
//! slos:
//!   - name: chat-availability
//!     service: chat
//!     objective_percent: 99.9
//!     period: 28d
//!     sli: { kind: availability }
//! ```

use std::collections::BTreeMap;

use brownout_protocol::Criticality;
use serde::Deserialize;

use super::model::{
    self as spec, AlertConfig, Alerting, Budgeting, Format, LatencyMetric, Period, PromSli,
    Selector, Sli, SliKind, SloSpec, SpecError, SpecSource,
};

pub const VERSION: &str = "brownout/v1";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[allow(dead_code)]
    version: String,
    slos: Vec<RawSlo>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSlo {
    name: String,
    #[serde(default)]
    description: String,
    service: String,
    #[serde(default)]
    feature: Option<String>,
    #[serde(default)]
    criticality: Vec<String>,
    #[serde(default)]
    objective_percent: Option<f64>,
    #[serde(default)]
    objective_ratio: Option<f64>,
    /// `7d`, `28d`, `30d`… or `calendar_month`.
    period: String,
    /// `occurrences` (default) or `timeslices`.
    #[serde(default)]
    budgeting: Option<String>,
    #[serde(default)]
    timeslice: Option<RawTimeslice>,
    sli: RawSli,
    #[serde(default)]
    min_events: Option<u64>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    alerting: Option<RawAlerting>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimeslice {
    /// Slice length, e.g. `1m`.
    slice: String,
    /// A slice is good when at least this fraction of its events are good.
    good_ratio: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSli {
    /// `availability`, `latency` or `task_success`.
    kind: String,
    /// Latency only: `ttft` or `e2e`.
    #[serde(default)]
    latency_metric: Option<String>,
    /// Latency only: the threshold a good request stays at or under.
    #[serde(default)]
    threshold_ms: Option<f64>,
    /// Override the PromQL the rule generator uses.
    #[serde(default)]
    prometheus: Option<RawPromSli>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPromSli {
    #[serde(default)]
    error_query: Option<String>,
    #[serde(default)]
    total_query: Option<String>,
    #[serde(default)]
    error_ratio_query: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAlerting {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    page: Option<RawAlert>,
    #[serde(default)]
    ticket: Option<RawAlert>,
    #[serde(default)]
    fast_burn: Option<RawAlert>,
    #[serde(default)]
    absent: Option<RawAlert>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAlert {
    #[serde(default)]
    enabled: Option<bool>,
    /// How long the condition must hold before firing (`for`), e.g. `2m`. `0s` is not a
    /// duration; leave it out for "at once".
    #[serde(default)]
    pending: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

pub(crate) fn convert(text: &str, file: &str) -> Result<Vec<SloSpec>, SpecError> {
    let raw: RawFile = serde_yaml::from_str(text).map_err(|e| SpecError::parse(file, e))?;
    raw.slos
        .into_iter()
        .enumerate()
        .map(|(i, s)| convert_slo(s, file, &format!("slos[{i}]")))
        .collect()
}

fn convert_slo(r: RawSlo, file: &str, at: &str) -> Result<SloSpec, SpecError> {
    let f = |field: &str| format!("{at}.{field}");
    spec::check_name(file, &f("name"), &r.name)?;
    spec::check_text(file, &f("service"), &r.service)?;
    let feature = match r.feature {
        Some(x) => {
            spec::check_text(file, &f("feature"), &x)?;
            Some(x)
        }
        None => None,
    };
    let mut criticality = Vec::new();
    for (i, c) in r.criticality.iter().enumerate() {
        let parsed = Criticality::parse(c).ok_or_else(|| {
            SpecError::invalid(
                file,
                f(&format!("criticality[{i}]")),
                format!("{c:?} is not critical, default or sheddable (or P0/P1/P2)"),
            )
        })?;
        if !criticality.contains(&parsed) {
            criticality.push(parsed);
        }
    }
    let objective_ratio = match (r.objective_percent, r.objective_ratio) {
        (Some(p), None) => spec::check_objective(file, &f("objective_percent"), p / 100.0)?,
        (None, Some(x)) => spec::check_objective(file, &f("objective_ratio"), x)?,
        _ => {
            return Err(SpecError::invalid(
                file,
                at,
                "give exactly one of objective_percent and objective_ratio",
            ));
        }
    };
    let period = if r.period == "calendar_month" {
        Period::CalendarMonth
    } else {
        spec::rolling_period(file, &f("period"), &r.period)?
    };
    let budgeting = match (r.budgeting.as_deref().unwrap_or("occurrences"), r.timeslice) {
        ("occurrences", None) => Budgeting::Occurrences,
        ("occurrences", Some(_)) => {
            return Err(SpecError::invalid(
                file,
                f("timeslice"),
                "only allowed with budgeting: timeslices",
            ));
        }
        ("timeslices", Some(t)) => {
            let slice_secs = spec::timeslice(file, &f("timeslice.slice"), &t.slice)?;
            if !t.good_ratio.is_finite() || t.good_ratio <= 0.0 || t.good_ratio > 1.0 {
                return Err(SpecError::invalid(
                    file,
                    f("timeslice.good_ratio"),
                    "must be in (0, 1]",
                ));
            }
            Budgeting::Timeslices {
                slice_secs,
                good_slice_ratio: t.good_ratio,
            }
        }
        ("timeslices", None) => {
            return Err(SpecError::invalid(
                file,
                f("timeslice"),
                "required with budgeting: timeslices",
            ));
        }
        (other, _) => {
            return Err(SpecError::invalid(
                file,
                f("budgeting"),
                format!("{other:?} is not occurrences or timeslices"),
            ));
        }
    };
    let selector = Selector {
        feature,
        criticality,
    };
    let kind = sli_kind(&r.sli, file, &f("sli"))?;
    let promql = match r.sli.prometheus {
        Some(p) => prom_override(p, file, &f("sli.prometheus"))?,
        None => default_promql(kind, &r.service, &selector)
            .map_err(|reason| SpecError::invalid(file, f("sli"), reason))?,
    };
    spec::check_labels(file, &f("labels"), &r.labels)?;
    let alerting = alerting(r.alerting, file, &f("alerting"))?;
    Ok(SloSpec {
        name: r.name,
        description: r.description,
        service: r.service,
        selector,
        objective_ratio,
        period,
        budgeting,
        sli: Sli {
            kind,
            promql: Some(promql),
        },
        min_events: r.min_events.unwrap_or(spec::DEFAULT_MIN_EVENTS),
        labels: r.labels,
        alerting,
        source: SpecSource {
            file: file.to_string(),
            format: Format::Brownout,
        },
    })
}

fn sli_kind(s: &RawSli, file: &str, at: &str) -> Result<SliKind, SpecError> {
    let only_latency = |kind: &str| {
        if s.latency_metric.is_some() || s.threshold_ms.is_some() {
            Err(SpecError::invalid(
                file,
                format!("{at}.kind"),
                format!("latency_metric and threshold_ms only apply to kind latency, not {kind}"),
            ))
        } else {
            Ok(())
        }
    };
    match s.kind.as_str() {
        "availability" => only_latency("availability").map(|()| SliKind::Availability),
        "task_success" => only_latency("task_success").map(|()| SliKind::TaskSuccess),
        "latency" => {
            let metric = match s.latency_metric.as_deref() {
                Some("ttft") => LatencyMetric::Ttft,
                Some("e2e") => LatencyMetric::E2e,
                Some(other) => {
                    return Err(SpecError::invalid(
                        file,
                        format!("{at}.latency_metric"),
                        format!("{other:?} is not ttft or e2e"),
                    ));
                }
                None => {
                    return Err(SpecError::invalid(
                        file,
                        format!("{at}.latency_metric"),
                        "required for kind latency (ttft or e2e)",
                    ));
                }
            };
            let threshold_ms = s.threshold_ms.ok_or_else(|| {
                SpecError::invalid(
                    file,
                    format!("{at}.threshold_ms"),
                    "required for kind latency",
                )
            })?;
            if !threshold_ms.is_finite() || threshold_ms <= 0.0 {
                return Err(SpecError::invalid(
                    file,
                    format!("{at}.threshold_ms"),
                    "must be a number > 0",
                ));
            }
            Ok(SliKind::Latency {
                metric,
                threshold_ms,
            })
        }
        other => Err(SpecError::invalid(
            file,
            format!("{at}.kind"),
            format!("{other:?} is not availability, latency or task_success"),
        )),
    }
}

fn prom_override(p: RawPromSli, file: &str, at: &str) -> Result<PromSli, SpecError> {
    match (p.error_query, p.total_query, p.error_ratio_query) {
        (Some(e), Some(t), None) => Ok(PromSli::Events {
            error_query: spec::check_query(file, &format!("{at}.error_query"), &e)?,
            total_query: spec::check_query(file, &format!("{at}.total_query"), &t)?,
        }),
        (None, None, Some(r)) => Ok(PromSli::Raw {
            error_ratio_query: spec::check_query(file, &format!("{at}.error_ratio_query"), &r)?,
        }),
        _ => Err(SpecError::invalid(
            file,
            at,
            "give error_query and total_query, or error_ratio_query alone",
        )),
    }
}

fn alerting(r: Option<RawAlerting>, file: &str, at: &str) -> Result<Alerting, SpecError> {
    let mut a = Alerting::default();
    let Some(r) = r else { return Ok(a) };
    if let Some(name) = &r.name {
        spec::check_alert_name(file, &format!("{at}.name"), name)?;
    }
    check_alert_labels(file, &format!("{at}.labels"), &r.labels)?;
    a.name = r.name;
    a.labels = r.labels;
    a.annotations = r.annotations;
    for (slot, raw, key) in [
        (&mut a.page, r.page, "page"),
        (&mut a.ticket, r.ticket, "ticket"),
        (&mut a.fast_burn, r.fast_burn, "fast_burn"),
        (&mut a.absent, r.absent, "absent"),
    ] {
        if let Some(x) = raw {
            *slot = alert_config(x, slot.pending_secs, file, &format!("{at}.{key}"))?;
        }
    }
    Ok(a)
}

fn alert_config(
    r: RawAlert,
    default_pending: u64,
    file: &str,
    at: &str,
) -> Result<AlertConfig, SpecError> {
    let pending_secs = match r.pending.as_deref() {
        None => default_pending,
        Some("0" | "0s") => 0,
        Some(t) => super::duration::parse_secs(t)
            .map_err(|e| SpecError::invalid(file, format!("{at}.pending"), e.to_string()))?,
    };
    check_alert_labels(file, &format!("{at}.labels"), &r.labels)?;
    Ok(AlertConfig {
        enabled: r.enabled.unwrap_or(true),
        pending_secs,
        labels: r.labels,
        annotations: r.annotations,
    })
}

/// Alert labels may override `severity` but not the SLO identity labels.
pub(crate) fn check_alert_labels(
    file: &str,
    at: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), SpecError> {
    spec::check_labels(file, at, labels)
}

/// The metric names the serving tier is assumed to export (docs/SLO.md, "Metrics assumed").
pub mod metrics {
    /// Counter of finished requests with labels `service`, `feature`, `criticality`, `outcome`
    /// (the finish reason — `stop`, `length`, `abort` — or `error`; only `error` is bad). Refused
    /// requests (shed, feature disabled) are not in it: the serving tier counts them in
    /// `brownout_serving_shed_total` and `brownout_serving_feature_disabled_total`.
    pub const REQUESTS: &str = brownout_protocol::wire::metric::SERVING_REQUESTS_TOTAL;
    /// Counter of agent tasks with labels `service`, `feature`, `criticality`, `outcome`
    /// (`ok`, `error`).
    pub const AGENT_TASKS: &str = "brownout_agent_tasks_total";
    /// vLLM's TTFT histogram (seconds).
    pub const TTFT: &str = brownout_protocol::wire::metric::TIME_TO_FIRST_TOKEN_SECONDS;
    /// vLLM's end-to-end latency histogram (seconds).
    pub const E2E: &str = brownout_protocol::wire::metric::E2E_REQUEST_LATENCY_SECONDS;
}

/// A PromQL string literal.
fn lit(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn default_matchers(service: &str, sel: &Selector) -> Vec<String> {
    let mut matchers = vec![format!("service={}", lit(service))];
    if let Some(f) = &sel.feature {
        matchers.push(format!("feature={}", lit(f)));
    }
    if !sel.criticality.is_empty() {
        let alts: Vec<&str> = sel.criticality.iter().map(|c| c.as_str()).collect();
        matchers.push(format!("criticality=~\"{}\"", alts.join("|")));
    }
    matchers
}

/// The `outcome` values of requests refused on purpose (docs/PROTOCOL.md "Deliberate
/// outcomes"), as the serving tier counts them in `brownout_serving_requests_total`.
pub const DELIBERATE_OUTCOMES: &str =
    "shed|feature_disabled|tool_disabled|drained|user_cap|loop_abort|throttled";

/// The refusals on purpose of an SLO whose SLI is the default request or agent-task counter
/// (the user-felt view's extra bad events): `None` for latency SLIs and own queries.
pub(crate) fn default_refused_promql(spec: &SloSpec) -> Option<String> {
    let metric = match spec.sli.kind {
        SliKind::Availability => metrics::REQUESTS,
        SliKind::TaskSuccess => metrics::AGENT_TASKS,
        SliKind::Latency { .. } => return None,
    };
    let default = default_promql(spec.sli.kind, &spec.service, &spec.selector).ok();
    if spec.sli.promql.is_none() || spec.sli.promql != default {
        return None;
    }
    let all = default_matchers(&spec.service, &spec.selector).join(",");
    Some(format!(
        "sum(rate({metric}{{{all},outcome=~\"{DELIBERATE_OUTCOMES}\"}}[{{{{.window}}}}]))"
    ))
}

/// PromQL for an SLI kind over the assumed metrics (docs/SLO.md).
///
/// # Errors
/// A latency SLI narrowed by feature or criticality: vLLM's histograms carry neither label, so
/// the spec must give its own queries.
pub(crate) fn default_promql(
    kind: SliKind,
    service: &str,
    sel: &Selector,
) -> Result<PromSli, String> {
    let matchers = default_matchers(service, sel);
    let counter = |metric: &str| {
        let all = matchers.join(",");
        PromSli::Events {
            error_query: format!("sum(rate({metric}{{{all},outcome=\"error\"}}[{{{{.window}}}}]))"),
            // Refusals on purpose are no answered request of the SLI (the real-failure view).
            total_query: format!(
                "sum(rate({metric}{{{all},outcome!~\"{DELIBERATE_OUTCOMES}\"}}[{{{{.window}}}}]))"
            ),
        }
    };
    match kind {
        SliKind::Availability => Ok(counter(metrics::REQUESTS)),
        SliKind::TaskSuccess => Ok(counter(metrics::AGENT_TASKS)),
        SliKind::Latency {
            metric,
            threshold_ms,
        } => {
            if sel.feature.is_some() || !sel.criticality.is_empty() {
                return Err(
                    "a latency SLI narrowed by feature or criticality needs sli.prometheus: \
                            vLLM's histograms carry no feature or criticality label"
                        .into(),
                );
            }
            let hist = match metric {
                LatencyMetric::Ttft => metrics::TTFT,
                LatencyMetric::E2e => metrics::E2E,
            };
            let secs = threshold_ms / 1000.0;
            // Rust and Go clients print `le="2"`, Python's (vLLM) prints `le="2.0"`: match both.
            let le = if secs.fract() == 0.0 {
                format!("le=~\"{secs}|{secs}.0\"")
            } else {
                format!("le=\"{secs}\"")
            };
            let m = &matchers[0];
            Ok(PromSli::Events {
                error_query: format!(
                    "(sum(rate({hist}_count{{{m}}}[{{{{.window}}}}])) - sum(rate({hist}_bucket{{{m},{le}}}[{{{{.window}}}}])))"
                ),
                total_query: format!("sum(rate({hist}_count{{{m}}}[{{{{.window}}}}]))"),
            })
        }
    }
}
