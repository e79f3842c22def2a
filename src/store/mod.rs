//! Storage: one [`Store`] trait, two real backends.
//!
//! - [`clickhouse::ClickHouseStore`] (when `CLICKHOUSE_URL` is set): the official crate, written
//!   for ClickHouse 18.16 (docs/ARCHITECTURE.md §4): no validation, `.bind()`, `DateTime` + `UInt64`
//!   micros, parallel `Array(String)` attributes, tables partitioned by day, retention by
//!   dropping partitions.
//! - [`sqlite::SqliteStore`] (the embedded default): rusqlite under the data dir, WAL mode, one
//!   writer and one reader connection.
//!
//! Ingest writes whole [`Batch`]es. A batch carries a random id; writing the same batch twice
//! stores it once ([`WriteMode::Replay`] checks what is already there), which is what makes the
//! spool's replay exactly-once. Everything else in the crate reads through the query methods
//! here and keeps its own small state with [`Store::put_doc`] / [`Store::list_docs`].

pub mod clickhouse;
pub mod logs;
pub mod sqlite;

pub use logs::{LogCursor, LogHit, LogPage, LogQuery};

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use brownout_protocol::{AgentSnapshot, FailureEvent};
use serde::{Deserialize, Serialize};

use crate::config::Config;

/// What went wrong talking to a store. Never shown to HTTP clients as-is.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("clickhouse: {0}")]
    ClickHouse(#[from] ::clickhouse::error::Error),
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("store task failed: {0}")]
    Join(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("bad query: {0}")]
    BadQuery(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// A replay check was not run because earlier inserts of this writer were still running
    /// in the store (their rows may not be visible yet); try again later.
    #[error("earlier inserts still running: {0}")]
    Unsettled(String),
}

/// The boxed future every [`Store`] method returns (keeps the trait object-safe).
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 'a>>;

/// A span as stored: one request (or a step of one) in a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpanRow {
    /// 32 lowercase hex digits.
    pub trace_id: String,
    /// 16 lowercase hex digits.
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub service: String,
    pub name: String,
    /// OTLP span kind (0 unspecified, 1 internal, 2 server, 3 client, 4 producer, 5 consumer).
    pub kind: u8,
    pub start_us: u64,
    pub duration_us: u64,
    /// OTLP status code (0 unset, 1 ok, 2 error). Error means a bad request for SLOs.
    pub status: u8,
    pub status_message: String,
    /// `feature` / `brownout.feature` attribute, or empty.
    pub feature: String,
    /// `critical`, `default` or `sheddable`.
    pub criticality: String,
    pub host: String,
    /// True for spans that count as requests in SLOs: roots and server spans.
    pub is_request: bool,
    /// Span then resource attributes, values rendered as strings.
    pub attributes: Vec<(String, String)>,
}

/// Span status codes.
pub const STATUS_ERROR: u8 = 2;

/// An OTLP log record as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogRow {
    pub ts_us: u64,
    pub trace_id: String,
    pub span_id: String,
    pub service: String,
    pub host: String,
    /// OTLP severity number (17–20 ERROR, 21–24 FATAL).
    pub severity_number: u8,
    pub severity_text: String,
    pub body: String,
    pub attributes: Vec<(String, String)>,
}

/// A failure event as stored: the event plus a unique id and the pattern it was tagged with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureRow {
    /// Unique; the tie-breaker for pagination.
    pub id: String,
    /// Pattern id assigned at ingest by the configured tagger, or empty.
    pub pattern: String,
    #[serde(flatten)]
    pub event: FailureEvent,
}

/// A snapshot as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotRow {
    pub snapshot: AgentSnapshot,
}

/// Everything one store write carries. `id` makes writes idempotent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    pub id: u64,
    #[serde(default)]
    pub spans: Vec<SpanRow>,
    #[serde(default)]
    pub logs: Vec<LogRow>,
    #[serde(default)]
    pub failures: Vec<FailureRow>,
    #[serde(default)]
    pub snapshots: Vec<AgentSnapshot>,
    /// The SLI counts of these rows, per SLO and minute ([`SliRow`]), computed at ingest
    /// (docs/SLO.md "Stored SLI buckets"). Written with the rows, in the same exactly-once
    /// write, so an acknowledged event is counted once, also across a crash and a replay.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sli: Vec<SliRow>,
}

