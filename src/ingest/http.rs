//! HTTP receivers (ingest token): OTLP/HTTP traces and logs, failure NDJSON, agent snapshots.
//!
//! Bodies are read with a hard limit (`ingest.max_body_bytes`, checked on `Content-Length`
//! first, then while reading, then while un-gzipping): 413 past it. A truncated or corrupt
//! gzip stream, malformed protobuf or JSON, invalid UTF-8 or NUL bytes are 400 with a message
//! saying what and where. A full spool or exhausted memory is 503 with `Retry-After`.
//!
//! OTLP answers follow the OTLP/HTTP spec: 200 with an `Export*ServiceResponse` (whose
//! `partial_success` counts refused items), errors as a `google.rpc.Status`, both in the
//! request's encoding (protobuf or JSON).

use std::collections::VecDeque;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use brownout_protocol::{AgentSnapshot, FailureEvent};
use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use serde::Serialize;

use super::inflate::InflateError;
use super::pipeline::Pipeline;
use super::write::Reservation;
use super::{Accepted, IngestState, SubmitError, accept_reserved, otlp};
use crate::auth::Role;
use crate::error::ApiError;

/// The ingest routes, guarded by the ingest token; each body must arrive within
/// `ingest.request_timeout_ms` (408 past it).
pub fn router(state: IngestState) -> Router {
    Router::new()
        .route("/v1/traces", post(export::<ExportTraceServiceRequest>))
        .route("/v1/logs", post(export::<ExportLogsServiceRequest>))
        .route("/v1/failures", post(failures))
        .route("/v1/agents/snapshot", post(snapshot))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_ingest,
        ))
        .with_state(state)
}

/// The sender's tenant (`X-Brownout-Tenant`, `default` without it), set by the ingest guard.
#[derive(Debug, Clone)]
pub struct Tenant(pub String);

async fn require_ingest(
    State(state): State<IngestState>,
    mut req: Request,
    next: Next,
) -> Response {
    if let Err(e) = state.tokens.check(Role::Ingest, req.headers()) {
        state.metrics.reject("unauthorized");
        return e.into_response();
    }
    let tenant = super::limits::tenant_name(
        req.headers()
            .get(super::limits::TENANT_HEADER)
            .map(|v| v.as_bytes()),
    );
    match tenant {
        Ok(t) => {
            req.extensions_mut().insert(Tenant(t));
            next.run(req).await
        }
        Err(msg) => {
            state.metrics.reject("bad_tenant");
            ApiError::bad_request("bad_tenant", msg).into_response()
        }
    }
}

/// Why a body could not be read.
#[derive(Debug)]
pub enum BodyError {
    TooLarge(usize),
    BadGzip(String),
    UnsupportedEncoding(String),
    Read(String),
    /// The body did not arrive within this many milliseconds.
    Timeout(u128),
    /// No room in the in-flight budget for the body (or ingest is closing).
    Budget(SubmitError),
}

impl BodyError {
    /// The rejection reason to count, `None` where [`Pipeline::reserve`] counted it already.
    fn reason(&self) -> Option<&'static str> {
        Some(match self {
            BodyError::TooLarge(_) => "body_too_large",
            BodyError::BadGzip(_) | BodyError::Read(_) => "bad_encoding",
            BodyError::UnsupportedEncoding(_) => "unsupported_media_type",
            BodyError::Timeout(_) => "timeout",
            BodyError::Budget(_) => return None,
        })
    }

    /// Counts the rejection.
    fn count(&self, m: &crate::metrics::Metrics) {
        if let Some(r) = self.reason() {
            m.reject(r);
        }
    }

    fn into_api(self) -> ApiError {
        match self {
            BodyError::TooLarge(max) => ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!(
                    "request body exceeds {max} bytes (after decompression); send smaller batches"
                ),
            ),
            BodyError::BadGzip(e) => ApiError::bad_request(
                "bad_gzip",
                format!("gzip body is truncated or corrupt: {e}"),
            ),
            BodyError::UnsupportedEncoding(e) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_encoding",
                format!("Content-Encoding {e:?} is not supported (use gzip or none)"),
            ),
            BodyError::Read(e) => {
                ApiError::bad_request("bad_body", format!("cannot read the request body: {e}"))
            }
            BodyError::Budget(e) => submit_error(e),
            BodyError::Timeout(ms) => ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!(
                    "the request body did not arrive within {ms} ms (ingest.request_timeout_ms); send it faster or in smaller batches"
                ),
            ),
        }
    }
}

