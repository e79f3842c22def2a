//! The real Rust OpenTelemetry SDK with the `opentelemetry-otlp` exporter — gRPC (tonic, gzip)
//! and HTTP (protobuf and JSON, gzip) — sends spans and logs to a running control plane, and
//! they come back through the query API.
//!
//! The SDK runs on its own thread (its batch processors block), with its own tokio runtime for
//! the tonic client, as a separate application would.

use std::collections::HashMap;
use std::time::Duration;

use brownout::auth::Tokens;
use brownout::config::{Config, Secret};
use brownout::plane::{App, Listeners, Running};
use opentelemetry::KeyValue;
use opentelemetry::logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity};
use opentelemetry::trace::{Span as _, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry_otlp::{
    Compression, Protocol, WithExportConfig, WithHttpConfig, WithTonicConfig,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::logs::SdkLoggerProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde_json::Value as J;

const INGEST: &str = "ingest-token-aaaaaaaaaaaa";
const READ: &str = "read-token-bbbbbbbbbbbbbb";

#[derive(Debug, Clone, Copy)]
enum Transport {
    Grpc,
    HttpProtobuf,
    HttpJson,
}

async fn start() -> (Running, tempfile::TempDir) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::defaults();
    config.data_dir = dir.path().to_path_buf();
    config.ingest.batch_max_delay = Duration::from_millis(20);
    let tokens = Tokens::new(
        Some(Secret::new(INGEST)),
        Some(Secret::new(READ)),
        Some(Secret::new("admin-token-cccccccccccc")),
    );
    let app = App::build(config, tokens).await.unwrap();
    (
        app.spawn(Listeners::loopback().await.unwrap(), axum::Router::new()),
        dir,
    )
}

fn resource(service: &str) -> Resource {
    Resource::builder()
        .with_service_name(service.to_string())
        .with_attribute(KeyValue::new("host.name", "app-host-1"))
        .build()
}

/// Emits one trace (a server root span with two children, one failing) and two log records
/// (INFO and ERROR, the latter inside the trace) with the real SDK; returns the trace id.
fn emit(
    transport: Transport,
    grpc_addr: std::net::SocketAddr,
    http_addr: std::net::SocketAddr,
    service: &str,
) -> String {
    let grpc = format!("http://{grpc_addr}");
    let http = format!("http://{http_addr}");
    let service = service.to_string();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let guard = rt.enter();
        let headers = HashMap::from([("authorization".to_string(), format!("Bearer {INGEST}"))]);
        let (span_exporter, log_exporter) = match transport {
            Transport::Grpc => {
                let mut md = tonic::metadata::MetadataMap::new();
                md.insert("authorization", format!("Bearer {INGEST}").parse().unwrap());
                (
                    opentelemetry_otlp::SpanExporter::builder()
                        .with_tonic()
                        .with_endpoint(&grpc)
                        .with_metadata(md.clone())
                        .with_compression(Compression::Gzip)
                        .build()
                        .unwrap(),
                    opentelemetry_otlp::LogExporter::builder()
                        .with_tonic()
                        .with_endpoint(&grpc)
                        .with_metadata(md)
                        .build()
                        .unwrap(),
                )
            }
            Transport::HttpProtobuf | Transport::HttpJson => {
                let protocol = if matches!(transport, Transport::HttpJson) {
                    Protocol::HttpJson
                } else {
                    Protocol::HttpBinary
                };
                (
                    opentelemetry_otlp::SpanExporter::builder()
                        .with_http()
                        .with_protocol(protocol)
                        .with_endpoint(format!("{http}/v1/traces"))
                        .with_headers(headers.clone())
                        .with_compression(Compression::Gzip)
                        .build()
                        .unwrap(),
                    opentelemetry_otlp::LogExporter::builder()
                        .with_http()
                        .with_protocol(protocol)
                        .with_endpoint(format!("{http}/v1/logs"))
                        .with_headers(headers)
                        .build()
                        .unwrap(),
                )
            }
        };
        let tp = SdkTracerProvider::builder()
            .with_batch_exporter(span_exporter)
            .with_resource(resource(&service))
            .build();
        let lp = SdkLoggerProvider::builder()
            .with_batch_exporter(log_exporter)
            .with_resource(resource(&service))
            .build();
        drop(guard);

        let tracer = tp.tracer("brownout-test");
        let mut root = tracer
            .span_builder("POST /v1/chat/completions")
            .with_kind(opentelemetry::trace::SpanKind::Server)
            .with_attributes([
                KeyValue::new("feature", "basic_qa"),
                KeyValue::new("criticality", "critical"),
            ])
            .start(&tracer);
        let trace_id = root.span_context().trace_id();
        let root_cx =
            opentelemetry::Context::current().with_remote_span_context(root.span_context().clone());
        let mut ok = tracer.start_with_context("retrieve", &root_cx);
        ok.end();
        let mut bad = tracer.start_with_context("call_tool", &root_cx);
        bad.set_attribute(KeyValue::new("tool", "weather"));
        bad.set_status(Status::error(
            "tool call to weather API timed out after 8000 ms",
        ));
        let bad_span_id = bad.span_context().span_id();
        bad.end();
        root.set_status(Status::Ok);
        root.end();

        let logger = lp.logger("brownout-test");
        for (sev, text, body) in [
            (Severity::Info, "INFO", "request started"),
            (
                Severity::Error,
                "ERROR",
                "KV cache exhausted: no free blocks",
            ),
        ] {
            let mut rec = logger.create_log_record();
            rec.set_severity_number(sev);
            rec.set_severity_text(text);
            rec.set_body(AnyValue::from(body.to_string()));
            rec.add_attribute("feature", "basic_qa");
            rec.set_trace_context(trace_id, bad_span_id, None);
            logger.emit(rec);
        }
        tp.force_flush().unwrap();
        lp.force_flush().unwrap();
        tp.shutdown().unwrap();
        lp.shutdown().unwrap();
        drop(rt);
        format!("{trace_id}")
    })
    .join()
    .unwrap()
}

