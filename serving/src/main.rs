//! `brownout-serve`: the bundled serving tier (paged KV, continuous batching, a real model,
//! OpenAI-compatible API on :8000, obeys degradation commands from Redis).
//!
//! ```text
//! brownout-serve [--model tiny-random|smollm2|toy|PATH] [--port 8000] [--device cpu|cuda] ...
//! brownout-serve bench kv        replay a long-tailed trace through paged and contiguous KV
//! brownout-serve bench model     decode tokens/s at batch 1/8/32 on each route, TTFT, memory
//! brownout-serve bench gate      per-user table memory under millions of distinct users
//! brownout-serve bench upstream  latency and CPU the --upstream proxy adds to an upstream
//! brownout-serve --upstream http://vllm:8000 [--upstream fallback=URL] [--upstream-model ROUTE=NAME]
//!                                the gate and commands in front of any OpenAI-compatible engine
//! brownout-serve fetch-model     download SmolLM2-135M-Instruct into the local model cache
//! ```

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context;
use brownout_serving::api::{self, ModelChoice, ServeOptions};
use brownout_serving::control::{self, ControlHandle, FeatureCatalog, SubscriberConfig};
use brownout_serving::gate::{GateConfig, RouteChoice};
use brownout_serving::kvcache::sim::{long_tailed_trace, replay};
use brownout_serving::kvcache::{AllocMode, BlockPool};
use brownout_serving::telemetry::{Telemetry, TelemetryConfig};
use clap::{Args, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "brownout-serve",
    version,
    about = "brownout's serving tier",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchWhat,
    },
    /// Fetches SmolLM2-135M-Instruct (GGUF) into the local model cache.
    FetchModel,
}

#[derive(Subcommand, Debug)]
enum BenchWhat {
    /// Replays one long-tailed trace through the paged and the contiguous allocator.
    Kv(BenchKvArgs),
    /// Decode tokens/s of each route at each batch size (interleaved rounds, medians, paired
    /// ratios), TTFT of a long prompt, resident memory; on the device `--device` picks.
    Model(BenchModelArgs),
    /// Memory of the admission gate's per-user table under millions of distinct users (resident
    /// set size at checkpoints), against an unbounded per-user map with `--peer`.
    Gate(BenchGateArgs),
    /// Latency (p50/p99) and CPU per 1,000 requests the `--upstream` proxy adds, against calling
    /// the upstream directly, in one run (it starts the upstream and the proxy itself).
    Upstream(BenchUpstreamArgs),
}

