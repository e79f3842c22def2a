//! Failure-pattern mining (template miner) and clustering (linfa).

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
