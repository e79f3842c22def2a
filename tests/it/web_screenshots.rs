//! Takes the screenshots in `docs/screenshots/` (headless Chromium against the UI on
//! `SampleDataSource`). Ignored by default because it rewrites committed files; run it with
//! `scripts/screenshots.sh` (or `cargo test -p brownout --test it web_screenshots:: -- --ignored`).

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use brownout::web;
use brownout_test_support::ui::SampleDataSource;

const PAGES: &[(&str, &str)] = &[
    ("overview", "/"),
    ("hosts", "/hosts"),
    ("host", "/hosts/gpu-a100-01"),
    ("service", "/services/chat-gateway"),
    (
        "instance-logs",
        "/services/chat-gateway/instances/chat-gateway-7f9c-0",
    ),
    ("patterns", "/patterns"),
    ("slos", "/slos"),
    ("degradation", "/degradation"),
    ("debug-resource", "/debug/resource"),
    ("logs", "/logs?severity=warn"),
    ("trace", "/traces/0af7651916cd43dd8448eb211c80319c"),
];

#[test]
#[ignore = "rewrites docs/screenshots; run scripts/screenshots.sh"]
fn take_screenshots() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind loopback");
    let addr = listener.local_addr().expect("addr");
    let source = Arc::new(SampleDataSource::new(brownout_protocol::now_ms()));
    rt.spawn(async move { axum::serve(listener, web::router(source)).await });

    let out_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/screenshots");
    std::fs::create_dir_all(&out_dir).expect("create docs/screenshots");
    for (name, path) in PAGES {
        let profile = tempfile::tempdir().expect("temp profile");
        let file = out_dir.join(format!("{name}.png"));
        let status = Command::new("timeout")
            .arg("60")
            .arg("/usr/bin/chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--hide-scrollbars",
                "--window-size=1400,1000",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(format!("--screenshot={}", file.display()))
            .arg(format!("http://{addr}{path}"))
            .output()
            .expect("run chromium (apt-get install chromium; scripts/test.sh installs it)");
        assert!(
            status.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&status.stderr)
        );
        let len = std::fs::metadata(&file).expect("screenshot written").len();
        assert!(
            len > 10_000,
            "{name}: screenshot suspiciously small ({len} bytes)"
        );
    }
}