#[derive(Args, Debug)]
struct BenchUpstreamArgs {
    /// Requests per path (direct, proxied) and mode, sent alternately one at a time.
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    #[arg(long, default_value_t = 100)]
    warmup: usize,
    /// `--model` of the upstream brownout-serve this run starts.
    #[arg(long, default_value = "toy")]
    upstream_model: String,
    /// Use this running upstream instead (any OpenAI-compatible server).
    #[arg(long)]
    upstream_url: Option<String>,
    /// The running upstream's pid, to measure its CPU too.
    #[arg(long)]
    upstream_pid: Option<u32>,
    #[arg(long, default_value_t = 16)]
    max_tokens: u32,
    /// plain, stream (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "plain,stream")]
    modes: Vec<String>,
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct BenchGateArgs {
    /// Distinct users sent through (each one agent request, admitted and finished).
    #[arg(long, default_value_t = 2_000_000)]
    users: u64,
    /// Size of the bounded per-user table.
    #[arg(long, default_value_t = 16_384)]
    max_tracked_users: usize,
    /// Bytes of each user id (ids are padded with odd Unicode to this length).
    #[arg(long, default_value_t = 64)]
    id_bytes: usize,
    /// Run the naive peer instead: an unbounded map from user id to in-flight count.
    #[arg(long)]
    peer: bool,
}

#[derive(Args, Debug)]
struct BenchModelArgs {
    /// smollm2, tiny-random, or a path to a GGUF file.
    #[arg(long, default_value = "smollm2")]
    model: String,
    /// cpu, cuda or auto.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Timed decode steps per (route, batch size), split into 8 rounds.
    #[arg(long, default_value_t = 64)]
    steps: usize,
    /// Batch sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    batches: Vec<usize>,
    /// Routes, comma-separated: primary, fallback.
    #[arg(long, value_delimiter = ',', default_value = "primary,fallback")]
    routes: Vec<String>,
    /// Prompt length for the time-to-first-token figure (0: skip it).
    #[arg(long, default_value_t = 512)]
    ttft_prompt: usize,
    /// Seconds of the closed-loop capacity measurement per route pair, calls/s and flows/s as
    /// `brownout bench overload` calibrates them (0: skip it).
    #[arg(long, default_value_t = 30.0)]
    capacity_secs: f64,
    /// Print the report as JSON instead of a Markdown table.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct BenchKvArgs {
    #[arg(long, default_value_t = 2000)]
    requests: usize,
    #[arg(long, default_value_t = 4096)]
    num_blocks: usize,
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    #[arg(long, default_value_t = 8192)]
    max_model_len: usize,
    #[arg(long, default_value_t = 20)]
    min_len: usize,
    #[arg(long, default_value_t = 4000)]
    max_len: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Alloc+free operations for the pool microbenchmark.
    #[arg(long, default_value_t = 20_000_000)]
    pool_ops: u64,
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// tiny-random, smollm2, toy, or a path to a GGUF file.
    #[arg(long, default_value = "tiny-random", env = "BROWNOUT_MODEL")]
    model: String,
    #[arg(long, default_value = "0.0.0.0")]
    host: String,
    #[arg(long, default_value_t = 8000, env = "BROWNOUT_SERVE_PORT")]
    port: u16,
    /// cpu, cuda or auto.
    #[arg(long, default_value = "cpu")]
    device: String,
    #[arg(long, default_value_t = 2048)]
    num_blocks: usize,
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    #[arg(long, default_value_t = 32)]
    max_num_seqs: usize,
    #[arg(long, default_value_t = 512)]
    max_num_batched_tokens: usize,
    #[arg(long)]
    max_model_len: Option<usize>,
    /// paged or contiguous (the baseline).
    #[arg(long, default_value = "paged")]
    kv_mode: String,
    #[arg(long)]
    no_prefix_caching: bool,
    #[arg(long)]
    served_model_name: Option<String>,
    #[arg(long, default_value_t = 1 << 20)]
    max_body_bytes: usize,
    /// Open connections held at most; one more gets 503 + Retry-After: 1.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Open connections one client address holds at most (behind a proxy: raise it).
    #[arg(long, default_value_t = 256)]
    max_connections_per_ip: usize,
    /// An HTTP/1 request head (and an idle keep-alive connection) gets this long.
    #[arg(long, default_value_t = 10_000)]
    header_read_timeout_ms: u64,
    /// An HTTP/2 connection that moves no byte for this long is closed.
    #[arg(long, default_value_t = 60_000)]
    idle_timeout_ms: u64,
    #[arg(long, default_value_t = 60)]
    max_queue_wait_secs: u64,
    /// Redis for degradation commands (else REDIS_URL; none: runs at T0 unless commanded in-process).
    #[arg(long)]
    redis_url: Option<String>,
    #[arg(long)]
    cluster: Option<String>,
    /// The id commands address this instance by (`instances` keys) and its acks field
    /// (default `brownout-serve-<port>`; 1-128 visible ASCII characters).
    #[arg(long, env = "BROWNOUT_INSTANCE_ID")]
    instance_id: Option<String>,
    /// fcfs (arrival order only, no criticality anywhere: the plain-vLLM baseline) or priority.
    #[arg(long, default_value = "priority")]
    scheduling_policy: String,
    /// Share of sequence slots and KV blocks only critical requests may take, in [0, 1)
    /// (ignored under fcfs).
    #[arg(long, default_value_t = 0.2)]
    critical_reserve_ratio: f64,
    /// The critical step guard (priority only; 0: off): while a critical request runs or
    /// waits, an engine step takes non-critical tokens only up to this many tokens in all, so
    /// critical requests decode at the pace of a small batch on an engine whose step time grows
    /// with the batch (a CPU). Leave 0 on a GPU.
    #[arg(long, default_value_t = 0)]
    critical_step_tokens: usize,
    /// Simulated GPU pace for benchmarks: every engine step that runs the model takes at least
    /// this many milliseconds (the real model still runs; the engine thread then waits out the
    /// rest, as a GPU step would). 0: off. Labelled "simulated GPU pace" wherever it is used.
    #[arg(long, default_value_t = 0)]
    simulate_step_ms: u64,
    /// Most agent requests (tools or x-brownout-conversation) one user may have in flight
    /// (0: no cap); limits.user_concurrency of the command can only lower it.
    #[arg(long, default_value_t = 3)]
    user_concurrency: u32,
    /// Users the per-user table tracks (bounded LRU).
    #[arg(long, default_value_t = 16_384)]
    max_tracked_users: usize,
    /// Forward to this OpenAI-compatible server instead of running the bundled engine:
    /// `URL` or `ROUTE=URL` (route primary or fallback), repeatable (docs/UPSTREAM.md).
    #[arg(long = "upstream", value_name = "[ROUTE=]URL", value_parser = parse_upstream)]
    upstreams: Vec<(RouteChoice, String)>,
    /// The model name sent upstream on a route (`ROUTE=NAME`, repeatable); else the first
    /// model the route's upstream lists at /v1/models.
    #[arg(long = "upstream-model", value_name = "ROUTE=NAME", value_parser = parse_upstream_model)]
    upstream_models: Vec<(RouteChoice, String)>,
    /// Requests in flight to the upstreams at most (the critical reserve is a share of them;
    /// limits.max_num_seqs and the instance entry's max_num_seqs lower it).
    #[arg(long, default_value_t = 64)]
    upstream_max_concurrency: usize,
    #[arg(long, default_value_t = 2000)]
    upstream_connect_timeout_ms: u64,
    /// Longest silence while reading an upstream answer (streams included).
    #[arg(long, default_value_t = 60)]
    upstream_read_timeout_secs: u64,
    #[arg(long, default_value_t = 1000)]
    upstream_health_interval_ms: u64,
    /// Sent upstream as `Authorization: Bearer` (else the client's Authorization is passed on).
    #[arg(long, env = "BROWNOUT_UPSTREAM_API_KEY", hide_env_values = true)]
    upstream_api_key: Option<String>,
}

fn parse_upstream(s: &str) -> Result<(RouteChoice, String), String> {
    brownout_serving::upstream::parse_upstream_arg(s)
}

fn parse_upstream_model(s: &str) -> Result<(RouteChoice, String), String> {
    brownout_serving::upstream::parse_model_arg(s)
}

fn parse_mode(s: &str) -> anyhow::Result<AllocMode> {
    match s {
        "paged" => Ok(AllocMode::Paged),
        "contiguous" => Ok(AllocMode::Contiguous),
        other => anyhow::bail!("--kv-mode must be paged or contiguous (got {other:?})"),
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Some(Cmd::Bench {
            what: BenchWhat::Kv(a),
        }) => bench_kv(&a),
        Some(Cmd::Bench {
            what: BenchWhat::Model(a),
        }) => bench_model(&a),
        Some(Cmd::Bench {
            what: BenchWhat::Gate(a),
        }) => bench_gate(&a),
        Some(Cmd::Bench {
            what: BenchWhat::Upstream(a),
        }) => bench_upstream(&a),
        Some(Cmd::FetchModel) => {
            let path = brownout_serving::model::fetch_model()?;
            println!("{}", path.display());
            Ok(())
        }
        None => {
            // Logs to stderr, colour only on a terminal (as the control plane's logging::init).
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "info".into()),
                )
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_writer(std::io::stderr)
                .init();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("tokio runtime")?;
            rt.block_on(serve(cli.serve))
        }
    }
}

