//! The OpenAI-compatible HTTP API, `/metrics`, `/health`, `/debug/kv` and `/debug/resource`.
//! Every request passes the admission gate ([`crate::gate`]) first: the tier rules (T1 feature
//! grey-out, T2 route and caps, T3 shedding), the stop-bleed actions of this instance's
//! `instances` entry (drain, admission rate) and the agent guards (loop kill, tool breakers,
//! per-user cap; docs/ARCHITECTURE.md §3, docs/REQUIREMENTS.md R4, R5). The engine applies `max_num_seqs` (the instance entry's, else
//! `limits.max_num_seqs`) and the critical reserve.

pub mod drain;
pub mod error;
pub mod handlers;
pub mod listen;
pub mod openai;
pub mod server;
pub mod text;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

pub use error::ApiError;
pub use listen::ConnLimits;
pub use server::{ModelChoice, ServeOptions, build_state, run_server, run_server_with};

use crate::control::ControlHandle;
use crate::gate::{Gate, GateConfig};
use crate::metrics::Metrics;
use crate::scheduler::engine::EngineHandle;
use crate::telemetry::Telemetry;

/// Text ↔ tokens for the served model.
pub trait TextCodec: Send + Sync + 'static {
    fn encode(&self, text: &str) -> Vec<u32>;
    fn decode(&self, ids: &[u32]) -> String;
    /// Token ids of the model's chat template applied to `(role, content)` pairs, ending with
    /// the opening of the assistant turn. Special-token text inside messages must stay plain
    /// text (no prompt injection of `<|im_start|>system`).
    fn encode_chat(&self, messages: &[(String, String)]) -> Vec<u32>;
}

/// The real model's tokenizer and chat template.
pub struct ModelCodec(pub Arc<crate::model::LoadedModel>);

impl TextCodec for ModelCodec {
    fn encode(&self, text: &str) -> Vec<u32> {
        self.0.tokenizer().encode(text)
    }
    fn decode(&self, ids: &[u32]) -> String {
        self.0.tokenizer().decode(ids)
    }
    fn encode_chat(&self, messages: &[(String, String)]) -> Vec<u32> {
        let msgs: Vec<crate::model::ChatMessage> = messages
            .iter()
            .map(|(r, c)| crate::model::ChatMessage::new(r, c))
            .collect();
        self.0.encode_chat(&msgs)
    }
}

/// The toy model's byte codec (tests and `--model toy`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ToyCodec;

impl TextCodec for ToyCodec {
    fn encode(&self, text: &str) -> Vec<u32> {
        crate::scheduler::toy::toy_encode(text)
    }
    fn decode(&self, ids: &[u32]) -> String {
        crate::scheduler::toy::toy_decode(ids)
    }
    fn encode_chat(&self, messages: &[(String, String)]) -> Vec<u32> {
        let mut s = String::new();
        for (role, content) in messages {
            s.push_str(role);
            s.push_str(": ");
            s.push_str(content);
            s.push('\n');
        }
        s.push_str("assistant: ");
        crate::scheduler::toy::toy_encode(&s)
    }
}

/// Everything a handler needs; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub engine: EngineHandle,
    pub codec: Arc<dyn TextCodec>,
    pub control: ControlHandle,
    pub gate: Gate,
    pub metrics: Arc<Metrics>,
    pub model_name: String,
    pub ready: AtomicBool,
    pub max_body_bytes: usize,
    /// `max_tokens` when a completion request gives none (OpenAI's legacy default is 16).
    pub default_max_tokens_completion: usize,
    /// `max_tokens` when a chat request gives none (capped by the room left in the context).
    pub default_max_tokens_chat: usize,
    pub fallback_available: bool,
    pub telemetry: Telemetry,
    pub created_s: u64,
}

/// Options for [`AppState::new`] beyond the engine and codec.
#[derive(Debug, Clone)]
pub struct ApiOptions {
    pub model_name: String,
    pub max_body_bytes: usize,
    pub default_max_tokens_completion: usize,
    pub default_max_tokens_chat: usize,
    pub fallback_available: bool,
    /// The admission gate's settings (per-user cap, table size).
    pub gate: GateConfig,
}

impl Default for ApiOptions {
    fn default() -> ApiOptions {
        ApiOptions {
            model_name: "model".into(),
            max_body_bytes: 1 << 20,
            default_max_tokens_completion: 16,
            default_max_tokens_chat: 256,
            fallback_available: true,
            gate: GateConfig::default(),
        }
    }
}

impl AppState {
    pub fn new(
        engine: EngineHandle,
        codec: Arc<dyn TextCodec>,
        control: ControlHandle,
        metrics: Arc<Metrics>,
        telemetry: Telemetry,
        opts: ApiOptions,
    ) -> AppState {
        AppState {
            inner: Arc::new(Inner {
                engine,
                codec,
                gate: Gate::new(control.clone(), opts.gate),
                control,
                metrics,
                model_name: opts.model_name,
                ready: AtomicBool::new(false),
                max_body_bytes: opts.max_body_bytes,
                default_max_tokens_completion: opts.default_max_tokens_completion,
                default_max_tokens_chat: opts.default_max_tokens_chat,
                fallback_available: opts.fallback_available,
                telemetry,
                created_s: brownout_protocol::now_ms() / 1000,
            }),
        }
    }

    /// `/health` answers 200 only after this (the model is loaded and warmed up).
    pub fn set_ready(&self, ready: bool) {
        self.inner.ready.store(ready, Ordering::Relaxed);
    }
    pub fn engine(&self) -> &EngineHandle {
        &self.inner.engine
    }
    pub fn control(&self) -> &ControlHandle {
        &self.inner.control
    }
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }
    /// The admission gate in front of the engine.
    pub fn gate(&self) -> &Gate {
        &self.inner.gate
    }
    pub fn model_name(&self) -> &str {
        &self.inner.model_name
    }
}

/// The serving API. Merge other routers (e.g. the control plane's `/v1/features`) onto it.
pub fn router(state: AppState) -> Router {
    let limit = state.inner.max_body_bytes;
    Router::new()
        .route(
            "/v1/completions",
            post(handlers::endpoint::<openai::CompletionRequest>),
        )
        .route(
            "/v1/chat/completions",
            post(handlers::endpoint::<openai::ChatRequest>),
        )
        .route("/v1/models", get(handlers::models))
        .route("/health", get(handlers::health))
        .route("/metrics", get(handlers::metrics))
        .route("/debug/kv", get(handlers::debug_kv))
        .route("/debug/resource", get(handlers::debug_resource))
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}
