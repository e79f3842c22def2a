//! OTLP → rows: pure conversion, shared by the HTTP and gRPC receivers (through [`Export`]).
//!
//! - A span becomes a [`SpanRow`]; service from the resource's `service.name`, host from
//!   `host.name`, feature/criticality from the span's (or resource's) `feature` /
//!   `brownout.feature` / `criticality` attributes. Spans with status ERROR also become
//!   failure events ([`FailureEvent::from_attributes`]; `exception` events' attributes
//!   included; trace id kept).
//! - A log record becomes a [`LogRow`]; severity ≥ ERROR (17) — or, when the number is
//!   unspecified, severity text ERROR/FATAL — also becomes a failure event.
//! - A span or record with an invalid id (trace id not 16 bytes, span id not 8) is rejected
//!   and counted for OTLP's `partial_success`.

use brownout_protocol::wire::attr;
use brownout_protocol::{Criticality, FailureEvent};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::resource::v1::Resource;

use super::limits::{
    DROPPED_ATTRIBUTES, MAX_ATTRIBUTE_BYTES, MAX_ATTRIBUTES, MAX_EVENTS, MAX_KEY_BYTES,
    MAX_MESSAGE_BYTES, MAX_NAME_BYTES, MAX_VALUE_BYTES, Truncated, cut, limit_event,
};
use crate::store::{FailureRow, LogRow, STATUS_ERROR, SpanRow};

/// OTLP severity number of ERROR.
pub const SEVERITY_ERROR: i32 = 17;

/// What one export request turned into.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Converted {
    pub spans: Vec<SpanRow>,
    pub logs: Vec<LogRow>,
    pub failures: Vec<FailureEvent>,
    /// Items refused (invalid ids), for `partial_success`.
    pub rejected: u64,
    /// The first refusal's reason.
    pub first_error: Option<String>,
    /// What the per-item limits cut ([`super::limits`]).
    pub truncated: super::limits::Truncated,
}

impl Converted {
    fn reject(&mut self, why: String) {
        self.rejected += 1;
        if self.first_error.is_none() {
            self.first_error = Some(why);
        }
    }
}

/// Renders an attribute value as text: strings as-is, numbers and booleans in their usual
/// form, bytes as hex, arrays and maps as JSON.
pub fn value_to_string(v: Option<&AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        None => String::new(),
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BytesValue(b)) => hex::encode(b),
        Some(other) => value_to_json(other).to_string(),
    }
}

fn value_to_json(v: &Value) -> serde_json::Value {
    match v {
        Value::StringValue(s) => s.clone().into(),
        Value::BoolValue(b) => (*b).into(),
        Value::IntValue(i) => (*i).into(),
        Value::DoubleValue(d) => {
            serde_json::Number::from_f64(*d).map_or(serde_json::Value::Null, Into::into)
        }
        Value::BytesValue(b) => hex::encode(b).into(),
        Value::ArrayValue(a) => a
            .values
            .iter()
            .map(|x| {
                x.value
                    .as_ref()
                    .map_or(serde_json::Value::Null, value_to_json)
            })
            .collect(),
        Value::KvlistValue(kv) => kv
            .values
            .iter()
            .map(|k| {
                (
                    k.key.clone(),
                    k.value
                        .as_ref()
                        .and_then(|x| x.value.as_ref())
                        .map_or(serde_json::Value::Null, value_to_json),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into(),
        #[allow(unreachable_patterns)]
        _ => serde_json::Value::Null,
    }
}

/// The attributes as text pairs, within the per-item limits: at most [`MAX_ATTRIBUTES`] of
/// them and [`MAX_ATTRIBUTE_BYTES`] of text are rendered at all (a million attributes cost
/// nothing more), keys and values are copied no further than their limits.
fn pairs(kvs: &[KeyValue], t: &mut Truncated) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut bytes = 0usize;
    for kv in kvs {
        if out.len() >= MAX_ATTRIBUTES || bytes >= MAX_ATTRIBUTE_BYTES {
            break;
        }
        let k = clip(&kv.key, MAX_KEY_BYTES, &mut t.keys);
        let v = value_text(kv.value.as_ref(), &mut t.values);
        bytes += k.len() + v.len();
        out.push((k, v));
    }
    let extra = kvs.len() - out.len();
    if extra > 0 {
        t.attributes += extra as u64;
        out.push((DROPPED_ATTRIBUTES.to_string(), extra.to_string()));
    }
    out
}

/// A copy of `s`, or of its first `max` bytes (at a character boundary) with the marker
/// `…[+N bytes]`, counted in `n`.
fn clip(s: &str, max: usize, n: &mut u64) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    *n += 1;
    format!("{}…[+{} bytes]", &s[..end], s.len() - end)
}

/// [`value_to_string`] without copying more than [`MAX_VALUE_BYTES`] of a long value.
fn value_text(v: Option<&AnyValue>, n: &mut u64) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => clip(s, MAX_VALUE_BYTES, n),
        Some(Value::BytesValue(b)) if b.len() > MAX_VALUE_BYTES / 2 => {
            *n += 1;
            format!(
                "{}…[+{} bytes]",
                hex::encode(&b[..MAX_VALUE_BYTES / 2]),
                2 * (b.len() - MAX_VALUE_BYTES / 2)
            )
        }
        _ => {
            let mut s = value_to_string(v);
            *n += u64::from(cut(&mut s, MAX_VALUE_BYTES));
            s
        }
    }
}