/// One SLO's counts in one minute, from one batch: what the store sums into its SLI buckets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliCounts {
    /// Good events of the SLI (latency SLIs: not failed and under the SLO's threshold).
    pub good: u64,
    /// Good + bad events of the SLI (refusals on purpose are not in it).
    pub total: u64,
    /// Requests of the SLO refused on purpose (docs/SLO.md "Deliberate refusals").
    pub refused: u64,
}

impl std::ops::AddAssign for SliCounts {
    fn add_assign(&mut self, o: SliCounts) {
        self.good += o.good;
        self.total += o.total;
        self.refused += o.refused;
    }
}

/// [`SliCounts`] of one SLO (by name) in the minute starting at `minute_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliRow {
    pub slo: String,
    /// Start of the minute, unix ms (a multiple of 60 000).
    pub minute_ms: u64,
    #[serde(flatten)]
    pub counts: SliCounts,
}

/// Adds `counts` to the row of (`slo`, `minute_ms`) in `rows`, or appends one.
pub fn add_sli(rows: &mut Vec<SliRow>, slo: &str, minute_ms: u64, counts: SliCounts) {
    match rows
        .iter_mut()
        .find(|r| r.minute_ms == minute_ms && r.slo == slo)
    {
        Some(r) => r.counts += counts,
        None => rows.push(SliRow {
            slo: slo.to_string(),
            minute_ms,
            counts,
        }),
    }
}

/// Stored SLI counts of one SLO summed over one bucket (a minute, or an hour for old data),
/// as [`Store::sli_buckets`] returns them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SliBucket {
    pub slo: String,
    /// Bucket start, unix ms.
    pub start_ms: u64,
    /// The first minute of the bucket that holds counts (its start, unix ms).
    pub first_ms: u64,
    #[serde(flatten)]
    pub counts: SliCounts,
}

/// How long the stored SLI buckets are kept: the longest SLO period (31 days) plus a margin,
/// whatever the raw rows' retention ([`Store::drop_before`] keeps them at least this long).
pub const SLI_RETENTION_MS: u64 = 35 * 86_400_000;

impl Batch {
    /// A new, empty batch with a fresh random id.
    pub fn new() -> Batch {
        Batch {
            id: new_batch_id(),
            ..Batch::default()
        }
    }
    pub fn num_rows(&self) -> usize {
        self.spans.len() + self.logs.len() + self.failures.len() + self.snapshots.len()
    }
    pub fn is_empty(&self) -> bool {
        self.num_rows() == 0
    }
    /// Moves `other`'s rows into `self`.
    pub fn append(&mut self, other: &mut Batch) {
        self.spans.append(&mut other.spans);
        self.logs.append(&mut other.logs);
        self.failures.append(&mut other.failures);
        self.snapshots.append(&mut other.snapshots);
        // Kept summed per (SLO, minute): a group commit of many requests stores a few rows.
        for r in other.sli.drain(..) {
            add_sli(&mut self.sli, &r.slo, r.minute_ms, r.counts);
        }
    }
}

/// A random, non-zero batch id.
pub fn new_batch_id() -> u64 {
    loop {
        let id = rand::random::<u64>() >> 1; // fits i64 for SQLite
        if id != 0 {
            return id;
        }
    }
}

/// How a batch is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// Never tried before: write without checking.
    Fresh,
    /// May already be (partly) stored: write only what is missing.
    Replay,
}

/// Filters for [`Store::failures`]. Newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FailureQuery {
    /// Inclusive, unix ms.
    pub since_ms: u64,
    /// Exclusive, unix ms.
    pub until_ms: u64,
    pub service: Option<String>,
    pub category: Option<String>,
    pub feature: Option<String>,
    pub criticality: Option<String>,
    pub pattern: Option<String>,
    /// `Some(false)`: only real failures; `Some(true)`: only deliberate refusals (attribute
    /// `deliberate = "true"`, docs/SLO.md "Deliberate refusals"); `None`: both.
    pub deliberate: Option<bool>,
    /// Page size (1..=10_000).
    pub limit: usize,
    /// Continue after this position (from a previous page).
    pub cursor: Option<FailureCursor>,
}

