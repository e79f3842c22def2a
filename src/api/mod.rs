//! The query API (read token): traces, failures, hosts, ingest status. JSON, paginated.
//!
//! | route | answer |
//! |---|---|
//! | `GET /api/v1/traces/{trace_id}` | `{trace_id, spans: [...]}` (404 when unknown) |
//! | `GET /api/v1/failures?since=&until=&service=&category=&feature=&criticality=&pattern=&limit=&cursor=` | `{items, next_cursor}` newest first |
//! | `GET /api/v1/logs?since=&until=&service=&host=&instance=&severity=&q=&limit=&cursor=` | `{items, next_cursor}` OTLP log records newest first ([`crate::store::logs`]) |
//! | `GET /api/v1/hosts` | `{hosts: [{host, state, last_seen_ms, age_ms, snapshot}]}` |
//! | `GET /api/v1/ingest/status` | `{backend, store_up, spool_bytes}` |
//!
//! `since`/`until` take unix milliseconds or RFC 3339; defaults are the last hour.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use brownout_protocol::{Category, Criticality};
use serde::Deserialize;

use std::sync::Arc;

use tokio::sync::watch;

use crate::auth::{Guard, Role, Tokens};
use crate::error::{Path, Query};
use crate::ingest::WriterStatus;
use crate::ingest::hosts::HostRegistry;
use crate::store::{FailureCursor, FailureQuery, LogCursor, LogPage, LogQuery, Store};

/// What the query API reads.
#[derive(Clone)]
pub struct ApiDeps {
    pub store: Arc<dyn Store>,
    pub hosts: HostRegistry,
    /// The ingest writer's state, for `/api/v1/ingest/status`.
    pub writer_status: watch::Receiver<WriterStatus>,
}

pub use crate::error::ApiError;

/// `parse_time` with the query API's code.
fn time_param(field: &str, s: &str) -> Result<u64, ApiError> {
    crate::error::parse_time(field, s).map_err(|m| ApiError::bad_request("bad_parameter", m))
}

/// The query API's routes, guarded by the read token.
pub fn router(deps: ApiDeps, tokens: Arc<Tokens>) -> Router {
    let guard = Guard {
        role: Role::Read,
        tokens,
    };
    Router::new()
        .route("/api/v1/traces/{trace_id}", get(trace))
        .route("/api/v1/failures", get(failures))
        .route("/api/v1/logs", get(logs))
        .route("/api/v1/hosts", get(hosts))
        .route("/api/v1/ingest/status", get(ingest_status))
        .route_layer(axum::middleware::from_fn_with_state(
            guard,
            crate::auth::require,
        ))
        .with_state(deps)
}

async fn trace(
    State(state): State<ApiDeps>,
    Path(trace_id): Path<String>,
) -> Result<Response, ApiError> {
    if trace_id.len() != 32 || !trace_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::bad_request(
            "bad_parameter",
            "trace_id must be 32 hex digits",
        ));
    }
    let spans = state
        .store
        .trace(&trace_id.to_ascii_lowercase())
        .await
        .map_err(|e| ApiError::store(&e))?;
    if spans.is_empty() {
        return Err(ApiError::not_found(format!(
            "no spans for trace {trace_id}"
        )));
    }
    Ok(
        Json(serde_json::json!({"trace_id": trace_id.to_ascii_lowercase(), "spans": spans}))
            .into_response(),
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FailureParams {
    since: Option<String>,
    until: Option<String>,
    service: Option<String>,
    category: Option<String>,
    feature: Option<String>,
    criticality: Option<String>,
    pattern: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

/// Turns query parameters into a [`FailureQuery`] (shared with other components' pages).
///
/// # Errors
/// 400 naming the parameter.
fn failure_query(p: FailureParams, now_ms: u64) -> Result<FailureQuery, ApiError> {
    let since_ms = p
        .since
        .as_deref()
        .map(|s| time_param("since", s))
        .transpose()?
        .unwrap_or(now_ms.saturating_sub(3_600_000));
    let until_ms = p
        .until
        .as_deref()
        .map(|s| time_param("until", s))
        .transpose()?
        .unwrap_or(now_ms + 60_000);
    if until_ms <= since_ms {
        return Err(ApiError::bad_request(
            "bad_parameter",
            "until must be after since",
        ));
    }
    let limit = match p.limit.as_deref() {
        None => 100,
        Some(s) => match s.parse::<usize>() {
            Ok(n) if (1..=1000).contains(&n) => n,
            _ => {
                return Err(ApiError::bad_request(
                    "bad_parameter",
                    format!("limit={s:?} must be an integer from 1 to 1000"),
                ));
            }
        },
    };
    if let Some(c) = p.category.as_deref()
        && Category::parse(c).is_none()
    {
        let all: Vec<&str> = Category::ALL.iter().map(|c| c.as_str()).collect();
        return Err(ApiError::bad_request(
            "bad_parameter",
            format!("category={c:?} is not one of {}", all.join(", ")),
        ));
    }
    let criticality = match p.criticality.as_deref() {
        None => None,
        Some(c) => Some(
            Criticality::parse(c)
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "bad_parameter",
                        format!("criticality={c:?} is not critical, default or sheddable"),
                    )
                })?
                .as_str()
                .to_string(),
        ),
    };
    let cursor = match p.cursor.as_deref() {
        None | Some("") => None,
        Some(c) => Some(FailureCursor::decode(c).ok_or_else(|| {
            ApiError::bad_request("bad_parameter", "cursor is not one this server issued")
        })?),
    };
    let nonempty = |v: Option<String>| v.filter(|s| !s.is_empty());
    Ok(FailureQuery {
        since_ms,
        until_ms,
        service: nonempty(p.service),
        category: nonempty(p.category),
        feature: nonempty(p.feature),
        criticality,
        pattern: nonempty(p.pattern),
        limit,
        cursor,
        deliberate: None,
    })
}

