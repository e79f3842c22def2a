//! Logs off a terminal carry no colour codes: `brownout serve` with stdout and stderr to pipes
//! (the control plane's `logging::init`).

use brownout_test_support::pipes::{assert_no_escape_codes, output_until_a_log_line};

#[test]
fn brownout_serve_subcommand_logs_without_colour_codes_to_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("brownout.toml");
    let port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    std::fs::write(
        &cfg,
        format!(
            "[server]\nhttp_addr = \"127.0.0.1:{}\"\notlp_http_addr = \"127.0.0.1:{}\"\notlp_grpc_addr = \"127.0.0.1:{}\"\n",
            port(),
            port(),
            port()
        ),
    )
    .unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_brownout"));
    cmd.arg("serve").arg("--config").arg(&cfg);
    cmd.env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .env_remove("REDIS_URL")
        .env_remove("CLICKHOUSE_URL")
        .env("BROWNOUT_DATA_DIR", dir.path().join("data"))
        .env("BROWNOUT_INGEST_TOKEN", "no-ansi-ingest-token-0123456789")
        .env("BROWNOUT_READ_TOKEN", "no-ansi-read-token-0123456789")
        .env("BROWNOUT_ADMIN_TOKEN", "no-ansi-admin-token-0123456789")
        .env("BROWNOUT_COMMAND_KEY", "no-ansi-command-key-0123456789");
    assert_no_escape_codes("brownout serve", &output_until_a_log_line(cmd));
}
