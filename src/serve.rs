//! `brownout serve`: load the config, start the control plane, wait for Ctrl-C or SIGTERM, stop.
//! Everything is built in one place, [`crate::plane::Plane::from_config`].

use crate::config::Config;

/// Command-line arguments of `brownout serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// TOML config file (see examples/brownout.toml and docs/CONFIG.md).
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
}

/// Runs the control plane until Ctrl-C / SIGTERM, then stops it gracefully.
///
/// # Errors
/// Bad config (file, field, reason), missing tokens or command key, unavailable store, taken
/// ports.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let config = Config::load(args.config.as_deref())?;
    let overlap = config.token_overlap;
    let key_overlap = crate::plane::key_reload::overlap_from_env()?;
    let plane = crate::plane::Plane::from_config(config.clone()).await?;
    let key_reload = crate::plane::key_reload::spawn(
        plane.degrade.clone(),
        config,
        key_overlap,
        std::time::Duration::from_secs(1),
    );
    let reload = crate::auth::reload::spawn(
        plane.running.state.tokens.clone(),
        args.config.clone(),
        overlap,
        std::time::Duration::from_secs(1),
    );
    shutdown_signal().await;
    reload.abort();
    key_reload.abort();
    plane.stop().await
}

/// Resolves on Ctrl-C or SIGTERM (the shared helper of every brownout binary).
pub async fn shutdown_signal() {
    brownout_net::shutdown_signal().await;
}
