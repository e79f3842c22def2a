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
//! - With ClickHouse and `ingest.clickhouse_ack = "spool"` (the default) the writer below is
//!   replaced by the WAL writer and spool shipper of `shipper.rs`: a group is acknowledged once
//!   it is in the fsync'ed spool and shipped to ClickHouse behind the acknowledgement, merged,
//!   exactly once. What follows is the writer of SQLite (and of ClickHouse with `insert`).
//! - A request is *acknowledged* only once its rows are durable: committed to the store
//!   (SQLite with `synchronous=FULL`, or an insert ClickHouse answered), or appended to the
//!   fsync'ed spool. [`Pipeline::submit_reserved`] waits for that. The writer commits in
//!   groups: it takes everything queued (≤ `batch_max_rows`, waiting at most
//!   `batch_max_delay` for more) and writes it as one batch, so concurrent requests share one
//!   commit (one fsync) and batches grow with the load. Pipelined: each group commits in its
//!   own task, which answers its requests when the store returns, while the writer gathers the
//!   next group and starts it as soon as one of the store's
//!   [`Store::write_concurrency`] slots is free (SQLite 1, ClickHouse 2). A group whose write
//!   fails comes back to the writer and goes to the spool.
//! - A handler that cannot get memory permits within `backpressure_wait` answers 503 with
//!   `Retry-After`, and so does one that finds the spool full. Memory is therefore bounded by
//!   `max_inflight_bytes`.
//! - Exactly once: a batch carries an id; the store records it in the same write as its rows
//!   (SQLite: the `batches` table in the same transaction; ClickHouse: `batch_id` + `seq` per
//!   row, checked before a replay), so a spool record replayed after a crash between the store
//!   write and the spool commit is stored once.
//! - While the spool holds anything, new batches go behind it (with one write slot the store
//!   sees batches in acceptance order; with two, the two in flight may land in either order).
//! - When the spool is full and the store is down, the group in hand is refused (503
//!   `spool_full` + `Retry-After` to each of its requests: none of them was acknowledged, so
//!   dropping it loses nothing acknowledged), and so are new requests until the spool has room.
//! - Shutdown writes what is queued to the store or, failing that, to the spool, and answers
//!   its requests; what neither takes is refused, not acknowledged.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot, watch};

use super::spool::{Spool, SpoolError};
use super::write::{
    Held, Item, Reservation, SubmitError, WriterStatus, poisoned, seal, settle, sleep_until_opt,
    take, timed_store_write,
};
use crate::config::{ClickHouseAck, IngestConfig, SpoolConfig};
use crate::metrics::Metrics;
use crate::store::{Batch, Store, WriteMode};

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
        // The store tags its inserts with the spool's id, stable across restarts, so a replay
        // can wait for inserts a predecessor left running; half the write timeout for that
        // wait leaves the other half to the check and the insert.
        store.set_writer(sp.writer_id(), write_timeout / 2);
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
        let pipeline = Pipeline {
            tx,
            permits,
            max_permits,
            wait: ingest.backpressure_wait,
            retry_after_secs: spool.retry_after_secs,
            spool_full: Arc::clone(&spool_full),
            metrics: metrics.clone(),
        };
        if ingest.clickhouse_ack == ClickHouseAck::Spool && store.backend() == "clickhouse" {
            let handle = start_wal(
                store,
                sp,
                ingest,
                spool,
                write_timeout,
                &metrics,
                spool_full,
                status_tx,
                rx,
                shutdown,
            );
            return Ok((pipeline, PipelineTask { handle }, status_rx));
        }
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
            status: status_tx,
            store_up: true,
            replay_cache: None,
            shutdown: shutdown.clone(),
        };
        let handle = tokio::spawn(writer.run(shutdown));
        Ok((pipeline, PipelineTask { handle }, status_rx))
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
        Ok(Reservation::new(
            permit,
            self.metrics.ingest.inflight_bytes.clone(),
        ))
    }

    /// Tops `held` (memory a request's body already took) up to `need` bytes; a request
    /// that holds more keeps it.
    ///
    /// # Errors
    /// As [`Pipeline::reserve`].
    pub async fn top_up(
        &self,
        held: Option<Reservation>,
        need: usize,
    ) -> Result<Reservation, SubmitError> {
        match held {
            Some(mut r) => {
                if need > r.bytes() {
                    r.merge(self.reserve(need - r.bytes()).await?);
                }
                Ok(r)
            }
            None => self.reserve(need).await,
        }
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
                permit: r,
                done,
            })
            .map_err(|_| SubmitError::Closed)?;
        durable.await.unwrap_or(Err(SubmitError::NotStored))
    }
}

