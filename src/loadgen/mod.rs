//! Open-loop load generator for OpenAI-compatible endpoints, judged by flows.
//!
//! ```text
//!  arrivals (Poisson, rate = base × curve × bursts)             [plan.rs: pure, seeded]
//!     └─> one user per arrival: a task flow (login, Q&A, trip planner, …: calls + think time)
//!            └─> whole-flow deadline (8 s agent flows, 3 s login, 4 s Q&A)  [client.rs]
//!                  each call: POST /v1/chat/completions, stream, criticality + feature headers,
//!                  x-brownout-attempt (1 = first try; more = a retry of the call or the flow)
//!                  refusal/error → retry per client kind (well-behaved / naive / impatient)
//!                  deadline → hang up (the engine cancels the request on disconnect)
//!            failed flow → the user retries the whole flow with some probability
//!  stats: flow success per criticality, flow goodput over time, TTFT, wasted tokens  [stats.rs]
//! ```
//!
//! A flow succeeds only when all its calls finish before its deadline; a flow that ends at
//! 8.03 s has failed, and the tokens its calls received are counted as wasted. Open loop means
//! arrivals do not wait for earlier flows: an overloaded server sees the load pile up, as a real
//! one would. The number of users in flight is capped (memory stays bounded); arrivals past the
//! cap are counted as `client_dropped`, never silently lost.

pub mod client;
pub mod plan;
pub mod progress;
pub mod stats;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use brownout_protocol::Criticality;
use brownout_protocol::wire::header;
use futures::StreamExt as _;
use tokio::sync::Semaphore;
use tokio::time::Instant;

pub use client::{Deadlines, Failure};
pub use plan::{Arrival, ClientKind, ClientMix, FlowKind, LoadShape, plan_arrivals};
pub use stats::{CallOutcome, FlowEnd, FlowRecord, LoadReport, Recorder, Timeline};

/// The client-behaviour flags `brownout loadgen` and `brownout-demo bench overload` share.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// Shares of client kinds: `well_behaved=0.6,naive=0.3,impatient=0.1`.
    #[arg(long, default_value = "well_behaved=0.6,naive=0.3,impatient=0.1")]
    pub client_mix: ClientMix,
    /// Whole-flow deadline overrides, `KIND=SECS,…` (`agent=10` sets every multi-call kind;
    /// kinds: login, basic_qa, chat, trip_planner, pdf_analysis, image_generation,
    /// multilingual_email). Defaults: login 3, basic_qa 4, the rest 8.
    #[arg(long, default_value = "")]
    pub deadline: String,
    /// Chance that a user whose flow failed retries the whole flow (after 1–3 s).
    #[arg(long, default_value_t = 0.3)]
    pub flow_retry_prob: f64,
}

impl ClientArgs {
    /// # Errors
    /// `--flow-retry-prob` outside [0, 1], or a bad `--deadline` spec.
    pub fn check(&self) -> anyhow::Result<Deadlines> {
        anyhow::ensure!(
            (0.0..=1.0).contains(&self.flow_retry_prob),
            "--flow-retry-prob must be in [0, 1]"
        );
        let mut deadlines = Deadlines::default();
        deadlines
            .apply(&self.deadline)
            .map_err(anyhow::Error::msg)?;
        Ok(deadlines)
    }

    /// Sets the client mix, the flow deadlines and the flow-retry chance on `c`.
    ///
    /// # Errors
    /// As [`ClientArgs::check`].
    pub fn apply(&self, c: &mut LoadConfig) -> anyhow::Result<()> {
        c.deadlines = self.check()?;
        c.client_mix = self.client_mix;
        c.flow_retry_prob = self.flow_retry_prob;
        Ok(())
    }
}

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
    #[command(flatten)]
    pub clients: ClientArgs,
    /// Whole-flow retries per user at most.
    #[arg(long, default_value_t = 2)]
    pub max_flow_retries: u32,
    /// The impatient client abandons and retries a call that has not finished after this long.
    #[arg(long, default_value_t = 3.0)]
    pub impatient_timeout_secs: f64,
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
    /// Per-call TTFT objective, seconds (reported as calls/s within it; flows are judged by
    /// their deadline).
    #[arg(long, default_value_t = 2.0)]
    pub ttft_slo_secs: f64,
}

