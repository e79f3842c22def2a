//! Ingest benchmark: sustained spans/s end to end, with the real OpenTelemetry SDK and
//! `opentelemetry-otlp` exporter as the load, in another process.
//!
//! ```text
//! cargo run --release --example ingest_bench -- --store sqlite --seconds 30
//! CLICKHOUSE_URL=http://127.0.0.1:8123 cargo run --release --example ingest_bench -- --store clickhouse --seconds 30
//! # into the 2-shard cluster of bench/with-clickhouse-cluster.sh (it exports CLICKHOUSE_CLUSTER)
//! bench/with-clickhouse-cluster.sh bash -c 'CLICKHOUSE_URL=${CLICKHOUSE_NODES%% *} target/release/examples/ingest_bench --store clickhouse --seconds 30'
//! # against a running `brownout serve` (no control plane in this process): the load goes to
//! # its OTLP endpoint and the accepted counter is read from its /metrics
//! target/release/examples/ingest_bench --external http://127.0.0.1:8080/metrics --endpoint http://127.0.0.1:4317 --token "$INGEST_TOKEN" --seconds 30
//! # both: bench/clickhouse-cluster-serve.sh (one node vs the 2-shard cluster, one session)
//! # TLS on the OTLP listeners (`server.tls_*`, a CA and a certificate made here with rcgen; the
//! # exporters trust that CA), against the same run without: alternate the two
//! target/release/examples/ingest_bench --store sqlite --seconds 20 --tls on|off [--transport http]
//! ```
//!
//! The parent runs the control plane in-process (real sockets, the chosen store), starts itself
//! again as the load generator (`--load`, N threads, each with its own tracer provider, batch
//! span processor and OTLP exporter), samples the accepted-spans counter and its own resident
//! memory every second, then waits for the ingest writer to drain and counts the stored rows.
//! Spans the SDK dropped (its queue full) show up as `created − accepted`; rows lost after
//! acceptance as `accepted − stored`.

use std::time::{Duration, Instant};

use anyhow::Context;
use brownout::auth::Tokens;
use brownout::config::{ClickHouseConfig, Config};
use brownout::plane::{App, Listeners};
use opentelemetry::KeyValue;
use opentelemetry::trace::{
    Span as _, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};

mod common;
use common::arg;

/// The spans the load generator says it created (its `created N` line; 0 without one).
fn created_spans(stdout: &[u8]) -> u64 {
    String::from_utf8_lossy(stdout)
        .lines()
        .find_map(|l| {
            l.strip_prefix("created ")
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--load") {
        return load(&args);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    if args.iter().any(|a| a == "--external") {
        return rt.block_on(external(&args));
    }
    rt.block_on(bench(&args))
}

/// This example again in `--load` mode (the load generator), its stdout piped: `first` (such as
/// `--ca FILE`), then the transport, endpoint, token, seconds, threads and rate, in that order.
fn spawn_load(first: &[&str], values: &[&String; 6]) -> anyhow::Result<tokio::process::Child> {
    let names = [
        "--transport",
        "--endpoint",
        "--token",
        "--seconds",
        "--threads",
        "--rate",
    ];
    let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
    cmd.args(first).arg("--load");
    for (n, v) in names.iter().zip(values) {
        cmd.arg(n).arg(v);
    }
    Ok(cmd.stdout(std::process::Stdio::piped()).spawn()?)
}

/// The mean and the lowest of the per-second rates in the steady state: without the first and
/// the last second (ramp up, flush) when there are more than three.
fn steady_rate(rates: &[u64]) -> (f64, u64) {
    let steady = if rates.len() > 3 {
        &rates[1..rates.len() - 1]
    } else {
        rates
    };
    let mean = steady.iter().sum::<u64>() as f64 / steady.len().max(1) as f64;
    (mean, steady.iter().copied().min().unwrap_or(0))
}

/// `brownout_ingest_spans_total` as the server's `/metrics` shows it.
async fn scrape_spans(c: &reqwest::Client, url: &str) -> anyhow::Result<u64> {
    let text = c.get(url).send().await?.error_for_status()?.text().await?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix("brownout_ingest_spans_total ")
                .and_then(|v| v.trim().parse::<f64>().ok())
        })
        .map(|v| v as u64)
        .context("no brownout_ingest_spans_total in /metrics")
}

