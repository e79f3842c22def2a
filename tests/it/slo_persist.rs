//! Error budgets from the store (docs/SLO.md "Stored SLI buckets", "Two views of one budget",
//! "Pattern impact"), against real stores and real processes:
//!
//! - the real `brownout serve` binary ingests spans with known good/bad counts over the last
//!   hours, is killed with SIGKILL and restarted on the same data dir (SQLite) or the same
//!   ClickHouse: budget left, the burn rate of every window and the alert states (with their
//!   since-times) are what they were;
//! - two control planes on one ClickHouse, each fed a different share of the traffic, report
//!   the same budget, and the controller inputs a new leader would read are the same;
//! - an objective changed between two starts applies to the stored history at once;
//! - refusals on purpose (what a pinned T3 makes the serving tier answer) burn the user-felt
//!   budget and neither the real-failure budget nor the alerts the triggers read;
//! - failures with known shares of the SLO-bad events come out ranked by that share, and a
//!   pattern on a service with no SLO has impact 0 however many failures it has.

use std::time::Duration;

use crate::ingest_crash::{INGEST, READ, Serve};

use brownout::auth::Tokens;
use brownout::config::Config;
use brownout::degrade::{InProcBus, Transport};
use brownout::ingest::Accepted;
use brownout::plane::{App, Listeners, Plane, PlaneOptions};
use brownout::slo::{CountSource, SloStatus};
use brownout::store::SpanRow;
use brownout_protocol::{FailureEvent, now_ms};
use brownout_test_support::eventually_async;
use serde_json::{Value, json};

const MIN: u64 = 60_000;

/// 99 % over 28 days. The page pair stays pending through a test (30 min); the ticket pair
/// fires at once, so its since-time shows whether the state was restored or begun again.
fn spec_yaml(objective_percent: f64) -> String {
    format!(
        "version: brownout/v1
slos:
  - name: chat-availability
    service: chat
    objective_percent: {objective_percent}
    period: 28d
    sli: {{kind: availability}}
    min_events: 10
    alerting:
      page: {{pending: 30m}}
      ticket: {{pending: 0s}}
"
    )
}

fn specs(objective_percent: f64) -> Vec<brownout::slo::SloSpec> {
    brownout::slo::spec::parse_str(&spec_yaml(objective_percent), "persist.yaml")
        .unwrap_or_else(|e| panic!("{e}"))
}

/// One request span of `chat` ending at `end_ms`.
fn span(i: u64, end_ms: u64, error: bool, deliberate: bool) -> SpanRow {
    let mut attributes = vec![("brownout.feature".to_string(), "basic_qa".to_string())];
    if deliberate {
        attributes.push(("brownout.deliberate".into(), "true".into()));
    }
    SpanRow {
        trace_id: format!("{:032x}", i + 1),
        span_id: format!("{:016x}", i + 1),
        parent_span_id: String::new(),
        service: "chat".into(),
        name: "chat".into(),
        kind: 2,
        start_us: (end_ms - 40) * 1000,
        duration_us: 40_000,
        status: if error { 2 } else { 1 },
        status_message: String::new(),
        feature: "basic_qa".into(),
        criticality: "default".into(),
        host: "gpu-1".into(),
        is_request: true,
        attributes,
    }
}

/// Known traffic: 20 requests a minute from `minutes` minutes before `now`'s minute to three
/// minutes before it (the seconds-scale window holds none of them); one in 20 failing, five in
/// 20 in the last hour of it. Returns the spans and how many failed.
fn known_traffic(now: u64, minutes: u64) -> (Vec<SpanRow>, u64) {
    let m0 = now - now % MIN;
    let mut out = Vec::new();
    let mut bad = 0;
    for m in 3..minutes {
        let start = m0 - m * MIN;
        let failing = if m <= 60 { 5 } else { 1 };
        for k in 0..20u64 {
            let error = k < failing;
            bad += u64::from(error);
            out.push(span(
                out.len() as u64,
                start + 1_000 + k * 2_000,
                error,
                false,
            ));
        }
    }
    (out, bad)
}

