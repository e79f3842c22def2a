//! OTLP/gRPC receivers (tonic): `TraceService/Export` and `LogsService/Export`, gzip accepted,
//! the ingest token in the `authorization` metadata, partial success as in OTLP/HTTP.
//!
//! The services are written out here rather than generated: the codec hands the handler the
//! raw message, so that its decoded size is bounded and its memory reserved *before* prost
//! decodes it (as on OTLP/HTTP), and a malformed message is `INVALID_ARGUMENT`, not
//! `INTERNAL`.
//!
//! What is buffered before that reservation is bounded too ([`Budgeted`]):
//! - the token and tenant are checked on the request headers, before one byte of the body is
//!   read (`UNAUTHENTICATED` / `INVALID_ARGUMENT`: an unauthenticated client makes the server
//!   buffer nothing);
//! - a message whose gRPC length prefix says more than `ingest.max_body_bytes` is refused from
//!   those 5 bytes, before its body is buffered (`RESOURCE_EXHAUSTED`, counted as
//!   `body_too_large`); a gzip message that inflates past it is `RESOURCE_EXHAUSTED` too;
//! - every body byte is taken from the in-flight budget (`ingest.max_inflight_bytes`) as it
//!   arrives, and that reservation becomes part of the request's reservation for its decoded
//!   size; so concurrent streams, however many, buffer at most the budget, and wait for it
//!   (then `UNAVAILABLE`) like every other request.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::UnaryService;
use tonic::{Request, Response, Status};

use super::limits::Signal;
use super::pipeline::Pipeline;
use super::write::Reservation;
use super::{IngestState, SubmitError, otlp};

/// Checks the ingest token (`authorization` metadata, i.e. the HTTP/2 request headers) and
/// returns the tenant (`x-brownout-tenant`).
fn check_auth(state: &IngestState, headers: &axum::http::HeaderMap) -> Result<String, Status> {
    let presented = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let token = presented
        .strip_prefix("Bearer ")
        .or_else(|| presented.strip_prefix("bearer "))
        .unwrap_or("")
        .trim();
    if state.tokens.allows(crate::auth::Role::Ingest, token) {
        super::limits::tenant_name(
            headers
                .get(super::limits::TENANT_HEADER)
                .map(|v| v.as_bytes()),
        )
        .map_err(|e| {
            state.metrics.reject("bad_tenant");
            Status::invalid_argument(e)
        })
    } else {
        state.metrics.reject("unauthorized");
        Err(Status::unauthenticated(
            "missing or invalid `authorization: Bearer <ingest-token>` metadata",
        ))
    }
}

fn submit_status(e: SubmitError) -> Status {
    // UNAVAILABLE is retryable for OTLP exporters.
    match e {
        SubmitError::Closed | SubmitError::NotStored => Status::unavailable(e.to_string()),
        SubmitError::Overloaded { .. } | SubmitError::SpoolFull { .. } => {
            Status::unavailable(e.to_string())
        }
        SubmitError::Tenant(_) => Status::resource_exhausted(e.to_string()),
    }
}

/// The request's bytes, decoded by the handler (after the size estimate and the memory
/// reservation), so that a malformed message is `INVALID_ARGUMENT` and decoding happens only
/// once memory for it is held. Responses are encoded with prost.
struct RawCodec<E>(PhantomData<E>);

impl<E> Default for RawCodec<E> {
    fn default() -> Self {
        RawCodec(PhantomData)
    }
}

struct RawDecoder;
struct ProstEncoder<E>(PhantomData<E>);

impl<E: Message + Send + 'static> Codec for RawCodec<E> {
    type Encode = E;
    type Decode = Bytes;
    type Encoder = ProstEncoder<E>;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawDecoder
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let n = buf.remaining();
        Ok(Some(buf.copy_to_bytes(n)))
    }
}

impl<E: Message> Encoder for ProstEncoder<E> {
    type Item = E;
    type Error = Status;

    fn encode(&mut self, item: E, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(buf)
            .map_err(|e| Status::internal(format!("encoding the answer: {e}")))
    }
}

