//! The ClickHouse store, within what ClickHouse 18.16 supports (docs/ARCHITECTURE.md §4).
//!
//! - The client is built with `.with_validation(false)` (18.16 has no
//!   `RowBinaryWithNamesAndTypes`), queries use `.bind()`, and no server setting is sent
//!   (on a cluster: `insert_distributed_sync = 1`, which 18.16 knows).
//! - Time is `DateTime` (seconds, for partitioning and coarse filters) plus a `UInt64` of
//!   microseconds; attributes are parallel `Array(String)` key/value columns.
//! - Row tables are `MergeTree` partitioned by `toYYYYMMDD(ts)`; retention drops whole
//!   partitions ([`Store::drop_before`]). Documents live in a `ReplacingMergeTree` read with
//!   `argMax`.
//! - Every row carries `batch_id` and `seq` (its index in the batch). A replayed batch first
//!   asks which `seq`s of that batch each table already holds and writes only the rest, so a
//!   write that succeeded on the server but whose answer was lost is not doubled. A merged
//!   write ([`Store::write_merged`]: several spool records in one INSERT per table) keeps each
//!   row's own batch id and index and asks once per table for all its batches in replay mode.
//! - **Settling before a replay check.** An INSERT whose body ClickHouse has fully received
//!   goes on being written after our side gave up on it (the control plane killed, or the
//!   write timed out), and its rows are visible only once it finishes. So every INSERT is sent
//!   with `query_id = brownout-<writer>-<run>-<n>` (`<writer>`: the spool's id, stable across
//!   restarts, [`Store::set_writer`]; `<run>`: random per store instance; `<n>`: a counter, so
//!   no two running inserts share an id), and a replay first polls `system.processes` (every
//!   50 ms) until no insert of this writer started before the replay — every one of an earlier
//!   run, this run's with a smaller counter — is still running. A query leaves
//!   `system.processes` only after its parts are committed, so the check that follows sees its
//!   rows. Past the settle bound (half of `storage.write_timeout_ms`) the replay fails
//!   ([`StoreError::Unsettled`]) without checking or inserting, and is retried later.
//! - **Cluster** (`storage.clickhouse_cluster`, docs/SCALING.md): each table `t` becomes a
//!   `Replicated…MergeTree` `t_local` created `ON CLUSTER` (ZooKeeper path
//!   `/clickhouse/tables/{shard}/<db>.t_local`, replica `{replica}`: the servers' macros) and a
//!   `Distributed` table `t` over it, sharded by `cityHash64(trace_id)` (spans),
//!   `cityHash64(id)` (failures), `cityHash64(host)` (snapshots), `cityHash64(kind, key)`
//!   (documents). Every write and read goes through the Distributed tables (writes with
//!   `insert_distributed_sync = 1`: the insert returns once every shard has its rows), so the
//!   queries above are unchanged; column migrations and retention's `DROP PARTITION` run
//!   `ON CLUSTER` on the local tables.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use brownout_protocol::AgentSnapshot;
use clickhouse::{Client, Row};
use serde::{Deserialize, Serialize};

use super::{
    Batch, CountQuery, Doc, FailureQuery, FailureRow, Parts, RequestCount, RowCounts, SliBucket,
    SliCounts, SpanRow, Store, StoreError, StoreFuture, WriteMode, doc_version_us, sqlite::page,
};
use crate::config::ClickHouseConfig;

mod rows;
mod schema;
use rows::*;

/// The ClickHouse store.
pub struct ClickHouseStore {
    client: Client,
    /// Set once the tables are known to exist; until then writes and pings migrate first, so
    /// the control plane can start while ClickHouse is down and catch up when it returns.
    migrated: std::sync::atomic::AtomicBool,
    database: String,
    /// `Some(name)`: a cluster (module docs); the table names below are then the
    /// database-qualified `Distributed` tables, and `<name>_local` the replicated ones.
    cluster: Option<String>,
    spans: String,
    logs: String,
    failures: String,
    snapshots: String,
    docs: String,
    /// SLI counts per batch (`MergeTree`, replay-checked like the row tables) …
    sli_rows: String,
    /// … summed per SLO and minute by the materialized view `sli_mv` (`SummingMergeTree`).
    sli_buckets: String,
    sli_mv: String,
    /// Whose inserts these are ([`Store::set_writer`]; module docs "Settling").
    writer: Mutex<WriterTag>,
    /// Random per store instance: tells this run's inserts from a predecessor's.
    run: String,
    /// The next insert's number in this run.
    next_query: AtomicU64,
}

