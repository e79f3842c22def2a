//! SLO specs (three formats, every example, bad input) and Prometheus rule generation (golden
//! files, `promtool check rules`, `promtool test rules`).
//!
//! Regenerate the golden files and alerts/slo-*.yml with `UPDATE_GOLDEN=1 cargo test -p brownout --test it slo_spec::`.

use std::path::{Path, PathBuf};
use std::process::Command;

use brownout::slo::spec::{self, Budgeting, Format, LatencyMetric, Period, PromSli, SliKind};
use brownout::slo::{SpecError, rules};
use brownout_protocol::Criticality;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn examples() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join("examples/slo"))
        .expect("examples/slo exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    v.sort();
    v
}

/// Compares `got` with the file, or rewrites the file when UPDATE_GOLDEN is set.
fn golden(path: &Path, got: &str) {
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(path, got).expect("write golden");
        return;
    }
    let want = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    assert!(
        got == want,
        "{} differs from the generator's output; run `UPDATE_GOLDEN=1 cargo test -p brownout --test it slo_spec::` \
         and review the diff",
        path.display()
    );
}

fn promtool() -> &'static str {
    let ok = Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "promtool is not installed: `apt-get install prometheus` (scripts/test.sh does it)"
    );
    "promtool"
}

/// Runs with the relative path the rule headers name (`examples/slo/x.yaml`).
fn load_relative(p: &Path) -> Vec<spec::SloSpec> {
    let rel = p.strip_prefix(root()).expect("under the crate root");
    let text = std::fs::read_to_string(p).expect("read example");
    spec::parse_str(&text, &rel.display().to_string()).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_example_parses_and_validates() {
    let files = examples();
    assert!(
        files.len() >= 4,
        "expected the brownout, Sloth and OpenSLO examples"
    );
    let all = spec::load_files(&files).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
    for want in [
        "chat-availability",
        "chat-ttft",
        "chat-critical-availability",
        "pdf-analysis-minutes",
        "agent-task-success",
        "gateway-requests-availability",
        "gateway-requests-latency",
        "embeddings-availability",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
}

#[test]
fn brownout_format_maps_every_field() {
    let specs = load_relative(&root().join("examples/slo/chat.yaml"));
    let by = |n: &str| specs.iter().find(|s| s.name == n).expect(n);
    let a = by("chat-availability");
    assert_eq!(
        (a.service.as_str(), a.objective_ratio, a.period),
        ("chat", 0.999, Period::Rolling { days: 28 })
    );
    assert_eq!(a.min_events, 100);
    assert_eq!(a.sli.kind, SliKind::Availability);
    assert_eq!(a.source.format, Format::Brownout);
    let t = by("chat-ttft");
    assert_eq!(
        t.sli.kind,
        SliKind::Latency {
            metric: LatencyMetric::Ttft,
            threshold_ms: 2000.0
        }
    );
    assert_eq!(t.alerting.ticket.pending_secs, 300);
    match &t.sli.promql {
        Some(PromSli::Events { error_query, .. }) => {
            assert!(
                error_query.contains(
                    r#"vllm:time_to_first_token_seconds_bucket{service="chat",le=~"2|2.0"}"#
                ),
                "{error_query}"
            )
        }
        other => panic!("{other:?}"),
    }
    let c = by("chat-critical-availability");
    assert_eq!(c.period, Period::CalendarMonth);
    assert_eq!(c.selector.criticality, vec![Criticality::Critical]);
    let p = by("pdf-analysis-minutes");
    assert_eq!(
        p.budgeting,
        Budgeting::Timeslices {
            slice_secs: 60,
            good_slice_ratio: 0.95
        }
    );
    assert_eq!(p.selector.feature.as_deref(), Some("pdf_analysis"));
    assert!(!p.alerting.ticket.enabled);
}

#[test]
fn sloth_spec_converts() {
    let specs = load_relative(&root().join("examples/slo/sloth-gateway.yaml"));
    let a = &specs[0];
    assert_eq!(a.source.format, Format::Sloth);
    assert_eq!(
        (a.service.as_str(), a.objective_ratio, a.period),
        ("gateway", 0.999, Period::Rolling { days: 30 })
    );
    assert_eq!(a.labels.get("owner").map(String::as_str), Some("platform"));
    assert_eq!(a.alerting.name.as_deref(), Some("GatewayHighErrorRate"));
    assert_eq!(
        a.alerting.page.labels.get("severity").map(String::as_str),
        Some("critical")
    );
    let l = &specs[1];
    assert!(!l.alerting.ticket.enabled, "ticket_alert.disable");
    match &l.sli.promql {
        // The multi-line block becomes one line.
        Some(PromSli::Events { error_query, .. }) => {
            assert!(!error_query.contains('\n') && error_query.starts_with("( sum(rate("))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn openslo_spec_converts() {
    let specs = load_relative(&root().join("examples/slo/openslo-embeddings.yaml"));
    let [s] = specs.as_slice() else {
        panic!("one SLO expected")
    };
    assert_eq!(s.source.format, Format::OpenSlo);
    assert_eq!(
        (s.objective_ratio, s.period),
        (0.995, Period::Rolling { days: 28 })
    );
    assert_eq!(
        s.labels.get("team").map(String::as_str),
        Some("search,inference")
    );
    match &s.sli.promql {
        Some(PromSli::Events {
            error_query,
            total_query,
        }) => {
            assert_eq!(
                error_query,
                &format!(
                    "({total_query}) - (sum(rate(brownout_serving_requests_total{{service=\"embeddings\",outcome=\"ok\"}}[{{{{.window}}}}])))"
                )
            );
        }
        other => panic!("{other:?}"),
    }
}

const GOOD: &str = "version: brownout/v1\nslos:\n  - name: x\n    service: chat\n    objective_percent: 99.9\n    period: 28d\n    sli: {kind: availability}\n";

/// Each bad spec must be refused with a message naming the file, the field and the reason.
#[test]
fn bad_specs_name_file_field_and_reason() {
    let sloth =
        |slo: &str| format!("version: prometheus/v1\nservice: gw\nslos:\n  - name: a\n{slo}");
    let openslo = |spec: &str| {
        format!(
            "apiVersion: openslo/v1\nkind: SLO\nmetadata:\n  name: a\nspec:\n  service: s\n  timeWindow:\n    - duration: 28d\n      isRolling: true\n{spec}"
        )
    };
    let ratio = "  indicator:\n    metadata: {name: i}\n    spec:\n      ratioMetric:\n        good: {metricSource: {type: Prometheus, spec: {query: 'sum(rate(a[{{.window}}]))'}}}\n        total: {metricSource: {type: Prometheus, spec: {query: 'sum(rate(b[{{.window}}]))'}}}\n";
    let cases: Vec<(String, &[&str])> = vec![
        (GOOD.replace("objective_percent", "objectiv"), &["slos[0]", "unknown field `objectiv`"]),
        (GOOD.replace("99.9", "100"), &["slos[0].objective_percent", "strictly between 0 and 1"]),
        (GOOD.replace("99.9", "99.9999"), &["slos[0].objective_percent", "five nines"]),
        (GOOD.replace("    period", "    objective_ratio: 0.9\n    period"), &["slos[0]", "exactly one of objective_percent and objective_ratio"]),
        (GOOD.replace("name: x", "name: Chat_X"), &["slos[0].name", "lowercase"]),
        (GOOD.replace("28d", "29h"), &["slos[0].period", "whole number of days"]),
        (GOOD.replace("28d", "45d"), &["slos[0].period", "1d to 31d"]),
        (GOOD.replace("{kind: availability}", "{kind: latency, latency_metric: ttft}"), &["slos[0].sli.threshold_ms", "required"]),
        (GOOD.replace("{kind: availability}", "{kind: availability, threshold_ms: 5}"), &["slos[0].sli.kind", "only apply to kind latency"]),
        (GOOD.replace("{kind: availability}", "{kind: uptime}"), &["slos[0].sli.kind", "\"uptime\" is not"]),
        (GOOD.replace("    sli:", "    budgeting: timeslices\n    sli:"), &["slos[0].timeslice", "required with budgeting: timeslices"]),
        (GOOD.replace("    sli:", "    budgeting: timeslices\n    timeslice: {slice: 7s, good_ratio: 0.9}\n    sli:"), &["slos[0].timeslice.slice", "multiple of 10s"]),
        (GOOD.replace("    sli:", "    labels: {slo: y}\n    sli:"), &["slos[0].labels.slo", "reserved"]),
        (GOOD.replace("    sli:", "    labels: {\"bad-name\": y}\n    sli:"), &["slos[0].labels.bad-name", "label name"]),
        (GOOD.replace("    sli:", "    criticality: [urgent]\n    sli:"), &["slos[0].criticality[0]", "\"urgent\""]),
        (
            GOOD.replace("    sli: {kind: availability}", "    feature: pdf\n    sli: {kind: latency, latency_metric: e2e, threshold_ms: 500}"),
            &["slos[0].sli", "needs sli.prometheus"],
        ),
        (
            GOOD.replace("{kind: availability}", "{kind: availability, prometheus: {error_query: 'sum(rate(a[5m]))', total_query: 'sum(rate(b[{{.window}}]))'}}"),
            &["slos[0].sli.prometheus.error_query", "{{.window}}"],
        ),
        (format!("{GOOD}{}", &GOOD[GOOD.find("  - name").unwrap_or(0)..]), &["slo \"x\"", "defined twice"]),
        (GOOD.replace("brownout/v1", "brownout/v2"), &["version", "\"brownout/v2\""]),
        ("slos: []\n".to_string(), &["no `version`"]),
        (sloth("    objective: 100.5\n    sli: {events: {error_query: 'a[{{.window}}]', total_query: 'b[{{.window}}]'}}\n"), &["slos[0].objective", "strictly between"]),
        (sloth("    objective: 99\n    sli: {plugin: {id: x}}\n"), &["slos[0].sli.plugin", "not supported"]),
        (sloth("    objective: 99\n    sli: {}\n"), &["slos[0].sli", "exactly one of events and raw"]),
        (openslo(&format!("  budgetingMethod: RatioTimeslices\n  objectives: [{{target: 0.99}}]\n{ratio}")), &["SLO \"a\".spec.budgetingMethod", "RatioTimeslices"]),
        (openslo(&format!("  budgetingMethod: Occurrences\n  objectives: [{{target: 0.99}}, {{target: 0.9}}]\n{ratio}")), &["SLO \"a\".spec.objectives", "exactly one objective"]),
        (openslo("  budgetingMethod: Occurrences\n  objectives: [{target: 0.99}]\n  indicatorRef: nope\n"), &["SLO \"a\".spec.indicatorRef", "no SLI document named \"nope\""]),
        (openslo(&format!("  budgetingMethod: Timeslices\n  objectives: [{{target: 0.99}}]\n{ratio}")), &["timeSliceTarget", "required with budgetingMethod Timeslices"]),
    ];
    for (text, wants) in cases {
        let err = match spec::parse_str(&text, "bad.yaml") {
            Ok(s) => panic!("accepted:\n{text}\n{s:?}"),
            Err(e) => e,
        };
        let msg = err.to_string();
        assert!(msg.starts_with("bad.yaml: "), "{msg}");
        for w in wants {
            assert!(
                msg.contains(w),
                "{msg:?} should contain {w:?}\nspec:\n{text}"
            );
        }
    }
}

#[test]
fn unreadable_file_names_it() {
    match spec::load_file(Path::new("/nonexistent/slo.yaml")) {
        Err(SpecError::Io { file, .. }) => assert_eq!(file, "/nonexistent/slo.yaml"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn names_must_be_unique_across_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = (dir.path().join("a.yaml"), dir.path().join("b.yaml"));
    std::fs::write(&a, GOOD).expect("write");
    std::fs::write(&b, GOOD).expect("write");
    let err = spec::load_files(&[a, b]).expect_err("duplicate across files");
    assert!(err.to_string().contains("already defined in"), "{err}");
}

/// alerts/slo-<stem>.yml is exactly what `brownout slo rules examples/slo/<stem>.yaml` prints.
#[test]
fn alert_files_equal_the_generator_output() {
    for ex in examples() {
        let stem = ex.file_stem().and_then(|s| s.to_str()).expect("stem");
        let yaml = rules::generate(&load_relative(&ex)).unwrap_or_else(|e| panic!("{e}"));
        golden(&root().join(format!("alerts/slo-{stem}.yml")), &yaml);
    }
}

/// Edge cases: a raw SLI (no guard), a 99% objective (no fast burn), an alert-name override,
/// disabled alerts, a sub-second latency threshold, and a spec-level severity override.
#[test]
fn edge_case_rules_match_golden() {
    let dir = root().join("tests/golden/slo");
    let src = dir.join("edge.spec.yaml");
    let text = std::fs::read_to_string(&src).expect("edge spec");
    let specs =
        spec::parse_str(&text, "tests/golden/slo/edge.spec.yaml").unwrap_or_else(|e| panic!("{e}"));
    let yaml = rules::generate(&specs).unwrap_or_else(|e| panic!("{e}"));
    golden(&dir.join("edge.rules.yml"), &yaml);
    assert!(
        yaml.contains(r#"le="0.5""#),
        "sub-second threshold as a plain le"
    );
    assert!(
        !yaml.contains("slo:sli_events:count5m{slo=\"edge-raw\"}"),
        "no guard without event counts"
    );
    assert!(
        !yaml.contains("EdgeRawFastBurn"),
        "288x is unreachable at 99%"
    );
}

#[test]
fn rules_refuse_slos_without_prometheus_queries() {
    let text = "apiVersion: openslo/v1\nkind: SLO\nmetadata: {name: dd}\nspec:\n  service: s\n  timeWindow: [{duration: 30d, isRolling: true}]\n  budgetingMethod: Occurrences\n  objectives: [{target: 0.99}]\n  indicator:\n    metadata: {name: i}\n    spec:\n      ratioMetric:\n        good: {metricSource: {type: Datadog, spec: {query: 'x'}}}\n        total: {metricSource: {type: Datadog, spec: {query: 'y'}}}\n";
    let specs = spec::parse_str(text, "dd.yaml").unwrap_or_else(|e| panic!("{e}"));
    let err = rules::generate(&specs).expect_err("no PromQL");
    assert!(
        err.to_string()
            .contains("dd.yaml: slo \"dd\": no Prometheus SLI"),
        "{err}"
    );
}

#[test]
fn promtool_check_rules_accepts_generated_files() {
    let mut files: Vec<PathBuf> = examples()
        .iter()
        .map(|e| {
            root().join(format!(
                "alerts/slo-{}.yml",
                e.file_stem().and_then(|s| s.to_str()).expect("stem")
            ))
        })
        .collect();
    files.push(root().join("tests/golden/slo/edge.rules.yml"));
    let out = Command::new(promtool())
        .arg("check")
        .arg("rules")
        .args(&files)
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "promtool check rules failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The hand-written scenarios in alerts/tests/slo-*.yml: which alerts fire when.
#[test]
fn promtool_unit_tests_pass() {
    let mut tests: Vec<PathBuf> = std::fs::read_dir(root().join("alerts/tests"))
        .expect("alerts/tests")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("slo-") && n.ends_with(".yml"))
        })
        .collect();
    tests.sort();
    assert!(tests.len() >= 3, "{tests:?}");
    let out = Command::new(promtool())
        .arg("test")
        .arg("rules")
        .args(&tests)
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "promtool test rules failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
