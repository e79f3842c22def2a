//! Ingest: everything that arrives from outside and must not be lost.
//!
//! - [`http`]: OTLP/HTTP (`POST /v1/traces`, `POST /v1/logs`; protobuf and JSON; gzip; partial
//!   success), `POST /v1/failures` (NDJSON, per-line errors) and `POST /v1/agents/snapshot`.
//! - [`grpc`]: OTLP/gRPC trace and logs services (tonic, opentelemetry-proto types).
//! - [`otlp`]: pure conversion of OTLP messages into rows and failure events.
//! - [`pipeline`]: bounded memory → batches → store, with [`spool`] as the on-disk fallback
//!   (with ClickHouse acknowledged from the spool: the WAL writer and shipper of `shipper.rs`).
//! - [`write`]: what both writers share (a submitted request and its held answer, the group
//!   sealed into one batch, submit errors, the memory reservation, the writer status, the timed
//!   store write).
//! - [`hosts`]: per-host last-seen and fresh/stale/down from snapshots.
//! - [`limits`]: per-tenant item rates.
//! - [`listen`]: connection caps (per listener and per address), header-read and idle timeouts.
//!
//! All receivers end in [`accept`] / [`accept_reserved`] (the OTLP ones, HTTP and gRPC,
//! through [`accept_export`]), which tag failures, count, publish them to live subscribers and
//! submit one batch to the pipeline. Receivers reserve memory *before* decoding, sized by
//! [`decoded_size`], so requests waiting for memory hold only their (bounded) bodies.

pub mod grpc;
pub mod hosts;
pub mod http;
pub mod inflate;
pub mod limits;
pub mod listen;
pub mod otlp;
pub mod pipeline;
mod shipper;
pub mod spool;
pub mod write;

use std::sync::Arc;

use brownout_protocol::{AgentSnapshot, FailureEvent};
use tokio::sync::broadcast;

use crate::auth::Tokens;
use crate::config::IngestConfig;
use crate::metrics::Metrics;
use crate::store::{Batch, FailureRow, LogRow, SpanRow};
pub use pipeline::Pipeline;
pub use write::{SubmitError, WriterStatus};

/// What ingest's receivers use, and nothing else. Built by the composition root
/// ([`crate::plane::App`]); cheap to clone.
#[derive(Clone)]
pub struct IngestState {
    /// The `[ingest]` limits.
    pub config: Arc<IngestConfig>,
    pub metrics: Metrics,
    pub hosts: hosts::HostRegistry,
    pub tokens: Arc<Tokens>,
    /// Per-tenant ingest rates (`ingest.tenant_items_per_sec`).
    pub tenants: Arc<limits::TenantLimiter>,
    /// Submit rows here (they are counted, spooled when needed, never lost).
    pub pipeline: Pipeline,
    /// Assigns pattern ids to failures at ingest; `None` leaves them empty.
    pub tagger: Option<Arc<dyn FailureTagger>>,
    /// Sees every accepted span (the agent guards, [`crate::agents`]); `None`: nobody.
    pub span_observer: Option<Arc<dyn SpanObserver>>,
    /// Counts each batch's SLIs into it, stored with its rows ([`crate::slo::persist`]);
    /// `None`: no SLI buckets are stored.
    pub sli_counter: Option<Arc<dyn SliCounter>>,
    /// Every accepted failure, live (lossy for slow subscribers: `broadcast`).
    pub failures_tx: broadcast::Sender<Arc<FailureRow>>,
    /// Every accepted request span (roots and server spans), live, one message per ingest batch
    /// (lossy for slow subscribers: `broadcast`). Feeds the SLO evaluator.
    pub spans_tx: broadcast::Sender<Arc<[SpanRow]>>,
}

impl IngestState {
    /// Subscribes to accepted failures as they arrive.
    pub fn subscribe_failures(&self) -> broadcast::Receiver<Arc<FailureRow>> {
        self.failures_tx.subscribe()
    }

