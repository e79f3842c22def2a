//! Failure events (docs/ARCHITECTURE.md §5): one JSON object per NDJSON line on
//! `POST /v1/failures`, or an OTLP log record / error span with the same attribute names.
//!
//! Parsing is strict about shape and lenient about content: unknown fields, a wrong type, an
//! unparseable `ts` or a NUL byte are errors that name the field; a missing or unknown
//! `category` is inferred from `error_type` and `message` ([`Category::infer`]).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

use crate::command::Criticality;

/// What kind of failure it was (docs/REQUIREMENTS.md R1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    TimeoutResource,
    TimeoutNetwork,
    ModelError,
    ToolUnavailable,
    KvCacheExhausted,
    SerializationError,
    StateConflict,
    RateLimited,
    Degraded,
    /// An agent going in circles: the control plane saw the same tool-call fingerprint repeat
    /// in one trace or conversation (docs/AGENTS.md). Only inferred from an explicit `category`.
    AgentLoop,
    Other,
}

impl Category {
    pub const ALL: [Category; 11] = [
        Category::TimeoutResource,
        Category::TimeoutNetwork,
        Category::ModelError,
        Category::ToolUnavailable,
        Category::KvCacheExhausted,
        Category::SerializationError,
        Category::StateConflict,
        Category::RateLimited,
        Category::Degraded,
        Category::AgentLoop,
        Category::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Category::TimeoutResource => "timeout_resource",
            Category::TimeoutNetwork => "timeout_network",
            Category::ModelError => "model_error",
            Category::ToolUnavailable => "tool_unavailable",
            Category::KvCacheExhausted => "kv_cache_exhausted",
            Category::SerializationError => "serialization_error",
            Category::StateConflict => "state_conflict",
            Category::RateLimited => "rate_limited",
            Category::Degraded => "degraded",
            Category::AgentLoop => "agent_loop",
            Category::Other => "other",
        }
    }

    pub fn parse(s: &str) -> Option<Category> {
        Category::ALL.into_iter().find(|c| c.as_str() == s)
    }

    /// Infers a category from an error type and message. Order matters: the most specific
    /// signal wins (a KV exhaustion that surfaces as a timeout is `kv_cache_exhausted`).
    pub fn infer(error_type: &str, message: &str) -> Category {
        let text = format!("{error_type} {message}").to_ascii_lowercase();
        let has = |needles: &[&str]| needles.iter().any(|n| text.contains(n));
        if has(&[
            "kv cache",
            "kv_cache",
            "kv-cache",
            "kvcache",
            "out of blocks",
            "no free blocks",
            "cache exhausted",
        ]) {
            Category::KvCacheExhausted
        } else if has(&[
            "servicedegraded",
            "degraded",
            "fallback_to_basic",
            "feature_disabled",
            "load shed",
            "shed_load",
        ]) {
            Category::Degraded
        } else if has(&[
            "rate limit",
            "rate_limit",
            "ratelimit",
            "429",
            "too many requests",
            "quota",
        ]) {
            if has(&["resource_quota", "gpu", "vram", "memory"]) {
                Category::TimeoutResource
            } else {
                Category::RateLimited
            }
        } else if has(&[
            "serializ",
            "deserializ",
            "json",
            "protobuf",
            "decode",
            "encode",
            "utf-8",
            "utf8",
            "parse error",
        ]) {
            Category::SerializationError
        } else if has(&[
            "deadlock",
            "conflict",
            "optimistic lock",
            "stale state",
            "version mismatch",
            "concurrent modification",
        ]) {
            Category::StateConflict
        } else if has(&[
            "tool",
            "api unavailable",
            "503",
            "connection refused",
            "circuit open",
            "unavailable",
        ]) && !has(&["gpu", "cuda", "out of memory"])
        {
            if has(&["timed out", "timeout", "deadline"])
                && has(&["network", "dns", "socket", "tcp", "connect"])
            {
                Category::TimeoutNetwork
            } else {
                Category::ToolUnavailable
            }
        } else if has(&["timed out", "timeout", "deadline exceeded"]) {
            if has(&[
                "network", "dns", "socket", "tcp", "connect", "upstream", "http",
            ]) {
                Category::TimeoutNetwork
            } else {
                Category::TimeoutResource
            }
        } else if has(&[
            "oomkill",
            "oom-kill",
            "oom kill",
            "out of memory",
            "cuda",
            "gpu",
            "resource_quota_exhausted",
            "resource exhausted",
        ]) {
            Category::TimeoutResource
        } else if has(&["model", "nan", "logits", "generation failed", "inference"]) {
            Category::ModelError
        } else {
            Category::Other
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failure, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureEvent {
    /// Unix milliseconds. On input: RFC 3339 text or unix ms.
    #[serde(rename = "ts", deserialize_with = "de_ts")]
    pub ts_ms: u64,
    pub service: String,
    #[serde(default)]
    pub host: String,
    #[serde(default)]
    pub request_id: String,
    #[serde(default)]
    pub trace_id: String,
    #[serde(default)]
    pub user_id: String,
    #[serde(default)]
    pub feature: String,
    #[serde(default)]
    pub criticality: Criticality,
    pub category: Category,
    #[serde(default)]
    pub error_type: String,
    pub message: String,
    #[serde(default)]
    pub latency_ms: f64,
    #[serde(default)]
    pub attributes: BTreeMap<String, String>,
}

/// The input shape: like [`FailureEvent`] but `category` and `criticality` are free text.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFailureEvent {
    #[serde(deserialize_with = "de_ts")]
    ts: u64,
    service: String,
    #[serde(default)]
    host: String,
    #[serde(default)]
    request_id: String,
    #[serde(default)]
    trace_id: String,
    #[serde(default)]
    user_id: String,
    #[serde(default)]
    feature: String,
    #[serde(default)]
    criticality: Option<String>,
    #[serde(default)]
    category: Option<String>,
    #[serde(default)]
    error_type: String,
    message: String,
    #[serde(default)]
    latency_ms: Option<f64>,
    #[serde(default)]
    attributes: BTreeMap<String, String>,
}

/// Why one failure line was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FailureParseError {
    #[error("line is not valid UTF-8 (at byte {0})")]
    InvalidUtf8(usize),
    #[error("line contains a NUL byte")]
    NulByte,
    #[error("{0}")]
    Json(String),
    #[error("field `{field}`: {reason}")]
    Field { field: &'static str, reason: String },
}

/// The latest accepted `ts`: 2106-02-07T06:28:15.999Z, the end of the unsigned 32-bit
/// seconds that ClickHouse's `DateTime` holds. Later values are refused, not saturated.
pub const MAX_TS_MS: u64 = u32::MAX as u64 * 1000 + 999;

/// Accepts RFC 3339 text or a non-negative integer of unix milliseconds, from 1970 to
/// [`MAX_TS_MS`]; says which bound a time outside them crosses.
fn de_ts<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Ts {
        Ms(u64),
        Negative(i64),
        Text(String),
    }
    let after = |what: String| {
        serde::de::Error::custom(format!(
            "ts {what} is after 2106-02-07T06:28:15Z (unix ms {MAX_TS_MS}), the latest time stored"
        ))
    };
    let before = |what: String| {
        serde::de::Error::custom(format!(
            "ts {what} is before 1970-01-01T00:00:00Z (unix ms 0), the earliest time stored"
        ))
    };
    match Ts::deserialize(d).map_err(|_| {
        serde::de::Error::custom("ts must be RFC 3339 text or unix milliseconds (an integer)")
    })? {
        Ts::Ms(ms) if ms > MAX_TS_MS => Err(after(ms.to_string())),
        Ts::Ms(ms) => Ok(ms),
        Ts::Negative(ms) => Err(before(ms.to_string())),
        Ts::Text(s) => {
            let t = chrono::DateTime::parse_from_rfc3339(&s)
                .map_err(|_| serde::de::Error::custom(format!("ts {s:?} is not RFC 3339")))?;
            let ms = t.timestamp_millis();
            match u64::try_from(ms) {
                Err(_) => Err(before(format!("{s:?}"))),
                Ok(ms) if ms > MAX_TS_MS => Err(after(format!("{s:?}"))),
                Ok(ms) => Ok(ms),
            }
        }
    }
}

