//! `GET /api/v1/patterns?since=&until=&limit=`: failure patterns ranked by budget impact (with
//! [`router_with_slo_bad`]: the share of the window's SLO-bad events each explains, read from
//! the stored SLI buckets; else the share of the window's failures).
//!
//! `since`/`until` are unix milliseconds or RFC 3339; `until` defaults to the newest event seen
//! (the engine has no clock), `since` to 24 h before `until`. Bad input is a 400 with a stable
//! `code` and a message naming the parameter. Auth and mounting are the caller's.

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::engine::Pattern;
pub use super::engine::SharedEngine;
use super::feed::SloBadSource;
use crate::error::{ApiError, Query, parse_time};

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

fn bad(message: String) -> ApiError {
    ApiError::bad_request("bad_request", message)
}

/// `parse_time` with this API's code.
fn time_param(name: &str, s: &str) -> Result<u64, ApiError> {
    parse_time(name, s).map_err(bad)
}

/// The patterns router (`GET /api/v1/patterns`), impact as the share of failures.
pub fn router(engine: SharedEngine) -> Router {
    Router::new()
        .route("/api/v1/patterns", get(list))
        .with_state((engine, None))
}

/// The patterns router ranking by real impact: each pattern's share of the window's SLO-bad
/// events, from the stored SLI buckets.
pub fn router_with_slo_bad(engine: SharedEngine, source: SloBadSource) -> Router {
    Router::new()
        .route("/api/v1/patterns", get(list))
        .with_state((engine, Some(source)))
}

type ApiState = (SharedEngine, Option<SloBadSource>);

async fn list(
    State((engine, source)): State<ApiState>,
    Query(q): Query<PatternsQuery>,
) -> Result<Json<PatternsResponse>, ApiError> {
    let until = q
        .until
        .as_deref()
        .map(|s| time_param("until", s))
        .transpose()?;
    let since = q
        .since
        .as_deref()
        .map(|s| time_param("since", s))
        .transpose()?;
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
    let newest = engine
        .lock()
        .map_err(|_| ApiError::internal("pattern engine unavailable", &"its lock is poisoned"))?
        .newest_ms();
    let until_ms = until.unwrap_or_else(|| newest.saturating_add(1));
    let since_ms = since.unwrap_or_else(|| until_ms.saturating_sub(86_400_000));
    if since_ms > until_ms {
        return Err(bad(format!(
            "`since` ({since_ms}) is after `until` ({until_ms})"
        )));
    }
    let bad_events = match &source {
        None => None,
        Some(src) => {
            crate::slo::persist::slo_bad_events(src.store.as_ref(), &src.slos, since_ms, until_ms)
                .await
                .map_err(|e| ApiError::store(&e))?
        }
    };
    let engine = engine
        .lock()
        .map_err(|_| ApiError::internal("pattern engine unavailable", &"its lock is poisoned"))?;
    let mut patterns = match &bad_events {
        Some(b) => engine.patterns_by_slo_impact(since_ms, until_ms, b),
        None => engine.patterns(since_ms, until_ms),
    };
    patterns.truncate(limit);
    Ok(Json(PatternsResponse {
        since_ms,
        until_ms,
        patterns,
    }))
}
