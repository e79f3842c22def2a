//! The `gpu-agent bench` CPU-time benchmark (part of the binary, not of the library), over the
//! local fixture servers of [`engines`] (engines in vLLM's and the bundled tier's exact formats,
//! a snapshot sink standing in for the control plane).
//!
//! The benchmark runs the fixtures in a child process (`gpu-agent bench-fixtures`, hidden) so
//! that `getrusage(RUSAGE_SELF)` in the agent's process counts only the agent: scraping 4
//! engines, sampling 8 simulated GPUs, serving its own `/metrics` to a scraper every cycle, and
//! pushing every snapshot.

pub mod engines;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use engines::{
    BROWNOUT_SERVE_DEBUG_KV, BROWNOUT_SERVE_METRICS, SnapshotSink, VLLM_V1_METRICS, spawn_engine,
};

/// The URLs the fixture child process prints on its first line.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct FixtureUrls {
    pub engines: Vec<String>,
    pub control_plane: String,
}

/// The token the bench's sink expects.
pub const BENCH_TOKEN: &str = "bench-token";

/// `gpu-agent bench-fixtures`: serves `num_engines` engines (alternating vLLM v1 and the bundled
/// tier) and a sink, prints [`FixtureUrls`] as one JSON line, then GETs `scrape_url` every
/// `scrape_interval` (as Prometheus would scrape the agent) until stdin closes.
///
/// # Errors
/// Bind or IO errors.
pub async fn fixtures_main(
    num_engines: usize,
    scrape_url: Option<String>,
    scrape_interval: Duration,
) -> anyhow::Result<()> {
    let mut engines = Vec::new();
    for i in 0..num_engines {
        let fx = if i % 2 == 0 {
            spawn_engine(VLLM_V1_METRICS, None).await?
        } else {
            spawn_engine(BROWNOUT_SERVE_METRICS, Some(BROWNOUT_SERVE_DEBUG_KV)).await?
        };
        engines.push(fx.url());
    }
    let sink = SnapshotSink::new(Some(BENCH_TOKEN));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let control_plane = format!("http://{}", listener.local_addr()?);
    tokio::spawn(sink.serve(listener, std::future::pending()));
    println!(
        "{}",
        serde_json::to_string(&FixtureUrls {
            engines,
            control_plane
        })?
    );

    if let Some(url) = scrape_url {
        brownout_gpu_agent::ensure_crypto_provider();
        let client = reqwest::Client::builder().no_proxy().build()?;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(scrape_interval);
            loop {
                tick.tick().await;
                if let Ok(r) = client.get(&url).send().await {
                    let _ = r.bytes().await;
                }
            }
        });
    }
    // Run until the parent closes our stdin.
    let _ = tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    })
    .await;
    Ok(())
}

/// Process CPU time (user + system) so far, from `getrusage(RUSAGE_SELF)`.
pub fn process_cpu_time() -> Duration {
    // SAFETY: getrusage only writes into the struct we pass; a zeroed rusage is a valid value.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid, writable pointer.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    if rc != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Result of [`run_bench`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchResult {
    pub gpus: u32,
    pub engines: usize,
    pub interval_ms: u64,
    pub cycles: u64,
    pub wall_s: f64,
    pub cpu_s: f64,
    /// CPU time per cycle (scrape + probe + snapshot + push + one exporter scrape), ms.
    pub cpu_per_cycle_ms: f64,
    /// CPU over wall time, percent of one core, at the interval used.
    pub cpu_percent_of_core: f64,
    /// Projected at the default 1 s interval: `cpu_per_cycle_ms / 10`.
    pub projected_percent_at_1s: f64,
    pub snapshots_pushed: u64,
    pub snapshots_dropped: u64,
    pub engine_scrape_errors: u64,
}

/// Runs the agent against fixture engines in a child process and measures the agent process's
/// CPU time over `cycles` cycles (after `warmup` cycles).
///
/// # Errors
/// When the fixture child cannot start or the agent fails.
pub async fn run_bench(
    gpus: u32,
    num_engines: usize,
    interval: Duration,
    cycles: u64,
    warmup: u64,
) -> anyhow::Result<BenchResult> {
    use anyhow::Context as _;
    use tokio::io::AsyncBufReadExt as _;

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let scrape_url = format!("http://{}/metrics", listener.local_addr()?);
    let exe = std::env::current_exe().context("cannot find the gpu-agent executable")?;
    let mut child = tokio::process::Command::new(exe)
        .args([
            "bench-fixtures",
            "--engines",
            &num_engines.to_string(),
            "--scrape-url",
            &scrape_url,
            "--scrape-interval-ms",
            &interval.as_millis().to_string(),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start the fixture process")?;
    let stdout = child
        .stdout
        .take()
        .context("no stdout from the fixture process")?;
    let mut line = String::new();
    tokio::io::BufReader::new(stdout)
        .read_line(&mut line)
        .await?;
    let urls: FixtureUrls = serde_json::from_str(line.trim())
        .with_context(|| format!("fixture process said {line:?}"))?;

    let mut cfg = brownout_gpu_agent::AgentConfig::new("bench-host").with_simulated_gpus(gpus);
    cfg.listen = None;
    cfg.interval = interval;
    cfg.ingest_token = Some(BENCH_TOKEN.to_string());
    cfg.control_plane = Some(brownout_gpu_agent::config::parse_control_plane(
        &urls.control_plane,
    )?);
    for (i, u) in urls.engines.iter().enumerate() {
        cfg.engines
            .push(brownout_gpu_agent::config::parse_engine(u, i)?);
    }
    let agent = brownout_gpu_agent::Agent::new(cfg)?;
    let handle = agent.handle();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(agent.run(Some(listener), async {
        let _ = stop_rx.await;
    }));

    let mut rx = handle.subscribe();
    let wait_for =
        |rx: &mut tokio::sync::watch::Receiver<Option<Arc<brownout_gpu_agent::CycleReport>>>,
         n: u64| {
            let mut rx = rx.clone();
            async move {
                rx.wait_for(|r| r.as_ref().is_some_and(|r| r.cycles_total >= n))
                    .await
                    .map(|_| ())
            }
        };
    wait_for(&mut rx, warmup.max(1)).await?;
    let (t0, cpu0) = (std::time::Instant::now(), process_cpu_time());
    wait_for(&mut rx, warmup.max(1) + cycles).await?;
    let (wall, cpu) = (t0.elapsed(), process_cpu_time() - cpu0);
    let report = handle.latest().context("no cycle report")?;
    let counts = handle.push_counts().unwrap_or_default();

    let _ = stop_tx.send(());
    task.await??;
    drop(child.stdin.take());
    if tokio::time::timeout(Duration::from_secs(2), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }

    let cpu_per_cycle_ms = cpu.as_secs_f64() * 1000.0 / cycles as f64;
    Ok(BenchResult {
        gpus,
        engines: num_engines,
        interval_ms: interval.as_millis() as u64,
        cycles,
        wall_s: wall.as_secs_f64(),
        cpu_s: cpu.as_secs_f64(),
        cpu_per_cycle_ms,
        cpu_percent_of_core: 100.0 * cpu.as_secs_f64() / wall.as_secs_f64(),
        projected_percent_at_1s: cpu_per_cycle_ms / 10.0,
        snapshots_pushed: counts.pushed,
        snapshots_dropped: counts.dropped,
        engine_scrape_errors: report
            .engines
            .iter()
            .map(|e| e.scrape_errors.iter().sum::<u64>())
            .sum(),
    })
}
