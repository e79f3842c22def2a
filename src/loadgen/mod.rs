//! Open-loop load generator with task flows, criticality mix and retry storms.

/// Command-line arguments of `brownout loadgen`.
#[derive(Debug, clap::Args)]
pub struct LoadgenArgs {}

/// Runs `brownout loadgen`.
///
/// # Errors
/// Always, until this component lands.
pub async fn run(_args: LoadgenArgs) -> anyhow::Result<()> {
    anyhow::bail!("brownout loadgen: not implemented yet")
}