/// The attribute that marks a failure event as a deliberate refusal (docs/PROTOCOL.md
/// "Deliberate outcomes"): `"true"` on every event the serving tier sends for a request it refused
/// on purpose.
pub const DELIBERATE_ATTR: &str = "deliberate";

impl FailureEvent {
    /// True when the event records a request refused on purpose (shed, feature disabled,
    /// drained, per-user cap, loop kill, tool breaker, throttled): attribute `deliberate` (or
    /// `brownout.deliberate`) is `"true"`. Such an event is a degradation outcome, not a failure:
    /// control planes count it neither as an SLO error nor as a failure pattern.
    pub fn is_deliberate(&self) -> bool {
        [DELIBERATE_ATTR, crate::wire::attr::DELIBERATE]
            .iter()
            .any(|k| self.attributes.get(*k).is_some_and(|v| v == "true"))
    }

    /// Parses one NDJSON line.
    ///
    /// # Errors
    /// A [`FailureParseError`] that says what was wrong: invalid UTF-8, a NUL byte, malformed
    /// JSON or an unknown field (with serde's line/column), or a bad field value.
    pub fn parse_line(line: &[u8]) -> Result<FailureEvent, FailureParseError> {
        let text = std::str::from_utf8(line)
            .map_err(|e| FailureParseError::InvalidUtf8(e.valid_up_to()))?;
        if text.contains('\0') {
            return Err(FailureParseError::NulByte);
        }
        let raw: RawFailureEvent =
            serde_json::from_str(text).map_err(|e| FailureParseError::Json(e.to_string()))?;
        FailureEvent::from_raw(raw)
    }

