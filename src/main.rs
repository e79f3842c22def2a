//! `brownout`: the control plane binary. Thin: parse the CLI, dispatch, report errors.

use clap::{Parser, Subcommand};

/// SLO control plane for LLM and AI-agent serving: observe, mine failures, burn budgets,
/// degrade on purpose.
#[derive(Debug, Parser)]
#[command(name = "brownout", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the control plane (HTTP :8080, OTLP :4317/:4318).
    Serve(brownout::serve::ServeArgs),
    /// Run the whole loop in one process on embedded defaults.
    Demo(brownout::demo::DemoArgs),
    /// Mine templates and cluster failure patterns from log files.
    Patterns(brownout::patterns::PatternsArgs),
    /// SLO tools: generate Prometheus rules, evaluate budgets.
    Slo(brownout::slo::SloArgs),
    /// Write the weekly stability roadmap report.
    Report(brownout::report::ReportArgs),
    /// Drive an OpenAI-compatible endpoint with realistic agent traffic.
    Loadgen(brownout::loadgen::LoadgenArgs),
    /// Benchmarks (overload: the control loop on vs off).
    Bench(brownout::demo::BenchArgs),
    /// Fault drills against a running deployment (engine-kill, redis-restart, clickhouse-kill,
    /// leader-kill).
    Drill(brownout::drill::DrillArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    // `patterns` needs no async runtime; starting one (a thread per core) would dominate a
    // short `patterns mine` run.
    let cli = match cli.cmd {
        Cmd::Patterns(a) => return exit(brownout::patterns::run_blocking(a)),
        cmd => Cli { cmd },
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async move {
        match cli.cmd {
            Cmd::Serve(a) => brownout::serve::run(a).await,
            Cmd::Demo(a) => brownout::demo::run(a).await,
            Cmd::Patterns(a) => brownout::patterns::run(a).await,
            Cmd::Slo(a) => brownout::slo::run(a).await,
            Cmd::Report(a) => brownout::report::run(a).await,
            Cmd::Loadgen(a) => brownout::loadgen::run(a).await,
            Cmd::Bench(a) => brownout::demo::bench(a).await,
            Cmd::Drill(a) => brownout::drill::run(a).await,
        }
    });
    exit(result)
}

fn exit(result: anyhow::Result<()>) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
