//! `brownout-serve bench model` end to end: the real binary on the tiny random model, its JSON
//! report, its progress lines, and a clear error for bad arguments.

use std::process::Command;

fn serve() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_brownout-serve"));
    c.env("RUST_BACKTRACE", "0");
    c
}

#[test]
fn bench_model_reports_every_route_and_batch_as_json_with_progress() {
    let out = serve()
        .args([
            "bench",
            "model",
            "--model",
            "tiny-random",
            "--device",
            "cpu",
            "--steps",
            "8",
            "--batches",
            "1,3",
            "--ttft-prompt",
            "12",
            "--capacity-secs",
            "2",
            "--json",
        ])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // Progress: load, device, both health checks, each of the 8 rounds, both TTFTs.
    assert!(
        stderr.contains("[bench model] loaded tiny-random"),
        "{stderr}"
    );
    assert!(stderr.contains("health check primary") && stderr.contains("health check fallback"));
    assert_eq!(stderr.matches("decode round ").count(), 8, "{stderr}");
    assert!(stderr.contains("decode round 8/8"));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert_eq!(report["model"], "tiny-random");
    assert!(report["device"].as_str().unwrap().starts_with("cpu"));
    let rows = report["rows"].as_array().unwrap();
    let value = |route: &str, what: &str| {
        rows.iter()
            .find(|r| r["route"] == route && r["what"] == what)
            .and_then(|r| r["value"].as_f64())
            .unwrap_or_else(|| panic!("no row {route} / {what} in {rows:?}"))
    };
    for route in ["primary", "fallback"] {
        for what in ["decode batch 1", "decode batch 3", "TTFT 12-token prompt"] {
            assert!(value(route, what) > 0.0, "{route} {what}");
        }
        let ratio = value(
            route,
            "decode batch 3 / batch 1 (median of 8 paired rounds)",
        );
        assert!(ratio.is_finite() && ratio > 0.0);
    }
    assert!(
        value(
            "fallback",
            "decode batch 1 / primary batch 1 (median of 8 paired rounds)"
        ) > 0.0
    );
    assert!(value("both", "resident memory (RSS) loaded and health-checked") > 0.0);
    // T2's effect at every batch size, and the capacity per route through the real engine.
    assert!(
        value(
            "fallback",
            "decode batch 3 / primary batch 3 (median of 8 paired rounds)"
        ) > 0.0
    );
    for route in ["primary", "fallback"] {
        let calls = value(
            route,
            "capacity, 16 calls in flight, max_tokens 24 (calls/s)",
        );
        let flows = value(route, "capacity, flows/s (2.15 calls per flow)");
        assert!(calls > 0.0, "{route}: no call completed");
        assert!(
            (flows - calls / 2.15).abs() < 1e-9,
            "{route}: {flows} vs {calls}"
        );
    }
    assert!(
        value(
            "fallback",
            "capacity / primary capacity (median of 3 paired slices)"
        ) > 0.0
    );
    assert_eq!(stderr.matches("capacity slice ").count(), 6, "{stderr}");
}

#[test]
fn bench_model_refuses_bad_arguments_with_a_reason() {
    for (args, want) in [
        (vec!["--batches", "1,0"], "batch sizes of at least 1"),
        (
            vec!["--routes", "primary,bogus"],
            "--routes takes primary and fallback",
        ),
        (vec!["--device", "tpu"], "tpu"),
        (vec!["--model", "/nonexistent.gguf"], "nonexistent"),
    ] {
        // Every case names the model once: tiny-random unless the case is about the model.
        let model = if args[0] == "--model" {
            vec![]
        } else {
            vec!["--model", "tiny-random"]
        };
        let out = serve()
            .args(["bench", "model", "--steps", "2"])
            .args(&model)
            .args(&args)
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: no report on failure");
    }
}
