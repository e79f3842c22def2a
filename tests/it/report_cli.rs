//! `brownout report` through the real binary: from a WeekData file, from synthetic data, and a
//! bad input file that names itself.

use std::process::Command;

fn report(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_brownout"))
        .arg("report")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn json_roadmap_from_a_week_file() {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/report_golden/week.json");
    let out = report(&["--week", "2026-W48", "--format", "json", "--data", data]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let items = v["roadmap"].as_array().unwrap();
    assert_eq!(items.len(), 3);
    assert_eq!(items[0]["playbook_id"], "kv-overflow");
    assert!(items[0]["expected_budget_win_back"].as_f64().unwrap() > 0.0);
}

#[test]
fn synthetic_week_renders_markdown_with_every_section() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("w48.md");
    let out = report(&[
        "--week",
        "2026-W48",
        "--synth",
        "--format",
        "md",
        "--out",
        file.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let md = std::fs::read_to_string(&file).unwrap();
    for h in [
        "## The week in a paragraph",
        "## Top failure patterns",
        "## New patterns",
        "## Degradation timeline",
        "## Roadmap",
        "### 1. ",
    ] {
        assert!(md.contains(h), "{h} missing");
    }
}

#[test]
fn bad_inputs_fail_with_a_message_naming_them() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"week\": 5}").unwrap();
    let out = report(&["--week", "2026-W48", "--data", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.json"));
    let out = report(&["--week", "2026-W99"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("2026-W99"));
}
