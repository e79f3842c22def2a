//! The Grafana dashboards in `dashboards/`: valid JSON, provisioning-ready (the Prometheus
//! datasource is the `DS_PROMETHEUS` variable everywhere, no hard-coded uid), unique dashboard
//! uids and panel ids, panels on the 24-column grid, and every PromQL expression (panel targets
//! and `label_values(...)` variable queries) parsed by `promtool check rules`.
//!
//! Needs `promtool` (Debian package `prometheus`; scripts/test.sh installs it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn dashboards() -> Vec<(String, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("dashboards");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&p).expect("read dashboard");
            let v: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: invalid JSON: {e}"));
            (name, v)
        })
        .collect()
}

/// Panels, including those nested in collapsed rows.
fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels array") {
        out.push(p);
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner.iter());
        }
    }
    out
}

/// Grafana's interval variables as Prometheus durations, so the expression parses as PromQL.
/// (`$var` inside label matchers is just text in a string literal and parses as is.)
fn substitute_grafana(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m")
        .replace("$__interval", "1m")
        .replace("$__range", "1h")
}

/// `label_values(<selector>, <label>)` → the selector, which must be PromQL.
fn variable_selector(query: &str) -> Option<String> {
    let inner = query
        .trim()
        .strip_prefix("label_values(")?
        .strip_suffix(')')?;
    let (selector, _label) = inner.rsplit_once(',')?;
    Some(selector.trim().to_string())
}

const EXPECTED: &[&str] = &[
    "brownout-overview.json",
    "degradation.json",
    "gpu-hosts.json",
    "serving-golden-signals.json",
    "slos-error-budgets.json",
];