/// The `query_id` prefix of this writer's inserts and how long a replay waits for them.
struct WriterTag {
    /// `brownout-<writer id>-`.
    prefix: String,
    settle_within: Duration,
}

/// How often a replay asks `system.processes` whether earlier inserts are still running.
const SETTLE_POLL: Duration = Duration::from_millis(50);

fn random_hex() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Whether the running query `query_id` is an insert of this writer started before the insert
/// numbered `before` of run `run`: any of another run (a predecessor on the same spool), or one
/// of this run with a smaller number.
fn started_before(query_id: &str, prefix: &str, run: &str, before: u64) -> bool {
    let Some(rest) = query_id.strip_prefix(prefix) else {
        return false;
    };
    match rest.rsplit_once('-') {
        Some((r, n)) if r == run => n.parse::<u64>().map_or(true, |n| n < before),
        _ => true,
    }
}

/// A client for ClickHouse over `https://` with our own TLS configuration (a private CA,
/// a client certificate): hyper's pooled client, as the clickhouse crate builds its default one
/// (TCP keep-alive 60 s, idle sockets kept 2 s, under ClickHouse's 3 s keep-alive).
fn https_client(tls: &std::sync::Arc<rustls::ClientConfig>) -> Client {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.set_keepalive(Some(Duration::from_secs(60)));
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config((**tls).clone())
        .https_only()
        .enable_http1()
        .wrap_connector(http);
    Client::with_http_client(
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(2))
            .build(connector),
    )
}

impl ClickHouseStore {
    /// A client for `config` (no connection is made until the first call).
    pub fn new(config: &ClickHouseConfig) -> ClickHouseStore {
        let client = match &config.tls {
            None => Client::default(),
            Some(tls) => https_client(tls),
        };
        let mut client = client
            .with_url(&config.url)
            .with_database(&config.database)
            .with_validation(false);
        if let Some(u) = &config.user {
            client = client.with_user(u);
        }
        if let Some(p) = &config.password {
            client = client.with_password(p.expose());
        }
        if config.cluster.is_some() {
            // A write returns once every shard holds its rows, so the replay check (which
            // reads them back through the Distributed table) sees them. 18.16 takes it only as a
            // query setting (not inside `INSERT … SELECT`); current versions still accept the
            // name (an alias of `distributed_foreground_insert`).
            client = client.with_setting("insert_distributed_sync", "1");
        }
        let t = |name: &str| match &config.cluster {
            None => format!("{}{name}", config.table_prefix),
            // ON CLUSTER DDL runs on every host without this session's database: qualify.
            Some(_) => format!("{}.{}{name}", config.database, config.table_prefix),
        };
        ClickHouseStore {
            client,
            migrated: std::sync::atomic::AtomicBool::new(false),
            database: config.database.clone(),
            cluster: config.cluster.clone(),
            spans: t("spans"),
            logs: t("logs"),
            failures: t("failures"),
            snapshots: t("snapshots"),
            docs: t("docs"),
            sli_rows: t("sli_rows"),
            sli_buckets: t("sli_buckets"),
            sli_mv: t("sli_mv"),
            writer: Mutex::new(WriterTag {
                // Until the ingest pipeline names the spool's writer: this instance alone.
                prefix: format!("brownout-{}-", random_hex()),
                settle_within: Duration::from_secs(5),
            }),
            run: random_hex(),
            next_query: AtomicU64::new(0),
        }
    }

