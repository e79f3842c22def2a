//! What the `main`s of `brownout` and `brownout-demo` share: the async runtime and the exit
//! status (errors printed as `error: …` with their causes, exit code 1).

use std::future::Future;
use std::process::ExitCode;

/// Runs `fut` on a multi-threaded runtime and turns its result into the exit status.
pub fn block_on(fut: impl Future<Output = anyhow::Result<()>>) -> ExitCode {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => exit(rt.block_on(fut)),
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The exit status of a command's result.
pub fn exit(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
