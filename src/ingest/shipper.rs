//! ClickHouse acknowledged from the spool (`ingest.clickhouse_ack = "spool"`, the default with
//! ClickHouse): the spool is the write-ahead log, and a shipper moves it into ClickHouse behind
//! the acknowledgement.
//!
//! ```text
//! handlers ──submit()──> [memory budget] ──> WAL writer: group = everything queued (≤ batch_max_rows)
//!                                              spool.append (one fsync per group) → answers (200 now)
//!                                              memory given back; (position, batch) ──> shipper
//! shipper: consecutive records from the cursor, ≤ batch_max_rows rows ──> one INSERT per table
//!          (two merged inserts in flight); ok → cursor moves past them (in order; with
//!          ClickHouse once the SLI rows of up to 16 such groups are in, in one insert)
//!          failed / timed out → those records are retried with the replay check
//! ```
//!
//! - **Group commit.** The writer takes everything queued (≤ `batch_max_rows`, waiting up to
//!   `batch_max_delay` for more), appends it as one record with one `fsync`, and answers every
//!   request of the group; meanwhile the next group gathers in the queue. A request's memory
//!   reservation is released as soon as its rows are in the fsync'ed spool.
//! - **Shipping.** The writer hands each appended batch to the shipper in memory (while the
//!   shipper's cache, a quarter of `ingest.max_inflight_bytes` of spool bytes, has room;
//!   otherwise the shipper reads the record back from the spool). The shipper merges
//!   consecutive records into one write ([`Store::write_merged`]: one INSERT per table) and,
//!   when ClickHouse answers, moves the spool's cursor past them.
//! - **SLI rows of several groups in one insert.** With ClickHouse ([`Store::splits_sli`]) a
//!   group's insert leaves out its SLI rows ([`crate::store::Parts::WithoutSli`]); those of
//!   consecutive groups go in one insert ([`crate::store::Parts::SliOnly`]) once 16 groups
//!   wait, 1 s after the first, or 50 ms after the last when no other follows (and at
//!   shutdown). The cursor moves past those records only when that insert lands, so after a
//!   crash they are replayed with the check, and each table keeps exactly one copy. Each SLI
//!   insert writes two parts (`sli_rows` and the summing view's): once a second under a
//!   steady load instead of once per group.
//! - **Exactly once.** Every row carries its batch id and index. A record whose insert may have
//!   landed — the records from the cursor on at startup (the process may have died after the
//!   insert and before the cursor moved), and those of an insert that failed or timed out — is
//!   written in [`WriteMode::Replay`]: one query per table asks which of its rows are there.
//!   Every other record is written [`WriteMode::Fresh`]: the normal path is one INSERT per
//!   table per merged group, no query.
//! - **Backpressure.** The spool is bounded by `spool.max_bytes`: a group that does not fit is
//!   refused (503 `spool_full` + `Retry-After` to each of its requests, nothing of it was
//!   acknowledged), and so are new requests until the shipper has made room.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{mpsc, watch};

use super::spool::{Pos, ReadAt, Spool, SpoolError};
use super::write::{
    Held, Item, SubmitError, WriterStatus, poisoned, seal, settle, sleep_until_opt, take,
    timed_store_write,
};
use crate::metrics::Metrics;
use crate::store::{Batch, Parts, Store, WriteMode};

/// At most this many spool records in one merged insert (bounds the replay check's id list).
const MAX_MERGE_RECORDS: usize = 1000;
/// Merged inserts in flight at once: one is serialized and sent while ClickHouse writes the
/// other's parts.
const SHIP_DEPTH: usize = 2;
/// With a store that writes SLI rows apart ([`Store::splits_sli`]): the SLI rows of at most
/// this many consecutive groups go in one insert…
const SLI_MAX_GROUPS: usize = 16;
/// …written at most this long after the first of them was shipped, or this long after the
/// last one when no other group follows. The cursor moves past those records only once their
/// SLI rows are in.
const SLI_MAX_WAIT: Duration = Duration::from_secs(1);
const SLI_IDLE: Duration = Duration::from_millis(50);

