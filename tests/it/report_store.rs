//! The weekly report from a real (SQLite) store: `report::store::week_data`, the `/reports`
//! router and the weekly task.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use brownout::report::store::{self as rstore, week_data};
use brownout::report::week_start_ms;
use brownout::slo::spec::SloSpec;
use brownout::store::sqlite::SqliteStore;
use brownout::store::{Batch, FailureRow, SpanRow, Store, WriteMode};
use brownout_protocol::{Category, Criticality, FailureEvent};
use http_body_util::BodyExt as _;
use tower::ServiceExt as _;

const WEEK: &str = "2026-W48";
const H: u64 = 3_600_000;
const D: u64 = 24 * H;

async fn store() -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(&dir.path().join("t.sqlite")).unwrap();
    s.migrate().await.unwrap();
    (Arc::new(s), dir)
}

fn slos() -> Vec<SloSpec> {
    brownout::slo::spec::parse_str(
        "version: brownout/v1\nslos:\n  - name: muse-availability\n    service: muse\n    objective_percent: 99\n    period: 7d\n    sli:\n      kind: availability\n",
        "test.yaml",
    )
    .unwrap()
}

fn span(n: u64, start_ms: u64, bad: bool) -> SpanRow {
    SpanRow {
        trace_id: format!("{n:032x}"),
        span_id: format!("{n:016x}"),
        parent_span_id: String::new(),
        service: "muse".into(),
        name: "chat".into(),
        kind: 2,
        start_us: start_ms * 1000,
        duration_us: 50_000,
        status: if bad { 2 } else { 1 },
        status_message: String::new(),
        feature: "chat".into(),
        criticality: "default".into(),
        host: "gpu-1".into(),
        is_request: true,
        attributes: vec![],
    }
}

fn failure(n: u64, ts_ms: u64, message: String, category: Category, user: u64) -> FailureRow {
    FailureRow {
        id: format!("f{n}"),
        pattern: String::new(),
        event: FailureEvent {
            ts_ms,
            service: "muse".into(),
            host: "gpu-1".into(),
            request_id: format!("req-{n}"),
            trace_id: format!("{n:032x}"),
            user_id: format!("u{user}"),
            feature: "chat".into(),
            criticality: Criticality::Default,
            category,
            error_type: "E".into(),
            message,
            latency_ms: 10.0,
            attributes: BTreeMap::new(),
        },
    }
}

fn decision(
    at_ms: u64,
    tier: u8,
    previous: u8,
    transition: &str,
    trigger: &str,
    dry_run: bool,
) -> serde_json::Value {
    serde_json::json!({
        "at_ms": at_ms, "tier": tier, "previous": previous, "transition": transition,
        "trigger": trigger, "detail": format!("{trigger} detail"), "reasons": [],
        "dry_run": dry_run, "published": null,
    })
}

/// W48: 1000 requests, 5 bad (half the 1 % weekly budget); W47: 1000 requests, 2 bad. Failures:
/// 30 KV overflows (10 the week before), 12 tool timeouts (new), an episode T1→T3→T2→T0 on
/// Tuesday 10:00–12:00 and a dry-run T2 on Wednesday.
async fn fill(store: &dyn Store) -> u64 {
    let start = week_start_ms(WEEK).unwrap();
    let mut b = Batch::new();
    for i in 0..1000u64 {
        b.spans.push(span(i, start + i * 600_000, i % 200 == 7));
        b.spans
            .push(span(10_000 + i, start - 7 * D + i * 600_000, i % 500 == 3));
    }
    let mut n = 0;
    for i in 0..30u64 {
        n += 1;
        b.failures.push(failure(
            n,
            start + D + i * H,
            format!(
                "KV cache overflow: sequence length {} exceeds max_model_len 8192",
                9000 + i
            ),
            Category::KvCacheExhausted,
            i % 7,
        ));
    }
    for i in 0..10u64 {
        n += 1;
        b.failures.push(failure(
            n,
            start - 6 * D + i * H,
            format!(
                "KV cache overflow: sequence length {} exceeds max_model_len 8192",
                9100 + i
            ),
            Category::KvCacheExhausted,
            i,
        ));
    }
    for i in 0..12u64 {
        n += 1;
        b.failures.push(failure(
            n,
            start + 3 * D + i * H,
            format!("tool weather timed out after {} ms", 30_000 + i),
            Category::TimeoutResource,
            100 + i,
        ));
    }
    store.write_batch(&b, WriteMode::Fresh).await.unwrap();
    let tue = start + D;
    for (at, tier, prev, tr, trig, dry) in [
        (tue + 10 * H, 1, 0, "enter", "slo_burn", false),
        (
            tue + 10 * H + 30 * 60_000,
            3,
            1,
            "enter",
            "gpu_saturation",
            false,
        ),
        (tue + 11 * H, 2, 3, "step_down", "recovery", false),
        (tue + 12 * H, 0, 2, "step_down", "recovery", false),
        (tue + D + 5 * H, 2, 0, "enter", "dry_run_trigger", true),
    ] {
        store
            .put_doc(
                "decision",
                &format!("{at:020}"),
                &decision(at, tier, prev, tr, trig, dry),
            )
            .await
            .unwrap();
    }
    start
}