/// The first string value of the first of `names` among the raw attributes.
fn raw_find<'a>(kvs: &'a [KeyValue], names: &[&str]) -> Option<&'a str> {
    names.iter().find_map(|n| {
        kvs.iter().find(|kv| kv.key == *n).and_then(|kv| {
            match kv.value.as_ref()?.value.as_ref()? {
                Value::StringValue(s) => Some(s.as_str()),
                _ => None,
            }
        })
    })
}

/// A resource's attributes (within the per-item limits), its `service.name` (else `unknown`)
/// and its `host.name` (else `host`, else empty), within [`MAX_NAME_BYTES`]: what every item
/// under it inherits.
fn resource_context(
    resource: Option<&Resource>,
    t: &mut Truncated,
) -> (Vec<(String, String)>, String, String) {
    let kvs = resource.map_or(&[][..], |r| &r.attributes[..]);
    let attributes = resource
        .map(|r| pairs(&r.attributes, t))
        .unwrap_or_default();
    let service = clip(
        raw_find(kvs, &["service.name"]).unwrap_or("unknown"),
        MAX_NAME_BYTES,
        &mut t.names,
    );
    let host = clip(
        raw_find(kvs, &["host.name", "host"]).unwrap_or(""),
        MAX_NAME_BYTES,
        &mut t.names,
    );
    (attributes, service, host)
}

fn find<'a>(attrs: &'a [(String, String)], names: &[&str]) -> Option<&'a str> {
    names
        .iter()
        .find_map(|n| attrs.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str()))
}

/// 16-byte trace id → 32 hex digits; empty or wrong length → Err.
fn trace_hex(b: &[u8]) -> Result<String, String> {
    if b.len() == 16 && b.iter().any(|x| *x != 0) {
        Ok(hex::encode(b))
    } else {
        Err(format!(
            "trace id must be 16 non-zero bytes, got {}",
            b.len()
        ))
    }
}

fn span_hex(b: &[u8], what: &str) -> Result<String, String> {
    if b.len() == 8 && b.iter().any(|x| *x != 0) {
        Ok(hex::encode(b))
    } else {
        Err(format!("{what} must be 8 non-zero bytes, got {}", b.len()))
    }
}

fn ns_to_us(ns: u64) -> u64 {
    ns / 1000
}

