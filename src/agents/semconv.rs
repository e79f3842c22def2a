//! Which spans are tool calls, and what they say: the OpenTelemetry GenAI semantic conventions
//! first, brownout's own attribute names as fallbacks (docs/AGENTS.md has the table).
//!
//! Ingest renders every OTLP attribute value as text ([`crate::ingest::otlp::value_to_string`]:
//! strings as-is, numbers and booleans as written, bytes as hex, arrays and maps as JSON), so a
//! tool name or an argument list of any `AnyValue` type arrives here as a string.

use std::hash::{BuildHasher, Hash, Hasher};

use crate::store::{STATUS_ERROR, SpanRow};

/// The `gen_ai.operation.name` of a tool execution span.
pub const OP_EXECUTE_TOOL: &str = "execute_tool";

/// Tool names longer than this (in characters) are cut to it for breakers and display; the
/// loop fingerprint hashes the whole name.
pub const MAX_TOOL_NAME_CHARS: usize = 64;

/// Longest conversation id followed as such (the `abort` limit, docs/PROTOCOL.md); a longer
/// one falls back to the trace id.
pub const MAX_CONVERSATION_BYTES: usize = brownout_protocol::MAX_ABORT_ID_BYTES;

/// Arguments longer than this (bytes) are hashed as text, not parsed as JSON.
const MAX_JSON_ARGS_BYTES: usize = 64 * 1024;

/// Attribute names, most specific first.
pub const OPERATION: &[&str] = &["gen_ai.operation.name"];
pub const TOOL_NAME: &[&str] = &["gen_ai.tool.name", "brownout.tool.name", "brownout.tool"];
pub const TOOL_ARGS: &[&str] = &["gen_ai.tool.call.arguments", "brownout.tool.arguments"];
pub const CONVERSATION: &[&str] = &[
    "gen_ai.conversation.id",
    brownout_protocol::wire::attr::CONVERSATION,
    "brownout.conversation_id",
];
pub const TOOL_CLASS: &[&str] = &["brownout.tool.class"];
pub const USER: &[&str] = &["enduser.id", "brownout.user", "user_id"];
pub const ERROR_TYPE: &[&str] = &["error.type"];

/// One tool call read from a span.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The name for breakers and display: controls removed, cut to [`MAX_TOOL_NAME_CHARS`].
    pub tool: String,
    /// Hash of the whole tool name and the normalised arguments (one loop step).
    pub step: u64,
    pub trace_id: String,
    /// `gen_ai.conversation.id` (or a fallback), when present and at most
    /// [`MAX_CONVERSATION_BYTES`].
    pub conversation: Option<String>,
    pub service: String,
    pub user: String,
    /// The class the span declares (`brownout.tool.class`).
    pub class: Option<String>,
    pub duration_us: u64,
    /// Status ERROR, or an `error.type` attribute.
    pub failed: bool,
    pub error_type: String,
}

fn attr<'a>(s: &'a SpanRow, names: &[&str]) -> Option<&'a str> {
    names.iter().find_map(|n| {
        s.attributes
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.as_str())
    })
}

/// Removes control characters and surrounding blanks and cuts to [`MAX_TOOL_NAME_CHARS`].
pub fn clean_name(raw: &str) -> String {
    raw.chars()
        .filter(|c| !c.is_control())
        .collect::<String>()
        .trim()
        .chars()
        .take(MAX_TOOL_NAME_CHARS)
        .collect()
}

/// The tool call a span describes, if it is one: `gen_ai.operation.name = execute_tool`, or a
/// tool-name attribute, or a span named `execute_tool <name>`. `None` for other spans and for
/// tool calls whose name is empty once cleaned.
pub fn tool_call(s: &SpanRow, hasher: &impl BuildHasher) -> Option<ToolCall> {
    let op = attr(s, OPERATION);
    let named = attr(s, TOOL_NAME).filter(|n| !n.trim().is_empty());
    let from_span_name = s
        .name
        .strip_prefix(OP_EXECUTE_TOOL)
        .and_then(|r| r.strip_prefix(' '))
        .filter(|n| !n.trim().is_empty());
    if op.is_some_and(|o| o != OP_EXECUTE_TOOL) {
        // An inference or agent span that merely mentions a tool is not a tool call.
        return None;
    }
    let raw_name = named.or(from_span_name)?;
    let tool = clean_name(raw_name);
    if tool.is_empty() {
        return None;
    }
    let mut h = hasher.build_hasher();
    raw_name.hash(&mut h);
    hash_arguments(attr(s, TOOL_ARGS).unwrap_or(""), &mut h);
    let error_type = attr(s, ERROR_TYPE).unwrap_or("").to_string();
    Some(ToolCall {
        tool,
        step: h.finish(),
        trace_id: s.trace_id.clone(),
        conversation: attr(s, CONVERSATION)
            .filter(|c| !c.is_empty() && c.len() <= MAX_CONVERSATION_BYTES)
            .map(str::to_string),
        service: s.service.clone(),
        user: attr(s, USER).unwrap_or("").chars().take(256).collect(),
        class: attr(s, TOOL_CLASS).map(str::to_string),
        duration_us: s.duration_us,
        failed: s.status == STATUS_ERROR || !error_type.is_empty(),
        error_type,
    })
}

/// Hashes arguments after normalising them: JSON is hashed structurally (object keys in sorted
/// order, numbers by value, strings with blank runs collapsed), anything else as text with blank
/// runs collapsed. So `{"q": "rust", "n": 1}` and `{ "n":1.0,"q":"rust " }` are one step.
pub fn hash_arguments(args: &str, h: &mut impl Hasher) {
    let t = args.trim();
    if t.len() <= MAX_JSON_ARGS_BYTES
        && let Ok(v) = serde_json::from_str::<serde_json::Value>(t)
    {
        0u8.hash(h);
        hash_json(&v, h);
    } else {
        1u8.hash(h);
        hash_text(t, h);
    }
}

