//! `brownout-serve`: the bundled serving tier (paged KV, continuous batching, a real model,
//! OpenAI-compatible API on :8000, obeys degradation commands from Redis). Thin: parse the CLI,
//! dispatch; the composition root is `brownout_serving::serve`, the benchmarks
//! `brownout_serving::serve::bench`.
//!
//! ```text
//! brownout-serve [--model tiny-random|smollm2|toy|PATH] [--port 8000] [--device auto|cpu|cuda] ...
//! brownout-serve bench kv|model|gate|upstream
//! brownout-serve --upstream http://vllm:8000 [--upstream fallback=URL] [--upstream-model ROUTE=NAME]
//!                                the gate and commands in front of any OpenAI-compatible engine
//! brownout-serve fetch-model     download SmolLM2-135M-Instruct into the local model cache
//! ```
//!
//! SIGTERM or SIGINT drains gracefully (`--shutdown-grace-secs`) and exits 0.

use anyhow::Context;
use brownout_serving::serve::{self, ServeArgs, bench::BenchWhat};
use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "brownout-serve",
    version,
    about = "brownout's serving tier",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchWhat,
    },
    /// Fetches SmolLM2-135M-Instruct (GGUF) into the local model cache.
    FetchModel,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Some(Cmd::Bench { what }) => serve::bench::run(what),
        Some(Cmd::FetchModel) => {
            let path = brownout_serving::model::fetch_model()?;
            println!("{}", path.display());
            Ok(())
        }
        None => {
            // Logs to stderr, colour only on a terminal (as the control plane's logging::init).
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "info".into()),
                )
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_writer(std::io::stderr)
                .init();
            let rt = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("tokio runtime")?;
            let r = rt.block_on(async {
                reload_keys_on_sighup();
                serve::run(cli.serve, brownout_net::shutdown_signal()).await
            });
            // Whatever still runs on the runtime (a probe, a reconnect) is not waited for.
            rt.shutdown_timeout(std::time::Duration::from_secs(1));
            r
        }
    }
}

/// SIGHUP: read the command public-key file (`BROWNOUT_COMMAND_PUBKEY_FILE`) again at the next
/// command, without waiting for the once-a-second change check (docs/SECURITY.md).
fn reload_keys_on_sighup() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::hangup()) {
        Ok(mut hup) => {
            tokio::spawn(async move {
                while hup.recv().await.is_some() {
                    brownout_protocol::command_keys::request_key_reload();
                    tracing::info!("SIGHUP: the command public keys are read again");
                }
            });
        }
        Err(e) => tracing::warn!(error = %e, "no SIGHUP handler: key files reload on change only"),
    }
}