/// [`read_body`] with the ingest limits: `ingest.max_body_bytes`, and
/// `ingest.request_timeout_ms` for the whole body to arrive (a slow sender holds no slot
/// forever; nothing has been accepted yet when it is cut off).
async fn read_ingest_body(
    state: &IngestState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Bytes, Option<Reservation>), BodyError> {
    let ing = &state.config;
    tokio::time::timeout(
        ing.request_timeout,
        read_body(headers, body, ing.max_body_bytes, &state.pipeline),
    )
    .await
    .unwrap_or(Err(BodyError::Timeout(ing.request_timeout.as_millis())))
}

/// The request of a JSON receiver (failures, snapshots): its tenant and its body, read within
/// the ingest limits ([`read_ingest_body`]). A refused body is counted and answered as an
/// [`ApiError`] before the handler runs.
struct JsonBody {
    tenant: String,
    bytes: Bytes,
    /// The memory the body took, to be topped up to its rows' estimate.
    held: Option<Reservation>,
}

impl axum::extract::FromRequest<IngestState> for JsonBody {
    type Rejection = Response;

    async fn from_request(req: Request, state: &IngestState) -> Result<JsonBody, Response> {
        let (mut parts, body) = req.into_parts();
        let axum::Extension(Tenant(tenant)) =
            <axum::Extension<Tenant> as axum::extract::FromRequestParts<IngestState>>::from_request_parts(&mut parts, state)
                .await
                .map_err(IntoResponse::into_response)?;
        let (bytes, held) = read_ingest_body(state, &parts.headers, body)
            .await
            .map_err(|e| {
                e.count(&state.metrics);
                e.into_api().into_response()
            })?;
        Ok(JsonBody {
            tenant,
            bytes,
            held,
        })
    }
}

/// Reads a body up to `max` bytes, un-gzipping when `Content-Encoding: gzip` (again at most
/// `max` bytes once inflated). Every byte is taken from the in-flight budget before it is
/// held: the body's frames as they arrive, the inflated output as it is produced
/// ([`super::inflate`]); the compressed bytes are given back once inflated. Returns the body
/// and that reservation, which the caller tops up to its decoded-size estimate.
///
/// # Errors
/// [`BodyError`] for each way a body can be unacceptable, [`BodyError::Budget`] when the
/// budget has no room within the backpressure wait.
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
    max: usize,
    pipeline: &Pipeline,
) -> Result<(Bytes, Option<Reservation>), BodyError> {
    use http_body_util::BodyExt;
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > max as u64
    {
        return Err(BodyError::TooLarge(max));
    }
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .map(|v| v.to_str().unwrap_or("?").trim().to_ascii_lowercase())
        .unwrap_or_default();
    let gzip = match encoding.as_str() {
        "" | "identity" => false,
        "gzip" | "x-gzip" => true,
        other => return Err(BodyError::UnsupportedEncoding(other.to_string())),
    };
    let mut held: Option<Reservation> = None;
    let mut pieces: VecDeque<Bytes> = VecDeque::new();
    let mut raw = 0usize;
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
        let Ok(d) = frame.into_data() else { continue };
        if d.is_empty() {
            continue;
        }
        raw += d.len();
        if raw > max {
            return Err(BodyError::TooLarge(max));
        }
        take(pipeline, &mut held, d.len()).await?;
        pieces.push_back(d);
    }
    if gzip {
        let out = super::inflate::gunzip_contiguous(pieces, max, pipeline, &mut held)
            .await
            .map_err(|e| match e {
                InflateError::TooLarge(m) => BodyError::TooLarge(m),
                InflateError::Bad(e) => BodyError::BadGzip(e),
                InflateError::Budget(e) => BodyError::Budget(e),
            })?;
        // The compressed pieces are gone.
        if let Some(h) = held.as_mut() {
            h.release(raw);
        }
        return Ok((Bytes::from(out), held));
    }
    Ok(match pieces.len() {
        0 => (Bytes::new(), held),
        1 => (pieces.pop_front().unwrap_or_default(), held),
        _ => {
            // Joined into one buffer: reserved before the copy, the pieces' share given back
            // once they are dropped.
            take(pipeline, &mut held, raw).await?;
            let mut joined = bytes::BytesMut::with_capacity(raw);
            for p in pieces.drain(..) {
                joined.extend_from_slice(&p);
            }
            if let Some(h) = held.as_mut() {
                h.release(raw);
            }
            (joined.freeze(), held)
        }
    })
}

