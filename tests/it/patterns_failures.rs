//! Failure messages as LLM apps, serving engines and agent tools emit them, tracebacks, and
//! log formats beside Loghub's (corpora written by `python3 bench/gen_failures.py`): grouping
//! accuracy, exception types kept in templates and never merged, a traceback being one event
//! keyed by its type and top frames, through the library and the real `brownout` binary.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use brownout::patterns::bench::{Corpus, grouping_accuracy, load_corpora};
use brownout::patterns::trace::is_exception_type;
use brownout::patterns::{PatternEngine, TemplateId, TemplateMiner, mine_log, mine_log_with};
use brownout_protocol::{Category, FailureEvent};

fn testdata(dir: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(dir)
}

fn corpus(dir: &str, name: &str) -> Corpus {
    load_corpora(&testdata(dir))
        .expect("corpora load")
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("corpus {dir}/{name} missing"))
}

/// The exception type a true template starts with, if any.
fn true_type(t: &str) -> Option<&str> {
    let first = t.split(' ').next()?;
    is_exception_type(first).then(|| first.trim_end_matches(':'))
}

/// Mines `c` and checks: GA ≥ `min_ga`, every template of a line whose true template names an
/// exception type holds that type, and no template holds lines of two types.
fn check_types_kept(c: &Corpus, min_ga: f64) {
    let mut m = TemplateMiner::default();
    let ids = mine_log_with(&mut m, &c.lines);
    let ga = grouping_accuracy(&ids, &c.truth);
    assert!(
        ga >= min_ga,
        "{}: grouping accuracy {ga:.3} < {min_ga}",
        c.name
    );
    let mut types_of: HashMap<TemplateId, HashSet<&str>> = HashMap::new();
    let mut missing = Vec::new();
    for (id, truth) in ids.iter().zip(&c.truth) {
        let Some(ty) = true_type(truth) else { continue };
        types_of.entry(*id).or_default().insert(ty);
        let t = m.template(*id).unwrap_or_default();
        if !t.split(' ').any(|tok| tok.trim_end_matches(':') == ty) {
            missing.push(format!("{ty}: {t}"));
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "{}: templates without their exception type:\n{}",
        c.name,
        missing.join("\n")
    );
    let kinds: HashSet<&&str> = types_of.values().flatten().collect();
    assert!(
        kinds.len() >= 25,
        "{}: only {} exception types",
        c.name,
        kinds.len()
    );
    for (id, tys) in &types_of {
        assert_eq!(tys.len(), 1, "{}: template {id} merges {tys:?}", c.name);
    }
}

#[test]
fn llm_failure_messages_keep_their_exception_types_raw_and_bare() {
    let raw = corpus("failures", "llm_raw");
    let bare = corpus("failures", "llm_messages");
    assert_eq!(raw.truth, bare.truth, "the same failures, raw and bare");
    let kinds: HashSet<&String> = raw.truth.iter().collect();
    assert!(kinds.len() >= 25, "{} kinds", kinds.len());
    check_types_kept(&bare, 0.98);
    check_types_kept(&raw, 0.98);
}

#[test]
fn tracebacks_are_one_event_keyed_by_type_and_top_frames() {
    let c = corpus("failures", "tracebacks");
    let ids = mine_log(&c.lines);
    let ga = grouping_accuracy(&ids, &c.truth);
    assert!(ga >= 0.98, "tracebacks: grouping accuracy {ga:.3} < 0.98");
    // Every line of one event has the event's id: as many groups as true groups.
    let groups: HashSet<&TemplateId> = ids.iter().collect();
    let truths: HashSet<&String> = c.truth.iter().collect();
    assert_eq!(groups.len(), truths.len());
}

#[test]
fn log_formats_beside_loghubs_are_grouped() {
    let corpora = load_corpora(&testdata("logs/formats")).expect("format corpora");
    let names: Vec<&str> = corpora.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "gunicorn",
            "jsonl",
            "k8s_events",
            "klog",
            "logfmt",
            "pylogging",
            "rfc5424",
            "uvicorn",
            "vllm"
        ]
    );
    let mut low = Vec::new();
    let mut sum = 0.0;
    for c in &corpora {
        let ga = grouping_accuracy(&mine_log(&c.lines), &c.truth);
        sum += ga;
        if ga < 0.95 {
            low.push(format!("{}: {ga:.3}", c.name));
        }
    }
    assert!(low.is_empty(), "formats below 0.95: {low:?}");
    let avg = sum / corpora.len() as f64;
    assert!(avg >= 0.98, "average over the formats {avg:.3} < 0.98");
}

