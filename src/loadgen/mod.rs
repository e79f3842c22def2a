//! Open-loop load generator for OpenAI-compatible endpoints.
//!
//! ```text
//!  arrivals (Poisson, rate = base × evening curve × bursts)   [plan.rs: pure, seeded]
//!     └─> one task flow per arrival (login, chat, PDF analysis, …: several calls with think time)
//!            └─> each call: POST /v1/chat/completions, stream, criticality + feature headers
//!                  429 → well-behaved clients wait Retry-After × jitter; misbehaving ones retry at once
//!  stats per criticality: success rate, TTFT p50/p99, shed and disabled counts, goodput
//! ```
//!
//! Open loop means arrivals do not wait for earlier flows: an overloaded server sees the load
//! pile up, as a real one would. The number of flows in flight is capped (memory stays bounded);
//! arrivals past the cap are counted as `client_dropped`, never silently lost.

pub mod plan;
pub mod stats;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use brownout_protocol::Criticality;
use futures::StreamExt as _;
use tokio::sync::Semaphore;

pub use plan::{Arrival, FlowKind, LoadShape, plan_arrivals};
pub use stats::{CallOutcome, LoadReport, Recorder};

/// Command-line arguments of `brownout loadgen`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadgenArgs {
    /// Base URL of an OpenAI-compatible server (repeat for several; round-robin).
    #[arg(long, required = true)]
    pub target: Vec<String>,
    /// How long to generate arrivals, in seconds.
    #[arg(long, default_value_t = 60)]
    pub duration_secs: u64,
    /// Flows per second outside the peak.
    #[arg(long, default_value_t = 2.0)]
    pub base_rate: f64,
    /// Multiplier of the evening peak over the base rate.
    #[arg(long, default_value_t = 3.0)]
    pub peak_factor: f64,
    /// Compresses think time (docs/REQUIREMENTS.md R10.2: 2–8 s between calls) by this factor.
    #[arg(long, default_value_t = 4.0)]
    pub speed: f64,
    /// Share of clients that ignore Retry-After and retry at once (a recovery storm).
    #[arg(long, default_value_t = 0.1)]
    pub misbehaving_ratio: f64,
    /// Model name sent in requests.
    #[arg(long, default_value = "default")]
    pub model: String,
    /// max_tokens per call.
    #[arg(long, default_value_t = 24)]
    pub max_tokens: u32,
    /// RNG seed (same seed, same arrival plan).
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Print the final report as one JSON line on stdout.
    #[arg(long)]
    pub json: bool,
    /// TTFT objective used for goodput, seconds.
    #[arg(long, default_value_t = 2.0)]
    pub ttft_slo_secs: f64,
}

/// Everything a run needs, independent of the CLI.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub targets: Vec<String>,
    pub shape: LoadShape,
    pub speed: f64,
    pub misbehaving_ratio: f64,
    pub model: String,
    pub max_tokens: u32,
    pub seed: u64,
    pub ttft_slo: Duration,
    /// Cap on flows in flight.
    pub max_in_flight: usize,
    /// Per-call timeout.
    pub call_timeout: Duration,
    /// Retries after a 429/503 before a call counts as failed.
    pub max_retries: u32,
    /// Print progress to stderr every second.
    pub progress: bool,
}

impl LoadConfig {
    pub fn from_args(a: &LoadgenArgs) -> LoadConfig {
        LoadConfig {
            targets: a
                .target
                .iter()
                .map(|t| t.trim_end_matches('/').to_string())
                .collect(),
            shape: LoadShape {
                duration: Duration::from_secs(a.duration_secs),
                base_rate: a.base_rate,
                peak_factor: a.peak_factor,
                ..LoadShape::default()
            },
            speed: a.speed,
            misbehaving_ratio: a.misbehaving_ratio,
            model: a.model.clone(),
            max_tokens: a.max_tokens,
            seed: a.seed,
            ttft_slo: Duration::from_secs_f64(a.ttft_slo_secs),
            max_in_flight: 4096,
            call_timeout: Duration::from_secs(30),
            max_retries: 3,
            progress: true,
        }
    }
}

/// Runs `brownout loadgen`.
///
/// # Errors
/// When no target is given or the HTTP client cannot be built.
pub async fn run(args: LoadgenArgs) -> anyhow::Result<()> {
    let cfg = LoadConfig::from_args(&args);
    let report = run_load(cfg).await?;
    eprintln!("{}", report.human());
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(())
}

/// Builds the HTTP client used for load (rustls with the ring provider; no TLS needed on
/// loopback, but https targets work).
///
/// # Errors
/// When reqwest cannot build a client.
pub fn http_client() -> anyhow::Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .tcp_nodelay(true)
        .build()
        .context("building the HTTP client")
}

