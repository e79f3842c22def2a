//! `brownout-serve`'s composition root: one start-up path for both modes.
//!
//! ```text
//!  ServeArgs ─▶ checks, instance id, control handle + command subscriber, telemetry
//!      ├─ engine mode:   api::build_state  (model, engine thread, warm-up) ─▶ api::router
//!      └─ --upstream:    upstream::build_proxy (probes, limiter)           ─▶ upstream::router
//!                 + /v1/features (control::http) ─▶ auth (--api-key) ─▶ drain (shutdown)
//!                 ─▶ net/ listener: --max-connections, --max-connections-per-ip,
//!                    --header-read-timeout-ms, --idle-timeout-ms, TCP_NODELAY
//!  SIGTERM / SIGINT ─▶ drain::Drain::run (503 instance_draining, /health draining, in-flight
//!                    work finishes up to --shutdown-grace-secs, the rest ended) ─▶ listener
//!                    closed ─▶ subscriber stopped, spans flushed ─▶ exit 0
//! ```
//!
//! The bench commands are in [`bench`]; `main.rs` only parses and dispatches.

pub mod auth;
pub mod bench;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use clap::Args;
use tokio::net::TcpListener;

use crate::api::{self, ConnLimits, ModelChoice, ServeOptions};
use crate::control::{self, ControlHandle, FeatureCatalog, SubscriberConfig};
use crate::gate::{GateConfig, RouteChoice};
use crate::kvcache::AllocMode;
use crate::scheduler::engine::EngineHandle;
use crate::telemetry::{Telemetry, TelemetryConfig};
// The drain and the listener path live in api/ (api/server.rs serves through them too); kept
// here under their old paths.
pub use crate::api::drain::{self, DRAIN_RETRY_AFTER_S, Drain, DrainReport, Phase};
pub use crate::api::listen::{serve, serve_tls};
pub use auth::ApiKeys;

