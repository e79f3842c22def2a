//! The log search (`/logs`, `GET /api/v1/logs`) and the trace waterfall (`/traces/{trace_id}`):
//! the pages over the sample source, and the read API over a real SQLite store behind the read
//! token.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use brownout::auth::Tokens;
use brownout::config::{HostsConfig, Secret};
use brownout::ingest::hosts::HostRegistry;
use brownout::store::sqlite::SqliteStore;
use brownout::store::{Batch, LogQuery, LogRow, Store, WriteMode};
use brownout::web;
use brownout_test_support::ui::{SAMPLE_TRACE_ID, SampleDataSource};
use http_body_util::BodyExt;
use tower::ServiceExt;

const NOW_MS: u64 = 1_764_460_800_000;

async fn get(app: axum::Router, uri: &str, token: Option<&str>) -> (StatusCode, String) {
    let mut req = Request::get(uri);
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let res = app.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
    let status = res.status();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

fn ui() -> (Arc<SampleDataSource>, axum::Router) {
    let s = Arc::new(SampleDataSource::new(NOW_MS));
    (s.clone(), web::router(s))
}

#[tokio::test]
async fn the_waterfall_nests_spans_in_start_order_and_marks_the_critical_path() {
    let (_, app) = ui();
    let (st, json) = get(
        app.clone(),
        &format!("/ui/api/traces/{SAMPLE_TRACE_ID}"),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let got: Vec<(String, u64, bool)> = v["spans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["span_id"].as_str().unwrap()[14..].to_string(),
                s["depth"].as_u64().unwrap(),
                s["critical"].as_bool().unwrap(),
            )
        })
        .collect();
    let want: Vec<(String, u64, bool)> = [
        ("a1", 0, true),
        ("a2", 1, true),
        ("a3", 2, true),
        ("a4", 2, true),
        // Overlaps the prefill that the tool call waited on: not on the critical path.
        ("a8", 2, false),
        ("a5", 2, true),
        ("a6", 3, true),
        ("a7", 2, true),
    ]
    .iter()
    .map(|(a, b, c)| (a.to_string(), *b, *c))
    .collect();
    assert_eq!(got, want);
    assert_eq!(v["duration_us"], 9_400_000);
    // The HTML page: the same order in the table, the key attributes, the SVG, the viewer link.
    let (st, html) = get(app.clone(), &format!("/traces/{SAMPLE_TRACE_ID}"), None).await;
    assert_eq!(st, StatusCode::OK);
    let order: Vec<&str> = html
        .split("data-span=\"")
        .skip(1)
        .map(|s| &s[14..16])
        .collect();
    // SVG rows then table rows: both in the waterfall's order.
    let ids: Vec<&str> = want.iter().map(|w| w.0.as_str()).collect();
    assert_eq!(order, [ids.clone(), ids].concat());
    for needle in [
        "queue wait",
        "2.31",
        "TTFT",
        "tokens in",
        "1834",
        "tool",
        "class=\"waterfall\"",
        "open in the trace viewer",
        "jaeger.internal:16686",
    ] {
        assert!(html.contains(needle), "{needle}");
    }
    // Unknown or malformed ids are 404 pages.
    assert_eq!(
        get(app.clone(), "/traces/xyz", None).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(app, "/ui/api/traces/not-hex-not-hex-not-hex-not-hex!", None)
            .await
            .0,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn the_logs_page_filters_and_pages_without_gaps_or_repeats() {
    let (s, app) = ui();
    // Filtered: exactly the source's matching records, newest first.
    let (st, json) = get(
        app.clone(),
        "/ui/api/logs?service=chat-gateway&severity=error",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let recs = v["records"].as_array().unwrap();
    let want = s.search(&LogQuery {
        since_ms: NOW_MS - 3_600_000,
        until_ms: NOW_MS + 60_000,
        service: Some("chat-gateway".into()),
        min_severity: 17,
        limit: 1000,
        ..LogQuery::default()
    });
    assert!(!want.items.is_empty());
    assert_eq!(recs.len(), want.items.len());
    for (r, w) in recs.iter().zip(&want.items) {
        assert_eq!(r["body"], w.row.body.as_str());
        assert_eq!(r["service"], "chat-gateway");
        assert!(r["level"] == "error" || r["level"] == "fatal", "{r}");
    }
    // Paged by 7 through the "next" links: every record of the hour once, in order.
    let mut next = Some("limit=7".to_string());
    let mut bodies: Vec<(u64, String)> = Vec::new();
    let mut pages = 0;
    while let Some(q) = next {
        let (st, json) = get(app.clone(), &format!("/ui/api/logs?{q}"), None).await;
        assert_eq!(st, StatusCode::OK, "{json}");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let recs = v["records"].as_array().unwrap();
        assert!(recs.len() <= 7);
        bodies.extend(recs.iter().map(|r| {
            (
                r["ts_ms"].as_u64().unwrap(),
                r["body"].as_str().unwrap().to_string(),
            )
        }));
        next = v["next_query"].as_str().map(str::to_string);
        pages += 1;
        assert!(pages < 100);
    }
    let all = s.search(&LogQuery {
        since_ms: NOW_MS - 3_600_000,
        until_ms: NOW_MS + 60_000,
        limit: 1000,
        ..LogQuery::default()
    });
    let want: Vec<(u64, String)> = all
        .items
        .iter()
        .map(|h| (h.row.ts_us / 1000, h.row.body.clone()))
        .collect();
    assert_eq!(bodies, want);
    assert!(pages > 2);
    // The HTML page: the form keeps the filters, rows link their traces, a bad filter is said.
    let (st, html) = get(app.clone(), "/logs?q=KV+cache&severity=warn", None).await;
    assert_eq!(st, StatusCode::OK);
    assert!(html.contains("value=\"KV cache\""), "{html}");
    assert!(html.contains("KV cache exhausted"));
    assert!(!html.contains("Tool Execution Timeout"), "text filter");
    let (st, html) = get(app.clone(), "/logs?severity=loud", None).await;
    assert_eq!(st, StatusCode::OK);
    assert!(
        html.contains("id=\"logs-error\"") && html.contains("loud"),
        "{html}"
    );
    let (_, html) = get(app, "/logs?nosuch=1", None).await;
    assert!(html.contains("id=\"logs-error\""), "unknown parameter");
}

#[tokio::test]
async fn the_instance_page_shows_its_log_records_beside_its_failures() {
    let (s, app) = ui();
    let (service, instance) = s.instance_names()[0].clone();
    let enc = |x: &str| x.replace('/', "%2F");
    let (st, html) = get(
        app,
        &format!("/services/{service}/instances/{}", enc(&instance)),
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{html}");
    assert!(html.contains("Recent failures"));
    assert!(html.contains("Log records"));
    assert!(html.contains("href=\"/logs?service="), "{html}");
    assert!(
        html.contains(&format!("href=\"/traces/{SAMPLE_TRACE_ID}\""))
            || html.contains("No log records")
    );
}

/// `GET /api/v1/logs` over a real SQLite store: read token required, filters, cursor paging,
/// and 400s naming the parameter.
#[tokio::test]
async fn the_log_api_reads_the_store_behind_the_read_token() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("t.sqlite")).unwrap());
    store.migrate().await.unwrap();
    let now = brownout_protocol::now_ms();
    let rows: Vec<LogRow> = (0..25u64)
        .map(|n| LogRow {
            // Pairs share a timestamp.
            ts_us: (now - 60_000 + (n / 2) * 100) * 1000,
            trace_id: String::new(),
            span_id: String::new(),
            service: if n % 2 == 0 { "chat" } else { "agent" }.into(),
            host: "gpu-1".into(),
            severity_number: if n % 5 == 0 { 17 } else { 9 },
            severity_text: String::new(),
            body: format!("line {n} <b>bold</b>"),
            attributes: vec![],
        })
        .collect();
    store
        .write_batch(
            &Batch {
                logs: rows.clone(),
                ..Batch::new()
            },
            WriteMode::Fresh,
        )
        .await
        .unwrap();
    let (_tx, writer_status) = tokio::sync::watch::channel(Default::default());
    let deps = brownout::api::ApiDeps {
        store: store.clone(),
        hosts: HostRegistry::new(HostsConfig {
            stale_after: Duration::from_secs(30),
            down_after: Duration::from_secs(120),
        }),
        writer_status,
    };
    let tokens = Arc::new(Tokens::new(None, Some(Secret::new("r3ad")), None));
    let app = brownout::api::router(deps, tokens);
    assert_eq!(
        get(app.clone(), "/api/v1/logs", None).await.0,
        StatusCode::UNAUTHORIZED
    );
    let mut bodies = Vec::new();
    let mut cursor = String::new();
    loop {
        let (st, json) = get(
            app.clone(),
            &format!("/api/v1/logs?instance=gpu-1/engine-0&limit=4&cursor={cursor}"),
            Some("r3ad"),
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{json}");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        for it in v["items"].as_array().unwrap() {
            bodies.push(it["body"].as_str().unwrap().to_string());
            assert!(it["id"].is_string());
        }
        match v["next_cursor"].as_str() {
            Some(c) => cursor = c.to_string(),
            None => break,
        }
    }
    assert_eq!(bodies.len(), 25);
    let mut want: Vec<(u64, usize)> = rows.iter().enumerate().map(|(i, r)| (r.ts_us, i)).collect();
    want.sort_by(|a, b| b.cmp(a));
    // Newest first; within a timestamp the later-written (larger rowid) first.
    assert_eq!(
        bodies,
        want.iter()
            .map(|(_, i)| rows[*i].body.clone())
            .collect::<Vec<_>>()
    );
    let (st, json) = get(
        app.clone(),
        "/api/v1/logs?service=chat&severity=error&q=line",
        Some("r3ad"),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let got: Vec<&str> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["body"].as_str().unwrap())
        .collect();
    assert_eq!(
        got,
        [
            "line 20 <b>bold</b>",
            "line 10 <b>bold</b>",
            "line 0 <b>bold</b>"
        ]
    );
    for (q, field) in [
        ("limit=0", "limit"),
        ("severity=loud", "severity"),
        ("cursor=zz", "cursor"),
        ("host=a&instance=b/engine-0", "instance"),
        (&format!("q={}", "x".repeat(257)) as &str, "q"),
    ] {
        let (st, json) = get(app.clone(), &format!("/api/v1/logs?{q}"), Some("r3ad")).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{q}: {json}");
        assert!(json.contains(field), "{q}: {json}");
    }
}

/// A page source whose traces and logs are a real store's (the rest: unavailable).
struct StoreSource(Arc<dyn Store>);

fn down<'a, T: Send + 'a>() -> futures::future::BoxFuture<'a, Result<T, web::UiError>> {
    Box::pin(futures::future::ready(Err(web::UiError::Unavailable {
        component: "test",
        detail: "not in this test".into(),
    })))
}

