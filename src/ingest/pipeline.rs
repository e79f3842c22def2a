//! The write path from accepted rows to the store, losing nothing.
//!
//! ```text
//! handlers ──submit()──> [memory: ≤ max_inflight_bytes, semaphore] ──> writer task
//!                                                                       │ batch ≤ batch_max_rows, ≤ batch_max_delay
//!                                       spool empty and store up? ──yes─┼─> store.write_batch(Fresh)
//!                                                      no, or it failed ─┴─> spool.append (fsync)
//!                                       spool not empty and store up ──────> replay oldest record (Replay mode), commit
//! ```
//!
//! - A request is *acknowledged* only once its rows are durable: committed to the store
//!   (SQLite with `synchronous=FULL`, or an insert ClickHouse answered), or appended to the
//!   fsync'ed spool. [`Pipeline::submit_reserved`] waits for that. The writer commits in
//!   groups: it takes everything queued (≤ `batch_max_rows`, waiting at most
//!   `batch_max_delay` for more) and writes it as one batch, so concurrent requests share one
//!   commit (one fsync) and batches grow with the load.
//! - A handler that cannot get memory permits within `backpressure_wait` answers 503 with
//!   `Retry-After`, and so does one that finds the spool full. Memory is therefore bounded by
//!   `max_inflight_bytes`.
//! - Exactly once: a batch carries an id; the store records it in the same write as its rows
//!   (SQLite: the `batches` table in the same transaction; ClickHouse: `batch_id` + `seq` per
//!   row, checked before a replay), so a spool record replayed after a crash between the store
//!   write and the spool commit is stored once.
//! - While the spool holds anything, new batches go behind it, so the store sees batches in
//!   acceptance order.
//! - When the spool is full and the store is down, the group in hand is refused (503
//!   `spool_full` + `Retry-After` to each of its requests: none of them was acknowledged, so
//!   dropping it loses nothing acknowledged), and so are new requests until the spool has room.
//! - Shutdown writes what is queued to the store or, failing that, to the spool, and answers
//!   its requests; what neither takes is refused, not acknowledged.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};

use super::spool::{Spool, SpoolError};
use crate::config::{IngestConfig, SpoolConfig};
use crate::metrics::Metrics;
use crate::store::{Batch, Store, WriteMode};

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

struct Item {
    batch: Batch,
    /// Memory budget held until the batch is written or spooled.
    permit: OwnedSemaphorePermit,
    /// Told `Ok` once the rows are durable (store or spool), else why they were not kept.
    done: oneshot::Sender<Result<(), SubmitError>>,
}

/// What the writer holds for each queued request until its group is durable.
struct Held {
    _permit: OwnedSemaphorePermit,
    done: oneshot::Sender<Result<(), SubmitError>>,
}

fn settle(held: &mut Vec<Held>, r: Result<(), SubmitError>) {
    for h in held.drain(..) {
        let _ = h.done.send(r.clone());
    }
}

/// Cloneable handle handlers use to submit rows.
#[derive(Clone)]
pub struct Pipeline {
    tx: mpsc::UnboundedSender<Item>,
    permits: Arc<Semaphore>,
    max_permits: usize,
    wait: Duration,
    retry_after_secs: u32,
    spool_full: Arc<std::sync::atomic::AtomicBool>,
    metrics: Metrics,
}

/// Joins the writer task; [`PipelineTask::finish`] after the shutdown signal.
pub struct PipelineTask {
    handle: tokio::task::JoinHandle<()>,
}

impl PipelineTask {
    /// Waits until the writer has flushed everything to the store or the spool.
    pub async fn finish(self) {
        if let Err(e) = self.handle.await {
            tracing::error!(error = %e, "ingest writer task failed");
        }
    }
}

/// Status the writer reports (for `/api/v1/ingest/status` and tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct WriterStatus {
    pub store_up: bool,
    pub spool_bytes: u64,
}

