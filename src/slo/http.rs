//! `GET /api/v1/slos` and `GET /api/v1/slos/{name}`: the latest report, as JSON. Reads the
//! published report only (no lock). Authentication is added by whoever mounts the router.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::task::SloHandle;
use crate::error::{ApiError, Path};

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

async fn one(State(h): State<SloHandle>, Path(name): Path<String>) -> Result<Response, ApiError> {
    let report = h.latest();
    match report.get(&name) {
        Some(s) => Ok(Json(s.clone()).into_response()),
        None if report.slos.is_empty() && h.names().iter().any(|n| n == &name) => {
            Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "slo_not_evaluated",
                "the SLO has not been evaluated yet",
            ))
        }
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "slo_not_found",
            "no SLO with that name",
        )),
    }
}
