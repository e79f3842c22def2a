//! The in-process evaluator against hand-computed cases, the tokio task (paused time), the
//! HTTP API, the gauges and `brownout slo eval`.

use std::sync::Arc;
use std::time::Duration;

use brownout::slo::eval::{Evaluator, EventKind, Observation, classify};
use brownout::slo::spec::{self, SloSpec};
use brownout::slo::{AlertState, PairKind, SloHandle, SloMetrics, SloStatus, cli, task};
use brownout_protocol::{Criticality, FailureEvent};

/// 2026-01-01T00:00:00Z.
const T0: u64 = 1_767_225_600_000;
const SEC: u64 = 1_000;
const MIN: u64 = 60 * SEC;
const HOUR: u64 = 60 * MIN;

/// SLOs from brownout/v1 YAML list items (each starting with `- name:`).
fn specs(items: &str) -> Vec<SloSpec> {
    let text = format!("version: brownout/v1\nslos:\n{items}");
    spec::parse_str(&text, "test.yaml").unwrap_or_else(|e| panic!("{e}"))
}

fn availability(
    name: &str,
    objective: &str,
    period: &str,
    min_events: u64,
    extra: &str,
) -> Vec<SloSpec> {
    specs(&format!(
        "  - name: {name}\n    service: chat\n    objective_percent: {objective}\n    period: {period}\n    sli: {{kind: availability}}\n    min_events: {min_events}\n{extra}"
    ))
}

fn request(ts_ms: u64, ok: bool) -> Observation<'static> {
    Observation {
        ts_ms,
        kind: EventKind::Request,
        service: "chat",
        feature: "basic_qa",
        criticality: Criticality::Default,
        ok,
        deliberate: false,
        latency_ms: Some(300.0),
        ttft_ms: Some(120.0),
    }
}

/// Records one request every `every_ms` in `[from, to)`, `ok(i)` deciding each.
fn feed(ev: &mut Evaluator, from: u64, to: u64, every_ms: u64, ok: impl Fn(u64) -> bool) {
    let mut i = 0;
    let mut t = from;
    while t < to {
        ev.record(&request(t, ok(i)));
        i += 1;
        t += every_ms;
    }
}

fn alert<'a>(s: &'a SloStatus, window: &str) -> &'a brownout::slo::AlertStatus {
    s.alerts
        .iter()
        .find(|a| a.window == window)
        .unwrap_or_else(|| panic!("no {window} alert in {:?}", s.alerts))
}

fn firing_windows(s: &SloStatus) -> Vec<&str> {
    s.firing().map(|a| a.window.as_str()).collect()
}

/// Two quiet hours at 10 requests/s, then every request fails. Returns the statuses of the
/// evaluations every 10 s during the outage, as (seconds since it began, status).
fn outage(slos: Vec<SloSpec>, outage_secs: u64, recovery_secs: u64) -> Vec<(u64, SloStatus)> {
    let mut ev = Evaluator::new(slos);
    let start = T0 + 2 * HOUR;
    feed(&mut ev, T0, start, 100, |_| true);
    let before = ev.evaluate(start - 1);
    assert!(
        before[0].firing().next().is_none(),
        "nothing fires before the outage"
    );
    let mut out = Vec::new();
    let mut t = start;
    for step in 1..=(outage_secs + recovery_secs) / 10 {
        let now = start + step * 10 * SEC;
        let failing = step * 10 <= outage_secs;
        // Events of (t, now]: the one at `now` included, as an evaluation right after it.
        feed(&mut ev, t + 100, now + 100, 100, |_| !failing);
        t = now;
        out.push((step * 10, ev.evaluate(now).remove(0)));
    }
    out
}

fn first_firing(run: &[(u64, SloStatus)], window: &str) -> Option<u64> {
    run.iter()
        .find(|(_, s)| alert(s, window).state.is_firing())
        .map(|(t, _)| *t)
}

