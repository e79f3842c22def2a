//! OTLP/gRPC receivers (tonic): `TraceService/Export` and `LogsService/Export`, gzip accepted,
//! the ingest token in the `authorization` metadata, partial success as in OTLP/HTTP.

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use prost::Message;
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

use super::{Accepted, IngestState, SubmitError, accept_reserved, otlp};

/// Both services, sharing the app state.
#[derive(Clone)]
pub struct Otlp {
    state: IngestState,
}

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
        SubmitError::Closed => Status::unavailable(e.to_string()),
        SubmitError::Overloaded { .. } | SubmitError::SpoolFull { .. } => {
            Status::unavailable(e.to_string())
        }
        SubmitError::Tenant(_) => Status::resource_exhausted(e.to_string()),
    }
}

impl Otlp {
    /// Checks the token and tenant, then reserves memory for the decoded rows before they are
    /// converted (a request waiting for memory holds only its message).
    async fn admit<T: Message>(
        &self,
        req: Request<T>,
    ) -> Result<(String, T, super::pipeline::Reservation), Status> {
        let tenant = check_auth(&self.state, &req)?;
        let req = req.into_inner();
        let reservation = self
            .state
            .pipeline
            .reserve(super::decoded_size(req.encoded_len(), true))
            .await
            .map_err(submit_status)?;
        Ok((tenant, req, reservation))
    }
}

#[tonic::async_trait]
impl TraceService for Otlp {
    async fn export(
        &self,
        req: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let (tenant, req, reservation) = self.admit(req).await?;
        let c = otlp::convert_traces(&req);
        drop(req);
        let rows = Accepted {
            spans: c.spans,
            failures: c.failures,
            ..Accepted::default()
        };
        accept_reserved(&self.state, &tenant, rows, reservation).map_err(submit_status)?;
        self.state.metrics.reject_n("malformed", c.rejected);
        Ok(Response::new(ExportTraceServiceResponse {
            partial_success: (c.rejected > 0).then(|| ExportTracePartialSuccess {
                rejected_spans: i64::try_from(c.rejected).unwrap_or(i64::MAX),
                error_message: c.first_error.unwrap_or_default(),
            }),
        }))
    }
}

#[tonic::async_trait]
impl LogsService for Otlp {
    async fn export(
        &self,
        req: Request<ExportLogsServiceRequest>,
    ) -> Result<Response<ExportLogsServiceResponse>, Status> {
        let (tenant, req, reservation) = self.admit(req).await?;
        let c = otlp::convert_logs(&req, brownout_protocol::now_ms());
        drop(req);
        let rows = Accepted {
            logs: c.logs,
            failures: c.failures,
            ..Accepted::default()
        };
        accept_reserved(&self.state, &tenant, rows, reservation).map_err(submit_status)?;
        self.state.metrics.reject_n("malformed", c.rejected);
        Ok(Response::new(ExportLogsServiceResponse {
            partial_success: (c.rejected > 0).then(|| ExportLogsPartialSuccess {
                rejected_log_records: i64::try_from(c.rejected).unwrap_or(i64::MAX),
                error_message: c.first_error.unwrap_or_default(),
            }),
        }))
    }
}

/// Serves both services on `listener` until `shutdown` resolves.
///
/// # Errors
/// When the transport fails.
pub async fn serve(
    state: IngestState,
    listener: super::limits::CappedListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let max = state.config.max_body_bytes;
    let timeout = state.config.request_timeout;
    let svc = Otlp { state };
    let traces = TraceServiceServer::new(svc.clone())
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(max);
    let logs = LogsServiceServer::new(svc)
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip)
        .max_decoding_message_size(max);
    tonic::transport::Server::builder()
        .timeout(timeout)
        .add_service(traces)
        .add_service(logs)
        .serve_with_incoming_shutdown(super::limits::incoming(listener), shutdown)
        .await
}