impl web::UiDataSource for StoreSource {
    fn overview(&self) -> futures::future::BoxFuture<'_, Result<web::OverviewView, web::UiError>> {
        down()
    }
    fn hosts(&self) -> futures::future::BoxFuture<'_, Result<web::HostsView, web::UiError>> {
        down()
    }
    fn host<'a>(
        &'a self,
        _: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<web::HostDetailView, web::UiError>> {
        down()
    }
    fn service<'a>(
        &'a self,
        _: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<web::ServiceView, web::UiError>> {
        down()
    }
    fn instance<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<web::InstanceView, web::UiError>> {
        down()
    }
    fn patterns(&self) -> futures::future::BoxFuture<'_, Result<web::PatternsView, web::UiError>> {
        down()
    }
    fn slos(&self) -> futures::future::BoxFuture<'_, Result<web::SloView, web::UiError>> {
        down()
    }
    fn degradation(
        &self,
    ) -> futures::future::BoxFuture<'_, Result<web::DegradationView, web::UiError>> {
        down()
    }
    fn resource(&self) -> futures::future::BoxFuture<'_, Result<web::ResourceView, web::UiError>> {
        down()
    }
    fn trace_spans<'a>(
        &'a self,
        trace_id: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Vec<brownout::store::SpanRow>, web::UiError>> {
        Box::pin(async move {
            self.0
                .trace(trace_id)
                .await
                .map_err(|e| web::UiError::Unavailable {
                    component: "store",
                    detail: e.to_string(),
                })
        })
    }
}