/// Load against a running server (`--external METRICS_URL --endpoint OTLP --token T`): the
/// accepted counter is sampled from its /metrics once a second; the caller counts the rows.
async fn external(args: &[String]) -> anyhow::Result<()> {
    let metrics = arg(args, "--external", "");
    let endpoint = arg(args, "--endpoint", "");
    let token = arg(args, "--token", "");
    let seconds = arg(args, "--seconds", "30");
    let threads = arg(args, "--threads", "2");
    let transport = arg(args, "--transport", "grpc");
    let rate = arg(args, "--rate", "0");
    let _ = rustls::crypto::ring::default_provider().install_default();
    anyhow::ensure!(
        !metrics.is_empty() && !endpoint.is_empty(),
        "--external needs a /metrics URL and --endpoint"
    );
    let c = reqwest::Client::new();
    let base = scrape_spans(&c, &metrics).await?;
    let child = spawn_load(
        &[],
        &[&transport, &endpoint, &token, &seconds, &threads, &rate],
    )?;
    let out = tokio::spawn(child.wait_with_output());
    println!(
        "external server {metrics} transport={transport} threads={threads} rate={rate} seconds={seconds}"
    );
    let t0 = Instant::now();
    let mut last = base;
    let mut rates = Vec::new();
    while !out.is_finished() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let n = scrape_spans(&c, &metrics).await.unwrap_or(last);
        rates.push(n - last);
        println!(
            "{:>5.0} {:>12} {:>10}",
            t0.elapsed().as_secs_f64(),
            n - base,
            n - last
        );
        last = n;
    }
    let output = out.await??;
    let load_secs = t0.elapsed().as_secs_f64();
    let created = created_spans(&output.stdout);
    let accepted = scrape_spans(&c, &metrics).await? - base;
    let (mean, min) = steady_rate(&rates);
    println!(
        "summary: external transport={transport} created={created} accepted={accepted} \
         sdk_dropped_or_failed={} load_s={load_secs:.1} mean_spans_per_s={mean:.0} min_spans_per_s={min}",
        created.saturating_sub(accepted)
    );
    Ok(())
}

/// The load generator (child process).
fn load(args: &[String]) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let transport = arg(args, "--transport", "grpc");
    let endpoint = arg(args, "--endpoint", "");
    let token = arg(args, "--token", "");
    let seconds: f64 = arg(args, "--seconds", "30").parse()?;
    let threads: usize = arg(args, "--threads", "2").parse()?;
    let rate: f64 = arg(args, "--rate", "0").parse()?; // spans/s over all threads; 0 = flat out
    // `--ca FILE`: the endpoint is https and its certificate is one of this CA's.
    let ca = match arg(args, "--ca", "").as_str() {
        "" => None,
        path => Some(std::fs::read(path).with_context(|| format!("--ca {path}"))?),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut handles = Vec::new();
    for t in 0..threads {
        let guard = rt.enter();
        let exporter = match transport.as_str() {
            "grpc" => {
                let mut md = tonic::metadata::MetadataMap::new();
                md.insert("authorization", format!("Bearer {token}").parse()?);
                let mut b = opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_endpoint(&endpoint)
                    .with_metadata(md);
                if let Some(ca) = &ca {
                    b = b.with_tls_config(
                        tonic::transport::ClientTlsConfig::new()
                            .ca_certificate(tonic::transport::Certificate::from_pem(ca))
                            .domain_name("localhost"),
                    );
                }
                b.build()?
            }
            _ => {
                let mut b = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_protocol(Protocol::HttpBinary)
                    .with_endpoint(format!("{endpoint}/v1/traces"))
                    .with_headers(
                        [("authorization".to_string(), format!("Bearer {token}"))].into(),
                    );
                if let Some(ca) = &ca {
                    // The SDK's own blocking reqwest client, trusting the bench's CA.
                    let client = std::thread::scope(|s| {
                        s.spawn(|| {
                            reqwest::blocking::Client::builder()
                                .add_root_certificate(reqwest::Certificate::from_pem(ca)?)
                                .timeout(Duration::from_secs(10))
                                .build()
                        })
                        .join()
                        .expect("client builder thread")
                    })?;
                    b = b.with_http_client(client);
                }
                b.build()?
            }
        };
        let bsp = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_max_queue_size(200_000)
                    .with_max_export_batch_size(4096)
                    .with_scheduled_delay(Duration::from_millis(50))
                    .build(),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(bsp)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name(format!("bench-{t}"))
                    .build(),
            )
            .build();
        drop(guard);
        let per_thread = rate / threads as f64;
        handles.push(std::thread::spawn(move || {
            let tracer = provider.tracer("ingest-bench");
            let start = Instant::now();
            let mut created: u64 = 0;
            let mut i: u64 = 0;
            while start.elapsed().as_secs_f64() < seconds {
                // One request: a server root span and 9 children; 1 % fail.
                let mut root = tracer
                    .span_builder("POST /v1/chat/completions")
                    .with_kind(SpanKind::Server)
                    .with_attributes([
                        KeyValue::new(
                            "feature",
                            if i.is_multiple_of(3) {
                                "pdf_analysis"
                            } else {
                                "basic_qa"
                            },
                        ),
                        KeyValue::new("criticality", "default"),
                    ])
                    .start(&tracer);
                let cx = opentelemetry::Context::current()
                    .with_remote_span_context(root.span_context().clone());
                for c in 0..9 {
                    let mut s = tracer.start_with_context(
                        ["tokenize", "retrieve", "prefill", "decode", "tool"][c % 5],
                        &cx,
                    );
                    s.set_attribute(KeyValue::new("step", c as i64));
                    s.end();
                }
                if i.is_multiple_of(100) {
                    root.set_status(Status::error(
                        "tool call to weather API timed out after 8000 ms",
                    ));
                }
                root.end();
                created += 10;
                i += 1;
                if per_thread > 0.0 {
                    let due = created as f64 / per_thread;
                    let now = start.elapsed().as_secs_f64();
                    if due > now {
                        std::thread::sleep(Duration::from_secs_f64(due - now));
                    }
                }
            }
            let _ = provider.force_flush();
            let _ = provider.shutdown();
            created
        }));
    }
    let created: u64 = handles.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    println!("created {created}");
    drop(rt);
    Ok(())
}