#[test]
fn total_outage_at_three_nines_pages_within_about_a_minute() {
    let run = outage(
        availability("chat-availability", "99.9", "28d", 100, ""),
        600,
        0,
    );
    // 1h/5m at 28d: factor 13.44, so the 1 h window needs 1.344% errors: 48.4 s of a total
    // outage in an hour of steady traffic; evaluated every 10 s, that is the 50 s evaluation.
    assert_eq!(first_firing(&run, "1h/5m"), Some(50));
    let (_, at50) = &run[4];
    let a = alert(at50, "1h/5m");
    assert_eq!((a.kind, a.factor), (PairKind::Page, 13.44));
    assert_eq!(
        a.state,
        AlertState::Firing {
            since_ms: T0 + 2 * HOUR + 50 * SEC
        }
    );
    // 5 m window at 60 s, bucket-aligned (the open bucket and the 29 before it): 23 whole
    // buckets before the outage (2 300 ok) and 600 failures → 600 / 2 900 → 206.9×.
    assert_eq!(run[5].1.burn_rate(300), Some(206.896552));
    // The fast burn of docs/REQUIREMENTS.md R2.9 (20% of the 28 d budget in 30 min: 268.8×, 26.88% errors over
    // 30 min) needs 483.9 s of total outage → the 490 s evaluation.
    assert_eq!(first_firing(&run, "30m/2m30s"), Some(490));
}

#[test]
fn pending_time_delays_firing_and_recovery_resolves() {
    let extra = "    alerting:\n      page: {pending: 2m}\n";
    let run = outage(
        availability("chat-availability", "99.9", "28d", 100, extra),
        600,
        1_800,
    );
    let start = T0 + 2 * HOUR;
    let (_, s50) = &run[4];
    assert_eq!(
        alert(s50, "1h/5m").state,
        AlertState::Pending {
            since_ms: start + 50 * SEC
        }
    );
    assert_eq!(
        first_firing(&run, "1h/5m"),
        Some(170),
        "pending 2 minutes after 50 s"
    );
    // Recovery after 600 s: the 5 m window (the open 10 s bucket and the 29 before it) last
    // holds a whole failing bucket, [590 s, 600 s), at 880 s; at 890 s only the single failure
    // at 600 s is left (1 of 3 000: 0.3×), so the alert resolves, although the 1 h window
    // still burns.
    let resolved = run
        .iter()
        .find(|(_, s)| matches!(alert(s, "1h/5m").state, AlertState::Resolved { .. }));
    let (t, s) = resolved.expect("resolves");
    assert_eq!(*t, 890);
    assert_eq!(
        alert(s, "1h/5m").state,
        AlertState::Resolved {
            since_ms: start + 890 * SEC,
            fired_since_ms: start + 170 * SEC
        }
    );
    assert!(
        s.burn_rate(3_600).is_some_and(|b| b > 13.44),
        "long window still above the factor"
    );
    // Fifteen minutes after resolving it is inactive again.
    let (_, last) = run.last().expect("statuses");
    assert_eq!(alert(last, "1h/5m").state, AlertState::Inactive);
}

#[test]
fn one_percent_errors_at_three_nines_is_a_tenfold_burn() {
    let mut ev = Evaluator::new(availability("chat-availability", "99.9", "28d", 100, ""));
    feed(&mut ev, T0, T0 + 3 * HOUR, 100, |i| i % 100 != 0);
    let mut last = Vec::new();
    for k in 0..=6 {
        last = ev.evaluate(T0 + 3 * HOUR - 100 + k * 10 * SEC);
    }
    let s = &last[0];
    assert_eq!(s.burn_rate(3_600), Some(10.0));
    assert_eq!(s.burn_rate(21_600), Some(10.0));
    // 10× is above 5.6 (6h/30m page), 2.8 and 0.93 (tickets); below 13.44 and 268.8.
    assert_eq!(firing_windows(s), vec!["6h/30m", "1d/2h", "3d/6h"]);
    // Three hours of 1% errors: 10× over a 28-day budget. The history is those three hours
    // (and the minute since): 10 × 10 859.9 s / 2 419 200 s = 4.489% of the period's budget
    // spent — not "overspent nine times", which is what 1 − the period's burn rate says.
    assert_eq!(s.history_secs, 3 * 3_600 + 59);
    assert_eq!(s.budget_spent_ratio, 0.04489);
    assert_eq!(s.budget_remaining_ratio, 0.95511);
    // At 10× the rest lasts 0.95511 × 28 d / 10 ≈ 2.67 days.
    assert_eq!(s.time_to_exhaustion_secs, Some(231_060.0));
}