/// What the writer and the shipper share.
pub(super) struct Shared {
    pub spool: Arc<Mutex<Spool>>,
    pub metrics: Metrics,
    pub status: watch::Sender<WriterStatus>,
    pub store_up: AtomicBool,
    pub spool_full: Arc<AtomicBool>,
    /// The spool's pending bytes, mirrored after each append and commit (read without the
    /// lock, which an fsync may be holding).
    pub spool_bytes: AtomicU64,
    /// Spool bytes of the batches handed to the shipper in memory and not yet shipped.
    pub cached: AtomicUsize,
    pub cache_limit: usize,
}

impl Shared {
    fn publish(&self) {
        let bytes = self.spool_bytes.load(Ordering::Relaxed);
        self.metrics
            .ingest
            .spool_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        let _ = self.status.send(WriterStatus {
            store_up: self.store_up.load(Ordering::Relaxed),
            spool_bytes: bytes,
        });
    }

    /// Runs `f` on the spool in a blocking thread (appends and commits fsync), then mirrors
    /// its pending bytes.
    async fn with_spool<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Spool) -> Result<T, SpoolError> + Send + 'static,
    ) -> Result<T, SpoolError> {
        let me = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let mut s = me.spool.lock().map_err(|_| poisoned())?;
            let r = f(&mut s);
            me.spool_bytes.store(s.pending_bytes(), Ordering::Relaxed);
            r
        })
        .await
        .map_err(|e| SpoolError::Io {
            path: "<task>".into(),
            source: std::io::Error::other(e.to_string()),
        })?
    }
}

/// A record the writer appended, announced to the shipper in append order.
pub(super) struct Appended {
    start: Pos,
    end: Pos,
    /// The batch and the spool bytes it is charged to the cache, while the cache has room;
    /// `None`: the shipper reads it back from the spool.
    batch: Option<(Arc<Batch>, usize)>,
}

/// Appends groups to the spool and acknowledges them.
pub(super) struct WalWriter {
    pub shared: Arc<Shared>,
    pub rx: mpsc::UnboundedReceiver<Item>,
    pub to_shipper: mpsc::UnboundedSender<Appended>,
    pub max_rows: usize,
    pub max_delay: Duration,
    pub retry_after_secs: u32,
}

