//! `GET /api/v1/patterns?since=&until=&limit=`: failure patterns ranked by budget impact.
//!
//! `since`/`until` are unix milliseconds or RFC 3339; `until` defaults to the newest event seen
//! (the engine has no clock), `since` to 24 h before `until`. Bad input is a 400 with a stable
//! `code` and a message naming the parameter. Auth and mounting are the caller's.

use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::engine::{Pattern, PatternEngine};

/// The engine as shared between ingest (observe) and the API (query).
pub type SharedEngine = Arc<Mutex<PatternEngine>>;

#[derive(Debug, Deserialize)]
struct PatternsQuery {
    since: Option<String>,
    until: Option<String>,
    limit: Option<String>,
}

/// The response body.
#[derive(Debug, Serialize, Deserialize)]
pub struct PatternsResponse {
    pub since_ms: u64,
    pub until_ms: u64,
    pub patterns: Vec<Pattern>,
}

/// An API error: a stable machine-readable code and a human message.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(serde_json::json!({"error": {"code": self.code, "message": self.message}})),
        )
            .into_response()
    }
}

fn bad(message: String) -> ApiError {
    ApiError {
        status: StatusCode::BAD_REQUEST,
        code: "bad_request",
        message,
    }
}

/// Parses unix milliseconds or RFC 3339.
pub fn parse_time(name: &str, s: &str) -> Result<u64, String> {
    if let Ok(ms) = s.parse::<u64>() {
        return Ok(ms);
    }
    chrono::DateTime::parse_from_rfc3339(s)
        .ok()
        .and_then(|t| u64::try_from(t.timestamp_millis()).ok())
        .ok_or_else(|| {
            format!("query parameter `{name}`: {s:?} is neither unix milliseconds nor RFC 3339")
        })
}

/// The patterns router (`GET /api/v1/patterns`).
pub fn router(engine: SharedEngine) -> Router {
    Router::new()
        .route("/api/v1/patterns", get(list))
        .with_state(engine)
}

async fn list(
    State(engine): State<SharedEngine>,
    Query(q): Query<PatternsQuery>,
) -> Result<Json<PatternsResponse>, ApiError> {
    let until = q
        .until
        .as_deref()
        .map(|s| parse_time("until", s))
        .transpose()
        .map_err(bad)?;
    let since = q
        .since
        .as_deref()
        .map(|s| parse_time("since", s))
        .transpose()
        .map_err(bad)?;
    let limit = match q.limit.as_deref() {
        None => 50,
        Some(s) => s
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=1000).contains(n))
            .ok_or_else(|| {
                bad(format!(
                    "query parameter `limit`: {s:?} is not a number in 1..=1000"
                ))
            })?,
    };
    let engine = engine.lock().map_err(|_| ApiError {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        code: "internal",
        message: "pattern engine unavailable".into(),
    })?;
    let until_ms = until.unwrap_or_else(|| engine.newest_ms().saturating_add(1));
    let since_ms = since.unwrap_or_else(|| until_ms.saturating_sub(86_400_000));
    if since_ms > until_ms {
        return Err(bad(format!(
            "`since` ({since_ms}) is after `until` ({until_ms})"
        )));
    }
    let mut patterns = engine.patterns(since_ms, until_ms);
    patterns.truncate(limit);
    Ok(Json(PatternsResponse {
        since_ms,
        until_ms,
        patterns,
    }))
}