/// A known trace written to a real SQLite store out of order: the waterfall lists it in start
/// order under its parents.
#[tokio::test]
async fn the_waterfall_of_a_stored_trace_is_in_start_order_with_its_nesting() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("t.sqlite")).unwrap());
    store.migrate().await.unwrap();
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let span = |id: &str, parent: &str, start_ms: u64, dur_ms: u64| brownout::store::SpanRow {
        trace_id: trace.into(),
        span_id: format!("{id:0>16}"),
        parent_span_id: if parent.is_empty() {
            String::new()
        } else {
            format!("{parent:0>16}")
        },
        service: "chat".into(),
        name: format!("op {id} <i>x</i>"),
        kind: 2,
        start_us: (NOW_MS + start_ms) * 1000,
        duration_us: dur_ms * 1000,
        status: 0,
        status_message: String::new(),
        feature: "basic_qa".into(),
        criticality: "critical".into(),
        host: "gpu-1".into(),
        is_request: parent.is_empty(),
        attributes: vec![("gen_ai.tool.name".into(), "<b>search</b>".into())],
    };
    // root r: a (10..30) → a1 (12..20); b (40..95) → b1 (41..50), b2 (60..94); written shuffled.
    let spans = vec![
        span("b2", "b", 60, 34),
        span("a1", "a", 12, 8),
        span("r", "", 0, 100),
        span("b1", "b", 41, 9),
        span("b", "r", 40, 55),
        span("a", "r", 10, 20),
    ];
    store
        .write_batch(
            &Batch {
                spans,
                ..Batch::new()
            },
            WriteMode::Fresh,
        )
        .await
        .unwrap();
    let app = web::router(Arc::new(StoreSource(store)));
    let (st, json) = get(app.clone(), &format!("/ui/api/traces/{trace}"), None).await;
    assert_eq!(st, StatusCode::OK, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let got: Vec<(String, u64, bool)> = v["spans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["span_id"]
                    .as_str()
                    .unwrap()
                    .trim_start_matches('0')
                    .to_string(),
                s["depth"].as_u64().unwrap(),
                s["critical"].as_bool().unwrap(),
            )
        })
        .collect();
    let want = [
        ("r", 0, true),
        ("a", 1, true),
        ("a1", 2, true),
        ("b", 1, true),
        ("b1", 2, true),
        ("b2", 2, true),
    ];
    let want: Vec<(String, u64, bool)> = want
        .iter()
        .map(|(a, b, c)| (a.to_string(), *b, *c))
        .collect();
    assert_eq!(got, want);
    let (st, html) = get(app.clone(), &format!("/traces/{trace}"), None).await;
    assert_eq!(st, StatusCode::OK);
    assert!(
        html.contains("op r &lt;i&gt;x&lt;&#x2F;i&gt;"),
        "span names escaped: {html}"
    );
    assert!(!html.contains("<b>search</b>") && !html.contains("<i>x</i>"));
    // An unknown trace of the store is a 404.
    let (st, _) = get(app, "/traces/00000000000000000000000000000001", None).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}
