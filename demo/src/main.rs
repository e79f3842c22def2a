//! `brownout-demo`: the demo world and the overload benchmark. Thin: parse the CLI, dispatch,
//! report errors.

use clap::{Parser, Subcommand};

/// brownout's whole loop in one process: control plane, two serving engines on the CPU, two
/// gpu-agents with simulated GPUs, and an evening-peak load.
#[derive(Debug, Parser)]
#[command(name = "brownout-demo", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the whole loop in one process on embedded defaults.
    Demo(brownout_demo::DemoArgs),
    /// Benchmarks (overload: the control loop on vs off).
    Bench(brownout_demo::BenchArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    brownout::logging::init();
    brownout::entry::block_on(async move {
        match cli.cmd {
            Cmd::Demo(a) => brownout_demo::run(a).await,
            Cmd::Bench(a) => brownout_demo::bench(a).await,
        }
    })
}
