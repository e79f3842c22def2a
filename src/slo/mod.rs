//! SLO specs, error budgets, multi-window burn rates, Prometheus rule generation.

/// Command-line arguments of `brownout slo`.
#[derive(Debug, clap::Args)]
pub struct SloArgs {}

/// Runs `brownout slo`.
///
/// # Errors
/// Always, until this component lands.
pub async fn run(_args: SloArgs) -> anyhow::Result<()> {
    anyhow::bail!("brownout slo: not implemented yet")
}
