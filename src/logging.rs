//! Log set-up shared by the binaries that link the control plane: `RUST_LOG` (default `info`)
//! to stderr, without colour codes unless stderr is a terminal.

use std::io::IsTerminal as _;

/// Installs the global `tracing` subscriber. Call once, first thing in `main`.
pub fn init() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}
