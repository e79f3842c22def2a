//! `brownout drill NAME --target URL …`: fault drills against a running deployment (seed 000's
//! "故障注入常态化" and seed 003's chaos drills). Each drill injects one fault with a command the
//! operator gives (`--inject`, optionally `--recover`), watches the deployment through its
//! public APIs, and reports each step with its time and a verdict:
//!
//! | drill | fault (`--inject`) | passes when |
//! |---|---|---|
//! | `engine-kill` | kills a serving engine (e.g. `systemctl kill -s KILL brownout-serve`) while a stream is open | the client's stream ends (error event or cut) within `--stream-deadline-secs`, no hang; the gpu-agent reports the engine down to the control plane within `--timeout-secs` |
//! | `redis-restart` | restarts Redis | a tier pinned during the outage is applied and acked by every instance within `--timeout-secs` after recovery; the pin is then removed |
//! | `clickhouse-kill` | stops ClickHouse | `--events` failure events sent during the outage are all stored, each exactly once, within `--timeout-secs` after recovery |
//! | `leader-kill` | kills the leading control plane (`--target`) | a `--peer` replica takes the lease within `--timeout-secs` |
//!
//! The integration tests run the same functions with an in-process fault (`Fault::Call`) against
//! real processes on loopback.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use serde::Serialize;
use serde_json::{Value as J, json};

/// The drills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DrillName {
    EngineKill,
    RedisRestart,
    ClickhouseKill,
    LeaderKill,
}

impl DrillName {
    pub fn as_str(self) -> &'static str {
        match self {
            DrillName::EngineKill => "engine-kill",
            DrillName::RedisRestart => "redis-restart",
            DrillName::ClickhouseKill => "clickhouse-kill",
            DrillName::LeaderKill => "leader-kill",
        }
    }
}

/// `brownout drill` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct DrillArgs {
    /// Which drill.
    #[arg(value_enum)]
    pub name: DrillName,
    /// Base URL of the control plane (its HTTP port, e.g. http://cp:8080).
    #[arg(long)]
    pub target: String,
    /// Shell command that injects the fault (run with `sh -c`).
    #[arg(long)]
    pub inject: String,
    /// Shell command that repairs it (skipped when absent: e.g. a supervisor restarts the
    /// process by itself).
    #[arg(long)]
    pub recover: Option<String>,
    /// engine-kill: base URL of the serving engine to kill.
    #[arg(long)]
    pub engine: Option<String>,
    /// leader-kill: other control-plane replicas (repeatable).
    #[arg(long = "peer")]
    pub peers: Vec<String>,
    /// clickhouse-kill: failure events to send during the outage.
    #[arg(long, default_value_t = 200)]
    pub events: usize,
    /// How long the deployment gets to show the expected state after the fault.
    #[arg(long, default_value_t = 60)]
    pub timeout_secs: u64,
    /// engine-kill: how long the open stream may take to end after the kill.
    #[arg(long, default_value_t = 10)]
    pub stream_deadline_secs: u64,
    /// Read token (else BROWNOUT_READ_TOKEN).
    #[arg(long, env = "BROWNOUT_READ_TOKEN", hide_env_values = true)]
    pub read_token: Option<String>,
    /// Admin token, for redis-restart's pin (else BROWNOUT_ADMIN_TOKEN).
    #[arg(long, env = "BROWNOUT_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Ingest token, for clickhouse-kill's events (else BROWNOUT_INGEST_TOKEN).
    #[arg(long, env = "BROWNOUT_INGEST_TOKEN", hide_env_values = true)]
    pub ingest_token: Option<String>,
    /// Print the report as JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// How the fault is injected.
pub enum Fault {
    /// `sh -c CMD`; fails the drill when it exits non-zero.
    Shell(String),
    /// In-process (tests): kill a child process, stop a server.
    Call(Box<dyn FnMut() -> anyhow::Result<()> + Send>),
    /// In-process and asynchronous (tests): restart a server and wait for it.
    Async(Box<dyn FnMut() -> futures::future::BoxFuture<'static, anyhow::Result<()>> + Send>),
}

impl std::fmt::Debug for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Shell(c) => write!(f, "Shell({c:?})"),
            Fault::Call(_) => f.write_str("Call(..)"),
            Fault::Async(_) => f.write_str("Async(..)"),
        }
    }
}

