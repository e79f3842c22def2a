//! What the gate knows about a request: read from its headers and two body fields, every value
//! bounded and checked before it is used (a bad one is a 400 that names it, never a panic nor
//! an unbounded allocation).
//!
//! | source | field | bound |
//! |---|---|---|
//! | `x-brownout-criticality` | criticality | `critical`/`default`/`sheddable` or P0/P1/P2 |
//! | `x-brownout-feature` | feature | 128 bytes, visible ASCII |
//! | `x-brownout-user`, else the body's `user` | user | 256 bytes; header visible ASCII, body any Unicode but no control characters |
//! | `x-brownout-conversation` | conversation | 128 bytes, visible ASCII |
//! | `traceparent` | trace id | W3C form; an invalid header is ignored, as W3C says |
//! | `x-brownout-attempt` | attempt | 1 = a first try, 2.. = a retry (of the call, or of the user's whole flow); anything else is ignored (a first try) |
//! | body `tools[].function.name` | tools | 128 tools, names `[A-Za-z0-9_-]{1,64}` (OpenAI's rule) |

use axum::http::HeaderMap;
use brownout_protocol::Criticality;
use brownout_protocol::wire::header;

use super::users::MAX_USER_ID_BYTES;

pub const CRITICALITY_HEADER: &str = header::CRITICALITY;
pub const FEATURE_HEADER: &str = header::FEATURE;
pub const USER_HEADER: &str = header::USER;
pub const CONVERSATION_HEADER: &str = header::CONVERSATION;
pub const TRACEPARENT_HEADER: &str = "traceparent";
pub const ATTEMPT_HEADER: &str = header::ATTEMPT;

pub const MAX_FEATURE_BYTES: usize = 128;
pub const MAX_CONVERSATION_BYTES: usize = 128;
pub const MAX_TOOLS: usize = 128;
pub const MAX_TOOL_NAME_BYTES: usize = 64;

/// A request's metadata that the gate decides on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestMeta {
    pub criticality: Criticality,
    /// `x-brownout-feature` (empty when absent).
    pub feature: String,
    /// `x-brownout-user`, else the body's `user` (the header wins: a gateway that authenticated
    /// the caller sets it; the body field is whatever the client typed).
    pub user: Option<String>,
    pub conversation: Option<String>,
    /// The trace id of a valid `traceparent` (32 lowercase hex digits).
    pub trace_id: Option<String>,
    /// Function names of the request's `tools`.
    pub tools: Vec<String>,
    /// `x-brownout-attempt` above 1: the client says this request retries an earlier one
    /// (counted apart in `brownout_serving_arrivals_total`, so the control plane's demand
    /// signal can leave retries out).
    pub retry: bool,
}

/// Bad metadata: a 400 naming the header or field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct MetaError {
    /// `invalid_header` or `invalid_value`.
    pub code: &'static str,
    pub message: String,
    /// The body field, when it was one.
    pub param: Option<&'static str>,
}

fn header_err(message: String) -> MetaError {
    MetaError {
        code: "invalid_header",
        message,
        param: None,
    }
}

fn value_err(param: &'static str, message: String) -> MetaError {
    MetaError {
        code: "invalid_value",
        message,
        param: Some(param),
    }
}

/// A header as text: absent → `None`, not visible ASCII → error, blank → `None`.
fn header_text<'a>(h: &'a HeaderMap, name: &'static str) -> Result<Option<&'a str>, MetaError> {
    match h.get(name) {
        None => Ok(None),
        Some(v) => {
            let s = v
                .to_str()
                .map_err(|_| header_err(format!("header {name} must be visible ASCII")))?
                .trim();
            Ok((!s.is_empty()).then_some(s))
        }
    }
}

fn bounded<'a>(
    h: &'a HeaderMap,
    name: &'static str,
    max: usize,
) -> Result<Option<&'a str>, MetaError> {
    let v = header_text(h, name)?;
    if let Some(s) = v
        && s.len() > max
    {
        return Err(header_err(format!(
            "header {name} is longer than {max} bytes"
        )));
    }
    Ok(v)
}