fn event(error_type: &str, message: &str) -> FailureEvent {
    FailureEvent {
        ts_ms: 1_800_000_000_000,
        service: "agent".into(),
        host: String::new(),
        request_id: String::new(),
        trace_id: "t1".into(),
        user_id: String::new(),
        feature: String::new(),
        criticality: Default::default(),
        category: Category::Other,
        error_type: error_type.into(),
        message: message.into(),
        latency_ms: 0.0,
        attributes: Default::default(),
    }
}

#[test]
fn an_events_error_type_and_stack_trace_are_part_of_its_pattern_key() {
    let mut e = PatternEngine::default();
    // The same message under two types: two templates; the same type again: the same one.
    let a = e.observe(&event("httpx.ReadTimeout", "upstream call failed"));
    let b = e.observe(&event("httpx.ConnectTimeout", "upstream call failed"));
    assert_ne!(a, b);
    assert_eq!(
        e.observe(&event("httpx.ReadTimeout", "upstream call failed")),
        a
    );
    assert_eq!(
        e.lookup(&event("httpx.ConnectTimeout", "upstream call failed")),
        b
    );
    assert_eq!(
        e.miner().template(a).as_deref(),
        Some("upstream call failed")
    );
    // A stack trace in exception.stacktrace (as OTLP carries it): keyed by its top frames.
    let trace = |func: &str| {
        format!(
            "Traceback (most recent call last):\n  File \"/app/agent/llm.py\", line 41, in {func}\n    x()\nRuntimeError: boom"
        )
    };
    let with = |func: &str| {
        let mut ev = event("RuntimeError", "boom");
        ev.attributes
            .insert("exception.stacktrace".into(), trace(func));
        ev
    };
    let c = e.observe(&with("complete"));
    let d = e.observe(&with("stream"));
    assert_ne!(c, d, "different top frames");
    assert_eq!(e.observe(&with("complete")), c);
    // The trace in the message itself: mined as its exception line, keyed the same way.
    let f = e.observe(&event("", &trace("complete")));
    assert_eq!(e.miner().template(f).as_deref(), Some("RuntimeError: boom"));
    // As OTLP ingest builds it from an `exception` span event's attributes.
    let otlp = FailureEvent::from_attributes(
        1_800_000_000_000,
        "span chat failed",
        [
            ("exception.type", "RuntimeError".to_string()),
            ("exception.message", "boom".to_string()),
            ("exception.stacktrace", trace("stream")),
        ],
    );
    assert_eq!(
        e.observe(&otlp),
        d,
        "exception.* attributes key like the event above"
    );
    let ps = e.patterns(0, u64::MAX / 2);
    assert!(
        ps.iter()
            .any(|p| p.error_types == vec!["RuntimeError".to_string()]),
        "the type a trace names is the pattern's error type: {ps:#?}"
    );
}

#[test]
fn the_cli_prints_one_line_per_input_line_and_one_id_per_trace() {
    let c = corpus("failures", "tracebacks");
    let path = testdata("failures/tracebacks.log");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_brownout"))
        .args(["patterns", "mine", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let ids: Vec<&str> = text
        .lines()
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert_eq!(ids.len(), c.lines.len(), "one output line per input line");
    assert_eq!(
        ids,
        mine_log(&c.lines)
            .iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
    );
    // A Java trace's `Caused by:` and `... N more` lines carry the trace's id.
    let at = c
        .lines
        .iter()
        .position(|l| l.starts_with("Caused by:"))
        .unwrap();
    assert_eq!(ids[at], ids[at - 1]);
}