impl FailureQuery {
    /// The page size, clamped to 1..=10 000.
    pub(crate) fn page_size(&self) -> usize {
        self.limit.clamp(1, 10_000)
    }

    /// What both backends append to their failure query after its time range: the equality
    /// filters, `deliberate`, the cursor's condition (three `?`: its `ts_ms` twice, then its
    /// id), and the newest-first order with `LIMIT page_size + 1`. Returns the filters' values,
    /// to bind in order before the cursor's.
    pub(crate) fn push_conditions(&self, sql: &mut String) -> Vec<String> {
        let values = push_equals(
            sql,
            &[
                ("service", &self.service),
                ("category", &self.category),
                ("feature", &self.feature),
                ("criticality", &self.criticality),
                ("pattern", &self.pattern),
            ],
        );
        if let Some(d) = self.deliberate {
            sql.push_str(if d {
                " AND deliberate = 1"
            } else {
                " AND deliberate = 0"
            });
        }
        if self.cursor.is_some() {
            sql.push_str(" AND (ts_ms < ? OR (ts_ms = ? AND id < ?))");
        }
        sql.push_str(&format!(
            " ORDER BY ts_ms DESC, id DESC LIMIT {}",
            self.page_size() + 1
        ));
        values
    }
}

/// Appends ` AND <column> = ?` to `sql` for each filter that is set; returns their values in
/// that order, to bind.
pub(crate) fn push_equals(sql: &mut String, filters: &[(&str, &Option<String>)]) -> Vec<String> {
    let mut values = Vec::new();
    for (col, v) in filters {
        if let Some(v) = v {
            sql.push_str(&format!(" AND {col} = ?"));
            values.push(v.clone());
        }
    }
    values
}

/// Position in the newest-first order of failures: `(ts_ms, id)` of the last row returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureCursor {
    pub ts_ms: u64,
    pub id: String,
}

impl FailureCursor {
    /// Opaque text form: `<ts_ms>.<hex(id)>`.
    pub fn encode(&self) -> String {
        format!("{}.{}", self.ts_ms, hex::encode(self.id.as_bytes()))
    }
    pub fn decode(s: &str) -> Option<FailureCursor> {
        let (ts, id) = s.split_once('.')?;
        let ts_ms = ts.parse().ok()?;
        let id = String::from_utf8(hex::decode(id).ok()?).ok()?;
        Some(FailureCursor { ts_ms, id })
    }
}

/// One page of failures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FailurePage {
    pub items: Vec<FailureRow>,
    /// Present when more rows may follow.
    pub next_cursor: Option<String>,
}

/// Filters for [`Store::request_counts`].
#[derive(Debug, Clone, PartialEq)]
pub struct CountQuery {
    /// Inclusive, unix ms.
    pub since_ms: u64,
    /// Exclusive, unix ms.
    pub until_ms: u64,
    /// Bucket width (≥ 1000 ms).
    pub bucket_ms: u64,
    pub service: Option<String>,
    /// When set, a request is good only if it did not fail *and* took at most this long.
    pub latency_threshold_ms: Option<u64>,
}

/// Good and total requests (spans with `is_request`) in one bucket for one
/// service/feature/criticality. Requests refused on purpose (span attribute
/// `brownout.deliberate = true`) are in neither `good` nor `total` but in `refused`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestCount {
    /// Bucket start, unix ms.
    pub bucket_ms: u64,
    pub service: String,
    pub feature: String,
    pub criticality: String,
    pub good: u64,
    pub total: u64,
    #[serde(default)]
    pub refused: u64,
}

/// A stored JSON document (pattern templates, degradation decisions, reports…).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Doc {
    pub kind: String,
    pub key: String,
    /// When it was last written, unix ms.
    pub updated_ms: u64,
    pub value: serde_json::Value,
}

