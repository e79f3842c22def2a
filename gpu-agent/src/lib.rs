//! brownout's GPU node agent: one per GPU host.
//!
//! Every interval (1 s) the agent scrapes the serving engines on the host ([`engine`]: the
//! bundled tier's `/metrics` and `/debug/kv`, any vLLM server's `/metrics`), samples the GPUs
//! ([`probe`]: NVML, or a simulated probe labelled `simulated="true"`), exports both on `:9400`
//! with the DCGM exporter's names ([`exporter`]) and pushes an [`brownout_protocol::AgentSnapshot`]
//! to the control plane ([`push`], bounded queue, backoff with jitter). [`agent`] wires the
//! parts; [`config`] holds the typed configuration.
//!
//! In-process use (`brownout-demo`):
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use brownout_gpu_agent::{Agent, AgentConfig, config::parse_engine};
//! let mut cfg = AgentConfig::new("demo-gpu-0").with_simulated_gpus(2);
//! cfg.listen = None; // no exporter port; read it through the handle
//! cfg.engines.push(parse_engine("engine-0=http://127.0.0.1:8000", 0)?);
//! let agent = Agent::new(cfg)?;
//! let handle = agent.handle();
//! let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
//! let task = tokio::spawn(agent.run(None, async { let _ = stop_rx.await; }));
//! // ... handle.latest_snapshot(), handle.subscribe(), handle.render_metrics()
//! let _ = stop_tx.send(());
//! task.await??;
//! # Ok(()) }
//! ```

pub mod agent;
pub mod config;
pub mod cycle;
pub mod engine;
pub mod exporter;
pub mod probe;
pub mod push;

use std::future::Future;

pub use agent::{Agent, AgentError, AgentHandle, CycleReport, ensure_crypto_provider};
pub use config::AgentConfig;
pub use engine::EngineTarget;

/// Builds an agent from `config` and runs it until `shutdown` completes (see [`Agent::run`]).
/// Use [`Agent::new`] + [`Agent::handle`] + [`Agent::run`] to also read snapshots in-process.
///
/// # Errors
/// A bad config, an exporter address that cannot be bound, or a failed exporter server.
pub async fn run(
    config: AgentConfig,
    listener: Option<tokio::net::TcpListener>,
    shutdown: impl Future<Output = ()> + Send,
) -> anyhow::Result<()> {
    Agent::new(config)?.run(listener, shutdown).await?;
    Ok(())
}
