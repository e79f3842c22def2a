//! Ingest limits on a running control plane (embedded SQLite store, real sockets): per-tenant
//! item rates over HTTP and gRPC, the per-listener connection cap, and the request timeout
//! against a client that sends its body too slowly. Each is answered with its status and a
//! message, counted in `brownout_ingest_rejected_total` / `brownout_connections_refused_total`,
//! and loses nothing that was accepted.

use std::time::{Duration, Instant};

use brownout::auth::Tokens;
use brownout::config::{Config, Secret};
use brownout::plane::{App, Listeners, Running};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use serde_json::Value as J;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const INGEST: &str = "ingest-token-limits-aaaa";
const READ: &str = "read-token-limits-bbbbbb";

struct Server {
    run: Running,
    _dir: tempfile::TempDir,
    client: reqwest::Client,
}

async fn start(tune: impl FnOnce(&mut Config)) -> Server {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::defaults();
    config.data_dir = dir.path().to_path_buf();
    config.ingest.batch_max_delay = Duration::from_millis(20);
    tune(&mut config);
    let tokens = Tokens::new(
        Some(Secret::new(INGEST)),
        Some(Secret::new(READ)),
        Some(Secret::new("admin-token-limits-cccc")),
    );
    let app = App::build(config, tokens).await.unwrap();
    let run = app.spawn(Listeners::loopback().await.unwrap(), axum::Router::new());
    Server {
        run,
        _dir: dir,
        client: reqwest::Client::new(),
    }
}

fn ndjson(service: &str, n: usize) -> String {
    let mut s = String::new();
    for i in 0..n {
        s.push_str(&format!(
            "{{\"ts\":{},\"service\":\"{service}\",\"message\":\"boom {i}\"}}\n",
            brownout_protocol::now_ms()
        ));
    }
    s
}

impl Server {
    async fn post_failures(&self, tenant: Option<&str>, body: String) -> (u16, Option<String>, J) {
        let mut r = self
            .client
            .post(format!("http://{}/v1/failures", self.run.otlp_http_addr))
            .bearer_auth(INGEST)
            .header("content-type", "application/x-ndjson")
            .body(body);
        if let Some(t) = tenant {
            r = r.header("x-brownout-tenant", t);
        }
        let r = r.send().await.unwrap();
        let status = r.status().as_u16();
        let retry = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        (status, retry, r.json().await.unwrap_or(J::Null))
    }

    async fn failures_of(&self, service: &str) -> usize {
        let r: J = self
            .client
            .get(format!(
                "http://{}/api/v1/failures?service={service}&limit=1000",
                self.run.http_addr
            ))
            .bearer_auth(READ)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        r["items"].as_array().map_or(0, Vec::len)
    }

