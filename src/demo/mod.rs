//! `brownout demo`: the whole loop in one process on embedded defaults.

/// Command-line arguments of `brownout demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {}

/// Runs `brownout demo`.
///
/// # Errors
/// Always, until this component lands.
pub async fn run(_args: DemoArgs) -> anyhow::Result<()> {
    anyhow::bail!("brownout demo: not implemented yet")
}
