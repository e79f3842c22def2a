//! Hostile single requests against a running control plane (embedded SQLite, real sockets):
//! a million attributes is refused before it is decoded (OTLP/HTTP 413, gRPC
//! INVALID_ARGUMENT); an 8 MiB `service.name` and thousands of attributes are cut to the
//! per-item limits with a marker, said in `partial_success` and counted; a malformed gRPC
//! message is INVALID_ARGUMENT; `ts` past 2106 or before 1970 is refused saying so; `/reports`
//! carries a CSP, `nosniff` and `frame-ancestors 'none'`; a gRPC message over
//! `ingest.max_body_bytes` is RESOURCE_EXHAUSTED from its length prefix (and without a token,
//! UNAUTHENTICATED from the headers), a gzip one that inflates past it too.

use std::marker::PhantomData;
use std::time::Duration;

use brownout::auth::Tokens;
use brownout::config::{Config, Secret};
use brownout::degrade::{InProcBus, Transport};
use brownout::plane::{App, Listeners, Plane, PlaneOptions};
use bytes::{Buf, BufMut};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status};
use prost::Message;
use serde_json::Value as J;

const INGEST: &str = "ingest-token-hostile-aaaa";
const READ: &str = "read-token-hostile-bbbbbb";
const ADMIN: &str = "admin-token-hostile-ccccc";

struct Cp {
    plane: Plane,
    http: String,
    otlp: String,
    grpc: String,
    _dir: tempfile::TempDir,
}

async fn start() -> Cp {
    start_with(|_| {}).await
}

async fn start_with(tune: impl FnOnce(&mut Config)) -> Cp {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::defaults();
    config.data_dir = dir.path().to_path_buf();
    tune(&mut config);
    let tokens = Tokens::new(
        Some(Secret::new(INGEST)),
        Some(Secret::new(READ)),
        Some(Secret::new(ADMIN)),
    );
    let app = App::build(config, tokens).await.unwrap();
    let listeners = Listeners::loopback().await.unwrap();
    let (http, otlp, grpc) = listeners.addrs();
    let opts = PlaneOptions::defaults(
        "hostile",
        b"hostile-command-key",
        Transport::InProc(InProcBus::new()),
    )
    .unwrap();
    let plane = Plane::start(app, listeners, opts).await.unwrap();
    Cp {
        plane,
        http: format!("http://{http}"),
        otlp: format!("http://{otlp}"),
        grpc: format!("http://{grpc}"),
        _dir: dir,
    }
}

fn kv(k: impl Into<String>, v: impl Into<String>) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(v.into())),
        }),
        ..KeyValue::default()
    }
}

/// One error span of `service` carrying `attrs`.
fn export(service: &str, attrs: Vec<KeyValue>) -> ExportTraceServiceRequest {
    let now = brownout_protocol::now_ms() * 1_000_000;
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv("service.name", service)],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: vec![Span {
                    trace_id: rand_id(16),
                    span_id: rand_id(8),
                    name: "hostile".into(),
                    start_time_unix_nano: now,
                    end_time_unix_nano: now + 1_000_000,
                    attributes: attrs,
                    status: Some(Status {
                        code: 2,
                        message: "boom".into(),
                    }),
                    ..Span::default()
                }],
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    }
}

fn rand_id(n: usize) -> Vec<u8> {
    (0..n).map(|_| rand::random::<u8>() | 1).collect()
}

async fn post_traces(
    c: &reqwest::Client,
    cp: &Cp,
    req: &ExportTraceServiceRequest,
) -> (u16, Vec<u8>) {
    let r = c
        .post(format!("{}/v1/traces", cp.otlp))
        .bearer_auth(INGEST)
        .header("content-type", "application/x-protobuf")
        .body(req.encode_to_vec())
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.bytes().await.unwrap().to_vec())
}

