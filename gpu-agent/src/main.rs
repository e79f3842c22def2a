//! `gpu-agent`: parse the command line, build the config, run until Ctrl-C / SIGTERM.

mod bench;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::Context as _;
use brownout_gpu_agent::AgentConfig;
use brownout_gpu_agent::config::{default_host, parse_control_plane, parse_engine};
use clap::{Args, Parser, Subcommand};

/// brownout's GPU node agent: NVML (or simulated GPUs) + engine scrape, a DCGM-compatible
/// exporter, and snapshots to the control plane. The push token comes from
/// BROWNOUT_INGEST_TOKEN.
#[derive(Debug, Parser)]
#[command(name = "gpu-agent", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Exporter port (the DCGM exporter's).
    #[arg(long, default_value_t = 9400)]
    port: u16,
    /// Exporter bind address.
    #[arg(long, default_value = "0.0.0.0")]
    listen: IpAddr,
    /// A serving engine to scrape: URL or ID=URL (repeatable), e.g. http://127.0.0.1:8000.
    #[arg(long = "engine", value_name = "URL")]
    engines: Vec<String>,
    /// Control-plane base URL; snapshots go to <URL>/v1/agents/snapshot.
    #[arg(long, value_name = "URL")]
    control_plane: Option<String>,
    /// Simulate N GPUs (labelled simulated="true") instead of reading NVML.
    #[arg(long, value_name = "N")]
    simulate_gpus: Option<u32>,
    /// Cycle interval.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Host name for the Hostname label and snapshots (default: this machine's).
    #[arg(long)]
    host: Option<String>,
    /// Snapshots kept while the control plane is unreachable.
    #[arg(long, default_value_t = 60)]
    queue_capacity: usize,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure the agent's CPU time per cycle against local fixture engines.
    Bench {
        #[arg(long, default_value_t = 8)]
        gpus: u32,
        #[arg(long, default_value_t = 4)]
        engines: usize,
        #[arg(long, default_value_t = 200)]
        cycles: u64,
        #[arg(long, default_value_t = 100)]
        interval_ms: u64,
        #[arg(long, default_value_t = 10)]
        warmup: u64,
    },
    /// Internal: the fixture servers `bench` runs in a child process.
    #[command(hide = true)]
    BenchFixtures {
        #[arg(long, default_value_t = 4)]
        engines: usize,
        #[arg(long)]
        scrape_url: Option<String>,
        #[arg(long, default_value_t = 1000)]
        scrape_interval_ms: u64,
    },
}

fn config_from(args: RunArgs) -> anyhow::Result<AgentConfig> {
    let mut cfg = AgentConfig::new(args.host.unwrap_or_else(default_host));
    cfg.listen = Some(SocketAddr::new(args.listen, args.port));
    cfg.interval = Duration::from_millis(args.interval_ms);
    cfg.scrape_timeout = cfg
        .scrape_timeout
        .min(cfg.interval.mul_f64(0.8))
        .max(Duration::from_millis(5));
    cfg.queue_capacity = args.queue_capacity;
    cfg.engines = args
        .engines
        .iter()
        .enumerate()
        .map(|(i, s)| parse_engine(s, i))
        .collect::<Result<_, _>>()?;
    cfg.control_plane = args
        .control_plane
        .as_deref()
        .map(parse_control_plane)
        .transpose()?;
    cfg.ingest_token = std::env::var("BROWNOUT_INGEST_TOKEN")
        .ok()
        .filter(|t| !t.is_empty());
    if let Some(n) = args.simulate_gpus {
        cfg = cfg.with_simulated_gpus(n);
    }
    cfg.validate()?;
    Ok(cfg)
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutting down");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let quiet = matches!(
        cli.command,
        Some(Command::BenchFixtures { .. }) | Some(Command::Bench { .. })
    );
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| if quiet { "error".into() } else { "info".into() }),
        )
        // Colour only on a terminal (as the control plane's logging::init).
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        None => {
            let cfg = config_from(cli.run).context("bad command line")?;
            brownout_gpu_agent::run(cfg, None, shutdown_signal()).await
        }
        Some(Command::Bench {
            gpus,
            engines,
            cycles,
            interval_ms,
            warmup,
        }) => {
            let r = bench::run_bench(
                gpus,
                engines,
                Duration::from_millis(interval_ms),
                cycles,
                warmup,
            )
            .await?;
            println!("{}", serde_json::to_string_pretty(&r)?);
            Ok(())
        }
        Some(Command::BenchFixtures {
            engines,
            scrape_url,
            scrape_interval_ms,
        }) => {
            bench::fixtures_main(
                engines,
                scrape_url,
                Duration::from_millis(scrape_interval_ms),
            )
            .await
        }
    }
}