/// Everything a run needs, independent of the CLI.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub targets: Vec<String>,
    pub shape: LoadShape,
    /// Think time is divided by this.
    pub speed: f64,
    pub client_mix: ClientMix,
    pub deadlines: Deadlines,
    /// Chance a user retries a failed flow, and how many times at most.
    pub flow_retry_prob: f64,
    pub max_flow_retries: u32,
    /// The impatient client's own call timeout.
    pub impatient_timeout: Duration,
    pub model: String,
    pub max_tokens: u32,
    pub seed: u64,
    pub ttft_slo: Duration,
    /// Cap on users in flight.
    pub max_in_flight: usize,
    /// Progress on stderr (a bar on a terminal, a line every 10 s otherwise).
    pub progress: bool,
    /// Name shown on progress lines.
    pub label: String,
}

impl LoadConfig {
    /// A configuration with the defaults of `brownout loadgen`.
    pub fn new(targets: Vec<String>, shape: LoadShape) -> LoadConfig {
        LoadConfig {
            targets: targets
                .iter()
                .map(|t| t.trim_end_matches('/').to_string())
                .collect(),
            shape,
            speed: 4.0,
            client_mix: ClientMix::default(),
            deadlines: Deadlines::default(),
            flow_retry_prob: 0.3,
            max_flow_retries: 2,
            impatient_timeout: Duration::from_secs(3),
            model: "default".into(),
            max_tokens: 24,
            seed: 7,
            ttft_slo: Duration::from_secs(2),
            max_in_flight: 4096,
            progress: true,
            label: "loadgen".into(),
        }
    }

    /// # Errors
    /// A bad `--deadline` spec or an out-of-range number.
    pub fn from_args(a: &LoadgenArgs) -> anyhow::Result<LoadConfig> {
        anyhow::ensure!(
            a.speed > 0.0 && a.speed.is_finite(),
            "--speed must be a positive number"
        );
        anyhow::ensure!(
            a.impatient_timeout_secs > 0.0 && a.impatient_timeout_secs.is_finite(),
            "--impatient-timeout-secs must be a positive number"
        );
        let mut c = LoadConfig::new(
            a.target.clone(),
            LoadShape {
                duration: Duration::from_secs(a.duration_secs),
                base_rate: a.base_rate,
                peak_factor: a.peak_factor,
                ..LoadShape::default()
            },
        );
        c.speed = a.speed;
        a.clients.apply(&mut c)?;
        c.max_flow_retries = a.max_flow_retries;
        c.impatient_timeout = Duration::from_secs_f64(a.impatient_timeout_secs);
        c.model = a.model.clone();
        c.max_tokens = a.max_tokens;
        c.seed = a.seed;
        c.ttft_slo = Duration::from_secs_f64(a.ttft_slo_secs);
        Ok(c)
    }
}