    /// Subscribes to accepted request spans as they arrive (one message per ingest batch).
    pub fn subscribe_spans(&self) -> broadcast::Receiver<Arc<[SpanRow]>> {
        self.spans_tx.subscribe()
    }
}

/// Assigns a pattern id to a failure event at ingest (the patterns component provides one;
/// without it, `pattern` stays empty). Must be fast: it runs on the request path.
pub trait FailureTagger: Send + Sync + 'static {
    fn tag(&self, event: &FailureEvent) -> String;
}

/// Sees the spans of every accepted request, once, before they are stored; the failure events it
/// returns are stored (tagged, counted, published) with them. Must be fast: it runs on the
/// request path.
pub trait SpanObserver: Send + Sync + 'static {
    fn observe(&self, spans: &[SpanRow]) -> Vec<FailureEvent>;
}

/// Counts the SLIs of one request's rows at ingest (the SLO component provides one): the rows
/// it returns travel in the batch and are stored with it, in the same exactly-once write
/// (docs/SLO.md "Stored SLI buckets"). Must be fast: it runs on the request path.
pub trait SliCounter: Send + Sync + 'static {
    fn count(&self, spans: &[SpanRow], failures: &[FailureRow]) -> Vec<crate::store::SliRow>;
}

/// Rows from one request, before tagging.
#[derive(Debug, Default)]
pub struct Accepted {
    pub spans: Vec<SpanRow>,
    pub logs: Vec<LogRow>,
    pub failures: Vec<FailureEvent>,
    pub snapshots: Vec<AgentSnapshot>,
}

/// Tags, counts and submits one request's rows, and returns once they are durable (in the
/// store or the fsync'ed spool): only then may a receiver acknowledge. Counters move and live
/// subscribers hear of the rows only after that.
///
/// # Errors
/// [`SubmitError`] when the pipeline cannot take them now (answer 503 + Retry-After).
pub async fn accept(
    state: &IngestState,
    tenant: &str,
    rows: Accepted,
    approx_bytes: usize,
) -> Result<(), SubmitError> {
    let r = state.pipeline.reserve(approx_bytes).await?;
    accept_reserved(state, tenant, rows, r).await
}

/// Like [`accept`] under memory reserved with [`Pipeline::reserve`] before decoding. The
/// request's items count against `tenant`'s rate first; a refused request keeps nothing.
///
/// # Errors
/// [`SubmitError::Tenant`] over the tenant's rate, [`SubmitError::Closed`] after shutdown,
/// [`SubmitError::NotStored`] when the rows could not be made durable.
pub async fn accept_reserved(
    state: &IngestState,
    tenant: &str,
    rows: Accepted,
    reservation: write::Reservation,
) -> Result<(), SubmitError> {
    let mut rows = rows;
    let items = rows.spans.len() + rows.logs.len() + rows.failures.len() + rows.snapshots.len();
    if let Err(e) = state.tenants.check(tenant, items) {
        let reason = match e {
            limits::TenantLimitError::RateLimited { .. } => "tenant_rate_limited",
            limits::TenantLimitError::TooManyItems { .. } => "too_many_items",
        };
        state.metrics.reject_n(reason, items as u64);
        return Err(e.into());
    }
    if let Some(o) = &state.span_observer
        && !rows.spans.is_empty()
    {
        rows.failures.extend(o.observe(&rows.spans));
    }
    let tagger = state.tagger.clone();
    let mut cut = limits::Truncated::default();
    let failures: Vec<FailureRow> = rows
        .failures
        .into_iter()
        .map(|mut e| {
            limits::limit_event(&mut e, &mut cut);
            let pattern = tagger.as_ref().map(|t| t.tag(&e)).unwrap_or_default();
            otlp::failure_row(e, pattern)
        })
        .collect();
    let (n_spans, n_logs, n_fail, n_snap) = (
        rows.spans.len(),
        rows.logs.len(),
        failures.len(),
        rows.snapshots.len(),
    );
    let live: Vec<FailureRow> = if state.failures_tx.receiver_count() > 0 {
        failures.clone()
    } else {
        Vec::new()
    };
    let live_spans: Vec<SpanRow> = if state.spans_tx.receiver_count() > 0 {
        rows.spans
            .iter()
            .filter(|s| s.is_request)
            .cloned()
            .collect()
    } else {
        Vec::new()
    };
    let sli = match &state.sli_counter {
        Some(c) => c.count(&rows.spans, &failures),
        None => Vec::new(),
    };
    let batch = Batch {
        id: 0,
        spans: rows.spans,
        logs: rows.logs,
        failures,
        snapshots: rows.snapshots,
        sli,
    };
    state.pipeline.submit_reserved(batch, reservation).await?;
    cut.count(&state.metrics);
    let m = &state.metrics.ingest;
    m.spans_total.inc_by(n_spans as u64);
    m.logs_total.inc_by(n_logs as u64);
    m.failures_total.inc_by(n_fail as u64);
    m.snapshots_total.inc_by(n_snap as u64);
    for f in live {
        let _ = state.failures_tx.send(Arc::new(f));
    }
    if !live_spans.is_empty() {
        let _ = state.spans_tx.send(Arc::from(live_spans));
    }
    Ok(())
}

