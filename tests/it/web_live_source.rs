//! The web UI over the LIVE data source: a real control plane (embedded SQLite store, real
//! sockets) with the real SLO evaluator (the example specs), degradation controller (the example
//! policy, in-process bus) and pattern engine (installed as the ingest tagger). Data goes in over
//! HTTP ingest exactly as agents and apps send it; every page must show it.
//!
//! The second test sends XSS payloads the same way (failure messages, service, host, engine,
//! model and feature names) and loads every page in headless Chromium: nothing may run, and the
//! payload text must be displayed literally. Needs `/usr/bin/chromium`.

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use brownout::auth::Tokens;
use brownout::config::{Config, Secret};
use brownout::degrade::{
    AlertmanagerWebhook, DegradeConfig, DegradeHandle, InProcBus, Policy, Transport,
};
use brownout::ingest::FailureTagger;
use brownout::patterns::feed::PatternFeed;
use brownout::patterns::{EngineConfig, PatternEngine, PatternId, SharedEngine};
use brownout::plane::{App, Listeners, Running};
use brownout::slo::Evaluator;
use brownout::slo::task::SloHandle;
use brownout::store::{FailureQuery, Store};
use brownout::web::live::{LiveDataSource, LiveParts};
use brownout::web::{self, DataOrigin};
use brownout_protocol::{
    Ack, AgentSnapshot, EngineStats, FailureEvent, GpuStats, KvStats, Tier, now_ms,
};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use tower::ServiceExt;

const INGEST: &str = "ingest-token-aaaaaaaaaaaa";
const READ: &str = "read-token-bbbbbbbbbbbbbb";
const ADMIN: &str = "admin-token-cccccccccccc";

/// Tags failures with their pattern id at ingest (as `brownout serve` does).
struct Tagger(SharedEngine);

impl FailureTagger for Tagger {
    fn tag(&self, event: &FailureEvent) -> String {
        let mut e = self.0.lock().unwrap_or_else(|p| p.into_inner());
        PatternId::from_template(e.observe(event)).0
    }
}

/// The names the data is sent under.
#[derive(Clone)]
struct Names {
    service: String,
    host: String,
    engine: String,
    model: String,
    feature: String,
    /// Each sent as a failure message (several times, so the miner keeps them as patterns).
    messages: Vec<String>,
}

fn plain_names() -> Names {
    Names {
        service: "chat".into(),
        host: "gpu-node-a".into(),
        engine: "engine-0".into(),
        model: "llama-3-70b-instruct".into(),
        feature: "pdf_analysis".into(),
        messages: vec![
            "Tool weather_api timed out after 3000 ms".into(),
            "KV cache exhausted: 0 free blocks for request req-1".into(),
        ],
    }
}