fn hash_text(s: &str, h: &mut impl Hasher) {
    for w in s.split_whitespace() {
        w.hash(h);
    }
}

fn hash_json(v: &serde_json::Value, h: &mut impl Hasher) {
    use serde_json::Value;
    match v {
        Value::Null => 0u8.hash(h),
        Value::Bool(b) => (1u8, *b).hash(h),
        Value::Number(n) => {
            2u8.hash(h);
            match n.as_f64() {
                // 1 and 1.0 are one value; -0.0 is 0.
                Some(f) => (if f == 0.0 { 0.0f64 } else { f }).to_bits().hash(h),
                None => n.to_string().hash(h),
            }
        }
        Value::String(s) => {
            3u8.hash(h);
            hash_text(s, h);
        }
        Value::Array(a) => {
            (4u8, a.len()).hash(h);
            for x in a {
                hash_json(x, h);
            }
        }
        Value::Object(m) => {
            (5u8, m.len()).hash(h);
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            for k in keys {
                k.hash(h);
                hash_json(&m[k], h);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::hash_map::RandomState;

    use super::*;

    pub(crate) fn span(attrs: &[(&str, &str)]) -> SpanRow {
        SpanRow {
            trace_id: "ab".repeat(16),
            span_id: "cd".repeat(8),
            parent_span_id: "ef".repeat(8),
            service: "orchestrator".into(),
            name: "execute_tool".into(),
            kind: 1,
            start_us: 0,
            duration_us: 1000,
            status: 0,
            status_message: String::new(),
            feature: String::new(),
            criticality: "default".into(),
            host: String::new(),
            is_request: false,
            attributes: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn arguments_are_normalised_before_hashing() {
        let s = RandomState::new();
        let h = |x: &str| {
            let mut a = s.build_hasher();
            hash_arguments(x, &mut a);
            a.finish()
        };
        assert_eq!(
            h(r#"{"q": "rust", "n": 1}"#),
            h(r#"{ "n":1.0,"q":" rust " }"#)
        );
        assert_eq!(h("  find   the  file "), h("find the file"));
        assert_ne!(h(r#"{"q": "rust"}"#), h(r#"{"q": "go"}"#));
        assert_ne!(h(r#"["a","b"]"#), h(r#"["b","a"]"#), "array order matters");
        assert_ne!(h("1"), h("\"1\""), "a number is not a string");
    }

    #[test]
    fn semconv_names_win_and_brownout_names_are_fallbacks() {
        let s = RandomState::new();
        let c = tool_call(
            &span(&[
                ("gen_ai.operation.name", "execute_tool"),
                ("gen_ai.tool.name", "web_search"),
                ("brownout.tool", "ignored"),
                ("gen_ai.conversation.id", "conv-1"),
                ("enduser.id", "u1"),
            ]),
            &s,
        )
        .unwrap();
        assert_eq!(
            (
                c.tool.as_str(),
                c.conversation.as_deref(),
                c.user.as_str(),
                c.failed
            ),
            ("web_search", Some("conv-1"), "u1", false)
        );
        let c = tool_call(
            &span(&[("brownout.tool", "lookup"), ("brownout.conversation", "c2")]),
            &s,
        )
        .unwrap();
        assert_eq!(
            (c.tool.as_str(), c.conversation.as_deref()),
            ("lookup", Some("c2"))
        );
        // The span name alone (`execute_tool <name>`), and error.type marks a failure.
        let mut sp = span(&[("error.type", "TimeoutError")]);
        sp.name = "execute_tool get_weather".into();
        let c = tool_call(&sp, &s).unwrap();
        assert_eq!((c.tool.as_str(), c.failed), ("get_weather", true));
        // Not tool calls: a chat span, a chat span mentioning a tool, an empty name.
        assert!(tool_call(&span(&[("gen_ai.operation.name", "chat")]), &s).is_none());
        assert!(
            tool_call(
                &span(&[("gen_ai.operation.name", "chat"), ("gen_ai.tool.name", "x")]),
                &s
            )
            .is_none()
        );
        assert!(tool_call(&span(&[("gen_ai.tool.name", " \u{7}\n ")]), &s).is_none());
        // A conversation id over the abort limit is not followed as one.
        let long = "c".repeat(MAX_CONVERSATION_BYTES + 1);
        let c = tool_call(
            &span(&[("gen_ai.tool.name", "t"), ("gen_ai.conversation.id", &long)]),
            &s,
        )
        .unwrap();
        assert_eq!(c.conversation, None);
    }

    #[test]
    fn hostile_names_are_bounded_and_cleaned_but_fingerprinted_whole() {
        let s = RandomState::new();
        let huge = "🔥\u{202e}".repeat(100_000);
        let a = tool_call(&span(&[("gen_ai.tool.name", &huge)]), &s).unwrap();
        assert_eq!(a.tool.chars().count(), MAX_TOOL_NAME_CHARS);
        let mut other = huge.clone();
        other.push('x');
        let b = tool_call(&span(&[("gen_ai.tool.name", &other)]), &s).unwrap();
        assert_eq!(a.tool, b.tool, "display names cut alike");
        assert_ne!(a.step, b.step, "the fingerprint sees the whole name");
        let c = tool_call(&span(&[("gen_ai.tool.name", "a\u{0}b\u{1b}[31mc")]), &s).unwrap();
        assert_eq!(c.tool, "ab[31mc");
    }
}
