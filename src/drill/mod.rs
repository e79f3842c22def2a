//! `brownout drill NAME --target URL …`: fault drills against a running deployment (the regular
//! fault injection and chaos drills of docs/REQUIREMENTS.md R8.2 and R8.3). Each drill injects
//! one fault with a command the operator gives (`--inject`, optionally `--recover`), watches the deployment through its
//! public APIs, and reports each step with its time and a verdict:
//!
//! | drill | fault (`--inject`) | passes when |
//! |---|---|---|
//! | `engine-kill` | kills a serving engine (e.g. `systemctl kill -s KILL brownout-serve`) while a stream is open | the client's stream ends (error event or cut) within `--stream-deadline-secs`, no hang; the gpu-agent reports the engine down to the control plane within `--timeout-secs` |
//! | `redis-restart` | restarts Redis | a tier pinned during the outage is applied and acked by every instance within `--timeout-secs` after recovery; the pin is then removed |
//! | `clickhouse-kill` | stops ClickHouse | `--events` failure events sent during the outage are all stored, each exactly once, within `--timeout-secs` after recovery |
//! | `leader-kill` | kills the leading control plane (`--target`) | a `--peer` replica takes the lease within `--timeout-secs` |
//! | `plane-kill` | kills the control plane (`kill -9`) while 4 clients send `--events` failure events; `--recover` restarts it | every acknowledged event is stored exactly once after the restart, and no event is stored twice |
//!
//! The integration tests run the same functions with an in-process fault (`Fault::Call`) against
//! real processes on loopback.
//!
//! One file per drill ([`engine_kill`], [`redis_restart`], [`clickhouse_kill`], [`leader_kill`],
//! [`plane_kill`]);
//! this file holds the arguments, the fault, the report and the HTTP helpers they share.

mod clickhouse_kill;
mod engine_kill;
mod leader_kill;
mod plane_kill;
mod redis_restart;

pub use clickhouse_kill::clickhouse_kill;
pub use engine_kill::engine_kill;
pub use leader_kill::leader_kill;
pub use plane_kill::plane_kill;
pub use redis_restart::redis_restart;

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;
use serde_json::Value as J;

/// The drills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DrillName {
    EngineKill,
    RedisRestart,
    ClickhouseKill,
    LeaderKill,
    PlaneKill,
}

impl DrillName {
    pub fn as_str(self) -> &'static str {
        match self {
            DrillName::EngineKill => "engine-kill",
            DrillName::RedisRestart => "redis-restart",
            DrillName::ClickhouseKill => "clickhouse-kill",
            DrillName::LeaderKill => "leader-kill",
            DrillName::PlaneKill => "plane-kill",
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
    /// clickhouse-kill: failure events to send during the outage; plane-kill: events to send
    /// around the kill.
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

/// Where the two ingest drills (clickhouse-kill, plane-kill) start: their report and clock, a
/// client, the target's ingest token, and a service name of their own for the events they send.
type IngestStart = (Report, Instant, reqwest::Client, String, String);

/// The start of an ingest drill; `Err(report)`, with a failed step saying how to give one,
/// when the target has no ingest token.
fn ingest_start(t: &Target, name: DrillName) -> anyhow::Result<Result<IngestStart, Report>> {
    let mut rep = Report::new(name);
    let t0 = Instant::now();
    let c = client()?;
    let Some(ingest) = t.ingest_token.clone() else {
        rep.step(
            t0,
            "ingest token",
            false,
            "pass --ingest-token or BROWNOUT_INGEST_TOKEN",
        );
        return Ok(Err(rep));
    };
    let service = format!("drill-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    Ok(Ok((rep, t0, c, ingest, service)))
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

async fn degrade_status(c: &reqwest::Client, t: &Target, base: &str) -> anyhow::Result<J> {
    get_json(
        c,
        &format!("{}/api/v1/degrade", trim(base)),
        t.admin_token.as_deref().or(t.read_token.as_deref()),
    )
    .await
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
        DrillName::PlaneKill => {
            plane_kill(&t, &mut inject, recover.as_mut(), a.events, timeout).await?
        }
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
