//! `brownout-serve bench …`: the serving tier's benchmarks (docs/BENCHMARKS.md), moved out of
//! `main.rs`.
//!
//! ```text
//! brownout-serve bench kv        replay a long-tailed trace through paged and contiguous KV
//! brownout-serve bench model     decode tokens/s at batch 1/8/32 on each route, TTFT, memory
//! brownout-serve bench gate      per-user table memory under millions of distinct users
//! brownout-serve bench upstream  latency and CPU the --upstream proxy adds to an upstream
//! ```

use std::time::Instant;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::control::ControlHandle;
use crate::gate::GateConfig;
use crate::kvcache::sim::{long_tailed_trace, replay};
use crate::kvcache::{AllocMode, BlockPool};

/// Runs one benchmark, printing its report on stdout.
///
/// # Errors
/// Bad arguments, or what the benchmark ran into.
pub fn run(what: BenchWhat) -> anyhow::Result<()> {
    match what {
        BenchWhat::Kv(a) => bench_kv(&a),
        BenchWhat::Model(a) => bench_model(&a),
        BenchWhat::Gate(a) => bench_gate(&a),
        BenchWhat::Upstream(a) => bench_upstream(&a),
    }
}

#[derive(Subcommand, Debug)]
pub enum BenchWhat {
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
pub struct BenchUpstreamArgs {
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
pub struct BenchGateArgs {
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
pub struct BenchModelArgs {
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
pub struct BenchKvArgs {
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

fn bench_upstream(a: &BenchUpstreamArgs) -> anyhow::Result<()> {
    use crate::upstream::bench::{BenchUpstreamSpec, bench_upstream, to_markdown};
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

/// Resident set size of this process (KiB).
fn rss_kib() -> u64 {
    crate::model::resident_bytes().map_or(0, |b| b / 1024)
}

fn bench_gate(a: &BenchGateArgs) -> anyhow::Result<()> {
    use crate::gate::{Gate, RequestMeta};
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
    use crate::model::Route;
    use crate::scheduler::{BenchSpec, bench_spec};
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