/// Generates the planned arrivals and drives them against the targets until every flow ends.
///
/// # Errors
/// When no target is configured or the HTTP client cannot be built.
pub async fn run_load(cfg: LoadConfig) -> anyhow::Result<LoadReport> {
    anyhow::ensure!(
        !cfg.targets.is_empty(),
        "loadgen needs at least one --target"
    );
    let client = http_client()?;
    let arrivals = plan_arrivals(&cfg.shape, cfg.misbehaving_ratio, cfg.seed);
    let recorder = Arc::new(Recorder::new(cfg.ttft_slo));
    let permits = Arc::new(Semaphore::new(cfg.max_in_flight));
    let cfg = Arc::new(cfg);
    let start = Instant::now();
    let total = arrivals.len();
    let progress = cfg.progress.then(|| {
        let rec = recorder.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tick.tick().await;
                eprintln!(
                    "[loadgen {:>4}s] {}",
                    start.elapsed().as_secs(),
                    rec.progress_line(total)
                );
            }
        })
    });
    let mut tasks = Vec::with_capacity(total);
    for (i, arrival) in arrivals.into_iter().enumerate() {
        let due = start + arrival.at;
        tokio::time::sleep_until(due.into()).await;
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            recorder.client_dropped(arrival.kind.criticality());
            continue;
        };
        let target = cfg.targets[i % cfg.targets.len()].clone();
        let (client, rec, cfg) = (client.clone(), recorder.clone(), cfg.clone());
        tasks.push(tokio::spawn(async move {
            run_flow(&client, &target, &arrival, &cfg, &rec).await;
            drop(permit);
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    if let Some(p) = progress {
        p.abort();
    }
    Ok(recorder.report(start.elapsed()))
}

/// One user's task flow: its calls in order with think time between them. A call that fails
/// after retries ends the flow (the user gives up), as an agent pipeline would.
async fn run_flow(
    client: &reqwest::Client,
    target: &str,
    a: &Arrival,
    cfg: &LoadConfig,
    rec: &Recorder,
) {
    let calls = a.kind.calls();
    for (n, prompt) in calls.iter().enumerate() {
        if n > 0 {
            let think = a
                .think_times
                .get(n - 1)
                .copied()
                .unwrap_or(Duration::from_secs(2));
            tokio::time::sleep(think.div_f64(cfg.speed.max(0.01))).await;
        }
        let outcome = call_with_retries(client, target, a, prompt, cfg, rec).await;
        rec.record(a.kind.criticality(), &outcome);
        if !matches!(outcome, CallOutcome::Ok { .. }) {
            return;
        }
    }
}

async fn call_with_retries(
    client: &reqwest::Client,
    target: &str,
    a: &Arrival,
    prompt: &str,
    cfg: &LoadConfig,
    rec: &Recorder,
) -> CallOutcome {
    let mut attempt = 0;
    loop {
        let outcome = one_call(client, target, a, prompt, cfg).await;
        match &outcome {
            CallOutcome::Shed { retry_after } | CallOutcome::Disabled { retry_after }
                if attempt < cfg.max_retries =>
            {
                attempt += 1;
                rec.retry(a.kind.criticality());
                if !a.misbehaving {
                    // Honour Retry-After, with our own jitter on top so clients spread out.
                    let base = retry_after.unwrap_or(Duration::from_secs(1));
                    let jitter = 1.0
                        + (a.jitter_seed.wrapping_mul(u64::from(attempt) + 1) % 1000) as f64
                            / 2000.0;
                    tokio::time::sleep(base.mul_f64(jitter).div_f64(cfg.speed.max(0.01))).await;
                }
            }
            _ => return outcome,
        }
    }
}

async fn one_call(
    client: &reqwest::Client,
    target: &str,
    a: &Arrival,
    prompt: &str,
    cfg: &LoadConfig,
) -> CallOutcome {
    let body = serde_json::json!({
        "model": cfg.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": cfg.max_tokens,
        "temperature": 0.7,
        "seed": a.jitter_seed % (1 << 31),
        "stream": true,
    });
    let started = Instant::now();
    let req = client
        .post(format!("{target}/v1/chat/completions"))
        .header("x-brownout-criticality", a.kind.criticality().as_str())
        .header("x-brownout-feature", a.kind.feature())
        .timeout(cfg.call_timeout)
        .json(&body);
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            return CallOutcome::Error {
                reason: if e.is_timeout() {
                    "timeout".into()
                } else {
                    "connect".into()
                },
            };
        }
    };
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .map(Duration::from_secs_f64);
    match status {
        200 => {}
        429 => return CallOutcome::Shed { retry_after },
        503 => return CallOutcome::Disabled { retry_after },
        s => {
            return CallOutcome::Error {
                reason: format!("http_{s}"),
            };
        }
    }
    let mut ttft = None;
    let mut stream = resp.bytes_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = stream.next().await {
        let Ok(chunk) = chunk else {
            return CallOutcome::Error {
                reason: "stream_broken".into(),
            };
        };
        if ttft.is_none() {
            buf.extend_from_slice(&chunk);
            if sse_has_content(&buf) {
                ttft = Some(started.elapsed());
                buf = Vec::new();
            }
        }
    }
    CallOutcome::Ok {
        ttft: ttft.unwrap_or_else(|| started.elapsed()),
        e2e: started.elapsed(),
    }
}

/// True once the SSE text holds a `data:` event carrying generated text (not only the role).
fn sse_has_content(buf: &[u8]) -> bool {
    let text = String::from_utf8_lossy(buf);
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .any(|d| {
            if d == "[DONE]" {
                return true;
            }
            serde_json::from_str::<serde_json::Value>(d).is_ok_and(|v| {
                let c = &v["choices"][0];
                [&c["delta"]["content"], &c["text"]]
                    .iter()
                    .any(|t| t.as_str().is_some_and(|s| !s.is_empty()))
            })
        })
}

/// The criticality of each flow kind, for reports.
pub fn criticalities() -> [Criticality; 3] {
    [
        Criticality::Critical,
        Criticality::Default,
        Criticality::Sheddable,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_content_detection_skips_role_only_chunks() {
        let role = b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n";
        assert!(!sse_has_content(role));
        let content = b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n";
        assert!(sse_has_content(content));
        assert!(sse_has_content(b"data: {\"choices\":[{\"text\":\"x\"}]}\n"));
        assert!(sse_has_content(b"data: [DONE]\n"));
        assert!(!sse_has_content(b"data: {\"choi"));
    }
}
