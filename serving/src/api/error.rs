//! One error type for every HTTP failure, rendered as OpenAI's error JSON:
//! `{"error": {"message": …, "type": …, "param": …, "code": …}}`.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use brownout_protocol::wire;
use serde_json::json;

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    /// Stable machine-readable code.
    pub code: &'static str,
    pub message: String,
    pub param: Option<&'static str>,
    /// Seconds, for 429/503.
    pub retry_after_s: Option<u64>,
    /// Extra top-level fields inside `error` (e.g. `estimated_recovery_at`, `hint`).
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// A deliberate refusal's outcome, sent as the `x-brownout-outcome` header.
    pub outcome: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            param: None,
            retry_after_s: None,
            extra: serde_json::Map::new(),
            outcome: None,
        }
    }
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }
    pub fn param(mut self, p: &'static str) -> ApiError {
        self.param = Some(p);
        self
    }
    pub fn with(mut self, k: &str, v: serde_json::Value) -> ApiError {
        self.extra.insert(k.to_string(), v);
        self
    }

    /// OpenAI's `type` for a status.
    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            400 | 413 | 415 | 422 => "invalid_request_error",
            401 | 403 => "authentication_error",
            404 => "not_found_error",
            409 => "conflict_error",
            429 => "rate_limit_error",
            503 => "service_unavailable_error",
            _ => "server_error",
        }
    }

    pub fn body(&self) -> serde_json::Value {
        let mut e = serde_json::Map::new();
        e.insert("message".into(), json!(self.message));
        e.insert("type".into(), json!(self.kind()));
        e.insert("param".into(), json!(self.param));
        e.insert("code".into(), json!(self.code));
        for (k, v) in &self.extra {
            e.insert(k.clone(), v.clone());
        }
        json!({ "error": e })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after_s {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if let Some(o) = self.outcome {
            r.headers_mut()
                .insert(wire::header::OUTCOME, HeaderValue::from_static(o));
        }
        r
    }
}