impl WalWriter {
    pub(super) async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut pending = Batch::default();
        let mut held: Vec<Held> = Vec::new();
        let mut watching = true;
        loop {
            tokio::select! {
                r = shutdown.changed(), if watching => {
                    watching = r.is_ok();
                    if *shutdown.borrow() {
                        break;
                    }
                    continue;
                }
                msg = self.rx.recv() => {
                    let Some(item) = msg else { break };
                    take(&mut pending, &mut held, item);
                }
            }
            self.gather(&mut pending, &mut held).await;
            self.append_group(&mut pending, &mut held).await;
        }
        // Shutdown: what is queued goes to the spool (durable) and is answered.
        self.rx.close();
        while let Ok(item) = self.rx.try_recv() {
            take(&mut pending, &mut held, item);
        }
        self.append_group(&mut pending, &mut held).await;
    }

    /// Group commit: everything queued joins the group (and, with `batch_max_delay`, what
    /// arrives within it), up to `batch_max_rows`.
    async fn gather(&mut self, pending: &mut Batch, held: &mut Vec<Held>) {
        while pending.num_rows() < self.max_rows {
            match self.rx.try_recv() {
                Ok(item) => take(pending, held, item),
                Err(_) => break,
            }
        }
        if self.max_delay.is_zero() {
            return;
        }
        let deadline = tokio::time::Instant::now() + self.max_delay;
        while pending.num_rows() < self.max_rows {
            tokio::select! {
                msg = self.rx.recv() => match msg {
                    Some(item) => take(pending, held, item),
                    None => break,
                },
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
    }

    /// Appends the group as one record (one fsync) and answers its requests: `Ok` once it is
    /// durable, `SpoolFull` when it does not fit, `NotStored` when the disk failed.
    async fn append_group(&mut self, pending: &mut Batch, held: &mut Vec<Held>) {
        let Some(batch) = seal(pending, held) else {
            return;
        };
        let mut tries = 0;
        let mut delay = Duration::from_millis(100);
        // Encoded outside the spool's lock (the shipper commits meanwhile).
        let b = Arc::clone(&batch);
        let payload = match tokio::task::spawn_blocking(move || serde_json::to_vec(&*b)).await {
            Ok(Ok(p)) => Arc::new(p),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot encode a batch for the spool");
                settle(held, Err(SubmitError::NotStored));
                return;
            }
            Err(e) => {
                tracing::error!(error = %e, "spool encode task failed");
                settle(held, Err(SubmitError::NotStored));
                return;
            }
        };
        let appended = loop {
            let p = Arc::clone(&payload);
            let r = self
                .shared
                .with_spool(move |s| {
                    let (start, end) = s.append_pos(&p)?;
                    Ok((start, end, p.len()))
                })
                .await;
            match r {
                Ok(a) => break Ok(a),
                Err(SpoolError::Full { used, max, need }) => {
                    // New requests are refused until the shipper makes room; with nothing to
                    // ship (a group larger than the whole spool) only this group is.
                    if used > 0 {
                        self.shared.spool_full.store(true, Ordering::Relaxed);
                    }
                    tracing::warn!(
                        used,
                        max,
                        need,
                        rows = batch.num_rows(),
                        "spool full (the shipper is behind or ClickHouse is down): refusing these rows (503 spool_full)"
                    );
                    self.shared
                        .metrics
                        .reject_n("spool_full", held.len() as u64);
                    break Err(SubmitError::SpoolFull {
                        retry_after_secs: self.retry_after_secs,
                    });
                }
                Err(e) => {
                    tries += 1;
                    tracing::error!(error = %e, "spool append failed");
                    if tries >= 3 {
                        break Err(SubmitError::NotStored);
                    }
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
            }
        };
        match appended {
            Ok((start, end, len)) => {
                // Durable: answer every request of the group; their memory goes back now.
                settle(held, Ok(()));
                let before = self.shared.cached.fetch_add(len, Ordering::Relaxed);
                let batch = if before + len <= self.shared.cache_limit {
                    Some((batch, len))
                } else {
                    self.shared.cached.fetch_sub(len, Ordering::Relaxed);
                    None
                };
                let _ = self.to_shipper.send(Appended { start, end, batch });
            }
            Err(e) => settle(held, Err(e)),
        }
        self.shared.publish();
    }
}

/// A record waiting to be shipped.
struct Ready {
    end: Pos,
    /// Empty for skipped (corrupt) spool bytes: nothing to write, the cursor still moves.
    batch: Arc<Batch>,
    mode: WriteMode,
    /// Bytes charged to the cache (0 when read back from the spool).
    cached: usize,
}

/// Drains the spool into the store, merged, in order, exactly once.
pub(super) struct Shipper {
    pub shared: Arc<Shared>,
    pub store: Arc<dyn Store>,
    pub rx: mpsc::UnboundedReceiver<Appended>,
    pub max_rows: usize,
    pub write_timeout: Duration,
    /// Records from the cursor up to here were in the spool when it was opened: they are read
    /// from disk and checked (their insert may have landed before a crash).
    pub backlog_end: Pos,
    pub next_disk: Pos,
}

type Flight = tokio::task::JoinHandle<bool>;

impl Shipper {
    pub(super) async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut queue: VecDeque<Ready> = VecDeque::new();
        // Records at the front of `queue` that are in an insert now, and the inserts (in order,
        // each with how many records it holds).
        let mut sent = 0usize;
        let mut flights: futures::stream::FuturesOrdered<_> =
            futures::stream::FuturesOrdered::new();
        let mut backoff = Duration::from_millis(200);
        let mut retry_at: Option<tokio::time::Instant> = None;
        let mut closed = false;
        let mut watching = true;
        // Shipped records whose SLI rows wait for one insert with those of the next groups
        // (only when the store splits them); the cursor stays before them until it lands.
        let split = self.store.splits_sli();
        let mut sli = SliWait::default();
        loop {
            if *shutdown.borrow() {
                break;
            }
            if let Err(e) = self.fill(&mut queue, sent, &mut closed).await {
                tracing::error!(error = %e, "spool read failed; retrying");
                retry_at = Some(tokio::time::Instant::now() + Duration::from_secs(1));
            }
            // Start merged inserts while a slot is free and records wait.
            let ready = retry_at.is_none_or(|t| tokio::time::Instant::now() >= t);
            if ready {
                retry_at = None;
            }
            // The SLI rows of the shipped groups: when enough wait, when the first has waited
            // long enough, or when no group was shipped for a moment.
            if ready && sli.due() {
                let records = std::mem::take(&mut sli.records);
                if self.ship_sli(&records).await {
                    self.commit(records).await;
                    sli = SliWait::default();
                } else {
                    // They may have landed: checked when written again, after a pause that
                    // also holds back new groups (the cursor cannot pass these records).
                    sli.records = records;
                    for r in &mut sli.records {
                        r.mode = WriteMode::Replay;
                    }
                    self.shared.store_up.store(false, Ordering::Relaxed);
                    self.shared.publish();
                    retry_at = Some(tokio::time::Instant::now() + backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    continue;
                }
            }
            while ready && flights.len() < SHIP_DEPTH && sent < queue.len() {
                let n = self.take_group(&queue, sent);
                let group: Vec<(Arc<Batch>, WriteMode)> = queue
                    .iter()
                    .skip(sent)
                    .take(n)
                    .filter(|r| !r.batch.is_empty())
                    .map(|r| (Arc::clone(&r.batch), r.mode))
                    .collect();
                sent += n;
                let flight: Flight = tokio::spawn(ship(
                    Arc::clone(&self.store),
                    group,
                    if split { Parts::WithoutSli } else { Parts::All },
                    self.write_timeout,
                    self.shared.metrics.clone(),
                ));
                flights.push_back(async move { (n, flight.await.unwrap_or(false)) });
            }
            if closed && queue.is_empty() && flights.is_empty() && sli.records.is_empty() {
                break;
            }
            tokio::select! {
                r = shutdown.changed(), if watching => watching = r.is_ok(),
                Some((n, ok)) = flights.next(), if !flights.is_empty() => {
                    if ok {
                        let done = self.drain(&mut queue, n);
                        sent -= n;
                        backoff = Duration::from_millis(200);
                        if split {
                            sli.push(self.keep_sli(done));
                        } else {
                            self.commit(done).await;
                        }
                    } else {
                        // Its rows may be partly stored, and so may those of the inserts
                        // behind it: all are retried with the check, after a pause.
                        while let Some((m, _)) = flights.next().await {
                            let _ = m;
                        }
                        for r in queue.iter_mut().take(sent) {
                            r.mode = WriteMode::Replay;
                        }
                        sent = 0;
                        self.shared.store_up.store(false, Ordering::Relaxed);
                        self.shared.publish();
                        retry_at = Some(tokio::time::Instant::now() + backoff);
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
                msg = self.rx.recv(), if !closed && queue.len() == sent && self.backlog_done() => {
                    match msg {
                        Some(a) => {
                            if let Err(e) = self.accept(&mut queue, a).await {
                                tracing::error!(error = %e, "spool read failed");
                            }
                        }
                        None => closed = true,
                    }
                }
                () = sleep_until_opt(retry_at) => {}
                () = sleep_until_opt(sli.deadline()), if retry_at.is_none() => {}
            }
        }
        // Shutdown: the inserts in flight finish (each within the write timeout) and move the
        // cursor; what is not shipped stays in the spool for the next start (checked then).
        let mut gap = false;
        while let Some((n, ok)) = flights.next().await {
            if ok && !gap {
                let done = self.drain(&mut queue, n);
                if split {
                    sli.push(self.keep_sli(done));
                } else {
                    self.commit(done).await;
                }
            } else {
                gap = true;
            }
        }
        if !sli.records.is_empty() {
            let records = std::mem::take(&mut sli.records);
            if self.ship_sli(&records).await {
                self.commit(records).await;
            }
        }
        tracing::info!(
            spool_bytes = self.shared.spool_bytes.load(Ordering::Relaxed),
            "spool shipper stopped"
        );
    }

    fn backlog_done(&self) -> bool {
        self.next_disk >= self.backlog_end
    }

    /// How many records from `from` the next merged insert takes: at least one, then while the
    /// rows stay within `batch_max_rows`.
    fn take_group(&self, queue: &VecDeque<Ready>, from: usize) -> usize {
        let mut rows = 0;
        let mut n = 0;
        for r in queue.iter().skip(from) {
            let more = r.batch.num_rows();
            if n > 0 && (rows + more > self.max_rows || n >= MAX_MERGE_RECORDS) {
                break;
            }
            rows += more;
            n += 1;
        }
        n
    }

    /// Queues records until `batch_max_rows` rows wait beyond the inserts in flight: first the
    /// backlog found at startup (from disk), then what the writer announced.
    async fn fill(
        &mut self,
        queue: &mut VecDeque<Ready>,
        sent: usize,
        closed: &mut bool,
    ) -> Result<(), SpoolError> {
        let waiting = |q: &VecDeque<Ready>| -> (usize, usize) {
            let rows = q.iter().skip(sent).map(|r| r.batch.num_rows()).sum();
            (rows, q.len() - sent)
        };
        loop {
            let (rows, n) = waiting(queue);
            if rows >= self.max_rows * SHIP_DEPTH || n >= MAX_MERGE_RECORDS * SHIP_DEPTH {
                return Ok(());
            }
            if !self.backlog_done() {
                let at = self.next_disk;
                match self.shared.with_spool(move |s| s.read_at(at)).await? {
                    ReadAt::Record(p) => {
                        let end = Pos {
                            segment: p.segment,
                            offset: p.end,
                        };
                        self.next_disk = end;
                        queue.push_back(self.decode(&p.payload, end, WriteMode::Replay));
                    }
                    ReadAt::Corrupt { next } => {
                        self.corrupt();
                        self.next_disk = next;
                        queue.push_back(Ready {
                            end: next,
                            batch: Arc::new(Batch::default()),
                            mode: WriteMode::Replay,
                            cached: 0,
                        });
                    }
                    ReadAt::End => self.next_disk = self.backlog_end,
                }
                continue;
            }
            match self.rx.try_recv() {
                Ok(a) => self.accept(queue, a).await?,
                Err(mpsc::error::TryRecvError::Empty) => return Ok(()),
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    *closed = true;
                    return Ok(());
                }
            }
        }
    }

    /// Queues a record the writer announced (never tried before: `Fresh`).
    async fn accept(&mut self, queue: &mut VecDeque<Ready>, a: Appended) -> Result<(), SpoolError> {
        match a.batch {
            Some((batch, cached)) => queue.push_back(Ready {
                end: a.end,
                batch,
                mode: WriteMode::Fresh,
                cached,
            }),
            None => {
                let at = a.start;
                let r = match self.shared.with_spool(move |s| s.read_at(at)).await? {
                    ReadAt::Record(p) => self.decode(&p.payload, a.end, WriteMode::Fresh),
                    ReadAt::Corrupt { .. } | ReadAt::End => {
                        self.corrupt();
                        Ready {
                            end: a.end,
                            batch: Arc::new(Batch::default()),
                            mode: WriteMode::Fresh,
                            cached: 0,
                        }
                    }
                };
                queue.push_back(r);
            }
        }
        Ok(())
    }

    fn decode(&self, payload: &[u8], end: Pos, mode: WriteMode) -> Ready {
        let batch = match serde_json::from_slice::<Batch>(payload) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, "spool record does not decode; skipping it");
                self.corrupt();
                Batch::default()
            }
        };
        Ready {
            end,
            batch: Arc::new(batch),
            mode,
            cached: 0,
        }
    }

    fn corrupt(&self) {
        self.shared.metrics.ingest.spool_corrupt_records_total.inc();
    }

    /// One insert of these shipped records' SLI rows; true when the store took it.
    async fn ship_sli(&self, records: &[Ready]) -> bool {
        let group: Vec<(Arc<Batch>, WriteMode)> = records
            .iter()
            .filter(|r| !r.batch.sli.is_empty())
            .map(|r| (Arc::clone(&r.batch), r.mode))
            .collect();
        ship(
            Arc::clone(&self.store),
            group,
            Parts::SliOnly,
            self.write_timeout,
            self.shared.metrics.clone(),
        )
        .await
    }

    /// The first `n` records were shipped: out of the queue.
    fn drain(&self, queue: &mut VecDeque<Ready>, n: usize) -> Vec<Ready> {
        queue.drain(..n).collect()
    }

    /// Shipped records whose SLI rows are still to be written: only those rows are kept (and
    /// the batches' bytes go back to the cache now, so the writer keeps handing batches over in
    /// memory while they wait).
    fn keep_sli(&self, done: Vec<Ready>) -> Vec<Ready> {
        let freed: usize = done.iter().map(|r| r.cached).sum();
        self.shared.cached.fetch_sub(freed, Ordering::Relaxed);
        done.into_iter()
            .map(|r| Ready {
                end: r.end,
                batch: Arc::new(Batch {
                    id: r.batch.id,
                    sli: r.batch.sli.clone(),
                    ..Batch::default()
                }),
                mode: r.mode,
                cached: 0,
            })
            .collect()
    }

    /// These records (the oldest not yet committed, in order) are stored: move the cursor past
    /// them and forget them.
    async fn commit(&self, records: Vec<Ready>) {
        let n = records.len();
        let mut end = None;
        let mut freed = 0;
        for r in records {
            end = Some(r.end);
            freed += r.cached;
        }
        self.shared.cached.fetch_sub(freed, Ordering::Relaxed);
        self.shared
            .metrics
            .ingest
            .spool_replayed_batches_total
            .inc_by(n as u64);
        if let Some(end) = end {
            // A failed cursor write only means these records are shipped again, checked,
            // after a restart: the next commit moves past them anyway.
            if let Err(e) = self.shared.with_spool(move |s| s.commit_to(end)).await {
                tracing::error!(error = %e, "spool cursor commit failed");
            }
        }
        self.shared.store_up.store(true, Ordering::Relaxed);
        self.shared.spool_full.store(false, Ordering::Relaxed);
        self.shared.publish();
    }
}