struct Plane {
    run: Running,
    patterns: SharedEngine,
    /// Published by hand (`publish_now`), so the test decides when the ranking changes.
    feed: PatternFeed,
    source: Arc<LiveDataSource>,
    store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

fn snapshot(n: &Names) -> AgentSnapshot {
    AgentSnapshot {
        host: n.host.clone(),
        ts_ms: now_ms(),
        simulated: false,
        probe_up: true,
        gpus: vec![GpuStats {
            index: 0,
            uuid: "GPU-0".into(),
            name: "H100".into(),
            memory_total_bytes: 80 << 30,
            memory_used_bytes: 70 << 30,
            memory_reserved_bytes: 0,
            gpu_util_ratio: 0.97,
            mem_util_ratio: 0.5,
            temperature_c: 71.0,
            power_w: 550.0,
        }],
        engines: vec![EngineStats {
            id: n.engine.clone(),
            url: "http://127.0.0.1:8000".into(),
            model: n.model.clone(),
            up: true,
            kv: KvStats {
                block_size: 16,
                num_blocks_total: 1000,
                num_blocks_used: 937,
                usage_ratio: 0.937,
                internal_fragmentation_ratio: 0.043,
                reserved_unused_ratio: 0.071,
                token_occupancy_ratio: 0.886,
                external_fragmentation_ratio: 0.0,
            },
            num_requests_running: 61,
            num_requests_waiting: 47,
            num_preemptions_total: 3,
            tier: 3,
            ttft_p50_s: 0.4,
            ttft_p99_s: 2.6,
            ..Default::default()
        }],
    }
}

/// Starts the plane, ingests `names` over HTTP, drives the controller to T3 and waits until
/// everything is visible.
async fn start(names: Option<&Names>) -> Plane {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::defaults();
    config.data_dir = dir.path().to_path_buf();
    config.ingest.batch_max_delay = Duration::from_millis(20);
    std::fs::create_dir_all(&config.data_dir).unwrap();
    let store: Arc<dyn Store> =
        Arc::new(brownout::store::sqlite::SqliteStore::open(&config.sqlite_path()).unwrap());
    store.migrate().await.unwrap();
    let tokens = Tokens::new(
        Some(Secret::new(INGEST)),
        Some(Secret::new(READ)),
        Some(Secret::new(ADMIN)),
    );
    let mut app = App::build_with_store(config, tokens, store.clone())
        .await
        .unwrap();
    let patterns: SharedEngine = Arc::new(Mutex::new(PatternEngine::new(EngineConfig::default())));
    app.set_tagger(Arc::new(Tagger(patterns.clone())));

    let mut specs = Vec::new();
    for (file, text) in [
        (
            "examples/slo/chat.yaml",
            include_str!("../../examples/slo/chat.yaml"),
        ),
        (
            "examples/slo/agent.yaml",
            include_str!("../../examples/slo/agent.yaml"),
        ),
    ] {
        specs.extend(brownout::slo::spec::parse_str(text, file).unwrap());
    }
    let slo = SloHandle::new(Evaluator::new(specs));
    let policy = Policy::from_yaml(include_str!("../../examples/policy.yaml")).unwrap();
    let degrade = DegradeHandle::new(
        DegradeConfig::new("prod-eu", b"0123456789abcdef0123456789abcdef", policy),
        &prometheus::Registry::new(),
    )
    .unwrap();
    {
        let store = store.clone();
        degrade.on_decision(move |d| {
            let store = store.clone();
            let v = serde_json::to_value(d).unwrap();
            let key = format!("{:020}", d.at_ms);
            tokio::spawn(async move { store.put_doc("decision", &key, &v).await });
        });
    }
    let run = app.spawn(Listeners::loopback().await.unwrap(), axum::Router::new());
    let http = format!("http://{}", run.http_addr);
    let client = reqwest::Client::new();

    if let Some(n) = names {
        // Failures (NDJSON) and a snapshot, over HTTP with the ingest token.
        let now = now_ms();
        let mut events = Vec::new();
        for (m, msg) in n.messages.iter().enumerate() {
            for i in 0..4u64 {
                events.push(FailureEvent {
                    ts_ms: now - 60_000 + m as u64 * 1000 + i,
                    service: n.service.clone(),
                    host: n.host.clone(),
                    request_id: format!("req-{m}-{i}"),
                    trace_id: format!("{:032x}", 0xabc0 + m as u64 * 16 + i),
                    user_id: format!("user-{i}"),
                    feature: n.feature.clone(),
                    criticality: Default::default(),
                    category: if m % 2 == 0 {
                        brownout_protocol::Category::ToolUnavailable
                    } else {
                        brownout_protocol::Category::KvCacheExhausted
                    },
                    error_type: "ToolTimeout".into(),
                    message: msg.clone(),
                    latency_ms: 3000.0,
                    attributes: Default::default(),
                });
            }
        }
        let body: String = events
            .iter()
            .map(|e| serde_json::to_string(e).unwrap() + "\n")
            .collect();
        let r = client
            .post(format!("{http}/v1/failures"))
            .bearer_auth(INGEST)
            .header("content-type", "application/x-ndjson")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        // 20 request spans (2 failed) over OTLP/HTTP JSON.
        let r = client
            .post(format!("{http}/v1/traces"))
            .bearer_auth(INGEST)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&spans(n, 20, 2)).unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        let snap = snapshot(n);
        let r = client
            .post(format!("{http}/v1/agents/snapshot"))
            .bearer_auth(INGEST)
            .json(&snap)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.text().await.unwrap());

        // The SLO engine counts the failures (as the plane's feeder does) and evaluates.
        for e in &events {
            slo.record_failure(e);
        }
        slo.evaluate(now_ms());

