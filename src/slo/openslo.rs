//! OpenSLO v1 (`apiVersion: openslo/v1`) as input: `kind: SLO` documents, with their SLI inline
//! (`indicator`) or by name (`indicatorRef`, a `kind: SLI` document in the same file). Other
//! kinds (Service, DataSource, AlertPolicy…) are skipped.
//!
//! Mapping: `metadata.name` → name; `spec.service` → service; `metadata.labels` → labels
//! (lists joined with `,`); `timeWindow` rolling `Nd`/`Nw` → rolling period, `1M` calendar →
//! calendar month; `budgetingMethod` Occurrences / Timeslices; exactly one objective with
//! `target` or `targetPercent` (and `timeSliceTarget` / `timeSliceWindow` for Timeslices); a
//! `ratioMetric` whose sources have `type: Prometheus` and `spec.query` (with `{{.window}}`)
//! becomes the PromQL SLI (`bad`/`total`, or `good`/`total` → errors = total − good, or `raw`).
//! In process the SLO is evaluated as availability of its service. `thresholdMetric`,
//! RatioTimeslices and composite objectives are refused.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::model::{
    self as spec, Alerting, Budgeting, Format, Period, PromSli, Selector, Sli, SliKind, SloSpec,
    SpecError, SpecSource,
};