/// Takes `n` more bytes from the budget into `held`.
async fn take(
    pipeline: &Pipeline,
    held: &mut Option<Reservation>,
    n: usize,
) -> Result<(), BodyError> {
    let r = pipeline.reserve(n).await.map_err(BodyError::Budget)?;
    match held {
        Some(h) => h.merge(r),
        None => *held = Some(r),
    }
    Ok(())
}

/// OTLP's two encodings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Protobuf,
    Json,
}

fn otlp_encoding(headers: &HeaderMap) -> Option<Encoding> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let base = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match base.as_str() {
        "application/x-protobuf" | "application/protobuf" => Some(Encoding::Protobuf),
        "application/json" => Some(Encoding::Json),
        _ => None,
    }
}

/// `google.rpc.Status`, the body of an OTLP/HTTP error.
#[derive(Clone, PartialEq, prost::Message, Serialize)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
}

fn otlp_error(enc: Encoding, e: ApiError) -> Response {
    // gRPC codes: 3 INVALID_ARGUMENT, 4 DEADLINE_EXCEEDED, 8 RESOURCE_EXHAUSTED, 14 UNAVAILABLE,
    // 16 UNAUTHENTICATED.
    let code = match e.status {
        StatusCode::SERVICE_UNAVAILABLE => 14,
        StatusCode::PAYLOAD_TOO_LARGE | StatusCode::TOO_MANY_REQUESTS => 8,
        StatusCode::REQUEST_TIMEOUT => 4,
        _ => 3,
    };
    let status = RpcStatus {
        code,
        message: format!("{}: {}", e.code, e.message),
    };
    let mut r = encode(enc, e.status, &status, status.encode_to_vec());
    if let Some(s) = e.retry_after_secs {
        r.headers_mut().insert(header::RETRY_AFTER, s.into());
    }
    r
}

fn encode<T: Serialize>(enc: Encoding, status: StatusCode, msg: &T, proto: Vec<u8>) -> Response {
    match enc {
        Encoding::Protobuf => (
            status,
            [(header::CONTENT_TYPE, "application/x-protobuf")],
            proto,
        )
            .into_response(),
        Encoding::Json => (status, Json(msg)).into_response(),
    }
}

fn submit_error(e: SubmitError) -> ApiError {
    match e {
        SubmitError::Overloaded { retry_after_secs } => {
            ApiError::unavailable("overloaded", e.to_string(), retry_after_secs)
        }
        SubmitError::SpoolFull { retry_after_secs } => {
            ApiError::unavailable("spool_full", e.to_string(), retry_after_secs)
        }
        SubmitError::Closed => ApiError::unavailable("shutting_down", e.to_string(), 5),
        SubmitError::NotStored => ApiError::unavailable("not_stored", e.to_string(), 5),
        SubmitError::Tenant(ref t) => ApiError {
            retry_after_secs: Some(t.retry_after_secs()),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                match t {
                    super::limits::TenantLimitError::RateLimited { .. } => "tenant_rate_limited",
                    super::limits::TenantLimitError::TooManyItems { .. } => "too_many_items",
                },
                e.to_string(),
            )
        },
    }
}

/// Decodes an OTLP request body in its encoding.
fn decode<T: Message + Default + for<'de> serde::Deserialize<'de>>(
    enc: Encoding,
    body: &[u8],
) -> Result<T, ApiError> {
    match enc {
        Encoding::Protobuf => T::decode(body).map_err(|e| {
            ApiError::bad_request(
                "malformed_protobuf",
                format!("request is not a valid OTLP protobuf message: {e}"),
            )
        }),
        Encoding::Json => {
            let text = std::str::from_utf8(body).map_err(|e| {
                ApiError::bad_request(
                    "invalid_utf8",
                    format!("JSON body is not valid UTF-8 (at byte {})", e.valid_up_to()),
                )
            })?;
            serde_json::from_str(text).map_err(|e| {
                ApiError::bad_request(
                    "malformed_json",
                    format!("request is not a valid OTLP JSON message: {e}"),
                )
            })
        }
    }
}