        // The controller: a firing Alertmanager alert raises T3; an instance acks over the bus.
        let hook: AlertmanagerWebhook = serde_json::from_value(serde_json::json!({
            "version": "4", "status": "firing", "receiver": "brownout", "groupKey": "g",
            "alerts": [{"status": "firing", "labels": {"alertname": "BrownoutServingOverload"}}]
        }))
        .unwrap();
        degrade.alertmanager_webhook(&hook, now_ms()).unwrap();
        degrade.push_snapshot(snap);
        let bus = InProcBus::new();
        let acks = bus.ack_sender();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let ctl = tokio::spawn(brownout::degrade::run_controller(
            degrade.clone(),
            Transport::InProc(bus),
            async move {
                let _ = stop_rx.await;
            },
        ));
        let cmd = eventually("a published T3 command", || {
            degrade.command().filter(|c| c.tier == Tier::T3)
        })
        .await;
        let instance = format!("{}/{}", n.host, n.engine);
        acks.send((
            instance.clone(),
            Ack::Applied {
                epoch: cmd.epoch,
                version: cmd.version,
                applied_at_ms: cmd.issued_at_ms + 42,
                entry: None,
            },
        ))
        .await
        .unwrap();
        eventually("the ack", || {
            degrade
                .status()
                .acks
                .iter()
                .any(|a| a.instance == instance)
                .then_some(())
        })
        .await;
        let _ = stop_tx.send(());
        ctl.await.unwrap().unwrap();

        // Ingest is asynchronous by up to a batch delay.
        let q = FailureQuery {
            since_ms: 0,
            until_ms: u64::MAX / 2,
            limit: 100,
            ..FailureQuery::default()
        };
        for _ in 0..200 {
            if store.failures(&q).await.unwrap().items.len() >= events.len()
                && !run.state.hosts.list(now_ms()).is_empty()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert!(store.failures(&q).await.unwrap().items.len() >= events.len());

        let cq = brownout::store::CountQuery {
            since_ms: 0,
            until_ms: u64::MAX / 2,
            bucket_ms: 3_600_000,
            service: None,
            latency_threshold_ms: None,
        };
        for _ in 0..200 {
            let n: u64 = store
                .request_counts(&cq)
                .await
                .unwrap()
                .iter()
                .map(|c| c.total)
                .sum();
            if n == 20 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
    let (feed, ranked) = PatternFeed::new(patterns.clone());
    feed.publish_now(now_ms()).await;
    let source = Arc::new(LiveDataSource::new(LiveParts {
        store: run.state.store.clone(),
        hosts: run.state.hosts.clone(),
        slo,
        degrade,
        patterns: ranked,
        origin: DataOrigin::Live,
    }));
    Plane {
        run,
        patterns,
        feed,
        source,
        store,
        _dir: dir,
    }
}

/// `total` root server spans of `n.service` on `n.host`, the first `failed` with status ERROR.
fn spans(n: &Names, total: u8, failed: u8) -> ExportTraceServiceRequest {
    let t0 = now_ms() * 1_000_000 - 30_000_000_000;
    let kv = |k: &str, v: &str| KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(v.into())),
        }),
        ..Default::default()
    };
    let spans = (0..total)
        .map(|i| Span {
            trace_id: vec![0x70 + i; 16],
            span_id: vec![i + 1; 8],
            name: "chat.completions".into(),
            kind: 2,
            start_time_unix_nano: t0 + u64::from(i) * 1_000_000,
            end_time_unix_nano: t0 + u64::from(i) * 1_000_000 + 400_000_000,
            attributes: vec![kv("feature", &n.feature)],
            status: Some(Status {
                code: if i < failed { 2 } else { 1 },
                message: if i < failed {
                    n.messages[0].clone()
                } else {
                    String::new()
                },
            }),
            ..Default::default()
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv("service.name", &n.service), kv("host.name", &n.host)],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

async fn eventually<T>(what: &str, f: impl Fn() -> Option<T>) -> T {
    brownout_test_support::eventually(what, Duration::from_secs(5), f).await
}

/// Percent-encodes a path segment.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn pages(n: &Names) -> Vec<String> {
    let inst = format!("{}/{}", n.host, n.engine);
    vec![
        "/".into(),
        "/hosts".into(),
        format!("/hosts/{}", enc(&n.host)),
        format!("/services/{}", enc(&n.service)),
        format!("/services/{}/instances/{}", enc(&n.service), enc(&inst)),
        "/patterns".into(),
        "/slos".into(),
        "/degradation".into(),
        "/debug/resource".into(),
    ]
}

/// What Tera's autoescape makes of `s`.
fn html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#x27;")
        .replace('/', "&#x2F;")
}

