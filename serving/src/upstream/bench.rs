//! `brownout-serve bench upstream`: what the proxy adds. In one run it starts an upstream
//! (`brownout-serve --model …`, or uses `--upstream-url`) and a proxy in front of it (both real
//! processes of this binary), then sends the same requests alternately straight to the
//! upstream and through the proxy, one at a time: latency quantiles of both paths (the
//! difference is the added latency) and CPU time of each process (from /proc) per 1,000
//! requests.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use serde_json::{Value, json};

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchUpstreamSpec {
    /// Requests per path and mode.
    pub requests: usize,
    /// Requests per path before measuring.
    pub warmup: usize,
    /// `--model` of the upstream this run starts (ignored with `upstream_url`).
    pub upstream_model: String,
    /// An upstream already running (its CPU is measured when `upstream_pid` is given).
    pub upstream_url: Option<String>,
    pub upstream_pid: Option<u32>,
    pub max_tokens: u32,
    /// `plain` and/or `stream`.
    pub modes: Vec<String>,
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn spawn(args: &[String]) -> anyhow::Result<Proc> {
    let exe = std::env::current_exe().context("finding this binary")?;
    let child = Command::new(exe)
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("REDIS_URL")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting brownout-serve")?;
    Ok(Proc(child))
}

async fn wait_healthy(c: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        if let Ok(r) = c.get(format!("{url}/health")).send().await
            && r.status().is_success()
        {
            return Ok(());
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(300),
            "{url} never became healthy"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// User + system CPU seconds of a process (all its threads), from /proc/<pid>/stat.
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the parenthesised command name: state is field 3; utime 14, stime 15.
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((ticks(11) + ticks(12)) / hz.max(1.0))
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn one(c: &reqwest::Client, url: &str, body: &Value, stream: bool) -> anyhow::Result<f64> {
    let t = Instant::now();
    let r = c
        .post(format!("{url}/v1/chat/completions"))
        .json(body)
        .send()
        .await?;
    anyhow::ensure!(r.status().is_success(), "{url} answered {}", r.status());
    if stream {
        let mut s = r.bytes_stream();
        while let Some(c) = s.next().await {
            c?;
        }
    } else {
        r.bytes().await?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

/// Runs the benchmark; the report as JSON.
///
/// # Errors
/// When a process does not start or a request fails.
pub async fn bench_upstream(
    spec: &BenchUpstreamSpec,
    log: &mut dyn FnMut(&str),
) -> anyhow::Result<Value> {
    anyhow::ensure!(spec.requests > 0, "--requests must be positive");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .tcp_nodelay(true)
        .build()?;
    let mut procs = Vec::new();
    let (upstream_url, upstream_pid) = match &spec.upstream_url {
        Some(u) => (
            super::normalize_url(u).map_err(anyhow::Error::msg)?,
            spec.upstream_pid,
        ),
        None => {
            let port = free_port()?;
            let p = spawn(&[
                "--model".into(),
                spec.upstream_model.clone(),
                "--host".into(),
                "127.0.0.1".into(),
                "--port".into(),
                port.to_string(),
                "--max-num-seqs".into(),
                "8".into(),
            ])?;
            let pid = p.0.id();
            procs.push(p);
            (format!("http://127.0.0.1:{port}"), Some(pid))
        }
    };
    wait_healthy(&c, &upstream_url).await?;
    let pport = free_port()?;
    let proxy = spawn(&[
        "--upstream".into(),
        upstream_url.clone(),
        "--host".into(),
        "127.0.0.1".into(),
        "--port".into(),
        pport.to_string(),
    ])?;
    let proxy_pid = proxy.0.id();
    procs.push(proxy);
    let proxy_url = format!("http://127.0.0.1:{pport}");
    wait_healthy(&c, &proxy_url).await?;
    log(&format!("upstream {upstream_url}, proxy {proxy_url}"));

    let mut modes = Vec::new();
    for mode in &spec.modes {
        let stream = match mode.as_str() {
            "plain" => false,
            "stream" => true,
            other => anyhow::bail!("--modes takes plain and stream (got {other:?})"),
        };
        let body = json!({
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": spec.max_tokens, "ignore_eos": true, "temperature": 0, "stream": stream,
        });
        for _ in 0..spec.warmup {
            one(&c, &upstream_url, &body, stream).await?;
            one(&c, &proxy_url, &body, stream).await?;
        }
        let (mut direct, mut proxied) = (Vec::new(), Vec::new());
        let cpu_p0 = cpu_seconds(proxy_pid)?;
        let cpu_u0 = upstream_pid.map(cpu_seconds).transpose()?;
        let t = Instant::now();
        for i in 0..spec.requests {
            // Alternate which path goes first, so neither always meets a warmer upstream.
            if i % 2 == 0 {
                direct.push(one(&c, &upstream_url, &body, stream).await?);
                proxied.push(one(&c, &proxy_url, &body, stream).await?);
            } else {
                proxied.push(one(&c, &proxy_url, &body, stream).await?);
                direct.push(one(&c, &upstream_url, &body, stream).await?);
            }
            if (i + 1) % (spec.requests / 5).max(1) == 0 {
                log(&format!("{mode}: {} of {} pairs", i + 1, spec.requests));
            }
        }
        let secs = t.elapsed().as_secs_f64();
        let cpu_p = cpu_seconds(proxy_pid)? - cpu_p0;
        let cpu_u = match (upstream_pid, cpu_u0) {
            (Some(pid), Some(u0)) => Some(cpu_seconds(pid)? - u0),
            _ => None,
        };
        let paired: Vec<f64> = {
            let mut v: Vec<f64> = proxied.iter().zip(&direct).map(|(p, d)| p - d).collect();
            v.sort_by(f64::total_cmp);
            v
        };
        direct.sort_by(f64::total_cmp);
        proxied.sort_by(f64::total_cmp);
        let n = spec.requests as f64;
        // The proxy's CPU is spent on the proxied requests; the upstream's on both paths.
        let proxy_cpu_ms_per_1k = cpu_p * 1e3 / n * 1e3;
        let upstream_cpu_ms_per_1k = cpu_u.map(|u| u * 1e3 / (2.0 * n) * 1e3);
        modes.push(json!({
            "mode": mode,
            "requests_per_path": spec.requests,
            "seconds": secs,
            "direct_ms": {"p50": quantile(&direct, 0.5), "p99": quantile(&direct, 0.99)},
            "proxied_ms": {"p50": quantile(&proxied, 0.5), "p99": quantile(&proxied, 0.99)},
            "added_ms": {
                "p50": quantile(&proxied, 0.5) - quantile(&direct, 0.5),
                "p99": quantile(&proxied, 0.99) - quantile(&direct, 0.99),
                "paired_p50": quantile(&paired, 0.5),
            },
            "proxy_cpu_ms_per_1k_requests": proxy_cpu_ms_per_1k,
            "upstream_cpu_ms_per_1k_requests": upstream_cpu_ms_per_1k,
            "proxy_cpu_over_upstream_cpu": upstream_cpu_ms_per_1k.map(|u| proxy_cpu_ms_per_1k / u.max(1e-9)),
        }));
    }
    drop(procs);
    Ok(json!({
        "upstream": spec.upstream_url.clone().unwrap_or_else(|| format!("brownout-serve --model {}", spec.upstream_model)),
        "max_tokens": spec.max_tokens,
        "warmup": spec.warmup,
        "modes": modes,
    }))
}

/// The report as a Markdown table.
pub fn to_markdown(v: &Value) -> String {
    let mut s = String::from(
        "| mode | requests/path | direct p50 / p99 (ms) | proxied p50 / p99 (ms) | added p50 / p99 (ms) | proxy CPU ms / 1k req | upstream CPU ms / 1k req | proxy / upstream CPU |\n|---|---|---|---|---|---|---|---|\n",
    );
    for m in v["modes"].as_array().into_iter().flatten() {
        let f = |x: &Value| x.as_f64().map_or("–".into(), |x| format!("{x:.3}"));
        s.push_str(&format!(
            "| {} | {} | {} / {} | {} / {} | {} / {} | {} | {} | {} |\n",
            m["mode"].as_str().unwrap_or(""),
            m["requests_per_path"],
            f(&m["direct_ms"]["p50"]),
            f(&m["direct_ms"]["p99"]),
            f(&m["proxied_ms"]["p50"]),
            f(&m["proxied_ms"]["p99"]),
            f(&m["added_ms"]["p50"]),
            f(&m["added_ms"]["p99"]),
            f(&m["proxy_cpu_ms_per_1k_requests"]),
            f(&m["upstream_cpu_ms_per_1k_requests"]),
            m["proxy_cpu_over_upstream_cpu"]
                .as_f64()
                .map_or("–".into(), |x| format!("{:.1} %", x * 100.0)),
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_of_this_process_is_read_and_quantiles_pick_ranks() {
        let a = cpu_seconds(std::process::id()).unwrap();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(cpu_seconds(std::process::id()).unwrap() >= a);
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 51.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
