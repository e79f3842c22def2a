//! `brownout serve`: the control plane process.

/// Command-line arguments of `brownout serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// TOML config file (see examples/brownout.toml).
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
}

/// Runs the control plane until shutdown.
///
/// # Errors
/// Always, until the ingest issue lands.
pub async fn run(_args: ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("brownout serve: not implemented yet")
}