/// Converts a trace export.
pub fn convert_traces(req: &ExportTraceServiceRequest) -> Converted {
    let mut out = Converted::default();
    let mut t = Truncated::default();
    for rs in &req.resource_spans {
        let (resource, service, host) = resource_context(rs.resource.as_ref(), &mut t);
        for ss in &rs.scope_spans {
            for s in &ss.spans {
                let trace_id = match trace_hex(&s.trace_id) {
                    Ok(t) => t,
                    Err(e) => {
                        out.reject(format!("span {:?}: {e}", s.name));
                        continue;
                    }
                };
                let span_id = match span_hex(&s.span_id, "span id") {
                    Ok(t) => t,
                    Err(e) => {
                        out.reject(format!("span {:?}: {e}", s.name));
                        continue;
                    }
                };
                let parent_span_id =
                    if s.parent_span_id.is_empty() || s.parent_span_id.iter().all(|b| *b == 0) {
                        String::new()
                    } else {
                        match span_hex(&s.parent_span_id, "parent span id") {
                            Ok(p) => p,
                            Err(e) => {
                                out.reject(format!("span {:?}: {e}", s.name));
                                continue;
                            }
                        }
                    };
                let mut attributes: Vec<(String, String)> = pairs(&s.attributes, &mut t);
                let name = clip(&s.name, MAX_NAME_BYTES, &mut t.names);
                let mut feature = find(&attributes, &["feature", attr::FEATURE])
                    .or_else(|| find(&resource, &["feature", attr::FEATURE]))
                    .unwrap_or("")
                    .to_string();
                t.names += u64::from(cut(&mut feature, MAX_NAME_BYTES));
                let criticality = find(&attributes, &["criticality", attr::CRITICALITY])
                    .or_else(|| find(&resource, &["criticality", attr::CRITICALITY]))
                    .and_then(Criticality::parse)
                    .unwrap_or_default()
                    .as_str()
                    .to_string();
                let start_us = ns_to_us(s.start_time_unix_nano);
                let duration_us =
                    ns_to_us(s.end_time_unix_nano.saturating_sub(s.start_time_unix_nano));
                let (status, status_message) = s
                    .status
                    .as_ref()
                    .map(|st| {
                        (
                            st.code.clamp(0, 2) as u8,
                            clip(&st.message, MAX_MESSAGE_BYTES, &mut t.messages),
                        )
                    })
                    .unwrap_or_default();
                let kind = s.kind.clamp(0, 5) as u8;
                if status == STATUS_ERROR {
                    let mut fattrs: Vec<(String, String)> = resource.clone();
                    fattrs.extend(attributes.iter().cloned());
                    if s.events.len() > MAX_EVENTS {
                        t.events += (s.events.len() - MAX_EVENTS) as u64;
                    }
                    for ev in s
                        .events
                        .iter()
                        .take(MAX_EVENTS)
                        .filter(|e| e.name == "exception")
                    {
                        fattrs.extend(pairs(&ev.attributes, &mut t));
                    }
                    fattrs.push(("trace_id".into(), trace_id.clone()));
                    fattrs.push(("span_id".into(), span_id.clone()));
                    fattrs.push(("span_name".into(), name.clone()));
                    fattrs.push((
                        "latency_ms".into(),
                        format!("{}", duration_us as f64 / 1000.0),
                    ));
                    let fallback = if status_message.is_empty() {
                        format!("span {name} failed")
                    } else {
                        status_message.clone()
                    };
                    let ts_ms = s.end_time_unix_nano.max(s.start_time_unix_nano) / 1_000_000;
                    let mut ev = FailureEvent::from_attributes(
                        ts_ms,
                        &fallback,
                        fattrs.iter().map(|(k, v)| (k.as_str(), v.clone())),
                    );
                    limit_event(&mut ev, &mut t);
                    out.failures.push(ev);
                }
                attributes.extend(resource.iter().cloned());
                out.spans.push(SpanRow {
                    trace_id,
                    span_id,
                    parent_span_id: parent_span_id.clone(),
                    service: service.clone(),
                    name,
                    kind,
                    start_us,
                    duration_us,
                    status,
                    status_message,
                    feature,
                    criticality,
                    host: host.clone(),
                    is_request: parent_span_id.is_empty() || kind == 2,
                    attributes,
                });
            }
        }
    }
    out.truncated = t;
    out
}

/// True when a record's severity is ERROR or worse.
pub fn is_error(severity_number: i32, severity_text: &str) -> bool {
    if severity_number > 0 {
        severity_number >= SEVERITY_ERROR
    } else {
        let t = severity_text.to_ascii_uppercase();
        t.starts_with("ERROR") || t.starts_with("FATAL") || t == "CRITICAL"
    }
}