async fn get(app: &axum::Router, path: &str) -> (StatusCode, String) {
    let res = app
        .clone()
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = res.status();
    let bytes = axum::body::to_bytes(res.into_body(), 16 << 20)
        .await
        .unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_shows_what_was_ingested() {
    let n = plain_names();
    let p = start(Some(&n)).await;
    let app = web::router(p.source.clone());
    let inst = format!("{}/{}", n.host, n.engine);

    // (page, strings it must show)
    let want: Vec<(String, Vec<&str>)> = vec![
        // Tier, SLOs, the host, the service, a pattern.
        (
            "/".into(),
            vec![
                "prod-eu",
                "T3",
                "alertmanager",
                "chat-availability",
                &n.host,
                "/services/chat",
                "class=\"origin live\"",
            ],
        ),
        ("/hosts".into(), vec![&n.host, &n.engine, &n.model, "H100"]),
        (
            format!("/hosts/{}", n.host),
            vec![&n.engine, "/services/chat/instances/gpu-node-a%2Fengine-0"],
        ),
        ("/services/chat".into(), vec![&inst]),
        (
            format!("/services/chat/instances/{}", enc(&inst)),
            vec![&n.messages[0], &n.messages[1], &n.feature, "req-0-0"],
        ),
        ("/patterns".into(), vec!["weather_api", "chat"]),
        (
            "/slos".into(),
            vec!["chat-availability", "agent-task-success", "service chat"],
        ),
        (
            "/degradation".into(),
            vec!["prod-eu", "T3", "BrownoutServingOverload", &inst],
        ),
        (
            "/debug/resource".into(),
            vec![&n.host, &n.engine, &n.model, "47", "4.3%", "7.1%"],
        ),
    ];
    for (page, needles) in &want {
        let (status, body) = get(&app, page).await;
        assert_eq!(status, StatusCode::OK, "{page}: {body}");
        for needle in needles {
            assert!(
                body.contains(needle) || body.contains(&html(needle)),
                "{page} lacks {needle:?}: {body}"
            );
        }
        assert!(!body.contains("SAMPLE DATA"), "{page} claims sample data");
    }

    // The JSON views agree with what was sent.
    let (_, j) = get(&app, "/ui/api/overview").await;
    let j: serde_json::Value = serde_json::from_str(&j).unwrap();
    assert_eq!(j["clusters"][0]["tier"], 3, "{j}");
    let svc = &j["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "chat")
        .unwrap();
    assert_eq!(svc["num_instances"], 1, "{svc}");
    // 20 requests in the 5-minute window: 0.0667/s. Bad events: the failures reported (8 sent
    // + the 2 error spans ingest turns into failures) outnumber the 2 failed spans: 10 / 20.
    let rps = svc["requests_per_s"].as_f64().unwrap();
    assert!((rps - 20.0 / 300.0).abs() < 1e-9, "{svc}");
    assert!(
        (svc["error_ratio"].as_f64().unwrap() - 0.5).abs() < 1e-9,
        "{svc}"
    );
    assert!(
        (svc["ttft_p99_s"].as_f64().unwrap() - 2.6).abs() < 1e-9,
        "{svc}"
    );
    let slo = j["slos"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "chat-availability")
        .unwrap();
    assert!(
        slo["budget_remaining_ratio"].as_f64().unwrap() < 1.0,
        "failures burn the budget: {slo}"
    );
    let (_, pj) = get(&app, "/ui/api/patterns").await;
    let pj: serde_json::Value = serde_json::from_str(&pj).unwrap();
    let pats = pj["patterns"].as_array().unwrap();
    assert!(pats.len() >= 2, "{pj}");
    // Examples are the raw messages the tagger labelled at ingest.
    let examples: Vec<&str> = pats
        .iter()
        .flat_map(|p| p["examples"].as_array().unwrap())
        .filter_map(|e| e["message"].as_str())
        .collect();
    assert!(examples.contains(&n.messages[0].as_str()), "{pj}");
    // The page shows the feed's latest ranking: a pattern observed just now shows only after
    // the feed's next computation.
    {
        let mut e = p.patterns.lock().unwrap();
        for i in 0..3 {
            let mut ev: FailureEvent = serde_json::from_value(serde_json::json!({
                "ts": now_ms(), "service": "chat", "category": "serialization_error",
                "message": format!("Unexpected token in JSON at position {i}")
            }))
            .unwrap();
            ev.request_id = format!("late-{i}");
            e.observe(&ev);
        }
    }
    let (_, again) = get(&app, "/ui/api/patterns").await;
    let again: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(
        again["patterns"], pj["patterns"],
        "recomputed without a new publication"
    );
    p.feed.publish_now(now_ms()).await;
    let (_, later) = get(&app, "/ui/api/patterns").await;
    assert!(
        later.contains("Unexpected token"),
        "the new publication is not shown: {later}"
    );
    let (_, dj) = get(&app, "/ui/api/degradation").await;
    let dj: serde_json::Value = serde_json::from_str(&dj).unwrap();
    let ack = &dj["clusters"][0]["acks"][0];
    assert_eq!(
        (ack["instance"].as_str(), ack["lag_ms"].as_u64()),
        (Some(inst.as_str()), Some(42)),
        "{dj}"
    );
    assert!(
        dj["clusters"][0]["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["tier"] == 3),
        "{dj}"
    );
    // Decisions were persisted as docs and are read back from the store.
    let docs = p.store.list_docs("decision", 0).await.unwrap();
    assert!(!docs.is_empty());

    // Unknown names are 404s, not 500s.
    for page in [
        "/hosts/nope",
        "/services/nope",
        "/services/chat/instances/nope",
    ] {
        assert_eq!(get(&app, page).await.0, StatusCode::NOT_FOUND, "{page}");
    }
    p.run.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_plane_renders_every_page_with_empty_states() {
    let p = start(None).await;
    let app = web::router(p.source.clone());
    for page in [
        "/",
        "/hosts",
        "/patterns",
        "/slos",
        "/degradation",
        "/debug/resource",
    ] {
        let (status, body) = get(&app, page).await;
        assert_eq!(status, StatusCode::OK, "{page}: {body}");
        assert!(body.contains("class=\"origin live\""), "{page}: {body}");
    }
    let (_, body) = get(&app, "/debug/resource").await;
    assert!(body.contains("No engines reporting."), "{body}");
    let (_, j) = get(&app, "/ui/api/degradation").await;
    let j: serde_json::Value = serde_json::from_str(&j).unwrap();
    // Before any decision: T0 over the whole window.
    assert_eq!(j["clusters"][0]["current"]["tier"], 0, "{j}");
    assert_eq!(
        j["clusters"][0]["timeline"].as_array().unwrap().len(),
        1,
        "{j}"
    );
    // Before the SLO task's first evaluation there is no report: no SLO rows, no error.
    let (status, j) = get(&app, "/ui/api/slos").await;
    assert_eq!(status, StatusCode::OK, "{j}");
    assert_eq!(get(&app, "/services/chat").await.0, StatusCode::NOT_FOUND);
    p.run.stop().await.unwrap();
}

/// A fresh deployment: request spans of `chat` and a snapshot of its engines (served model
/// `default`), no failure yet. The overview used to list `chat 0 instances` and `default 2
/// instances` until the first failure told it chat's hosts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_with_spans_only_owns_the_engines_nothing_else_claims() {
    let p = start(None).await;
    let app = web::router(p.source.clone());
    let http = format!("http://{}", p.run.http_addr);
    let client = reqwest::Client::new();
    let n = Names {
        model: "default".into(),
        ..plain_names()
    };
    let r = client
        .post(format!("{http}/v1/traces"))
        .bearer_auth(INGEST)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&spans(&n, 10, 0)).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let r = client
        .post(format!("{http}/v1/agents/snapshot"))
        .bearer_auth(INGEST)
        .json(&snapshot(&n))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let mut services = serde_json::Value::Null;
    for _ in 0..100 {
        let (_, j) = get(&app, "/ui/api/overview").await;
        let j: serde_json::Value = serde_json::from_str(&j).unwrap();
        services = j["services"].clone();
        let chat = services
            .as_array()
            .and_then(|a| a.iter().find(|s| s["name"] == "chat"));
        if chat.is_some_and(|c| c["num_instances"] == 1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let names: Vec<&str> = services
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["chat"], "{services}");
    assert_eq!(services[0]["num_instances"], 1, "{services}");
    let (status, body) = get(&app, "/services/chat").await;
    assert_eq!(status, StatusCode::OK);
    // The instance id, HTML-escaped (`/` is `&#x2F;`) and in its link.
    assert!(body.contains("gpu-node-a&#x2F;engine-0"), "{body}");
    assert!(
        body.contains("/services/chat/instances/gpu-node-a%2Fengine-0"),
        "{body}"
    );
    p.run.stop().await.unwrap();
}

// ---- XSS through ingest ---------------------------------------------------------------------

/// Each payload, if it ran, would set `data-pwned` on `<body>` or change the title.
const PAYLOADS: &[&str] = &[
    "<script>document.title='pwned'</script>",
    "\"><img src=x onerror=\"document.body.setAttribute('data-pwned','img')\">",
    "</title><script>document.body.setAttribute('data-pwned','title')</script>",
    "<svg onload=\"document.body.setAttribute('data-pwned','svg')\"><circle r=9 /></svg>",
    "</text></svg><script>document.body.setAttribute('data-pwned','svgtext')</script>",
    "' onmouseover='document.body.setAttribute(`data-pwned`,`attr`)' x='",
];

fn hostile_names() -> Names {
    Names {
        service: format!("svc{}", PAYLOADS[0]),
        host: format!("host{}", PAYLOADS[1]),
        engine: format!("eng{}", PAYLOADS[3]),
        model: format!("model{}", PAYLOADS[4]),
        feature: format!("feat{}", PAYLOADS[5]),
        messages: vec![
            format!("first {} failed after 30 ms", PAYLOADS[2]),
            format!("second {} failed with code 7", PAYLOADS[4]),
        ],
    }
}

fn dump_dom(url: &str) -> String {
    let profile = tempfile::tempdir().expect("temp profile");
    let out = Command::new("timeout")
        .arg("60")
        .arg("/usr/bin/chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("--virtual-time-budget=500")
        .arg("--dump-dom")
        .arg(url)
        .output()
        .expect("/usr/bin/chromium is needed for this test: apt-get install chromium (scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "chromium failed on {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 DOM")
}

fn as_text(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_sent_through_ingest_render_as_text_in_chromium() {
    let n = hostile_names();
    let p = start(Some(&n)).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ui = tokio::spawn(axum::serve(listener, web::router(p.source.clone())).into_future());

    // (page, a payload-carrying string it must display literally)
    let inst = format!("{}/{}", n.host, n.engine);
    let expect: Vec<(String, Vec<String>)> = pages(&n)
        .into_iter()
        .zip([
            vec![n.host.clone(), n.service.clone()],
            vec![n.host.clone(), n.engine.clone(), n.model.clone()],
            vec![n.host.clone(), n.engine.clone()],
            vec![n.service.clone(), inst.clone()],
            vec![
                n.messages[0].clone(),
                n.messages[1].clone(),
                n.feature.clone(),
            ],
            vec![n.service.clone()],
            vec!["chat-availability".to_string()],
            vec![inst.clone()],
            vec![n.host.clone(), n.engine.clone(), n.model.clone()],
        ])
        .collect();
    let doms = tokio::task::spawn_blocking(move || {
        expect
            .chunks(2)
            .flat_map(|chunk| {
                let handles: Vec<_> = chunk
                    .iter()
                    .map(|(page, _)| {
                        let url = format!("http://{addr}{page}");
                        std::thread::spawn(move || dump_dom(&url))
                    })
                    .collect();
                chunk
                    .iter()
                    .cloned()
                    .zip(
                        handles
                            .into_iter()
                            .map(|h| h.join().expect("chromium thread")),
                    )
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();

    for ((page, shown), dom) in &doms {
        assert!(dom.contains("<main>"), "{page}: page did not render: {dom}");
        assert!(
            !dom.contains("data-pwned=\""),
            "{page}: a payload executed: {dom}"
        );
        assert!(
            !dom.contains("<title>pwned"),
            "{page}: a payload changed the title: {dom}"
        );
        for tag in ["<img", "<svg onload", "<circle r=\"9\"", " onmouseover=\""] {
            assert!(
                !dom.contains(tag),
                "{page}: payload became markup ({tag}): {dom}"
            );
        }
        assert_eq!(
            dom.matches("<script").count(),
            1,
            "{page}: only our own script tag: {dom}"
        );
        let body = &dom[dom.find("<body").unwrap_or(0)..];
        for s in shown {
            assert!(
                body.contains(&as_text(s)),
                "{page}: {s:?} is not displayed literally: {dom}"
            );
        }
    }
    ui.abort();
    p.run.stop().await.unwrap();
}