    /// The `query_id` prefix of this store's inserts: `brownout-<writer id>-`.
    pub fn writer_prefix(&self) -> String {
        self.writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .prefix
            .clone()
    }

    /// A fresh `query_id` for one insert (unique: ClickHouse refuses a second running query
    /// with the same id).
    fn next_query_id(&self) -> String {
        let n = self.next_query.fetch_add(1, Ordering::SeqCst);
        format!("{}{}-{n}", self.writer_prefix(), self.run)
    }

    /// Waits until no insert of this writer started before this call is still running in
    /// ClickHouse (module docs "Settling"), polling `system.processes`.
    ///
    /// # Errors
    /// [`StoreError::Unsettled`] when some are still running after the settle bound; or when
    /// ClickHouse does not answer.
    async fn settle(&self) -> Result<(), StoreError> {
        let (prefix, within) = {
            let w = self
                .writer
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            (w.prefix.clone(), w.settle_within)
        };
        let before = self.next_query.load(Ordering::SeqCst);
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let running: Vec<String> = self
                .client
                .query("SELECT query_id FROM system.processes WHERE startsWith(query_id, ?)")
                .bind(prefix.as_str())
                .fetch_all()
                .await?;
            let earlier = running
                .iter()
                .filter(|id| started_before(id, &prefix, &self.run, before))
                .count();
            if earlier == 0 {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StoreError::Unsettled(format!(
                    "{earlier} insert(s) with query_id {prefix}… still running after {} ms; \
                     the replay check waits for them",
                    within.as_millis()
                )));
            }
            tokio::time::sleep(SETTLE_POLL).await;
        }
    }

    fn row_tables(&self) -> [&str; 4] {
        [&self.spans, &self.logs, &self.failures, &self.snapshots]
    }

    /// The tables retention drops day partitions of, each with its cutoff.
    fn retained_tables(&self, cutoff_ms: u64) -> [(&str, u64); 6] {
        let [a, b, c, d] = self.row_tables();
        let sli = super::sli_cutoff_ms(cutoff_ms);
        [
            (a, cutoff_ms),
            (b, cutoff_ms),
            (c, cutoff_ms),
            (d, cutoff_ms),
            (self.sli_rows.as_str(), cutoff_ms),
            (self.sli_buckets.as_str(), sli),
        ]
    }

    /// The cluster name, when this store runs on one.
    pub fn cluster(&self) -> Option<&str> {
        self.cluster.as_deref()
    }

    /// ` ON CLUSTER <name>`, or nothing on one node.
    fn on_cluster(&self) -> String {
        self.cluster
            .as_ref()
            .map_or_else(String::new, |c| format!(" ON CLUSTER {c}"))
    }

    /// The table holding the rows of `t` on each shard: `t` itself on one node, `<t>_local`
    /// (the `ReplicatedMergeTree` under the `Distributed` table `t`) on a cluster.
    pub fn local_table(&self, t: &str) -> String {
        match self.cluster {
            None => t.to_string(),
            Some(_) => format!("{t}_local"),
        }
    }

    /// The spans table every read and write goes through (tests count rows per shard with
    /// [`ClickHouseStore::local_table`] of it).
    pub fn spans_table(&self) -> &str {
        &self.spans
    }

    /// The failures table every read and write goes through.
    pub fn failures_table(&self) -> &str {
        &self.failures
    }

    async fn insert_rows<T>(
        &self,
        table: &str,
        rows: impl Iterator<Item = T>,
    ) -> Result<(), StoreError>
    where
        T: Row + Serialize + for<'a> clickhouse::RowWrite<Value<'a> = T>,
    {
        // The crate quotes the name as one identifier: `db.t` would not resolve. The session's
        // database is the configured one, where a cluster store's tables are.
        let table = table.rsplit('.').next().unwrap_or(table);
        let mut ins = self
            .client
            .insert::<T>(table)
            .await?
            .with_setting("query_id", self.next_query_id());
        let mut n = 0usize;
        for r in rows {
            ins.write(&r).await?;
            n += 1;
        }
        if n == 0 {
            // Nothing to send: an empty INSERT is refused by some servers.
            drop(ins);
            return Ok(());
        }
        ins.end().await?;
        Ok(())
    }

    /// Inserts the rows of one table of `items` (`rows`: a batch's rows of it) that table `t`
    /// does not hold yet ([`ClickHouseStore::present_many`] of the batches in replay mode),
    /// each converted by `row` with its batch id and index.
    async fn insert_missing<S: Sync, T>(
        &self,
        t: &str,
        items: &[(&Batch, WriteMode)],
        rows: fn(&Batch) -> &[S],
        row: fn(&S, u64, u32) -> T,
    ) -> Result<(), StoreError>
    where
        T: Row + Serialize + for<'a> clickhouse::RowWrite<Value<'a> = T>,
    {
        let present = self.present_many(t, &replay_ids(items, rows)).await?;
        self.insert_rows(t, missing_rows(items, &present, rows, row))
            .await
    }

    async fn write(&self, b: &Batch, mode: WriteMode) -> Result<(), StoreError> {
        self.write_many(&[(b, mode)], Parts::All).await
    }

    /// Which `(batch_id, seq)` of the batches `ids` table `t` already holds: one query for all
    /// of them. No query when `ids` is empty.
    async fn present_many(&self, t: &str, ids: &[u64]) -> Result<HashSet<(u64, u32)>, StoreError> {
        if ids.is_empty() {
            return Ok(HashSet::new());
        }
        #[derive(Row, Deserialize)]
        struct Present {
            batch_id: u64,
            seq: u32,
        }
        // Ids are numbers: written into the query, not bound (a list of them).
        let list = ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        let rows: Vec<Present> = self
            .client
            .query(&format!(
                "SELECT batch_id, seq FROM {t} WHERE batch_id IN ({list})"
            ))
            .fetch_all()
            .await?;
        Ok(rows.into_iter().map(|r| (r.batch_id, r.seq)).collect())
    }

    /// Writes several batches with one INSERT per table (the four tables at once). Each row
    /// keeps its own batch's id and index, so a merged insert is checked on replay like a
    /// single one: for the batches in [`WriteMode::Replay`] (their earlier write may have
    /// landed) one query per table asks which of their rows are there, and only the rest are
    /// inserted; [`WriteMode::Fresh`] batches are not checked.
    /// `parts` chooses the tables ([`Parts`]).
    async fn write_many(
        &self,
        items: &[(&Batch, WriteMode)],
        parts: Parts,
    ) -> Result<(), StoreError> {
        self.ensure_migrated().await?;
        let (main, sli) = match parts {
            Parts::All => (true, true),
            Parts::WithoutSli => (true, false),
            Parts::SliOnly => (false, true),
        };
        if items
            .iter()
            .any(|(b, m)| *m == WriteMode::Replay && !b.is_empty())
        {
            // An earlier insert of these rows may still be running: its rows would not be
            // seen by the check below, and would land next to the ones inserted again.
            self.settle().await?;
        }
        if !main {
            return self
                .insert_missing(&self.sli_rows, items, |b| &b.sli, ch_sli)
                .await;
        }
        let spans = self.insert_missing(&self.spans, items, |b| &b.spans, ch_span);
        let logs = self.insert_missing(&self.logs, items, |b| &b.logs, ch_log);
        let failures = self.insert_missing(&self.failures, items, |b| &b.failures, ch_failure);
        let snapshots = async {
            let of: fn(&Batch) -> &[AgentSnapshot] = |b| &b.snapshots;
            let present = self
                .present_many(&self.snapshots, &replay_ids(items, of))
                .await?;
            // Encoded before the insert starts: a snapshot that cannot be is an error, and
            // nothing of the table is sent.
            let snaps =
                missing_rows(items, &present, of, ch_snapshot).collect::<Result<Vec<_>, _>>()?;
            self.insert_rows(&self.snapshots, snaps.into_iter()).await
        };
        let sli = async {
            if !sli {
                return Ok(());
            }
            self.insert_missing(&self.sli_rows, items, |b| &b.sli, ch_sli)
                .await
        };
        // The tables' inserts run at once: one round trip per group, not five in a row.
        futures::future::try_join5(spans, logs, failures, snapshots, sli).await?;
        Ok(())
    }
}

