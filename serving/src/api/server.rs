//! Building an engine + API from options, and serving it until shutdown. This is the in-process
//! entry `brownout-demo` uses as well as `brownout-serve`.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use brownout_protocol::Criticality;
use tokio::net::TcpListener;

use super::listen::ConnLimits;
use super::{ApiOptions, AppState, ModelCodec, TextCodec, ToyCodec};
use crate::control::ControlHandle;
use crate::gate::GateConfig;
use crate::kvcache::{AllocMode, KvConfig};
use crate::metrics::Metrics;
use crate::model::{Device, LoadedModel, ModelRunner, Route, SeqChunk};
use crate::scheduler::engine::{EngineConfig, EngineRequest, ModelBackend, SeqEvent, spawn_engine};
use crate::scheduler::toy::{TOY_EOS, ToyModel};
use crate::scheduler::{SamplingParams, SchedulerConfig, SchedulingPolicy};
use crate::telemetry::Telemetry;

/// Which model to serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelChoice {
    /// The engine's deterministic paged toy (no weights; byte tokenizer).
    Toy,
    /// A tiny Llama with seeded random weights, through the real model code path.
    TinyRandom,
    /// SmolLM2-135M-Instruct from the local cache (`brownout-serve fetch-model`).
    SmolLm2,
    /// A GGUF file.
    Path(PathBuf),
}

impl std::str::FromStr for ModelChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "toy" => ModelChoice::Toy,
            "tiny-random" => ModelChoice::TinyRandom,
            "smollm2" => ModelChoice::SmolLm2,
            p => ModelChoice::Path(PathBuf::from(p)),
        })
    }
}

/// Everything needed to start one engine.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub model: ModelChoice,
    /// `cpu` or `cuda`.
    pub device: String,
    pub num_blocks: usize,
    pub block_size: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    /// Defaults to the model's.
    pub max_model_len: Option<usize>,
    pub kv_mode: AllocMode,
    pub enable_prefix_caching: bool,
    /// Served model name override (the `model` field clients send, `model_name` label).
    pub served_model_name: Option<String>,
    pub max_body_bytes: usize,
    pub max_queue_wait: Duration,
    /// `--scheduling-policy` (default `priority`; `fcfs` is the plain-vLLM baseline).
    pub scheduling_policy: SchedulingPolicy,
    /// `--critical-reserve-ratio` (default 0.2): share of sequence slots and KV blocks only
    /// critical requests may take (none under `fcfs`).
    pub critical_reserve_ratio: f64,
    /// `--critical-step-tokens` (default 0: off): the critical step guard
    /// ([`crate::scheduler::batch`]): while a critical request runs or waits, a step takes
    /// non-critical tokens only up to this many tokens in all.
    pub critical_step_tokens: usize,
    /// The admission gate (`--user-concurrency`, `--max-tracked-users`).
    pub gate: GateConfig,
    /// `--simulate-step-ms` (0: off): each engine step takes at least this long, a simulated
    /// GPU pace for small CPU models in benchmarks (see [`EngineConfig::simulate_step`]).
    pub simulate_step_ms: u64,
}

impl Default for ServeOptions {
    fn default() -> ServeOptions {
        ServeOptions {
            model: ModelChoice::TinyRandom,
            device: "cpu".into(),
            num_blocks: 1024,
            block_size: 16,
            max_num_seqs: 32,
            max_num_batched_tokens: 512,
            max_model_len: None,
            kv_mode: AllocMode::Paged,
            enable_prefix_caching: true,
            served_model_name: None,
            max_body_bytes: 1 << 20,
            max_queue_wait: Duration::from_secs(60),
            scheduling_policy: SchedulingPolicy::Priority,
            critical_reserve_ratio: 0.2,
            critical_step_tokens: 0,
            gate: GateConfig::default(),
            simulate_step_ms: 0,
        }
    }
}

/// The real model as the engine's backend; it owns the K/V memory.
pub struct LoadedBackend {
    /// The model plus its K/V blocks, on the CPU or (primary route) on a CUDA device.
    pub runner: ModelRunner,
}