/// Row counts, for tests and the benchmark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowCounts {
    pub spans: u64,
    pub logs: u64,
    pub failures: u64,
    pub snapshots: u64,
}

/// Which tables a [`Store::write_parts`] covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parts {
    /// Every table ([`Store::write_merged`]).
    All,
    /// All but the SLI rows ([`Batch::sli`]).
    WithoutSli,
    /// Only the SLI rows.
    SliOnly,
}

/// The storage boundary. Implementations are cheap to share (`Arc<dyn Store>`).
pub trait Store: Send + Sync + 'static {
    /// `"clickhouse"` or `"sqlite"`.
    fn backend(&self) -> &'static str;

    /// Creates tables if needed.
    fn migrate(&self) -> StoreFuture<'_, ()>;

    /// Cheap liveness check.
    fn ping(&self) -> StoreFuture<'_, ()>;

    /// Writes one batch. With [`WriteMode::Replay`] rows of this batch id already stored are
    /// not written again.
    fn write_batch<'a>(&'a self, batch: &'a Batch, mode: WriteMode) -> StoreFuture<'a, ()>;

    /// [`Store::write_batch`] of a shared batch: what the ingest writer calls, so a backend
    /// that hands the batch to a blocking thread (SQLite) needs no copy of it.
    fn write_shared(&self, batch: Arc<Batch>, mode: WriteMode) -> StoreFuture<'_, ()> {
        Box::pin(async move { self.write_batch(&batch, mode).await })
    }

    /// Writes several batches as one write (ClickHouse: one INSERT per table for all of them),
    /// each keeping its own id. Batches in [`WriteMode::Replay`] may be partly stored already
    /// (an earlier write whose answer was lost): only their missing rows are written. The
    /// default writes them one after another.
    fn write_merged(&self, batches: Vec<(Arc<Batch>, WriteMode)>) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            for (b, mode) in batches {
                self.write_shared(b, mode).await?;
            }
            Ok(())
        })
    }

    /// Whether [`Store::write_parts`] writes the SLI rows apart from the rest: then the ingest
    /// shipper writes the other tables of each merged group at once and the SLI rows of
    /// several consecutive groups in one later insert (ClickHouse: one part, and one part of
    /// the summing view, per second instead of per group). The default: no.
    fn splits_sli(&self) -> bool {
        false
    }

    /// [`Store::write_merged`] of some tables only ([`Parts`]). The default (a store that does
    /// not split, [`Store::splits_sli`] false) writes everything with
    /// [`Parts::All`] and [`Parts::WithoutSli`], and nothing with [`Parts::SliOnly`].
    fn write_parts(
        &self,
        batches: Vec<(Arc<Batch>, WriteMode)>,
        parts: Parts,
    ) -> StoreFuture<'_, ()> {
        match parts {
            Parts::SliOnly => Box::pin(async { Ok(()) }),
            Parts::All | Parts::WithoutSli => self.write_merged(batches),
        }
    }

    /// Names the writer of this store's inserts (the spool's [`crate::ingest::spool::Spool::writer_id`],
    /// stable across restarts) and how long a [`WriteMode::Replay`] may wait for this writer's
    /// earlier inserts to finish before its existence check. ClickHouse tags every INSERT with a
    /// `query_id` under this id and, before a replay's check, waits until none it (or a previous
    /// process on the same spool) started earlier is still running; past `settle_within` the
    /// replay fails with [`StoreError::Unsettled`] and is retried. The default does nothing
    /// (SQLite writes a batch and its id in one transaction).
    fn set_writer(&self, _writer_id: &str, _settle_within: std::time::Duration) {}

    /// How many batch writes the ingest writer may have in flight at once. 1 (the default):
    /// one after another, the next group gathering while one commits.
    fn write_concurrency(&self) -> usize {
        1
    }

    /// All spans of one trace, by start time.
    fn trace<'a>(&'a self, trace_id: &'a str) -> StoreFuture<'a, Vec<SpanRow>>;

    /// Failures, newest first, filtered and paginated.
    fn failures<'a>(&'a self, q: &'a FailureQuery) -> StoreFuture<'a, FailurePage>;

    /// OTLP log records, newest first, filtered and paginated ([`logs`]). Both backends
    /// implement it; the default (for test doubles) refuses.
    fn logs<'a>(&'a self, _q: &'a LogQuery) -> StoreFuture<'a, LogPage> {
        Box::pin(async {
            Err(StoreError::BadQuery(
                "this store cannot search log records".into(),
            ))
        })
    }

    /// Good/total request counts per bucket, service, feature and criticality (SLIs).
    fn request_counts<'a>(&'a self, q: &'a CountQuery) -> StoreFuture<'a, Vec<RequestCount>>;

    /// The latest snapshot of each host seen at or after `since_ms`, by host name.
    fn latest_snapshots(&self, since_ms: u64) -> StoreFuture<'_, Vec<AgentSnapshot>>;

    /// Creates or replaces a document.
    fn put_doc<'a>(
        &'a self,
        kind: &'a str,
        key: &'a str,
        value: &'a serde_json::Value,
    ) -> StoreFuture<'a, ()>;

    /// One document, if present.
    fn get_doc<'a>(&'a self, kind: &'a str, key: &'a str) -> StoreFuture<'a, Option<Doc>>;

    /// Documents of one kind updated at or after `since_ms`, by key.
    fn list_docs<'a>(&'a self, kind: &'a str, since_ms: u64) -> StoreFuture<'a, Vec<Doc>>;

    /// Stored SLI counts ([`Batch::sli`]) of the minutes in `[from_ms, to_ms)`, summed per SLO
    /// and bucket of `bucket_ms` (a multiple of 60 000: minutes, or hours for old data), in
    /// time order.
    fn sli_buckets(
        &self,
        from_ms: u64,
        to_ms: u64,
        bucket_ms: u64,
    ) -> StoreFuture<'_, Vec<SliBucket>>;

    /// Retention: removes spans, logs, failures and snapshots older than the day holding
    /// `cutoff_ms`, and SLI buckets older than that and than [`SLI_RETENTION_MS`]. Returns how
    /// many partitions (ClickHouse) or rows (SQLite) went.
    fn drop_before(&self, cutoff_ms: u64) -> StoreFuture<'_, u64>;

    /// How many rows each table holds.
    fn count_rows(&self) -> StoreFuture<'_, RowCounts>;
}

