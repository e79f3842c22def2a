//! The running control plane (embedded SQLite store, real sockets) over HTTP: OTLP/HTTP in both
//! encodings with gzip, partial success, NDJSON failures, snapshots, the query API, auth,
//! malformed input, and `/metrics` checked by `promtool`.

use std::io::Write;
use std::time::Duration;

use brownout::auth::Tokens;
use brownout::config::{Config, Secret};
use brownout::plane::{App, Listeners, Running};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;
use serde_json::Value as J;

const INGEST: &str = "ingest-token-aaaaaaaaaaaa";
const READ: &str = "read-token-bbbbbbbbbbbbbb";
const ADMIN: &str = "admin-token-cccccccccccc";

struct Server {
    run: Running,
    http: String,
    otlp: String,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
}

async fn start(max_body_bytes: usize) -> Server {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::defaults();
    config.data_dir = dir.path().to_path_buf();
    config.ingest.batch_max_delay = Duration::from_millis(20);
    config.ingest.max_body_bytes = max_body_bytes;
    config.ingest.max_ndjson_line_bytes = 4096;
    let tokens = Tokens::new(
        Some(Secret::new(INGEST)),
        Some(Secret::new(READ)),
        Some(Secret::new(ADMIN)),
    );
    let app = App::build(config, tokens).await.unwrap();
    let run = app.spawn(Listeners::loopback().await.unwrap(), axum::Router::new());
    let http = format!("http://{}", run.http_addr);
    let otlp = format!("http://{}", run.otlp_http_addr);
    Server {
        run,
        http,
        otlp,
        client: reqwest::Client::new(),
        _dir: dir,
    }
}

impl Server {
    fn post(&self, url: String, ct: &str, body: Vec<u8>) -> reqwest::RequestBuilder {
        self.client
            .post(url)
            .bearer_auth(INGEST)
            .header("content-type", ct)
            .body(body)
    }

    async fn get_json(&self, path: &str) -> (u16, J) {
        let r = self
            .client
            .get(format!("{}{path}", self.http))
            .bearer_auth(READ)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(J::Null))
    }

    /// Polls a query until `pred` holds (ingest is asynchronous by up to a batch delay).
    async fn eventually(&self, path: &str, pred: impl Fn(u16, &J) -> bool) -> J {
        let pred = &pred;
        let found = brownout_test_support::poll(Duration::from_secs(5), || async move {
            let (s, j) = self.get_json(path).await;
            pred(s, &j).then_some(j)
        })
        .await;
        if let Some(j) = found {
            return j;
        }
        let (s, j) = self.get_json(path).await;
        panic!("{path}: condition never held; last answer {s} {j}");
    }
}

fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(v.into())),
        }),
        ..Default::default()
    }
}

fn now_ns() -> u64 {
    brownout_protocol::now_ms() * 1_000_000
}

