//! Logs off a terminal carry no colour codes: `brownout-demo demo` with stdout and stderr to
//! pipes (the control plane's `logging::init`).

use brownout_test_support::pipes::{assert_no_escape_codes, output_until_a_log_line};

#[test]
fn brownout_demo_logs_without_colour_codes_to_a_pipe() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_brownout-demo"));
    cmd.args([
        "demo",
        "--no-load",
        "--model",
        "tiny-random",
        "--duration",
        "20",
        "--port",
    ])
    .arg(port.to_string());
    cmd.env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .env_remove("REDIS_URL");
    assert_no_escape_codes("brownout-demo", &output_until_a_log_line(cmd));
}