impl ModelBackend for LoadedBackend {
    fn forward(&mut self, route: Route, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, String> {
        self.runner
            .forward(route, chunks)
            .map_err(|e| e.to_string())
    }
}

/// Loads the model, starts the engine thread, warms up, and returns the API state (ready).
///
/// # Errors
/// When the model cannot be loaded or the engine thread cannot start.
pub async fn build_state(
    opts: &ServeOptions,
    control: ControlHandle,
    telemetry: Telemetry,
) -> anyhow::Result<AppState> {
    let kv = KvConfig {
        num_blocks: opts.num_blocks,
        block_size: opts.block_size,
        mode: opts.kv_mode,
        enable_prefix_caching: opts.enable_prefix_caching,
    };
    anyhow::ensure!(
        opts.block_size > 0 && opts.num_blocks > 0,
        "--block-size and --num-blocks must be positive"
    );
    anyhow::ensure!(
        (0.0..1.0).contains(&opts.critical_reserve_ratio),
        "--critical-reserve-ratio must be in [0, 1) (got {})",
        opts.critical_reserve_ratio
    );
    let device: Device = opts
        .device
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))?;
    let loaded = match &opts.model {
        ModelChoice::Toy => None,
        other => {
            let spec = match other {
                ModelChoice::TinyRandom => "tiny-random".to_string(),
                ModelChoice::SmolLm2 => "smollm2".to_string(),
                ModelChoice::Path(p) => p.display().to_string(),
                ModelChoice::Toy => unreachable!("handled above"),
            };
            let model = tokio::task::spawn_blocking(move || -> anyhow::Result<LoadedModel> {
                LoadedModel::load(&spec, device).with_context(|| format!("loading model {spec}"))
            })
            .await
            .context("model loader thread")??;
            Some(Arc::new(model))
        }
    };
    let (name, max_len, eos, codec): (String, usize, Vec<u32>, Arc<dyn TextCodec>) = match &loaded {
        None => ("toy".to_string(), 2048, vec![TOY_EOS], Arc::new(ToyCodec)),
        Some(m) => {
            let c = m.config();
            (
                c.name.clone(),
                c.max_model_len,
                c.eos_token_ids.clone(),
                Arc::new(ModelCodec(m.clone())),
            )
        }
    };
    let name = opts.served_model_name.clone().unwrap_or(name);
    let max_model_len = opts.max_model_len.unwrap_or(max_len).min(max_len);
    let metrics = Arc::new(Metrics::with_max_model_len(&name, max_model_len));
    let cfg = EngineConfig {
        model_name: name.clone(),
        sched: SchedulerConfig {
            max_num_seqs: opts.max_num_seqs.max(1),
            max_num_batched_tokens: opts.max_num_batched_tokens.max(1),
            max_model_len,
            policy: opts.scheduling_policy,
            critical_reserve_ratio: opts.critical_reserve_ratio,
            critical_step_tokens: opts.critical_step_tokens,
        },
        kv,
        eos_token_ids: eos,
        max_queue_wait: opts.max_queue_wait,
        inbox_capacity: 4096,
        simulate_step: (opts.simulate_step_ms > 0)
            .then(|| Duration::from_millis(opts.simulate_step_ms)),
    };
    let engine = match &loaded {
        None => spawn_engine(
            cfg,
            ToyModel::new(opts.num_blocks, opts.block_size),
            metrics.clone(),
            Some(control.clone()),
        ),
        Some(m) => {
            let (m, blocks, bs) = (m.clone(), opts.num_blocks, opts.block_size);
            // Placed on its device, then the start-up health check runs there: both routes
            // generate from "Hello" before the engine (and so `/health`) can go ready.
            let runner = tokio::task::spawn_blocking(move || -> anyhow::Result<ModelRunner> {
                let mut runner = ModelRunner::with_device(m, blocks, bs, device)
                    .context("placing the model and its K/V blocks")?;
                runner.health_check().context("model health check")?;
                Ok(runner)
            })
            .await
            .context("model health check thread")??;
            tracing::info!(device = %runner.device_name(), cuda = runner.is_cuda(), "model runner ready");
            spawn_engine(
                cfg,
                LoadedBackend { runner },
                metrics.clone(),
                Some(control.clone()),
            )
        }
    }
    .context("starting the engine thread")?
    .0;
    let state = AppState::new(
        engine,
        codec,
        control,
        metrics,
        telemetry,
        ApiOptions {
            model_name: name,
            max_body_bytes: opts.max_body_bytes,
            fallback_available: true,
            gate: opts.gate.clone(),
            ..ApiOptions::default()
        },
    );
    warm_up(&state).await.context("warm-up generation")?;
    state.set_ready(true);
    Ok(state)
}

/// One short generation through the whole path, so `/health` turns ready only once it works.
async fn warm_up(state: &AppState) -> anyhow::Result<()> {
    let prompt = state.inner.codec.encode("warm up");
    let req = EngineRequest {
        prompt: if prompt.is_empty() { vec![0] } else { prompt },
        params: SamplingParams {
            max_tokens: 2,
            ..SamplingParams::default()
        },
        criticality: Criticality::Critical,
        route: Route::Primary,
    };
    let (_, mut rx) = state.engine().submit(req)?;
    while let Some(ev) = rx.recv().await {
        match ev {
            SeqEvent::Token(_) => {}
            SeqEvent::Finished { .. } => return Ok(()),
            SeqEvent::Failed { message, .. } => anyhow::bail!("{message}"),
        }
    }
    anyhow::bail!("the engine stopped during warm-up")
}

/// Serves `router(state)` (merged with `extra`, e.g. the control plane's `/v1/features`) on
/// `listener` until `shutdown` resolves, then drains (new generation requests 503
/// `instance_draining`, in-flight ones get 10 s; [`super::drain`]). The connection limits
/// are [`ConnLimits::default`].
///
/// # Errors
/// Socket errors from the server.
pub async fn run_server<F>(
    state: AppState,
    extra: Option<Router>,
    listener: TcpListener,
    shutdown: F,
) -> std::io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    run_server_with(state, extra, listener, ConnLimits::default(), shutdown).await
}

/// [`run_server`] with explicit connection limits (caps per listener and per client address,
/// header-read and idle timeouts: [`super::listen`]).
///
/// # Errors
/// Socket errors from the server.
pub async fn run_server_with<F>(
    state: AppState,
    extra: Option<Router>,
    listener: TcpListener,
    limits: ConnLimits,
    shutdown: F,
) -> std::io::Result<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let drain = super::drain::Drain::new(
        state.control().instance_id(),
        Duration::from_secs(10),
        super::drain::DRAIN_RETRY_AFTER_S,
    );
    let mut app = super::router(state);
    if let Some(extra) = extra {
        app = app.merge(extra);
    }
    super::listen::serve(app, listener, limits, drain, shutdown)
        .await
        .map(|_| ())
}
