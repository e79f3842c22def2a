//! What the control plane's benchmark examples (`ingest_bench`, `log_search_bench`) share:
//! reading `--name value` arguments.

/// The value after `name` in `args`, or `default` when `name` is not there.
pub fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| default.to_string())
}
