//! What an event is to the SLOs: an [`Observation`] (from a span or a failure event) and
//! whether it counts for an SLO and is good ([`classify`]): the selector (service, feature,
//! criticality) and the SLI kind (availability, latency, task success).

use brownout_protocol::wire::attr;
use brownout_protocol::{Criticality, FailureEvent};

use super::spec::{LatencyMetric, SliKind, SloSpec};

/// What an observed event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// An inference / API request (a server span).
    Request,
    /// One agent task (possibly many requests).
    AgentTask,
}

/// One event as the SLOs see it. Borrowed, so the ingest hot path allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation<'a> {
    pub ts_ms: u64,
    pub kind: EventKind,
    pub service: &'a str,
    /// Empty when unknown.
    pub feature: &'a str,
    pub criticality: Criticality,
    /// False for a span with status ERROR or a failure event.
    pub ok: bool,
    /// A request brownout refused on purpose (a deliberate outcome: shed, feature disabled,
    /// drained, per-user cap, loop kill, tool breaker, throttled). Counted for no SLI, neither
    /// good nor bad, and reported apart ([`SloStatus::refused`]; docs/SLO.md "Deliberate
    /// refusals").
    pub deliberate: bool,
    /// End-to-end latency, when known.
    pub latency_ms: Option<f64>,
    /// Time to first token, when known.
    pub ttft_ms: Option<f64>,
}

impl<'a> Observation<'a> {
    /// A failure event is one bad event. It is an agent task when its attribute `kind` (or
    /// `brownout.kind`) is `agent_task`, or its `error_type` starts with `Agent`
    /// (`AgentExecutionFailed`); otherwise a request. Its `latency_ms` counts as end-to-end
    /// latency when > 0. One marked deliberate ([`FailureEvent::is_deliberate`]) is a refusal,
    /// not a bad event.
    pub fn from_failure(ev: &'a FailureEvent) -> Observation<'a> {
        let kind_attr = ev
            .attributes
            .get("kind")
            .or_else(|| ev.attributes.get(attr::KIND));
        let kind =
            if kind_attr.is_some_and(|k| k == "agent_task") || ev.error_type.starts_with("Agent") {
                EventKind::AgentTask
            } else {
                EventKind::Request
            };
        Observation {
            ts_ms: ev.ts_ms,
            kind,
            service: &ev.service,
            feature: &ev.feature,
            criticality: ev.criticality,
            ok: false,
            deliberate: ev.is_deliberate(),
            latency_ms: (ev.latency_ms > 0.0).then_some(ev.latency_ms),
            ttft_ms: None,
        }
    }

    /// A finished server span. `attr` looks up span attributes by name: `brownout.feature` /
    /// `feature`, `brownout.criticality` / `criticality`, `brownout.kind` (`request` or
    /// `agent_task`), and the time to first token as `brownout.ttft_s` / `ttft_s` (seconds,
    /// what the serving tier exports) or `brownout.ttft_ms` / `ttft_ms`, and `brownout.deliberate`
    /// / `deliberate` (`true` on a request refused on purpose). `ts_ms` is the span's end,
    /// `duration_ms` its length (the end-to-end latency).
    pub fn from_span(
        service: &'a str,
        ts_ms: u64,
        duration_ms: f64,
        is_error: bool,
        attr: impl Fn(&str) -> Option<&'a str>,
    ) -> Observation<'a> {
        let get = |prefixed: &str, plain: &str| attr(prefixed).or_else(|| attr(plain));
        let number = |v: Option<&str>| {
            v.and_then(|v| v.parse::<f64>().ok())
                .filter(|d| d.is_finite() && *d >= 0.0)
        };
        let ttft_ms = number(get(attr::TTFT_S, "ttft_s"))
            .map(|s| s * 1000.0)
            .or_else(|| number(get(attr::TTFT_MS, "ttft_ms")));
        Observation {
            ts_ms,
            kind: if get(attr::KIND, "kind") == Some("agent_task") {
                EventKind::AgentTask
            } else {
                EventKind::Request
            },
            service,
            feature: get(attr::FEATURE, "feature").unwrap_or(""),
            criticality: get(attr::CRITICALITY, "criticality")
                .and_then(Criticality::parse)
                .unwrap_or_default(),
            ok: !is_error,
            deliberate: get(attr::DELIBERATE, "deliberate") == Some("true"),
            latency_ms: Some(duration_ms).filter(|d| d.is_finite() && *d >= 0.0),
            ttft_ms,
        }
    }
}

/// Service, feature and criticality selectors.
pub(super) fn matches_selector(spec: &SloSpec, obs: &Observation<'_>) -> bool {
    obs.service == spec.service
        && spec
            .selector
            .feature
            .as_deref()
            .is_none_or(|f| obs.feature == f)
        && (spec.selector.criticality.is_empty()
            || spec.selector.criticality.contains(&obs.criticality))
}

/// Whether a refusal on purpose would have counted for this SLO (its selector and its kind of
/// event): it is then one of the SLO's refused requests.
pub fn outcome_of_refusal(spec: &SloSpec, obs: &Observation<'_>) -> bool {
    matches_selector(spec, obs) && classify_kind(spec, obs)
}

/// Whether the SLI kind takes this kind of event (requests or agent tasks).
pub(super) fn classify_kind(spec: &SloSpec, obs: &Observation<'_>) -> bool {
    match spec.sli.kind {
        SliKind::TaskSuccess => obs.kind == EventKind::AgentTask,
        SliKind::Availability | SliKind::Latency { .. } => obs.kind == EventKind::Request,
    }
}

/// Whether an observation counts for an SLO, and if so whether it is good. A deliberate
/// refusal counts for none (`None`).
pub fn classify(spec: &SloSpec, obs: &Observation<'_>) -> Option<bool> {
    if obs.deliberate || !matches_selector(spec, obs) {
        return None;
    }
    match spec.sli.kind {
        SliKind::Availability => (obs.kind == EventKind::Request).then_some(obs.ok),
        SliKind::TaskSuccess => (obs.kind == EventKind::AgentTask).then_some(obs.ok),
        SliKind::Latency {
            metric,
            threshold_ms,
        } => {
            if obs.kind != EventKind::Request {
                return None;
            }
            let v = match metric {
                LatencyMetric::Ttft => obs.ttft_ms,
                LatencyMetric::E2e => obs.latency_ms,
            }?;
            Some(obs.ok && v <= threshold_ms)
        }
    }
}
