//! `GET /api/v1/slos` and `GET /api/v1/slos/{name}`: the latest report, as JSON. Reads the
//! published report only (no lock). Authentication is added by whoever mounts the router.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::task::SloHandle;

/// The SLO API routes, to be merged or nested into the control plane's router.
pub fn router(handle: SloHandle) -> axum::Router {
    axum::Router::new()
        .route("/api/v1/slos", get(list))
        .route("/api/v1/slos/{name}", get(one))
        .with_state(handle)
}

async fn list(State(h): State<SloHandle>) -> Response {
    Json(h.latest().as_ref().clone()).into_response()
}

async fn one(State(h): State<SloHandle>, Path(name): Path<String>) -> Response {
    let report = h.latest();
    match report.get(&name) {
        Some(s) => Json(s.clone()).into_response(),
        None => {
            let exists = report.slos.is_empty() && h.names().iter().any(|n| n == &name);
            let (status, code, message) = if exists {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "slo_not_evaluated",
                    "the SLO has not been evaluated yet",
                )
            } else {
                (
                    StatusCode::NOT_FOUND,
                    "slo_not_found",
                    "no SLO with that name",
                )
            };
            (
                status,
                Json(serde_json::json!({ "code": code, "message": message })),
            )
                .into_response()
        }
    }
}
