//! The HTML report in a real browser: headless Chromium loads it (no network, no external
//! assets) and the DOM it builds has every section and both charts.

use brownout::report::{Format, Playbook, build, render};

#[test]
fn headless_chromium_renders_every_section() {
    let data = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/report_golden/week.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let html = render(&build(&data, &Playbook::bundled()), Format::Html).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("report.html");
    std::fs::write(&file, &html).unwrap();
    let bin = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|b| {
            std::process::Command::new(b)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .expect("chromium is not installed: apt-get install -y chromium (scripts/test.sh does)");
    let out = std::process::Command::new(bin)
        .args(["--headless", "--no-sandbox", "--disable-gpu"])
        .arg(format!(
            "--user-data-dir={}",
            dir.path().join("profile").display()
        ))
        .arg("--dump-dom")
        .arg(format!("file://{}", file.display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for id in [
        "summary",
        "burn-chart",
        "top-patterns",
        "trend-chart",
        "new-patterns",
        "timeline",
        "roadmap",
    ] {
        assert!(
            dom.contains(&format!("id=\"{id}\"")),
            "section {id} missing from the rendered DOM"
        );
    }
    assert!(
        dom.contains("<svg") && dom.contains("<polyline"),
        "charts are inline SVG"
    );
    assert!(!dom.contains("<script>alert"), "no injected script element");
    assert!(
        !html.contains("http://") || !html.contains("src=\"http"),
        "no external assets"
    );
}
