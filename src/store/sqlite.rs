//! The embedded store: one SQLite file (WAL mode) with a writer and a reader connection, each
//! behind a mutex and used from `spawn_blocking`.
//!
//! A batch is written in one transaction together with its id in `batches`, so writing the same
//! batch twice is a no-op: exactly-once by construction.

use std::path::Path;
use std::sync::{Arc, Mutex};

use brownout_protocol::{AgentSnapshot, Category, Criticality, FailureEvent};
use rusqlite::{Connection, OptionalExtension, params, params_from_iter};

use super::{
    Batch, CountQuery, Doc, FailureCursor, FailurePage, FailureQuery, FailureRow, RequestCount,
    RowCounts, SliBucket, SliCounts, SpanRow, Store, StoreError, StoreFuture, WriteMode,
    attrs_from_json, attrs_to_json, check_sli_bucket, doc_from_json, doc_version_us, sli_cutoff_ms,
    snapshots_from_json,
};

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS batches (id INTEGER PRIMARY KEY, written_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS spans (
  trace_id TEXT NOT NULL, span_id TEXT NOT NULL, parent_span_id TEXT NOT NULL,
  service TEXT NOT NULL, name TEXT NOT NULL, kind INTEGER NOT NULL,
  start_us INTEGER NOT NULL, duration_us INTEGER NOT NULL,
  status INTEGER NOT NULL, status_message TEXT NOT NULL,
  feature TEXT NOT NULL, criticality TEXT NOT NULL, host TEXT NOT NULL,
  is_request INTEGER NOT NULL, attrs TEXT NOT NULL, batch_id INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS spans_trace ON spans(trace_id);
CREATE INDEX IF NOT EXISTS spans_requests ON spans(is_request, start_us);
CREATE TABLE IF NOT EXISTS logs (
  ts_us INTEGER NOT NULL, trace_id TEXT NOT NULL, span_id TEXT NOT NULL,
  service TEXT NOT NULL, host TEXT NOT NULL, severity_number INTEGER NOT NULL,
  severity_text TEXT NOT NULL, body TEXT NOT NULL, attrs TEXT NOT NULL, batch_id INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS logs_ts ON logs(ts_us);
CREATE TABLE IF NOT EXISTS failures (
  id TEXT NOT NULL, ts_ms INTEGER NOT NULL, service TEXT NOT NULL, host TEXT NOT NULL,
  request_id TEXT NOT NULL, trace_id TEXT NOT NULL, user_id TEXT NOT NULL, feature TEXT NOT NULL,
  criticality TEXT NOT NULL, category TEXT NOT NULL, error_type TEXT NOT NULL, message TEXT NOT NULL,
  latency_ms REAL NOT NULL, pattern TEXT NOT NULL, attrs TEXT NOT NULL, batch_id INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS failures_ts ON failures(ts_ms, id);
CREATE TABLE IF NOT EXISTS snapshots (
  host TEXT NOT NULL, ts_ms INTEGER NOT NULL, json TEXT NOT NULL, batch_id INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS snapshots_host_ts ON snapshots(host, ts_ms);
CREATE INDEX IF NOT EXISTS snapshots_ts ON snapshots(ts_ms);
CREATE TABLE IF NOT EXISTS sli_buckets (
  slo TEXT NOT NULL, minute_ms INTEGER NOT NULL,
  good INTEGER NOT NULL, total INTEGER NOT NULL, refused INTEGER NOT NULL,
  PRIMARY KEY (slo, minute_ms)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS docs (
  kind TEXT NOT NULL, key TEXT NOT NULL, version_us INTEGER NOT NULL, json TEXT NOT NULL,
  PRIMARY KEY (kind, key)
);
"#;

/// Deliberate refusals (docs/SLO.md "Deliberate refusals"), as virtual generated columns read from
/// the stored attributes: existing rows of an older database get them without a rewrite, and the
/// positional inserts stay as they are (generated columns take no value).
const DELIBERATE_COLUMNS: [(&str, &str); 2] = [
    (
        "spans",
        "ALTER TABLE spans ADD COLUMN deliberate INTEGER GENERATED ALWAYS AS \
         (coalesce(json_extract(attrs, '$.\"brownout.deliberate\"'), '') = 'true') VIRTUAL",
    ),
    (
        "failures",
        "ALTER TABLE failures ADD COLUMN deliberate INTEGER GENERATED ALWAYS AS \
         (coalesce(json_extract(attrs, '$.deliberate'), '') = 'true' \
          OR coalesce(json_extract(attrs, '$.\"brownout.deliberate\"'), '') = 'true') VIRTUAL",
    ),
];

/// Creates the tables, then adds the columns a database made by an older version lacks.
fn migrate_schema(c: &Connection) -> Result<(), rusqlite::Error> {
    c.execute_batch(SCHEMA)?;
    for (table, ddl) in DELIBERATE_COLUMNS {
        let has: bool = c.query_row(
            &format!(
                "SELECT count(*) FROM pragma_table_xinfo('{table}') WHERE name = 'deliberate'"
            ),
            [],
            |r| r.get::<_, i64>(0).map(|n| n > 0),
        )?;
        if !has {
            c.execute_batch(ddl)?;
        }
    }
    Ok(())
}

/// The embedded SQLite store.
pub struct SqliteStore {
    writer: Arc<Mutex<Connection>>,
    reader: Arc<Mutex<Connection>>,
}

fn configure(c: &Connection) -> Result<(), rusqlite::Error> {
    c.pragma_update(None, "journal_mode", "WAL")?;
    // FULL: a commit is fsync'ed before it returns, so an acknowledged batch survives a power
    // loss, not only a crash of the process (ingest acknowledges after the commit).
    c.pragma_update(None, "synchronous", "FULL")?;
    c.busy_timeout(std::time::Duration::from_secs(10))?;
    Ok(())
}

/// Page cache of the writer connection, KiB (SQLite's default is 2 000 KiB: less than one
/// group commit of a few thousand spans, whose pages then spill to the WAL mid-transaction and
/// are read back; measured in docs/BENCHMARKS.md "Ingest").
pub const WRITER_CACHE_KIB: i64 = 32 << 10;

/// WAL pages before the writer checkpoints (SQLite's default is 1 000, about one group commit:
/// a checkpoint in nearly every commit, copying the same hot index pages each time).
pub const WAL_AUTOCHECKPOINT_PAGES: i64 = 8192;

impl SqliteStore {
    /// Opens (creating) the database file.
    ///
    /// # Errors
    /// When the file cannot be opened.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let w = Connection::open(path)?;
        configure(&w)?;
        w.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)?;
        w.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)?;
        migrate_schema(&w)?;
        let r = Connection::open(path)?;
        configure(&r)?;
        Ok(SqliteStore {
            writer: Arc::new(Mutex::new(w)),
            reader: Arc::new(Mutex::new(r)),
        })
    }

    fn with<T: Send + 'static>(
        conn: &Arc<Mutex<Connection>>,
        f: impl FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    ) -> StoreFuture<'static, T> {
        let conn = Arc::clone(conn);
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let mut guard = conn
                    .lock()
                    .map_err(|_| StoreError::Join("sqlite connection mutex poisoned".into()))?;
                f(&mut guard)
            })
            .await
            .map_err(|e| StoreError::Join(e.to_string()))?
        })
    }
}

fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn write_batch_tx(c: &mut Connection, b: &Batch) -> Result<(), StoreError> {
    let tx = c.transaction()?;
    let fresh = tx.execute(
        "INSERT OR IGNORE INTO batches (id, written_ms) VALUES (?1, ?2)",
        params![i(b.id), i(brownout_protocol::now_ms())],
    )?;
    if fresh == 0 {
        // Already written (a replay after a crash between write and spool commit).
        return Ok(());
    }
    {
        let mut st = tx.prepare_cached(
            "INSERT INTO spans VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16)",
        )?;
        for s in &b.spans {
            st.execute(params![
                s.trace_id,
                s.span_id,
                s.parent_span_id,
                s.service,
                s.name,
                s.kind,
                i(s.start_us),
                i(s.duration_us),
                s.status,
                s.status_message,
                s.feature,
                s.criticality,
                s.host,
                s.is_request,
                attrs_to_json(&s.attributes),
                i(b.id)
            ])?;
        }
        let mut st =
            tx.prepare_cached("INSERT INTO logs VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10)")?;
        for l in &b.logs {
            st.execute(params![
                i(l.ts_us),
                l.trace_id,
                l.span_id,
                l.service,
                l.host,
                l.severity_number,
                l.severity_text,
                l.body,
                attrs_to_json(&l.attributes),
                i(b.id)
            ])?;
        }
        let mut st = tx.prepare_cached(
            "INSERT INTO failures VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16)",
        )?;
        for f in &b.failures {
            let e = &f.event;
            let attrs: Vec<(String, String)> = e
                .attributes
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            st.execute(params![
                f.id,
                i(e.ts_ms),
                e.service,
                e.host,
                e.request_id,
                e.trace_id,
                e.user_id,
                e.feature,
                e.criticality.as_str(),
                e.category.as_str(),
                e.error_type,
                e.message,
                e.latency_ms,
                f.pattern,
                attrs_to_json(&attrs),
                i(b.id)
            ])?;
        }
        let mut st = tx.prepare_cached("INSERT INTO snapshots VALUES (?1,?2,?3,?4)")?;
        for s in &b.snapshots {
            let json = serde_json::to_string(s).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            st.execute(params![s.host, i(s.ts_ms), json, i(b.id)])?;
        }
        // SLI buckets: summed in place, in the batch's transaction (counted once with it).
        let mut st = tx.prepare_cached(
            "INSERT INTO sli_buckets VALUES (?1,?2,?3,?4,?5) ON CONFLICT (slo, minute_ms) DO UPDATE \
             SET good = good + excluded.good, total = total + excluded.total, \
             refused = refused + excluded.refused",
        )?;
        for r in &b.sli {
            st.execute(params![
                r.slo,
                i(r.minute_ms),
                i(r.counts.good),
                i(r.counts.total),
                i(r.counts.refused)
            ])?;
        }
    }
    tx.commit()?;
    Ok(())
}