async fn metrics(c: &reqwest::Client, cp: &Cp) -> String {
    c.get(format!("{}/metrics", cp.http))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

fn metric(text: &str, line_prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {line_prefix} in /metrics"))
}

/// Waits (up to `secs`) until the control plane's `/metrics` line `name` satisfies `ok`.
async fn wait_for_metric(
    c: &reqwest::Client,
    cp: &Cp,
    what: &str,
    secs: u64,
    name: &str,
    ok: impl Fn(f64) -> bool,
) {
    brownout_test_support::eventually_async(what, Duration::from_secs(secs), || async {
        ok(metric(&metrics(c, cp).await, name)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_attributes_is_refused_before_decoding() {
    let cp = start().await;
    let c = reqwest::Client::new();
    let attrs: Vec<KeyValue> = (0..1_000_000).map(|i| kv(format!("k{i}"), "v")).collect();
    let req = export("svc-million", attrs);
    assert!(req.encoded_len() < 16 << 20, "fits the body limit");
    let (st, body) = post_traces(&c, &cp, &req).await;
    assert_eq!(st, 413);
    // The answer is a google.rpc.Status in protobuf: its message is plain text inside.
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("once decoded") && text.contains("max_inflight_bytes"),
        "{text}"
    );
    // gRPC: the same, INVALID_ARGUMENT (not retried by exporters).
    let mut g = TraceServiceClient::connect(cp.grpc.clone())
        .await
        .unwrap()
        .max_encoding_message_size(32 << 20);
    let mut r = tonic::Request::new(req);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {INGEST}").parse().unwrap());
    let e = g.export(r).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("once decoded"), "{}", e.message());
    let m = metrics(&c, &cp).await;
    assert!(
        metric(
            &m,
            "brownout_ingest_rejected_total{reason=\"decoded_too_large\"}"
        ) >= 2.0
    );
    cp.plane.stop().await.unwrap();
}

/// A trace export of `n` attributes of 1 MiB each (`n + ε` MiB of protobuf).
fn megabytes(n: usize) -> ExportTraceServiceRequest {
    let attrs: Vec<KeyValue> = (0..n)
        .map(|i| kv(format!("big{i}"), "x".repeat(1 << 20)))
        .collect();
    export("svc-oversize", attrs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_grpc_message_is_refused_before_it_is_buffered() {
    let cp = start().await;
    let c = reqwest::Client::new();
    let connect = || async {
        TraceServiceClient::connect(cp.grpc.clone())
            .await
            .unwrap()
            .max_encoding_message_size(64 << 20)
    };
    let big = megabytes(20);
    assert!(big.encoded_len() > 16 << 20, "over the 16 MiB body limit");

    // Over the limit: RESOURCE_EXHAUSTED naming the limit (not OUT_OF_RANGE or INTERNAL).
    let mut r = tonic::Request::new(big.clone());
    r.metadata_mut()
        .insert("authorization", format!("Bearer {INGEST}").parse().unwrap());
    let e = connect().await.export(r).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(
        e.message().contains("ingest.max_body_bytes"),
        "{}",
        e.message()
    );

    // Without a token the headers are enough to refuse it.
    let e = connect()
        .await
        .export(tonic::Request::new(big))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");

    // A gzip message of a few KiB that inflates past the limit: RESOURCE_EXHAUSTED as well.
    let mut bomb = tonic::Request::new(megabytes(20));
    bomb.metadata_mut()
        .insert("authorization", format!("Bearer {INGEST}").parse().unwrap());
    let e = connect()
        .await
        .send_compressed(tonic::codec::CompressionEncoding::Gzip)
        .export(bomb)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");

    // The channel and the budget are fine afterwards: a normal export is stored, and nothing
    // of the refused ones is still held.
    let mut ok = tonic::Request::new(megabytes(2));
    ok.metadata_mut()
        .insert("authorization", format!("Bearer {INGEST}").parse().unwrap());
    connect().await.export(ok).await.unwrap();
    let m = metrics(&c, &cp).await;
    assert!(
        metric(
            &m,
            "brownout_ingest_rejected_total{reason=\"body_too_large\"}"
        ) >= 1.0
    );
    assert!(
        metric(
            &m,
            "brownout_ingest_rejected_total{reason=\"unauthorized\"}"
        ) >= 1.0
    );
    wait_for_metric(
        &c,
        &cp,
        "the in-flight budget to be given back",
        10,
        "brownout_ingest_inflight_bytes",
        |v| v == 0.0,
    )
    .await;
    cp.plane.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_names_and_many_attributes_are_cut_with_a_marker_and_counted() {
    let cp = start().await;
    let c = reqwest::Client::new();
    let long_service = "s".repeat(8 << 20);
    let attrs: Vec<KeyValue> = (0..5000)
        .map(|i| kv(format!("k{i:05}"), "v".repeat(100)))
        .collect();
    let (st, body) = post_traces(&c, &cp, &export(&long_service, attrs)).await;
    assert_eq!(st, 200);
    let resp = ExportTraceServiceResponse::decode(&body[..]).unwrap();
    let ps = resp.partial_success.expect("a warning in partial_success");
    assert_eq!(ps.rejected_spans, 0);
    assert!(
        ps.error_message.contains("cut to the per-item limits"),
        "{ps:?}"
    );
    // The failure is stored under the cut name, with at most 128 attributes and the marker.
    let cut_name = format!("{}…[+{} bytes]", "s".repeat(256), (8 << 20) - 256);
    let url = format!("{}/api/v1/failures?limit=10", cp.http);
    let items = brownout_test_support::eventually_async(
        "the cut failure to be stored",
        Duration::from_secs(10),
        || {
            let (c, url) = (c.clone(), url.clone());
            async move {
                let j: J = c
                    .get(&url)
                    .bearer_auth(READ)
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                let items = j["items"].as_array()?.clone();
                (!items.is_empty()).then_some(items)
            }
        },
    )
    .await;
    let f = &items[0];
    assert_eq!(f["service"].as_str().unwrap(), cut_name);
    let attrs = f["attributes"].as_object().unwrap();
    assert!(attrs.len() <= 130, "{} attributes", attrs.len());
    let dropped: u64 = attrs["brownout.dropped_attributes"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(dropped >= 5000 - 128, "{dropped}");
    let m = metrics(&c, &cp).await;
    assert!(metric(&m, "brownout_ingest_truncated_total{what=\"names\"}") >= 1.0);
    assert!(metric(&m, "brownout_ingest_truncated_total{what=\"attributes\"}") >= 4000.0);
    cp.plane.stop().await.unwrap();
}

/// Sends raw bytes as the gRPC message and decodes the answer as prost.
struct RawCodec<D>(PhantomData<D>);
struct RawEnc;
struct ProstDec<D>(PhantomData<D>);

impl<D: Message + Default + Send + 'static> tonic::codec::Codec for RawCodec<D> {
    type Encode = Vec<u8>;
    type Decode = D;
    type Encoder = RawEnc;
    type Decoder = ProstDec<D>;
    fn encoder(&mut self) -> RawEnc {
        RawEnc
    }
    fn decoder(&mut self) -> ProstDec<D> {
        ProstDec(PhantomData)
    }
}

impl tonic::codec::Encoder for RawEnc {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        buf: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl<D: Message + Default> tonic::codec::Decoder for ProstDec<D> {
    type Item = D;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        buf: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<D>, tonic::Status> {
        let b = buf.copy_to_bytes(buf.remaining());
        D::decode(b)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_grpc_is_invalid_argument_and_bad_times_say_why() {
    let cp = start().await;
    let channel = tonic::transport::Endpoint::from_shared(cp.grpc.clone())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut g = tonic::client::Grpc::new(channel);
    g.ready().await.unwrap();
    let mut r = tonic::Request::new(vec![0x0a, 0xff, 0xff, 0x01]);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {INGEST}").parse().unwrap());
    let e = g
        .unary::<_, ExportTraceServiceResponse, _>(
            r,
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
                .parse()
                .unwrap(),
            RawCodec::<ExportTraceServiceResponse>(PhantomData),
        )
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("not a valid OTLP"), "{}", e.message());

    let c = reqwest::Client::new();
    for (line, want) in [
        (
            r#"{"ts":18446744073709551615,"service":"a","message":"x"}"#,
            "after 2106",
        ),
        (
            r#"{"ts":"0001-01-01T00:00:00Z","service":"a","message":"x"}"#,
            "before 1970",
        ),
    ] {
        let r = c
            .post(format!("{}/v1/failures", cp.otlp))
            .bearer_auth(INGEST)
            .body(format!("{line}\n"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400);
        let j: J = r.json().await.unwrap();
        let msg = j["errors"][0]["error"].as_str().unwrap_or_default();
        assert!(msg.contains(want), "{line}: {j}");
    }
    let r = c
        .get(format!(
            "{}/api/v1/failures?since=0001-01-01T00:00:00Z",
            cp.http
        ))
        .bearer_auth(READ)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
    assert!(r.text().await.unwrap().contains("before 1970"));
    cp.plane.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_carry_the_security_headers() {
    let cp = start().await;
    let c = reqwest::Client::new();
    for path in ["/reports", "/reports/current"] {
        let r = c
            .get(format!("{}{path}", cp.http))
            .bearer_auth(READ)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
        let h = r.headers();
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("frame-ancestors 'none'") && csp.contains("default-src 'none'"),
            "{path}: {csp}"
        );
        assert!(!csp.contains("script-src"), "no script on reports: {csp}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
    }
    cp.plane.stop().await.unwrap();
}

/// One OK span carrying one attribute of `mib` MiB of one repeated letter (it gzips to a few KiB).
fn compressible(mib: usize) -> (ExportTraceServiceRequest, String) {
    let mut req = export("svc-gzip", vec![kv("blob", "g".repeat(mib << 20))]);
    let span = &mut req.resource_spans[0].scope_spans[0].spans[0];
    span.status = None;
    let trace = hex::encode(&span.trace_id);
    (req, trace)
}

fn gzip(b: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

async fn stored(c: &reqwest::Client, cp: &Cp, trace: &str) -> usize {
    let r = c
        .get(format!("{}/api/v1/traces/{trace}", cp.http))
        .bearer_auth(READ)
        .send()
        .await
        .unwrap();
    if r.status() == 404 {
        return 0;
    }
    let j: J = r.json().await.unwrap();
    j["spans"].as_array().map_or(0, Vec::len)
}

/// The in-flight budget covers a gzip body as it is inflated (docs/SECURITY.md): with most of
/// the budget held by a half-sent upload, a gzip request of a few KiB that inflates to 4 MiB
/// cannot get the memory for its output and is refused (503 + Retry-After over HTTP,
/// `UNAVAILABLE` over gRPC), nothing of it stored; once the upload is gone the same requests
/// are stored, and the budget goes back to 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_output_is_inflated_inside_the_in_flight_budget() {
    use tokio::io::AsyncWriteExt;
    let cp = start_with(|c| {
        c.ingest.max_inflight_bytes = 16 << 20; // the smallest allowed: = max_body_bytes
        c.ingest.backpressure_wait = Duration::from_millis(300);
    })
    .await;
    let c = reqwest::Client::new();
    let (http_req, http_trace) = compressible(4);
    let (grpc_req, grpc_trace) = compressible(4);
    let http_gz = gzip(&http_req.encode_to_vec());
    assert!(http_gz.len() < 64 << 10, "{} bytes of gzip", http_gz.len());

    // An upload announcing 16,000,000 bytes sends 14 MiB and stalls: its bytes hold the budget.
    let addr = cp.otlp.trim_start_matches("http://").to_string();
    let mut stall = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /v1/traces HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {INGEST}\r\n\
         Content-Type: application/x-protobuf\r\nContent-Length: 16000000\r\n\r\n"
    );
    stall.write_all(head.as_bytes()).await.unwrap();
    stall.write_all(&vec![0u8; 14 << 20]).await.unwrap();
    wait_for_metric(
        &c,
        &cp,
        "the stalled upload to hold 14 MiB of the budget",
        20,
        "brownout_ingest_inflight_bytes",
        |v| v >= f64::from(14u32 << 20),
    )
    .await;

    let send_http = || {
        c.post(format!("{}/v1/traces", cp.otlp))
            .bearer_auth(INGEST)
            .header("content-type", "application/x-protobuf")
            .header("content-encoding", "gzip")
            .body(http_gz.clone())
            .send()
    };
    let send_grpc = || async {
        let mut r = tonic::Request::new(grpc_req.clone());
        r.metadata_mut()
            .insert("authorization", format!("Bearer {INGEST}").parse().unwrap());
        TraceServiceClient::connect(cp.grpc.clone())
            .await
            .unwrap()
            .max_encoding_message_size(32 << 20)
            .send_compressed(tonic::codec::CompressionEncoding::Gzip)
            .export(r)
            .await
    };
    let r = send_http().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().get("retry-after").is_some());
    let e = send_grpc().await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    assert_eq!(stored(&c, &cp, &http_trace).await, 0);
    assert_eq!(stored(&c, &cp, &grpc_trace).await, 0);

    // The upload goes away: its memory comes back (the server sees the connection end), and
    // the same requests fit.
    drop(stall);
    // The gauge follows the budget itself: with nothing else in flight it falls to 0 when the
    // upload's memory goes back, not at the next commit.
    wait_for_metric(
        &c,
        &cp,
        "brownout_ingest_inflight_bytes to fall to 0 once the upload is gone",
        20,
        "brownout_ingest_inflight_bytes",
        |v| v == 0.0,
    )
    .await;
    brownout_test_support::eventually_async(
        "the gzip request to fit once the upload's memory is back",
        Duration::from_secs(20),
        || async { (send_http().await.ok()?.status() == 200).then_some(()) },
    )
    .await;
    send_grpc().await.unwrap();
    assert_eq!(stored(&c, &cp, &http_trace).await, 1);
    assert_eq!(stored(&c, &cp, &grpc_trace).await, 1);
    let m = metrics(&c, &cp).await;
    assert!(metric(&m, "brownout_ingest_rejected_total{reason=\"overloaded\"}") >= 2.0);
    assert_eq!(metric(&m, "brownout_ingest_inflight_bytes"), 0.0);
    cp.plane.stop().await.unwrap();
}
