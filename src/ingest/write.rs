//! What the two writers share: the in-memory pipeline's (`pipeline.rs`) and the WAL writer and
//! spool shipper (`shipper.rs`): a submitted request ([`Item`]) and its held answer ([`Held`]),
//! the gathered group sealed into one batch ([`seal`]), why a submit was refused
//! ([`SubmitError`]), the memory it holds ([`Reservation`]), the writer's status, and the timed
//! store write.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, oneshot};

use super::spool::SpoolError;
use crate::metrics::Metrics;
use crate::store::Batch;

/// Why a submit was refused. Both mean "try again later" (503 + Retry-After).
#[derive(Debug, Clone, thiserror::Error)]
pub enum SubmitError {
    #[error(
        "ingest is overloaded: the store is behind and memory is full; retry in {retry_after_secs} s"
    )]
    Overloaded { retry_after_secs: u32 },
    #[error("the spool is full while the store is unavailable; retry in {retry_after_secs} s")]
    SpoolFull { retry_after_secs: u32 },
    #[error("ingest is shutting down")]
    Closed,
    #[error("the rows could not be made durable (store and spool both failed); retry in 5 s")]
    NotStored,
    #[error(transparent)]
    Tenant(#[from] super::limits::TenantLimitError),
}

/// One submitted request on its way to the writer.
pub(super) struct Item {
    pub(super) batch: Batch,
    /// Memory budget held until the batch is written or spooled.
    pub(super) permit: Reservation,
    /// Told `Ok` once the rows are durable (store or spool), else why they were not kept.
    pub(super) done: oneshot::Sender<Result<(), SubmitError>>,
}

/// What the writer holds for each queued request until its group is durable.
pub(super) struct Held {
    _permit: Reservation,
    done: oneshot::Sender<Result<(), SubmitError>>,
}

/// Answers every held request with `r`.
pub(super) fn settle(held: &mut Vec<Held>, r: Result<(), SubmitError>) {
    for h in held.drain(..) {
        let _ = h.done.send(r.clone());
    }
}

/// The gathered group as one batch with a fresh id, ready to write or spool; `None` when it
/// holds no rows, its requests then answered `Ok` at once (there is nothing to keep).
pub(super) fn seal(pending: &mut Batch, held: &mut Vec<Held>) -> Option<Arc<Batch>> {
    if pending.is_empty() {
        settle(held, Ok(()));
        return None;
    }
    let mut batch = std::mem::take(pending);
    batch.id = crate::store::new_batch_id();
    Some(Arc::new(batch))
}

/// Status the writer reports (for `/api/v1/ingest/status` and tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct WriterStatus {
    pub store_up: bool,
    pub spool_bytes: u64,
}

/// Memory taken from the ingest budget; given back when dropped or when its batch is written.
#[derive(Debug)]
pub struct Reservation {
    /// `None` only once merged into another reservation (which then holds the memory).
    permit: Option<OwnedSemaphorePermit>,
    /// `brownout_ingest_inflight_bytes`: raised when memory is taken, lowered when it goes back
    /// (on drop or [`Reservation::release`]), so it never lags behind the budget.
    gauge: prometheus::IntGauge,
}

impl Reservation {
    pub(super) fn new(permit: OwnedSemaphorePermit, gauge: prometheus::IntGauge) -> Self {
        gauge.add(i64::try_from(permit.num_permits()).unwrap_or(i64::MAX));
        Reservation {
            permit: Some(permit),
            gauge,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.permit.as_ref().map_or(0, |p| p.num_permits())
    }

    /// Adds `other`'s memory to this reservation.
    pub fn merge(&mut self, mut other: Reservation) {
        match (self.permit.as_mut(), other.permit.take()) {
            (Some(mine), Some(theirs)) => mine.merge(theirs),
            (None, theirs) => self.permit = theirs,
            (Some(_), None) => {}
        }
    }

    /// Gives up to `n` bytes back to the budget (memory that was freed early, such as a
    /// compressed body once it is inflated).
    pub fn release(&mut self, n: usize) {
        let n = n.min(self.bytes());
        if let Some(p) = self.permit.as_mut()
            && let Some(back) = p.split(n)
        {
            self.gauge
                .sub(i64::try_from(back.num_permits()).unwrap_or(i64::MAX));
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(p) = self.permit.take() {
            self.gauge
                .sub(i64::try_from(p.num_permits()).unwrap_or(i64::MAX));
        }
    }
}

/// One store write under `write_timeout`: its time observed when it succeeds; a failure or a
/// timeout counted and logged with the rows and what happens next (`then`). True when stored.
pub(super) async fn timed_store_write(
    write: impl std::future::Future<Output = Result<(), crate::store::StoreError>>,
    backend: &str,
    rows: usize,
    then: &str,
    write_timeout: Duration,
    metrics: &Metrics,
) -> bool {
    let t0 = Instant::now();
    match tokio::time::timeout(write_timeout, write).await {
        Ok(Ok(())) => {
            metrics
                .ingest
                .store_write_seconds
                .observe(t0.elapsed().as_secs_f64());
            true
        }
        Ok(Err(e)) => {
            metrics.ingest.store_write_errors_total.inc();
            tracing::warn!(error = %e, backend, rows, then, "store write failed");
            false
        }
        Err(_) => {
            metrics.ingest.store_write_errors_total.inc();
            tracing::warn!(
                timeout_ms = write_timeout.as_millis() as u64,
                backend,
                rows,
                then,
                "store write timed out"
            );
            false
        }
    }
}

/// The error of a poisoned spool mutex.
pub(super) fn poisoned() -> SpoolError {
    SpoolError::Io {
        path: "<spool>".into(),
        source: std::io::Error::other("spool mutex poisoned"),
    }
}

/// Moves a request's rows into the group being gathered and holds its answer.
pub(super) fn take(pending: &mut Batch, held: &mut Vec<Held>, mut item: Item) {
    pending.append(&mut item.batch);
    held.push(Held {
        _permit: item.permit,
        done: item.done,
    });
}

/// Sleeps until `d`; forever when `None` (a `select!` arm with no deadline).
pub(super) async fn sleep_until_opt(d: Option<tokio::time::Instant>) {
    match d {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