/// Runs `brownout loadgen`.
///
/// # Errors
/// When no target is given, an argument is out of range or the HTTP client cannot be built.
pub async fn run(args: LoadgenArgs) -> anyhow::Result<()> {
    let cfg = LoadConfig::from_args(&args)?;
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

/// Generates the planned arrivals and drives them against the targets until every user is done.
///
/// # Errors
/// When no target is configured or the HTTP client cannot be built.
pub async fn run_load(cfg: LoadConfig) -> anyhow::Result<LoadReport> {
    anyhow::ensure!(
        !cfg.targets.is_empty(),
        "loadgen needs at least one --target"
    );
    let client = http_client()?;
    let arrivals = plan_arrivals(&cfg.shape, &cfg.client_mix, cfg.seed);
    let recorder = Arc::new(Recorder::new(cfg.ttft_slo));
    let permits = Arc::new(Semaphore::new(cfg.max_in_flight.max(1)));
    let cfg = Arc::new(cfg);
    let start = Instant::now();
    let total = arrivals.len();
    let progress = cfg.progress.then(|| {
        let rec = recorder.clone();
        let mut bar = progress::Progress::new(&cfg.label, cfg.shape.duration);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                bar.tick(start.elapsed(), &rec.progress_line(total));
            }
        })
    });
    let mut tasks = Vec::with_capacity(total);
    for (i, arrival) in arrivals.into_iter().enumerate() {
        tokio::time::sleep_until(start + arrival.at).await;
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            recorder.client_dropped(arrival.kind.criticality(), start.elapsed());
            continue;
        };
        let target = cfg.targets[i % cfg.targets.len()].clone();
        let (client, rec, cfg) = (client.clone(), recorder.clone(), cfg.clone());
        tasks.push(tokio::spawn(async move {
            run_user(&client, &target, &arrival, &cfg, &rec, start).await;
            drop(permit);
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    if let Some(p) = progress {
        p.abort();
        if cfg.progress {
            progress::Progress::finish_line();
        }
    }
    Ok(recorder.report(start.elapsed()))
}

/// Flows per second that finish within their deadline with `concurrency` users in a closed
/// loop (each starts its next flow when the last one ends) for `length`: the capacity the
/// overload benchmark scales its load by. Well-behaved clients only, no whole-flow retries.
///
/// # Errors
/// When no target is configured or the HTTP client cannot be built.
pub async fn closed_loop_flows_per_s(
    cfg: &LoadConfig,
    concurrency: usize,
    length: Duration,
) -> anyhow::Result<f64> {
    anyhow::ensure!(!cfg.targets.is_empty(), "no target to calibrate against");
    let client = http_client()?;
    let plan = plan_arrivals(
        &LoadShape {
            duration: Duration::from_secs(600),
            base_rate: 5.0,
            peak_factor: 1.0,
            burst_prob_per_s: 0.0,
            ..LoadShape::default()
        },
        &ClientMix::only(ClientKind::WellBehaved),
        cfg.seed,
    );
    anyhow::ensure!(!plan.is_empty(), "empty calibration plan");
    let plan = Arc::new(plan);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let rec = Arc::new(Recorder::new(cfg.ttft_slo));
    let cfg = Arc::new(cfg.clone());
    let start = Instant::now();
    let end = start + length;
    let mut tasks = Vec::new();
    for w in 0..concurrency.max(1) {
        let (client, plan, next, rec, cfg) = (
            client.clone(),
            plan.clone(),
            next.clone(),
            rec.clone(),
            cfg.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let target = cfg.targets[w % cfg.targets.len()].clone();
            let mut ok = 0u64;
            while Instant::now() < end {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let a = &plan[i % plan.len()];
                let t0 = Instant::now();
                let run = run_flow(
                    &client,
                    &target,
                    a,
                    0,
                    t0 + cfg.deadlines.get(a.kind),
                    &cfg,
                    &rec,
                )
                .await;
                if run.end == FlowEnd::Ok {
                    ok += 1;
                }
            }
            ok
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += t.await.unwrap_or(0);
    }
    Ok(ok as f64 / start.elapsed().as_secs_f64().max(1e-9))
}

/// One user: the flow, and whole-flow retries after a failure (seeded, so every configuration
/// of a benchmark sees the same decisions for the same outcomes).
async fn run_user(
    client: &reqwest::Client,
    target: &str,
    a: &Arrival,
    cfg: &LoadConfig,
    rec: &Recorder,
    start: Instant,
) {
    let budget = cfg.deadlines.get(a.kind);
    for attempt in 0..=cfg.max_flow_retries {
        let t0 = Instant::now();
        rec.flow_started(t0 - start);
        let run = run_flow(client, target, a, attempt, t0 + budget, cfg, rec).await;
        let ended = Instant::now();
        rec.record_flow(&FlowRecord {
            criticality: a.kind.criticality(),
            attempt,
            started: t0 - start,
            ended: ended - start,
            end: run.end,
            tokens: run.tokens,
            call_retries: run.retries,
        });
        if run.end == FlowEnd::Ok
            || attempt == cfg.max_flow_retries
            || client::unit(a.jitter_seed, 1000 + u64::from(attempt), 0) >= cfg.flow_retry_prob
        {
            return;
        }
        let refresh = 1.0 + 2.0 * client::unit(a.jitter_seed, 2000 + u64::from(attempt), 0);
        tokio::time::sleep(Duration::from_secs_f64(refresh)).await;
    }
}

/// How one try of a flow went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FlowRun {
    end: FlowEnd,
    tokens: u64,
    retries: u32,
}

/// One try of a user's task flow: its calls in order with think time between them, each call
/// retried per the client's kind, everything cut at `deadline`.
async fn run_flow(
    client: &reqwest::Client,
    target: &str,
    a: &Arrival,
    flow_attempt: u32,
    deadline: Instant,
    cfg: &LoadConfig,
    rec: &Recorder,
) -> FlowRun {
    let crit = a.kind.criticality();
    let mut run = FlowRun {
        end: FlowEnd::Ok,
        tokens: 0,
        retries: 0,
    };
    let missed = |mut run: FlowRun| {
        run.end = FlowEnd::Deadline;
        run
    };
    for (n, prompt) in a.kind.calls().iter().enumerate() {
        if n > 0 {
            let think = a
                .think_times
                .get(n - 1)
                .copied()
                .unwrap_or(Duration::from_secs(2))
                .div_f64(cfg.speed.max(0.01));
            if Instant::now() + think >= deadline {
                tokio::time::sleep_until(deadline).await;
                return missed(run);
            }
            tokio::time::sleep(think).await;
        }
        let mut attempt = 0u32;
        loop {
            let now = Instant::now();
            if now >= deadline {
                return missed(run);
            }
            let remaining = deadline - now;
            let timeout = client::call_timeout(a.client, remaining, cfg.impatient_timeout);
            let outcome = one_call(
                client,
                target,
                a,
                prompt,
                cfg,
                now + timeout,
                timeout >= remaining,
                1 + attempt + flow_attempt,
            )
            .await;
            rec.record(crit, &outcome);
            run.tokens += outcome_tokens(&outcome);
            let failure = match &outcome {
                CallOutcome::Ok { .. } => break,
                CallOutcome::Shed { retry_after } | CallOutcome::Disabled { retry_after } => {
                    Failure::Refused {
                        retry_after: *retry_after,
                    }
                }
                CallOutcome::Abandoned { deadline: true, .. } => return missed(run),
                CallOutcome::Abandoned { .. } | CallOutcome::Error { .. } => Failure::Error,
            };
            attempt += 1;
            let u = client::unit(
                a.jitter_seed,
                ((n as u64) << 32) | u64::from(attempt),
                u64::from(flow_attempt),
            );
            let Some(delay) = client::retry_delay(a.client, attempt, failure, u) else {
                run.end = FlowEnd::of(&outcome, false);
                return run;
            };
            let remaining = deadline.saturating_duration_since(Instant::now());
            if client::gives_up_before_deadline(a.client, delay, remaining) {
                run.end = FlowEnd::of(&outcome, false);
                return run;
            }
            if delay >= remaining {
                tokio::time::sleep_until(deadline).await;
                return missed(run);
            }
            rec.retry(crit);
            run.retries += 1;
            tokio::time::sleep(delay).await;
        }
    }
    if Instant::now() > deadline {
        return missed(run);
    }
    run
}

fn outcome_tokens(o: &CallOutcome) -> u64 {
    match o {
        CallOutcome::Ok { tokens, .. } | CallOutcome::Abandoned { tokens, .. } => *tokens,
        _ => 0,
    }
}

/// Error codes of a 503 that are failures, not deliberate refusals.
const FAILURE_CODES: [&str; 5] = [
    stats::EXPIRED_REASON,
    "kv_cache_exhausted",
    "engine_stopped",
    "model_error",
    "not_ready",
];

/// One request, cut at `cut` (the client hangs up there; `cut_is_deadline` says whether that is
/// the flow's deadline or the impatient client's own timeout). `try_no` goes out as
/// `x-brownout-attempt`: 1 for the first try of a call in the user's first flow try, more for a
/// retry of the call or any call of a retried flow.
#[allow(clippy::too_many_arguments)]
async fn one_call(
    client: &reqwest::Client,
    target: &str,
    a: &Arrival,
    prompt: &str,
    cfg: &LoadConfig,
    cut: Instant,
    cut_is_deadline: bool,
    try_no: u32,
) -> CallOutcome {
    let body = serde_json::json!({
        "model": cfg.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": cfg.max_tokens,
        "temperature": 0.7,
        "seed": a.jitter_seed % (1 << 31),
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let started = Instant::now();
    let abandoned = |ttft: Option<Duration>, tokens: u64| CallOutcome::Abandoned {
        ttft,
        after: started.elapsed(),
        tokens,
        deadline: cut_is_deadline,
    };
    let req = client
        .post(format!("{target}/v1/chat/completions"))
        .header(header::CRITICALITY, a.kind.criticality().as_str())
        .header(header::FEATURE, a.kind.feature())
        .header("x-brownout-client", a.client.as_str())
        .header(header::USER, format!("user-{:016x}", a.jitter_seed))
        .header(header::ATTEMPT, try_no.to_string())
        .json(&body);
    let resp = match tokio::time::timeout_at(cut, req.send()).await {
        Err(_) => return abandoned(None, 0),
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
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
        .map(|s| Duration::from_secs_f64(s.min(3600.0)));
    match status {
        200 => {}
        429 => return CallOutcome::Shed { retry_after },
        s => {
            // The error body is small; bounded by the cut like everything else.
            let code = match tokio::time::timeout_at(cut, resp.bytes()).await {
                Ok(Ok(b)) if b.len() <= 64 << 10 => error_code(&b),
                _ => None,
            };
            return match (s, code) {
                (503, Some(c)) if FAILURE_CODES.contains(&c.as_str()) => {
                    CallOutcome::Error { reason: c }
                }
                (503, _) => CallOutcome::Disabled { retry_after },
                (s, _) => CallOutcome::Error {
                    reason: format!("http_{s}"),
                },
            };
        }
    }
    let mut scan = SseScan::default();
    let mut ttft = None;
    let mut stream = resp.bytes_stream();
    loop {
        let next = match tokio::time::timeout_at(cut, stream.next()).await {
            Err(_) => return abandoned(ttft, scan.tokens()),
            Ok(n) => n,
        };
        let Some(chunk) = next else { break };
        let Ok(chunk) = chunk else {
            return CallOutcome::Error {
                reason: "stream_broken".into(),
            };
        };
        scan.push(&chunk);
        if ttft.is_none() && scan.content_chunks > 0 {
            ttft = Some(started.elapsed());
        }
        if let Some(code) = scan.error.take() {
            return CallOutcome::Error { reason: code };
        }
        if scan.done {
            break;
        }
    }
    CallOutcome::Ok {
        ttft: ttft.unwrap_or_else(|| started.elapsed()),
        e2e: started.elapsed(),
        tokens: scan.tokens(),
    }
}

/// The `error.code` of an OpenAI-shaped error body.
fn error_code(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()?
        .pointer("/error/code")?
        .as_str()
        .map(|s| s.chars().take(64).collect())
}

/// Incremental reader of a chat-completions SSE stream: counts content chunks, keeps the
/// `usage` figure and notices an error event. Holds at most one incomplete event.
#[derive(Debug, Default)]
struct SseScan {
    pending: Vec<u8>,
    content_chunks: u64,
    usage_tokens: Option<u64>,
    error: Option<String>,
    done: bool,
}

/// Longest incomplete event kept; longer garbage is dropped.
const MAX_PENDING: usize = 256 << 10;

impl SseScan {
    fn push(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
        while let Some(end) = find_event_end(&self.pending) {
            let event: Vec<u8> = self.pending.drain(..end.1).collect();
            self.event(&String::from_utf8_lossy(&event[..end.0]));
        }
        if self.pending.len() > MAX_PENDING {
            self.pending.clear();
        }
    }

    fn event(&mut self, text: &str) {
        for d in text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
        {
            if d == "[DONE]" {
                self.done = true;
                continue;
            }
            let Ok(v) = serde_json::from_str::<serde_json::Value>(d) else {
                continue;
            };
            if let Some(code) = v.pointer("/error/code").and_then(|c| c.as_str()) {
                self.error = Some(code.chars().take(64).collect());
            }
            if let Some(n) = v
                .pointer("/usage/completion_tokens")
                .and_then(serde_json::Value::as_u64)
            {
                self.usage_tokens = Some(n);
            }
            let c = &v["choices"][0];
            if [&c["delta"]["content"], &c["text"]]
                .iter()
                .any(|t| t.as_str().is_some_and(|s| !s.is_empty()))
            {
                self.content_chunks += 1;
            }
        }
    }

    /// Completion tokens: the server's usage figure when it sent one, else the content chunks
    /// seen (the serving tier sends about one token per chunk).
    fn tokens(&self) -> u64 {
        self.usage_tokens.unwrap_or(self.content_chunks)
    }
}

/// `(end of the event text, end including the blank line)` of the first complete event.
fn find_event_end(b: &[u8]) -> Option<(usize, usize)> {
    let lf = b.windows(2).position(|w| w == b"\n\n").map(|i| (i, i + 2));
    let crlf = b
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
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
    fn sse_scan_counts_content_usage_errors_across_chunk_boundaries() {
        let mut s = SseScan::default();
        s.push(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n");
        assert_eq!(s.content_chunks, 0, "a role-only chunk is not content");
        s.push(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: {\"choi");
        assert_eq!(s.content_chunks, 1);
        s.push(b"ces\":[{\"delta\":{\"content\":\" there\"}}]}\r\n\r\n");
        assert_eq!((s.content_chunks, s.tokens()), (2, 2));
        s.push(b"data: {\"choices\":[],\"usage\":{\"completion_tokens\":3}}\n\n");
        assert_eq!(s.tokens(), 3, "usage wins over the chunk count");
        assert!(!s.done);
        s.push(b"data: [DONE]\n\n");
        assert!(s.done);
        let mut e = SseScan::default();
        e.push(b"data: {\"error\":{\"code\":\"timeout_resource\",\"message\":\"x\"}}\n\n");
        assert_eq!(e.error.as_deref(), Some("timeout_resource"));
        assert_eq!(
            error_code(br#"{"error":{"code":"feature_disabled","message":"m"}}"#).as_deref(),
            Some("feature_disabled")
        );
        assert_eq!(error_code(b"not json"), None);
    }

    /// A fake OpenAI endpoint: `mode` decides each answer; counts requests and hang-ups.
    async fn fake_server(
        mode: &'static str,
    ) -> (
        String,
        Arc<std::sync::atomic::AtomicU64>,
        Arc<std::sync::atomic::AtomicU64>,
    ) {
        use axum::response::IntoResponse as _;
        use std::sync::atomic::{AtomicU64, Ordering};
        let hits = Arc::new(AtomicU64::new(0));
        let dropped = Arc::new(AtomicU64::new(0));
        let (h, d) = (hits.clone(), dropped.clone());
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(move || {
                let (h, d) = (h.clone(), d.clone());
                async move {
                    h.fetch_add(1, Ordering::SeqCst);
                    match mode {
                        "shed" => (
                            axum::http::StatusCode::TOO_MANY_REQUESTS,
                            [("retry-after", "1")],
                            r#"{"error":{"code":"shed","message":"shed"}}"#,
                        )
                            .into_response(),
                        "ok" => (
                            [("content-type", "text/event-stream")],
                            "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n\n",
                        )
                            .into_response(),
                        _ => {
                            // "stall": one token, then nothing; notice when the client hangs up.
                            struct OnDrop(Arc<AtomicU64>);
                            impl Drop for OnDrop {
                                fn drop(&mut self) {
                                    self.0.fetch_add(1, Ordering::SeqCst);
                                }
                            }
                            let guard = OnDrop(d.clone());
                            let first = futures::stream::once(async {
                                Ok::<_, std::convert::Infallible>(axum::body::Bytes::from_static(
                                    b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
                                ))
                            });
                            let rest = futures::stream::pending().map(move |x: axum::body::Bytes| {
                                let _ = &guard;
                                Ok(x)
                            });
                            (
                                [("content-type", "text/event-stream")],
                                axum::body::Body::from_stream(first.chain(rest)),
                            )
                                .into_response()
                        }
                    }
                }
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(l, app).await });
        (url, hits, dropped)
    }

    fn one_user(kind: FlowKind, client: ClientKind) -> Arrival {
        Arrival {
            at: Duration::ZERO,
            kind,
            client,
            think_times: vec![Duration::from_millis(40); kind.calls().len() - 1],
            jitter_seed: 99,
        }
    }

    fn cfg(url: &str, deadline_ms: u64) -> LoadConfig {
        let mut c = LoadConfig::new(vec![url.to_string()], LoadShape::default());
        let mut d = Deadlines::default();
        for k in FlowKind::ALL {
            d.set(k, Duration::from_millis(deadline_ms));
        }
        c.deadlines = d;
        c.progress = false;
        c.speed = 1.0;
        c
    }

    #[tokio::test]
    async fn a_flow_past_its_deadline_hangs_up_and_counts_its_tokens_as_wasted() {
        let (url, hits, dropped) = fake_server("stall").await;
        let c = cfg(&url, 300);
        let rec = Recorder::new(c.ttft_slo);
        let client = http_client().unwrap();
        let a = one_user(FlowKind::Login, ClientKind::Naive);
        let t0 = Instant::now();
        let run = run_flow(
            &client,
            &url,
            &a,
            0,
            t0 + Duration::from_millis(300),
            &c,
            &rec,
        )
        .await;
        assert_eq!(run.end, FlowEnd::Deadline);
        assert_eq!(run.tokens, 1, "the one token streamed before the deadline");
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
        // The server sees the disconnect (its response stream is dropped).
        for _ in 0..100 {
            if dropped.load(std::sync::atomic::Ordering::SeqCst) == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(dropped.load(std::sync::atomic::Ordering::SeqCst), 1);
        let d = rec.report(Duration::from_secs(1));
        let cl = d.class(Criticality::Critical).unwrap();
        assert_eq!(cl.abandoned, 1);
    }

    /// Every call says which try it is: the server refuses twice, an impatient client retries
    /// at once (tries 1, 2, 3); the calls of a retried flow are retries from the start.
    #[tokio::test]
    async fn calls_carry_their_attempt_number() {
        use axum::response::IntoResponse as _;
        let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let s = seen.clone();
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(move |h: axum::http::HeaderMap| {
                let s = s.clone();
                async move {
                    let mut v = s.lock().unwrap();
                    v.push(
                        h.get("x-brownout-attempt")
                            .and_then(|x| x.to_str().ok())
                            .unwrap_or("")
                            .to_string(),
                    );
                    if v.len() % 3 != 0 {
                        return (
                            axum::http::StatusCode::TOO_MANY_REQUESTS,
                            r#"{"error":{"code":"shed","message":"shed"}}"#,
                        )
                            .into_response();
                    }
                    (
                        [("content-type", "text/event-stream")],
                        "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n",
                    )
                        .into_response()
                }
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(l, app).await });
        let c = cfg(&url, 5000);
        let rec = Recorder::new(c.ttft_slo);
        let client = http_client().unwrap();
        let a = one_user(FlowKind::Login, ClientKind::Impatient);
        for flow_attempt in [0, 1] {
            let deadline = Instant::now() + Duration::from_secs(5);
            let run = run_flow(&client, &url, &a, flow_attempt, deadline, &c, &rec).await;
            assert_eq!(run.end, FlowEnd::Ok);
        }
        assert_eq!(*seen.lock().unwrap(), ["1", "2", "3", "2", "3", "4"]);
    }

    #[tokio::test]
    async fn a_flow_of_several_calls_succeeds_within_its_deadline() {
        let (url, hits, _) = fake_server("ok").await;
        let c = cfg(&url, 5000);
        let rec = Arc::new(Recorder::new(c.ttft_slo));
        let client = http_client().unwrap();
        let a = one_user(FlowKind::TripPlanner, ClientKind::WellBehaved);
        run_user(&client, &url, &a, &c, &rec, Instant::now()).await;
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 4);
        let r = rec.report(Duration::from_secs(1));
        let f = &r.class(Criticality::Default).unwrap().flows;
        assert_eq!(
            (f.users, f.users_ok, f.useful_tokens, f.wasted_tokens),
            (1, 1, 8, 0)
        );
    }

    #[tokio::test]
    async fn a_well_behaved_client_gives_up_when_retry_after_passes_the_deadline() {
        let (url, hits, _) = fake_server("shed").await;
        // Retry-After 1 s (≥ 1 s with jitter) against a 600 ms deadline: no retry at all.
        let c = cfg(&url, 600);
        let rec = Recorder::new(c.ttft_slo);
        let client = http_client().unwrap();
        let a = one_user(FlowKind::Login, ClientKind::WellBehaved);
        let run = run_flow(
            &client,
            &url,
            &a,
            0,
            Instant::now() + Duration::from_millis(600),
            &c,
            &rec,
        )
        .await;
        assert_eq!((run.end, run.retries), (FlowEnd::Shed, 0));
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
        // The impatient client hammers until the deadline (or its cap).
        let a = one_user(FlowKind::Login, ClientKind::Impatient);
        let run = run_flow(
            &client,
            &url,
            &a,
            0,
            Instant::now() + Duration::from_millis(600),
            &c,
            &rec,
        )
        .await;
        assert_eq!(run.retries, client::IMPATIENT_MAX_RETRIES);
        assert_eq!(run.end, FlowEnd::Shed);
    }
}