#[tokio::test]
async fn week_from_the_store_has_patterns_slo_spend_and_episodes() {
    let (store, _dir) = store().await;
    let start = fill(store.as_ref()).await;
    let data = week_data(store.as_ref(), &slos(), WEEK, "c").await.unwrap();
    assert_eq!(data.start_ms, start);
    assert_eq!((data.week.as_str(), data.cluster.as_str()), (WEEK, "c"));

    // Patterns: KV overflow first with its trend, the tool timeout new.
    let mut p = data.patterns.clone();
    p.sort_by_key(|x| std::cmp::Reverse(x.count));
    assert_eq!(p.len(), 2, "{p:#?}");
    assert!(p[0].label.contains("KV cache overflow"), "{}", p[0].label);
    assert_eq!(
        (p[0].count, p[0].last_week_count, p[0].new),
        (30, 10, false)
    );
    assert_eq!(p[0].affected_users, 7);
    assert_eq!(p[0].daily, vec![0, 24, 6, 0, 0, 0, 0]);
    assert!((p[0].budget_impact - 30.0 / 42.0).abs() < 1e-9);
    assert!(p[1].label.contains("timed out"), "{}", p[1].label);
    assert_eq!((p[1].count, p[1].new), (12, true));

    // SLO: 5 bad of 1000 against a 1 % budget = 50 %; last week 2 of 1000 = 20 %.
    assert_eq!(data.slos.len(), 1);
    let s = &data.slos[0];
    assert_eq!(s.name, "muse-availability");
    assert!((s.objective - 0.99).abs() < 1e-12);
    assert!(
        (s.budget_spent_ratio - 0.5).abs() < 1e-9,
        "{}",
        s.budget_spent_ratio
    );
    assert!(
        (s.last_week_budget_spent_ratio - 0.2).abs() < 1e-9,
        "{}",
        s.last_week_budget_spent_ratio
    );
    assert_eq!(s.remaining_by_day.len(), 7);
    assert!((s.remaining_by_day[6] - 0.5).abs() < 1e-9);
    assert!(s.remaining_by_day.windows(2).all(|w| w[1] <= w[0]));

    // One real episode, T3 at its peak, triggered by the first raise; the dry run is skipped.
    assert_eq!(data.episodes.len(), 1, "{:#?}", data.episodes);
    let e = &data.episodes[0];
    assert_eq!(
        (e.start_ms, e.end_ms, e.max_tier),
        (start + D + 10 * H, start + D + 12 * H, 3)
    );
    assert_eq!(e.trigger, "slo_burn");

    // The rendered report carries them.
    let r = brownout::report::build(&data, &brownout::report::Playbook::bundled());
    assert!(!r.empty);
    assert!(r.top[0].pattern.label.contains("KV cache overflow"));
    assert_eq!(r.top[0].trend, "+200%");
    assert_eq!(r.slos[0].spent_pct, "50.0%");
    assert_eq!(r.slos[0].delta, "+30.0 pp");
    assert_eq!(r.episodes[0].max_tier, 3);
    assert_eq!(r.episodes[0].duration, "2 h 00 min");
}