    fn from_raw(raw: RawFailureEvent) -> Result<FailureEvent, FailureParseError> {
        if raw.service.trim().is_empty() {
            return Err(FailureParseError::Field {
                field: "service",
                reason: "must not be empty".into(),
            });
        }
        let criticality = match raw.criticality.as_deref() {
            None | Some("") => Criticality::Default,
            Some(s) => Criticality::parse(s).ok_or_else(|| FailureParseError::Field {
                field: "criticality",
                reason: format!("{s:?} is not critical, default or sheddable"),
            })?,
        };
        let category = raw
            .category
            .as_deref()
            .and_then(Category::parse)
            .unwrap_or_else(|| Category::infer(&raw.error_type, &raw.message));
        let latency_ms = raw.latency_ms.unwrap_or(0.0);
        if !latency_ms.is_finite() || latency_ms < 0.0 {
            return Err(FailureParseError::Field {
                field: "latency_ms",
                reason: "must be a finite number ≥ 0".into(),
            });
        }
        Ok(FailureEvent {
            ts_ms: raw.ts,
            service: raw.service,
            host: raw.host,
            request_id: raw.request_id,
            trace_id: raw.trace_id,
            user_id: raw.user_id,
            feature: raw.feature,
            criticality,
            category,
            error_type: raw.error_type,
            message: raw.message,
            latency_ms,
            attributes: raw.attributes,
        })
    }