impl Fault {
    async fn run(&mut self) -> anyhow::Result<()> {
        match self {
            Fault::Shell(cmd) => {
                let out = tokio::process::Command::new("sh")
                    .arg("-c")
                    .arg(&*cmd)
                    .output()
                    .await
                    .with_context(|| format!("running {cmd:?}"))?;
                if !out.status.success() {
                    bail!(
                        "{cmd:?} exited with {}: {}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                }
                Ok(())
            }
            Fault::Call(f) => f(),
            Fault::Async(f) => f().await,
        }
    }
}

/// Tokens and URLs a drill talks to.
#[derive(Debug, Clone, Default)]
pub struct Target {
    pub plane: String,
    pub read_token: Option<String>,
    pub admin_token: Option<String>,
    pub ingest_token: Option<String>,
}

/// One step of a drill.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub name: String,
    pub ok: bool,
    /// Since the drill started.
    pub at_ms: u64,
    pub detail: String,
}

impl Step {
    /// `<at> ms  ok|FAIL  <name>: <detail>`.
    fn line(&self) -> String {
        format!(
            "{:>7} ms  {}  {}: {}",
            self.at_ms,
            if self.ok { "ok  " } else { "FAIL" },
            self.name,
            self.detail
        )
    }
}

/// What a drill found.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub drill: DrillName,
    pub passed: bool,
    pub steps: Vec<Step>,
    /// Named figures (e.g. `stream_end_ms`, `marked_down_ms`).
    pub figures: serde_json::Map<String, J>,
}

impl Report {
    fn new(drill: DrillName) -> Report {
        Report {
            drill,
            passed: true,
            steps: Vec::new(),
            figures: serde_json::Map::new(),
        }
    }

    fn step(&mut self, t0: Instant, name: &str, ok: bool, detail: impl Into<String>) {
        let s = Step {
            name: name.into(),
            ok,
            at_ms: t0.elapsed().as_millis() as u64,
            detail: detail.into(),
        };
        // Progress as it happens (the report repeats it at the end).
        eprintln!("[drill {}] {}", self.drill.as_str(), s.line());
        self.passed &= ok;
        self.steps.push(s);
    }

    /// Records a step from its outcome (the detail either way); true when it passed.
    fn check(&mut self, t0: Instant, name: &str, r: Result<String, String>) -> bool {
        let ok = r.is_ok();
        let (Ok(detail) | Err(detail)) = r;
        self.step(t0, name, ok, detail);
        ok
    }

    fn figure(&mut self, k: &str, v: impl Into<J>) {
        self.figures.insert(k.into(), v.into());
    }

    /// Human-readable summary.
    pub fn render(&self) -> String {
        let mut out = format!(
            "drill {}: {}\n",
            self.drill.as_str(),
            if self.passed { "PASSED" } else { "FAILED" }
        );
        for s in &self.steps {
            out.push_str(&format!("  {}\n", s.line()));
        }
        for (k, v) in &self.figures {
            out.push_str(&format!("  {k} = {v}\n"));
        }
        out
    }
}

fn client() -> anyhow::Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(3))
        .build()?)
}

async fn get_json(c: &reqwest::Client, url: &str, token: Option<&str>) -> anyhow::Result<J> {
    let mut r = c.get(url).timeout(Duration::from_secs(5));
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    let resp = r.send().await.with_context(|| format!("GET {url}"))?;
    let status = resp.status();
    if !status.is_success() {
        bail!("GET {url}: {status}");
    }
    Ok(resp.json().await?)
}

/// The response when its status is a success, else what went wrong (status and body, or the
/// transport error).
async fn success(r: reqwest::Result<reqwest::Response>) -> Result<reqwest::Response, String> {
    match r {
        Ok(r) if r.status().is_success() => Ok(r),
        Ok(r) => {
            let s = r.status();
            Err(format!("{s}: {}", r.text().await.unwrap_or_default()))
        }
        Err(e) => Err(format!("{e:#}")),
    }
}

/// Runs a fault (inject or recover); `done` is the step's detail when it worked.
async fn run_fault(f: &mut Fault, done: &str) -> Result<String, String> {
    f.run()
        .await
        .map(|()| done.to_string())
        .map_err(|e| format!("{e:#}"))
}

fn trim(u: &str) -> &str {
    u.trim_end_matches('/')
}

/// The `up` flag the control plane holds for the engine at `engine_url`, from any host.
async fn engine_up(
    c: &reqwest::Client,
    t: &Target,
    engine_url: &str,
) -> anyhow::Result<Option<bool>> {
    let hosts = get_json(
        c,
        &format!("{}/api/v1/hosts", trim(&t.plane)),
        t.read_token.as_deref(),
    )
    .await?;
    let want = trim(engine_url);
    for h in hosts["hosts"].as_array().into_iter().flatten() {
        for e in h["snapshot"]["engines"].as_array().into_iter().flatten() {
            if e["url"].as_str().map(trim) == Some(want) {
                return Ok(e["up"].as_bool());
            }
        }
    }
    Ok(None)
}

