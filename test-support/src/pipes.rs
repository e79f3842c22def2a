//! Runs a binary with its output to pipes (not a terminal), for the tests that check its logs
//! carry no colour codes there.

/// Runs `cmd` with stdout and stderr to pipes (not a terminal) until one of them carries a log
/// line at INFO level or above, then kills it. Returns everything it wrote by then.
pub fn output_until_a_log_line(mut cmd: std::process::Command) -> Vec<u8> {
    use std::io::Read as _;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the binary");
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let mut readers = Vec::new();
    for mut pipe in [
        Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
        Box::new(child.stderr.take().unwrap()),
    ] {
        let tx = tx.clone();
        readers.push(std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        }));
    }
    drop(tx);
    let mut out = Vec::new();
    let limit = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while std::time::Instant::now() < limit {
        match rx.recv_timeout(std::time::Duration::from_millis(200)) {
            Ok(chunk) => out.extend(chunk),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
        let text = String::from_utf8_lossy(&out);
        if ["INFO", "WARN", "ERROR"].iter().any(|l| text.contains(l)) {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    for r in readers {
        let _ = r.join();
    }
    while let Ok(chunk) = rx.try_recv() {
        out.extend(chunk);
    }
    let text = String::from_utf8_lossy(&out);
    assert!(
        ["INFO", "WARN", "ERROR"].iter().any(|l| text.contains(l)),
        "the binary wrote no log line:\n{text}"
    );
    out
}

pub fn assert_no_escape_codes(name: &str, out: &[u8]) {
    assert!(
        !out.contains(&0x1b),
        "{name} wrote ANSI escape codes to a pipe:\n{}",
        String::from_utf8_lossy(out).escape_debug()
    );
}