/// What [`Otlp::call`] learnt from the headers and what the body took from the budget while it
/// arrived, handed to the handler in the request's extensions.
#[derive(Clone)]
struct Admitted {
    tenant: String,
    body: Arc<Mutex<Option<Reservation>>>,
}

/// A request body whose bytes are taken from the in-flight budget as they arrive (before
/// tonic buffers them), and whose gRPC length prefixes are checked against
/// `ingest.max_body_bytes` before a message is buffered. A gzip message (`grpc-encoding:
/// gzip`, compressed flag set) is inflated here, not by tonic: each chunk of its output is
/// taken from the budget before it is produced ([`super::inflate::gunzip_chunks`]), and tonic
/// gets it as an uncompressed message; the compressed bytes are given back once inflated.
struct Budgeted {
    inner: tonic::body::Body,
    pipeline: Pipeline,
    metrics: crate::metrics::Metrics,
    max: usize,
    /// The request says `grpc-encoding: gzip`.
    gzip: bool,
    held: Arc<Mutex<Option<Reservation>>>,
    /// Where in the message stream the next byte belongs.
    at: At,
    /// Frames ready for tonic.
    out: std::collections::VecDeque<http_body::Frame<Bytes>>,
    done: bool,
}

/// The framing state of a gRPC request body: `[compressed u8][length u32 BE][message]`.
enum At {
    /// Collecting the 5-byte prefix of the next message.
    Prefix(Vec<u8>),
    /// Inside an uncompressed message (passed through), this many bytes to go.
    Plain(usize),
    /// Inside a gzip message, this many bytes to go; its pieces so far.
    Gzip(usize, std::collections::VecDeque<Bytes>),
}

impl Budgeted {
    /// Takes `n` bytes from the budget into the request's reservation.
    async fn take(&mut self, n: usize) -> Result<(), Status> {
        let r = self.pipeline.reserve(n).await.map_err(submit_status)?;
        if let Ok(mut held) = self.held.lock() {
            match held.as_mut() {
                Some(h) => h.merge(r),
                None => *held = Some(r),
            }
        }
        Ok(())
    }