async fn failures(
    State(state): State<ApiDeps>,
    Query(p): Query<FailureParams>,
) -> Result<Response, ApiError> {
    let q = failure_query(p, brownout_protocol::now_ms())?;
    bounded_json(state.store.failures(&q).await, bound_page)
}

/// A failures page holds at most about this many bytes of JSON; past it the page ends early
/// and `next_cursor` continues after its last row (rows are bounded at ingest, so this takes
/// many rows: docs/SECURITY.md).
pub const MAX_PAGE_BYTES: usize = 4 << 20;

/// A store page as the JSON answer, cut by `bound` to [`MAX_PAGE_BYTES`]; a store error is
/// the API's store error.
fn bounded_json<P: serde::Serialize>(
    page: Result<P, crate::store::StoreError>,
    bound: fn(&mut P, usize),
) -> Result<Response, ApiError> {
    let mut page = page.map_err(|e| ApiError::store(&e))?;
    bound(&mut page, MAX_PAGE_BYTES);
    Ok(Json(page).into_response())
}

/// How many of `items` fit in `max` bytes of JSON (one separator byte each); at least one.
fn fits_in<T: serde::Serialize>(items: &[T], max: usize) -> usize {
    let mut total = 0usize;
    for (i, row) in items.iter().enumerate() {
        total += serde_json::to_vec(row).map_or(0, |v| v.len() + 1);
        if total > max && i > 0 {
            return i;
        }
    }
    items.len()
}

/// Ends `page` early once its rows pass `max` bytes of JSON (always keeping one row).
fn bound_page(page: &mut crate::store::FailurePage, max: usize) {
    let keep = fits_in(&page.items, max);
    if keep < page.items.len() {
        page.items.truncate(keep);
        if let Some(last) = page.items.last() {
            page.next_cursor = Some(
                crate::store::FailureCursor {
                    ts_ms: last.event.ts_ms,
                    id: last.id.clone(),
                }
                .encode(),
            );
        }
    }
}

// ---- log search ---------------------------------------------------------------------------------

/// Query parameters of `GET /api/v1/logs` (and the UI's `/logs`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogParams {
    pub since: Option<String>,
    pub until: Option<String>,
    pub service: Option<String>,
    pub host: Option<String>,
    /// A drill-down instance (`host` or `host/engine`): its host's records (log records carry
    /// the host, not the engine).
    pub instance: Option<String>,
    /// Minimum severity: `trace`, `debug`, `info`, `warn`, `error`, `fatal` or 1–24.
    pub severity: Option<String>,
    /// Substring of the body (case-sensitive, at most [`crate::store::logs::LOG_TEXT_MAX`] bytes).
    pub q: Option<String>,
    pub limit: Option<String>,
    pub cursor: Option<String>,
}

