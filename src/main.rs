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
    /// Moved: the demo world is `brownout-demo demo` (it links the serving tier).
    #[command(hide = true)]
    Demo(Moved),
    /// Mine templates and cluster failure patterns from log files.
    Patterns(brownout::patterns::PatternsArgs),
    /// SLO tools: generate Prometheus rules, evaluate budgets.
    Slo(brownout::slo::SloArgs),
    /// Write the weekly stability roadmap report.
    Report(brownout::report::ReportArgs),
    /// Drive an OpenAI-compatible endpoint with realistic agent traffic.
    Loadgen(brownout::loadgen::LoadgenArgs),
    /// Moved: the overload benchmark is `brownout-demo bench overload`.
    #[command(hide = true)]
    Bench(Moved),
    /// Fault drills against a running deployment (engine-kill, redis-restart, clickhouse-kill,
    /// leader-kill, plane-kill).
    Drill(brownout::drill::DrillArgs),
    /// The command-signing key pair and the engines' ack keys (docs/SECURITY.md).
    Keys(brownout::keys_cli::KeysArgs),
}

/// The arguments of a command that moved to `brownout-demo`, taken as they are.
#[derive(Debug, clap::Args)]
struct Moved {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    _args: Vec<String>,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    brownout::logging::init();
    // `patterns` needs no async runtime; starting one (a thread per core) would dominate a
    // short `patterns mine` run.
    let cli = match cli.cmd {
        Cmd::Patterns(a) => return brownout::entry::exit(brownout::patterns::run_blocking(a)),
        Cmd::Keys(a) => return brownout::entry::exit(brownout::keys_cli::run(&a)),
        cmd => Cli { cmd },
    };
    brownout::entry::block_on(async move {
        match cli.cmd {
            Cmd::Serve(a) => brownout::serve::run(a).await,
            Cmd::Patterns(a) => brownout::patterns::run(a).await,
            Cmd::Slo(a) => brownout::slo::run(a).await,
            Cmd::Report(a) => brownout::report::run(a).await,
            Cmd::Loadgen(a) => brownout::loadgen::run(a).await,
            Cmd::Drill(a) => brownout::drill::run(a).await,
            Cmd::Keys(_) => unreachable!("run before the runtime starts"),
            Cmd::Demo(_) => Err(anyhow::anyhow!(
                "`brownout demo` moved to its own binary: run `brownout-demo demo` \
                 (from the repository: cargo run --release -p brownout-demo -- demo)"
            )),
            Cmd::Bench(_) => Err(anyhow::anyhow!(
                "`brownout bench` moved to its own binary: run `brownout-demo bench overload` \
                 (from the repository: cargo run --release -p brownout-demo -- bench overload)"
            )),
        }
    })
}
