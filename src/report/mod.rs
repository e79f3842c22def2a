//! Weekly stability roadmap report.

/// Command-line arguments of `brownout report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {}

/// Runs `brownout report`.
///
/// # Errors
/// Always, until this component lands.
pub async fn run(_args: ReportArgs) -> anyhow::Result<()> {
    anyhow::bail!("brownout report: not implemented yet")
}