#[test]
fn low_traffic_guard_holds() {
    // One request every 10 minutes, every one failing: a 1000× burn on 6 events an hour.
    let run = |min_events: u64| {
        let mut ev = Evaluator::new(availability("quiet", "99.9", "28d", min_events, ""));
        let mut firing = Vec::new();
        for k in 0..18 {
            let t = T0 + k * 10 * MIN;
            ev.record(&request(t, false));
            let s = ev.evaluate(t + 5 * SEC).remove(0);
            firing.extend(s.firing().map(|a| a.window.clone()));
        }
        firing
    };
    assert_eq!(
        run(100),
        Vec::<String>::new(),
        "guard of 100 events: nothing fires"
    );
    assert!(
        run(0).contains(&"1h/5m".to_string()),
        "without the guard the same traffic pages"
    );
    // The short window's guard is proportional: a guard of 6 needs 6 events in the hour and
    // ceil(6 · 5/60) = 1 in the 5 m window, which this traffic has.
    assert!(run(6).contains(&"1h/5m".to_string()));
    // A guard of 7 keeps 1h/5m quiet (never 7 events in an hour); the 6h/30m pair, with 18
    // events in its long window, still pages.
    let seven = run(7);
    assert!(
        !seven.contains(&"1h/5m".to_string()) && seven.contains(&"6h/30m".to_string()),
        "{seven:?}"
    );
}

#[test]
fn budget_and_time_to_exhaustion_by_hand() {
    let mut ev = Evaluator::new(availability("b", "99.9", "28d", 0, ""));
    let id = ev.find("b").expect("id");
    let now = T0 + 10 * 24 * HOUR;
    ev.record_counts(id, now - 5 * 24 * HOUR, 999_500, 1_000_000);
    ev.record_counts(id, now - 30 * MIN, 9_950, 10_000);
    let s = ev.evaluate(now).remove(0);
    // 550 bad of 1 010 000 = 0.0544554%: a 0.544554× burn over the period so far. The history
    // is 5 of the 28 days (the first event), so 0.544554 × 5 / 28 = 9.7242% of the period's
    // budget is spent.
    assert_eq!(s.period_events.total, 1_010_000);
    assert_eq!(s.history_secs, 5 * 86_400);
    assert_eq!(s.budget_remaining_ratio, 0.902758);
    // The last hour: 50 bad of 10 000 = 0.5% → 5×. Left: 0.902758 · 28 d / 5 ≈ 436 790 s.
    assert_eq!(s.burn_rate(3_600), Some(5.0));
    assert_eq!(s.time_to_exhaustion_secs, Some(436_790.0)); // 0.9027581 · 2 419 200 / 5 = 436 790.4
}

#[test]
fn calendar_month_starts_on_the_first() {
    let mut ev = Evaluator::new(availability("cal", "99.9", "calendar_month", 0, ""));
    let march_1 = 1_772_323_200_000; // 2026-03-01T00:00:00Z
    feed(&mut ev, march_1 - HOUR, march_1, 1_000, |_| false); // Feb 28, 23:00: all bad
    feed(&mut ev, march_1, march_1 + HOUR, 1_000, |_| true);
    let s = ev.evaluate(march_1 + 2 * HOUR).remove(0);
    assert_eq!(s.period_events.total, 3_600, "only March counts");
    assert_eq!(s.budget_remaining_ratio, 1.0);
    assert_eq!(
        s.burn_rate(86_400),
        Some(500.0),
        "rolling windows still see February: 3600 bad of 7200"
    );
}