/// The spans as OTLP/JSON (hex ids, nanosecond strings).
fn otlp_json(spans: &[SpanRow]) -> Value {
    let spans: Vec<Value> = spans
        .iter()
        .map(|s| {
            let attrs: Vec<Value> = s
                .attributes
                .iter()
                .map(|(k, v)| json!({"key": k, "value": {"stringValue": v}}))
                .collect();
            json!({
                "traceId": s.trace_id, "spanId": s.span_id, "name": s.name, "kind": 2,
                "startTimeUnixNano": (s.start_us * 1000).to_string(),
                "endTimeUnixNano": ((s.start_us + s.duration_us) * 1000).to_string(),
                "status": {"code": s.status}, "attributes": attrs,
            })
        })
        .collect();
    json!({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "chat"}}]},
        "scopeSpans": [{"spans": spans}],
    }]})
}

/// `brownout serve` (`ingest_crash`'s child process) over one data dir, with the SLO file.
struct ServeProcess {
    serve: Serve,
}

impl ServeProcess {
    fn on(
        dir: &std::path::Path,
        objective_percent: f64,
        clickhouse: Option<(&str, &str)>,
    ) -> ServeProcess {
        let serve = Serve::new(dir, clickhouse);
        let slo = dir.join("slo.yaml");
        std::fs::write(&slo, spec_yaml(objective_percent)).unwrap();
        let mut toml = std::fs::read_to_string(&serve.config).unwrap();
        toml.push_str(&format!("\n[control]\nslo_file = \"{}\"\n", slo.display()));
        std::fs::write(&serve.config, toml).unwrap();
        ServeProcess { serve }
    }

    async fn start(&mut self) {
        self.serve.spawn();
        Serve::wait_ready(self.serve.url(), self.serve.log.clone())
            .await
            .unwrap();
    }

    fn kill9(&mut self) {
        self.serve.kill9();
    }

    async fn send(&self, spans: &[SpanRow]) {
        let c = reqwest::Client::new();
        for chunk in spans.chunks(500) {
            let r = c
                .post(format!("{}/v1/traces", self.serve.url()))
                .bearer_auth(INGEST)
                .json(&otlp_json(chunk))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{:?}", r.text().await);
        }
    }

    /// `GET /api/v1/slos/chat-availability`; `None` before the first evaluation (503).
    async fn try_slo(&self) -> Option<SloStatus> {
        let r = reqwest::Client::new()
            .get(format!(
                "{}/api/v1/slos/chat-availability",
                self.serve.url()
            ))
            .bearer_auth(READ)
            .send()
            .await
            .unwrap();
        match r.status().as_u16() {
            200 => Some(r.json().await.unwrap()),
            503 => None,
            s => panic!("{s}: {:?}", r.text().await),
        }
    }