async fn otlp_prelude(
    state: &IngestState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Encoding, Bytes, Option<Reservation>), Response> {
    let Some(enc) = otlp_encoding(headers) else {
        state.metrics.reject("unsupported_media_type");
        let e = ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "Content-Type must be application/x-protobuf or application/json",
        );
        return Err(e.into_response());
    };
    match read_ingest_body(state, headers, body).await {
        Ok((b, held)) => Ok((enc, b, held)),
        Err(e) => {
            e.count(&state.metrics);
            Err(otlp_error(enc, e.into_api()))
        }
    }
}

/// The OTLP request of a body: content type and size checked, memory reserved for its decoded
/// rows, then decoded. Protobuf is bounded before decoding
/// ([`super::protobuf_reservation`]: 413 when it could never fit the in-flight budget); JSON,
/// whose decoding is close to its size, reserves ×4 before decoding and tops the reservation
/// up to the same estimate before converting. Every refusal is already an OTLP error response.
async fn otlp_request<T: Message + Default + for<'de> serde::Deserialize<'de>>(
    state: &IngestState,
    headers: &HeaderMap,
    body: Body,
    signal: super::limits::Signal,
) -> Result<(Encoding, T, super::write::Reservation), Response> {
    let (enc, bytes, held) = otlp_prelude(state, headers, body).await?;
    let too_large = |m: String| {
        state.metrics.reject("decoded_too_large");
        otlp_error(
            enc,
            ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "decoded_too_large", m),
        )
    };
    let first = match enc {
        Encoding::Protobuf => {
            super::protobuf_reservation(&state.config, &bytes, signal).map_err(too_large)?
        }
        Encoding::Json => super::decoded_size(bytes.len(), false),
    };
    let mut reservation = state
        .pipeline
        .top_up(held, first)
        .await
        .map_err(|e| otlp_error(enc, submit_error(e)))?;
    let req: T = decode(enc, &bytes).map_err(|e| {
        state.metrics.reject("malformed");
        otlp_error(enc, e)
    })?;
    drop(bytes);
    if enc == Encoding::Json {
        let need = super::protobuf_reservation(&state.config, &req.encode_to_vec(), signal)
            .map_err(too_large)?;
        if need > reservation.bytes() {
            let more = state
                .pipeline
                .reserve(need - reservation.bytes())
                .await
                .map_err(|e| otlp_error(enc, submit_error(e)))?;
            reservation.merge(more);
        }
    }
    Ok((enc, req, reservation))
}

/// `POST /v1/traces` and `POST /v1/logs`: the body decoded within its reservation
/// ([`otlp_request`]), then accepted ([`super::accept_export`]); the answer in the request's
/// encoding.
async fn export<R>(
    State(state): State<IngestState>,
    axum::Extension(Tenant(tenant)): axum::Extension<Tenant>,
    headers: HeaderMap,
    body: Body,
) -> Response
where
    R: otlp::Export + for<'de> serde::Deserialize<'de>,
{
    let (enc, req, reservation) = match otlp_request::<R>(&state, &headers, body, R::SIGNAL).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    match super::accept_export(&state, &tenant, req, reservation).await {
        Ok(resp) => encode(enc, StatusCode::OK, &resp, resp.encode_to_vec()),
        Err(e) => otlp_error(enc, submit_error(e)),
    }
}

/// One refused NDJSON line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LineError {
    /// 1-based.
    pub line: usize,
    pub error: String,
}

/// What parsing an NDJSON body produced.
#[derive(Debug, Default)]
pub struct NdjsonParse {
    pub events: Vec<FailureEvent>,
    pub errors: Vec<LineError>,
    pub num_rejected: usize,
    pub num_too_long: usize,
}

/// At most this many line errors are listed in a response (all are counted).
pub const MAX_LISTED_ERRORS: usize = 100;

/// Splits an NDJSON body into failure events and per-line errors. Blank lines are skipped;
/// `\r\n` is accepted.
pub fn parse_ndjson(body: &[u8], max_line: usize) -> NdjsonParse {
    let mut out = NdjsonParse::default();
    for (i, raw) in body.split(|b| *b == b'\n').enumerate() {
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        if line.iter().all(|b| b.is_ascii_whitespace()) {
            continue;
        }
        let err = if line.len() > max_line {
            out.num_too_long += 1;
            Some(format!(
                "line is {} bytes, longer than the {max_line}-byte limit",
                line.len()
            ))
        } else {
            match FailureEvent::parse_line(line) {
                Ok(ev) => {
                    out.events.push(ev);
                    None
                }
                Err(e) => Some(e.to_string()),
            }
        };
        if let Some(error) = err {
            out.num_rejected += 1;
            if out.errors.len() < MAX_LISTED_ERRORS {
                out.errors.push(LineError { line: i + 1, error });
            }
        }
    }
    out
}