/// The overview lists every configured SLO; the report must too, also one without a single
/// request (the demo's agent SLO before any agent traffic), with no figures made up for it.
#[tokio::test]
async fn an_slo_without_requests_is_listed_without_figures() {
    let (store, _dir) = store().await;
    fill(store.as_ref()).await;
    let mut specs = slos();
    specs.extend(
        brownout::slo::spec::parse_str(
            "version: brownout/v1\nslos:\n  - name: agent-task-success\n    service: agent-nobody-calls\n    objective_percent: 95\n    period: 7d\n    sli:\n      kind: availability\n",
            "idle.yaml",
        )
        .unwrap(),
    );
    let data = week_data(store.as_ref(), &specs, WEEK, "c").await.unwrap();
    assert_eq!(data.slos.len(), 1, "{:#?}", data.slos);
    assert_eq!(data.slos_without_data.len(), 1);
    assert_eq!(data.slos_without_data[0].name, "agent-task-success");
    let r = brownout::report::build(&data, &brownout::report::Playbook::bundled());
    assert_eq!(r.slos.len(), 2, "both SLOs are rows");
    let idle = &r.slos[1];
    assert_eq!(
        (idle.objective_pct.as_str(), idle.spent_pct.as_str()),
        ("95.00%", "\u{2014}")
    );
    assert_eq!(idle.history_note, brownout::report::NO_REQUESTS);
    assert!(
        r.summary
            .contains("agent-task-success had no requests this week or the week before"),
        "{}",
        r.summary
    );
    let html = brownout::report::render(&r, brownout::report::Format::Html).unwrap();
    // SLO names are validated ([a-z0-9-]): nothing in the row needs escaping.
    assert!(html.contains("agent-task-success"));
    assert!(html.contains(brownout::report::NO_REQUESTS));
    let md = brownout::report::render(&r, brownout::report::Format::Md).unwrap();
    assert!(
        md.contains("| agent-task-success (no requests this week or the week before) | 95.00% |"),
        "{md}"
    );
    // An SLO without data does not make an otherwise empty week look like it has data.
    let empty = week_data(store.as_ref(), &specs, "2025-W01", "c")
        .await
        .unwrap();
    assert_eq!(empty.slos_without_data.len(), 2);
    assert!(brownout::report::build(&empty, &brownout::report::Playbook::bundled()).empty);
}

#[test]
fn episodes_are_clipped_to_the_week_and_left_open_until_now() {
    let start = week_start_ms(WEEK).unwrap();
    let rec = |at: u64, tier: u8| {
        serde_json::from_value(decision(at, tier, 0, "enter", "t", false)).unwrap()
    };
    // Raised the week before, back at T0 on Monday 01:00; raised again Sunday 23:00, still up.
    let ds = vec![
        rec(start - H, 2),
        rec(start + H, 0),
        rec(start + 7 * D - H, 1),
    ];
    let eps = rstore::episodes_from_decisions(&ds, start, start + 30 * D);
    assert_eq!(eps.len(), 2, "{eps:#?}");
    assert_eq!(
        (eps[0].start_ms, eps[0].end_ms, eps[0].max_tier),
        (start, start + H, 2)
    );
    assert_eq!(
        (eps[1].start_ms, eps[1].end_ms),
        (start + 7 * D - H, start + 7 * D)
    );
    // Before the week, nothing.
    assert!(rstore::episodes_from_decisions(&ds[..2], start + 7 * D, start + 30 * D).is_empty());
}

