//! OTLP/gRPC receivers (tonic): `TraceService/Export` and `LogsService/Export`, gzip accepted,
//! the ingest token in the `authorization` metadata, partial success as in OTLP/HTTP.
//!
//! The services are written out here rather than generated: the codec hands the handler the
//! raw message, so that its decoded size is bounded and its memory reserved *before* prost
//! decodes it (as on OTLP/HTTP), and a malformed message is `INVALID_ARGUMENT`, not
//! `INTERNAL`.

use std::marker::PhantomData;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::UnaryService;
use tonic::{Request, Response, Status};

use super::limits::Signal;
use super::{Accepted, IngestState, SubmitError, accept_reserved, otlp};

/// Checks the ingest token and returns the tenant (`x-brownout-tenant` metadata).
fn check_auth<T>(state: &IngestState, req: &Request<T>) -> Result<String, Status> {
    let presented = req
        .metadata()
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
            req.metadata()
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

/// Checks the token and tenant, bounds the decoded size, reserves memory for it, then decodes.
async fn admit<T: Message + Default>(
    state: &IngestState,
    req: Request<Bytes>,
    signal: Signal,
) -> Result<(String, T, super::pipeline::Reservation), Status> {
    let tenant = check_auth(state, &req)?;
    let bytes = req.into_inner();
    let need = super::protobuf_reservation(&state.config, &bytes, signal).map_err(|e| {
        state.metrics.reject("decoded_too_large");
        Status::invalid_argument(e)
    })?;
    let reservation = state.pipeline.reserve(need).await.map_err(submit_status)?;
    let msg = T::decode(bytes).map_err(|e| {
        state.metrics.reject("malformed");
        Status::invalid_argument(format!("request is not a valid OTLP protobuf message: {e}"))
    })?;
    Ok((tenant, msg, reservation))
}

async fn export_traces(
    state: IngestState,
    req: Request<Bytes>,
) -> Result<Response<ExportTraceServiceResponse>, Status> {
    let (tenant, req, reservation) =
        admit::<ExportTraceServiceRequest>(&state, req, Signal::Traces).await?;
    let c = otlp::convert_traces(&req);
    drop(req);
    let rows = Accepted {
        spans: c.spans,
        failures: c.failures,
        ..Accepted::default()
    };
    accept_reserved(&state, &tenant, rows, reservation)
        .await
        .map_err(submit_status)?;
    state.metrics.reject_n("malformed", c.rejected);
    c.truncated.count(&state.metrics);
    let message = c.first_error.or_else(|| c.truncated.warning());
    Ok(Response::new(ExportTraceServiceResponse {
        partial_success: message.map(|m| ExportTracePartialSuccess {
            rejected_spans: i64::try_from(c.rejected).unwrap_or(i64::MAX),
            error_message: m,
        }),
    }))
}

async fn export_logs(
    state: IngestState,
    req: Request<Bytes>,
) -> Result<Response<ExportLogsServiceResponse>, Status> {
    let (tenant, req, reservation) =
        admit::<ExportLogsServiceRequest>(&state, req, Signal::Logs).await?;
    let c = otlp::convert_logs(&req, brownout_protocol::now_ms());
    drop(req);
    let rows = Accepted {
        logs: c.logs,
        failures: c.failures,
        ..Accepted::default()
    };
    accept_reserved(&state, &tenant, rows, reservation)
        .await
        .map_err(submit_status)?;
    state.metrics.reject_n("malformed", c.rejected);
    c.truncated.count(&state.metrics);
    let message = c.first_error.or_else(|| c.truncated.warning());
    Ok(Response::new(ExportLogsServiceResponse {
        partial_success: message.map(|m| ExportLogsPartialSuccess {
            rejected_log_records: i64::try_from(c.rejected).unwrap_or(i64::MAX),
            error_message: m,
        }),
    }))
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
                        .unary(Unary(state, export_traces), req)
                        .await
                }
                (true, "/opentelemetry.proto.collector.logs.v1.LogsService/Export") => {
                    grpc!(RawCodec::<ExportLogsServiceResponse>::default())
                        .unary(Unary(state, export_logs), req)
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
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let timeout = state.config.request_timeout;
    let traces = Otlp::<false> {
        state: state.clone(),
    };
    let logs = Otlp::<true> { state };
    tonic::transport::Server::builder()
        .timeout(timeout)
        .add_service(traces)
        .add_service(logs)
        .serve_with_incoming_shutdown(super::listen::incoming(listener), shutdown)
        .await
}