async fn failures(
    State(state): State<IngestState>,
    JsonBody {
        tenant,
        bytes,
        held,
    }: JsonBody,
) -> Response {
    let parsed = parse_ndjson(&bytes, state.config.max_ndjson_line_bytes);
    let m = &state.metrics;
    let too_long = parsed.num_too_long as u64;
    m.ingest
        .rejected_total
        .with_label_values(&["line_too_long"])
        .inc_by(too_long);
    m.ingest
        .rejected_total
        .with_label_values(&["invalid_line"])
        .inc_by(parsed.num_rejected as u64 - too_long);
    let accepted = parsed.events.len();
    if accepted == 0 {
        let msg = if parsed.num_rejected == 0 {
            "the body holds no failure events (one JSON object per line)".to_string()
        } else {
            format!("all {} lines were refused", parsed.num_rejected)
        };
        let body = serde_json::json!({
            "error": {"code": "no_valid_lines", "message": msg},
            "accepted": 0, "rejected": parsed.num_rejected, "errors": parsed.errors,
        });
        return (StatusCode::BAD_REQUEST, Json(body)).into_response();
    }
    let approx = super::decoded_size(bytes.len(), false);
    let reservation = match state.pipeline.top_up(held, approx).await {
        Ok(r) => r,
        Err(e) => return submit_error(e).into_response(),
    };
    drop(bytes);
    if let Err(e) = accept_reserved(
        &state,
        &tenant,
        Accepted {
            failures: parsed.events,
            ..Accepted::default()
        },
        reservation,
    )
    .await
    {
        return submit_error(e).into_response();
    }
    Json(serde_json::json!({"accepted": accepted, "rejected": parsed.num_rejected, "errors": parsed.errors})).into_response()
}