    /// The status once it counts `total` events from the store.
    async fn slo_with(&self, total: u64) -> SloStatus {
        let mut last = None;
        for _ in 0..600 {
            if let Some(s) = self.try_slo().await {
                if s.period_events.total == total && s.source == CountSource::Store {
                    return s;
                }
                last = Some(s);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "the SLO never counted {total} events from the store: {last:?}\n{}",
            std::fs::read_to_string(&self.serve.log).unwrap_or_default()
        );
    }
}

/// The budget figures move with the history's length by the second: equal within one
/// minute's worth of the period's burn.
fn close(a: f64, b: f64, burn: f64, period_secs: u64) -> bool {
    (a - b).abs() <= burn * 60.0 / period_secs as f64 + 1e-6
}

fn alert_states(s: &SloStatus) -> Vec<(String, String, Value)> {
    s.alerts
        .iter()
        .map(|a| {
            (
                a.alert.clone(),
                a.window.clone(),
                serde_json::to_value(a.state).unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_killed_and_restarted_reports_the_same_budget_burn_rates_and_alerts() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    killed_and_restarted_on(ServeProcess::on(dir.path(), 99.0, None)).await;
}

/// The same on ClickHouse (the harness's server): the restarted process reads the buckets
/// (`sli_rows` → `sli_mv` → `sli_buckets`) and the alert states back from the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_on_clickhouse_killed_and_restarted_reports_the_same_budget_burn_rates_and_alerts()
 {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let (cfg, own) =
        crate::ingest_spool_clickhouse::clickhouse_for_test(dir.path(), "slokill").await;
    let data = dir.path().join("plane");
    std::fs::create_dir_all(&data).unwrap();
    killed_and_restarted_on(ServeProcess::on(
        &data,
        99.0,
        Some((&cfg.url, &cfg.table_prefix)),
    ))
    .await;
    drop(own);
}

/// Known traffic over 170 minutes, SIGKILL, restart on the same data dir (and store): the
/// budget, every window's burn rate and the alert states with their since-times are the same.
async fn killed_and_restarted_on(mut serve: ServeProcess) {
    serve.start().await;
    // Early in a minute: before and after the restart fall in the same minute (every window
    // is minute-aligned).
    let s = (now_ms() / 1000) % 60;
    if s > 15 {
        tokio::time::sleep(Duration::from_secs(61 - s)).await;
    }
    let (spans, bad) = known_traffic(now_ms(), 170);
    let total = spans.len() as u64;
    serve.send(&spans).await;
    let first = serve.slo_with(total).await;
    assert_eq!(first.period_events.bad(), bad);
    // The next evaluation, after the loop stored this one's alert states.
    let before = loop {
        let s = serve.try_slo().await.unwrap();
        if s.evaluated_at_ms > first.evaluated_at_ms {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(alert_states(&before), alert_states(&first), "stable states");
    let states: Vec<&str> = before.alerts.iter().map(|a| a.state.name()).collect();
    assert!(
        states.contains(&"firing") && states.contains(&"pending"),
        "{states:?}"
    );
    assert!(before.budget_remaining_ratio < 1.0);

    serve.kill9();
    serve.start().await;
    let after = serve.slo_with(total).await;
    assert_eq!(
        before.evaluated_at_ms / MIN,
        after.evaluated_at_ms / MIN,
        "the restart took more than the rest of the minute"
    );
    assert_eq!(after.period_events, before.period_events);
    assert_eq!(after.burn_rates, before.burn_rates, "every window");
    assert_eq!(
        alert_states(&after),
        alert_states(&before),
        "alert states restored"
    );
    let burn = before.period_events.bad() as f64 / before.period_events.total as f64 / 0.01;
    assert!(
        close(
            after.budget_remaining_ratio,
            before.budget_remaining_ratio,
            burn,
            before.period_secs
        ),
        "budget left {} then {}",
        before.budget_remaining_ratio,
        after.budget_remaining_ratio
    );
    assert!(after.history_secs >= before.history_secs);
    assert!(
        after.history_secs > 160 * 60,
        "history = since the first stored event"
    );
}

fn config_in(dir: &std::path::Path) -> Config {
    let mut config = Config::defaults();
    config.data_dir = dir.to_path_buf();
    config
}

async fn plane(config: Config, objective_percent: f64) -> Plane {
    let app = App::build(config, Tokens::random()).await.unwrap();
    let mut opts = PlaneOptions::defaults(
        "slo-persist",
        b"key-key-key-key-key",
        Transport::InProc(InProcBus::new()),
    )
    .unwrap();
    opts.ui = None;
    opts.slos = specs(objective_percent);
    opts.slo_interval = Duration::from_millis(200);
    opts.patterns_interval = Duration::from_millis(200);
    Plane::start(app, Listeners::loopback().await.unwrap(), opts)
        .await
        .unwrap()
}

/// Through the durable ingest path (what every receiver ends in).
async fn ingest(p: &Plane, spans: Vec<SpanRow>, failures: Vec<FailureEvent>) {
    let requests = spans
        .chunks(500)
        .map(|c| Accepted {
            spans: c.to_vec(),
            ..Accepted::default()
        })
        .chain(failures.chunks(200).map(|c| Accepted {
            failures: c.to_vec(),
            ..Accepted::default()
        }));
    for rows in requests {
        let bytes = (rows.spans.len() + rows.failures.len()) * 2048;
        brownout::ingest::accept(&p.state().ingest, "default", rows, bytes)
            .await
            .unwrap();
    }
}

/// The plane's status of the SLO once it counts `total` events from the store.
async fn counted(p: &Plane, total: u64) -> SloStatus {
    let slo = p.slo.clone();
    let last = std::sync::Mutex::new(None);
    let got = brownout_test_support::poll(Duration::from_secs(60), || {
        let status = slo.latest().get("chat-availability").cloned();
        let seen = status.as_ref().map(|s| (s.period_events.total, s.source));
        *last.lock().unwrap() = seen;
        async move {
            status.filter(|s| s.period_events.total == total && s.source == CountSource::Store)
        }
    })
    .await;
    got.unwrap_or_else(|| {
        panic!(
            "gave up waiting for {total} events counted from the store; last seen (total, source): {:?}",
            last.lock().unwrap()
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_fed_different_shares_report_the_same_budget() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tmp = tempfile::tempdir().unwrap();
    let (cfg, _own) = crate::ingest_spool_clickhouse::clickhouse_for_test(tmp.path(), "rep").await;
    let (da, db) = (tmp.path().join("a"), tmp.path().join("b"));
    let mut ca = config_in(&da);
    ca.clickhouse = Some(cfg.clone());
    let mut cb = config_in(&db);
    cb.clickhouse = Some(cfg.clone());
    let a = plane(ca, 99.0).await;
    let b = plane(cb, 99.0).await;
    // Old traffic only (the newest three minutes empty): at 30 % / 70 % of it.
    let (spans, _) = known_traffic(now_ms(), 90);
    let total = spans.len() as u64;
    let (to_a, to_b): (Vec<_>, Vec<_>) =
        spans.into_iter().enumerate().partition(|(i, _)| i % 10 < 3);
    ingest(&a, to_a.into_iter().map(|(_, s)| s).collect(), vec![]).await;
    ingest(&b, to_b.into_iter().map(|(_, s)| s).collect(), vec![]).await;
    let (sa, sb) = (counted(&a, total).await, counted(&b, total).await);
    assert_eq!(sa.period_events, sb.period_events);
    assert!(close(
        sa.budget_remaining_ratio,
        sb.budget_remaining_ratio,
        sa.burn_rates.last().map_or(1.0, |w| w.burn_rate),
        sa.period_secs
    ));
    // Every window counted from the store (5 minutes and more) agrees; the seconds-scale one
    // (in memory) is empty on both.
    assert_eq!(sa.burn_rates, sb.burn_rates, "a: {sa:?}\nb: {sb:?}");
    assert!(sa.burn_rates.iter().any(|w| w.burn_rate > 0.0));
    // What the degradation controller reads: a new leader decides on the same inputs.
    let inputs = |s: &SloStatus| {
        brownout::plane::feeders::slo_alerts(&brownout::slo::SloReport {
            evaluated_at_ms: 0,
            slos: vec![s.clone()],
        })
        .into_iter()
        .map(|x| (x.window, x.firing, x.burn_rate.to_bits()))
        .collect::<Vec<_>>()
    };
    a.stop().await.unwrap();
    let sb2 = counted(&b, total).await;
    assert_eq!(
        inputs(&sb2),
        inputs(&sa),
        "the survivor acts on the same budget"
    );
    b.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_objective_applies_to_the_stored_history() {
    let dir = tempfile::tempdir().unwrap();
    let p = plane(config_in(dir.path()), 99.0).await;
    let (spans, bad) = known_traffic(now_ms(), 90);
    let total = spans.len() as u64;
    ingest(&p, spans, vec![]).await;
    let at99 = counted(&p, total).await;
    p.stop().await.unwrap();
    // The spec edited to 99.9 %: ten times less budget, the same stored events.
    let p = plane(config_in(dir.path()), 99.9).await;
    let at999 = counted(&p, total).await;
    assert_eq!(at999.period_events, at99.period_events);
    assert_eq!(at999.objective, 0.999);
    let ratio = bad as f64 / total as f64;
    for w99 in &at99.burn_rates {
        // 99.9 % has one pair more (the fast burn, unreachable at 99 %): match by window.
        let w999 = at999
            .burn_rates
            .iter()
            .find(|w| w.window_secs == w99.window_secs)
            .unwrap();
        if w99.window_secs >= 300 {
            assert!(
                (w999.burn_rate - 10.0 * w99.burn_rate).abs() < 1e-3,
                "{w99:?} {w999:?}"
            );
        }
    }
    // The budget spent: the period's burn × history / period, at the new objective.
    let want = ratio / 0.001 * at999.history_secs as f64 / at999.period_secs as f64;
    assert!(
        (at999.budget_spent_ratio - want).abs() < 1e-3,
        "{} vs {want}",
        at999.budget_spent_ratio
    );
    assert!(at999.history_secs >= 86 * 60, "{}", at999.history_secs);
    p.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_on_purpose_burn_the_user_felt_budget_but_not_the_real_one_or_the_triggers() {
    let dir = tempfile::tempdir().unwrap();
    let p = plane(config_in(dir.path()), 99.0).await;
    // A pinned T3: the serving tier answers 429 `shed` to most requests, recorded as it does
    // (a span with `brownout.deliberate = true` and no ERROR status); the rest succeed.
    let now = now_ms();
    let m0 = now - now % MIN;
    let mut spans = Vec::new();
    for m in 3..40u64 {
        for k in 0..20u64 {
            let i = spans.len() as u64;
            spans.push(span(i, m0 - m * MIN + 1_000 + k * 2_000, false, k < 12));
        }
    }
    let refused = spans.iter().filter(|s| s.attributes.len() == 2).count() as u64;
    let answered = spans.len() as u64 - refused;
    ingest(&p, spans, vec![]).await;
    let s = counted(&p, answered).await;
    assert_eq!(s.period_events.good, answered, "no real failure");
    assert_eq!(s.refused.period, refused);
    assert!(s.burn_rates.iter().all(|w| w.burn_rate == 0.0), "{s:?}");
    assert!(s.budget_remaining_ratio == 1.0);
    let felt = s
        .user_felt
        .clone()
        .expect("an occurrence SLO has the user-felt view");
    assert_eq!(felt.period_events.total, answered + refused);
    assert_eq!(felt.period_events.good, answered);
    let hour = felt
        .burn_rates
        .iter()
        .find(|w| w.window_secs == 3_600)
        .unwrap();
    assert!(
        (hour.burn_rate - 60.0).abs() < 1e-6,
        "12 of 20 refused at 99 %: a 60× burn as users felt it, {hour:?}"
    );
    assert!(felt.budget_remaining_ratio < 1.0);
    // The triggers read the real-failure view: nothing fires.
    let inputs = brownout::plane::feeders::slo_alerts(&p.slo.latest());
    assert!(
        inputs.iter().all(|a| !a.firing && a.burn_rate == 0.0),
        "{inputs:?}"
    );
    // The gauges carry both views.
    let text = p.state().metrics.render();
    assert!(
        text.contains(
            "brownout_slo_burn_rate{slo=\"chat-availability\",view=\"user_felt\",window=\"1h\"} 60"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "brownout_slo_burn_rate{slo=\"chat-availability\",view=\"real_failures\",window=\"1h\"} 0"
        ),
        "{text}"
    );
    p.stop().await.unwrap();
}

fn failure(i: u64, ts_ms: u64, service: &str, message: &str) -> FailureEvent {
    FailureEvent::from_attributes(
        ts_ms,
        message,
        [
            ("service.name", service.to_string()),
            ("request_id", format!("r{i}")),
            ("feature", "basic_qa".to_string()),
        ],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patterns_are_ranked_by_their_share_of_the_slo_bad_events() {
    let dir = tempfile::tempdir().unwrap();
    let p = plane(config_in(dir.path()), 99.0).await;
    let now = now_ms();
    // Requests of chat: 900 good spans; 100 failures without a trace id (each its only record,
    // a bad event of chat-availability) in three patterns of 60, 30 and 10; and 200 failures of
    // a service no SLO watches.
    let spans: Vec<SpanRow> = (0..900)
        .map(|i| span(i, now - 30 * MIN + i * 1_000, false, false))
        .collect();
    let kinds = [
        (
            60,
            "chat",
            "CUDA out of memory while allocating the KV cache for the batch",
        ),
        (
            30,
            "chat",
            "tool call to the weather API timed out after the deadline",
        ),
        (
            10,
            "chat",
            "failed to deserialize the agent state: unexpected token",
        ),
        (
            200,
            "search",
            "index shard unavailable: connection refused by the backend",
        ),
    ];
    let mut failures = Vec::new();
    for (n, service, message) in kinds {
        for _ in 0..n {
            let i = failures.len() as u64;
            failures.push(failure(i, now - 20 * MIN + i * 500, service, message));
        }
    }
    ingest(&p, spans, failures).await;
    counted(&p, 1_000).await;
    let mut rx = p.ranked_patterns.clone();
    let ranked = eventually_async(
        "the pattern feed to rank by SLO impact",
        Duration::from_secs(30),
        || {
            let snap = rx.borrow_and_update().clone();
            async move {
                (snap.patterns.len() == 4 && snap.patterns[0].budget_impact > 0.0)
                    .then_some(snap.patterns.clone())
            }
        },
    )
    .await;
    let got: Vec<(u64, f64)> = ranked.iter().map(|p| (p.count, p.budget_impact)).collect();
    assert_eq!(
        got,
        vec![(60, 0.6), (30, 0.3), (10, 0.1), (200, 0.0)],
        "by share of the SLO-bad events, not by count"
    );
    assert_eq!(ranked[0].slo_impact.len(), 1);
    assert_eq!(ranked[0].slo_impact[0].slo, "chat-availability");
    assert!((ranked[0].slo_impact[0].share - 0.6).abs() < 1e-9);
    p.stop().await.unwrap();
}