/// What both OTLP receivers do with a decoded export request: convert it, accept its rows
/// under `reservation` ([`accept_reserved`]), count the items it refused (`malformed`) and what
/// the per-item limits cut, and build the answer, whose `partial_success` carries the first
/// refusal's reason or else the limits' warning.
///
/// # Errors
/// Those of [`accept_reserved`] (then nothing is counted as refused).
pub async fn accept_export<R: otlp::Export>(
    state: &IngestState,
    tenant: &str,
    req: R,
    reservation: write::Reservation,
) -> Result<R::Response, SubmitError> {
    let c = req.convert(brownout_protocol::now_ms());
    drop(req);
    let rows = Accepted {
        spans: c.spans,
        logs: c.logs,
        failures: c.failures,
        ..Accepted::default()
    };
    accept_reserved(state, tenant, rows, reservation).await?;
    state.metrics.reject_n("malformed", c.rejected);
    c.truncated.count(&state.metrics);
    let message = c.first_error.or_else(|| c.truncated.warning());
    Ok(R::response(message.map(|m| {
        (i64::try_from(c.rejected).unwrap_or(i64::MAX), m)
    })))
}

/// The memory to reserve for an OTLP protobuf body: [`limits::protobuf_decoded_estimate`]
/// (decoding plus converting, each resource copied into its items), or [`decoded_size`] when
/// the body does not even parse as protobuf (decoding will refuse it).
///
/// # Errors
/// A message for a 413 / `INVALID_ARGUMENT` when the estimate is more than the whole in-flight
/// budget (`ingest.max_inflight_bytes`): such a request could never be held, so it is refused
/// before it is decoded.
pub fn protobuf_reservation(
    config: &IngestConfig,
    body: &[u8],
    signal: limits::Signal,
) -> Result<usize, String> {
    let need = limits::protobuf_decoded_estimate(body, signal)
        .unwrap_or_else(|| decoded_size(body.len(), true));
    if need > config.max_inflight_bytes {
        return Err(format!(
            "this request of {} bytes would take about {} MiB once decoded, more than the in-flight budget ({} MiB, ingest.max_inflight_bytes); send fewer items or attributes per request",
            body.len(),
            need >> 20,
            config.max_inflight_bytes >> 20
        ));
    }
    Ok(need)
}

/// How many bytes of memory the rows decoded from a body of `body_bytes` take, roughly: a
/// span is ~150 bytes of protobuf and ~1.5 KiB as a [`SpanRow`] with its strings; text
/// encodings are closer to their decoded size.
pub fn decoded_size(body_bytes: usize, protobuf: bool) -> usize {
    let factor = if protobuf { 10 } else { 4 };
    body_bytes.saturating_mul(factor).saturating_add(1024)
}