#[test]
fn timeslices_count_bad_minutes() {
    let slo = specs(
        "  - name: minutes\n    service: chat\n    objective_percent: 99\n    period: 7d\n    budgeting: timeslices\n    timeslice: {slice: 1m, good_ratio: 0.95}\n    sli: {kind: availability}\n",
    );
    let mut ev = Evaluator::new(slo);
    // 100 requests a minute; minutes 10, 20 and 30 have 10 failures (90% < 95%: bad), minute 40
    // has 4 (96%: good).
    for m in 0..60u64 {
        let bad = match m {
            10 | 20 | 30 => 10,
            40 => 4,
            _ => 0,
        };
        for i in 0..100u64 {
            ev.record(&request(T0 + m * MIN + i * 600, i >= bad));
        }
    }
    let s = ev.evaluate(T0 + HOUR + 10 * SEC).remove(0);
    assert_eq!((s.period_events.good, s.period_events.total), (57, 60));
    // Budget: 1% of the 10 080 minutes of 7 days = 100.8 bad minutes; 3 spent.
    assert_eq!(s.budget_remaining_ratio, 0.970238);
    // Last hour: 3 bad of 60 minutes = 5% → 5×.
    assert_eq!(s.burn_rate(3_600), Some(5.0));
}

#[test]
fn failure_events_and_spans_become_observations() {
    let line = br#"{"ts":1767225600000,"service":"agent","feature":"research","criticality":"critical","error_type":"AgentExecutionFailed","message":"tool timed out","latency_ms":4200}"#;
    let fe = FailureEvent::parse_line(line).expect("valid failure");
    let o = Observation::from_failure(&fe);
    assert_eq!(
        (o.kind, o.ok, o.criticality, o.latency_ms),
        (
            EventKind::AgentTask,
            false,
            Criticality::Critical,
            Some(4200.0)
        )
    );

    let attrs = [
        ("brownout.feature", "pdf_analysis"),
        ("criticality", "sheddable"),
        ("brownout.ttft_s", "2.5"),
    ];
    let lookup = |k: &str| attrs.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
    let span = Observation::from_span("chat", T0, 3_100.0, false, lookup);
    assert_eq!(
        (span.kind, span.feature, span.criticality, span.ttft_ms),
        (
            EventKind::Request,
            "pdf_analysis",
            Criticality::Sheddable,
            Some(2500.0)
        )
    );

    let slos = specs(
        "  - name: ttft\n    service: chat\n    objective_percent: 99\n    period: 28d\n    sli: {kind: latency, latency_metric: ttft, threshold_ms: 2000}\n\
         \x20 - name: pdf\n    service: chat\n    feature: pdf_analysis\n    criticality: [sheddable]\n    objective_percent: 99\n    period: 28d\n    sli: {kind: availability}\n\
         \x20 - name: tasks\n    service: agent\n    objective_percent: 99\n    period: 28d\n    sli: {kind: task_success}\n",
    );
    let (ttft, pdf, tasks) = (&slos[0], &slos[1], &slos[2]);
    let fast = Observation {
        ttft_ms: Some(1_500.0),
        ..span
    };
    let no_ttft = Observation {
        ttft_ms: None,
        ..span
    };
    let cases = [
        (ttft, span, Some(false)), // 2.5 s > 2 s
        (ttft, fast, Some(true)),
        (ttft, no_ttft, None), // not measured: not counted
        (pdf, span, Some(true)),
        (
            pdf,
            Observation {
                feature: "basic_qa",
                ..span
            },
            None,
        ),
        (
            pdf,
            Observation {
                criticality: Criticality::Critical,
                ..span
            },
            None,
        ),
        (tasks, o, Some(false)),
        (tasks, span, None), // another service
    ];
    for (i, (slo, obs, want)) in cases.into_iter().enumerate() {
        assert_eq!(classify(slo, &obs), want, "case {i}: {} {obs:?}", slo.name);
    }
}