/// Opens the store the config asks for (ClickHouse when configured, else SQLite under the data
/// dir) and creates its tables.
///
/// # Errors
/// When SQLite cannot be opened or migrated. ClickHouse being down at start is *not* an
/// error: it is logged, and tables are created on the first write that reaches it.
pub async fn open(config: &Config) -> Result<Arc<dyn Store>, StoreError> {
    match &config.clickhouse {
        Some(ch) => {
            let store = clickhouse::ClickHouseStore::new(ch);
            if let Err(e) = store.migrate().await {
                // Not fatal: ingest spools until ClickHouse answers, and the store creates its
                // tables on the first successful write.
                tracing::warn!(error = %e, url = %ch.url, "ClickHouse is not answering; starting anyway, ingest will spool");
            }
            Ok(Arc::new(store))
        }
        None => {
            std::fs::create_dir_all(&config.data_dir)?;
            let store = sqlite::SqliteStore::open(&config.sqlite_path())?;
            store.migrate().await?;
            Ok(Arc::new(store))
        }
    }
}

/// [`Store::sli_buckets`]' bucket must be a whole number of minutes.
pub(crate) fn check_sli_bucket(bucket_ms: u64) -> Result<(), StoreError> {
    if bucket_ms == 0 || bucket_ms % 60_000 != 0 {
        return Err(StoreError::BadQuery(format!(
            "an SLI bucket must be a whole number of minutes, not {bucket_ms} ms"
        )));
    }
    Ok(())
}