    /// Builds an event from name/value attributes, as found on an OTLP log record or span.
    /// Recognised names are the field names above (also with a `brownout.` prefix, and
    /// `service.name`, `host.name`, `exception.type`, `exception.message`); the rest are kept in
    /// `attributes`. `category` is inferred when absent.
    pub fn from_attributes<'a>(
        ts_ms: u64,
        fallback_message: &str,
        attrs: impl IntoIterator<Item = (&'a str, String)>,
    ) -> FailureEvent {
        let mut ev = FailureEvent {
            ts_ms,
            service: String::new(),
            host: String::new(),
            request_id: String::new(),
            trace_id: String::new(),
            user_id: String::new(),
            feature: String::new(),
            criticality: Criticality::Default,
            category: Category::Other,
            error_type: String::new(),
            message: fallback_message.to_string(),
            latency_ms: 0.0,
            attributes: BTreeMap::new(),
        };
        let mut category = None;
        for (k, v) in attrs {
            let key = k.strip_prefix("brownout.").unwrap_or(k);
            match key {
                "service" | "service.name" => ev.service = v,
                "host" | "host.name" => ev.host = v,
                "request_id" => ev.request_id = v,
                "trace_id" => ev.trace_id = v,
                "user_id" | "enduser.id" => ev.user_id = v,
                "feature" => ev.feature = v,
                "criticality" => ev.criticality = Criticality::parse(&v).unwrap_or_default(),
                "category" => category = Category::parse(&v),
                "error_type" | "exception.type" | "error.type" => ev.error_type = v,
                "message" | "exception.message" => ev.message = v,
                "latency_ms" => {
                    ev.latency_ms = v
                        .parse()
                        .ok()
                        .filter(|x: &f64| x.is_finite() && *x >= 0.0)
                        .unwrap_or(0.0)
                }
                _ => {
                    ev.attributes.insert(k.to_string(), v);
                }
            }
        }
        if ev.service.is_empty() {
            ev.service = "unknown".into();
        }
        ev.category = category.unwrap_or_else(|| Category::infer(&ev.error_type, &ev.message));
        ev
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(extra: &str) -> String {
        format!(r#"{{"ts":"2026-11-27T20:15:00Z","service":"muse-agent","message":"boom"{extra}}}"#)
    }

    #[test]
    fn full_event_parses() {
        let l = r#"{"ts":1764460800000,"service":"muse","host":"gpu-3","request_id":"r1","trace_id":"abc","user_id":"u9","feature":"pdf_analysis","criticality":"sheddable","category":"tool_unavailable","error_type":"AgentExecutionFailed","message":"tool call to weather API timed out after 8000 ms","latency_ms":8001.5,"attributes":{"tool":"weather"}}"#;
        let e = FailureEvent::parse_line(l.as_bytes()).unwrap();
        assert_eq!(e.ts_ms, 1_764_460_800_000);
        assert_eq!(e.criticality, Criticality::Sheddable);
        assert_eq!(e.category, Category::ToolUnavailable);
        assert_eq!(e.attributes["tool"], "weather");
    }

    #[test]
    fn rfc3339_ts_is_unix_ms() {
        let e = FailureEvent::parse_line(line("").as_bytes()).unwrap();
        assert_eq!(e.ts_ms, 1_795_810_500_000);
    }

    #[test]
    fn bad_lines_say_why() {
        let cases: &[(&[u8], &str)] = &[
            (
                b"{\"ts\":1,\"service\":\"a\",\"message\":\"x\",\"colour\":1}",
                "unknown field `colour`",
            ),
            (
                b"{\"ts\":\"yesterday\",\"service\":\"a\",\"message\":\"x\"}",
                "not RFC 3339",
            ),
            (b"{\"ts\":1,\"message\":\"x\"}", "missing field `service`"),
            (b"{\"ts\":1,\"service\":\"a\",\"message\":\"x\0\"}", "NUL"),
            (b"{\"ts\":1,\"service\":\"\",\"message\":\"x\"}", "service"),
            (
                b"{\"ts\":1,\"service\":\"a\",\"message\":\"x\",\"criticality\":\"urgent\"}",
                "urgent",
            ),
            (
                b"{\"ts\":1,\"service\":\"a\",\"message\":\"x\",\"latency_ms\":-3}",
                "latency_ms",
            ),
            (b"{\"ts\":1,", "EOF"),
            (
                b"{\"ts\":18446744073709551615,\"service\":\"a\",\"message\":\"x\"}",
                "is after 2106-02-07",
            ),
            (
                b"{\"ts\":\"0001-01-01T00:00:00Z\",\"service\":\"a\",\"message\":\"x\"}",
                "before 1970",
            ),
            (
                b"{\"ts\":-5,\"service\":\"a\",\"message\":\"x\"}",
                "before 1970",
            ),
            (
                b"{\"ts\":\"2200-01-01T00:00:00Z\",\"service\":\"a\",\"message\":\"x\"}",
                "is after 2106",
            ),
            (b"\xff\xfe", "UTF-8"),
        ];
        for (input, want) in cases {
            let err = FailureEvent::parse_line(input).unwrap_err().to_string();
            assert!(
                err.contains(want),
                "{:?}: got {err:?}, want {want:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    #[test]
    fn category_is_inferred_when_missing_or_unknown() {
        let table = [
            (
                "AgentExecutionFailed",
                "resource_quota_exhausted",
                Category::TimeoutResource,
            ),
            (
                "",
                "KV cache exhausted: no free blocks for seq 12",
                Category::KvCacheExhausted,
            ),
            (
                "ServiceDegradedError",
                "fallback_to_basic_mode",
                Category::Degraded,
            ),
            (
                "ToolError",
                "tool call to hotel API timed out after 5000 ms",
                Category::ToolUnavailable,
            ),
            (
                "",
                "upstream http request timed out",
                Category::TimeoutNetwork,
            ),
            (
                "",
                "failed to deserialize JSON payload",
                Category::SerializationError,
            ),
            (
                "",
                "deadlock detected while updating agent state",
                Category::StateConflict,
            ),
            ("", "429 Too Many Requests", Category::RateLimited),
            ("", "something odd", Category::Other),
        ];
        for (et, msg, want) in table {
            assert_eq!(Category::infer(et, msg), want, "{et} {msg}");
        }
        let e = FailureEvent::parse_line(line(r#","category":"martian","message2":1"#).as_bytes());
        assert!(e.is_err(), "unknown field still refused");
        let e = FailureEvent::parse_line(line(r#","category":"martian""#).as_bytes()).unwrap();
        assert_eq!(e.category, Category::Other);
        let e = FailureEvent::parse_line(line(r#","category":"agent_loop""#).as_bytes()).unwrap();
        assert_eq!(e.category, Category::AgentLoop);
        assert_eq!(Category::parse("agent_loop"), Some(Category::AgentLoop));
        for c in Category::ALL {
            assert_eq!(Category::parse(c.as_str()), Some(c));
        }
    }

    #[test]
    fn from_attributes_maps_names_and_keeps_the_rest() {
        let e = FailureEvent::from_attributes(
            5,
            "span failed",
            [
                ("service.name", "svc".to_string()),
                ("brownout.feature", "pdf".into()),
                ("exception.type", "Timeout".into()),
                ("k", "v".into()),
            ],
        );
        assert_eq!(
            (
                e.service.as_str(),
                e.feature.as_str(),
                e.error_type.as_str()
            ),
            ("svc", "pdf", "Timeout")
        );
        assert_eq!(e.attributes["k"], "v");
        assert_eq!(e.category, Category::TimeoutResource);
    }

    proptest::proptest! {
        #[test]
        fn parse_line_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let _ = FailureEvent::parse_line(&bytes);
        }
    }
}