async fn bench(args: &[String]) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let store = arg(args, "--store", "sqlite");
    let seconds = arg(args, "--seconds", "30");
    let threads = arg(args, "--threads", "2");
    let transport = arg(args, "--transport", "grpc");
    let rate = arg(args, "--rate", "0");
    let dir = tempfile::tempdir()?;
    let mut config = Config::defaults();
    config.data_dir = dir.path().to_path_buf();
    // The product's group-commit delay (0) unless `--batch-delay-ms` says otherwise (before
    // acknowledgements waited for the commit, this bench used 200).
    if let Ok(ms) = arg(args, "--batch-delay-ms", "").parse::<u64>() {
        config.ingest.batch_max_delay = Duration::from_millis(ms);
    }
    // `--clickhouse-ack spool|insert`: when ClickHouse ingest is acknowledged (default: the
    // product's, `spool`).
    match arg(args, "--clickhouse-ack", "").as_str() {
        "" => {}
        "spool" => config.ingest.clickhouse_ack = brownout::config::ClickHouseAck::Spool,
        "insert" => config.ingest.clickhouse_ack = brownout::config::ClickHouseAck::Insert,
        other => anyhow::bail!("--clickhouse-ack {other:?}: spool or insert"),
    }
    // `--tls on`: the OTLP listeners speak TLS (`server.tls_*`) with a certificate for
    // localhost/127.0.0.1 from a CA made here, which the exporters trust (`--ca`).
    let tls = arg(args, "--tls", "off");
    let ca_file = dir.path().join("bench-ca.pem");
    match tls.as_str() {
        "off" => {}
        "on" => {
            let mut p = rcgen::CertificateParams::new(Vec::<String>::new())?;
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            p.distinguished_name
                .push(rcgen::DnType::CommonName, "ingest bench CA");
            let ca = rcgen::CertifiedIssuer::self_signed(p, rcgen::KeyPair::generate()?)?;
            let key = rcgen::KeyPair::generate()?;
            let leaf = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])?
                .signed_by(&key, &ca)?;
            let (cert_file, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
            std::fs::write(&cert_file, leaf.pem())?;
            std::fs::write(&key_file, key.serialize_pem())?;
            std::fs::write(&ca_file, ca.pem())?;
            let t = brownout_net::Tls::load(brownout_net::TlsFiles {
                cert: cert_file,
                key: key_file,
                client_ca: None,
            })?;
            config.tls = Some(brownout::config::ListenerTls {
                web: std::sync::Arc::clone(&t),
                ingest: t,
            });
        }
        other => anyhow::bail!("--tls {other:?}: on or off"),
    }
    let prefix = format!("bench{}_", uuid::Uuid::new_v4().simple());
    if store == "clickhouse" {
        let url =
            std::env::var("CLICKHOUSE_URL").context("--store clickhouse needs CLICKHOUSE_URL")?;
        config.clickhouse = Some(ClickHouseConfig {
            url,
            database: "default".into(),
            user: None,
            password: None,
            table_prefix: prefix.clone(),
            // bench/with-clickhouse-cluster.sh sets it: Distributed tables over its shards.
            cluster: std::env::var("CLICKHOUSE_CLUSTER")
                .ok()
                .filter(|c| !c.is_empty()),
            tls: None,
        });
    }
    let tokens = Tokens::random();
    let ingest_token = tokens
        .get(brownout::auth::Role::Ingest)
        .map(|s| s.expose().to_string())
        .unwrap_or_default();
    let mut app = App::build(config, tokens).await?;
    // `--sli on|off` (default on): count the SLIs of every batch into it, as `brownout serve`
    // does (docs/SLO.md "Stored SLI buckets"), for the example chat SLOs on each load thread's
    // service.
    let sli = arg(args, "--sli", "on");
    if sli == "on" {
        let n: usize = threads.parse().unwrap_or(2);
        let mut specs = Vec::new();
        for t in 0..n {
            let text = include_str!("slo/chat.yaml")
                .replace("service: chat", &format!("service: bench-{t}"))
                .replace("name: chat-", &format!("name: bench{t}-"));
            specs.extend(brownout::slo::spec::parse_str(&text, "chat.yaml")?);
        }
        app.set_sli_counter(std::sync::Arc::new(
            brownout::slo::persist::SliCounter::new(&specs),
        ));
    }
    let run = app.spawn(Listeners::loopback().await?, axum::Router::new());
    let state = run.state.clone();
    let scheme = if tls == "on" { "https" } else { "http" };
    let endpoint = if transport == "grpc" {
        format!("{scheme}://{}", run.otlp_grpc_addr)
    } else {
        format!("{scheme}://{}", run.otlp_http_addr)
    };

    let ca = ca_file.display().to_string();
    let tls_args: &[&str] = if tls == "on" { &["--ca", &ca] } else { &[] };
    let child = spawn_load(
        tls_args,
        &[
            &transport,
            &endpoint,
            &ingest_token,
            &seconds,
            &threads,
            &rate,
        ],
    )?;
    let child_pid = child.id().unwrap_or(0);
    let out = tokio::spawn(child.wait_with_output());

    println!(
        "store={store} transport={transport} tls={tls} threads={threads} rate={rate} seconds={seconds} sli={sli} batch_max_delay_ms={} clickhouse_ack={:?} (load pid {child_pid})",
        state.config.ingest.batch_max_delay.as_millis(),
        state.config.ingest.clickhouse_ack
    );
    println!(
        "{:>5} {:>12} {:>10} {:>9} {:>12}",
        "t_s", "accepted", "spans/s", "rss_MiB", "spool_bytes"
    );
    let t0 = Instant::now();
    let mut last = 0u64;
    let mut peak_rss = 0u64;
    let mut rates = Vec::new();
    let mut rss_series = Vec::new();
    while !out.is_finished() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let n = state.metrics.ingest.spans_total.get();
        let rss = rss_kib();
        peak_rss = peak_rss.max(rss);
        rates.push(n - last);
        rss_series.push(rss / 1024);
        println!(
            "{:>5.0} {:>12} {:>10} {:>9} {:>12}",
            t0.elapsed().as_secs_f64(),
            n,
            n - last,
            rss / 1024,
            state.metrics.ingest.spool_bytes.get()
        );
        last = n;
    }
    let output = out.await??;
    let load_secs = t0.elapsed().as_secs_f64();
    let created = created_spans(&output.stdout);
    let accepted = state.metrics.ingest.spans_total.get();
    // Wait for the writer to drain what it holds.
    let drain_start = Instant::now();
    loop {
        let s = *state.writer_status.borrow();
        if state.metrics.ingest.inflight_bytes.get() == 0 && s.spool_bytes == 0 {
            break;
        }
        if drain_start.elapsed() > Duration::from_secs(120) {
            println!("writer did not drain within 120 s");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drain_secs = drain_start.elapsed().as_secs_f64();
    let stored = state.store.count_rows().await?.spans;
    let store_handle = state.store.clone();
    drop(state);
    run.stop().await?;
    let (mean, min) = steady_rate(&rates);
    println!();
    println!(
        "summary: store={store} transport={transport} tls={tls} created={created} accepted={accepted} stored={stored} \
         sdk_dropped_or_failed={} lost_after_accept={} load_s={load_secs:.1} drain_s={drain_secs:.1} \
         mean_spans_per_s={mean:.0} min_spans_per_s={min} end_to_end_spans_per_s={:.0} peak_rss_mib={} rss_mib_series={rss_series:?}",
        created.saturating_sub(accepted),
        accepted.saturating_sub(stored),
        stored as f64 / (load_secs + drain_secs),
        peak_rss / 1024
    );
    if store == "clickhouse"
        && let Ok(ch) = std::env::var("CLICKHOUSE_URL")
    {
        let c = reqwest::Client::new();
        for t in ["spans", "logs", "failures", "snapshots", "docs"] {
            let _ = c
                .post(&ch)
                .body(format!("DROP TABLE IF EXISTS {prefix}{t}"))
                .send()
                .await;
        }
    }
    drop(store_handle);
    Ok(())
}