/// Turns query parameters into a [`LogQuery`]; defaults: the last hour, 100 rows.
///
/// # Errors
/// 400 naming the parameter.
pub fn log_query(p: LogParams, now_ms: u64) -> Result<LogQuery, ApiError> {
    use crate::store::logs::{LOG_PAGE_MAX, LOG_TEXT_MAX, severity_floor};
    let bad = |m: String| ApiError::bad_request("bad_parameter", m);
    let nonempty = |v: Option<String>| v.filter(|s| !s.is_empty());
    let since_ms = nonempty(p.since)
        .map(|s| time_param("since", &s))
        .transpose()?
        .unwrap_or(now_ms.saturating_sub(3_600_000));
    let until_ms = nonempty(p.until)
        .map(|s| time_param("until", &s))
        .transpose()?
        .unwrap_or(now_ms + 60_000);
    if until_ms <= since_ms {
        return Err(bad("until must be after since".into()));
    }
    let limit = match nonempty(p.limit) {
        None => 100,
        Some(s) => match s.parse::<usize>() {
            Ok(n) if (1..=LOG_PAGE_MAX).contains(&n) => n,
            _ => {
                return Err(bad(format!(
                    "limit={s:?} must be an integer from 1 to {LOG_PAGE_MAX}"
                )));
            }
        },
    };
    let min_severity = match nonempty(p.severity) {
        None => 0,
        Some(s) => severity_floor(&s).ok_or_else(|| {
            bad(format!(
                "severity={s:?} is not trace, debug, info, warn, error, fatal or 1-24"
            ))
        })?,
    };
    let text = nonempty(p.q);
    if text.as_ref().is_some_and(|t| t.len() > LOG_TEXT_MAX) {
        return Err(bad(format!("q is longer than {LOG_TEXT_MAX} bytes")));
    }
    let mut host = nonempty(p.host);
    if let Some(inst) = nonempty(p.instance) {
        let h = inst.split('/').next().unwrap_or_default().to_string();
        if host.as_ref().is_some_and(|x| *x != h) {
            return Err(bad(format!(
                "instance={inst:?} is not on host={:?}",
                host.unwrap_or_default()
            )));
        }
        host = Some(h);
    }
    let cursor = match nonempty(p.cursor) {
        None => None,
        Some(c) => Some(
            LogCursor::decode(&c)
                .ok_or_else(|| bad("cursor is not one this server issued".into()))?,
        ),
    };
    Ok(LogQuery {
        since_ms,
        until_ms,
        service: nonempty(p.service),
        host,
        min_severity,
        text,
        limit,
        cursor,
    })
}

async fn logs(
    State(state): State<ApiDeps>,
    Query(p): Query<LogParams>,
) -> Result<Response, ApiError> {
    let q = log_query(p, brownout_protocol::now_ms())?;
    bounded_json(state.store.logs(&q).await, bound_log_page)
}

/// [`bound_page`] for log records: ends the page early past `max` bytes of JSON.
pub fn bound_log_page(page: &mut LogPage, max: usize) {
    let keep = fits_in(&page.items, max);
    if keep < page.items.len() {
        page.items.truncate(keep);
        page.next_cursor = page.items.last().map(|h| h.pos.encode());
    }
}

async fn hosts(State(state): State<ApiDeps>) -> Response {
    Json(serde_json::json!({"hosts": state.hosts.list(brownout_protocol::now_ms())}))
        .into_response()
}

async fn ingest_status(State(state): State<ApiDeps>) -> Response {
    let s = *state.writer_status.borrow();
    Json(serde_json::json!({"backend": state.store.backend(), "store_up": s.store_up, "spool_bytes": s.spool_bytes}))
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> FailureParams {
        let q: String = pairs.iter().map(|(k, v)| format!("{k}={v}&")).collect();
        serde_urlencoded_like(&q)
    }

    fn serde_urlencoded_like(q: &str) -> FailureParams {
        let uri: axum::http::Uri = format!("/x?{q}").parse().unwrap();
        axum::extract::Query::<FailureParams>::try_from_uri(&uri)
            .unwrap()
            .0
    }

    #[test]
    fn failure_params_validate() {
        let ok = failure_query(
            params(&[
                ("since", "1000"),
                ("until", "2000"),
                ("category", "model_error"),
                ("limit", "5"),
            ]),
            0,
        )
        .unwrap();
        assert_eq!((ok.since_ms, ok.until_ms, ok.limit), (1000, 2000, 5));
        let rfc = failure_query(
            params(&[("since", "2026-11-30T00:00:00Z")]),
            1_800_000_000_000,
        )
        .unwrap();
        assert_eq!(rfc.since_ms, 1_795_996_800_000);
        let bad = [
            (vec![("since", "yesterday")], "since"),
            (vec![("since", "2000"), ("until", "1000")], "until"),
            (vec![("limit", "0")], "limit"),
            (vec![("limit", "abc")], "limit"),
            (vec![("category", "martian")], "category"),
            (vec![("criticality", "urgent")], "criticality"),
            (vec![("cursor", "zz")], "cursor"),
        ];
        for (p, want) in bad {
            let e = failure_query(params(&p), 10_000_000).unwrap_err();
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
            assert!(e.message.contains(want), "{p:?}: {}", e.message);
        }
    }
}