/// Polls `f` every 100 ms until it gives `Some`, or `timeout` passes.
async fn poll<T, F, Fut>(timeout: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if start.elapsed() >= timeout {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How the open stream ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum StreamEnd {
    /// An SSE `{"error": …}` event.
    ErrorEvent(String),
    /// The connection broke before `[DONE]`.
    Cut(String),
    /// `[DONE]` after a finish reason: the generation ended before the fault hit.
    Finished,
    /// Still open at the deadline.
    Hung,
}

/// engine-kill: opens a stream, injects the fault on its first event, and checks that the
/// stream ends without hanging and that the engine is reported down.
///
/// # Errors
/// Only for setup problems (no HTTP client); every finding is in the report.
pub async fn engine_kill(
    t: &Target,
    engine_url: &str,
    fault: &mut Fault,
    recover: Option<&mut Fault>,
    stream_deadline: Duration,
    timeout: Duration,
) -> anyhow::Result<Report> {
    let mut rep = Report::new(DrillName::EngineKill);
    let t0 = Instant::now();
    let c = client()?;
    match engine_up(&c, t, engine_url).await {
        Ok(Some(true)) => rep.step(t0, "engine reported up", true, engine_url),
        Ok(other) => {
            rep.step(
                t0,
                "engine reported up",
                false,
                format!("the control plane reports {other:?} for {engine_url}: is a gpu-agent scraping it?"),
            );
            return Ok(rep);
        }
        Err(e) => {
            rep.step(t0, "engine reported up", false, format!("{e:#}"));
            return Ok(rep);
        }
    }
    // As long a generation as the context allows (vLLM's /v1/models gives max_model_len), and
    // past end-of-sequence, so that the fault lands mid-stream.
    let max_model_len = get_json(&c, &format!("{}/v1/models", trim(engine_url)), None)
        .await
        .ok()
        .and_then(|m| m["data"][0]["max_model_len"].as_u64())
        .unwrap_or(512);
    let body = json!({
        "model": "default",
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
        "stream": true,
        "max_tokens": max_model_len.saturating_sub(128).max(16),
        "ignore_eos": true,
    });
    let resp = c
        .post(format!("{}/v1/chat/completions", trim(engine_url)))
        .header("x-brownout-criticality", "critical")
        .json(&body)
        .send()
        .await;
    let resp = match success(resp).await {
        Ok(r) => r,
        Err(e) => {
            rep.step(t0, "stream opened", false, e);
            return Ok(rep);
        }
    };
    rep.step(
        t0,
        "stream opened",
        true,
        "POST /v1/chat/completions stream=true",
    );
    let mut stream = resp.bytes_stream();
    let mut buf = Vec::<u8>::new();
    let mut injected_at: Option<Instant> = None;
    let mut events = 0usize;
    let deadline = Instant::now() + stream_deadline + Duration::from_secs(30);
    let end = loop {
        let wait = match injected_at {
            Some(at) => (at + stream_deadline).saturating_duration_since(Instant::now()),
            None => deadline.saturating_duration_since(Instant::now()),
        };
        let next = tokio::time::timeout(wait, stream.next()).await;
        match next {
            Err(_) => break StreamEnd::Hung,
            Ok(None) => break StreamEnd::Cut("the connection closed without [DONE]".into()),
            Ok(Some(Err(e))) => break StreamEnd::Cut(format!("{e:#}")),
            Ok(Some(Ok(bytes))) => {
                buf.extend_from_slice(&bytes);
                let mut done = None;
                while let Some(pos) = buf.windows(2).position(|w| w == b"\n\n") {
                    let ev: Vec<u8> = buf.drain(..pos + 2).collect();
                    let text = String::from_utf8_lossy(&ev);
                    let data = text
                        .trim()
                        .strip_prefix("data:")
                        .map(str::trim)
                        .unwrap_or("");
                    if data.is_empty() {
                        continue;
                    }
                    events += 1;
                    if data == "[DONE]" {
                        done = Some(StreamEnd::Finished);
                        break;
                    }
                    if let Ok(v) = serde_json::from_str::<J>(data)
                        && v.get("error").is_some()
                    {
                        done = Some(StreamEnd::ErrorEvent(v["error"].to_string()));
                        break;
                    }
                }
                if let Some(d) = done {
                    break d;
                }
                if injected_at.is_none() && events > 0 {
                    let r = run_fault(fault, &format!("after {events} stream event(s)")).await;
                    injected_at = Some(Instant::now());
                    if !rep.check(t0, "fault injected", r) {
                        return Ok(rep);
                    }
                }
            }
        }
    };
    let end_ms = injected_at.map(|a| a.elapsed().as_millis() as u64);
    if let Some(ms) = end_ms {
        rep.figure("stream_end_after_fault_ms", ms);
    }
    match &end {
        StreamEnd::ErrorEvent(e) => rep.step(t0, "stream ended", true, format!("error event {e}")),
        StreamEnd::Cut(e) => rep.step(t0, "stream ended", true, format!("cut: {e}")),
        StreamEnd::Finished => rep.step(
            t0,
            "stream ended",
            false,
            "the generation finished normally: the fault did not hit the engine",
        ),
        StreamEnd::Hung => rep.step(
            t0,
            "stream ended",
            false,
            format!("still open {stream_deadline:?} after the fault: the client would hang"),
        ),
    }
    drop(stream);
    let since = Instant::now();
    let down = poll(timeout, || async {
        match engine_up(&c, t, engine_url).await {
            Ok(Some(false)) => Some(()),
            _ => None,
        }
    })
    .await;
    match down {
        Some(()) => {
            let ms = since.elapsed().as_millis() as u64 + end_ms.unwrap_or(0);
            rep.figure("marked_down_after_fault_ms", ms);
            rep.step(
                t0,
                "engine reported down",
                true,
                format!("{ms} ms after the fault"),
            );
        }
        None => rep.step(
            t0,
            "engine reported down",
            false,
            format!("the control plane still shows it up after {timeout:?}"),
        ),
    }
    if let Some(r) = recover {
        if !rep.check(t0, "recovered", run_fault(r, "").await) {
            return Ok(rep);
        }
        let up = poll(timeout, || async {
            matches!(engine_up(&c, t, engine_url).await, Ok(Some(true))).then_some(())
        })
        .await;
        rep.step(
            t0,
            "engine reported up again",
            up.is_some(),
            if up.is_some() {
                "after --recover"
            } else {
                "not within the timeout"
            },
        );
    }
    Ok(rep)
}

async fn degrade_status(c: &reqwest::Client, t: &Target, base: &str) -> anyhow::Result<J> {
    get_json(
        c,
        &format!("{}/api/v1/degrade", trim(base)),
        t.admin_token.as_deref().or(t.read_token.as_deref()),
    )
    .await
}

/// redis-restart: pins tier 1 while Redis is down, and checks that every instance applies and
/// acks it after recovery.
///
/// # Errors
/// Only for setup problems; findings are in the report.
pub async fn redis_restart(
    t: &Target,
    fault: &mut Fault,
    recover: Option<&mut Fault>,
    timeout: Duration,
) -> anyhow::Result<Report> {
    let mut rep = Report::new(DrillName::RedisRestart);
    let t0 = Instant::now();
    let c = client()?;
    let Some(admin) = t.admin_token.clone() else {
        rep.step(
            t0,
            "admin token",
            false,
            "redis-restart pins a tier: pass --admin-token or BROWNOUT_ADMIN_TOKEN",
        );
        return Ok(rep);
    };
    let before = match degrade_status(&c, t, &t.plane).await {
        Ok(s) => s,
        Err(e) => {
            rep.step(t0, "status before", false, format!("{e:#}"));
            return Ok(rep);
        }
    };
    let instances: Vec<String> = before["acks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["status"] == "applied")
        .filter_map(|a| a["instance"].as_str().map(String::from))
        .collect();
    if instances.is_empty() {
        rep.step(
            t0,
            "status before",
            false,
            "no serving instance has acked anything: nothing to check",
        );
        return Ok(rep);
    }
    rep.step(
        t0,
        "status before",
        true,
        format!(
            "tier {}, instances {}",
            before["tier"],
            instances.join(", ")
        ),
    );
    if !rep.check(t0, "fault injected", run_fault(fault, "redis down").await) {
        return Ok(rep);
    }
    let injected = Instant::now();
    let pin = c
        .post(format!("{}/api/v1/degrade/override", trim(&t.plane)))
        .bearer_auth(&admin)
        .json(&json!({"tier": 1, "duration_secs": 600, "reason": "brownout drill redis-restart"}))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    let pinned = success(pin).await.map(|_| String::new());
    if !rep.check(t0, "tier 1 pinned during the outage", pinned) {
        return Ok(rep);
    }
    if let Some(r) = recover
        && !rep.check(t0, "recovered", run_fault(r, "redis back").await)
    {
        return Ok(rep);
    }
    let converged = poll(timeout, || async {
        let s = degrade_status(&c, t, &t.plane).await.ok()?;
        let cmd = &s["command"];
        if cmd["tier"].as_u64() != Some(1) {
            return None;
        }
        let (e, v) = (cmd["epoch"].as_u64()?, cmd["version"].as_u64()?);
        let acks = s["acks"].as_array()?;
        instances
            .iter()
            .all(|i| {
                acks.iter().any(|a| {
                    a["instance"].as_str() == Some(i)
                        && a["status"] == "applied"
                        && (a["epoch"].as_u64(), a["version"].as_u64()) >= (Some(e), Some(v))
                })
            })
            .then_some((e, v))
    })
    .await;
    match converged {
        Some((e, v)) => {
            let ms = injected.elapsed().as_millis() as u64;
            rep.figure("converged_after_fault_ms", ms);
            rep.step(
                t0,
                "every instance applied tier 1",
                true,
                format!("epoch {e} version {v}, {ms} ms after the fault"),
            );
        }
        None => rep.step(
            t0,
            "every instance applied tier 1",
            false,
            format!("not within {timeout:?}"),
        ),
    }
    let cleared = c
        .delete(format!("{}/api/v1/degrade/override", trim(&t.plane)))
        .bearer_auth(&admin)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .map(|r| r.status().is_success())
        .unwrap_or(false);
    rep.step(
        t0,
        "pin removed",
        cleared,
        "DELETE /api/v1/degrade/override",
    );
    Ok(rep)
}

/// clickhouse-kill: sends `events` failure events while the store is down, then checks each is
/// stored exactly once after recovery.
///
/// # Errors
/// Only for setup problems; findings are in the report.
pub async fn clickhouse_kill(
    t: &Target,
    fault: &mut Fault,
    recover: Option<&mut Fault>,
    events: usize,
    timeout: Duration,
) -> anyhow::Result<Report> {
    let mut rep = Report::new(DrillName::ClickhouseKill);
    let t0 = Instant::now();
    let c = client()?;
    let Some(ingest) = t.ingest_token.clone() else {
        rep.step(
            t0,
            "ingest token",
            false,
            "pass --ingest-token or BROWNOUT_INGEST_TOKEN",
        );
        return Ok(rep);
    };
    let events = events.clamp(1, 1000);
    let service = format!("drill-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    if !rep.check(t0, "fault injected", run_fault(fault, "store down").await) {
        return Ok(rep);
    }
    let mut sent = 0;
    for chunk in (0..events).collect::<Vec<_>>().chunks(50) {
        let body: String = chunk
            .iter()
            .map(|i| {
                format!(
                    "{}\n",
                    json!({"ts": brownout_protocol::now_ms(), "service": service, "message": format!("drill event {i}"), "category": "other"})
                )
            })
            .collect();
        let r = c
            .post(format!("{}/v1/failures", trim(&t.plane)))
            .bearer_auth(&ingest)
            .header("content-type", "application/x-ndjson")
            .body(body)
            .timeout(Duration::from_secs(10))
            .send()
            .await;
        if let Err(e) = success(r).await {
            rep.step(t0, "events accepted during the outage", false, e);
            return Ok(rep);
        }
        sent += chunk.len();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rep.step(
        t0,
        "events accepted during the outage",
        true,
        format!("{sent} events of service {service}"),
    );
    if let Some(r) = recover
        && !rep.check(t0, "recovered", run_fault(r, "store back").await)
    {
        return Ok(rep);
    }
    let recovered = Instant::now();
    let read = t.read_token.clone();
    let url = format!(
        "{}/api/v1/failures?service={service}&limit=1000",
        trim(&t.plane)
    );
    let last = std::sync::atomic::AtomicUsize::new(0);
    let stored = poll(timeout, || async {
        let j = get_json(&c, &url, read.as_deref()).await.ok()?;
        let items = j["items"].as_array()?;
        last.store(items.len(), std::sync::atomic::Ordering::Relaxed);
        (items.len() >= sent).then(|| {
            let mut msgs: Vec<&str> = items.iter().filter_map(|i| i["message"].as_str()).collect();
            msgs.sort_unstable();
            msgs.dedup();
            (items.len(), msgs.len())
        })
    })
    .await;
    match stored {
        Some((n, unique)) if n == sent && unique == sent => {
            let ms = recovered.elapsed().as_millis() as u64;
            rep.figure("stored_after_recovery_ms", ms);
            rep.step(
                t0,
                "every event stored exactly once",
                true,
                format!("{n} rows, {unique} distinct, {ms} ms after recovery"),
            );
        }
        Some((n, unique)) => rep.step(
            t0,
            "every event stored exactly once",
            false,
            format!("{n} rows, {unique} distinct for {sent} sent"),
        ),
        None => rep.step(
            t0,
            "every event stored exactly once",
            false,
            format!(
                "{} of {sent} stored after {timeout:?}",
                last.load(std::sync::atomic::Ordering::Relaxed)
            ),
        ),
    }
    Ok(rep)
}

/// leader-kill: kills the leading replica (`--target`) and checks that a peer takes over.
///
/// # Errors
/// Only for setup problems; findings are in the report.
pub async fn leader_kill(
    t: &Target,
    peers: &[String],
    fault: &mut Fault,
    timeout: Duration,
) -> anyhow::Result<Report> {
    let mut rep = Report::new(DrillName::LeaderKill);
    let t0 = Instant::now();
    let c = client()?;
    if peers.is_empty() {
        rep.step(t0, "peers", false, "pass at least one --peer replica");
        return Ok(rep);
    }
    let before = match degrade_status(&c, t, &t.plane).await {
        Ok(s) => s,
        Err(e) => {
            rep.step(t0, "target is the leader", false, format!("{e:#}"));
            return Ok(rep);
        }
    };
    let Some(old_epoch) = before["leader_epoch"].as_u64() else {
        rep.step(
            t0,
            "target is the leader",
            false,
            "the target does not hold the lease; point --target at the leader",
        );
        return Ok(rep);
    };
    rep.step(
        t0,
        "target is the leader",
        true,
        format!("epoch {old_epoch}"),
    );
    if !rep.check(t0, "fault injected", run_fault(fault, "leader down").await) {
        return Ok(rep);
    }
    let injected = Instant::now();
    let took = poll(timeout, || async {
        for p in peers {
            if let Ok(s) = degrade_status(&c, t, p).await
                && let Some(e) = s["leader_epoch"].as_u64()
                && e > old_epoch
            {
                return Some((p.clone(), e));
            }
        }
        None
    })
    .await;
    match took {
        Some((p, e)) => {
            let ms = injected.elapsed().as_millis() as u64;
            rep.figure("takeover_after_fault_ms", ms);
            rep.step(
                t0,
                "a peer took the lease",
                true,
                format!("{p} at epoch {e}, {ms} ms after the fault"),
            );
        }
        None => rep.step(
            t0,
            "a peer took the lease",
            false,
            format!("no peer leads after {timeout:?}"),
        ),
    }
    Ok(rep)
}

/// Runs the drill named on the command line.
///
/// # Errors
/// A missing argument for the drill, or the drill failing (after its report is printed).
pub async fn run(a: DrillArgs) -> anyhow::Result<()> {
    let t = Target {
        plane: a.target.clone(),
        read_token: a.read_token.clone(),
        admin_token: a.admin_token.clone(),
        ingest_token: a.ingest_token.clone(),
    };
    let mut inject = Fault::Shell(a.inject.clone());
    let mut recover = a.recover.clone().map(Fault::Shell);
    let timeout = Duration::from_secs(a.timeout_secs.max(1));
    let rep = match a.name {
        DrillName::EngineKill => {
            let Some(engine) = a.engine.as_deref() else {
                bail!("engine-kill needs --engine URL (the serving engine to kill)");
            };
            engine_kill(
                &t,
                engine,
                &mut inject,
                recover.as_mut(),
                Duration::from_secs(a.stream_deadline_secs.max(1)),
                timeout,
            )
            .await?
        }
        DrillName::RedisRestart => {
            redis_restart(&t, &mut inject, recover.as_mut(), timeout).await?
        }
        DrillName::ClickhouseKill => {
            clickhouse_kill(&t, &mut inject, recover.as_mut(), a.events, timeout).await?
        }
        DrillName::LeaderKill => leader_kill(&t, &a.peers, &mut inject, timeout).await?,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rep)?);
    } else {
        print!("{}", rep.render());
    }
    if rep.passed {
        Ok(())
    } else {
        bail!("drill {} failed", a.name.as_str())
    }
}