impl Store for ClickHouseStore {
    fn backend(&self) -> &'static str {
        "clickhouse"
    }

    fn migrate(&self) -> StoreFuture<'_, ()> {
        Box::pin(self.migrate_tables())
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let _: u8 = self.client.query("SELECT toUInt8(1)").fetch_one().await?;
            self.ensure_migrated().await
        })
    }

    fn write_batch<'a>(&'a self, batch: &'a Batch, mode: WriteMode) -> StoreFuture<'a, ()> {
        Box::pin(self.write(batch, mode))
    }

    fn set_writer(&self, writer_id: &str, settle_within: Duration) {
        let mut w = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        w.prefix = format!("brownout-{writer_id}-");
        w.settle_within = settle_within;
    }

    /// One INSERT per table for all of them; the replay check only for the batches in
    /// [`WriteMode::Replay`] (one query per table for all of those).
    fn write_merged(&self, batches: Vec<(Arc<Batch>, WriteMode)>) -> StoreFuture<'_, ()> {
        self.write_parts(batches, Parts::All)
    }

    /// The shipper writes the SLI rows of several groups in one insert.
    fn splits_sli(&self) -> bool {
        true
    }

    fn write_parts(
        &self,
        batches: Vec<(Arc<Batch>, WriteMode)>,
        parts: Parts,
    ) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            let items: Vec<(&Batch, WriteMode)> =
                batches.iter().map(|(b, m)| (b.as_ref(), *m)).collect();
            self.write_many(&items, parts).await
        })
    }

    /// Two inserts at a time: one is serialized and sent while ClickHouse writes the other's
    /// part, so the round trip is not paid once per group in a row.
    fn write_concurrency(&self) -> usize {
        2
    }

    fn trace<'a>(&'a self, trace_id: &'a str) -> StoreFuture<'a, Vec<SpanRow>> {
        Box::pin(async move {
            let rows: Vec<ChSpan> = self
                .client
                .query(&format!(
                    "SELECT {SPAN_COLS} FROM {} WHERE trace_id = ? ORDER BY start_us, span_id",
                    self.spans
                ))
                .bind(trace_id.to_ascii_lowercase())
                .fetch_all()
                .await?;
            Ok(rows.into_iter().map(span_from_ch).collect())
        })
    }

    fn failures<'a>(&'a self, q: &'a FailureQuery) -> StoreFuture<'a, super::FailurePage> {
        Box::pin(async move {
            let mut sql = format!(
                "SELECT {FAILURE_COLS} FROM {} WHERE ts >= toDateTime(?) AND ts <= toDateTime(?) AND ts_ms >= ? AND ts_ms < ?",
                self.failures
            );
            let strings = q.push_conditions(&mut sql);
            let mut query = self
                .client
                .query(&sql)
                .bind(secs_from_ms(q.since_ms))
                .bind(secs_from_ms(q.until_ms))
                .bind(q.since_ms)
                .bind(q.until_ms);
            for s in strings {
                query = query.bind(s);
            }
            if let Some(c) = &q.cursor {
                query = query.bind(c.ts_ms).bind(c.ts_ms).bind(c.id.as_str());
            }
            let rows: Vec<ChFailure> = query.fetch_all().await?;
            let mut items: Vec<FailureRow> = rows.into_iter().map(failure_from_ch).collect();
            Ok(page(&mut items, q.page_size()))
        })
    }

    fn logs<'a>(&'a self, q: &'a super::LogQuery) -> StoreFuture<'a, super::LogPage> {
        Box::pin(self.search_logs(q))
    }

    fn request_counts<'a>(&'a self, q: &'a CountQuery) -> StoreFuture<'a, Vec<RequestCount>> {
        Box::pin(async move {
            if q.bucket_ms == 0 {
                return Err(StoreError::BadQuery("bucket_ms must be > 0".into()));
            }
            #[derive(Row, Deserialize)]
            struct R {
                b: u64,
                service: String,
                feature: String,
                criticality: String,
                good: u64,
                total: u64,
                refused: u64,
            }
            let bucket_us = q.bucket_ms.saturating_mul(1000);
            let threshold_us = q
                .latency_threshold_ms
                .map_or(u64::MAX, |t| t.saturating_mul(1000));
            let mut sql = format!(
                "SELECT intDiv(intDiv(start_us, ?) * ?, 1000) AS b, service, feature, criticality, \
                 toUInt64(countIf(deliberate = 0 AND status != 2 AND duration_us <= ?)) AS good, \
                 toUInt64(countIf(deliberate = 0)) AS total, toUInt64(countIf(deliberate = 1)) AS refused \
                 FROM {} WHERE is_request = 1 AND ts >= toDateTime(?) AND ts <= toDateTime(?) \
                 AND start_us >= ? AND start_us < ?",
                self.spans
            );
            if q.service.is_some() {
                sql.push_str(" AND service = ?");
            }
            sql.push_str(" GROUP BY b, service, feature, criticality ORDER BY b, service, feature, criticality");
            let mut query = self
                .client
                .query(&sql)
                .bind(bucket_us)
                .bind(bucket_us)
                .bind(threshold_us)
                .bind(secs_from_ms(q.since_ms))
                .bind(secs_from_ms(q.until_ms))
                .bind(q.since_ms.saturating_mul(1000))
                .bind(q.until_ms.saturating_mul(1000));
            if let Some(s) = &q.service {
                query = query.bind(s.as_str());
            }
            let rows: Vec<R> = query.fetch_all().await?;
            Ok(rows
                .into_iter()
                .map(|r| RequestCount {
                    bucket_ms: r.b,
                    service: r.service,
                    feature: r.feature,
                    criticality: r.criticality,
                    good: r.good,
                    total: r.total,
                    refused: r.refused,
                })
                .collect())
        })
    }

    fn latest_snapshots(&self, since_ms: u64) -> StoreFuture<'_, Vec<AgentSnapshot>> {
        Box::pin(async move {
            let rows: Vec<String> = self
                .client
                .query(&format!(
                    "SELECT argMax(json, ts_ms) FROM {} WHERE ts >= toDateTime(?) AND ts_ms >= ? GROUP BY host ORDER BY host",
                    self.snapshots
                ))
                .bind(secs_from_ms(since_ms))
                .bind(since_ms)
                .fetch_all()
                .await?;
            super::snapshots_from_json(&rows)
        })
    }

    fn put_doc<'a>(
        &'a self,
        kind: &'a str,
        key: &'a str,
        value: &'a serde_json::Value,
    ) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let row = ChDoc {
                kind: kind.into(),
                key: key.into(),
                version_us: doc_version_us(),
                json: value.to_string(),
            };
            self.insert_rows(&self.docs, std::iter::once(row)).await
        })
    }

    fn get_doc<'a>(&'a self, kind: &'a str, key: &'a str) -> StoreFuture<'a, Option<Doc>> {
        Box::pin(async move {
            let rows: Vec<ChDoc> = self
                .client
                .query(&format!(
                    "SELECT kind, key, max(version_us) AS v, argMax(json, version_us) FROM {} \
                     WHERE kind = ? AND key = ? GROUP BY kind, key",
                    self.docs
                ))
                .bind(kind)
                .bind(key)
                .fetch_all()
                .await?;
            rows.into_iter().next().map(doc_from_ch).transpose()
        })
    }

    fn list_docs<'a>(&'a self, kind: &'a str, since_ms: u64) -> StoreFuture<'a, Vec<Doc>> {
        Box::pin(async move {
            let rows: Vec<ChDoc> = self
                .client
                .query(&format!(
                    "SELECT kind, key, max(version_us) AS v, argMax(json, version_us) FROM {} \
                     WHERE kind = ? GROUP BY kind, key HAVING v >= ? ORDER BY key",
                    self.docs
                ))
                .bind(kind)
                .bind(since_ms.saturating_mul(1000))
                .fetch_all()
                .await?;
            rows.into_iter().map(doc_from_ch).collect()
        })
    }

    fn drop_before(&self, cutoff_ms: u64) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            let mut dropped = 0u64;
            for (t, cutoff_ms) in self.retained_tables(cutoff_ms) {
                let cutoff_day = yyyymmdd(cutoff_ms);
                let local = self.local_table(t);
                let (sql, table) = match &self.cluster {
                    None => (
                        "SELECT DISTINCT partition FROM system.parts WHERE database = ? AND table = ? AND active"
                            .to_string(),
                        t,
                    ),
                    // system.parts only knows this host's parts: ask one replica of every
                    // shard (the table function `cluster`, in 18.16 and since).
                    Some(c) => (
                        format!(
                            "SELECT DISTINCT partition FROM cluster('{c}', system, parts) \
                             WHERE database = ? AND table = ? AND active"
                        ),
                        local.rsplit('.').next().unwrap_or(&local),
                    ),
                };
                let parts: Vec<String> = self
                    .client
                    .query(&sql)
                    .bind(self.database.as_str())
                    .bind(table)
                    .fetch_all()
                    .await?;
                // Partition ids are YYYYMMDD numbers; anything else is not ours to drop.
                let days = parts
                    .iter()
                    .filter_map(|p| p.trim_matches('\'').parse::<u32>().ok());
                for day in days {
                    if day < cutoff_day {
                        self.client
                            .query(&format!(
                                "ALTER TABLE {local}{} DROP PARTITION {day}",
                                self.on_cluster()
                            ))
                            .execute()
                            .await?;
                        dropped += 1;
                    }
                }
            }
            Ok(dropped)
        })
    }

    fn sli_buckets(
        &self,
        from_ms: u64,
        to_ms: u64,
        bucket_ms: u64,
    ) -> StoreFuture<'_, Vec<SliBucket>> {
        Box::pin(async move {
            super::check_sli_bucket(bucket_ms)?;
            #[derive(Row, Deserialize)]
            struct R {
                slo: String,
                b: u64,
                f: u64,
                g: u64,
                t: u64,
                r: u64,
            }
            // Parts not merged yet hold several rows per key: always summed here.
            let rows: Vec<R> = self
                .client
                .query(&format!(
                    "SELECT slo, intDiv(minute_ms, ?) * ? AS b, min(minute_ms) AS f, \
                     sum(good) AS g, sum(total) AS t, sum(refused) AS r FROM {} \
                     WHERE ts >= toDateTime(?) AND ts <= toDateTime(?) AND minute_ms >= ? \
                     AND minute_ms < ? GROUP BY slo, b ORDER BY b, slo",
                    self.sli_buckets
                ))
                .bind(bucket_ms)
                .bind(bucket_ms)
                .bind(secs_from_ms(from_ms))
                .bind(secs_from_ms(to_ms))
                .bind(from_ms)
                .bind(to_ms)
                .fetch_all()
                .await?;
            Ok(rows
                .into_iter()
                .map(|r| SliBucket {
                    slo: r.slo,
                    start_ms: r.b,
                    first_ms: r.f,
                    counts: SliCounts {
                        good: r.g,
                        total: r.t,
                        refused: r.r,
                    },
                })
                .collect())
        })
    }

    fn count_rows(&self) -> StoreFuture<'_, RowCounts> {
        Box::pin(async move {
            let n = |t: String| async move {
                let c: u64 = self
                    .client
                    .query(&format!("SELECT count() FROM {t}"))
                    .fetch_one()
                    .await?;
                Ok::<u64, StoreError>(c)
            };
            Ok(RowCounts {
                spans: n(self.spans.clone()).await?,
                logs: n(self.logs.clone()).await?,
                failures: n(self.failures.clone()).await?,
                snapshots: n(self.snapshots.clone()).await?,
            })
        })
    }
}

