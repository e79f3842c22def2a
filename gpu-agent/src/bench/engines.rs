//! Local fixture servers: engines answering `/metrics` (and `/debug/kv`) in vLLM's and the
//! bundled serving tier's exact formats (the samples in `gpu-agent/tests/fixtures/`), and a
//! snapshot sink standing in for the control plane. Used by `gpu-agent bench`, and compiled
//! into the dev-only `brownout-test-support` crate (`engines` module) for the tests, so there
//! is one copy.

#![allow(
    dead_code,
    reason = "the bench uses a part; the tests use the rest through brownout-test-support"
)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use brownout_protocol::AgentSnapshot;
use tokio::net::TcpListener;

/// vLLM v1 (0.8+) `/metrics`, as prometheus_client writes it.
pub const VLLM_V1_METRICS: &str = include_str!("../../tests/fixtures/vllm_v1_metrics.txt");
/// vLLM 0.6 (V0 engine) `/metrics`, with the deprecated `vllm:gpu_cache_usage_perc`.
pub const VLLM_0_6_METRICS: &str = include_str!("../../tests/fixtures/vllm_0_6_metrics.txt");
/// The bundled serving tier's `/metrics` (vLLM names plus `brownout_kv_*`, `brownout_serving_*`).
pub const BROWNOUT_SERVE_METRICS: &str =
    include_str!("../../tests/fixtures/brownout_serve_metrics.txt");
/// The bundled serving tier's `/debug/kv`.
pub const BROWNOUT_SERVE_DEBUG_KV: &str =
    include_str!("../../tests/fixtures/brownout_serve_debug_kv.json");

/// What one fixture engine serves; `metrics` can be swapped while it runs.
#[derive(Debug, Clone)]
pub struct EngineFixture {
    pub metrics: Arc<Mutex<String>>,
    /// `None`: `/debug/kv` answers 404 (a plain vLLM server).
    pub debug_kv: Option<String>,
    pub addr: SocketAddr,
}

impl EngineFixture {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    pub fn set_metrics(&self, body: &str) {
        *self
            .metrics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = body.to_string();
    }
}

/// Serves an engine fixture on an ephemeral loopback port until the runtime stops.
///
/// # Errors
/// The bind error.
pub async fn spawn_engine(metrics: &str, debug_kv: Option<&str>) -> std::io::Result<EngineFixture> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let fx = EngineFixture {
        metrics: Arc::new(Mutex::new(metrics.to_string())),
        debug_kv: debug_kv.map(str::to_string),
        addr,
    };
    let app = Router::new()
        .route(
            "/metrics",
            get(|State(fx): State<EngineFixture>| async move {
                let body = fx
                    .metrics
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone();
                (
                    [(
                        header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    body,
                )
            }),
        )
        .route(
            "/debug/kv",
            get(|State(fx): State<EngineFixture>| async move {
                match fx.debug_kv {
                    Some(b) => ([(header::CONTENT_TYPE, "application/json")], b).into_response(),
                    None => StatusCode::NOT_FOUND.into_response(),
                }
            }),
        )
        .with_state(fx.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(fx)
}

/// A stand-in for the control plane's `POST /v1/agents/snapshot`: checks the bearer token,
/// decodes the body as an [`AgentSnapshot`], and keeps what it received.
#[derive(Debug, Clone, Default)]
pub struct SnapshotSink {
    pub received: Arc<Mutex<Vec<AgentSnapshot>>>,
    pub token: Option<String>,
    /// Requests refused (bad token, bad body).
    pub refused: Arc<Mutex<u64>>,
}

impl SnapshotSink {
    pub fn new(token: Option<&str>) -> Self {
        Self {
            token: token.map(str::to_string),
            ..Default::default()
        }
    }

    pub fn received(&self) -> Vec<AgentSnapshot> {
        self.received
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/agents/snapshot", post(accept))
            .route("/count", get(count))
            .with_state(self.clone())
    }

    /// Serves on `listener` until `shutdown` completes.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown)
            .await
    }
}

async fn accept(State(sink): State<SnapshotSink>, headers: HeaderMap, body: Bytes) -> StatusCode {
    if let Some(t) = &sink.token {
        let want = format!("Bearer {t}");
        if headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            != Some(want.as_str())
        {
            *sink
                .refused
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) += 1;
            return StatusCode::UNAUTHORIZED;
        }
    }
    match serde_json::from_slice::<AgentSnapshot>(&body) {
        Ok(s) => {
            sink.received
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(s);
            StatusCode::ACCEPTED
        }
        Err(_) => {
            *sink
                .refused
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) += 1;
            StatusCode::BAD_REQUEST
        }
    }
}

async fn count(State(sink): State<SnapshotSink>) -> String {
    sink.received
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .len()
        .to_string()
}
