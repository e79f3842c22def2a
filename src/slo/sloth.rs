//! Sloth's `prometheus/v1` spec as input (github.com/slok/sloth, `pkg/prometheus/api/v1`).
//!
//! Mapping: `service` → service; `labels` (file and SLO level, merged) → labels; `objective`
//! (percent) → objective ratio; `sli.events` / `sli.raw` → the PromQL SLI; `alerting.name`,
//! labels and annotations → alerting; `page_alert` / `ticket_alert` `disable` → page / ticket
//! off. Sloth specs carry no period: 30 days, Sloth's default. In process they are evaluated as
//! availability SLOs of their service. SLI plugins are refused.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::model::{
    self as spec, AlertConfig, Alerting, Budgeting, Format, Period, PromSli, Selector, Sli,
    SliKind, SloSpec, SpecError, SpecSource,
};

pub const VERSION: &str = "prometheus/v1";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    #[allow(dead_code)]
    version: String,
    service: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    slos: Vec<RawSlo>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSlo {
    name: String,
    #[serde(default)]
    description: String,
    objective: f64,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    sli: RawSli,
    #[serde(default)]
    alerting: Option<RawAlerting>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSli {
    #[serde(default)]
    raw: Option<RawSliRaw>,
    #[serde(default)]
    events: Option<RawSliEvents>,
    #[serde(default)]
    plugin: Option<serde_yaml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSliRaw {
    error_ratio_query: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSliEvents {
    error_query: String,
    total_query: String,
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
    page_alert: Option<RawAlert>,
    #[serde(default)]
    ticket_alert: Option<RawAlert>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAlert {
    #[serde(default)]
    disable: bool,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

pub(crate) fn convert(text: &str, file: &str) -> Result<Vec<SloSpec>, SpecError> {
    let raw: RawSpec = serde_yaml::from_str(text).map_err(|e| SpecError::parse(file, e))?;
    spec::check_text(file, "service", &raw.service)?;
    spec::check_labels(file, "labels", &raw.labels)?;
    let mut out = Vec::with_capacity(raw.slos.len());
    for (i, s) in raw.slos.into_iter().enumerate() {
        let at = format!("slos[{i}]");
        let f = |x: &str| format!("{at}.{x}");
        spec::check_name(file, &f("name"), &s.name)?;
        let objective_ratio = spec::check_objective(file, &f("objective"), s.objective / 100.0)?;
        spec::check_labels(file, &f("labels"), &s.labels)?;
        let mut labels = raw.labels.clone();
        labels.extend(s.labels);
        let promql = match (s.sli.events, s.sli.raw, s.sli.plugin) {
            (Some(e), None, None) => PromSli::Events {
                error_query: spec::check_query(file, &f("sli.events.error_query"), &e.error_query)?,
                total_query: spec::check_query(file, &f("sli.events.total_query"), &e.total_query)?,
            },
            (None, Some(r), None) => PromSli::Raw {
                error_ratio_query: spec::check_query(
                    file,
                    &f("sli.raw.error_ratio_query"),
                    &r.error_ratio_query,
                )?,
            },
            (None, None, Some(_)) => {
                return Err(SpecError::invalid(
                    file,
                    f("sli.plugin"),
                    "Sloth SLI plugins are not supported; use events or raw",
                ));
            }
            _ => {
                return Err(SpecError::invalid(
                    file,
                    f("sli"),
                    "give exactly one of events and raw",
                ));
            }
        };
        let mut alerting = Alerting::default();
        if let Some(a) = s.alerting {
            if let Some(name) = &a.name {
                spec::check_alert_name(file, &f("alerting.name"), name)?;
            }
            spec::check_labels(file, &f("alerting.labels"), &a.labels)?;
            alerting.name = a.name;
            alerting.labels = a.labels;
            alerting.annotations = a.annotations;
            for (slot, raw_alert, key) in [
                (&mut alerting.page, a.page_alert, "page_alert"),
                (&mut alerting.ticket, a.ticket_alert, "ticket_alert"),
            ] {
                if let Some(x) = raw_alert {
                    spec::check_labels(file, &f(&format!("alerting.{key}.labels")), &x.labels)?;
                    *slot = AlertConfig {
                        enabled: !x.disable,
                        pending_secs: 0,
                        labels: x.labels,
                        annotations: x.annotations,
                    };
                }
            }
        }
        out.push(SloSpec {
            name: s.name,
            description: s.description,
            service: raw.service.clone(),
            selector: Selector::default(),
            objective_ratio,
            period: Period::Rolling { days: 30 },
            budgeting: Budgeting::Occurrences,
            sli: Sli {
                kind: SliKind::Availability,
                promql: Some(promql),
            },
            min_events: spec::DEFAULT_MIN_EVENTS,
            labels,
            alerting,
            source: SpecSource {
                file: file.to_string(),
                format: Format::Sloth,
            },
        });
    }
    Ok(out)
}