/// Converts a logs export.
pub fn convert_logs(req: &ExportLogsServiceRequest, now_ms: u64) -> Converted {
    let mut out = Converted::default();
    let mut t = Truncated::default();
    for rl in &req.resource_logs {
        let (resource, service, host) = resource_context(rl.resource.as_ref(), &mut t);
        for sl in &rl.scope_logs {
            for r in &sl.log_records {
                // Ids are optional on logs; present ones must be well-formed.
                let trace_id = if r.trace_id.is_empty() {
                    String::new()
                } else {
                    match trace_hex(&r.trace_id) {
                        Ok(t) => t,
                        Err(e) => {
                            out.reject(format!("log record: {e}"));
                            continue;
                        }
                    }
                };
                let span_id = if r.span_id.is_empty() {
                    String::new()
                } else {
                    match span_hex(&r.span_id, "span id") {
                        Ok(t) => t,
                        Err(e) => {
                            out.reject(format!("log record: {e}"));
                            continue;
                        }
                    }
                };
                let ts_ns = if r.time_unix_nano > 0 {
                    r.time_unix_nano
                } else {
                    r.observed_time_unix_nano
                };
                let ts_us = if ts_ns > 0 {
                    ns_to_us(ts_ns)
                } else {
                    now_ms * 1000
                };
                let body = match r.body.as_ref().and_then(|b| b.value.as_ref()) {
                    Some(Value::StringValue(s)) => clip(s, MAX_MESSAGE_BYTES, &mut t.messages),
                    _ => {
                        let mut b = value_to_string(r.body.as_ref());
                        t.messages += u64::from(cut(&mut b, MAX_MESSAGE_BYTES));
                        b
                    }
                };
                let attributes: Vec<(String, String)> = pairs(&r.attributes, &mut t);
                if is_error(r.severity_number, &r.severity_text) {
                    let mut fattrs: Vec<(String, String)> = resource.clone();
                    fattrs.extend(attributes.iter().cloned());
                    if !trace_id.is_empty()
                        && find(&attributes, &["trace_id", "brownout.trace_id"]).is_none()
                    {
                        fattrs.push(("trace_id".into(), trace_id.clone()));
                    }
                    let mut ev = FailureEvent::from_attributes(
                        ts_us / 1000,
                        &body,
                        fattrs.iter().map(|(k, v)| (k.as_str(), v.clone())),
                    );
                    limit_event(&mut ev, &mut t);
                    out.failures.push(ev);
                }
                out.logs.push(LogRow {
                    ts_us,
                    trace_id,
                    span_id,
                    service: service.clone(),
                    host: host.clone(),
                    severity_number: r.severity_number.clamp(0, 255) as u8,
                    severity_text: clip(&r.severity_text, MAX_NAME_BYTES, &mut t.names),
                    body,
                    attributes,
                });
            }
        }
    }
    out.truncated = t;
    out
}

/// An OTLP export request, traces or logs, as both receivers (HTTP and gRPC) take it: what
/// bounds its decoded size, what it converts to, and its answer.
pub trait Export: prost::Message + Default + Send + 'static {
    /// Its `Export*ServiceResponse`.
    type Response: prost::Message + serde::Serialize + Send + 'static;
    /// Which pre-decode estimate bounds it ([`super::limits::protobuf_decoded_estimate`]).
    const SIGNAL: super::limits::Signal;
    /// Its rows ([`convert_traces`], [`convert_logs`]); `now_ms` is the receive time.
    fn convert(&self, now_ms: u64) -> Converted;
    /// The answer: `partial` is the number of refused items and the message of a
    /// `partial_success`, when there is one.
    fn response(partial: Option<(i64, String)>) -> Self::Response;
}

impl Export for ExportTraceServiceRequest {
    type Response = ExportTraceServiceResponse;
    const SIGNAL: super::limits::Signal = super::limits::Signal::Traces;

    fn convert(&self, _now_ms: u64) -> Converted {
        convert_traces(self)
    }

    fn response(partial: Option<(i64, String)>) -> ExportTraceServiceResponse {
        ExportTraceServiceResponse {
            partial_success: partial.map(|(rejected_spans, error_message)| {
                ExportTracePartialSuccess {
                    rejected_spans,
                    error_message,
                }
            }),
        }
    }
}

impl Export for ExportLogsServiceRequest {
    type Response = ExportLogsServiceResponse;
    const SIGNAL: super::limits::Signal = super::limits::Signal::Logs;

    fn convert(&self, now_ms: u64) -> Converted {
        convert_logs(self, now_ms)
    }

    fn response(partial: Option<(i64, String)>) -> ExportLogsServiceResponse {
        ExportLogsServiceResponse {
            partial_success: partial.map(|(rejected_log_records, error_message)| {
                ExportLogsPartialSuccess {
                    rejected_log_records,
                    error_message,
                }
            }),
        }
    }
}

