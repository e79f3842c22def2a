//! Logs off a terminal carry no colour codes: `gpu-agent` with stdout and stderr to pipes.

use brownout_test_support::pipes::{assert_no_escape_codes, output_until_a_log_line};

#[test]
fn gpu_agent_logs_without_colour_codes_to_a_pipe() {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-agent"));
    cmd.args([
        "--simulate-gpus",
        "1",
        "--listen",
        "127.0.0.1",
        "--port",
        "0",
    ]);
    cmd.env_remove("RUST_LOG").env_remove("NO_COLOR");
    assert_no_escape_codes("gpu-agent", &output_until_a_log_line(cmd));
}