    /// The next frame for tonic, `None` at the end.
    async fn next(&mut self) -> Option<Result<http_body::Frame<Bytes>, Status>> {
        use http_body_util::BodyExt;
        loop {
            if let Some(f) = self.out.pop_front() {
                return Some(Ok(f));
            }
            if self.done {
                return None;
            }
            let frame = match self.inner.frame().await {
                Some(Ok(f)) => f,
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(e));
                }
                None => {
                    self.done = true;
                    if matches!(&self.at, At::Gzip(..)) {
                        return Some(Err(Status::invalid_argument(
                            "the request ended inside a gzip message",
                        )));
                    }
                    continue;
                }
            };
            let data = match frame.into_data() {
                Ok(d) if !d.is_empty() => d,
                Ok(_) => continue,
                Err(f) => {
                    self.out.push_back(f);
                    continue;
                }
            };
            if let Err(e) = self.take(data.len()).await {
                self.done = true;
                return Some(Err(e));
            }
            if let Err(e) = self.split(data).await {
                self.done = true;
                return Some(Err(e));
            }
        }
    }

    /// Walks `data` through the framing: uncompressed bytes pass through, gzip messages are
    /// collected and inflated once complete.
    async fn split(&mut self, mut data: Bytes) -> Result<(), Status> {
        while !data.is_empty() {
            match &mut self.at {
                At::Prefix(p) => {
                    let n = (5 - p.len()).min(data.len());
                    p.extend_from_slice(&data.split_to(n));
                    if p.len() < 5 {
                        continue;
                    }
                    let compressed = p[0] != 0;
                    let len = u32::from_be_bytes([p[1], p[2], p[3], p[4]]) as usize;
                    if len > self.max {
                        self.metrics.reject("body_too_large");
                        return Err(Status::resource_exhausted(format!(
                            "the gRPC message is {len} bytes, more than ingest.max_body_bytes ({} bytes); it was refused before it was read: send smaller batches",
                            self.max
                        )));
                    }
                    if compressed && self.gzip {
                        self.at = At::Gzip(len, std::collections::VecDeque::new());
                    } else {
                        // Uncompressed (or an encoding tonic will refuse): passed through.
                        self.out
                            .push_back(http_body::Frame::data(Bytes::copy_from_slice(p)));
                        self.at = if len == 0 {
                            At::Prefix(Vec::with_capacity(5))
                        } else {
                            At::Plain(len)
                        };
                    }
                }
                At::Plain(left) => {
                    let n = (*left).min(data.len());
                    self.out.push_back(http_body::Frame::data(data.split_to(n)));
                    *left -= n;
                    if *left == 0 {
                        self.at = At::Prefix(Vec::with_capacity(5));
                    }
                }
                At::Gzip(left, pieces) => {
                    let n = (*left).min(data.len());
                    pieces.push_back(data.split_to(n));
                    *left -= n;
                    if *left == 0 {
                        let pieces = std::mem::take(pieces);
                        self.at = At::Prefix(Vec::with_capacity(5));
                        self.inflate(pieces).await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Inflates one complete gzip message into an uncompressed one for tonic.
    async fn inflate(&mut self, pieces: std::collections::VecDeque<Bytes>) -> Result<(), Status> {
        let compressed: usize = pieces.iter().map(Bytes::len).sum();
        let mut held = self.held.lock().ok().and_then(|mut h| h.take());
        let r = super::inflate::gunzip_chunks(pieces, self.max, &self.pipeline, &mut held).await;
        if let Some(h) = held.as_mut() {
            if r.is_ok() {
                h.release(compressed);
            }
        }
        if let Ok(mut slot) = self.held.lock() {
            *slot = held;
        }
        let (chunks, total) = r.map_err(|e| match e {
            super::inflate::InflateError::TooLarge(max) => {
                self.metrics.reject("body_too_large");
                Status::resource_exhausted(format!(
                    "the gzip gRPC message inflates past ingest.max_body_bytes ({max} bytes): send smaller batches"
                ))
            }
            super::inflate::InflateError::Bad(e) => {
                self.metrics.reject("bad_encoding");
                Status::invalid_argument(format!("the gzip gRPC message is truncated or corrupt: {e}"))
            }
            super::inflate::InflateError::Budget(e) => submit_status(e),
        })?;
        let mut prefix = Vec::with_capacity(5);
        prefix.push(0);
        prefix.extend_from_slice(&u32::try_from(total).unwrap_or(u32::MAX).to_be_bytes());
        self.out
            .push_back(http_body::Frame::data(Bytes::from(prefix)));
        self.out
            .extend(chunks.into_iter().map(http_body::Frame::data));
        Ok(())
    }

    /// The body tonic reads.
    fn into_body(self) -> tonic::body::Body {
        let frames =
            futures::stream::unfold(self, |mut b| async move { b.next().await.map(|f| (f, b)) });
        tonic::body::Body::new(http_body_util::StreamBody::new(frames))
    }
}

/// Bounds the decoded size, reserves memory for it (on top of what the body took while it
/// arrived), then decodes.
async fn admit<T: Message + Default>(
    state: &IngestState,
    req: Request<Bytes>,
    signal: Signal,
) -> Result<(String, T, Reservation), Status> {
    let admitted = req
        .extensions()
        .get::<Admitted>()
        .cloned()
        .ok_or_else(|| Status::internal("request was not admitted"))?;
    let bytes = req.into_inner();
    let need = super::protobuf_reservation(&state.config, &bytes, signal).map_err(|e| {
        state.metrics.reject("decoded_too_large");
        Status::invalid_argument(e)
    })?;
    let held = admitted.body.lock().ok().and_then(|mut h| h.take());
    let reservation = state
        .pipeline
        .top_up(held, need)
        .await
        .map_err(submit_status)?;
    let msg = T::decode(bytes).map_err(|e| {
        state.metrics.reject("malformed");
        Status::invalid_argument(format!("request is not a valid OTLP protobuf message: {e}"))
    })?;
    Ok((admitted.tenant, msg, reservation))
}

/// `TraceService/Export` and `LogsService/Export`: admitted, then accepted
/// ([`super::accept_export`]).
async fn export<R: otlp::Export>(
    state: IngestState,
    req: Request<Bytes>,
) -> Result<Response<R::Response>, Status> {
    let (tenant, req, reservation) = admit::<R>(&state, req, R::SIGNAL).await?;
    super::accept_export(&state, &tenant, req, reservation)
        .await
        .map(Response::new)
        .map_err(submit_status)
}

/// One unary method: the raw request to its handler.
struct Unary<F>(IngestState, F);

impl<R, F, Fut> UnaryService<Bytes> for Unary<F>
where
    F: Fn(IngestState, Request<Bytes>) -> Fut,
    Fut: std::future::Future<Output = Result<Response<R>, Status>> + Send + 'static,
{
    type Response = R;
    type Future = Fut;

    fn call(&mut self, req: Request<Bytes>) -> Fut {
        (self.1)(self.0.clone(), req)
    }
}

/// `TraceService/Export` (`LOGS = false`) or `LogsService/Export` (`LOGS = true`).
#[derive(Clone)]
pub struct Otlp<const LOGS: bool> {
    state: IngestState,
}

impl tonic::server::NamedService for Otlp<false> {
    const NAME: &'static str = "opentelemetry.proto.collector.trace.v1.TraceService";
}

impl tonic::server::NamedService for Otlp<true> {
    const NAME: &'static str = "opentelemetry.proto.collector.logs.v1.LogsService";
}

impl<const LOGS: bool> tower::Service<axum::http::Request<tonic::body::Body>> for Otlp<LOGS> {
    type Response = axum::http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: axum::http::Request<tonic::body::Body>) -> Self::Future {
        let state = self.state.clone();
        let path = req.uri().path().to_string();
        Box::pin(async move {
            let max = state.config.max_body_bytes;
            // Token and tenant from the headers, before the body is read.
            let tenant = match check_auth(&state, req.headers()) {
                Ok(t) => t,
                Err(status) => return Ok(status.into_http()),
            };
            let held = Arc::new(Mutex::new(None));
            let (mut parts, body) = req.into_parts();
            parts.extensions.insert(Admitted {
                tenant,
                body: Arc::clone(&held),
            });
            let gzip = parts
                .headers
                .get("grpc-encoding")
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"gzip"));
            let body = Budgeted {
                inner: body,
                pipeline: state.pipeline.clone(),
                metrics: state.metrics.clone(),
                max,
                gzip,
                held,
                at: At::Prefix(Vec::with_capacity(5)),
                out: std::collections::VecDeque::new(),
                done: false,
            };
            let req = axum::http::Request::from_parts(parts, body.into_body());
            macro_rules! grpc {
                ($codec:expr) => {
                    tonic::server::Grpc::new($codec)
                        .accept_compressed(CompressionEncoding::Gzip)
                        .send_compressed(CompressionEncoding::Gzip)
                        .max_decoding_message_size(max)
                };
            }
            Ok(match (LOGS, path.as_str()) {
                (false, "/opentelemetry.proto.collector.trace.v1.TraceService/Export") => {
                    grpc!(RawCodec::<ExportTraceServiceResponse>::default())
                        .unary(Unary(state, export::<ExportTraceServiceRequest>), req)
                        .await
                }
                (true, "/opentelemetry.proto.collector.logs.v1.LogsService/Export") => {
                    grpc!(RawCodec::<ExportLogsServiceResponse>::default())
                        .unary(Unary(state, export::<ExportLogsServiceRequest>), req)
                        .await
                }
                _ => Status::unimplemented(format!("no method {path}")).into_http(),
            })
        })
    }
}

/// Serves both services on `listener` until `shutdown` resolves.
///
/// # Errors
/// When the transport fails.
pub async fn serve(
    state: IngestState,
    listener: super::listen::CappedListener,
    tls: Option<std::sync::Arc<super::listen::Tls>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let timeout = state.config.request_timeout;
    let traces = Otlp::<false> {
        state: state.clone(),
    };
    let logs = Otlp::<true> { state };
    let router = tonic::transport::Server::builder()
        .timeout(timeout)
        .add_service(traces)
        .add_service(logs);
    match tls {
        None => {
            router
                .serve_with_incoming_shutdown(super::listen::incoming(listener), shutdown)
                .await
        }
        Some(tls) => {
            router
                .serve_with_incoming_shutdown(super::listen::incoming_tls(listener, tls), shutdown)
                .await
        }
    }
}