#[test]
fn events_far_in_the_future_are_refused() {
    let handle = SloHandle::new(Evaluator::new(availability("f", "99.9", "28d", 0, "")));
    let now = brownout_protocol::now_ms();
    assert_eq!(handle.record(&request(now + 10 * MIN, true)), 0);
    assert_eq!(handle.record(&request(now + MIN, true)), 1);
    assert_eq!(
        handle.record_all([request(now, false), request(now + HOUR, false)]),
        1
    );
    assert_eq!(handle.stats().dropped_future, 2);
}

#[tokio::test(start_paused = true)]
async fn task_evaluates_on_schedule_and_updates_gauges() {
    let mut ev = Evaluator::new(availability("chat-availability", "99.9", "28d", 0, ""));
    feed(&mut ev, T0, T0 + HOUR, 1_000, |i| i % 50 != 0); // 2% errors → 20×
    let handle = SloHandle::new(ev);
    let registry = prometheus::Registry::new();
    let metrics = SloMetrics::register(&registry).expect("register");
    let mut reports = handle.subscribe();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let anchor = T0 + HOUR;
    let task = tokio::spawn(task::run_anchored(
        handle.clone(),
        Duration::from_secs(5),
        Some(metrics),
        async move {
            let _ = stop_rx.await;
        },
        anchor,
    ));

    reports.changed().await.expect("first report");
    assert_eq!(reports.borrow_and_update().evaluated_at_ms, anchor);
    reports.changed().await.expect("second report");
    let r: Arc<task::SloReport> = reports.borrow_and_update().clone();
    assert_eq!(
        r.evaluated_at_ms,
        anchor + 5_000,
        "every 5 s of (paused) tokio time"
    );
    let s = r.get("chat-availability").expect("status");
    assert!(s.firing().any(|a| a.window == "1h/5m"), "20× > 13.44");

    let text = prometheus::TextEncoder::new()
        .encode_to_string(&registry.gather())
        .expect("encode");
    // The 1 h window at anchor + 5 s holds the events of [T0 + 10 s, T0 + 1 h): 71 bad of 3 590.
    assert!(
        text.contains("brownout_slo_burn_rate{slo=\"chat-availability\",view=\"real_failures\",window=\"1h\"} 19.777159"),
        "{text}"
    );
    // A 20× burn for the 3 605 s of history: 20 × 3 605 / 2 419 200 = 2.98% of the budget.
    assert!(
        text.contains(
            "brownout_slo_error_budget_remaining_ratio{slo=\"chat-availability\",view=\"real_failures\"} 0.970197"
        ),
        "{text}"
    );
    assert!(text.contains("brownout_slo_alert_firing{severity=\"page\",slo=\"chat-availability\",window=\"1h/5m\"} 1"), "{text}");

    stop_tx.send(()).expect("stop");
    task.await.expect("task ends on shutdown");
}

#[tokio::test]
async fn api_lists_slos_and_refuses_unknown_names() {
    use axum::body::Body;
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;

    let mut ev = Evaluator::new(availability("chat-availability", "99.9", "28d", 0, ""));
    feed(&mut ev, T0, T0 + HOUR, 1_000, |_| true);
    let handle = SloHandle::new(ev);
    let app = brownout::slo::router(handle.clone());
    let get = |uri: &str| {
        axum::http::Request::get(uri)
            .body(Body::empty())
            .expect("request")
    };

    // Before the first evaluation the SLO is known but has no status.
    let resp = app
        .clone()
        .oneshot(get("/api/v1/slos/chat-availability"))
        .await
        .expect("response");
    assert_eq!(resp.status(), 503);

    handle.evaluate(T0 + HOUR);
    let resp = app
        .clone()
        .oneshot(get("/api/v1/slos"))
        .await
        .expect("response");
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(v["evaluated_at_ms"], T0 + HOUR);
    let s = &v["slos"][0];
    assert_eq!(s["name"], "chat-availability");
    assert_eq!(s["budget_remaining_ratio"], 1.0);
    assert_eq!(s["alerts"][0]["window"], "1h/5m");
    assert_eq!(s["alerts"][0]["state"], "inactive");
    assert!(
        s["burn_rates"]
            .as_array()
            .is_some_and(|w| w.iter().any(|x| x["window"] == "2m30s"))
    );

    let resp = app
        .clone()
        .oneshot(get("/api/v1/slos/chat-availability"))
        .await
        .expect("response");
    assert_eq!(resp.status(), 200);
    let resp = app
        .oneshot(get("/api/v1/slos/%3Cscript%3E"))
        .await
        .expect("response");
    assert_eq!(resp.status(), 404);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(v["error"]["code"], "slo_not_found");
    assert!(
        !String::from_utf8_lossy(&body).contains("<script>"),
        "the name is not echoed"
    );
}