pub const API_VERSION: &str = "openslo/v1";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDoc {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    metadata: RawMetadata,
    #[serde(default)]
    spec: serde_yaml::Value,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawMetadata {
    name: String,
    #[serde(default)]
    display_name: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, LabelValue>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum LabelValue {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSloSpec {
    #[serde(default)]
    description: Option<String>,
    service: String,
    #[serde(default)]
    indicator: Option<RawInlineSli>,
    #[serde(default)]
    indicator_ref: Option<String>,
    time_window: Vec<RawTimeWindow>,
    budgeting_method: String,
    objectives: Vec<RawObjective>,
    #[serde(default)]
    alert_policies: Option<serde_yaml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInlineSli {
    /// Validated for shape only; the SLO's own metadata names it.
    #[allow(dead_code)]
    metadata: RawMetadata,
    spec: RawSliSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSliSpec {
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    threshold_metric: Option<serde_yaml::Value>,
    #[serde(default)]
    ratio_metric: Option<RawRatioMetric>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawRatioMetric {
    #[serde(default)]
    counter: Option<bool>,
    #[serde(default)]
    good: Option<RawMetricHolder>,
    #[serde(default)]
    bad: Option<RawMetricHolder>,
    #[serde(default)]
    total: Option<RawMetricHolder>,
    #[serde(default)]
    raw_type: Option<String>,
    #[serde(default)]
    raw: Option<RawMetricHolder>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawMetricHolder {
    metric_source: RawMetricSource,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawMetricSource {
    #[serde(default)]
    metric_source_ref: Option<String>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    /// Data-source specific; for Prometheus we read `query`.
    #[serde(default)]
    spec: BTreeMap<String, serde_yaml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawTimeWindow {
    duration: String,
    #[serde(default)]
    is_rolling: Option<bool>,
    #[serde(default)]
    calendar: Option<serde_yaml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawObjective {
    #[serde(default)]
    display_name: Option<String>,
    #[serde(default)]
    op: Option<String>,
    #[serde(default)]
    value: Option<f64>,
    #[serde(default)]
    target: Option<f64>,
    #[serde(default)]
    target_percent: Option<f64>,
    #[serde(default)]
    time_slice_target: Option<f64>,
    #[serde(default)]
    time_slice_window: Option<serde_yaml::Value>,
    #[serde(default)]
    indicator: Option<serde_yaml::Value>,
    #[serde(default)]
    indicator_ref: Option<String>,
    #[serde(default)]
    composite_weight: Option<f64>,
}

pub(crate) fn convert(text: &str, file: &str) -> Result<Vec<SloSpec>, SpecError> {
    let mut docs = Vec::new();
    for (i, de) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let doc = RawDoc::deserialize(de)
            .map_err(|e| SpecError::parse(file, format!("document {}: {e}", i + 1)))?;
        if doc.api_version != API_VERSION {
            return Err(SpecError::invalid(
                file,
                format!("document {}: apiVersion", i + 1),
                format!("{:?} is not {API_VERSION}", doc.api_version),
            ));
        }
        docs.push(doc);
    }
    // SLI documents first, so indicatorRef can find them wherever they are in the file.
    let mut slis: BTreeMap<String, RawSliSpec> = BTreeMap::new();
    for doc in &docs {
        if doc.kind == "SLI" {
            let at = format!("SLI {:?}", doc.metadata.name);
            let s: RawSliSpec = serde_yaml::from_value(doc.spec.clone())
                .map_err(|e| SpecError::invalid(file, &at, e.to_string()))?;
            slis.insert(doc.metadata.name.clone(), s);
        }
    }
    let mut out = Vec::new();
    for doc in docs {
        if doc.kind != "SLO" {
            continue;
        }
        let at = format!("SLO {:?}", doc.metadata.name);
        let s: RawSloSpec = serde_yaml::from_value(doc.spec)
            .map_err(|e| SpecError::invalid(file, format!("{at}.spec"), e.to_string()))?;
        out.push(convert_slo(doc.metadata, s, &slis, file, &at)?);
    }
    Ok(out)
}

fn convert_slo(
    meta: RawMetadata,
    s: RawSloSpec,
    slis: &BTreeMap<String, RawSliSpec>,
    file: &str,
    at: &str,
) -> Result<SloSpec, SpecError> {
    let f = |x: &str| format!("{at}.{x}");
    let _ = (&meta.annotations, &s.alert_policies);
    spec::check_name(file, &f("metadata.name"), &meta.name)?;
    spec::check_text(file, &f("spec.service"), &s.service)?;
    let mut labels = BTreeMap::new();
    for (k, v) in meta.labels {
        let v = match v {
            LabelValue::One(x) => x,
            LabelValue::Many(xs) => xs.join(","),
        };
        labels.insert(k, v);
    }
    spec::check_labels(file, &f("metadata.labels"), &labels)?;

    let [window] = s.time_window.as_slice() else {
        return Err(SpecError::invalid(
            file,
            f("spec.timeWindow"),
            "exactly one time window is supported",
        ));
    };
    let rolling = window.is_rolling.unwrap_or(window.calendar.is_none());
    let period = if rolling {
        spec::rolling_period(file, &f("spec.timeWindow[0].duration"), &window.duration)?
    } else if window.duration == "1M" {
        Period::CalendarMonth
    } else {
        return Err(SpecError::invalid(
            file,
            f("spec.timeWindow[0].duration"),
            format!(
                "calendar window {:?}: only 1M (a calendar month) is supported",
                window.duration
            ),
        ));
    };

    let [obj] = s.objectives.as_slice() else {
        return Err(SpecError::invalid(
            file,
            f("spec.objectives"),
            "exactly one objective is supported",
        ));
    };
    if obj.indicator.is_some() || obj.indicator_ref.is_some() || obj.composite_weight.is_some() {
        return Err(SpecError::invalid(
            file,
            f("spec.objectives[0]"),
            "composite objectives are not supported",
        ));
    }
    if obj.op.is_some() || obj.value.is_some() {
        return Err(SpecError::invalid(
            file,
            f("spec.objectives[0]"),
            "op/value (threshold metrics) are not supported",
        ));
    }
    let objective_ratio = match (obj.target, obj.target_percent) {
        (Some(t), None) => spec::check_objective(file, &f("spec.objectives[0].target"), t)?,
        (None, Some(p)) => {
            spec::check_objective(file, &f("spec.objectives[0].targetPercent"), p / 100.0)?
        }
        _ => {
            return Err(SpecError::invalid(
                file,
                f("spec.objectives[0]"),
                "give exactly one of target and targetPercent",
            ));
        }
    };
    let budgeting = match s.budgeting_method.as_str() {
        "Occurrences" => Budgeting::Occurrences,
        "Timeslices" => {
            let good = obj.time_slice_target.ok_or_else(|| {
                SpecError::invalid(
                    file,
                    f("spec.objectives[0].timeSliceTarget"),
                    "required with budgetingMethod Timeslices",
                )
            })?;
            if !good.is_finite() || good <= 0.0 || good > 1.0 {
                return Err(SpecError::invalid(
                    file,
                    f("spec.objectives[0].timeSliceTarget"),
                    "must be in (0, 1]",
                ));
            }
            let window_text = match &obj.time_slice_window {
                Some(serde_yaml::Value::String(t)) => t.clone(),
                Some(serde_yaml::Value::Number(n)) => format!("{n}s"),
                _ => {
                    return Err(SpecError::invalid(
                        file,
                        f("spec.objectives[0].timeSliceWindow"),
                        "required with budgetingMethod Timeslices (e.g. 1m)",
                    ));
                }
            };
            let slice_secs =
                spec::timeslice(file, &f("spec.objectives[0].timeSliceWindow"), &window_text)?;
            Budgeting::Timeslices {
                slice_secs,
                good_slice_ratio: good,
            }
        }
        other => {
            return Err(SpecError::invalid(
                file,
                f("spec.budgetingMethod"),
                format!("{other:?} is not supported (Occurrences or Timeslices)"),
            ));
        }
    };

    let (sli_spec, sli_field) = match (&s.indicator, &s.indicator_ref) {
        (Some(inline), None) => (&inline.spec, f("spec.indicator.spec")),
        (None, Some(name)) => (
            slis.get(name).ok_or_else(|| {
                SpecError::invalid(
                    file,
                    f("spec.indicatorRef"),
                    format!("no SLI document named {name:?} in this file"),
                )
            })?,
            format!("SLI {name:?}.spec"),
        ),
        _ => {
            return Err(SpecError::invalid(
                file,
                f("spec"),
                "give exactly one of indicator and indicatorRef",
            ));
        }
    };
    let promql = prom_sli(sli_spec, file, &sli_field)?;
    let description = s
        .description
        .or_else(|| {
            s.indicator
                .as_ref()
                .and_then(|i| i.spec.description.clone())
        })
        .or(meta.display_name)
        .or_else(|| obj.display_name.clone())
        .unwrap_or_default();
    Ok(SloSpec {
        name: meta.name,
        description,
        service: s.service,
        selector: Selector::default(),
        objective_ratio,
        period,
        budgeting,
        sli: Sli {
            kind: SliKind::Availability,
            promql,
        },
        min_events: spec::DEFAULT_MIN_EVENTS,
        labels,
        alerting: Alerting::default(),
        source: SpecSource {
            file: file.to_string(),
            format: Format::OpenSlo,
        },
    })
}

/// The PromQL form of an OpenSLO ratio metric, `None` when its sources are not Prometheus.
fn prom_sli(s: &RawSliSpec, file: &str, at: &str) -> Result<Option<PromSli>, SpecError> {
    if s.threshold_metric.is_some() {
        return Err(SpecError::invalid(
            file,
            format!("{at}.thresholdMetric"),
            "threshold metrics are not supported; use ratioMetric",
        ));
    }
    let Some(r) = &s.ratio_metric else {
        return Err(SpecError::invalid(file, at, "ratioMetric is required"));
    };
    let _ = (
        r.counter,
        r.good.as_ref().map(|g| &g.metric_source.metric_source_ref),
    );
    let query = |h: &RawMetricHolder, field: &str| -> Result<Option<String>, SpecError> {
        let src = &h.metric_source;
        if !src
            .kind
            .as_deref()
            .is_some_and(|k| k.eq_ignore_ascii_case("prometheus"))
        {
            return Ok(None);
        }
        match src.spec.get("query") {
            Some(serde_yaml::Value::String(q)) => spec::check_query(
                file,
                &format!("{at}.ratioMetric.{field}.metricSource.spec.query"),
                q,
            )
            .map(Some),
            _ => Err(SpecError::invalid(
                file,
                format!("{at}.ratioMetric.{field}.metricSource.spec.query"),
                "a Prometheus source needs a query string",
            )),
        }
    };
    match (&r.good, &r.bad, &r.total, &r.raw) {
        (None, Some(bad), Some(total), None) => {
            Ok(match (query(bad, "bad")?, query(total, "total")?) {
                (Some(e), Some(t)) => Some(PromSli::Events {
                    error_query: e,
                    total_query: t,
                }),
                _ => None,
            })
        }
        (Some(good), None, Some(total), None) => {
            Ok(match (query(good, "good")?, query(total, "total")?) {
                (Some(g), Some(t)) => Some(PromSli::Events {
                    error_query: format!("({t}) - ({g})"),
                    total_query: t,
                }),
                _ => None,
            })
        }
        (None, None, None, Some(raw)) => {
            let Some(q) = query(raw, "raw")? else {
                return Ok(None);
            };
            match r.raw_type.as_deref() {
                Some("failure") => Ok(Some(PromSli::Raw {
                    error_ratio_query: q,
                })),
                Some("success") => Ok(Some(PromSli::Raw {
                    error_ratio_query: format!("1 - ({q})"),
                })),
                _ => Err(SpecError::invalid(
                    file,
                    format!("{at}.ratioMetric.rawType"),
                    "must be success or failure with raw",
                )),
            }
        }
        _ => Err(SpecError::invalid(
            file,
            format!("{at}.ratioMetric"),
            "give good and total, bad and total, or raw with rawType",
        )),
    }
}