/// The trace id of a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`), lowercased; `None` when
/// the header is not of that form or the id is all zeros.
pub fn parse_traceparent(v: &str) -> Option<String> {
    let mut it = v.trim().split('-');
    let (ver, trace, parent, flags) = (it.next()?, it.next()?, it.next()?, it.next()?);
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex(ver, 2) || ver.eq_ignore_ascii_case("ff") || !hex(trace, 32) || !hex(parent, 16) {
        return None;
    }
    if !hex(flags, 2) || (ver == "00" && it.next().is_some()) {
        return None;
    }
    let t = trace.to_ascii_lowercase();
    (t.bytes().any(|b| b != b'0')).then_some(t)
}

/// Checks a user id from the body: at most [`MAX_USER_ID_BYTES`], no control characters.
fn check_body_user(u: &str) -> Result<Option<String>, MetaError> {
    if u.is_empty() {
        return Ok(None);
    }
    if u.len() > MAX_USER_ID_BYTES {
        return Err(value_err(
            "user",
            format!("user must be at most {MAX_USER_ID_BYTES} bytes"),
        ));
    }
    if u.chars().any(char::is_control) {
        return Err(value_err(
            "user",
            "user must not contain control characters".into(),
        ));
    }
    Ok(Some(u.to_string()))
}

/// Checks an OpenAI function name: `[A-Za-z0-9_-]{1,64}`.
pub fn check_tool_name(n: &str) -> Result<(), MetaError> {
    let ok = !n.is_empty()
        && n.len() <= MAX_TOOL_NAME_BYTES
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        let shown: String = n.chars().take(40).flat_map(char::escape_default).collect();
        Err(value_err(
            "tools",
            format!(
                "tool function names must match [A-Za-z0-9_-]{{1,{MAX_TOOL_NAME_BYTES}}} (got \"{shown}\")"
            ),
        ))
    }
}

impl RequestMeta {
    /// Reads the headers.
    ///
    /// # Errors
    /// [`MetaError`] (`invalid_header`) for a non-ASCII, over-long or unknown value.
    pub fn from_headers(h: &HeaderMap) -> Result<RequestMeta, MetaError> {
        let criticality = match header_text(h, CRITICALITY_HEADER)? {
            None => Criticality::Default,
            Some(v) => Criticality::parse(v).ok_or_else(|| {
                header_err(format!(
                    "header {CRITICALITY_HEADER} must be critical, default or sheddable (got {:?})",
                    v.chars().take(40).collect::<String>()
                ))
            })?,
        };
        let feature = bounded(h, FEATURE_HEADER, MAX_FEATURE_BYTES)?
            .unwrap_or("")
            .to_string();
        let user = bounded(h, USER_HEADER, MAX_USER_ID_BYTES)?.map(str::to_string);
        let conversation =
            bounded(h, CONVERSATION_HEADER, MAX_CONVERSATION_BYTES)?.map(str::to_string);
        // A traceparent that is not valid W3C is ignored (W3C Trace Context §3.2.2.7).
        let trace_id = h
            .get(TRACEPARENT_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_traceparent);
        Ok(RequestMeta {
            criticality,
            feature,
            user,
            conversation,
            trace_id,
            tools: Vec::new(),
            // Advisory: a value that is not a positive integer counts as a first try.
            retry: h
                .get(ATTEMPT_HEADER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u32>().ok())
                .is_some_and(|n| n > 1),
        })
    }