async fn snapshot(
    State(state): State<IngestState>,
    JsonBody {
        tenant,
        bytes,
        held,
    }: JsonBody,
) -> Response {
    let text = match std::str::from_utf8(&bytes) {
        Ok(t) if !t.contains('\0') => t,
        Ok(_) => {
            state.metrics.reject("malformed");
            return ApiError::bad_request("nul_byte", "snapshot contains a NUL byte")
                .into_response();
        }
        Err(e) => {
            state.metrics.reject("bad_encoding");
            return ApiError::bad_request(
                "invalid_utf8",
                format!("snapshot is not valid UTF-8 (at byte {})", e.valid_up_to()),
            )
            .into_response();
        }
    };
    let mut snap: AgentSnapshot = match serde_json::from_str(text) {
        Ok(s) => s,
        Err(e) => {
            state.metrics.reject("malformed");
            return ApiError::bad_request("malformed_json", format!("not an agent snapshot: {e}"))
                .into_response();
        }
    };
    if snap.host.trim().is_empty() {
        state.metrics.reject("malformed");
        return ApiError::bad_request("bad_field", "field `host` must not be empty")
            .into_response();
    }
    let now = brownout_protocol::now_ms();
    if snap.ts_ms == 0 {
        snap.ts_ms = now;
    }
    let reservation = match state
        .pipeline
        .top_up(held, super::decoded_size(bytes.len(), false))
        .await
    {
        Ok(r) => r,
        Err(e) => return submit_error(e).into_response(),
    };
    state.hosts.observe(snap.clone(), now);
    if let Err(e) = accept_reserved(
        &state,
        &tenant,
        Accepted {
            snapshots: vec![snap],
            ..Accepted::default()
        },
        reservation,
    )
    .await
    {
        return submit_error(e).into_response();
    }
    Json(serde_json::json!({"accepted": 1})).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ndjson_reports_bad_lines_by_number() {
        let body = b"{\"ts\":1,\"service\":\"a\",\"message\":\"x\"}\n\
                     \n\
                     {\"ts\":1,\"service\":\"a\"}\r\n\
                     {\"ts\":2,\"service\":\"b\",\"message\":\"y\"}\r\n\
                     \xff\xfe\n\
                     {\"ts\":1,\"service\":\"a\",\"message\":\"x\0\"}\n\
                     {\"ts\":3,\"service\":\"c\",\"message\":\"" as &[u8];
        let mut body = body.to_vec();
        body.extend(std::iter::repeat_n(b'z', 400));
        body.extend(b"\"}");
        let p = parse_ndjson(&body, 256);
        assert_eq!(p.events.len(), 2);
        let lines: Vec<usize> = p.errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, vec![3, 5, 6, 7]);
        assert!(p.errors[0].error.contains("message"), "{:?}", p.errors[0]);
        assert!(p.errors[1].error.contains("UTF-8"));
        assert!(p.errors[2].error.contains("NUL"));
        assert!(p.errors[3].error.contains("longer than"));
        assert_eq!((p.num_rejected, p.num_too_long), (4, 1));
    }

    #[tokio::test]
    async fn bodies_limits_and_gzip() {
        use std::io::Write;
        let (p, _task, _stop, _dir) =
            super::super::pipeline::test_pipeline(64 << 20, std::time::Duration::from_millis(100));
        let mut h = HeaderMap::new();
        let (b, held) = read_body(&h, Body::from("hello"), 1024, &p).await.unwrap();
        assert_eq!(&b[..], b"hello");
        assert_eq!(
            held.map(|r| r.bytes()),
            Some(5),
            "the body's bytes are reserved"
        );
        assert_eq!(p.taken(), 0);
        assert!(matches!(
            read_body(&h, Body::from(vec![0u8; 2048]), 1024, &p).await,
            Err(BodyError::TooLarge(1024))
        ));
        h.insert(header::CONTENT_ENCODING, "gzip".parse().unwrap());
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&[b'a'; 4000]).unwrap();
        let gz = gz.finish().unwrap();
        assert!(gz.len() < 1024);
        assert!(
            matches!(
                read_body(&h, Body::from(gz.clone()), 1024, &p).await,
                Err(BodyError::TooLarge(_))
            ),
            "gzip bomb stops at the limit"
        );
        let (b, held) = read_body(&h, Body::from(gz.clone()), 8192, &p)
            .await
            .unwrap();
        assert_eq!(b.len(), 4000);
        let held = held.unwrap();
        assert!(
            held.bytes() >= 4000,
            "the inflated bytes are in the budget ({} reserved)",
            held.bytes()
        );
        assert_eq!(p.taken(), held.bytes());
        drop(held);
        let truncated = gz[..gz.len() - 10].to_vec();
        assert!(matches!(
            read_body(&h, Body::from(truncated), 8192, &p).await,
            Err(BodyError::BadGzip(_))
        ));
        h.insert(header::CONTENT_ENCODING, "br".parse().unwrap());
        assert!(matches!(
            read_body(&h, Body::from("x"), 8192, &p).await,
            Err(BodyError::UnsupportedEncoding(_))
        ));
        assert_eq!(p.taken(), 0, "every refusal gave its memory back");
    }

    #[tokio::test]
    async fn a_body_is_refused_when_its_inflated_size_does_not_fit_the_budget() {
        use std::io::Write;
        // A 4 MiB budget (= the size limit) with 3 MiB held by other requests: a gzip body of
        // well under 1 MiB fits, its 2 MiB inflated does not, so it waits and gets a 503.
        let (p, _task, _stop, _dir) =
            super::super::pipeline::test_pipeline(4 << 20, std::time::Duration::from_millis(50));
        let others = p.reserve(3 << 20).await.unwrap();
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_ENCODING, "gzip".parse().unwrap());
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        for i in 0..(2u32 << 20) / 4 {
            gz.write_all(&(i % 97).to_le_bytes()).unwrap();
        }
        let gz = gz.finish().unwrap();
        assert!(gz.len() < 512 << 10);
        let r = read_body(&h, Body::from(gz.clone()), 4 << 20, &p).await;
        assert!(
            matches!(r, Err(BodyError::Budget(SubmitError::Overloaded { .. }))),
            "{r:?}"
        );
        assert_eq!(
            r.unwrap_err().into_api().status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(p.taken(), 3 << 20, "the refused body gave its memory back");
        drop(others);
        let (b, held) = read_body(&h, Body::from(gz), 4 << 20, &p).await.unwrap();
        assert_eq!(b.len(), 2 << 20);
        assert!(held.is_some_and(|r| r.bytes() >= 2 << 20));
    }
}
