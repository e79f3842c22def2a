//! SIGTERM (what Kubernetes sends on a rollout or a node drain) stops the real `gpu-agent`
//! gracefully: its exporter answers until the end, and it exits 0.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use brownout_test_support::free_port;

#[test]
fn sigterm_stops_the_agent_with_exit_0() {
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpu-agent"))
        .args(["--simulate-gpus", "1", "--listen", "127.0.0.1"])
        .args(["--port", &port.to_string(), "--interval-ms", "100"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("gpu-agent starts");
    let url = format!("127.0.0.1:{port}");
    let start = Instant::now();
    // The exporter answers (a raw HTTP/1.0 GET of /metrics).
    loop {
        use std::io::{Read, Write};
        if let Ok(mut c) = std::net::TcpStream::connect(&url) {
            let _ = c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
            let mut out = String::new();
            let _ = c.read_to_string(&mut out);
            if out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200") {
                break;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the exporter never answered"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("gpu-agent still running 20 s after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit status {status}");
}