impl Pipeline {
    /// Starts the writer. It runs until `shutdown` turns true *and* every [`Pipeline`] clone is
    /// dropped or the shutdown drain completes.
    ///
    /// # Errors
    /// When the spool directory cannot be opened.
    pub fn start(
        store: Arc<dyn Store>,
        spool_dir: &std::path::Path,
        ingest: &IngestConfig,
        spool: &SpoolConfig,
        write_timeout: Duration,
        metrics: Metrics,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(Pipeline, PipelineTask, watch::Receiver<WriterStatus>), SpoolError> {
        let sp = Spool::open(spool_dir, spool.max_bytes, spool.segment_bytes)?;
        metrics
            .ingest
            .spool_bytes
            .set(i64::try_from(sp.pending_bytes()).unwrap_or(i64::MAX));
        metrics
            .ingest
            .spool_corrupt_records_total
            .inc_by(sp.num_corrupt);
        let (tx, rx) = mpsc::unbounded_channel();
        let max_permits = ingest
            .max_inflight_bytes
            .min(Semaphore::MAX_PERMITS)
            .min(u32::MAX as usize);
        let permits = Arc::new(Semaphore::new(max_permits));
        let spool_full = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (status_tx, status_rx) = watch::channel(WriterStatus {
            store_up: true,
            spool_bytes: sp.pending_bytes(),
        });
        let writer = Writer {
            store,
            spool: Arc::new(Mutex::new(sp)),
            rx,
            max_rows: ingest.batch_max_rows.get(),
            max_delay: ingest.batch_max_delay,
            write_timeout,
            metrics: metrics.clone(),
            spool_full: Arc::clone(&spool_full),
            retry_after_secs: spool.retry_after_secs,
            permits: Arc::clone(&permits),
            max_permits,
            status: status_tx,
            store_up: true,
            replay_cache: None,
            shutdown: shutdown.clone(),
        };
        let handle = tokio::spawn(writer.run(shutdown));
        Ok((
            Pipeline {
                tx,
                permits,
                max_permits,
                wait: ingest.backpressure_wait,
                retry_after_secs: spool.retry_after_secs,
                spool_full,
                metrics,
            },
            PipelineTask { handle },
            status_rx,
        ))
    }

    /// Accepts a batch (its id is replaced by the writer's), holding `approx_bytes` of the
    /// memory budget until it is written or spooled; returns once it is durable.
    ///
    /// # Errors
    /// [`SubmitError`] when it cannot be accepted now; nothing of it is kept.
    pub async fn submit(&self, batch: Batch, approx_bytes: usize) -> Result<(), SubmitError> {
        if batch.is_empty() {
            return Ok(());
        }
        let r = self.reserve(approx_bytes).await?;
        self.submit_reserved(batch, r).await
    }

    /// Takes `approx_bytes` of the memory budget *before* a request is decoded, so requests
    /// waiting for memory hold only their body, not their decoded rows.
    ///
    /// # Errors
    /// [`SubmitError`] when the spool is full or no memory frees up within the wait.
    pub async fn reserve(&self, approx_bytes: usize) -> Result<Reservation, SubmitError> {
        if self.spool_full.load(std::sync::atomic::Ordering::Relaxed) {
            self.metrics.reject("spool_full");
            return Err(SubmitError::SpoolFull {
                retry_after_secs: self.retry_after_secs,
            });
        }
        let n = u32::try_from(approx_bytes.clamp(1, self.max_permits)).unwrap_or(u32::MAX);
        let permit =
            match tokio::time::timeout(self.wait, Arc::clone(&self.permits).acquire_many_owned(n))
                .await
            {
                Ok(Ok(p)) => p,
                Ok(Err(_)) => return Err(SubmitError::Closed),
                Err(_) => {
                    self.metrics.reject("overloaded");
                    return Err(SubmitError::Overloaded {
                        retry_after_secs: self.retry_after_secs,
                    });
                }
            };
        self.metrics
            .ingest
            .inflight_bytes
            .set(i64::try_from(self.max_permits - self.permits.available_permits()).unwrap_or(0));
        Ok(Reservation(permit))
    }

    /// Queues a batch under a reservation (released when it is written or spooled) and waits
    /// until it is durable: committed to the store or appended to the fsync'ed spool. Only then
    /// may a receiver acknowledge it.
    ///
    /// # Errors
    /// [`SubmitError::Closed`] after shutdown, [`SubmitError::NotStored`] when neither the
    /// store nor the spool took it (the caller answers 503; the rows may or may not be stored).
    pub async fn submit_reserved(&self, batch: Batch, r: Reservation) -> Result<(), SubmitError> {
        if batch.is_empty() {
            return Ok(());
        }
        let (done, durable) = oneshot::channel();
        self.tx
            .send(Item {
                batch,
                permit: r.0,
                done,
            })
            .map_err(|_| SubmitError::Closed)?;
        durable.await.unwrap_or(Err(SubmitError::NotStored))
    }
}

/// Memory taken from the ingest budget; given back when dropped or when its batch is written.
pub struct Reservation(OwnedSemaphorePermit);

impl Reservation {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.0.num_permits()
    }

    /// Adds `other`'s memory to this reservation.
    pub fn merge(&mut self, other: Reservation) {
        self.0.merge(other.0);
    }
}