async fn serve(a: ServeArgs) -> anyhow::Result<()> {
    let model: ModelChoice = a.model.parse().map_err(|e: String| anyhow::anyhow!(e))?;
    let opts = ServeOptions {
        model,
        device: a.device.clone(),
        num_blocks: a.num_blocks,
        block_size: a.block_size,
        max_num_seqs: a.max_num_seqs,
        max_num_batched_tokens: a.max_num_batched_tokens,
        max_model_len: a.max_model_len,
        kv_mode: parse_mode(&a.kv_mode)?,
        enable_prefix_caching: !a.no_prefix_caching,
        served_model_name: a.served_model_name.clone(),
        max_body_bytes: a.max_body_bytes,
        max_queue_wait: Duration::from_secs(a.max_queue_wait_secs),
        scheduling_policy: a
            .scheduling_policy
            .parse()
            .map_err(|e: String| anyhow::anyhow!("--scheduling-policy: {e}"))?,
        critical_reserve_ratio: a.critical_reserve_ratio,
        critical_step_tokens: a.critical_step_tokens,
        simulate_step_ms: a.simulate_step_ms,
        gate: GateConfig {
            user_concurrency: a.user_concurrency,
            max_tracked_users: a.max_tracked_users.max(1),
            ..GateConfig::default()
        },
    };
    anyhow::ensure!(
        (0.0..1.0).contains(&a.critical_reserve_ratio),
        "--critical-reserve-ratio must be in [0, 1) (got {})",
        a.critical_reserve_ratio
    );
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
    let _subscriber = match sub {
        Some(cfg) => Some(control::spawn_subscriber(handle.clone(), cfg).await),
        None => {
            tracing::info!("no REDIS_URL: degradation commands are not subscribed");
            None
        }
    };
    let telemetry = Telemetry::start(TelemetryConfig::from_env("brownout-serve"));
    if !a.upstreams.is_empty() {
        return serve_upstream(a, handle, telemetry, instance).await;
    }
    let state = api::build_state(&opts, handle.clone(), telemetry.clone()).await?;
    let _ = handle.metrics().register(&state.metrics().registry);
    let addr: SocketAddr = format!("{}:{}", a.host, a.port)
        .parse()
        .context("--host/--port")?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    tracing::info!(
        %addr, model = state.model_name(), instance = %instance,
        scheduling_policy = %a.scheduling_policy, critical_reserve_ratio = a.critical_reserve_ratio,
        "serving"
    );
    let catalog = FeatureCatalog::seed_default();
    state
        .metrics()
        .init_features(catalog.features().iter().map(|(f, _)| f.as_str()));
    let features = control::http::router(handle, catalog);
    let limits = api::ConnLimits {
        max: a.max_connections.max(1),
        per_ip: a.max_connections_per_ip.clamp(1, a.max_connections.max(1)),
        header_read_timeout: Duration::from_millis(a.header_read_timeout_ms.max(1)),
        idle_timeout: Duration::from_millis(a.idle_timeout_ms.max(1)),
    };
    api::run_server_with(state, Some(features), listener, limits, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .context("server")?;
    // Flush buffered spans; the exporter may block, so off the async workers.
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    Ok(())
}

/// `--upstream`: the gate and the command subscriber in front of an OpenAI-compatible server.
async fn serve_upstream(
    a: ServeArgs,
    handle: ControlHandle,
    telemetry: Telemetry,
    instance: String,
) -> anyhow::Result<()> {
    use brownout_serving::upstream::{ProxyOptions, build_proxy, run_proxy};
    let opts = ProxyOptions {
        upstreams: a.upstreams.clone(),
        models: a.upstream_models.clone(),
        served_model_name: a.served_model_name.clone(),
        max_concurrency: a.upstream_max_concurrency,
        critical_reserve_ratio: a.critical_reserve_ratio,
        max_queue_wait: Duration::from_secs(a.max_queue_wait_secs),
        connect_timeout: Duration::from_millis(a.upstream_connect_timeout_ms.max(1)),
        read_timeout: Duration::from_secs(a.upstream_read_timeout_secs.max(1)),
        health_interval: Duration::from_millis(a.upstream_health_interval_ms.max(10)),
        max_body_bytes: a.max_body_bytes,
        api_key: a.upstream_api_key.clone(),
        gate: GateConfig {
            user_concurrency: a.user_concurrency,
            max_tracked_users: a.max_tracked_users.max(1),
            ..GateConfig::default()
        },
        ..ProxyOptions::default()
    };
    let state = build_proxy(opts, handle.clone(), telemetry.clone()).await?;
    let _ = handle.metrics().register(&state.metrics().registry);
    let addr: SocketAddr = format!("{}:{}", a.host, a.port)
        .parse()
        .context("--host/--port")?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding {addr}"))?;
    tracing::info!(
        %addr, model = state.model_name(), instance = %instance,
        upstreams = ?a.upstreams, max_concurrency = a.upstream_max_concurrency,
        critical_reserve_ratio = a.critical_reserve_ratio, "proxying"
    );
    let features = control::http::router(handle, FeatureCatalog::seed_default());
    run_proxy(state, Some(features), listener, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .context("server")?;
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    Ok(())
}

fn bench_upstream(a: &BenchUpstreamArgs) -> anyhow::Result<()> {
    use brownout_serving::upstream::bench::{BenchUpstreamSpec, bench_upstream, to_markdown};
    let spec = BenchUpstreamSpec {
        requests: a.requests,
        warmup: a.warmup,
        upstream_model: a.upstream_model.clone(),
        upstream_url: a.upstream_url.clone(),
        upstream_pid: a.upstream_pid,
        max_tokens: a.max_tokens,
        modes: a.modes.clone(),
    };
    // Two workers: the client of one request at a time needs no more.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let report = rt.block_on(bench_upstream(&spec, &mut |l| {
        eprintln!("[bench upstream] {l}")
    }))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", to_markdown(&report));
    }
    Ok(())
}