impl ClickHouseStore {
    /// [`Store::logs`]: newest first by `(ts_us, batch_id, seq)` (unique per row), through the
    /// Distributed table on a cluster. 18.16 has no skipping indices: the day partitions and the
    /// primary key `(service, ts)` narrow the read, `position()` scans the bodies left.
    async fn search_logs(&self, q: &super::LogQuery) -> Result<super::LogPage, StoreError> {
        q.check()?;
        let mut sql = format!(
            "SELECT {LOG_COLS} FROM {} WHERE ts >= toDateTime(?) AND ts <= toDateTime(?) \
             AND ts_us >= ? AND ts_us < ?",
            self.logs
        );
        let mut strings =
            super::push_equals(&mut sql, &[("service", &q.service), ("host", &q.host)]);
        if q.min_severity > 0 {
            // A number: written into the query.
            sql.push_str(&format!(" AND severity_number >= {}", q.min_severity));
        }
        if let Some(t) = q.text.as_ref().filter(|t| !t.is_empty()) {
            sql.push_str(" AND position(body, ?) > 0");
            strings.push(t.clone());
        }
        if let Some(c) = &q.cursor {
            // Numbers: written into the query.
            // `ts` bounded too: the later day partitions are not read again.
            sql.push_str(&format!(
                " AND ts <= toDateTime({secs}) AND ts_us <= {t} \
                 AND (ts_us < {t} OR (ts_us = {t} AND (batch_id < {b} OR (batch_id = {b} AND seq < {s}))))",
                secs = secs_from_us(c.ts_us),
                t = c.ts_us,
                b = c.id,
                s = c.seq
            ));
        }
        let limit = q.page_size();
        sql.push_str(&format!(
            " ORDER BY ts_us DESC, batch_id DESC, seq DESC LIMIT {}",
            limit + 1
        ));
        let mut query = self
            .client
            .query(&sql)
            .bind(secs_from_ms(q.since_ms))
            .bind(secs_from_ms(q.until_ms))
            .bind(q.since_ms.saturating_mul(1000))
            .bind(q.until_ms.saturating_mul(1000));
        for s in strings {
            query = query.bind(s);
        }
        let rows: Vec<ChLog> = query.fetch_all().await?;
        let items = rows
            .into_iter()
            .map(|l| {
                let (id, seq) = (l.batch_id, l.seq);
                let row = super::LogRow {
                    ts_us: l.ts_us,
                    trace_id: l.trace_id,
                    span_id: l.span_id,
                    service: l.service,
                    host: l.host,
                    severity_number: l.severity_number,
                    severity_text: l.severity_text,
                    body: l.body,
                    attributes: l.attr_keys.into_iter().zip(l.attr_values).collect(),
                };
                super::LogHit::new(row, id, seq)
            })
            .collect();
        Ok(super::logs::log_page(items, limit))
    }
}

#[cfg(test)]
mod tests {
    use super::started_before;

    #[test]
    fn a_replay_waits_for_a_predecessors_inserts_and_this_runs_earlier_ones_only() {
        let p = "brownout-00ab-";
        // A previous process on the same spool: every one of its inserts is earlier.
        assert!(started_before("brownout-00ab-99ff-7", p, "11aa", 3));
        assert!(started_before("brownout-00ab-99ff-700", p, "11aa", 3));
        // This run: only those numbered before the replay began.
        assert!(started_before("brownout-00ab-11aa-2", p, "11aa", 3));
        assert!(!started_before("brownout-00ab-11aa-3", p, "11aa", 3));
        assert!(!started_before("brownout-00ab-11aa-40", p, "11aa", 3));
        // Another writer's inserts are not waited for (a prefix of an id is not the id).
        assert!(!started_before("brownout-00abc-11aa-1", p, "11aa", 3));
        assert!(!started_before("something-else", p, "11aa", 3));
    }
}