/// ClickHouse acknowledged from the spool (`ingest.clickhouse_ack = "spool"`): the WAL writer
/// appends and answers, the shipper drains the spool into the store (`shipper.rs`).
#[allow(clippy::too_many_arguments)]
fn start_wal(
    store: Arc<dyn Store>,
    sp: Spool,
    ingest: &IngestConfig,
    spool: &SpoolConfig,
    write_timeout: Duration,
    metrics: &Metrics,
    spool_full: Arc<std::sync::atomic::AtomicBool>,
    status: watch::Sender<WriterStatus>,
    rx: mpsc::UnboundedReceiver<Item>,
    shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    use super::shipper::{Shared, Shipper, WalWriter};
    let backlog_start = sp.cursor();
    let backlog_end = sp.end();
    let shared = Arc::new(Shared {
        spool_bytes: std::sync::atomic::AtomicU64::new(sp.pending_bytes()),
        spool: Arc::new(Mutex::new(sp)),
        metrics: metrics.clone(),
        status,
        store_up: std::sync::atomic::AtomicBool::new(true),
        spool_full,
        cached: std::sync::atomic::AtomicUsize::new(0),
        cache_limit: ingest.max_inflight_bytes / 4,
    });
    let (to_shipper, from_writer) = mpsc::unbounded_channel();
    let writer = WalWriter {
        shared: Arc::clone(&shared),
        rx,
        to_shipper,
        max_rows: ingest.batch_max_rows.get(),
        max_delay: ingest.batch_max_delay,
        retry_after_secs: spool.retry_after_secs,
    };
    let shipper = Shipper {
        shared,
        store,
        rx: from_writer,
        max_rows: ingest.batch_max_rows.get(),
        write_timeout,
        backlog_end,
        next_disk: backlog_start,
    };
    let w = tokio::spawn(writer.run(shutdown.clone()));
    let s = tokio::spawn(shipper.run(shutdown));
    tokio::spawn(async move {
        if let Err(e) = w.await {
            tracing::error!(error = %e, "ingest WAL writer task failed");
        }
        if let Err(e) = s.await {
            tracing::error!(error = %e, "spool shipper task failed");
        }
    })
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
    status: watch::Sender<WriterStatus>,
    store_up: bool,
    shutdown: watch::Receiver<bool>,
    /// The record at the spool's cursor, decoded, so a failed replay does not re-read it.
    replay_cache: Option<(super::spool::Peeked, Arc<Batch>)>,
}

/// A group whose store write failed (or timed out), handed back to the writer to spool.
struct Failed {
    batch: Arc<Batch>,
    held: Vec<Held>,
}

/// Writes a group to the store and, when the store took it, answers its requests at once.
/// Runs as its own task, so the writer keeps gathering the next group meanwhile (and, where
/// the store allows more than one write at a time, starts it).
async fn commit_group(
    store: Arc<dyn Store>,
    batch: Arc<Batch>,
    mut held: Vec<Held>,
    write_timeout: Duration,
    metrics: Metrics,
) -> Option<Failed> {
    if timed_write(&*store, &batch, WriteMode::Fresh, write_timeout, &metrics).await {
        settle(&mut held, Ok(()));
        None
    } else {
        Some(Failed { batch, held })
    }
}

async fn timed_write(
    store: &dyn Store,
    batch: &Arc<Batch>,
    mode: WriteMode,
    write_timeout: Duration,
    metrics: &Metrics,
) -> bool {
    timed_store_write(
        store.write_shared(Arc::clone(batch), mode),
        store.backend(),
        batch.num_rows(),
        "spooling",
        write_timeout,
        metrics,
    )
    .await
}