/// `brownout slo eval` on NDJSON with request lines and failure events: golden output.
#[test]
fn eval_cli_output_matches_golden() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("tempdir");
    // One chat request every 10 s for two hours, then a 15-minute outage reported as failure
    // events (protocol format) — at 0.1 requests/s the page pair waits for enough events.
    let mut ndjson = String::new();
    let start = T0 + 2 * HOUR;
    let mut t = T0;
    while t < start {
        ndjson.push_str(&format!("{{\"ts\":{t},\"service\":\"chat\",\"feature\":\"basic_qa\",\"ok\":true,\"ttft_ms\":800}}\n"));
        t += 10 * SEC;
    }
    while t < start + 15 * MIN {
        ndjson.push_str(&format!(
            "{{\"ts\":{t},\"service\":\"chat\",\"feature\":\"basic_qa\",\"error_type\":\"KVCacheExhausted\",\"message\":\"no free blocks\"}}\n"
        ));
        t += 10 * SEC;
    }
    let events = dir.path().join("events.ndjson");
    std::fs::write(&events, ndjson).expect("write events");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_brownout"))
        .current_dir(&root)
        .args(["slo", "eval", "examples/slo/chat.yaml", "--events"])
        .arg(&events)
        .output()
        .expect("run brownout");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = String::from_utf8(out.stdout).expect("utf-8");
    let path = root.join("tests/golden/slo/eval-chat.txt");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &got).expect("write golden");
    }
    let want = std::fs::read_to_string(&path).expect("golden (UPDATE_GOLDEN=1 to create)");
    assert_eq!(
        got, want,
        "UPDATE_GOLDEN=1 cargo test -p brownout --test it slo_eval:: to accept"
    );
    assert!(got.contains("  page   1h/5m     firing    factor 13.44    SLOErrorBudgetBurn since 2026-01-01T02:00:50Z"), "{got}");
}