async fn eventually(c: &reqwest::Client, url: String, pred: impl Fn(u16, &J) -> bool) -> J {
    let (pred, url) = (&pred, url.as_str());
    brownout_test_support::eventually_async(url, Duration::from_secs(5), || async move {
        let r = c.get(url).bearer_auth(READ).send().await.unwrap();
        let st = r.status().as_u16();
        let j: J = r.json().await.unwrap_or(J::Null);
        pred(st, &j).then_some(j)
    })
    .await
}

async fn round_trip(transport: Transport) {
    let (run, _dir) = start().await;
    let service = format!("svc-{transport:?}").to_lowercase();
    let (g, h, svc) = (run.otlp_grpc_addr, run.otlp_http_addr, service.clone());
    let trace_id = tokio::task::spawn_blocking(move || emit(transport, g, h, &svc))
        .await
        .unwrap();
    assert_eq!(trace_id.len(), 32);
    let c = reqwest::Client::new();
    let http = format!("http://{}", run.http_addr);

    let t = eventually(&c, format!("{http}/api/v1/traces/{trace_id}"), |st, j| {
        st == 200 && j["spans"].as_array().is_some_and(|a| a.len() == 3)
    })
    .await;
    let spans = t["spans"].as_array().unwrap();
    let root = spans
        .iter()
        .find(|s| s["parent_span_id"] == "")
        .expect("a root span");
    assert_eq!(root["name"], "POST /v1/chat/completions");
    assert_eq!(root["service"], service.as_str());
    assert_eq!(root["host"], "app-host-1");
    assert_eq!(root["feature"], "basic_qa");
    assert_eq!(root["criticality"], "critical");
    assert_eq!(root["is_request"], true);
    assert_eq!(spans.iter().filter(|s| s["status"] == 2).count(), 1);

    // The failing span and the ERROR log became failure events linked to the trace.
    let f = eventually(
        &c,
        format!("{http}/api/v1/failures?service={service}"),
        |_, j| j["items"].as_array().is_some_and(|a| a.len() == 2),
    )
    .await;
    let items = f["items"].as_array().unwrap();
    assert!(
        items.iter().all(|i| i["trace_id"] == trace_id.as_str()),
        "{f}"
    );
    let mut cats: Vec<&str> = items
        .iter()
        .map(|i| i["category"].as_str().unwrap())
        .collect();
    cats.sort_unstable();
    assert_eq!(cats, vec!["kv_cache_exhausted", "tool_unavailable"]);

    let m = c
        .get(format!("{http}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(m.contains("brownout_ingest_spans_total 3"), "{m}");
    assert!(m.contains("brownout_ingest_logs_total 2"), "{m}");
    assert!(m.contains("brownout_ingest_failures_total 2"), "{m}");
    run.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_grpc_exporter_round_trip() {
    round_trip(Transport::Grpc).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_http_protobuf_exporter_round_trip() {
    round_trip(Transport::HttpProtobuf).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_http_json_exporter_round_trip() {
    round_trip(Transport::HttpJson).await;
}