impl Writer {
    async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        use futures::StreamExt;
        let mut pending = Batch::default();
        let mut held: Vec<Held> = Vec::new();
        let mut deadline: Option<tokio::time::Instant> = None;
        let mut due = false;
        let mut retry_at = tokio::time::Instant::now();
        let mut backoff = Duration::from_millis(200);
        let depth = self.store.write_concurrency().max(1);
        let mut inflight = futures::stream::FuturesUnordered::new();
        loop {
            // Start the group in hand when it is due and a write slot is free: at once with
            // `batch_max_delay` 0, else when full or its delay ran out. While the store is down
            // or the spool holds anything it goes to the spool instead (in line).
            if !pending.is_empty()
                && (due || self.max_delay.is_zero() || pending.num_rows() >= self.max_rows)
            {
                if self.spool_is_empty() && self.store_up {
                    if inflight.len() < depth {
                        let mut batch = std::mem::take(&mut pending);
                        batch.id = crate::store::new_batch_id();
                        inflight.push(tokio::spawn(commit_group(
                            Arc::clone(&self.store),
                            Arc::new(batch),
                            std::mem::take(&mut held),
                            self.write_timeout,
                            self.metrics.clone(),
                        )));
                        deadline = None;
                        due = false;
                    }
                } else if inflight.is_empty() {
                    self.flush(&mut pending, &mut held).await;
                    deadline = None;
                    due = false;
                }
            }
            let spool_waiting = !self.spool_is_empty();
            let can_replay = spool_waiting && tokio::time::Instant::now() >= retry_at;
            let room = pending.num_rows() < self.max_rows;
            // Unbiased on purpose: under sustained load `recv` is always ready, and replay
            // must still get its turns or the spool would never drain.
            tokio::select! {
                _ = shutdown.changed() => {
                    if *shutdown.borrow() {
                        break;
                    }
                }
                msg = self.rx.recv(), if room => {
                    let Some(item) = msg else { break };
                    take(&mut pending, &mut held, item);
                    // Group commit: everything already queued joins this group.
                    while pending.num_rows() < self.max_rows {
                        match self.rx.try_recv() {
                            Ok(item) => take(&mut pending, &mut held, item),
                            Err(_) => break,
                        }
                    }
                    if deadline.is_none() && !self.max_delay.is_zero() {
                        deadline = Some(tokio::time::Instant::now() + self.max_delay);
                    }
                }
                Some(done) = inflight.next(), if !inflight.is_empty() => {
                    self.written(done).await;
                }
                _ = sleep_until_opt(deadline), if !due => {
                    due = true;
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
        // Shutdown: let the writes in flight finish, take what is queued, then write it once
        // to the store or the spool.
        while let Some(done) = inflight.next().await {
            self.written(done).await;
        }
        self.rx.close();
        while let Ok(item) = self.rx.try_recv() {
            take(&mut pending, &mut held, item);
        }
        self.flush(&mut pending, &mut held).await;
        tracing::info!(spool_bytes = self.spool_bytes(), "ingest writer stopped");
    }

    /// A write in flight finished: nothing to do when the store took it (its requests are
    /// answered); else the store is marked down and the group goes to the spool.
    async fn written(&mut self, done: Result<Option<Failed>, tokio::task::JoinError>) {
        match done {
            Ok(None) => {}
            Ok(Some(Failed { batch, mut held })) => {
                self.store_up = false;
                let r = self.spool_group(&batch, held.len()).await;
                settle(&mut held, r);
            }
            Err(e) => {
                // The task panicked or was cancelled: its requests got no answer (their
                // senders were dropped, so each sees NotStored and may retry).
                tracing::error!(error = %e, "ingest commit task failed");
                self.store_up = false;
            }
        }
        self.publish();
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
        let _ = self.status.send(WriterStatus {
            store_up: self.store_up,
            spool_bytes: bytes,
        });
    }

    async fn timed_write(&self, batch: &Arc<Batch>, mode: WriteMode) -> bool {
        timed_write(&*self.store, batch, mode, self.write_timeout, &self.metrics).await
    }

    /// Writes `pending` to the store or the spool and answers its requests.
    async fn flush(&mut self, pending: &mut Batch, held: &mut Vec<Held>) {
        let Some(batch) = seal(pending, held) else {
            return;
        };
        let result = if self.spool_is_empty()
            && self.store_up
            && self.timed_write(&batch, WriteMode::Fresh).await
        {
            Ok(())
        } else {
            self.store_up = false;
            self.spool_group(&batch, held.len()).await
        };
        settle(held, result);
        self.publish();
    }

    /// Appends a group the store did not take to the spool, making room by one replay when it
    /// is full; refuses it (nothing of it was acknowledged) when neither works.
    async fn spool_group(&mut self, batch: &Batch, requests: usize) -> Result<(), SubmitError> {
        let mut delay = Duration::from_millis(100);
        let mut tries = 0;
        loop {
            match self.spool_append(batch).await {
                Ok(()) => return Ok(()),
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
                        self.metrics.reject_n("spool_full", requests as u64);
                        return Err(SubmitError::SpoolFull {
                            retry_after_secs: self.retry_after_secs,
                        });
                    }
                }
                Err(e) => {
                    tries += 1;
                    tracing::error!(error = %e, "spool append failed");
                    if tries >= 3 || self.shutting_down() {
                        return Err(SubmitError::NotStored);
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
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
                    Ok(b) => self.replay_cache = Some((p, Arc::new(b))),
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

/// A pipeline over a SQLite store in a temp dir, with an in-flight budget of `budget` bytes
/// and a backpressure wait of `wait` (unit tests of what takes from the budget).
#[cfg(test)]
pub(crate) fn test_pipeline(
    budget: usize,
    wait: Duration,
) -> (
    Pipeline,
    PipelineTask,
    watch::Sender<bool>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = crate::store::sqlite::SqliteStore::open(&dir.path().join("t.sqlite"))
        .expect("sqlite store");
    let ingest = IngestConfig {
        max_inflight_bytes: budget,
        backpressure_wait: wait,
        ..IngestConfig::default()
    };
    let (stop, stopped) = watch::channel(false);
    let (p, task, _) = Pipeline::start(
        Arc::new(store),
        &dir.path().join("spool"),
        &ingest,
        &SpoolConfig::default(),
        Duration::from_secs(10),
        Metrics::new(),
        stopped,
    )
    .expect("pipeline");
    (p, task, stop, dir)
}

#[cfg(test)]
impl Pipeline {
    /// Bytes of the budget now taken.
    pub(crate) fn taken(&self) -> usize {
        self.max_permits - self.permits.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::store::{
        CountQuery, Doc, FailurePage, FailureQuery, RequestCount, RowCounts, SpanRow, StoreError,
        StoreFuture,
    };

    /// Counts `n` down by one; false (and `n` left at 0) once it is spent.
    fn take_one(n: &AtomicUsize) -> bool {
        n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| f.checked_sub(1))
            .is_ok()
    }

    /// A store whose writes take `delay` (tokio time), fail while `fail` is above 0, and
    /// record what they stored.
    struct Slow {
        delay: Duration,
        concurrency: usize,
        fail: AtomicUsize,
        active: AtomicUsize,
        max_active: AtomicUsize,
        /// (batch id, rows) of each write the store took.
        writes: Mutex<Vec<(u64, usize)>>,
        /// `"clickhouse"` makes the pipeline acknowledge from the spool.
        backend: &'static str,
        /// Merged writes wait for a permit each (`None`: they do not wait).
        gate: Option<tokio::sync::Semaphore>,
        /// This many merged writes store their rows, then fail (the answer was lost).
        lose: AtomicUsize,
        /// (batch id, mode) of each merged write, in call order.
        merged: Mutex<Vec<Vec<(u64, WriteMode)>>>,
        /// Batches written `Fresh` although already stored.
        doubled: AtomicUsize,
        /// What [`Store::set_writer`] was last told.
        writer: Mutex<Option<(String, Duration)>>,
        /// Writes the SLI rows apart ([`Store::splits_sli`]), like ClickHouse.
        split: bool,
        /// (batch id, mode) of each SLI-only write, in call order.
        sli_writes: Mutex<Vec<Vec<(u64, WriteMode)>>>,
        /// This many SLI-only writes fail.
        fail_sli: AtomicUsize,
    }

    impl Slow {
        fn new(delay_ms: u64, concurrency: usize, fail: usize) -> Arc<Slow> {
            Arc::new(Slow::base(delay_ms, concurrency, fail))
        }
        fn base(delay_ms: u64, concurrency: usize, fail: usize) -> Slow {
            Slow {
                delay: Duration::from_millis(delay_ms),
                concurrency,
                fail: AtomicUsize::new(fail),
                active: AtomicUsize::new(0),
                max_active: AtomicUsize::new(0),
                writes: Mutex::new(Vec::new()),
                backend: "slow",
                gate: None,
                lose: AtomicUsize::new(0),
                merged: Mutex::new(Vec::new()),
                doubled: AtomicUsize::new(0),
                writer: Mutex::new(None),
                split: false,
                sli_writes: Mutex::new(Vec::new()),
                fail_sli: AtomicUsize::new(0),
            }
        }
        /// [`Slow::clickhouse_like`] that writes SLI rows apart; its first `fail_sli` SLI-only
        /// writes fail.
        fn clickhouse_split(fail_sli: usize) -> Arc<Slow> {
            let s = Slow {
                backend: "clickhouse",
                split: true,
                fail_sli: AtomicUsize::new(fail_sli),
                ..Slow::base(0, 2, 0)
            };
            Arc::new(s)
        }
        /// A ClickHouse-like store (acknowledged from the spool) whose writes wait for
        /// [`Slow::open_gate`] and whose first `lose` merged writes lose their answer.
        fn clickhouse_like(lose: usize) -> Arc<Slow> {
            Arc::new(Slow {
                backend: "clickhouse",
                gate: Some(tokio::sync::Semaphore::new(0)),
                lose: AtomicUsize::new(lose),
                ..Slow::base(0, 2, 0)
            })
        }
        fn open_gate(&self) {
            if let Some(g) = &self.gate {
                g.add_permits(1 << 20);
            }
        }
        fn writes(&self) -> Vec<(u64, usize)> {
            self.writes.lock().unwrap().clone()
        }
    }

    fn none<T: Send + 'static>() -> StoreFuture<'static, T> {
        Box::pin(async { Err(StoreError::BadQuery("not used in this test".into())) })
    }

    impl Store for Slow {
        fn backend(&self) -> &'static str {
            self.backend
        }
        fn write_merged(&self, batches: Vec<(Arc<Batch>, WriteMode)>) -> StoreFuture<'_, ()> {
            Box::pin(async move {
                if let Some(g) = &self.gate {
                    g.acquire().await.expect("gate").forget();
                }
                self.merged
                    .lock()
                    .unwrap()
                    .push(batches.iter().map(|(b, m)| (b.id, *m)).collect());
                {
                    let mut w = self.writes.lock().unwrap();
                    for (b, mode) in &batches {
                        let there = w.iter().any(|(id, _)| *id == b.id);
                        match (there, mode) {
                            (false, _) => w.push((b.id, b.num_rows())),
                            (true, WriteMode::Fresh) => {
                                self.doubled.fetch_add(1, Ordering::SeqCst);
                            }
                            (true, WriteMode::Replay) => {}
                        }
                    }
                }
                if take_one(&self.lose) {
                    return Err(StoreError::BadQuery("answer lost".into()));
                }
                Ok(())
            })
        }
        fn migrate(&self) -> StoreFuture<'_, ()> {
            Box::pin(async { Ok(()) })
        }
        fn ping(&self) -> StoreFuture<'_, ()> {
            Box::pin(async { Ok(()) })
        }
        fn write_batch<'a>(&'a self, batch: &'a Batch, mode: WriteMode) -> StoreFuture<'a, ()> {
            self.write_shared(Arc::new(batch.clone()), mode)
        }
        fn write_shared(&self, batch: Arc<Batch>, _mode: WriteMode) -> StoreFuture<'_, ()> {
            Box::pin(async move {
                let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
                self.max_active.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(self.delay).await;
                self.active.fetch_sub(1, Ordering::SeqCst);
                if take_one(&self.fail) {
                    return Err(StoreError::BadQuery("down".into()));
                }
                let mut w = self.writes.lock().unwrap();
                if !w.iter().any(|(id, _)| *id == batch.id) {
                    w.push((batch.id, batch.num_rows()));
                }
                Ok(())
            })
        }
        fn write_concurrency(&self) -> usize {
            self.concurrency
        }
        fn splits_sli(&self) -> bool {
            self.split
        }
        fn write_parts(
            &self,
            batches: Vec<(Arc<Batch>, WriteMode)>,
            parts: crate::store::Parts,
        ) -> StoreFuture<'_, ()> {
            if parts != crate::store::Parts::SliOnly {
                return self.write_merged(batches);
            }
            Box::pin(async move {
                self.sli_writes
                    .lock()
                    .unwrap()
                    .push(batches.iter().map(|(b, m)| (b.id, *m)).collect());
                if take_one(&self.fail_sli) {
                    return Err(StoreError::BadQuery("sli insert failed".into()));
                }
                Ok(())
            })
        }
        fn set_writer(&self, writer_id: &str, settle_within: Duration) {
            *self.writer.lock().unwrap() = Some((writer_id.to_string(), settle_within));
        }
        fn trace<'a>(&'a self, _: &'a str) -> StoreFuture<'a, Vec<SpanRow>> {
            none()
        }
        fn failures<'a>(&'a self, _: &'a FailureQuery) -> StoreFuture<'a, FailurePage> {
            none()
        }
        fn request_counts<'a>(&'a self, _: &'a CountQuery) -> StoreFuture<'a, Vec<RequestCount>> {
            none()
        }
        fn sli_buckets(
            &self,
            _: u64,
            _: u64,
            _: u64,
        ) -> StoreFuture<'_, Vec<crate::store::SliBucket>> {
            none()
        }
        fn latest_snapshots(
            &self,
            _: u64,
        ) -> StoreFuture<'_, Vec<brownout_protocol::AgentSnapshot>> {
            none()
        }
        fn put_doc<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
            _: &'a serde_json::Value,
        ) -> StoreFuture<'a, ()> {
            none()
        }
        fn get_doc<'a>(&'a self, _: &'a str, _: &'a str) -> StoreFuture<'a, Option<Doc>> {
            none()
        }
        fn list_docs<'a>(&'a self, _: &'a str, _: u64) -> StoreFuture<'a, Vec<Doc>> {
            none()
        }
        fn drop_before(&self, _: u64) -> StoreFuture<'_, u64> {
            none()
        }
        fn count_rows(&self) -> StoreFuture<'_, RowCounts> {
            none()
        }
    }

    fn start(
        store: Arc<Slow>,
    ) -> (
        Pipeline,
        PipelineTask,
        watch::Sender<bool>,
        tempfile::TempDir,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (p, task, stop) = start_at(
            store,
            &dir.path().join("spool"),
            &SpoolConfig::default(),
            Duration::from_secs(10),
        );
        (p, task, stop, dir)
    }

    /// A pipeline on `store` with its spool in `spool_dir` (default ingest settings).
    fn start_at(
        store: Arc<Slow>,
        spool_dir: &std::path::Path,
        spool: &SpoolConfig,
        write_timeout: Duration,
    ) -> (Pipeline, PipelineTask, watch::Sender<bool>) {
        let (stop, stopped) = watch::channel(false);
        let (p, task, _) = Pipeline::start(
            store,
            spool_dir,
            &IngestConfig::default(),
            spool,
            write_timeout,
            Metrics::new(),
            stopped,
        )
        .unwrap();
        (p, task, stop)
    }

    /// Submits `rows(n)` from a task of its own.
    fn submit_in_task(p: &Pipeline, n: usize) -> tokio::task::JoinHandle<Result<(), SubmitError>> {
        let p = p.clone();
        tokio::spawn(async move { p.submit(rows(n), 100).await })
    }

    fn rows(n: usize) -> Batch {
        Batch {
            snapshots: (0..n)
                .map(|i| brownout_protocol::AgentSnapshot {
                    host: format!("h{i}"),
                    ..Default::default()
                })
                .collect(),
            ..Batch::default()
        }
    }

    /// A batch with `n` snapshot rows and one SLI row.
    fn rows_with_sli(n: usize) -> Batch {
        Batch {
            sli: vec![crate::store::SliRow {
                slo: "chat".into(),
                minute_ms: 60_000,
                counts: crate::store::SliCounts {
                    good: 1,
                    total: 1,
                    ..Default::default()
                },
            }],
            ..rows(n)
        }
    }

    /// With a store that writes SLI rows apart, the SLI rows of many shipped groups go in a
    /// few inserts (at most 16 groups each), every batch's once; the cursor moves past a record
    /// only once its SLI rows are in.
    #[tokio::test]
    async fn sli_rows_of_consecutive_groups_go_in_one_insert_and_hold_the_cursor() {
        let store = Slow::clickhouse_split(0);
        let (p, task, stop, dir) = start(Arc::clone(&store));
        for _ in 0..40 {
            p.submit(rows_with_sli(1), 1000).await.unwrap();
        }
        wait_for(|| {
            store
                .sli_writes
                .lock()
                .unwrap()
                .iter()
                .map(Vec::len)
                .sum::<usize>()
                == 40
        })
        .await;
        let groups = store.merged.lock().unwrap().len();
        let sli = store.sli_writes.lock().unwrap().clone();
        eprintln!("{} SLI inserts for {groups} shipped groups", sli.len());
        let mut ids: Vec<u64> = sli.iter().flatten().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 40, "every batch's SLI rows, once: {sli:?}");
        assert!(
            sli.len() < groups || groups == 1,
            "{} SLI inserts for {groups} shipped groups",
            sli.len()
        );
        stop.send(true).unwrap();
        task.finish().await;
        let s = Spool::open(&dir.path().join("spool"), 1 << 30, 64 << 20).unwrap();
        assert!(
            s.is_empty(),
            "the cursor moved past everything once its SLI rows were in"
        );
    }

    /// A failed SLI insert is retried with the check (it may have landed), and until it lands
    /// the cursor stays before its records: a restart would ship them again, checked.
    #[tokio::test]
    async fn a_failed_sli_insert_is_retried_with_the_check_and_holds_the_cursor() {
        let store = Slow::clickhouse_split(usize::MAX);
        let (p, task, stop, dir) = start(Arc::clone(&store));
        for _ in 0..3 {
            p.submit(rows_with_sli(1), 1000).await.unwrap();
        }
        wait_for(|| store.sli_writes.lock().unwrap().len() >= 2).await;
        assert_eq!(
            store.writes().iter().map(|w| w.1).sum::<usize>(),
            3,
            "the other rows are stored"
        );
        let pending = Spool::open(&dir.path().join("spool"), 1 << 30, 64 << 20)
            .unwrap()
            .pending_bytes();
        assert!(pending > 0, "the cursor waits for the SLI rows");
        store.fail_sli.store(0, Ordering::SeqCst);
        let tried = store.sli_writes.lock().unwrap().len();
        wait_for(|| store.sli_writes.lock().unwrap().len() > tried).await;
        let sli = store.sli_writes.lock().unwrap().clone();
        let first: Vec<u64> = sli[0].iter().map(|(id, _)| *id).collect();
        // Every retry carries the same records, checked.
        for retry in &sli[1..] {
            let ids: Vec<u64> = retry.iter().map(|(id, _)| *id).collect();
            assert_eq!(ids, first, "{sli:?}");
            assert!(
                retry.iter().all(|(_, m)| *m == WriteMode::Replay),
                "{sli:?}"
            );
        }
        assert_eq!(store.doubled.load(Ordering::SeqCst), 0);
        stop.send(true).unwrap();
        task.finish().await;
        let s = Spool::open(&dir.path().join("spool"), 1 << 30, 64 << 20).unwrap();
        assert!(s.is_empty());
    }

    /// The store is told the spool's writer id (the same after a restart on the same spool),
    /// and half the write timeout for a replay's wait, in both acknowledgement modes.
    #[tokio::test]
    async fn the_store_is_named_after_the_spool_and_keeps_the_name_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let spool_dir = dir.path().join("spool");
        let mut seen = Vec::new();
        for store in [Slow::clickhouse_like(0), Slow::new(0, 1, 0)] {
            let (p, task, stop) = start_at(
                Arc::clone(&store),
                &spool_dir,
                &SpoolConfig::default(),
                Duration::from_secs(10),
            );
            let (id, within) = store.writer.lock().unwrap().clone().expect("set_writer");
            assert_eq!(within, Duration::from_secs(5));
            assert_eq!(
                std::fs::read_to_string(spool_dir.join("writer-id"))
                    .unwrap()
                    .trim(),
                id
            );
            seen.push(id);
            stop.send(true).unwrap();
            drop(p);
            task.finish().await;
        }
        assert_eq!(
            seen[0], seen[1],
            "a restart on the same spool keeps the writer id"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn requests_arriving_during_a_commit_share_the_next_one() {
        let store = Slow::new(100, 1, 0);
        let (p, _task, _stop, _dir) = start(Arc::clone(&store));
        let t0 = tokio::time::Instant::now();
        let first = submit_in_task(&p, 3);
        tokio::time::sleep(Duration::from_millis(10)).await; // the first commit is running
        let rest: Vec<_> = (0..10).map(|_| submit_in_task(&p, 2)).collect();
        first.await.unwrap().unwrap();
        assert!(
            t0.elapsed() >= Duration::from_millis(100),
            "acknowledged only after the commit"
        );
        for r in rest {
            r.await.unwrap().unwrap();
        }
        let sizes: Vec<usize> = store.writes().iter().map(|w| w.1).collect();
        assert_eq!(sizes, vec![3, 20], "ten requests, one commit");
        assert_eq!(store.max_active.load(Ordering::SeqCst), 1);
        assert!(t0.elapsed() < Duration::from_millis(250));
        assert_eq!(p.taken(), 0, "memory given back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_that_allows_two_writes_gets_two_in_flight() {
        let store = Slow::new(100, 2, 0);
        let (p, _task, _stop, _dir) = start(Arc::clone(&store));
        let t0 = tokio::time::Instant::now();
        let a = submit_in_task(&p, 1);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let b = submit_in_task(&p, 1);
        a.await.unwrap().unwrap();
        b.await.unwrap().unwrap();
        assert_eq!(store.max_active.load(Ordering::SeqCst), 2);
        assert!(
            t0.elapsed() < Duration::from_millis(150),
            "the second did not wait for the first: {:?}",
            t0.elapsed()
        );
        assert_eq!(store.writes().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_fails_in_flight_is_spooled_and_stored_once() {
        // The first write fails while the second is in flight: the first group goes to the
        // spool (acknowledged from there) and is replayed; every row is stored exactly once.
        let store = Slow::new(100, 2, 1);
        let (p, _task, _stop, _dir) = start(Arc::clone(&store));
        let a = submit_in_task(&p, 4);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let b = submit_in_task(&p, 5);
        a.await.unwrap().unwrap();
        b.await.unwrap().unwrap();
        for _ in 0..100 {
            if store.writes().len() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut sizes: Vec<usize> = store.writes().iter().map(|w| w.1).collect();
        sizes.sort_unstable();
        assert_eq!(sizes, vec![4, 5]);
    }

    async fn wait_for(what: impl Fn() -> bool) {
        for _ in 0..1000 {
            if what() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("condition never held");
    }

    #[tokio::test]
    async fn clickhouse_is_acknowledged_from_the_spool_and_shipped_merged_behind_it() {
        let store = Slow::clickhouse_like(0);
        let (p, task, stop, dir) = start(Arc::clone(&store));
        // The store takes nothing yet: every request is still answered (durable in the spool)
        // and its memory is given back.
        for n in 1..=5 {
            p.submit(rows(n), 1000).await.unwrap();
        }
        assert!(store.writes().is_empty(), "acknowledged before any insert");
        assert_eq!(p.taken(), 0, "memory given back once spooled");
        let spooled = Spool::open(&dir.path().join("spool"), 1 << 30, 64 << 20)
            .unwrap()
            .pending_bytes();
        assert!(spooled > 0, "the acknowledged rows are in the spool");
        store.open_gate();
        wait_for(|| store.writes().iter().map(|w| w.1).sum::<usize>() == 15).await;
        // Five records, at most two inserts in flight: the ones queued behind the first
        // inserts were merged.
        let merged = store.merged.lock().unwrap().clone();
        assert!(merged.len() < 5, "records merged: {merged:?}");
        assert!(merged.iter().flatten().all(|(_, m)| *m == WriteMode::Fresh));
        assert_eq!(store.doubled.load(Ordering::SeqCst), 0);
        stop.send(true).unwrap();
        task.finish().await;
        let s = Spool::open(&dir.path().join("spool"), 1 << 30, 64 << 20).unwrap();
        assert!(s.is_empty(), "the cursor moved past everything shipped");
    }

    #[tokio::test]
    async fn a_merged_insert_whose_answer_was_lost_is_retried_with_the_check_not_doubled() {
        let store = Slow::clickhouse_like(1);
        let (p, _task, _stop, _dir) = start(Arc::clone(&store));
        for n in 1..=4 {
            p.submit(rows(n), 1000).await.unwrap();
        }
        store.open_gate();
        wait_for(|| store.merged.lock().unwrap().len() >= 2).await;
        wait_for(|| store.writes().iter().map(|w| w.1).sum::<usize>() == 10).await;
        let merged = store.merged.lock().unwrap().clone();
        // The retry of the lost insert asks the store to check those batches.
        let lost: Vec<u64> = merged[0].iter().map(|(id, _)| *id).collect();
        let retried: Vec<(u64, WriteMode)> = merged[1..]
            .iter()
            .flatten()
            .filter(|(id, _)| lost.contains(id))
            .copied()
            .collect();
        assert!(!retried.is_empty(), "{merged:?}");
        assert!(
            retried.iter().all(|(_, m)| *m == WriteMode::Replay),
            "{merged:?}"
        );
        assert_eq!(store.doubled.load(Ordering::SeqCst), 0, "{merged:?}");
    }

    #[tokio::test]
    async fn after_a_restart_the_unshipped_records_are_shipped_with_the_check() {
        let dir = tempfile::tempdir().unwrap();
        let spool_dir = dir.path().join("spool");
        // First life: acknowledged, never shipped (the store never answers), then gone.
        let store = Slow::clickhouse_like(0);
        let (p, task, stop) = start_at(
            Arc::clone(&store),
            &spool_dir,
            &SpoolConfig::default(),
            Duration::from_secs(60),
        );
        for n in 1..=3 {
            p.submit(rows(n), 1000).await.unwrap();
        }
        drop(p);
        drop(task); // the tasks are left hanging on the closed gate, as if killed
        drop(stop);
        // Second life on the same spool.
        let store2 = Slow::clickhouse_like(0);
        store2.open_gate();
        let (_p2, _task2, _stop2) = start_at(
            Arc::clone(&store2),
            &spool_dir,
            &SpoolConfig::default(),
            Duration::from_secs(60),
        );
        wait_for(|| store2.writes().iter().map(|w| w.1).sum::<usize>() == 6).await;
        let merged = store2.merged.lock().unwrap().clone();
        assert_eq!(
            merged.len(),
            1,
            "the backlog went as one merged insert: {merged:?}"
        );
        assert!(merged[0].iter().all(|(_, m)| *m == WriteMode::Replay));
    }

    #[tokio::test]
    async fn a_full_spool_refuses_with_spool_full_and_takes_requests_again_once_shipped() {
        let store = Slow::clickhouse_like(0);
        let dir = tempfile::tempdir().unwrap();
        let spool = SpoolConfig {
            max_bytes: 8192,
            segment_bytes: 4096,
            ..SpoolConfig::default()
        };
        let (p, _task, _stop) = start_at(
            Arc::clone(&store),
            &dir.path().join("spool"),
            &spool,
            Duration::from_secs(60),
        );
        // One group larger than the whole spool: refused, nothing acknowledged, and it does not
        // block the next request.
        let err = p.submit(rows(200), 1000).await.unwrap_err();
        assert!(matches!(err, SubmitError::SpoolFull { .. }), "{err}");
        p.submit(rows(1), 1000).await.unwrap();
        // The store takes nothing: the spool fills, then refuses.
        let mut refused = None;
        for _ in 0..200 {
            if let Err(e) = p.submit(rows(5), 1000).await {
                refused = Some(e);
                break;
            }
        }
        assert!(
            matches!(refused, Some(SubmitError::SpoolFull { .. })),
            "{refused:?}"
        );
        assert_eq!(p.taken(), 0, "a refused request gives its memory back");
        // Shipped: room again.
        store.open_gate();
        let mut ok = false;
        for _ in 0..500 {
            if p.submit(rows(1), 1000).await.is_ok() {
                ok = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(ok, "requests are taken again once the shipper made room");
        assert_eq!(store.doubled.load(Ordering::SeqCst), 0);
    }
}