fn traces(trace: u8, n: u8, status_of: impl Fn(u8) -> i32) -> ExportTraceServiceRequest {
    let t0 = now_ns();
    let spans = (0..n)
        .map(|i| Span {
            trace_id: vec![trace; 16],
            span_id: vec![i + 1; 8],
            parent_span_id: if i == 0 { vec![] } else { vec![1; 8] },
            name: format!("step-{i}"),
            kind: if i == 0 { 2 } else { 1 },
            start_time_unix_nano: t0 + u64::from(i) * 1_000_000,
            end_time_unix_nano: t0 + u64::from(i) * 1_000_000 + 500_000,
            attributes: vec![kv("feature", "pdf_analysis")],
            status: Some(Status {
                code: status_of(i),
                message: if status_of(i) == 2 {
                    "tool call to weather API timed out".into()
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
                attributes: vec![kv("service.name", "muse-agent"), kv("host.name", "gpu-7")],
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

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_http_protobuf_json_and_gzip_spans_come_back_through_the_query_api() {
    let s = start(1 << 20).await;
    // Protobuf.
    let r = s
        .post(
            format!("{}/v1/traces", s.otlp),
            "application/x-protobuf",
            traces(0x11, 3, |_| 1).encode_to_vec(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-protobuf");
    let resp = ExportTraceServiceResponse::decode(r.bytes().await.unwrap()).unwrap();
    assert!(resp.partial_success.is_none());
    // JSON (OTLP/JSON: hex ids, camelCase), gzipped, to the 8080 port this time.
    let json = serde_json::to_vec(&traces(0x22, 2, |i| if i == 1 { 2 } else { 0 })).unwrap();
    let r = s
        .post(
            format!("{}/v1/traces", s.http),
            "application/json",
            gzip(&json),
        )
        .header("content-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);

    let t1 = s
        .eventually(
            &format!("/api/v1/traces/{}", hex::encode([0x11u8; 16])),
            |st, _| st == 200,
        )
        .await;
    let spans = t1["spans"].as_array().unwrap();
    assert_eq!(spans.len(), 3);
    assert_eq!(spans[0]["service"], "muse-agent");
    assert_eq!(spans[0]["host"], "gpu-7");
    assert_eq!(spans[0]["feature"], "pdf_analysis");
    assert_eq!(spans[1]["parent_span_id"], hex::encode([1u8; 8]));
    let t2 = s
        .eventually(
            &format!("/api/v1/traces/{}", hex::encode([0x22u8; 16])),
            |st, _| st == 200,
        )
        .await;
    assert_eq!(t2["spans"].as_array().unwrap().len(), 2);
    // The error span became a failure linked to its trace.
    let f = s
        .eventually("/api/v1/failures?service=muse-agent", |_, j| {
            j["items"].as_array().is_some_and(|a| !a.is_empty())
        })
        .await;
    let item = &f["items"][0];
    assert_eq!(item["trace_id"], hex::encode([0x22u8; 16]));
    assert_eq!(item["category"], "tool_unavailable");
    assert_eq!(item["message"], "tool call to weather API timed out");
    // Unknown trace → 404, bad id → 400.
    assert_eq!(
        s.get_json(&format!("/api/v1/traces/{}", hex::encode([0x33u8; 16])))
            .await
            .0,
        404
    );
    assert_eq!(s.get_json("/api/v1/traces/xyz").await.0, 400);
    s.run.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn otlp_partial_success_counts_refused_spans() {
    let s = start(1 << 20).await;
    let mut req = traces(0x44, 2, |_| 0);
    req.resource_spans[0].scope_spans[0].spans[1].trace_id = vec![1, 2, 3];
    for (ct, body) in [
        ("application/x-protobuf", req.encode_to_vec()),
        ("application/json", serde_json::to_vec(&req).unwrap()),
    ] {
        let r = s
            .post(format!("{}/v1/traces", s.otlp), ct, body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let bytes = r.bytes().await.unwrap();
        let resp: ExportTraceServiceResponse = if ct.ends_with("protobuf") {
            ExportTraceServiceResponse::decode(bytes).unwrap()
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        let ps = resp.partial_success.expect("partial success reported");
        assert_eq!(ps.rejected_spans, 1, "{ct}");
        assert!(
            ps.error_message.contains("trace id"),
            "{}",
            ps.error_message
        );
    }
    s.run.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_clear_4xx() {
    let s = start(64 << 10).await;
    let good = traces(0x55, 1, |_| 0).encode_to_vec();
    let gz = gzip(&good);
    let mut big_json = b"{\"resourceSpans\":[".to_vec();
    big_json.extend(std::iter::repeat_n(b' ', 70 << 10));
    big_json.extend(b"]}");
    let bomb = gzip(&vec![b'{'; 1 << 20]);
    let url = format!("{}/v1/traces", s.otlp);
    // (name, content type, content encoding, body, status, text the message must hold)
    type Case<'a> = (&'a str, &'a str, Option<&'a str>, Vec<u8>, u16, &'a str);
    let cases: Vec<Case> = vec![
        (
            "malformed protobuf",
            "application/x-protobuf",
            None,
            vec![0x0a, 0xff, 0xff, 0x01],
            400,
            "protobuf",
        ),
        (
            "malformed json",
            "application/json",
            None,
            b"{\"resourceSpans\": [".to_vec(),
            400,
            "JSON",
        ),
        (
            "json with wrong shape",
            "application/json",
            None,
            b"{\"resourceSpans\": 5}".to_vec(),
            400,
            "JSON",
        ),
        (
            "invalid utf-8",
            "application/json",
            None,
            b"{\"a\":\"\xff\"}".to_vec(),
            400,
            "UTF-8",
        ),
        (
            "truncated gzip",
            "application/x-protobuf",
            Some("gzip"),
            gz[..gz.len() / 2].to_vec(),
            400,
            "gzip",
        ),
        (
            "gzip bomb",
            "application/json",
            Some("gzip"),
            bomb,
            413,
            "exceeds",
        ),
        (
            "unknown encoding",
            "application/json",
            Some("zstd"),
            b"{}".to_vec(),
            415,
            "zstd",
        ),
        (
            "wrong content type",
            "text/plain",
            None,
            b"hi".to_vec(),
            415,
            "Content-Type",
        ),
    ];
    let (status, text) = raw_post(
        &s.run.otlp_http_addr,
        "/v1/traces",
        "application/json",
        &big_json,
    )
    .await;
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("exceeds"), "{text}");
    for (name, ct, enc, body, want, msg) in cases {
        let mut r = s.post(url.clone(), ct, body);
        if let Some(e) = enc {
            r = r.header("content-encoding", e);
        }
        let r = r.send().await.unwrap();
        assert_eq!(r.status().as_u16(), want, "{name}");
        let bytes = r.bytes().await.unwrap();
        let text = if ct == "application/x-protobuf" {
            // google.rpc.Status: field 2 is the message.
            String::from_utf8_lossy(&bytes).to_string()
        } else {
            String::from_utf8_lossy(&bytes).to_string()
        };
        assert!(text.contains(msg), "{name}: {text}");
    }
    // NDJSON endpoint: oversize (the server answers before reading the body, so a raw client
    // that reads the answer even when its write is cut short), then NUL/UTF-8 per line.
    let (status, text) = raw_post(
        &s.run.http_addr,
        "/v1/failures",
        "application/x-ndjson",
        &vec![b'x'; 70 << 10],
    )
    .await;
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("exceeds"), "{text}");
    let r = s
        .post(
            format!("{}/v1/failures", s.http),
            "application/x-ndjson",
            b"\xff\n{\"ts\":1,\"service\":\"a\",\"message\":\"a\0b\"}\n".to_vec(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let j: J = r.json().await.unwrap();
    assert_eq!(j["rejected"], 2);
    assert!(
        j["errors"][0]["error"].as_str().unwrap().contains("UTF-8"),
        "{j}"
    );
    assert!(
        j["errors"][1]["error"].as_str().unwrap().contains("NUL"),
        "{j}"
    );
    // Snapshot endpoint.
    let r = s
        .post(
            format!("{}/v1/agents/snapshot", s.http),
            "application/json",
            b"{\"host\":\"\",\"ts_ms\":1}".to_vec(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = s
        .post(
            format!("{}/v1/agents/snapshot", s.http),
            "application/json",
            b"{\"host\":5}".to_vec(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    s.run.stop().await.unwrap();
}

/// POSTs over a raw socket and returns the status and the whole answer, ignoring a write
/// that the server cut short after answering early.
async fn raw_post(addr: &std::net::SocketAddr, path: &str, ct: &str, body: &[u8]) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {INGEST}\r\ncontent-type: {ct}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = c.write_all(head.as_bytes()).await;
    let _ = c.write_all(body).await;
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_checked_per_role() {
    let s = start(1 << 20).await;
    let body = traces(0x66, 1, |_| 0).encode_to_vec();
    let url = format!("{}/v1/traces", s.otlp);
    let send = |tok: Option<&'static str>| {
        let mut r = s
            .client
            .post(url.clone())
            .header("content-type", "application/x-protobuf")
            .body(body.clone());
        if let Some(t) = tok {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    let table = [
        (None, 401),
        (Some(READ), 401),
        (Some(ADMIN), 401),
        (Some("ingest-token-aaaaaaaaaaab"), 401),
        (Some(INGEST), 200),
    ];
    for (tok, want) in table {
        let r = send(tok).await.unwrap();
        assert_eq!(r.status().as_u16(), want, "{tok:?}");
        if want == 401 {
            assert!(r.headers().contains_key("www-authenticate"));
        }
    }
    let api = format!("{}/api/v1/hosts", s.http);
    for (tok, want) in [
        (None, 401),
        (Some(INGEST), 401),
        (Some(READ), 200),
        (Some(ADMIN), 200),
    ] {
        let mut r = s.client.get(&api);
        if let Some(t) = tok {
            r = r.bearer_auth(t);
        }
        assert_eq!(r.send().await.unwrap().status().as_u16(), want, "{tok:?}");
    }
    s.run.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ndjson_failures_are_stored_and_paginated() {
    let s = start(1 << 20).await;
    let now = brownout_protocol::now_ms();
    let mut body = String::new();
    for i in 0..7 {
        let cat = if i % 2 == 0 {
            "\"category\":\"kv_cache_exhausted\","
        } else {
            ""
        };
        body.push_str(&format!(
            "{{\"ts\":{},\"service\":\"muse\",\"feature\":\"pdf_analysis\",{cat}\"error_type\":\"ToolError\",\"message\":\"tool call to hotel API timed out after {i} ms\",\"trace_id\":\"t{i}\"}}\n",
            now - 1000 + i
        ));
    }
    body.push_str("{\"ts\":1,\"service\":\"muse\"}\n"); // line 8: no message
    body.push_str("not json\n"); // line 9
    let r = s
        .post(
            format!("{}/v1/failures", s.http),
            "application/x-ndjson",
            body.into_bytes(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let j: J = r.json().await.unwrap();
    assert_eq!(
        (j["accepted"].as_u64(), j["rejected"].as_u64()),
        (Some(7), Some(2))
    );
    let lines: Vec<u64> = j["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["line"].as_u64().unwrap())
        .collect();
    assert_eq!(lines, vec![8, 9]);

    s.eventually("/api/v1/failures?service=muse", |_, j| {
        j["items"].as_array().is_some_and(|a| a.len() == 7)
    })
    .await;
    let mut seen = Vec::new();
    let mut cursor = String::new();
    loop {
        let (st, j) = s
            .get_json(&format!(
                "/api/v1/failures?service=muse&limit=3&cursor={cursor}"
            ))
            .await;
        assert_eq!(st, 200);
        seen.extend(
            j["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["trace_id"].as_str().unwrap().to_string()),
        );
        match j["next_cursor"].as_str() {
            Some(c) => cursor = c.to_string(),
            None => break,
        }
    }
    assert_eq!(seen, vec!["t6", "t5", "t4", "t3", "t2", "t1", "t0"]);
    let (_, j) = s
        .get_json("/api/v1/failures?category=kv_cache_exhausted&limit=100")
        .await;
    assert_eq!(j["items"].as_array().unwrap().len(), 4);
    let (_, j) = s
        .get_json("/api/v1/failures?category=tool_unavailable")
        .await;
    assert_eq!(
        j["items"].as_array().unwrap().len(),
        3,
        "category inferred when missing"
    );
    let (st, j) = s.get_json("/api/v1/failures?category=martian").await;
    assert_eq!(st, 400);
    assert!(j["error"]["message"].as_str().unwrap().contains("martian"));
    s.run.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_logs_become_failures_and_snapshots_update_hosts() {
    let s = start(1 << 20).await;
    let rec = |sev: i32, body: &str| LogRecord {
        time_unix_nano: now_ns(),
        severity_number: sev,
        body: Some(AnyValue {
            value: Some(Value::StringValue(body.into())),
        }),
        attributes: vec![
            kv("feature", "image_generation"),
            kv("error_type", "AgentExecutionFailed"),
        ],
        trace_id: vec![0x77; 16],
        span_id: vec![1; 8],
        ..Default::default()
    };
    let req = ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(Resource {
                attributes: vec![kv("service.name", "painter")],
                ..Default::default()
            }),
            scope_logs: vec![ScopeLogs {
                log_records: vec![rec(9, "started"), rec(17, "resource_quota_exhausted")],
                ..Default::default()
            }],
            ..Default::default()
        }],
    };
    let r = s
        .post(
            format!("{}/v1/logs", s.otlp),
            "application/json",
            serde_json::to_vec(&req).unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let f = s
        .eventually("/api/v1/failures?service=painter", |_, j| {
            j["items"].as_array().is_some_and(|a| a.len() == 1)
        })
        .await;
    assert_eq!(f["items"][0]["trace_id"], hex::encode([0x77u8; 16]));
    assert_eq!(f["items"][0]["category"], "timeout_resource");
    assert_eq!(f["items"][0]["feature"], "image_generation");

    let snap = serde_json::json!({"host": "gpu-9", "ts_ms": brownout_protocol::now_ms(), "probe_up": true, "gpus": [], "engines": []});
    let r = s
        .post(
            format!("{}/v1/agents/snapshot", s.http),
            "application/json",
            serde_json::to_vec(&snap).unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let (_, h) = s.get_json("/api/v1/hosts").await;
    assert_eq!(h["hosts"][0]["host"], "gpu-9");
    assert_eq!(h["hosts"][0]["state"], "fresh");
    s.run.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_ingest_and_pass_promtool() {
    let s = start(1 << 20).await;
    let r = s
        .post(
            format!("{}/v1/traces", s.otlp),
            "application/x-protobuf",
            traces(0x12, 4, |i| if i == 3 { 2 } else { 0 }).encode_to_vec(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = s
        .post(
            format!("{}/v1/traces", s.otlp),
            "application/x-protobuf",
            vec![0xff],
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    s.eventually(
        &format!("/api/v1/traces/{}", hex::encode([0x12u8; 16])),
        |st, _| st == 200,
    )
    .await;
    let text = s
        .client
        .get(format!("{}/metrics", s.http))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for want in [
        "brownout_ingest_spans_total 4",
        "brownout_ingest_failures_total 1",
        "brownout_ingest_logs_total 0",
        "brownout_ingest_rejected_total{reason=\"malformed\"} 1",
        "brownout_spool_bytes 0",
        "brownout_store_write_seconds_count",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool is installed (apt-get install prometheus)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    s.run.stop().await.unwrap();
}