/// Resident set size of this process (KiB), from /proc/self/status.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn bench_gate(a: &BenchGateArgs) -> anyhow::Result<()> {
    use brownout_serving::gate::{Gate, RequestMeta};
    anyhow::ensure!(a.users > 0, "--users must be positive");
    anyhow::ensure!(
        (16..=256).contains(&a.id_bytes),
        "--id-bytes must be in 16..=256 (the gate refuses longer ids)"
    );
    let control = ControlHandle::with_instance("bench", "bench-0");
    let gate = Gate::new(
        control,
        GateConfig {
            max_tracked_users: a.max_tracked_users.max(1),
            ..GateConfig::default()
        },
    );
    let mut peer: std::collections::HashMap<String, u32> = std::collections::HashMap::new();
    let id = |i: u64| {
        let mut s = format!("user-{i}-");
        while s.len() + 4 <= a.id_bytes {
            s.push('𝕏');
        }
        while s.len() < a.id_bytes {
            s.push('_');
        }
        s
    };
    let what = if a.peer {
        "unbounded map (peer)"
    } else {
        "gate"
    };
    let rss0 = rss_kib();
    let mut max_rss = rss0;
    let step = (a.users / 10).max(1);
    let t = Instant::now();
    let mut meta = RequestMeta {
        conversation: Some("bench".into()),
        ..RequestMeta::default()
    };
    for i in 0..a.users {
        let u = id(i);
        if a.peer {
            *peer.entry(u).or_insert(0) += 1;
        } else {
            meta.user = Some(u);
            let admitted = gate
                .admit(&meta)
                .map_err(|r| anyhow::anyhow!("refused: {}", r.message))?;
            drop(admitted); // the request finished: its slot goes back
        }
        if (i + 1) % step == 0 {
            let r = rss_kib();
            max_rss = max_rss.max(r);
            eprintln!(
                "[bench gate] {what}: {} users, rss {} KiB (+{} KiB)",
                i + 1,
                r,
                r.saturating_sub(rss0)
            );
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let tracked = if a.peer {
        peer.len()
    } else {
        gate.debug()["user_concurrency"]["tracked_users"]
            .as_u64()
            .unwrap_or(0) as usize
    };
    let out = serde_json::json!({
        "table": if a.peer { "unbounded" } else { "gate" },
        "users": a.users,
        "id_bytes": a.id_bytes,
        "max_tracked_users": a.max_tracked_users,
        "tracked_users": tracked,
        "rss_start_kib": rss0,
        "rss_end_kib": rss_kib(),
        "rss_max_kib": max_rss,
        "rss_growth_kib": max_rss.saturating_sub(rss0),
        "ns_per_request": secs * 1e9 / a.users as f64,
    });
    println!("{out}");
    Ok(())
}

fn bench_model(a: &BenchModelArgs) -> anyhow::Result<()> {
    use brownout_serving::model::{BenchSpec, Route, bench_spec};
    let routes = a
        .routes
        .iter()
        .map(|r| match r.as_str() {
            "primary" => Ok(Route::Primary),
            "fallback" => Ok(Route::Fallback),
            other => anyhow::bail!("--routes takes primary and fallback (got {other:?})"),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let spec = BenchSpec {
        model: a.model.clone(),
        device: a.device.parse().map_err(|e: String| anyhow::anyhow!(e))?,
        routes,
        batches: a.batches.clone(),
        decode_steps: a.steps,
        ttft_prompt_len: a.ttft_prompt,
        capacity_secs: a.capacity_secs,
    };
    let report = bench_spec(&spec, &mut |line| eprintln!("[bench model] {line}"))
        .with_context(|| format!("benchmarking model {}", a.model))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", report.to_markdown());
    }
    Ok(())
}

fn bench_kv(a: &BenchKvArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        a.block_size > 0 && a.num_blocks > 0,
        "--block-size and --num-blocks must be positive"
    );
    let trace = long_tailed_trace(a.requests, a.min_len, a.max_len, a.seed);
    let t0 = Instant::now();
    let paged = replay(
        &trace,
        AllocMode::Paged,
        a.num_blocks,
        a.block_size,
        a.max_model_len,
    );
    let paged_s = t0.elapsed().as_secs_f64();
    let contiguous = replay(
        &trace,
        AllocMode::Contiguous,
        a.num_blocks,
        a.block_size,
        a.max_model_len,
    );

    // Pool microbenchmark: single-block allocate + free, the hot path of decode.
    let mut pool = BlockPool::new(a.num_blocks, a.block_size);
    let mut held = Vec::with_capacity(1);
    let pairs = a.pool_ops / 2;
    let t = Instant::now();
    for _ in 0..pairs {
        pool.allocate_into(1, &mut held)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        pool.free(held.drain(..));
    }
    let ops_per_sec = (pairs * 2) as f64 / t.elapsed().as_secs_f64();
    // Batched: 16 blocks per allocation (a prefill chunk).
    let batch_pairs = pairs / 16;
    let t = Instant::now();
    for _ in 0..batch_pairs {
        pool.allocate_into(16, &mut held)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        pool.free(held.drain(..));
    }
    let block_ops_per_sec = (batch_pairs * 32) as f64 / t.elapsed().as_secs_f64();

    let mean_prompt =
        trace.iter().map(|r| r.prompt_len).sum::<usize>() as f64 / trace.len().max(1) as f64;
    let mean_output =
        trace.iter().map(|r| r.output_len).sum::<usize>() as f64 / trace.len().max(1) as f64;
    let out = serde_json::json!({
        "requests": a.requests,
        "num_blocks": a.num_blocks,
        "block_size": a.block_size,
        "trace": {"min_len": a.min_len, "max_len": a.max_len, "seed": a.seed,
                  "mean_prompt_tokens": mean_prompt, "mean_output_tokens": mean_output},
        "paged_token_occupancy": paged.token_occupancy,
        "contiguous_token_occupancy": contiguous.token_occupancy,
        "paged_max_concurrent": paged.max_concurrent,
        "contiguous_max_concurrent": contiguous.max_concurrent,
        "paged_mean_concurrent": paged.mean_concurrent,
        "contiguous_mean_concurrent": contiguous.mean_concurrent,
        "paged_steps": paged.steps,
        "contiguous_steps": contiguous.steps,
        "paged_preemptions": paged.preemptions,
        "contiguous_mean_external_fragmentation": contiguous.mean_external_fragmentation,
        "paged_mean_usage": paged.mean_usage,
        "contiguous_mean_usage": contiguous.mean_usage,
        "skipped_never_fit": paged.skipped,
        "paged_replay_seconds": paged_s,
        "pool_ops_per_sec": ops_per_sec,
        "pool_block_ops_per_sec_batch16": block_ops_per_sec,
    });
    println!("{out}");
    Ok(())
}