/// The serve command's flags (`brownout-serve [FLAGS]`).
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// tiny-random, smollm2, toy, or a path to a GGUF file.
    #[arg(long, default_value = "tiny-random", env = "BROWNOUT_MODEL")]
    pub model: String,
    #[arg(long, default_value = "0.0.0.0")]
    pub host: String,
    #[arg(long, default_value_t = 8000, env = "BROWNOUT_SERVE_PORT")]
    pub port: u16,
    /// cpu, cuda or auto (a usable CUDA device for the primary route, else the CPU, saying why).
    #[arg(long, default_value = "auto")]
    pub device: String,
    #[arg(long, default_value_t = 2048)]
    pub num_blocks: usize,
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    #[arg(long, default_value_t = 32)]
    pub max_num_seqs: usize,
    #[arg(long, default_value_t = 512)]
    pub max_num_batched_tokens: usize,
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// paged or contiguous (the baseline).
    #[arg(long, default_value = "paged")]
    pub kv_mode: String,
    #[arg(long)]
    pub no_prefix_caching: bool,
    #[arg(long)]
    pub served_model_name: Option<String>,
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    /// Open connections held at most (about 17.6 KiB each, as many file descriptors); when
    /// full, the oldest one that has not sent a whole request head is closed to admit a new
    /// one, and only if there is none the new one gets 503 + Retry-After: 1.
    #[arg(long, default_value_t = brownout_net::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Open connections one client address holds at most (behind a proxy: raise it).
    #[arg(long, default_value_t = 256)]
    pub max_connections_per_ip: usize,
    /// An HTTP/1 request head (and an idle keep-alive connection) gets this long.
    #[arg(long, default_value_t = 10_000)]
    pub header_read_timeout_ms: u64,
    /// An HTTP/2 connection that moves no byte for this long is closed.
    #[arg(long, default_value_t = 60_000)]
    pub idle_timeout_ms: u64,
    /// TLS: the PEM certificate chain served (vLLM's flag); with `--ssl-keyfile`. Reloaded
    /// when the file changes.
    #[arg(long, value_name = "PEM", requires = "ssl_keyfile")]
    pub ssl_certfile: Option<std::path::PathBuf>,
    /// TLS: the PEM private key of `--ssl-certfile`.
    #[arg(long, value_name = "PEM", requires = "ssl_certfile")]
    pub ssl_keyfile: Option<std::path::PathBuf>,
    /// TLS: a PEM bundle of CAs; every client must then present a certificate signed by one of
    /// them (mutual TLS). Needs `--ssl-certfile`.
    #[arg(long, value_name = "PEM", requires = "ssl_certfile")]
    pub ssl_ca_certs: Option<std::path::PathBuf>,
    /// On SIGTERM or SIGINT, how long requests and streams in flight may take to finish (new
    /// ones get 503 instance_draining meanwhile); what is still open then is ended.
    #[arg(long, default_value_t = 30)]
    pub shutdown_grace_secs: u64,
    /// Clients must send `Authorization: Bearer KEY` with one of these (repeatable; the env
    /// variable takes a comma-separated list). /health and /metrics stay open.
    #[arg(
        long = "api-key",
        value_name = "KEY",
        env = "BROWNOUT_SERVE_API_KEY",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub api_keys: Vec<String>,
    /// With --api-key: /health and /metrics need the key too.
    #[arg(long)]
    pub api_key_all_routes: bool,
    #[arg(long, default_value_t = 60)]
    pub max_queue_wait_secs: u64,
    /// Redis for degradation commands (else REDIS_URL; none: runs at T0 unless commanded in-process).
    #[arg(long)]
    pub redis_url: Option<String>,
    #[arg(long)]
    pub cluster: Option<String>,
    /// The id commands address this instance by (`instances` keys) and its acks field
    /// (default `brownout-serve-<port>`; 1-128 visible ASCII characters).
    #[arg(long, env = "BROWNOUT_INSTANCE_ID")]
    pub instance_id: Option<String>,
    /// fcfs (arrival order only, no criticality anywhere: the plain-vLLM baseline) or priority.
    #[arg(long, default_value = "priority")]
    pub scheduling_policy: String,
    /// Share of sequence slots and KV blocks only critical requests may take, in [0, 1)
    /// (ignored under fcfs).
    #[arg(long, default_value_t = 0.2)]
    pub critical_reserve_ratio: f64,
    /// The critical step guard (priority only; 0: off): while a critical request runs or
    /// waits, an engine step takes non-critical tokens only up to this many tokens in all, so
    /// critical requests decode at the pace of a small batch on an engine whose step time grows
    /// with the batch (a CPU). Leave 0 on a GPU.
    #[arg(long, default_value_t = 0)]
    pub critical_step_tokens: usize,
    /// Simulated GPU pace for benchmarks: every engine step that runs the model takes at least
    /// this many milliseconds (the real model still runs; the engine thread then waits out the
    /// rest, as a GPU step would). 0: off. Labelled "simulated GPU pace" wherever it is used.
    #[arg(long, default_value_t = 0)]
    pub simulate_step_ms: u64,
    /// Most agent requests (tools or x-brownout-conversation) one user may have in flight
    /// (0: no cap); limits.user_concurrency of the command can only lower it.
    #[arg(long, default_value_t = 3)]
    pub user_concurrency: u32,
    /// Users the per-user table tracks (bounded LRU).
    #[arg(long, default_value_t = 16_384)]
    pub max_tracked_users: usize,
    /// Forward to this OpenAI-compatible server instead of running the bundled engine:
    /// `URL` or `ROUTE=URL` (route primary or fallback), repeatable (docs/UPSTREAM.md).
    #[arg(long = "upstream", value_name = "[ROUTE=]URL", value_parser = crate::upstream::parse_upstream_arg)]
    pub upstreams: Vec<(RouteChoice, String)>,
    /// The model name sent upstream on a route (`ROUTE=NAME`, repeatable); else the first
    /// model the route's upstream lists at /v1/models.
    #[arg(long = "upstream-model", value_name = "ROUTE=NAME", value_parser = crate::upstream::parse_model_arg)]
    pub upstream_models: Vec<(RouteChoice, String)>,
    /// Requests in flight to the upstreams at most (the critical reserve is a share of them;
    /// limits.max_num_seqs and the instance entry's max_num_seqs lower it).
    #[arg(long, default_value_t = 64)]
    pub upstream_max_concurrency: usize,
    #[arg(long, default_value_t = 2000)]
    pub upstream_connect_timeout_ms: u64,
    /// Longest silence while reading an upstream answer (streams included).
    #[arg(long, default_value_t = 60)]
    pub upstream_read_timeout_secs: u64,
    #[arg(long, default_value_t = 1000)]
    pub upstream_health_interval_ms: u64,
    /// Sent upstream as `Authorization: Bearer` in place of the client's (else the client's
    /// Authorization, the key it sent to --api-key included, is passed on as it is).
    #[arg(long, env = "BROWNOUT_UPSTREAM_API_KEY", hide_env_values = true)]
    pub upstream_api_key: Option<String>,
}

fn parse_mode(s: &str) -> anyhow::Result<AllocMode> {
    match s {
        "paged" => Ok(AllocMode::Paged),
        "contiguous" => Ok(AllocMode::Contiguous),
        other => anyhow::bail!("--kv-mode must be paged or contiguous (got {other:?})"),
    }
}