/// Where [`Store::drop_before`] cuts the SLI buckets for a raw-row cutoff: never later than
/// [`SLI_RETENTION_MS`] ago, so the buckets outlive the raw rows.
pub(crate) fn sli_cutoff_ms(raw_cutoff_ms: u64) -> u64 {
    raw_cutoff_ms.min(brownout_protocol::now_ms().saturating_sub(SLI_RETENTION_MS))
}

/// Attributes as a JSON object text (SQLite column): keys sorted, a repeated key keeps its
/// last value. Serialized from borrowed strings (no copy of the attributes).
pub(crate) fn attrs_to_json(attrs: &[(String, String)]) -> String {
    let map: BTreeMap<&str, &str> = attrs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    serde_json::to_string(&map).unwrap_or_else(|_| "{}".to_string())
}

pub(crate) fn attrs_from_json(s: &str) -> Vec<(String, String)> {
    match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(s) {
        Ok(m) => m
            .into_iter()
            .map(|(k, v)| {
                (
                    k,
                    v.as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string()),
                )
            })
            .collect(),
        Err(_) => Vec::new(),
    }
}

pub(crate) fn map_to_pairs(m: &BTreeMap<String, String>) -> (Vec<String>, Vec<String>) {
    (m.keys().cloned().collect(), m.values().cloned().collect())
}

/// The agent snapshots of [`Store::latest_snapshots`] from their stored JSON (both backends
/// keep each as one JSON text).
pub(crate) fn snapshots_from_json(rows: &[String]) -> Result<Vec<AgentSnapshot>, StoreError> {
    rows.iter()
        .map(|j| {
            serde_json::from_str(j).map_err(|e| StoreError::Corrupt(format!("snapshot json: {e}")))
        })
        .collect()
}

/// A [`Doc`] from its stored columns (its version in µs, its JSON text).
pub(crate) fn doc_from_json(
    kind: String,
    key: String,
    version_us: u64,
    json: &str,
) -> Result<Doc, StoreError> {
    Ok(Doc {
        kind,
        key,
        updated_ms: version_us / 1000,
        value: serde_json::from_str(json)
            .map_err(|e| StoreError::Corrupt(format!("doc json: {e}")))?,
    })
}

/// A monotonic microsecond clock for document versions (two writes in one ms still order).
pub(crate) fn doc_version_us() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = u64::try_from(chrono::Utc::now().timestamp_micros()).unwrap_or(0);
    let mut prev = LAST.load(Ordering::Relaxed);
    loop {
        let next = now.max(prev + 1);
        match LAST.compare_exchange_weak(prev, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(p) => prev = p,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips() {
        for id in ["", "a.b", "x-1", "ünï"] {
            let c = FailureCursor {
                ts_ms: 17,
                id: id.into(),
            };
            assert_eq!(FailureCursor::decode(&c.encode()), Some(c));
        }
        for bad in ["", "17", "x.00", "17.zz", "17.ff"] {
            assert_eq!(FailureCursor::decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn attrs_json_is_what_the_value_map_wrote() {
        // The borrowed serializer writes what the old Value-map one did: sorted keys, the last
        // of repeated keys, the same escapes.
        fn old(attrs: &[(String, String)]) -> String {
            let map: serde_json::Map<String, serde_json::Value> = attrs
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                .collect();
            serde_json::Value::Object(map).to_string()
        }
        let p = |k: &str, v: &str| (k.to_string(), v.to_string());
        for attrs in [
            vec![],
            vec![p("b", "1"), p("a", "2")],
            vec![p("k", "first"), p("z", "x"), p("k", "last")],
            vec![p("q\"uote", "new\nline\u{0}\u{1f}é😀"), p("", "")],
        ] {
            assert_eq!(attrs_to_json(&attrs), old(&attrs));
            let back: BTreeMap<String, String> = attrs_from_json(&attrs_to_json(&attrs))
                .into_iter()
                .collect();
            let want: BTreeMap<String, String> = attrs.iter().cloned().collect();
            assert_eq!(back, want);
        }
    }

    #[test]
    fn doc_versions_increase() {
        let a = doc_version_us();
        let b = doc_version_us();
        assert!(b > a);
    }
}