    async fn metrics(&self) -> String {
        self.client
            .get(format!("http://{}/metrics", self.run.http_addr))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

fn metric(text: &str, line_prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {line_prefix} in /metrics"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_get_their_own_rate_and_refused_requests_keep_nothing() {
    let s = start(|c| {
        c.ingest.tenant_items_per_sec = std::num::NonZeroU32::new(5);
        c.ingest.tenant_burst_items = std::num::NonZeroU32::new(100).unwrap();
    })
    .await;
    // Tenant a spends its whole burst, then is refused with 429, Retry-After and a message.
    let (st, _, _) = s.post_failures(Some("team-a"), ndjson("svc-a", 100)).await;
    assert_eq!(st, 200);
    let (st, retry, body) = s.post_failures(Some("team-a"), ndjson("svc-a2", 40)).await;
    assert_eq!(st, 429, "{body}");
    let retry: u64 = retry.expect("Retry-After").parse().unwrap();
    assert!((1..=10).contains(&retry), "retry-after {retry}");
    assert_eq!(body["error"]["code"], "tenant_rate_limited");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("team-a") && msg.contains("5 items/s"), "{msg}");
    // Other tenants (and requests without the header: "default") are unaffected.
    let (st, _, _) = s.post_failures(Some("team-b"), ndjson("svc-b", 100)).await;
    assert_eq!(st, 200);
    let (st, _, _) = s.post_failures(None, ndjson("svc-default", 10)).await;
    assert_eq!(st, 200);
    // More than the burst at once can never pass: said so.
    let (st, _, body) = s.post_failures(Some("team-c"), ndjson("svc-c", 101)).await;
    assert_eq!(st, 429);
    assert_eq!(body["error"]["code"], "too_many_items");
    // A hostile tenant name is a 400, not a new bucket.
    let (st, _, body) = s
        .post_failures(Some("<script>alert(1)</script>"), ndjson("svc-x", 1))
        .await;
    assert_eq!(st, 400);
    assert_eq!(body["error"]["code"], "bad_tenant");

    // Everything accepted is stored; nothing of the refused requests is.
    for (svc, n) in [("svc-a", 100), ("svc-b", 100), ("svc-default", 10)] {
        let start = Instant::now();
        while s.failures_of(svc).await < n {
            assert!(start.elapsed() < Duration::from_secs(5), "{svc} not stored");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert_eq!(s.failures_of(svc).await, n);
    }
    for svc in ["svc-a2", "svc-c", "svc-x"] {
        assert_eq!(s.failures_of(svc).await, 0, "{svc}");
    }
    let m = s.metrics().await;
    assert_eq!(
        metric(
            &m,
            "brownout_ingest_rejected_total{reason=\"tenant_rate_limited\"}"
        ),
        40.0
    );
    assert_eq!(
        metric(
            &m,
            "brownout_ingest_rejected_total{reason=\"too_many_items\"}"
        ),
        101.0
    );
    assert_eq!(
        metric(&m, "brownout_ingest_rejected_total{reason=\"bad_tenant\"}"),
        1.0
    );

    // gRPC: the same buckets, RESOURCE_EXHAUSTED past them, tenant from the metadata.
    let mut client = TraceServiceClient::connect(format!("http://{}", s.run.otlp_grpc_addr))
        .await
        .unwrap();
    let req = |n: usize, tenant: &str| {
        let mut r = tonic::Request::new(spans(n));
        r.metadata_mut()
            .insert("authorization", format!("Bearer {INGEST}").parse().unwrap());
        r.metadata_mut()
            .insert("x-brownout-tenant", tenant.parse().unwrap());
        r
    };
    client.export(req(100, "grpc-a")).await.unwrap();
    let e = client.export(req(50, "grpc-a")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("grpc-a"), "{}", e.message());
    let e = client.export(req(1, "bad tenant")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    client.export(req(100, "grpc-b")).await.unwrap();
    s.run.stop().await.unwrap();
}

fn spans(n: usize) -> ExportTraceServiceRequest {
    let t0 = brownout_protocol::now_ms() * 1_000_000;
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(AnyValue {
                        value: Some(Value::StringValue("grpc-svc".into())),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: (0..n)
                    .map(|i| Span {
                        trace_id: vec![7; 16],
                        span_id: (i as u64 + 1).to_be_bytes().to_vec(),
                        name: "GET /x".into(),
                        kind: 2,
                        start_time_unix_nano: t0,
                        end_time_unix_nano: t0 + 1_000_000,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

async fn read_all(c: &mut tokio::net::TcpStream, within: Duration) -> String {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(within, c.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_get_503_and_slots_come_back() {
    let s = start(|c| c.max_connections = 3).await;
    let addr = s.run.otlp_http_addr;
    // Three keep-alive connections that each sent a whole request take every slot (ones that
    // have not sent a request head would be evicted to admit a new connection instead:
    // `ingest_slow_clients.rs`).
    let mut idle = Vec::new();
    for _ in 0..3 {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /no-such-path HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 1024];
        let n = tokio::time::timeout(Duration::from_secs(3), c.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 "),
            "an answer on the holder"
        );
        idle.push(c);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut extra = tokio::net::TcpStream::connect(addr).await.unwrap();
    let text = read_all(&mut extra, Duration::from_secs(3)).await;
    assert!(text.starts_with("HTTP/1.1 503"), "{text:?}");
    assert!(text.contains("retry-after: 1"), "{text}");
    assert!(text.contains("too_many_connections"), "{text}");
    // A client through the front door sees the same.
    let r = s
        .client
        .post(format!("http://{addr}/v1/failures"))
        .bearer_auth(INGEST)
        .body(ndjson("svc-cap", 1))
        .send()
        .await;
    match r {
        Ok(r) => assert_eq!(r.status().as_u16(), 503),
        Err(e) => panic!("expected a 503 answer, got {e}"),
    }
    // The other listeners have their own caps.
    let m = s.metrics().await;
    assert!(
        metric(
            &m,
            "brownout_connections_refused_total{listener=\"otlp_http\"}"
        ) >= 2.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "brownout_connections_refused_total{listener=\"http\"}"),
        0.0
    );
    // Closing the idle connections frees their slots.
    drop(idle);
    let start = Instant::now();
    loop {
        let c = reqwest::Client::new();
        let r = c
            .post(format!("http://{addr}/v1/failures"))
            .bearer_auth(INGEST)
            .body(ndjson("svc-cap", 1))
            .send()
            .await
            .unwrap();
        if r.status().as_u16() == 200 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "slots never freed: {}",
            r.status()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.run.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sent_too_slowly_gets_408_and_frees_its_slot() {
    let s = start(|c| {
        c.ingest.request_timeout = Duration::from_millis(400);
        c.max_connections = 1;
    })
    .await;
    let addr = s.run.otlp_http_addr;
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/failures HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {INGEST}\r\ncontent-type: application/x-ndjson\r\ncontent-length: 1000\r\n\r\n{{\"ts\":1,"
    );
    c.write_all(head.as_bytes()).await.unwrap();
    let t = Instant::now();
    // The rest of the body never comes.
    let text = read_all(&mut c, Duration::from_secs(5)).await;
    let took = t.elapsed();
    assert!(text.starts_with("HTTP/1.1 408"), "{text:?}");
    assert!(text.contains("request_timeout"), "{text}");
    assert!(took < Duration::from_secs(3), "answered after {took:?}");
    drop(c);
    // The only slot is free again.
    let start = Instant::now();
    loop {
        let r = reqwest::Client::new()
            .post(format!("http://{addr}/v1/failures"))
            .bearer_auth(INGEST)
            .body(ndjson("svc-slow", 1))
            .send()
            .await
            .unwrap();
        if r.status().as_u16() == 200 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "{}", r.status());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let m = s.metrics().await;
    assert_eq!(
        metric(&m, "brownout_ingest_rejected_total{reason=\"timeout\"}"),
        1.0
    );
    s.run.stop().await.unwrap();
}
