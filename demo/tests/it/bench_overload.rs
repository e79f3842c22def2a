//! `brownout-demo bench overload` end to end: the real binary, the tiny model, tiny phases.
//! It asserts the output's shape and that the three configurations ran — never the figures
//! (they are measured in docs/BENCHMARKS.md, not asserted).

use std::process::Command;

use serde_json::Value;

#[test]
fn bench_overload_runs_three_configurations_and_prints_one_json_line() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_brownout-demo"))
        .args([
            "bench",
            "overload",
            "--model",
            "tiny-random",
            "--warmup-secs",
            "2",
            "--ramp-secs",
            "1",
            "--hold-secs",
            "3",
            "--recovery-secs",
            "2",
            "--calibrate-secs",
            "6",
            "--settle-secs",
            "2",
            "--out",
        ])
        .arg(out_dir.path())
        .env("RUST_LOG", "warn")
        .output()
        .expect("running brownout-demo");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "exit {:?}\n{stderr}", out.status);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last = stdout.lines().last().expect("a JSON line on stdout");
    let v: Value = serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {last}"));
    let obj = v.as_object().unwrap();
    let mut keys: Vec<_> = obj.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["baseline", "loop_off", "loop_on"]);
    for (name, part) in obj {
        for k in [
            "flow_goodput_per_s",
            "capacity_flows_per_s",
            "critical_flow_success_rate",
            "default_flow_success_rate",
            "sheddable_flow_success_rate",
            "wasted_tokens",
            "flaps",
            "tier_changes",
        ] {
            assert!(part[k].is_number(), "{name}.{k} = {}", part[k]);
        }
        for k in ["onset_to_first_degradation_s", "back_to_t0_s"] {
            assert!(
                part[k].is_number() || part[k].is_null(),
                "{name}.{k} = {}",
                part[k]
            );
        }
        for rate in [
            "critical_flow_success_rate",
            "default_flow_success_rate",
            "sheddable_flow_success_rate",
        ] {
            let r = part[rate].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&r), "{name}.{rate} = {r}");
        }
        // Each configuration really sent load: users were planned and ran.
        assert!(part["users"].as_u64().unwrap() > 0, "{name}: no users");
        assert!(part["capacity_flows_per_s"].as_f64().unwrap() > 0.0);
    }
    // Each configuration ran its own deployment with its own scheduling and controller mode.
    assert_eq!(v["baseline"]["scheduling_policy"], "fcfs");
    assert_eq!(v["loop_off"]["scheduling_policy"], "priority");
    assert_eq!(v["loop_off"]["controller"], "dry_run");
    assert_eq!(v["loop_on"]["controller"], "on");
    // The tiny model runs at a simulated GPU pace: no critical step guard anywhere.
    for c in ["baseline", "loop_off", "loop_on"] {
        assert_eq!(v[c]["critical_step_tokens"], 0, "{c}");
    }
    // The dry-run configurations publish nothing.
    assert_eq!(v["baseline"]["tier_changes"], 0);
    assert_eq!(v["loop_off"]["tier_changes"], 0);
    // The files next to the results.
    let svg = std::fs::read_to_string(out_dir.path().join("goodput.svg")).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.matches("<path ").count() == 3,
        "{svg}"
    );
    let all: Value = serde_json::from_str(
        &std::fs::read_to_string(out_dir.path().join("overload.json")).unwrap(),
    )
    .unwrap();
    for c in ["baseline", "loop_off", "loop_on"] {
        assert!(all["runs"][c]["goodput_series"].is_array(), "{c}");
        assert!(all["runs"][c]["load"]["timeline"]["ok"].is_array(), "{c}");
        // What the control plane saw the engine hold: (s, waiting, running) every 500 ms.
        let q = all["runs"][c]["engine_samples"].as_array().unwrap();
        assert!(!q.is_empty() && q[0].as_array().unwrap().len() == 3, "{c}");
    }
    // The calibration measured the request rate too, and declared it to the controller as the
    // policy's capacity_rps.
    let rps = all["capacity_rps"].as_f64().expect("capacity_rps measured");
    assert!(rps > 0.0, "{rps}");
    let declared = |v: f64| Some((v * 100.0).round() / 100.0);
    assert_eq!(all["declared_capacity_rps"].as_f64(), declared(rps));
    // And the T2 route's, with T2 pinned on the engine, as fallback_capacity_rps.
    let fallback = all["fallback_capacity_rps"]
        .as_f64()
        .expect("fallback_capacity_rps measured");
    assert!(fallback > 0.0, "{fallback}");
    assert_eq!(
        all["declared_fallback_capacity_rps"].as_f64(),
        declared(fallback)
    );
    assert!(
        stderr.contains("with T2 in force (route fallback"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "declared to the controller: capacity_rps {rps:.2}"
        )),
        "{stderr}"
    );
    let md = std::fs::read_to_string(out_dir.path().join("overload.md")).unwrap();
    assert!(md.contains("| | baseline | loop_off | loop_on |"), "{md}");
    // Progress went to stderr as plain lines (not a terminal): no control codes.
    assert!(
        stderr.contains("bench overload: run 3/3: loop_on"),
        "{stderr}"
    );
    assert!(!stderr.contains('\x1b'), "colour or cursor codes on a pipe");
}