#[test]
fn dashboards_are_provisioning_ready_with_unique_ids() {
    let all = dashboards();
    let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, EXPECTED, "dashboard set");
    let mut uids = BTreeSet::new();
    for (name, d) in &all {
        let uid = d["uid"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no uid"));
        assert!(uids.insert(uid.to_string()), "{name}: uid {uid} used twice");
        assert!(
            d["title"]
                .as_str()
                .is_some_and(|t| t.starts_with("brownout / ")),
            "{name}: title"
        );
        assert!(
            d["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
            "{name}: schemaVersion"
        );
        assert_eq!(
            d["__inputs"][0]["name"], "DS_PROMETHEUS",
            "{name}: __inputs for the import UI"
        );
        let vars = d["templating"]["list"].as_array().expect("templating.list");
        assert!(
            vars.iter().any(|v| v["name"] == "DS_PROMETHEUS"
                && v["type"] == "datasource"
                && v["query"] == "prometheus"),
            "{name}: the datasource must be a template variable for provisioning"
        );
        for v in vars.iter().filter(|v| v["type"] == "query") {
            assert_eq!(
                v["datasource"]["uid"], "${DS_PROMETHEUS}",
                "{name}: variable {}",
                v["name"]
            );
        }

        let mut ids = BTreeSet::new();
        for p in panels(d) {
            let title = p["title"].as_str().unwrap_or("?");
            let id = p["id"]
                .as_u64()
                .unwrap_or_else(|| panic!("{name}: panel {title:?} has no id"));
            assert!(
                ids.insert(id),
                "{name}: panel id {id} ({title:?}) is not unique"
            );
            let g = &p["gridPos"];
            let (x, w) = (
                g["x"].as_u64().expect("gridPos.x"),
                g["w"].as_u64().expect("gridPos.w"),
            );
            assert!(
                x + w <= 24 && g["h"].as_u64().is_some_and(|h| h > 0),
                "{name}: {title:?} off the grid"
            );
            if p["type"] == "row" {
                continue;
            }
            assert_eq!(
                p["datasource"]["uid"], "${DS_PROMETHEUS}",
                "{name}: {title:?} hard-codes its datasource"
            );
            let targets = p["targets"]
                .as_array()
                .unwrap_or_else(|| panic!("{name}: {title:?} has no targets"));
            assert!(!targets.is_empty(), "{name}: {title:?} has no targets");
            let mut refs = BTreeSet::new();
            for t in targets {
                assert!(
                    t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
                    "{name}: {title:?} empty expr"
                );
                assert!(
                    refs.insert(t["refId"].as_str().expect("refId")),
                    "{name}: {title:?} duplicate refId"
                );
                assert_eq!(
                    t["datasource"]["uid"], "${DS_PROMETHEUS}",
                    "{name}: {title:?} target datasource"
                );
            }
        }
    }
}

#[test]
fn every_promql_expression_parses_with_promtool() {
    // One recording rule per expression; the record name says where it came from.
    let mut origin = BTreeMap::new();
    let mut rules = String::from("groups:\n  - name: dashboard-exprs\n    rules:\n");
    let mut push = |what: String, expr: String| {
        let record = format!("dashboard_expr:n{}", origin.len());
        rules.push_str(&format!(
            "      - record: {record}\n        expr: {}\n",
            serde_json::to_string(&expr).expect("a string is JSON, and JSON strings are YAML")
        ));
        origin.insert(record, what);
    };
    for (name, d) in dashboards() {
        for p in panels(&d) {
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().unwrap_or_default();
                push(
                    format!("{name} / {} / {}", p["title"], t["refId"]),
                    substitute_grafana(expr),
                );
            }
        }
        for v in d["templating"]["list"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|v| v["type"] == "query")
        {
            let q = v["definition"].as_str().unwrap_or_default();
            let sel = variable_selector(q).unwrap_or_else(|| {
                panic!("{name}: variable query {q:?} is not label_values(selector, label)")
            });
            push(format!("{name} / variable {}", v["name"]), sel);
        }
    }
    assert!(
        origin.len() > 50,
        "expected many expressions, got {}",
        origin.len()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("dashboard_exprs.yml");
    std::fs::write(&file, &rules).expect("write rules");
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool is needed: apt-get install prometheus (scripts/test.sh installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let located: Vec<String> = origin
        .iter()
        .filter(|(r, _)| text.contains(r.as_str()))
        .map(|(r, w)| format!("{r} = {w}"))
        .collect();
    assert!(
        out.status.success(),
        "promtool rejected dashboard PromQL:\n{text}\nat: {located:#?}"
    );
    assert!(
        text.contains(&format!("SUCCESS: {} rules found", origin.len())),
        "{text}"
    );
}

#[test]
fn a_broken_expression_is_caught() {
    // The check above can fail: promtool rejects a typo'd expression.
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("bad.yml");
    let expr = substitute_grafana(
        "histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[$__rate_interval]))",
    );
    std::fs::write(
        &file,
        format!(
            "groups:\n  - name: x\n    rules:\n      - record: x:y\n        expr: {}\n",
            serde_json::to_string(&expr).unwrap()
        ),
    )
    .expect("write");
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool");
    assert!(
        !out.status.success(),
        "unbalanced parentheses must not parse"
    );
}

#[test]
fn dashboards_use_the_contract_metric_names() {
    // The names docs/ARCHITECTURE.md §6 promises; a renamed metric would leave a panel empty.
    let text: String = dashboards().iter().map(|(_, d)| d.to_string()).collect();
    for metric in [
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_UTIL",
        "brownout_gpu_vram_used_ratio",
        "brownout_kv_internal_fragmentation_ratio",
        "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:generation_tokens_total",
        "brownout_slo_error_budget_remaining_ratio",
        "brownout_slo_burn_rate",
        "brownout_degradation_tier",
        "brownout_serving_tier",
        "brownout_serving_shed_total",
        "brownout_degradation_ack_lag_seconds",
    ] {
        assert!(text.contains(metric), "no dashboard uses {metric}");
    }
    for q in ["0.5", "0.95", "0.99"] {
        assert!(text.contains(&format!("histogram_quantile({q}, sum by (le, model_name) (rate(vllm:time_to_first_token_seconds_bucket")), "TTFT p{q}");
    }
}