impl ServeArgs {
    fn gate(&self) -> GateConfig {
        GateConfig {
            user_concurrency: self.user_concurrency,
            max_tracked_users: self.max_tracked_users.max(1),
            ..GateConfig::default()
        }
    }

    fn limits(&self) -> ConnLimits {
        ConnLimits {
            max: self.max_connections.max(1),
            per_ip: self
                .max_connections_per_ip
                .clamp(1, self.max_connections.max(1)),
            header_read_timeout: Duration::from_millis(self.header_read_timeout_ms.max(1)),
            idle_timeout: Duration::from_millis(self.idle_timeout_ms.max(1)),
        }
    }

    /// The `--ssl-*` files, read (a clear error when they cannot be used).
    fn tls(&self) -> anyhow::Result<Option<Arc<api::listen::Tls>>> {
        let (Some(cert), Some(key)) = (&self.ssl_certfile, &self.ssl_keyfile) else {
            return Ok(None);
        };
        let t = api::listen::Tls::load(api::listen::TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: self.ssl_ca_certs.clone(),
        })
        .context("--ssl-certfile/--ssl-keyfile/--ssl-ca-certs")?;
        Ok(Some(t))
    }

    fn engine_options(&self) -> anyhow::Result<ServeOptions> {
        let model: ModelChoice = self.model.parse().map_err(|e: String| anyhow::anyhow!(e))?;
        Ok(ServeOptions {
            model,
            device: self.device.clone(),
            num_blocks: self.num_blocks,
            block_size: self.block_size,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            max_model_len: self.max_model_len,
            kv_mode: parse_mode(&self.kv_mode)?,
            enable_prefix_caching: !self.no_prefix_caching,
            served_model_name: self.served_model_name.clone(),
            max_body_bytes: self.max_body_bytes,
            max_queue_wait: Duration::from_secs(self.max_queue_wait_secs),
            scheduling_policy: self
                .scheduling_policy
                .parse()
                .map_err(|e: String| anyhow::anyhow!("--scheduling-policy: {e}"))?,
            critical_reserve_ratio: self.critical_reserve_ratio,
            critical_step_tokens: self.critical_step_tokens,
            simulate_step_ms: self.simulate_step_ms,
            gate: self.gate(),
        })
    }

    fn proxy_options(&self) -> crate::upstream::ProxyOptions {
        crate::upstream::ProxyOptions {
            upstreams: self.upstreams.clone(),
            models: self.upstream_models.clone(),
            served_model_name: self.served_model_name.clone(),
            max_concurrency: self.upstream_max_concurrency,
            critical_reserve_ratio: self.critical_reserve_ratio,
            max_queue_wait: Duration::from_secs(self.max_queue_wait_secs),
            connect_timeout: Duration::from_millis(self.upstream_connect_timeout_ms.max(1)),
            read_timeout: Duration::from_secs(self.upstream_read_timeout_secs.max(1)),
            health_interval: Duration::from_millis(self.upstream_health_interval_ms.max(10)),
            max_body_bytes: self.max_body_bytes,
            api_key: self.upstream_api_key.clone(),
            gate: self.gate(),
            ..crate::upstream::ProxyOptions::default()
        }
    }
}

/// What a mode built: its routes and, in engine mode, the engine (to report its KV at exit).
struct Built {
    router: Router,
    engine: Option<EngineHandle>,
}

async fn build_engine(
    a: &ServeArgs,
    handle: &ControlHandle,
    telemetry: &Telemetry,
    instance: &str,
) -> anyhow::Result<Built> {
    let opts = a.engine_options()?;
    let state = api::build_state(&opts, handle.clone(), telemetry.clone()).await?;
    let _ = handle.metrics().register(&state.metrics().registry);
    let catalog = FeatureCatalog::seed_default();
    state
        .metrics()
        .init_features(catalog.features().iter().map(|(f, _)| f.as_str()));
    // `auto` runs the primary route on CUDA exactly when the kernels load; a CUDA build on a
    // machine without a usable GPU says why here.
    let cuda = if a.device == "cpu" || opts.model == ModelChoice::Toy {
        "not used (--device cpu or --model toy)".to_string()
    } else {
        match crate::model::cuda_unavailable() {
            None => "in use for the primary route".to_string(),
            Some(why) => format!("unavailable, running on the CPU: {why}"),
        }
    };
    tracing::info!(
        model = state.model_name(), instance = %instance, device = %a.device, cuda = %cuda,
        scheduling_policy = %a.scheduling_policy, critical_reserve_ratio = a.critical_reserve_ratio,
        "engine ready"
    );
    let engine = state.engine().clone();
    Ok(Built {
        router: api::router(state).merge(control::http::router(handle.clone(), catalog)),
        engine: Some(engine),
    })
}