/// Shipped records whose SLI rows are not written yet ([`SLI_MAX_GROUPS`], [`SLI_MAX_WAIT`],
/// [`SLI_IDLE`]).
#[derive(Default)]
struct SliWait {
    records: Vec<Ready>,
    groups: usize,
    /// When the first and the last of these groups were shipped.
    since: Option<(tokio::time::Instant, tokio::time::Instant)>,
}

impl SliWait {
    fn push(&mut self, done: Vec<Ready>) {
        self.records.extend(done);
        self.groups += 1;
        let now = tokio::time::Instant::now();
        self.since = Some(self.since.map_or((now, now), |(first, _)| (first, now)));
    }

    fn deadline(&self) -> Option<tokio::time::Instant> {
        self.since
            .map(|(first, last)| (first + SLI_MAX_WAIT).min(last + SLI_IDLE))
    }

    /// Whether their insert is due now.
    fn due(&self) -> bool {
        !self.records.is_empty()
            && (self.groups >= SLI_MAX_GROUPS
                || self
                    .deadline()
                    .is_some_and(|d| tokio::time::Instant::now() >= d))
    }
}

/// One merged insert of `parts`, with the store's timeout; true when the store took it.
async fn ship(
    store: Arc<dyn Store>,
    group: Vec<(Arc<Batch>, WriteMode)>,
    parts: Parts,
    write_timeout: Duration,
    metrics: Metrics,
) -> bool {
    if group.is_empty() {
        return true;
    }
    let rows: usize = match parts {
        Parts::SliOnly => group.iter().map(|(b, _)| b.sli.len()).sum(),
        _ => group.iter().map(|(b, _)| b.num_rows()).sum(),
    };
    let backend = store.backend();
    timed_store_write(
        store.write_parts(group, parts),
        backend,
        rows,
        "shipping retried with the replay check",
        write_timeout,
        &metrics,
    )
    .await
}