#[test]
fn eval_refuses_bad_event_lines_with_their_number() {
    let err = cli::parse_events("{\"ts\":1,\"service\":\"chat\",\"ok\":true}\n{\"ts\":2,\"service\":\"chat\",\"ok\":\"yes\"}\n")
        .expect_err("bad ok");
    assert!(format!("{err:#}").starts_with("line 2"), "{err:#}");
    let err = cli::parse_events("{\"ts\":1,\"service\":\"\",\"message\":\"x\"}\n")
        .expect_err("empty service");
    assert!(
        format!("{err:#}").contains("line 1: field `service`"),
        "{err:#}"
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// Model check: every window's event count and burn rate equal a brute-force count over
    /// the same bucket-aligned window (10 s buckets up to 1 h, 1 min up to 3 d, 1 h beyond).
    #[test]
    fn window_sums_match_a_brute_force_model(
        events in proptest::collection::vec((0u64..4 * 86_400_000, proptest::bool::weighted(0.9)), 1..300),
        now_offset in 0u64..600_000,
    ) {
        let mut events = events;
        events.sort();
        let mut ev = Evaluator::new(availability("m", "99.9", "28d", 0, ""));
        for &(off, ok) in &events {
            ev.record(&request(T0 + off, ok));
        }
        let now = T0 + 4 * 86_400_000 + now_offset;
        let s = ev.evaluate(now).remove(0);
        for w in &s.burn_rates {
            let ms = w.window_secs * 1_000;
            let bucket = if ms <= HOUR { 10 * SEC } else if ms <= 3 * 86_400_000 { MIN } else { HOUR };
            let last = now / bucket;
            let first = last + 1 - ms / bucket;
            let inside: Vec<bool> = events
                .iter()
                .filter(|(off, _)| (first..=last).contains(&((T0 + off) / bucket)))
                .map(|&(_, ok)| ok)
                .collect();
            let bad = inside.iter().filter(|ok| !**ok).count() as f64;
            let want = if inside.is_empty() { 0.0 } else { ((bad / inside.len() as f64 / 0.001) * 1e6).round() / 1e6 };
            proptest::prop_assert_eq!(w.events, inside.len() as u64, "{} window", w.window);
            proptest::prop_assert!((w.burn_rate - want).abs() < 1e-6, "{} window: {} vs {}", w.window, w.burn_rate, want);
        }
        // The 28-day period holds everything recorded (4 days of events).
        proptest::prop_assert_eq!(s.period_events.total, events.len() as u64);
    }
}

/// docs/SLO.md "Deliberate refusals": a request refused on purpose is neither good nor bad for
/// any SLI, and is counted apart. Through both paths: the serving tier's span (attribute
/// `brownout.deliberate`) and a failure event without a trace id marked `deliberate`.
#[test]
fn deliberate_refusals_are_neither_good_nor_bad() {
    let mut ev = Evaluator::new(availability("chat-availability", "99.9", "28d", 0, ""));
    // Inside the last hour's minute buckets: the events run to T0 + 2 997 s.
    let now = T0 + 3_000 * SEC;
    let attrs = |deliberate: &'static str| {
        move |k: &str| match k {
            "brownout.feature" => Some("pdf_analysis"),
            "brownout.deliberate" => Some(deliberate),
            _ => None,
        }
    };
    for i in 0..1_000u64 {
        let ts = T0 + i * 3_000;
        ev.record(&Observation::from_span(
            "chat",
            ts,
            400.0,
            false,
            attrs("false"),
        ));
        if i % 2 == 0 {
            // 500 refusals from the serving tier: no ERROR status, marked deliberate.
            let o = Observation::from_span("chat", ts, 0.3, false, attrs("true"));
            assert!(o.deliberate);
            assert_eq!(classify(&ev.specs().next().unwrap().clone(), &o), None);
            ev.record(&o);
        }
        if i % 10 == 0 {
            // 100 from a gateway: failure events without a trace id, marked deliberate.
            let line = format!(
                r#"{{"ts":{ts},"service":"chat","feature":"pdf_analysis","category":"rate_limited","error_type":"LoadShed","message":"shed at tier 3","attributes":{{"deliberate":"true","outcome":"shed"}}}}"#
            );
            let fe = FailureEvent::parse_line(line.as_bytes()).expect("valid failure");
            assert!(fe.is_deliberate());
            ev.record(&Observation::from_failure(&fe));
        }
    }
    let s = ev.evaluate(now).remove(0);
    assert_eq!(
        (s.period_events.good, s.period_events.total),
        (1_000, 1_000)
    );
    assert_eq!(s.burn_rate(300), Some(0.0));
    assert_eq!(s.budget_remaining_ratio, 1.0);
    assert!(s.firing().next().is_none());
    assert_eq!(
        (s.refused.period, s.refused.last_1h),
        (600, 600),
        "counted apart"
    );
    // The same failure event without the mark is one bad event.
    let line = format!(
        r#"{{"ts":{},"service":"chat","category":"rate_limited","error_type":"LoadShed","message":"shed"}}"#,
        now - 1_000
    );
    let fe = FailureEvent::parse_line(line.as_bytes()).expect("valid failure");
    ev.record(&Observation::from_failure(&fe));
    let s = ev.evaluate(now).remove(0);
    assert_eq!(s.period_events.bad(), 1);
}
