//! Telemetry out: OTLP spans to a real gRPC trace receiver, failure events as NDJSON to an HTTP
//! endpoint with the bearer token, and drops counted when the queue is full.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::routing::post;
use brownout_protocol::{Category, Command, Criticality, FailureEvent, Shed, Tier};
use brownout_serving::api::{self, ModelChoice, ServeOptions};
use brownout_serving::control::ControlHandle;
use brownout_serving::telemetry::{Telemetry, TelemetryConfig};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use tower::ServiceExt;

#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(req.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

type Posted = Arc<Mutex<Vec<(Option<String>, String)>>>;

async fn failures_sink() -> (String, Posted) {
    let posted: Posted = Arc::default();
    let app = Router::new()
        .route(
            "/v1/failures",
            post(
                |State(p): State<Posted>, h: HeaderMap, body: String| async move {
                    let auth = h
                        .get("authorization")
                        .map(|v| v.to_str().unwrap().to_string());
                    p.lock().unwrap().push((auth, body));
                    StatusCode::ACCEPTED
                },
            ),
        )
        .with_state(posted.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (url, posted)
}

fn opts() -> ServeOptions {
    ServeOptions {
        model: ModelChoice::Toy,
        num_blocks: 64,
        block_size: 16,
        max_model_len: Some(256),
        ..ServeOptions::default()
    }
}

async fn post_completion(app: &Router, crit: &str) -> StatusCode {
    let req = Request::post("/v1/completions")
        .header("content-type", "application/json")
        .header("x-brownout-criticality", crit)
        .header("x-brownout-feature", "chat")
        .body(Body::from(r#"{"prompt": "span me", "max_tokens": 3}"#))
        .unwrap();
    app.clone().oneshot(req).await.unwrap().status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_become_otlp_spans_and_failures_become_ndjson_events() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let receiver = Receiver::default();
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = format!("http://{}", l.local_addr().unwrap());
    let svc = TraceServiceServer::new(receiver.clone());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(l))
            .await
            .unwrap()
    });
    let (cp, posted) = failures_sink().await;
    let tel = Telemetry::start(TelemetryConfig {
        service: "brownout-serve".into(),
        host: "gpu-1".into(),
        control_plane: Some(cp),
        ingest_token: Some("s3cret".into()),
        otlp_endpoint: Some(otlp),
        queue_capacity: 64,
        batch_max: 16,
        ..TelemetryConfig::default()
    });
    let control = ControlHandle::new("t");
    let st = api::build_state(&opts(), control.clone(), tel.clone())
        .await
        .unwrap();
    let app = api::router(st);
    assert_eq!(post_completion(&app, "critical").await, StatusCode::OK);
    let mut t3 = Command::normal("t", 1, 1, brownout_protocol::now_ms(), 60_000);
    t3.tier = Tier::T3;
    t3.shed = Some(Shed {
        admit_min_criticality: Criticality::Critical,
        retry_after_s: 5,
        jitter_ratio: 0.0,
        recovery_eta_ms: 0,
        admit_rps: None,
    });
    control.apply(t3, 1).unwrap();
    assert_eq!(
        post_completion(&app, "sheddable").await,
        StatusCode::TOO_MANY_REQUESTS
    );

    let t = tel.clone();
    tokio::task::spawn_blocking(move || t.flush())
        .await
        .unwrap();
    let mut spans = Vec::new();
    for _ in 0..100 {
        spans = receiver
            .0
            .lock()
            .unwrap()
            .iter()
            .flat_map(|r| {
                r.resource_spans
                    .iter()
                    .flat_map(|rs| rs.scope_spans.iter().flat_map(|ss| ss.spans.clone()))
            })
            .collect::<Vec<_>>();
        if spans.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(spans.len(), 2, "one span per request");
    let attrs = |i: usize| -> BTreeMap<String, String> {
        spans[i]
            .attributes
            .iter()
            .map(|kv| {
                let v = match kv.value.as_ref().and_then(|v| v.value.clone()) {
                    Some(AnyValue::StringValue(s)) => s,
                    Some(AnyValue::IntValue(i)) => i.to_string(),
                    Some(AnyValue::DoubleValue(d)) => d.to_string(),
                    other => format!("{other:?}"),
                };
                (kv.key.clone(), v)
            })
            .collect()
    };
    let ok = attrs(0);
    assert_eq!(spans[0].name, "llm.request");
    assert_eq!(ok["gen_ai.request.model"], "toy");
    assert_eq!(ok["brownout.criticality"], "critical");
    assert_eq!(ok["brownout.feature"], "chat");
    assert_eq!(ok["brownout.route"], "primary");
    assert_eq!(ok["gen_ai.usage.input_tokens"], "7");
    assert_eq!(ok["gen_ai.usage.output_tokens"], "3");
    assert!(
        ok.contains_key("brownout.ttft_s")
            && ok.contains_key("brownout.queue_time_s")
            && ok.contains_key("brownout.num_preemptions")
    );
    assert_eq!(ok["brownout.outcome"], "length");
    assert!(ok["brownout.deliberate"].contains("false"));
    let shed = attrs(1);
    assert_eq!(shed["error.type"], "rate_limited");
    // A deliberate refusal: its own outcome, marked deliberate, with the command's version, and
    // not an error span (brownout's own refusals are not SLO errors).
    assert_eq!(shed["brownout.outcome"], "shed");
    assert!(shed["brownout.deliberate"].contains("true"));
    assert_eq!(shed["brownout.command_version"], "1");
    assert_ne!(
        spans[1].status.as_ref().map(|s| s.code),
        Some(2),
        "status is not ERROR"
    );

    for _ in 0..100 {
        if !posted.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let posted = posted.lock().unwrap().clone();
    assert_eq!(posted.len(), 1, "one failure (the shed request), one POST");
    let (auth, body) = &posted[0];
    assert_eq!(auth.as_deref(), Some("Bearer s3cret"));
    let ev = FailureEvent::parse_line(body.lines().next().unwrap().as_bytes()).unwrap();
    assert_eq!(
        (
            ev.category,
            ev.criticality,
            ev.service.as_str(),
            ev.host.as_str()
        ),
        (
            Category::RateLimited,
            Criticality::Sheddable,
            "brownout-serve",
            "gpu-1"
        )
    );
    assert_eq!(
        ev.trace_id.len(),
        32,
        "the failure carries its span's trace id"
    );
    assert_eq!(
        (
            ev.attributes["outcome"].as_str(),
            ev.attributes["deliberate"].as_str(),
            ev.attributes["command"].as_str(),
            ev.error_type.as_str()
        ),
        ("shed", "true", "1:1", "LoadShed")
    );
    assert_eq!(tel.failures_sent(), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_full_failure_queue_drops_and_counts_never_blocks() {
    let (cp, _posted) = failures_sink().await;
    let tel = Telemetry::start(TelemetryConfig {
        service: "s".into(),
        control_plane: Some(cp),
        queue_capacity: 2,
        batch_max: 1,
        ..TelemetryConfig::default()
    });
    let ev = FailureEvent {
        ts_ms: 1,
        service: "s".into(),
        host: String::new(),
        request_id: String::new(),
        trace_id: String::new(),
        user_id: String::new(),
        feature: String::new(),
        criticality: Criticality::Default,
        category: Category::KvCacheExhausted,
        error_type: String::new(),
        message: "m".into(),
        latency_ms: 0.0,
        attributes: BTreeMap::new(),
    };
    // The exporter task cannot run between these (one thread, no await): 2 fit, 8 drop.
    for _ in 0..10 {
        tel.failure(ev.clone());
    }
    assert_eq!(tel.failures_dropped(), 8);
    assert!(
        tel.render_metrics()
            .contains("brownout_serving_failure_events_dropped_total 8")
    );
}
