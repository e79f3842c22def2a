//! Failure-pattern mining (template miner) and clustering (linfa).
//!
//! - [`mask`]: header stripping and variable masking of one raw line (pure).
//! - [`miner`]: the online template miner with stable ids, persistence and bounded memory (pure).

pub mod cluster;
pub mod engine;
pub mod mask;
pub mod miner;

pub use miner::{MinerConfig, MinerState, MinerStateStore, TemplateId, TemplateMiner};

/// Command-line arguments of `brownout patterns`.
#[derive(Debug, clap::Args)]
pub struct PatternsArgs {}

/// Runs `brownout patterns`.
///
/// # Errors
/// Always, until this component lands.
pub async fn run(_args: PatternsArgs) -> anyhow::Result<()> {
    anyhow::bail!("brownout patterns: not implemented yet")
}