async fn build_upstream(
    a: &ServeArgs,
    handle: &ControlHandle,
    telemetry: &Telemetry,
    instance: &str,
) -> anyhow::Result<Built> {
    let state =
        crate::upstream::build_proxy(a.proxy_options(), handle.clone(), telemetry.clone()).await?;
    let _ = handle.metrics().register(&state.metrics().registry);
    tracing::info!(
        model = state.model_name(), instance = %instance,
        upstreams = ?a.upstreams, max_concurrency = a.upstream_max_concurrency,
        critical_reserve_ratio = a.critical_reserve_ratio, "proxy ready"
    );
    Ok(Built {
        router: crate::upstream::router(state).merge(control::http::router(
            handle.clone(),
            FeatureCatalog::seed_default(),
        )),
        engine: None,
    })
}

/// Runs `brownout-serve` (either mode) until `shutdown` resolves (SIGTERM or SIGINT from
/// `main`), then drains gracefully (module doc) and returns.
///
/// # Errors
/// Bad flags, a model or upstream that cannot start, a port that cannot be bound.
pub async fn run(
    a: ServeArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        (0.0..1.0).contains(&a.critical_reserve_ratio),
        "--critical-reserve-ratio must be in [0, 1) (got {})",
        a.critical_reserve_ratio
    );
    let keys = ApiKeys::new(&a.api_keys, a.api_key_all_routes).map_err(anyhow::Error::msg)?;
    let tls = a.tls()?;
    let addr: SocketAddr = format!("{}:{}", a.host, a.port)
        .parse()
        .context("--host/--port")?;
    let instance = a
        .instance_id
        .clone()
        .unwrap_or_else(|| format!("brownout-serve-{}", a.port));
    control::validate_instance_id(&instance)
        .map_err(|e| anyhow::anyhow!("--instance-id {instance:?}: {e}"))?;
    let sub = SubscriberConfig::from_env(a.redis_url.clone(), a.cluster.clone(), None, &instance)
        .context("degradation subscriber config")?;
    let cluster = sub.as_ref().map_or_else(
        || {
            a.cluster
                .clone()
                .or_else(brownout_protocol::cluster_from_env)
                .unwrap_or_else(|| brownout_protocol::DEFAULT_CLUSTER.into())
        },
        |s| s.cluster.clone(),
    );
    let handle = ControlHandle::with_instance(&cluster, &instance);
    let subscriber = match sub {
        Some(cfg) => Some(control::spawn_subscriber(handle.clone(), cfg).await),
        None => {
            tracing::info!("no REDIS_URL: degradation commands are not subscribed");
            None
        }
    };
    let telemetry = Telemetry::start(TelemetryConfig::from_env("brownout-serve"));
    let built = if a.upstreams.is_empty() {
        build_engine(&a, &handle, &telemetry, &instance).await?
    } else {
        build_upstream(&a, &handle, &telemetry, &instance).await?
    };
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    let drain = Drain::new(
        &instance,
        Duration::from_secs(a.shutdown_grace_secs),
        DRAIN_RETRY_AFTER_S,
    );
    tracing::info!(
        %addr, instance = %instance, api_keys = a.api_keys.len(),
        shutdown_grace_s = a.shutdown_grace_secs, "serving"
    );
    let report = serve_tls(
        auth::layer(built.router, keys),
        listener,
        a.limits(),
        tls,
        drain,
        shutdown,
    )
    .await
    .context("server")?;
    // The commands received until now are applied and acked (the subscriber ran through the
    // drain); stop it now that nothing is served any more.
    if let Some(s) = subscriber {
        s.abort();
    }
    let kv = match built.engine {
        Some(e) => engine_idle(&e).await,
        None => String::new(),
    };
    tracing::info!(
        in_flight_at_signal = report.in_flight_at_start,
        cancelled = report.cancelled,
        drained_ms = report.waited.as_millis() as u64,
        kv = %kv,
        "stopped"
    );
    // Flush buffered spans; the exporter may block, so off the async workers.
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    Ok(())
}

/// Waits (up to 3 s) for the engine to have let go of every sequence, and says what it holds.
async fn engine_idle(e: &EngineHandle) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let Some(kv) = e.debug_kv().await else {
            return "engine stopped".into();
        };
        let seqs = kv.running.len() + kv.waiting.len();
        if seqs == 0 || tokio::time::Instant::now() >= deadline {
            return format!(
                "sequences={seqs} kv_blocks_used={} of {}",
                kv.pool.num_blocks_used, kv.pool.num_blocks_total
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