/// A stored decision carrying per-instance actions `(instance, action, value)` and the acks it
/// recorded `(instance, status, lag)`.
fn stopbleed_decision(
    at_ms: u64,
    actions: &[(&str, &str, Option<f64>)],
    acks: &[(&str, &str, Option<u64>)],
    dry_run: bool,
) -> serde_json::Value {
    let mut d = decision(at_ms, 0, 0, "hold", "none", dry_run);
    d["instance_actions"] = actions
        .iter()
        .map(|(i, a, v)| {
            serde_json::json!({"instance": i, "action": a, "trigger": if *a == "ramp" { "admission_ramp" } else { "kv_usage" },
                "detail": format!("{a} <b>{i}</b>"), "value": v, "since_ms": at_ms.saturating_sub(1_000)})
        })
        .collect();
    d["instance_acks"] = acks
        .iter()
        .map(|(i, st, lag)| {
            (
                (*i).to_string(),
                serde_json::json!({"status": st, "lag_ms": lag}),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into();
    d
}

/// gpu-1 halved then drained then restored (acked), gpu-2 only watched, the ramp's steps, a
/// dry-run halving (not shown), and a drain left open.
fn stopbleed_decisions(start: u64) -> Vec<serde_json::Value> {
    let m = 60_000;
    vec![
        stopbleed_decision(
            start + H,
            &[
                ("gpu-1/e0", "watch", Some(0.9)),
                ("gpu-2/e0", "watch", Some(0.86)),
            ],
            &[],
            false,
        ),
        stopbleed_decision(
            start + H + m,
            &[
                ("gpu-1/e0", "halve", Some(0.95)),
                ("gpu-2/e0", "watch", Some(0.86)),
            ],
            &[("gpu-1/e0", "pending", None)],
            false,
        ),
        stopbleed_decision(
            start + H + 2 * m,
            &[("gpu-1/e0", "drain", Some(0.96))],
            &[("gpu-1/e0", "applied", Some(35))],
            false,
        ),
        stopbleed_decision(start + H + 9 * m, &[], &[], false),
        stopbleed_decision(
            start + 2 * H,
            &[("gpu-9/e0", "halve", Some(0.99))],
            &[],
            true,
        ),
        stopbleed_decision(
            start + 3 * H,
            &[("*", "ramp", Some(0.7))],
            &[("*", "applied", Some(20))],
            false,
        ),
        stopbleed_decision(
            start + 3 * H + m,
            &[("*", "ramp", Some(0.8))],
            &[("*", "pending", None)],
            false,
        ),
        stopbleed_decision(
            start + 3 * H + 2 * m,
            &[("*", "ramp", Some(0.9)), ("*", "recovery_storm", Some(0.8))],
            &[],
            false,
        ),
        stopbleed_decision(start + 3 * H + 3 * m, &[], &[], false),
        stopbleed_decision(
            start + 5 * D,
            &[("gpu-2/e0", "drain", Some(0.97))],
            &[("gpu-2/e0", "unknown_instance", None)],
            false,
        ),
    ]
}

#[test]
fn stop_bleed_actions_become_incidents_with_their_span_steps_and_ack() {
    let start = week_start_ms(WEEK).unwrap();
    let ds: Vec<brownout::degrade::DecisionRecord> = stopbleed_decisions(start)
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect();
    let now = start + 5 * D + H;
    let inc = rstore::instance_incidents_from_decisions(&ds, start, now);
    let got: Vec<(&str, &str, u64, u64, bool, &str)> = inc
        .iter()
        .map(|i| {
            (
                i.instance.as_str(),
                i.action.as_str(),
                i.start_ms - start,
                i.end_ms - start,
                i.open,
                i.ack.as_str(),
            )
        })
        .collect();
    let m = 60_000;
    assert_eq!(
        got,
        [
            // since_ms is a second before the decision that first carried it.
            (
                "gpu-1/e0",
                "halve",
                H + m - 1_000,
                H + 2 * m,
                false,
                "pending"
            ),
            (
                "gpu-1/e0",
                "drain",
                H + 2 * m - 1_000,
                H + 9 * m,
                false,
                "applied"
            ),
            ("*", "ramp", 3 * H - 1_000, 3 * H + 3 * m, false, "applied"),
            (
                "*",
                "recovery_storm",
                3 * H + 2 * m - 1_000,
                3 * H + 3 * m,
                false,
                "-"
            ),
            (
                "gpu-2/e0",
                "drain",
                5 * D - 1_000,
                5 * D + H,
                true,
                "unknown_instance"
            ),
        ],
        "{inc:#?}"
    );
    assert_eq!(inc[1].ack_lag_ms, Some(35));
    assert_eq!(inc[2].steps, [0.7, 0.8, 0.9]);
    assert_eq!(inc[0].detail, "halve <b>gpu-1/e0</b>");
    // The next week sees only the drain still in force, from its Monday.
    let next = rstore::instance_incidents_from_decisions(&ds, start + 7 * D, now + 7 * D);
    assert_eq!(next.len(), 1, "{next:#?}");
    assert_eq!(
        (next[0].instance.as_str(), next[0].start_ms, next[0].open),
        ("gpu-2/e0", start + 7 * D, true)
    );
    // The week before sees nothing.
    assert!(rstore::instance_incidents_from_decisions(&ds, start - 7 * D, start - D).is_empty());
}

#[tokio::test]
async fn a_report_built_from_stored_decisions_lists_the_stop_bleed_actions_escaped() {
    let (store, _dir) = store().await;
    let start = week_start_ms(WEEK).unwrap();
    for d in stopbleed_decisions(start) {
        let key = format!("{:020}", d["at_ms"].as_u64().unwrap());
        store.put_doc("decision", &key, &d).await.unwrap();
    }
    let data = rstore::week_data_at(store.as_ref(), &slos(), WEEK, "prod", start + 7 * D)
        .await
        .unwrap();
    assert_eq!(
        data.instance_actions.len(),
        5,
        "{:#?}",
        data.instance_actions
    );
    assert!(
        data.episodes.is_empty(),
        "per-instance actions are not tier episodes"
    );
    let r = brownout::report::build(&data, &brownout::report::Playbook::bundled());
    assert!(!r.empty);
    assert_eq!(
        r.instance_actions[1].what,
        "drained (only critical admitted)"
    );
    assert_eq!(r.instance_actions[1].duration, "7 min");
    assert_eq!(r.instance_actions[1].ack, "applied (lag 35 ms)");
    let html = brownout::report::render(&r, brownout::report::Format::Html).unwrap();
    assert!(html.contains("<section id=\"instance-actions\">"));
    assert!(html.contains("data-action=\"drain\""));
    assert!(
        html.contains("&lt;b&gt;gpu-1&#x2F;e0&lt;&#x2F;b&gt;"),
        "escaped"
    );
    assert!(!html.contains("<b>gpu-1"), "no raw markup");
    let md = brownout::report::render(&r, brownout::report::Format::Md).unwrap();
    assert!(
        md.contains("admission ramp 70% \u{2192} 80% \u{2192} 90%"),
        "{md}"
    );
    assert!(md.contains("recovery storm (retry waves)"));
    assert!(!md.contains("<b>"));
}

async fn get(app: &axum::Router, uri: &str) -> (StatusCode, String, String) {
    let res = app
        .clone()
        .oneshot(Request::get(uri).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let ct = res
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, ct, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn router_serves_every_format_refuses_bad_weeks_and_says_no_data() {
    let (store, _dir) = store().await;
    fill(store.as_ref()).await;
    let app = rstore::router(store.clone(), Arc::new(slos()), "c<b>".into());

    let (st, ct, html) = get(&app, "/reports/2026-W48").await;
    assert_eq!(st, StatusCode::OK);
    assert!(ct.starts_with("text/html"), "{ct}");
    assert!(html.contains("KV cache overflow") && html.contains("c&lt;b&gt;"));
    assert!(!html.contains("c<b>"));

    let (st, ct, md) = get(&app, "/reports/2026-W48?format=md").await;
    assert_eq!(st, StatusCode::OK);
    assert!(ct.starts_with("text/markdown"), "{ct}");
    assert!(md.contains("## Roadmap") && md.contains("50.0%"));

    let (st, ct, json) = get(&app, "/reports/2026-W48?format=json").await;
    assert_eq!(st, StatusCode::OK);
    assert!(ct.starts_with("application/json"), "{ct}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["week"], WEEK);
    assert_eq!(v["episodes"][0]["max_tier"], 3);

    for bad in [
        "/reports/2026-W99",
        "/reports/yesterday",
        "/reports/2026-W48?format=pdf",
    ] {
        let (st, _, msg) = get(&app, bad).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{bad}");
        assert!(!msg.is_empty());
    }

    let (st, _, md) = get(&app, "/reports/2026-W10?format=md").await;
    assert_eq!(st, StatusCode::OK);
    assert!(md.contains("No data was recorded"), "{md}");
    for w in ["current", "last"] {
        let (st, _, _) = get(&app, &format!("/reports/{w}?format=json")).await;
        assert_eq!(st, StatusCode::OK, "{w}");
    }
}

#[tokio::test]
async fn stored_reports_are_served_and_listed_escaped() {
    let (store, _dir) = store().await;
    let mut data = week_data(store.as_ref(), &slos(), "2026-W40", "c")
        .await
        .unwrap();
    assert!(data.patterns.is_empty() && data.slos.is_empty() && data.episodes.is_empty());
    data.episodes.push(brownout::report::Episode {
        start_ms: data.start_ms,
        end_ms: data.start_ms + H,
        max_tier: 2,
        trigger: "stored-marker".into(),
        detail: String::new(),
        steps: vec![],
        refused: vec![],
    });
    store
        .put_doc(
            "report",
            "c:2026-W40",
            &serde_json::to_value(&data).unwrap(),
        )
        .await
        .unwrap();
    store
        .put_doc("report", "c:<script>", &serde_json::json!({}))
        .await
        .unwrap();
    store
        .put_doc("report", "other:2026-W41", &serde_json::json!({}))
        .await
        .unwrap();
    let app = rstore::router(store.clone(), Arc::new(slos()), "c".into());
    let (st, _, json) = get(&app, "/reports/2026-W40?format=json").await;
    assert_eq!(st, StatusCode::OK);
    assert!(json.contains("stored-marker"));
    let (st, ct, html) = get(&app, "/reports").await;
    assert_eq!(st, StatusCode::OK);
    assert!(ct.starts_with("text/html"));
    assert!(html.contains("href=\"/reports/2026-W40\""));
    assert!(!html.contains("<script>") && !html.contains("2026-W41"));
}

#[tokio::test]
async fn weekly_task_stores_last_weeks_report_once() {
    let (store, _dir) = store().await;
    let slos = Arc::new(slos());
    let key = rstore::report_key("c", &rstore::last_week());
    assert!(store.get_doc("report", &key).await.unwrap().is_none());
    rstore::run_weekly(
        store.clone(),
        slos.clone(),
        "c".into(),
        std::future::ready(()),
    )
    .await;
    let first = store
        .get_doc("report", &key)
        .await
        .unwrap()
        .expect("stored");
    let data: brownout::report::WeekData = serde_json::from_value(first.value.clone()).unwrap();
    assert_eq!(data.week, rstore::last_week());
    assert_eq!(data.start_ms, week_start_ms(&rstore::last_week()).unwrap());
    rstore::run_weekly(store.clone(), slos, "c".into(), std::future::ready(())).await;
    let again = store.get_doc("report", &key).await.unwrap().unwrap();
    assert_eq!(again.updated_ms, first.updated_ms, "written twice");
    assert!(
        !rstore::ensure_stored(store.as_ref(), &[], "c", &rstore::last_week())
            .await
            .unwrap()
    );
}

/// The composed plane serves `/reports` behind the read token and stores last week's report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plane_serves_reports_behind_the_read_token_and_stores_last_week() {
    use brownout::auth::{Role, Tokens};
    use brownout::degrade::{InProcBus, Transport};
    use brownout::plane::{App, Listeners};
    use brownout::plane::{Plane, PlaneOptions};
    let dir = tempfile::tempdir().unwrap();
    let mut config = brownout::config::Config::defaults();
    config.data_dir = dir.path().to_path_buf();
    let tokens = Tokens::random();
    let read = tokens.get(Role::Read).unwrap().expose().to_string();
    let app = App::build(config, tokens).await.unwrap();
    let mut opts = PlaneOptions::defaults(
        "rep",
        b"key-key-key-key-key",
        Transport::InProc(InProcBus::new()),
    )
    .unwrap();
    opts.ui = None;
    let plane = Plane::start(app, Listeners::loopback().await.unwrap(), opts)
        .await
        .unwrap();
    let base = format!("http://{}", plane.running.http_addr);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    let res = client
        .get(format!("{base}/reports/last"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), reqwest::StatusCode::UNAUTHORIZED);
    let res = client
        .get(format!("{base}/reports/last?format=json"))
        .bearer_auth(&read)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), reqwest::StatusCode::OK);
    let v: serde_json::Value = res.json().await.unwrap();
    assert_eq!(v["week"], rstore::last_week());
    assert_eq!(v["cluster"], "rep");
    let key = rstore::report_key("rep", &rstore::last_week());
    let store = plane.state().store.clone();
    let mut stored = None;
    for _ in 0..100 {
        stored = store.get_doc("report", &key).await.unwrap();
        if stored.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(stored.is_some(), "the weekly task did not store {key}");
    plane.stop().await.unwrap();
}

/// `brownout report --store` reads the SQLite store under BROWNOUT_DATA_DIR (with the embedded
/// SLOs, so no SLO of this test's service appears).
#[tokio::test]
async fn cli_reads_the_store_under_the_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = SqliteStore::open(&dir.path().join("brownout.sqlite")).unwrap();
        s.migrate().await.unwrap();
        fill(&s).await;
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_brownout"))
        .args([
            "report",
            "--week",
            WEEK,
            "--cluster",
            "c",
            "--format",
            "json",
            "--store",
        ])
        .env("BROWNOUT_DATA_DIR", dir.path())
        .env_remove("CLICKHOUSE_URL")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["top"][0]["label"]
            .as_str()
            .unwrap()
            .contains("KV cache overflow"),
        "{v}"
    );
    assert_eq!(v["top"][0]["count"], 30);
    assert_eq!(v["episodes"][0]["max_tier"], 3);
    assert_eq!(v["empty"], false);
}

/// brownout's own refusals beside real failures (docs/SLO.md "Deliberate refusals"): a fresh
/// install's first ten minutes, with an operator pin of T2 for a minute, then T1 on queue depth.
/// The refusals are the episode's cost and the SLO's "refused on purpose", never a pattern or a
/// bad event; the real failures are what is ranked; the budget is projected from ten minutes,
/// and only Monday is drawn.
#[tokio::test]
async fn own_refusals_beside_real_failures_only_the_real_ones_are_ranked() {
    let (store, _dir) = store().await;
    const W: &str = "2026-W49";
    let start = week_start_ms(W).unwrap();
    let now = start + 10 * 60_000;
    let slos = brownout::slo::spec::parse_str(
        "version: brownout/v1\nslos:\n  - name: chat-availability\n    service: chat\n    objective_percent: 99.9\n    period: 28d\n    sli:\n      kind: availability\n",
        "test.yaml",
    )
    .unwrap();
    let features = [
        "basic_qa",
        "pdf_analysis",
        "image_generation",
        "simple_tasks",
    ];
    // Degraded from 180 s to 300 s: T2 (operator) then T1 (queue depth); both disable
    // pdf_analysis and image_generation.
    let degraded = |t: u64| (180..300).contains(&t);
    let mut b = Batch::new();
    let (mut refused, mut bad, mut total) = (0u64, 0u64, 0u64);
    let real = [
        (
            Category::TimeoutResource,
            "request waited 20000 ms in the GPU queue and timed out",
        ),
        (
            Category::ToolUnavailable,
            "tool web_search timed out after 8000 ms",
        ),
        (
            Category::KvCacheExhausted,
            "KV cache exhausted: no free blocks for seq 4711",
        ),
    ];
    let mut real_counts = [0u64; 3];
    for t in 0..600u64 {
        let ts = start + t * 1000;
        let feature = features[(t % 4) as usize];
        let mut s = span(t, ts, false);
        s.service = "chat".into();
        s.feature = feature.into();
        s.attributes
            .push(("brownout.feature".into(), feature.into()));
        let mut f = failure(t, ts, String::new(), Category::Other, t % 13);
        f.event.service = "chat".into();
        f.event.feature = feature.into();
        if degraded(t) && (feature == "pdf_analysis" || feature == "image_generation") {
            // The serving tier's refusal: a span marked deliberate without ERROR status, and a
            // failure event marked deliberate.
            s.attributes
                .push(("brownout.deliberate".into(), "true".into()));
            s.attributes
                .push(("brownout.outcome".into(), "feature_disabled".into()));
            s.duration_us = 300;
            f.event.category = Category::Degraded;
            f.event.error_type = "FeatureDisabled".into();
            f.event.message = format!(
                "feature {feature} disabled at tier {}",
                if t < 240 { 2 } else { 1 }
            );
            f.event
                .attributes
                .insert("deliberate".into(), "true".into());
            f.event
                .attributes
                .insert("outcome".into(), "feature_disabled".into());
            b.failures.push(f);
            refused += 1;
        } else if t % 7 == 3 {
            // A real failure: an error span and its failure event.
            let k = (t % 3) as usize;
            s.status = 2;
            f.event.category = real[k].0;
            f.event.message = real[k].1.to_string();
            b.failures.push(f);
            real_counts[k] += 1;
            bad += 1;
            total += 1;
        } else {
            total += 1;
        }
        b.spans.push(s);
    }
    store.write_batch(&b, WriteMode::Fresh).await.unwrap();
    for (at, tier, prev, tr, trig) in [
        (start + 180_000, 2, 0, "override", "operator"),
        (start + 240_000, 1, 2, "step_down", "queue_depth"),
        (start + 300_000, 0, 1, "step_down", "recovered"),
    ] {
        store
            .put_doc(
                "decision",
                &format!("{at:020}"),
                &decision(at, tier, prev, tr, trig, false),
            )
            .await
            .unwrap();
    }

    let data = rstore::week_data_at(store.as_ref(), &slos, W, "c", now)
        .await
        .unwrap();
    // Patterns: the three real failure kinds, nothing of brownout's own.
    assert_eq!(data.patterns.len(), 3, "{:#?}", data.patterns);
    assert!(
        data.patterns.iter().all(|p| !p.label.contains("disabled")),
        "{:#?}",
        data.patterns
    );
    assert_eq!(
        data.patterns.iter().map(|p| p.count).sum::<u64>(),
        real_counts.iter().sum::<u64>()
    );
    // Only Monday is reached.
    assert!(data.patterns.iter().all(|p| p.daily.len() == 1));
    assert_eq!(data.as_of_ms, Some(now));

    // The refusals: the week's, and the episode's cost.
    assert_eq!(data.refusals.len(), 1, "{:?}", data.refusals);
    assert_eq!(
        (data.refusals[0].outcome.as_str(), data.refusals[0].count),
        ("feature_disabled", refused)
    );
    assert_eq!(
        data.refusals[0].features,
        ["image_generation", "pdf_analysis"]
    );
    assert_eq!(data.episodes.len(), 1, "{:#?}", data.episodes);
    let e = &data.episodes[0];
    assert_eq!(
        e.steps
            .iter()
            .map(|s| (s.tier, s.trigger.as_str()))
            .collect::<Vec<_>>(),
        [(2, "operator"), (1, "queue_depth")]
    );
    assert_eq!(e.refused[0].count, refused);

    // The SLO: refusals in neither good nor total; ten minutes of history, projected.
    let s = &data.slos[0];
    assert_eq!(s.refused, refused);
    let burn = bad as f64 / total as f64 / 0.001;
    assert!((s.burn_rate.unwrap() - burn).abs() < 1e-3, "{s:?}");
    let covered_days = 10.0 / 1440.0;
    assert!(
        (s.history_days.unwrap() - covered_days).abs() < 1e-9,
        "{s:?}"
    );
    assert!(
        (s.budget_spent_ratio - burn * covered_days / 28.0).abs() < 1e-9,
        "{s:?}"
    );
    assert!(
        s.budget_spent_ratio < 0.1,
        "not thousands of percent: {s:?}"
    );
    // At this rate the whole budget lasts 28 d / burn from the first request.
    let want_out = start + (28.0 / burn * 86_400_000.0) as u64;
    assert!(s.runs_out_ms.unwrap().abs_diff(want_out) < 2, "{s:?}");
    assert_eq!(s.remaining_by_day.len(), 1, "only Monday is drawn");

    // The report ranks the real failures and shows the cost.
    let r = brownout::report::build(&data, &brownout::report::Playbook::bundled());
    let mut cats: Vec<&str> = r.top.iter().map(|t| t.pattern.category.as_str()).collect();
    cats.sort_unstable();
    assert_eq!(
        cats,
        ["kv_cache_exhausted", "timeout_resource", "tool_unavailable"]
    );
    assert_eq!(r.roadmap.len(), 3);
    assert_eq!(
        r.episodes[0].tiers,
        "T2 1 min (operator) \u{2192} T1 1 min (queue_depth)"
    );
    assert_eq!(
        r.episodes[0].cost,
        format!("disabled {refused} calls of image_generation, pdf_analysis")
    );
    assert!(r.summary.contains("of data so far"), "{}", r.summary);
    assert!(!r.summary.contains("disabled at tier"), "{}", r.summary);
    assert_eq!(r.slos[0].history_note, "projected from 10 min of data");

    // And its export: a header and three issues for Jira, three bodies for GitHub.
    let csv = brownout::report::export::jira_csv(&r);
    assert_eq!(csv.matches("\r\n\"").count(), 3, "{csv}");
    assert!(csv.starts_with("\"Summary\",\"Issue Type\",\"Priority\",\"Labels\""));
    for n in 1..=3 {
        let body = brownout::report::export::github_md(&r, Some(n)).unwrap();
        assert!(
            body.contains("## Change") && body.contains("- [ ] "),
            "{body}"
        );
    }
    assert!(brownout::report::export::github_md(&r, Some(4)).is_none());
}

#[tokio::test]
async fn exports_are_served_for_a_week() {
    let (store, _dir) = store().await;
    fill(store.as_ref()).await;
    let app = rstore::router(store.clone(), Arc::new(slos()), "c".into());
    let (st, ct, csv) = get(&app, "/reports/2026-W48/export.csv").await;
    assert_eq!(st, StatusCode::OK);
    assert!(ct.starts_with("text/csv"), "{ct}");
    assert!(
        csv.starts_with("\"Summary\",") && csv.contains("KV cache overflow"),
        "{csv}"
    );
    let (st, ct, md) = get(&app, "/reports/2026-W48/export.md?item=1").await;
    assert_eq!(st, StatusCode::OK);
    assert!(ct.starts_with("text/markdown"), "{ct}");
    assert!(
        md.contains("roadmap item 1") && md.contains("KV cache overflow"),
        "{md}"
    );
    let (st, _, all) = get(&app, "/reports/2026-W48/export.md").await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        all.matches("\n# ").count() + usize::from(all.starts_with("# ")),
        2,
        "{all}"
    );
    let (st, _, _) = get(&app, "/reports/2026-W48/export.md?item=3").await;
    assert_eq!(st, StatusCode::NOT_FOUND, "two roadmap items only");
    let (st, _, _) = get(&app, "/reports/2026-W48/export.md?item=x").await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
}