fn span_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SpanRow> {
    Ok(SpanRow {
        trace_id: r.get(0)?,
        span_id: r.get(1)?,
        parent_span_id: r.get(2)?,
        service: r.get(3)?,
        name: r.get(4)?,
        kind: r.get(5)?,
        start_us: u(r.get(6)?),
        duration_us: u(r.get(7)?),
        status: r.get(8)?,
        status_message: r.get(9)?,
        feature: r.get(10)?,
        criticality: r.get(11)?,
        host: r.get(12)?,
        is_request: r.get(13)?,
        attributes: attrs_from_json(&r.get::<_, String>(14)?),
    })
}

fn failure_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<FailureRow> {
    let criticality: String = r.get(8)?;
    let category: String = r.get(9)?;
    let attrs: String = r.get(14)?;
    Ok(FailureRow {
        id: r.get(0)?,
        pattern: r.get(13)?,
        event: FailureEvent {
            ts_ms: u(r.get(1)?),
            service: r.get(2)?,
            host: r.get(3)?,
            request_id: r.get(4)?,
            trace_id: r.get(5)?,
            user_id: r.get(6)?,
            feature: r.get(7)?,
            criticality: Criticality::parse(&criticality).unwrap_or_default(),
            category: Category::parse(&category).unwrap_or(Category::Other),
            error_type: r.get(10)?,
            message: r.get(11)?,
            latency_ms: r.get(12)?,
            attributes: attrs_from_json(&attrs).into_iter().collect(),
        },
    })
}

impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    fn migrate(&self) -> StoreFuture<'_, ()> {
        SqliteStore::with(&self.writer, |c| Ok(migrate_schema(c)?))
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        SqliteStore::with(&self.reader, |c| {
            Ok(c.query_row("SELECT 1", [], |_| Ok(()))?)
        })
    }

    fn write_batch<'a>(&'a self, batch: &'a Batch, mode: WriteMode) -> StoreFuture<'a, ()> {
        // spawn_blocking needs 'static: a borrowed batch is copied (ingest uses write_shared).
        self.write_shared(Arc::new(batch.clone()), mode)
    }

    fn write_shared(&self, batch: Arc<Batch>, _mode: WriteMode) -> StoreFuture<'_, ()> {
        // SQLite is always idempotent (the batches table), so both modes are the same.
        SqliteStore::with(&self.writer, move |c| write_batch_tx(c, &batch))
    }

    fn trace<'a>(&'a self, trace_id: &'a str) -> StoreFuture<'a, Vec<SpanRow>> {
        let t = trace_id.to_ascii_lowercase();
        SqliteStore::with(&self.reader, move |c| {
            let mut st = c.prepare_cached(
                "SELECT trace_id, span_id, parent_span_id, service, name, kind, start_us, duration_us, status,
                        status_message, feature, criticality, host, is_request, attrs
                 FROM spans WHERE trace_id = ?1 ORDER BY start_us, span_id",
            )?;
            let rows = st
                .query_map([t], span_from_row)?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
    }

    fn failures<'a>(&'a self, q: &'a FailureQuery) -> StoreFuture<'a, FailurePage> {
        let q = q.clone();
        SqliteStore::with(&self.reader, move |c| {
            let mut sql = String::from(
                "SELECT id, ts_ms, service, host, request_id, trace_id, user_id, feature, criticality, category,
                        error_type, message, latency_ms, pattern, attrs
                 FROM failures WHERE ts_ms >= ? AND ts_ms < ?",
            );
            let mut args: Vec<rusqlite::types::Value> =
                vec![i(q.since_ms).into(), i(q.until_ms).into()];
            args.extend(q.push_conditions(&mut sql).into_iter().map(Into::into));
            if let Some(cur) = &q.cursor {
                args.push(i(cur.ts_ms).into());
                args.push(i(cur.ts_ms).into());
                args.push(cur.id.clone().into());
            }
            let mut st = c.prepare(&sql)?;
            let mut items = st
                .query_map(params_from_iter(args), failure_from_row)?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(page(&mut items, q.page_size()))
        })
    }

    fn logs<'a>(&'a self, q: &'a super::LogQuery) -> StoreFuture<'a, super::LogPage> {
        let q = q.clone();
        SqliteStore::with(&self.reader, move |c| search_logs(c, &q))
    }

    fn request_counts<'a>(&'a self, q: &'a CountQuery) -> StoreFuture<'a, Vec<RequestCount>> {
        let q = q.clone();
        SqliteStore::with(&self.reader, move |c| {
            if q.bucket_ms == 0 {
                return Err(StoreError::BadQuery("bucket_ms must be > 0".into()));
            }
            let bucket_us = i(q.bucket_ms.saturating_mul(1000));
            let threshold_us = q
                .latency_threshold_ms
                .map(|t| i(t.saturating_mul(1000)))
                .unwrap_or(i64::MAX);
            let mut sql = String::from(
                "SELECT (start_us / ?1) * ?1 / 1000 AS b, service, feature, criticality,
                        SUM(CASE WHEN deliberate = 0 AND status != 2 AND duration_us <= ?2 THEN 1 ELSE 0 END),
                        SUM(CASE WHEN deliberate = 0 THEN 1 ELSE 0 END), SUM(deliberate)
                 FROM spans WHERE is_request = 1 AND start_us >= ?3 AND start_us < ?4",
            );
            let mut args: Vec<rusqlite::types::Value> = vec![
                bucket_us.into(),
                threshold_us.into(),
                i(q.since_ms.saturating_mul(1000)).into(),
                i(q.until_ms.saturating_mul(1000)).into(),
            ];
            if let Some(s) = &q.service {
                sql.push_str(" AND service = ?5");
                args.push(s.clone().into());
            }
            sql.push_str(" GROUP BY b, service, feature, criticality ORDER BY b, service, feature, criticality");
            let mut st = c.prepare(&sql)?;
            let rows = st
                .query_map(params_from_iter(args), |r| {
                    Ok(RequestCount {
                        bucket_ms: u(r.get(0)?),
                        service: r.get(1)?,
                        feature: r.get(2)?,
                        criticality: r.get(3)?,
                        good: u(r.get(4)?),
                        total: u(r.get(5)?),
                        refused: u(r.get(6)?),
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
    }

    fn latest_snapshots(&self, since_ms: u64) -> StoreFuture<'_, Vec<AgentSnapshot>> {
        SqliteStore::with(&self.reader, move |c| {
            // SQLite returns the bare column from the row holding MAX().
            let mut st = c.prepare_cached(
                "SELECT host, json, MAX(ts_ms) FROM snapshots WHERE ts_ms >= ?1 GROUP BY host ORDER BY host",
            )?;
            let rows = st
                .query_map([i(since_ms)], |r| r.get::<_, String>(1))?
                .collect::<Result<Vec<_>, _>>()?;
            snapshots_from_json(&rows)
        })
    }

    fn put_doc<'a>(
        &'a self,
        kind: &'a str,
        key: &'a str,
        value: &'a serde_json::Value,
    ) -> StoreFuture<'a, ()> {
        let (kind, key, json) = (kind.to_string(), key.to_string(), value.to_string());
        SqliteStore::with(&self.writer, move |c| {
            c.execute(
                "INSERT INTO docs (kind, key, version_us, json) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT(kind, key) DO UPDATE SET version_us = excluded.version_us, json = excluded.json",
                params![kind, key, i(doc_version_us()), json],
            )?;
            Ok(())
        })
    }

    fn get_doc<'a>(&'a self, kind: &'a str, key: &'a str) -> StoreFuture<'a, Option<Doc>> {
        let (kind, key) = (kind.to_string(), key.to_string());
        SqliteStore::with(&self.reader, move |c| {
            let row = c
                .query_row(
                    "SELECT version_us, json FROM docs WHERE kind = ?1 AND key = ?2",
                    params![kind, key],
                    |r| Ok((u(r.get(0)?), r.get::<_, String>(1)?)),
                )
                .optional()?;
            row.map(|(v, j)| doc_from_json(kind, key, v, &j))
                .transpose()
        })
    }

    fn list_docs<'a>(&'a self, kind: &'a str, since_ms: u64) -> StoreFuture<'a, Vec<Doc>> {
        let kind = kind.to_string();
        SqliteStore::with(&self.reader, move |c| {
            let mut st = c.prepare_cached(
                "SELECT key, version_us, json FROM docs WHERE kind = ?1 AND version_us >= ?2 ORDER BY key",
            )?;
            let rows = st
                .query_map(params![kind, i(since_ms.saturating_mul(1000))], |r| {
                    Ok((r.get::<_, String>(0)?, u(r.get(1)?), r.get::<_, String>(2)?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter()
                .map(|(k, v, j)| doc_from_json(kind.clone(), k, v, &j))
                .collect()
        })
    }

    fn drop_before(&self, cutoff_ms: u64) -> StoreFuture<'_, u64> {
        // Same day granularity as ClickHouse's partitions: whole UTC days before cutoff's day.
        let day_start_ms = cutoff_ms - cutoff_ms % 86_400_000;
        SqliteStore::with(&self.writer, move |c| {
            let tx = c.transaction()?;
            let mut n = 0u64;
            n += tx.execute(
                "DELETE FROM spans WHERE start_us < ?1",
                [i(day_start_ms * 1000)],
            )? as u64;
            n += tx.execute(
                "DELETE FROM logs WHERE ts_us < ?1",
                [i(day_start_ms * 1000)],
            )? as u64;
            n += tx.execute("DELETE FROM failures WHERE ts_ms < ?1", [i(day_start_ms)])? as u64;
            n += tx.execute("DELETE FROM snapshots WHERE ts_ms < ?1", [i(day_start_ms)])? as u64;
            n += tx.execute(
                "DELETE FROM sli_buckets WHERE minute_ms < ?1",
                [i(sli_cutoff_ms(day_start_ms))],
            )? as u64;
            tx.commit()?;
            Ok(n)
        })
    }

    fn sli_buckets(
        &self,
        from_ms: u64,
        to_ms: u64,
        bucket_ms: u64,
    ) -> StoreFuture<'_, Vec<SliBucket>> {
        SqliteStore::with(&self.reader, move |c| {
            check_sli_bucket(bucket_ms)?;
            let mut st = c.prepare_cached(
                "SELECT slo, (minute_ms / ?1) * ?1 AS b, min(minute_ms), sum(good), sum(total), \
                 sum(refused) FROM sli_buckets WHERE minute_ms >= ?2 AND minute_ms < ?3 \
                 GROUP BY slo, b ORDER BY b, slo",
            )?;
            let rows = st
                .query_map(params![i(bucket_ms), i(from_ms), i(to_ms)], |r| {
                    Ok(SliBucket {
                        slo: r.get(0)?,
                        start_ms: u(r.get(1)?),
                        first_ms: u(r.get(2)?),
                        counts: SliCounts {
                            good: u(r.get(3)?),
                            total: u(r.get(4)?),
                            refused: u(r.get(5)?),
                        },
                    })
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
    }

    fn count_rows(&self) -> StoreFuture<'_, RowCounts> {
        SqliteStore::with(&self.reader, |c| {
            let n = |t: &str| -> Result<u64, StoreError> {
                Ok(u(c.query_row(
                    &format!("SELECT COUNT(*) FROM {t}"),
                    [],
                    |r| r.get(0),
                )?))
            };
            Ok(RowCounts {
                spans: n("spans")?,
                logs: n("logs")?,
                failures: n("failures")?,
                snapshots: n("snapshots")?,
            })
        })
    }
}

/// Trims a `limit + 1` result to `limit` and sets the cursor when more follow.
pub(crate) fn page(items: &mut Vec<FailureRow>, limit: usize) -> FailurePage {
    let more = items.len() > limit;
    items.truncate(limit);
    let next_cursor = if more {
        items.last().map(|l| {
            FailureCursor {
                ts_ms: l.event.ts_ms,
                id: l.id.clone(),
            }
            .encode()
        })
    } else {
        None
    };
    FailurePage {
        items: std::mem::take(items),
        next_cursor,
    }
}

// ---- log search (docs/API.md `GET /api/v1/logs`) ---------------------------------------------

/// [`Store::logs`]: newest first by `(ts_us, rowid)`, on the `logs_ts` index (which holds the
/// rowid, so the order and the cursor's condition need no sort of their own).
fn search_logs(c: &mut Connection, q: &super::LogQuery) -> Result<super::LogPage, StoreError> {
    q.check()?;
    let mut sql = String::from(
        "SELECT rowid, ts_us, trace_id, span_id, service, host, severity_number, severity_text, body, attrs
         FROM logs WHERE ts_us >= ? AND ts_us < ?",
    );
    let mut args: Vec<rusqlite::types::Value> = vec![
        i(q.since_ms.saturating_mul(1000)).into(),
        i(q.until_ms.saturating_mul(1000)).into(),
    ];
    args.extend(
        super::push_equals(&mut sql, &[("service", &q.service), ("host", &q.host)])
            .into_iter()
            .map(Into::into),
    );
    if q.min_severity > 0 {
        sql.push_str(" AND severity_number >= ?");
        args.push(i64::from(q.min_severity).into());
    }
    if let Some(t) = q.text.as_ref().filter(|t| !t.is_empty()) {
        sql.push_str(" AND instr(body, ?) > 0");
        args.push(t.clone().into());
    }
    if let Some(cur) = &q.cursor {
        // The first bound is a range the index seeks to: a later page does not scan the
        // earlier ones again.
        sql.push_str(" AND ts_us <= ? AND (ts_us < ? OR (ts_us = ? AND rowid < ?))");
        args.push(i(cur.ts_us).into());
        args.push(i(cur.ts_us).into());
        args.push(i(cur.ts_us).into());
        args.push(i(cur.id).into());
    }
    let limit = q.page_size();
    sql.push_str(&format!(
        " ORDER BY ts_us DESC, rowid DESC LIMIT {}",
        limit + 1
    ));
    let mut st = c.prepare_cached(&sql)?;
    let items = st
        .query_map(params_from_iter(args), |r| {
            let row = super::LogRow {
                ts_us: u(r.get(1)?),
                trace_id: r.get(2)?,
                span_id: r.get(3)?,
                service: r.get(4)?,
                host: r.get(5)?,
                severity_number: r.get(6)?,
                severity_text: r.get(7)?,
                body: r.get(8)?,
                attributes: attrs_from_json(&r.get::<_, String>(9)?),
            };
            Ok(super::LogHit::new(row, u(r.get(0)?), 0))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(super::logs::log_page(items, limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_writer_commits_with_fsync_a_large_cache_and_rare_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteStore::open(&dir.path().join("t.sqlite")).unwrap();
        let w = s.writer.lock().unwrap();
        let get = |p: &str| -> i64 {
            w.query_row(&format!("PRAGMA {p}"), [], |r| r.get(0))
                .unwrap()
        };
        assert_eq!(get("synchronous"), 2, "FULL: every commit is fsync'ed");
        assert_eq!(get("cache_size"), -WRITER_CACHE_KIB);
        assert_eq!(get("wal_autocheckpoint"), WAL_AUTOCHECKPOINT_PAGES);
        drop(w);
        // A batch written through the shared path is there once, also when written again.
        let b = Arc::new(Batch {
            id: 42,
            snapshots: vec![AgentSnapshot {
                host: "h".into(),
                ts_ms: 1,
                ..AgentSnapshot::default()
            }],
            ..Batch::default()
        });
        s.write_shared(Arc::clone(&b), WriteMode::Fresh)
            .await
            .unwrap();
        s.write_shared(b, WriteMode::Replay).await.unwrap();
        assert_eq!(s.count_rows().await.unwrap().snapshots, 1);
    }
}
