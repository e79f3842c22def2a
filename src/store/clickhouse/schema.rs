//! The ClickHouse schema: the tables, their engines on one node or a cluster, the columns
//! added since (`deliberate`), the SLI view, and dropping them (tests).

use super::ClickHouseStore;
use crate::store::{Store, StoreError};

/// One table as [`ClickHouseStore::migrate`] creates it.
pub(super) struct TableDef<'a> {
    pub(super) name: &'a str,
    pub(super) columns: &'static str,
    /// The one-node engine: `MergeTree()` or `ReplacingMergeTree(version_us)`.
    pub(super) engine: &'static str,
    /// `PARTITION BY … ORDER BY …`.
    pub(super) rest: String,
    /// The Distributed table's sharding key (cluster only).
    pub(super) shard_key: &'static str,
    /// The DEFAULT of the `deliberate` column, on tables that have one.
    pub(super) deliberate: Option<&'static str>,
}

impl ClickHouseStore {
    /// Creates the tables (and on a cluster their local tables), the columns added since, and
    /// the SLI view: what [`Store::migrate`] runs.
    pub(super) async fn migrate_tables(&self) -> Result<(), StoreError> {
        let by_day = "PARTITION BY toYYYYMMDD(ts)";
        let defs = [
            TableDef {
                name: &self.spans,
                columns: "ts DateTime, start_us UInt64, duration_us UInt64, trace_id String, \
                     span_id String, parent_span_id String, service String, name String, kind UInt8, status UInt8, \
                     status_message String, feature String, criticality String, host String, is_request UInt8, \
                     attr_keys Array(String), attr_values Array(String), batch_id UInt64, seq UInt32",
                engine: "MergeTree()",
                rest: format!("{by_day} ORDER BY (service, ts)"),
                // A trace's spans stay together on one shard, and traces spread evenly.
                shard_key: "cityHash64(trace_id)",
                deliberate: Some("attr_values[indexOf(attr_keys, 'brownout.deliberate')] = 'true'"),
            },
            TableDef {
                name: &self.logs,
                columns: "ts DateTime, ts_us UInt64, trace_id String, span_id String, \
                     service String, host String, severity_number UInt8, severity_text String, body String, \
                     attr_keys Array(String), attr_values Array(String), batch_id UInt64, seq UInt32",
                engine: "MergeTree()",
                rest: format!("{by_day} ORDER BY (service, ts)"),
                // Many logs carry no trace id: spread by record, not by trace.
                shard_key: "cityHash64(trace_id, span_id, ts_us)",
                deliberate: None,
            },
            TableDef {
                name: &self.failures,
                columns: "ts DateTime, ts_ms UInt64, id String, service String, host String, \
                     request_id String, trace_id String, user_id String, feature String, criticality String, \
                     category String, error_type String, message String, latency_ms Float64, pattern String, \
                     attr_keys Array(String), attr_values Array(String), batch_id UInt64, seq UInt32",
                engine: "MergeTree()",
                rest: format!("{by_day} ORDER BY (ts, id)"),
                // The id is unique and random: an even spread even when most events carry
                // no trace id (which would put them all on one shard).
                shard_key: "cityHash64(id)",
                deliberate: Some(
                    "attr_values[indexOf(attr_keys, 'deliberate')] = 'true' \
                         OR attr_values[indexOf(attr_keys, 'brownout.deliberate')] = 'true'",
                ),
            },
            TableDef {
                name: &self.snapshots,
                columns: "ts DateTime, ts_ms UInt64, host String, json String, batch_id UInt64, seq UInt32",
                engine: "MergeTree()",
                rest: format!("{by_day} ORDER BY (host, ts)"),
                shard_key: "cityHash64(host)",
                deliberate: None,
            },
            TableDef {
                name: &self.sli_rows,
                columns: "ts DateTime, minute_ms UInt64, slo String, good UInt64, total UInt64, \
                     refused UInt64, batch_id UInt64, seq UInt32",
                engine: "MergeTree()",
                rest: format!("{by_day} ORDER BY (batch_id, seq)"),
                shard_key: "cityHash64(batch_id, seq)",
                deliberate: None,
            },
            TableDef {
                name: &self.sli_buckets,
                // `batch_ids` (the sum of the contributing batch ids, wrapping) is read by
                // nobody: it keeps two batches' equal counts distinct blocks, which a
                // ReplicatedMergeTree's insert deduplication would otherwise drop as one.
                columns: "ts DateTime, minute_ms UInt64, slo String, good UInt64, total UInt64, \
                     refused UInt64, batch_ids UInt64",
                engine: "SummingMergeTree()",
                rest: format!("{by_day} ORDER BY (slo, minute_ms, ts)"),
                shard_key: "cityHash64(slo, minute_ms)",
                deliberate: None,
            },
            TableDef {
                name: &self.docs,
                columns: "kind String, key String, version_us UInt64, json String",
                engine: "ReplacingMergeTree(version_us)",
                rest: "ORDER BY (kind, key)".into(),
                // Every version of a document on one shard, where merges replace it.
                shard_key: "cityHash64(kind, key)",
                deliberate: None,
            },
        ];
        for d in &defs {
            self.create_table(d).await?;
        }
        self.create_sli_view().await?;
        self.migrated
            .store(true, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// The SLI tables' materialized view: each insert into `sli_rows` (on a cluster: into a
    /// shard's `sli_rows_local`) is summed into `sli_buckets` (`sli_buckets_local`, replicated
    /// from there). Created after both tables, before any insert can reach them.
    pub(super) async fn create_sli_view(&self) -> Result<(), StoreError> {
        let (from, to) = (
            self.local_table(&self.sli_rows),
            self.local_table(&self.sli_buckets),
        );
        self.client
            .query(&format!(
                "CREATE MATERIALIZED VIEW IF NOT EXISTS {}{} TO {to} AS \
                 SELECT ts, minute_ms, slo, good, total, refused, batch_id AS batch_ids FROM {from}",
                self.sli_mv,
                self.on_cluster()
            ))
            .execute()
            .await?;
        Ok(())
    }

    /// Drops this store's tables (tests); on a cluster the Distributed and the local ones, on
    /// every host.
    ///
    /// # Errors
    /// When ClickHouse refuses.
    pub async fn drop_tables(&self) -> Result<(), StoreError> {
        let on = self.on_cluster();
        self.client
            .query(&format!("DROP TABLE IF EXISTS {}{on}", self.sli_mv))
            .execute()
            .await?;
        let more = [
            self.docs.as_str(),
            self.sli_rows.as_str(),
            self.sli_buckets.as_str(),
        ];
        for t in self.row_tables().into_iter().chain(more) {
            self.client
                .query(&format!("DROP TABLE IF EXISTS {t}{on}"))
                .execute()
                .await?;
            if self.cluster.is_some() {
                self.client
                    .query(&format!("DROP TABLE IF EXISTS {}{on}", self.local_table(t)))
                    .execute()
                    .await?;
            }
        }
        Ok(())
    }

    /// Creates one table if missing: on one node `t` with its engine; on a cluster the
    /// replicated `<t>_local` on every host (ZooKeeper path
    /// `/clickhouse/tables/{shard}/<db>.<t>_local`, replica `{replica}`: the servers' macros)
    /// and the `Distributed` table `t` over it. Then adds the `deliberate` column where the
    /// table has one and it is missing.
    pub(super) async fn create_table(&self, d: &TableDef<'_>) -> Result<(), StoreError> {
        let Some(cluster) = &self.cluster else {
            self.client
                .query(&format!(
                    "CREATE TABLE IF NOT EXISTS {} ({}) ENGINE = {} {}",
                    d.name, d.columns, d.engine, d.rest
                ))
                .execute()
                .await?;
            if let Some(expr) = d.deliberate {
                self.add_deliberate_column(d.name, expr).await?;
            }
            return Ok(());
        };
        let local = self.local_table(d.name);
        let (engine, args) = d
            .engine
            .split_once('(')
            .ok_or_else(|| StoreError::BadQuery(format!("engine {:?}", d.engine)))?;
        let args = args.trim_end_matches(')');
        let zk_path = format!("/clickhouse/tables/{{shard}}/{local}");
        let replicated = if args.is_empty() {
            format!("Replicated{engine}('{zk_path}', '{{replica}}')")
        } else {
            format!("Replicated{engine}('{zk_path}', '{{replica}}', {args})")
        };
        self.client
            .query(&format!(
                "CREATE TABLE IF NOT EXISTS {local} ON CLUSTER {cluster} ({}) ENGINE = {replicated} {}",
                d.columns, d.rest
            ))
            .execute()
            .await?;
        if let Some(expr) = d.deliberate {
            self.add_deliberate_column(&local, expr).await?;
        }
        // The Distributed table only describes the local ones, and 18.16 refuses `ALTER … ON
        // CLUSTER` on it when the shards replicate internally ("isn't replicated, but shard #1
        // is replicated according to its cluster definition"). So it is created with every
        // column, and one that lacks a column (made by an older version) is dropped and made
        // again; it holds no rows (inserts are synchronous), so nothing is lost.
        let columns = match d.deliberate {
            None => d.columns.to_string(),
            Some(expr) => format!("{}, deliberate UInt8 DEFAULT {expr}", d.columns),
        };
        if d.deliberate.is_some()
            && self.table_exists(d.name).await?
            && !self.has_deliberate(d.name).await?
        {
            self.client
                .query(&format!(
                    "DROP TABLE IF EXISTS {} ON CLUSTER {cluster}",
                    d.name
                ))
                .execute()
                .await?;
        }
        let bare_local = local.rsplit('.').next().unwrap_or(&local);
        self.client
            .query(&format!(
                "CREATE TABLE IF NOT EXISTS {} ON CLUSTER {cluster} ({columns}) \
                 ENGINE = Distributed({cluster}, {}, {bare_local}, {})",
                d.name, self.database, d.shard_key
            ))
            .execute()
            .await?;
        Ok(())
    }

    pub(super) async fn table_exists(&self, t: &str) -> Result<bool, StoreError> {
        let bare = t.rsplit('.').next().unwrap_or(t);
        let n: u64 = self
            .client
            .query("SELECT count() FROM system.tables WHERE database = ? AND name = ?")
            .bind(self.database.as_str())
            .bind(bare)
            .fetch_one()
            .await?;
        Ok(n > 0)
    }

    pub(super) async fn has_deliberate(&self, t: &str) -> Result<bool, StoreError> {
        let bare = t.rsplit('.').next().unwrap_or(t);
        let n: u64 = self
            .client
            .query(
                "SELECT count() FROM system.columns WHERE database = ? AND table = ? AND name = 'deliberate'",
            )
            .bind(self.database.as_str())
            .bind(bare)
            .fetch_one()
            .await?;
        Ok(n > 0)
    }

    /// Deliberate refusals (docs/SLO.md "Deliberate refusals"): a `deliberate UInt8` column on
    /// spans and failures whose DEFAULT reads the attribute arrays, so rows of older parts get
    /// it computed on read and inserts (which name their columns) need no change. 18.16 has no
    /// `ADD COLUMN IF NOT EXISTS`: `system.columns` is asked first. On a cluster `t` is the
    /// local table and the ALTER runs `ON CLUSTER` (once per shard, replicated from there).
    pub(super) async fn add_deliberate_column(
        &self,
        t: &str,
        expr: &str,
    ) -> Result<(), StoreError> {
        if !self.has_deliberate(t).await? {
            self.client
                .query(&format!(
                    "ALTER TABLE {t}{} ADD COLUMN deliberate UInt8 DEFAULT {expr}",
                    self.on_cluster()
                ))
                .execute()
                .await?;
        }
        Ok(())
    }

    pub(super) async fn ensure_migrated(&self) -> Result<(), StoreError> {
        if !self.migrated.load(std::sync::atomic::Ordering::Acquire) {
            self.migrate().await?;
        }
        Ok(())
    }
}