    /// Adds the body's `user` (unless the header gave one) and tool names.
    ///
    /// # Errors
    /// [`MetaError`] (`invalid_value`) for a bad user id, more than [`MAX_TOOLS`] tools or a bad
    /// tool name.
    pub fn with_body<'a>(
        mut self,
        user: Option<&str>,
        tools: impl ExactSizeIterator<Item = &'a str>,
    ) -> Result<RequestMeta, MetaError> {
        if let Some(u) = user {
            let checked = check_body_user(u)?;
            if self.user.is_none() {
                self.user = checked;
            }
        }
        if tools.len() > MAX_TOOLS {
            return Err(value_err(
                "tools",
                format!("at most {MAX_TOOLS} tools (got {})", tools.len()),
            ));
        }
        for t in tools {
            check_tool_name(t)?;
            if !self.tools.iter().any(|x| x == t) {
                self.tools.push(t.to_string());
            }
        }
        Ok(self)
    }

    /// Agent traffic (the per-user cap applies): the request declares tools or carries a
    /// conversation id.
    pub fn is_agent(&self) -> bool {
        !self.tools.is_empty() || self.conversation.is_some()
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn traceparent_is_parsed_as_w3c_says() {
        let ok = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01";
        assert_eq!(
            parse_traceparent(ok).as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad:?}");
        }
        // A future version may append fields.
        assert!(
            parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz")
                .is_some()
        );
    }

    #[test]
    fn header_user_wins_and_hostile_values_are_refused_with_their_name() {
        let mut h = HeaderMap::new();
        h.insert(USER_HEADER, HeaderValue::from_static("gw-alice"));
        let m = RequestMeta::from_headers(&h)
            .unwrap()
            .with_body(Some("typed-bob"), std::iter::empty())
            .unwrap();
        assert_eq!(m.user.as_deref(), Some("gw-alice"));
        let m = RequestMeta::default()
            .with_body(Some("ünï\u{200b}cödé 👩‍💻"), std::iter::empty())
            .unwrap();
        assert_eq!(m.user.as_deref(), Some("ünï\u{200b}cödé 👩‍💻"));
        let e = RequestMeta::default()
            .with_body(Some("a\u{0}b"), std::iter::empty())
            .unwrap_err();
        assert_eq!((e.code, e.param), ("invalid_value", Some("user")));
        let e = RequestMeta::default()
            .with_body(Some(&"u".repeat(257)), std::iter::empty())
            .unwrap_err();
        assert!(e.message.contains("256"), "{e}");
        let mut h = HeaderMap::new();
        h.insert(
            CONVERSATION_HEADER,
            HeaderValue::from_str(&"c".repeat(129)).unwrap(),
        );
        assert_eq!(
            RequestMeta::from_headers(&h).unwrap_err().code,
            "invalid_header"
        );
        let mut h = HeaderMap::new();
        h.insert(USER_HEADER, HeaderValue::from_bytes(b"\xff\xfe").unwrap());
        assert!(RequestMeta::from_headers(&h).is_err());
    }

    #[test]
    fn the_attempt_header_marks_retries_and_anything_else_is_a_first_try() {
        let retry = |v: Option<&'static str>| {
            let mut h = HeaderMap::new();
            if let Some(v) = v {
                h.insert(ATTEMPT_HEADER, HeaderValue::from_static(v));
            }
            RequestMeta::from_headers(&h).unwrap().retry
        };
        assert!(!retry(None));
        assert!(!retry(Some("1")));
        assert!(retry(Some("2")));
        assert!(retry(Some(" 7 ")));
        for odd in ["0", "-3", "x", "1.5", "99999999999"] {
            assert!(!retry(Some(odd)), "{odd:?} is no retry");
        }
    }

    #[test]
    fn tool_names_follow_openai_and_are_bounded() {
        let m = RequestMeta::default()
            .with_body(None, ["web_search", "code-exec", "web_search"].into_iter())
            .unwrap();
        assert_eq!(m.tools, ["web_search", "code-exec"]);
        assert!(m.is_agent());
        for bad in ["", "a b", "tool:x", "<script>", "ñ", &"x".repeat(65)] {
            let e = RequestMeta::default()
                .with_body(None, [bad].into_iter())
                .unwrap_err();
            assert_eq!(e.param, Some("tools"), "{bad:?}");
            assert!(e.message.len() < 200, "bounded: {}", e.message);
        }
        let many: Vec<String> = (0..129).map(|i| format!("t{i}")).collect();
        assert!(
            RequestMeta::default()
                .with_body(None, many.iter().map(String::as_str))
                .is_err()
        );
    }
}