struct Writer {
    store: Arc<dyn Store>,
    /// `Retry-After` of a refusal for a full spool.
    retry_after_secs: u32,
    spool: Arc<Mutex<Spool>>,
    rx: mpsc::UnboundedReceiver<Item>,
    max_rows: usize,
    max_delay: Duration,
    write_timeout: Duration,
    metrics: Metrics,
    spool_full: Arc<std::sync::atomic::AtomicBool>,
    permits: Arc<Semaphore>,
    max_permits: usize,
    status: watch::Sender<WriterStatus>,
    store_up: bool,
    shutdown: watch::Receiver<bool>,
    /// The record at the spool's cursor, decoded, so a failed replay does not re-read it.
    replay_cache: Option<(super::spool::Peeked, Batch)>,
}

impl Writer {
    async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut pending = Batch::default();
        let mut held: Vec<Held> = Vec::new();
        let mut deadline: Option<tokio::time::Instant> = None;
        let mut retry_at = tokio::time::Instant::now();
        let mut backoff = Duration::from_millis(200);
        loop {
            let spool_waiting = !self.spool_is_empty();
            let can_replay = spool_waiting && tokio::time::Instant::now() >= retry_at;
            // Unbiased on purpose: under sustained load `recv` is always ready, and replay
            // must still get its turns or the spool would never drain.
            tokio::select! {
                _ = shutdown.changed() => {
                    if *shutdown.borrow() {
                        break;
                    }
                }
                msg = self.rx.recv() => {
                    let Some(item) = msg else { break };
                    take(&mut pending, &mut held, item);
                    // Group commit: everything already queued joins this batch.
                    while pending.num_rows() < self.max_rows {
                        match self.rx.try_recv() {
                            Ok(item) => take(&mut pending, &mut held, item),
                            Err(_) => break,
                        }
                    }
                    if deadline.is_none() {
                        deadline = Some(tokio::time::Instant::now() + self.max_delay);
                    }
                    if pending.num_rows() >= self.max_rows || self.max_delay.is_zero() {
                        self.flush(&mut pending, &mut held).await;
                        deadline = None;
                    }
                }
                _ = sleep_until_opt(deadline) => {
                    self.flush(&mut pending, &mut held).await;
                    deadline = None;
                }
                _ = tokio::time::sleep_until(retry_at), if spool_waiting && !can_replay => {}
                _ = std::future::ready(()), if can_replay => {
                    if self.replay_one().await {
                        backoff = Duration::from_millis(200);
                    } else {
                        retry_at = tokio::time::Instant::now() + backoff;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
        }
        // Shutdown: take what is queued, then write it once to the store or the spool.
        self.rx.close();
        while let Ok(item) = self.rx.try_recv() {
            take(&mut pending, &mut held, item);
        }
        self.flush(&mut pending, &mut held).await;
        tracing::info!(spool_bytes = self.spool_bytes(), "ingest writer stopped");
    }

    fn shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    fn spool_is_empty(&self) -> bool {
        self.spool.lock().map(|s| s.is_empty()).unwrap_or(false)
    }

    fn spool_bytes(&self) -> u64 {
        self.spool.lock().map(|s| s.pending_bytes()).unwrap_or(0)
    }

    fn publish(&self) {
        let bytes = self.spool_bytes();
        self.metrics
            .ingest
            .spool_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.metrics
            .ingest
            .inflight_bytes
            .set(i64::try_from(self.max_permits - self.permits.available_permits()).unwrap_or(0));
        let _ = self.status.send(WriterStatus {
            store_up: self.store_up,
            spool_bytes: bytes,
        });
    }

    async fn timed_write(&self, batch: &Batch, mode: WriteMode) -> bool {
        let t0 = Instant::now();
        let r = tokio::time::timeout(self.write_timeout, self.store.write_batch(batch, mode)).await;
        match r {
            Ok(Ok(())) => {
                self.metrics
                    .ingest
                    .store_write_seconds
                    .observe(t0.elapsed().as_secs_f64());
                true
            }
            Ok(Err(e)) => {
                self.metrics.ingest.store_write_errors_total.inc();
                tracing::warn!(error = %e, backend = self.store.backend(), rows = batch.num_rows(), "store write failed; spooling");
                false
            }
            Err(_) => {
                self.metrics.ingest.store_write_errors_total.inc();
                tracing::warn!(
                    timeout_ms = self.write_timeout.as_millis() as u64,
                    rows = batch.num_rows(),
                    "store write timed out; spooling"
                );
                false
            }
        }
    }

    /// Writes `pending` to the store or the spool; keeps retrying (holding its memory) while
    /// neither can take it, except at shutdown where a last spool failure is logged loudly.
    async fn flush(&mut self, pending: &mut Batch, held: &mut Vec<Held>) {
        if pending.is_empty() {
            settle(held, Ok(()));
            return;
        }
        let mut batch = std::mem::take(pending);
        batch.id = crate::store::new_batch_id();
        let mut delay = Duration::from_millis(100);
        let mut tries = 0;
        let result = loop {
            if self.spool_is_empty() && self.store_up {
                if self.timed_write(&batch, WriteMode::Fresh).await {
                    break Ok(());
                }
                self.store_up = false;
            }
            match self.spool_append(&batch).await {
                Ok(()) => break Ok(()),
                Err(SpoolError::Full { .. }) => {
                    self.spool_full
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                    self.publish();
                    // Make room by replaying once; if the store cannot take it either, these
                    // rows are refused (nothing of them was acknowledged): 503 + Retry-After.
                    tries += 1;
                    if tries > 1 || !self.replay_one().await {
                        tracing::warn!(
                            rows = batch.num_rows(),
                            "store down and spool full: refusing these rows (503 spool_full)"
                        );
                        self.metrics.reject_n("spool_full", held.len() as u64);
                        break Err(SubmitError::SpoolFull {
                            retry_after_secs: self.retry_after_secs,
                        });
                    }
                }
                Err(e) => {
                    tries += 1;
                    tracing::error!(error = %e, "spool append failed");
                    if tries >= 3 || self.shutting_down() {
                        break Err(SubmitError::NotStored);
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        };
        settle(held, result);
        self.publish();
    }

    async fn spool_append(&self, batch: &Batch) -> Result<(), SpoolError> {
        let payload = serde_json::to_vec(batch).map_err(|e| SpoolError::Io {
            path: "<encode>".into(),
            source: std::io::Error::other(e),
        })?;
        let spool = Arc::clone(&self.spool);
        let r = tokio::task::spawn_blocking(move || {
            spool
                .lock()
                .map_err(|_| poisoned())
                .and_then(|mut s| s.append(&payload))
        })
        .await
        .map_err(|e| SpoolError::Io {
            path: "<task>".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
        if r.is_ok() {
            self.spool_full
                .store(false, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }

    /// Replays the oldest spooled batch. True when it was written (or the spool was empty).
    async fn replay_one(&mut self) -> bool {
        if self.replay_cache.is_none() {
            let spool = Arc::clone(&self.spool);
            let peeked = tokio::task::spawn_blocking(move || {
                spool
                    .lock()
                    .map_err(|_| poisoned())
                    .and_then(|mut s| s.peek())
            })
            .await;
            match peeked {
                Ok(Ok(Some(p))) => match serde_json::from_slice::<Batch>(&p.payload) {
                    Ok(b) => self.replay_cache = Some((p, b)),
                    Err(e) => {
                        tracing::error!(error = %e, "spool record does not decode; skipping it");
                        self.metrics.ingest.spool_corrupt_records_total.inc();
                        let _ = self.commit(p).await;
                        return true;
                    }
                },
                Ok(Ok(None)) => return true,
                Ok(Err(e)) => {
                    tracing::error!(error = %e, "spool read failed");
                    return false;
                }
                Err(e) => {
                    tracing::error!(error = %e, "spool read task failed");
                    return false;
                }
            }
        }
        let Some((p, b)) = self.replay_cache.take() else {
            return true;
        };
        if self.timed_write(&b, WriteMode::Replay).await {
            self.store_up = true;
            self.metrics.ingest.spool_replayed_batches_total.inc();
            let ok = self.commit(p).await;
            self.spool_full
                .store(false, std::sync::atomic::Ordering::Relaxed);
            self.publish();
            ok
        } else {
            self.store_up = false;
            self.replay_cache = Some((p, b));
            self.publish();
            false
        }
    }

    async fn commit(&self, p: super::spool::Peeked) -> bool {
        let spool = Arc::clone(&self.spool);
        match tokio::task::spawn_blocking(move || {
            spool
                .lock()
                .map_err(|_| poisoned())
                .and_then(|mut s| s.commit(&p))
        })
        .await
        {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "spool commit failed");
                false
            }
            Err(e) => {
                tracing::error!(error = %e, "spool commit task failed");
                false
            }
        }
    }
}

fn poisoned() -> SpoolError {
    SpoolError::Io {
        path: "<spool>".into(),
        source: std::io::Error::other("spool mutex poisoned"),
    }
}

fn take(pending: &mut Batch, held: &mut Vec<Held>, mut item: Item) {
    pending.append(&mut item.batch);
    held.push(Held {
        _permit: item.permit,
        done: item.done,
    });
}

async fn sleep_until_opt(d: Option<tokio::time::Instant>) {
    match d {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
