//! The Prometheus rule files in `alerts/`: `promtool check rules` accepts every file (the
//! generated SLO files too), `promtool test rules` passes our unit tests in `alerts/tests/`, and
//! every alert we ship has a severity, a summary, a runbook and a unit test that expects it to fire.
//!
//! Needs `promtool` (Debian package `prometheus`; scripts/test.sh installs it).

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn yml_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yml" || x == "yaml"))
        .collect();
    v.sort();
    v
}

fn promtool(args: &[&str], files: &[PathBuf]) -> (bool, String) {
    let out = Command::new("promtool")
        .args(args)
        .args(files)
        .current_dir(root())
        .output()
        .expect("promtool is needed: apt-get install prometheus (scripts/test.sh installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Our files (the SLO burn-rate files `slo-*.yml` are generated and tested by the SLO component).
fn our_rule_files() -> Vec<PathBuf> {
    yml_files(&root().join("alerts"))
        .into_iter()
        .filter(|p| !p.file_name().unwrap().to_string_lossy().starts_with("slo-"))
        .collect()
}

#[test]
fn promtool_check_rules_accepts_every_rule_file() {
    let files = yml_files(&root().join("alerts"));
    assert!(
        files.len() >= 4,
        "expected the rule files in alerts/, found {files:?}"
    );
    let (ok, out) = promtool(&["check", "rules"], &files);
    assert!(ok, "promtool check rules failed:\n{out}");
}

#[test]
fn promtool_unit_tests_pass() {
    // Ours only: the SLO component runs its generated `slo-*` tests itself (one takes seconds).
    let files: Vec<PathBuf> = yml_files(&root().join("alerts/tests"))
        .into_iter()
        .filter(|p| !p.file_name().unwrap().to_string_lossy().starts_with("slo-"))
        .collect();
    assert!(!files.is_empty(), "no rule unit tests in alerts/tests");
    let (ok, out) = promtool(&["test", "rules"], &files);
    assert!(ok, "promtool test rules failed:\n{out}");
    assert_eq!(out.matches("SUCCESS").count(), files.len(), "{out}");
}

#[test]
fn promtool_test_rules_catches_a_wrong_expectation() {
    // The harness itself can fail: the same KV series, expecting the P1 alert too early.
    let dir = tempfile::tempdir().expect("tempdir");
    let test = format!(
        r#"rule_files: ["{}"]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'vllm:kv_cache_usage_perc{{instance="a",model_name="m"}}'
        values: '0.95x5'
    alert_rule_test:
      - eval_time: 0m
        alertname: KVCacheUsageCritical
        exp_alerts: [{{exp_labels: {{severity: P1, instance: a, model_name: m}}}}]
"#,
        root().join("alerts/gpu.yml").display()
    );
    let path = dir.path().join("wrong_test.yml");
    std::fs::write(&path, test).expect("write test");
    let (ok, out) = promtool(&["test", "rules"], &[path]);
    assert!(
        !ok,
        "an alert with `for: 1m` cannot fire at 0m, promtool should fail:\n{out}"
    );
}

#[test]
fn every_alert_has_severity_summary_runbook_and_a_firing_test() {
    let tests: String = yml_files(&root().join("alerts/tests"))
        .iter()
        .map(|p| std::fs::read_to_string(p).expect("read test"))
        .collect();
    let mut names = Vec::new();
    for file in our_rule_files() {
        let doc: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(&file).expect("read rules"))
                .expect("YAML");
        for group in doc["groups"].as_sequence().expect("groups") {
            for rule in group["rules"].as_sequence().expect("rules") {
                let Some(name) = rule["alert"].as_str() else {
                    continue;
                };
                let sev = rule["labels"]["severity"].as_str().unwrap_or("");
                assert!(
                    ["P1", "P2", "P3"].contains(&sev),
                    "{name}: severity {sev:?} is not P1/P2/P3"
                );
                for key in ["summary", "description", "runbook"] {
                    assert!(
                        rule["annotations"][key]
                            .as_str()
                            .is_some_and(|s| !s.is_empty()),
                        "{name}: no {key}"
                    );
                }
                assert!(
                    tests.contains(&format!(
                        "alertname: {name}\n        exp_alerts:\n          - exp_labels"
                    )),
                    "{name}: no unit test in alerts/tests expects it to fire"
                );
                names.push(name.to_string());
            }
        }
    }
    for must in [
        "KVCacheUsageHigh",
        "KVCacheUsageCritical",
        "GPUVRAMHigh",
        "TTFTP99OverSLO",
        "GPUAgentDown",
        "GPUHostDown",
        "EnginePreemptionRateHigh",
        "IngestSpoolGrowing",
        "DegradedTier2ForLong",
    ] {
        assert!(
            names.iter().any(|n| n == must),
            "missing alert {must}; have {names:?}"
        );
    }
}

/// Every Alertmanager alert the default policy acts on is an alert this repository defines
/// (and, by the test above, one a unit test sees firing).
#[test]
fn every_alert_the_default_policy_names_is_defined_here() {
    use brownout::degrade::policy::{Condition, Policy};
    let policy = Policy::seed_default();
    let named: Vec<String> = policy
        .tiers
        .iter()
        .flat_map(|t| &t.enter)
        .filter_map(|c| match c {
            Condition::Alertmanager { alertname } => Some(alertname.clone()),
            _ => None,
        })
        .collect();
    assert!(named.len() >= 2, "{named:?}");
    let defined: String = our_rule_files()
        .iter()
        .map(|p| std::fs::read_to_string(p).expect("read rules"))
        .collect();
    for n in named {
        assert!(
            defined.contains(&format!("- alert: {n}\n")),
            "examples/policy.yaml acts on {n}, which no file in alerts/ defines"
        );
    }
}