/// Wraps a failure event for storage with a fresh id and a pattern.
pub fn failure_row(event: FailureEvent, pattern: String) -> FailureRow {
    FailureRow {
        id: uuid::Uuid::new_v4().simple().to_string(),
        pattern,
        event,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span};

    use super::*;

    /// A string attribute (also for the tests of [`super::super::limits`]).
    pub(crate) fn kv(k: &str, v: &str) -> KeyValue {
        KeyValue {
            key: k.into(),
            value: Some(AnyValue {
                value: Some(Value::StringValue(v.into())),
            }),
            ..Default::default()
        }
    }

    fn span(trace: Vec<u8>, id: Vec<u8>, parent: Vec<u8>, status: i32) -> Span {
        Span {
            trace_id: trace,
            span_id: id,
            parent_span_id: parent,
            name: "chat".into(),
            kind: 2,
            start_time_unix_nano: 1_764_460_800_000_000_000,
            end_time_unix_nano: 1_764_460_800_250_000_000,
            attributes: vec![
                kv("feature", "pdf_analysis"),
                kv("criticality", "sheddable"),
            ],
            status: Some(Status {
                code: status,
                message: if status == 2 {
                    "KV cache exhausted".into()
                } else {
                    String::new()
                },
            }),
            events: vec![span::Event {
                name: "exception".into(),
                attributes: vec![kv("exception.type", "OutOfBlocks")],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn traces(spans: Vec<Span>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", "muse"), kv("host.name", "gpu-1")],
                    ..Default::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn error_span_becomes_a_failure_with_its_trace_id() {
        let c = convert_traces(&traces(vec![
            span(vec![1; 16], vec![2; 8], vec![], 2),
            span(vec![1; 16], vec![3; 8], vec![2; 8], 1),
        ]));
        assert_eq!(c.rejected, 0);
        assert_eq!(c.spans.len(), 2);
        let s = &c.spans[0];
        assert_eq!(
            (
                s.service.as_str(),
                s.host.as_str(),
                s.feature.as_str(),
                s.criticality.as_str()
            ),
            ("muse", "gpu-1", "pdf_analysis", "sheddable")
        );
        assert_eq!(s.duration_us, 250_000);
        assert!(s.is_request);
        assert!(c.spans[1].is_request, "server spans count as requests");
        assert_eq!(c.failures.len(), 1);
        let f = &c.failures[0];
        assert_eq!(f.trace_id, hex::encode([1u8; 16]));
        assert_eq!(f.service, "muse");
        assert_eq!(f.error_type, "OutOfBlocks");
        assert_eq!(f.category, brownout_protocol::Category::KvCacheExhausted);
        assert_eq!(f.latency_ms, 250.0);
    }

    #[test]
    fn invalid_ids_are_rejected_for_partial_success() {
        let cases: [(Vec<u8>, Vec<u8>, Vec<u8>); 4] = [
            (vec![], vec![2; 8], vec![]),
            (vec![1; 15], vec![2; 8], vec![]),
            (vec![1; 16], vec![2; 7], vec![]),
            (vec![1; 16], vec![2; 8], vec![9; 3]),
        ];
        for (t, s, p) in cases {
            let c = convert_traces(&traces(vec![
                span(t.clone(), s.clone(), p.clone(), 0),
                span(vec![1; 16], vec![5; 8], vec![], 0),
            ]));
            assert_eq!((c.rejected, c.spans.len()), (1, 1), "{t:?} {s:?} {p:?}");
            assert!(c.first_error.is_some());
        }
    }

    #[test]
    fn error_logs_become_failures() {
        let rec = |sev: i32, text: &str, body: &str| LogRecord {
            time_unix_nano: 1_764_460_800_000_000_000,
            severity_number: sev,
            severity_text: text.into(),
            body: Some(AnyValue {
                value: Some(Value::StringValue(body.into())),
            }),
            attributes: vec![kv("feature", "image_generation")],
            trace_id: vec![7; 16],
            ..Default::default()
        };
        let req = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                resource: Some(Resource {
                    attributes: vec![kv("service.name", "muse")],
                    ..Default::default()
                }),
                scope_logs: vec![ScopeLogs {
                    log_records: vec![
                        rec(9, "INFO", "fine"),
                        rec(17, "ERROR", "tool call to weather API timed out"),
                        rec(0, "FATAL", "out of memory"),
                        rec(13, "WARN", "slow"),
                    ],
                    ..Default::default()
                }],
                ..Default::default()
            }],
        };
        let c = convert_logs(&req, 0);
        assert_eq!(c.logs.len(), 4);
        assert_eq!(c.failures.len(), 2);
        assert_eq!(c.failures[0].trace_id, hex::encode([7u8; 16]));
        assert_eq!(c.failures[0].feature, "image_generation");
        assert_eq!(c.failures[0].ts_ms, 1_764_460_800_000);
        assert_eq!(c.failures[0].message, "tool call to weather API timed out");
    }

    #[test]
    fn values_render_as_text() {
        let v = |x: Value| value_to_string(Some(&AnyValue { value: Some(x) }));
        assert_eq!(v(Value::IntValue(-3)), "-3");
        assert_eq!(v(Value::BoolValue(true)), "true");
        assert_eq!(v(Value::BytesValue(vec![0xab])), "ab");
        assert_eq!(value_to_string(None), "");
    }
}
