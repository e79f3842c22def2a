//! Logs off a terminal carry no colour codes: `brownout-serve` with stdout and stderr to pipes.

use brownout_test_support::pipes::{assert_no_escape_codes, output_until_a_log_line};

#[test]
fn brownout_serve_logs_without_colour_codes_to_a_pipe() {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_brownout-serve"));
    cmd.args(["--model", "toy", "--host", "127.0.0.1", "--port", "0"]);
    cmd.env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .env_remove("REDIS_URL");
    assert_no_escape_codes("brownout-serve", &output_until_a_log_line(cmd));
}
