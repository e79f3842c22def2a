//! Stored SLI buckets (docs/SLO.md "Stored SLI buckets") against the real stores — SQLite in a
//! temp dir, ClickHouse (`CLICKHOUSE_TEST_URL`, or a server of our own) on one node and, when
//! the binaries are there, the test harness's two-shard cluster: a batch's SLI rows are summed
//! per SLO and minute, written again (a replay) they are not counted twice, two batches with
//! equal rows are both counted, minutes read back by the hour add up, and retention keeps the
//! buckets longer than the raw rows.

use std::sync::Arc;

use brownout::store::clickhouse::ClickHouseStore;
use brownout::store::sqlite::SqliteStore;
use brownout::store::{
    Batch, SLI_RETENTION_MS, SliBucket, SliCounts, SliRow, Store, StoreError, WriteMode,
};
use brownout_protocol::now_ms;

const MIN: u64 = 60_000;
const HOUR: u64 = 60 * MIN;
const DAY: u64 = 24 * HOUR;

fn counts(good: u64, total: u64, refused: u64) -> SliCounts {
    SliCounts {
        good,
        total,
        refused,
    }
}

fn batch(id: u64, rows: &[(&str, u64, SliCounts)]) -> Arc<Batch> {
    Arc::new(Batch {
        id,
        sli: rows
            .iter()
            .map(|(slo, minute_ms, c)| SliRow {
                slo: (*slo).to_string(),
                minute_ms: *minute_ms,
                counts: *c,
            })
            .collect(),
        // A batch always carries the rows its SLI counts come from: one snapshot will do.
        snapshots: vec![brownout_protocol::AgentSnapshot {
            host: format!("h{id}"),
            ts_ms: rows.first().map_or(0, |r| r.1),
            ..Default::default()
        }],
        ..Batch::default()
    })
}

fn bucket(slo: &str, start_ms: u64, first_ms: u64, c: SliCounts) -> SliBucket {
    SliBucket {
        slo: slo.into(),
        start_ms,
        first_ms,
        counts: c,
    }
}

/// What every store must do with SLI rows.
async fn sums_each_acknowledged_batch_once(store: &dyn Store) {
    // Two hours ago, minute-aligned (inside every retention).
    let now = now_ms();
    let t0 = now - now % HOUR - 2 * HOUR;
    let b1 = batch(
        101,
        &[
            ("chat-availability", t0, counts(90, 100, 5)),
            ("chat-availability", t0 + MIN, counts(10, 20, 0)),
            ("chat-latency", t0, counts(1, 1, 0)),
        ],
    );
    // b2 and b3: equal rows in two batches; both count (a replicated table's insert
    // deduplication must not take them for one).
    let b2 = batch(102, &[("chat-availability", t0, counts(9, 10, 1))]);
    let b3 = batch(103, &[("chat-availability", t0, counts(9, 10, 1))]);
    for b in [&b1, &b2, &b3] {
        store
            .write_shared(Arc::clone(b), WriteMode::Fresh)
            .await
            .unwrap();
    }
    // Replays (a crash between the store write and the spool's commit): counted once.
    store
        .write_merged(vec![
            (Arc::clone(&b1), WriteMode::Replay),
            (Arc::clone(&b2), WriteMode::Replay),
        ])
        .await
        .unwrap();
    store
        .write_shared(Arc::clone(&b3), WriteMode::Replay)
        .await
        .unwrap();

    let minutes = store.sli_buckets(t0, t0 + 2 * MIN, MIN).await.unwrap();
    assert_eq!(
        minutes,
        vec![
            bucket("chat-availability", t0, t0, counts(108, 120, 7)),
            bucket("chat-latency", t0, t0, counts(1, 1, 0)),
            bucket("chat-availability", t0 + MIN, t0 + MIN, counts(10, 20, 0)),
        ],
        "per SLO and minute, each batch once"
    );
    let hours = store.sli_buckets(t0, t0 + HOUR, HOUR).await.unwrap();
    assert_eq!(
        hours,
        vec![
            bucket("chat-availability", t0, t0, counts(118, 140, 7)),
            bucket("chat-latency", t0, t0, counts(1, 1, 0)),
        ],
        "read by the hour, with the first minute that has counts"
    );
    let later = store.sli_buckets(t0 + MIN, t0 + HOUR, HOUR).await.unwrap();
    assert_eq!(
        later,
        vec![bucket("chat-availability", t0, t0 + MIN, counts(10, 20, 0))],
        "from is inclusive, by minute"
    );
    assert!(
        store
            .sli_buckets(t0 + 2 * MIN, t0 + HOUR, MIN)
            .await
            .unwrap()
            .is_empty()
    );
    match store.sli_buckets(t0, t0 + HOUR, 1_000).await {
        Err(StoreError::BadQuery(m)) => assert!(m.contains("whole number of minutes"), "{m}"),
        other => panic!("a bucket of a second must be refused, got {other:?}"),
    }
}

/// Retention: raw rows go with their day, the buckets stay for [`SLI_RETENTION_MS`].
async fn buckets_outlive_the_raw_rows(store: &dyn Store) {
    let now = now_ms();
    let recent = now - now % MIN - 2 * DAY;
    let old = now - now % MIN - SLI_RETENTION_MS - 3 * DAY;
    for (id, t) in [(201, recent), (202, old)] {
        store
            .write_shared(
                batch(id, &[("chat-availability", t, counts(1, 2, 0))]),
                WriteMode::Fresh,
            )
            .await
            .unwrap();
    }
    store.drop_before(now - DAY).await.unwrap();
    let left = store
        .sli_buckets(old - DAY, now + DAY, MIN)
        .await
        .unwrap()
        .into_iter()
        .filter(|b| b.start_ms == recent || b.start_ms == old)
        .map(|b| b.start_ms)
        .collect::<Vec<_>>();
    assert_eq!(
        left,
        vec![recent],
        "a bucket older than the raw cutoff stays; one older than the SLI retention goes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_sums_sli_buckets_once_and_keeps_them_past_raw_retention() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("b.sqlite")).unwrap();
    store.migrate().await.unwrap();
    sums_each_acknowledged_batch_once(&store).await;
    buckets_outlive_the_raw_rows(&store).await;
    // Reopened (a restart): the buckets are on disk.
    drop(store);
    let again = SqliteStore::open(&dir.path().join("b.sqlite")).unwrap();
    let now = now_ms();
    let t0 = now - now % HOUR - 2 * HOUR;
    let b = again.sli_buckets(t0, t0 + HOUR, HOUR).await.unwrap();
    assert_eq!(b[0].counts, counts(118, 140, 7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clickhouse_sums_sli_buckets_once_and_keeps_them_past_raw_retention() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tmp = tempfile::tempdir().unwrap();
    let (cfg, _own) = crate::ingest_spool_clickhouse::clickhouse_for_test(tmp.path(), "sli").await;
    let store = ClickHouseStore::new(&cfg);
    store.migrate().await.unwrap();
    sums_each_acknowledged_batch_once(&store).await;
    buckets_outlive_the_raw_rows(&store).await;
    // Merged parts sum to the same (SummingMergeTree): force the merge and read again.
    let now = now_ms();
    let t0 = now - now % HOUR - 2 * HOUR;
    let _ = reqwest::Client::new()
        .post(&cfg.url)
        .body(format!(
            "OPTIMIZE TABLE {}sli_buckets FINAL",
            cfg.table_prefix
        ))
        .send()
        .await
        .unwrap()
        .error_for_status()
        .unwrap();
    let b = store.sli_buckets(t0, t0 + HOUR, HOUR).await.unwrap();
    assert_eq!(b[0].counts, counts(118, 140, 7));
    store.drop_tables().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clickhouse_cluster_sums_sli_buckets_once() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let Some(cluster) = tokio::task::spawn_blocking(|| {
        brownout_test_support::clickhouse_cluster::ClickHouseCluster::start_or_skip(
            "store_sli::clickhouse_cluster_sums_sli_buckets_once",
        )
    })
    .await
    .unwrap() else {
        return;
    };
    let prefix = format!("{}_", brownout_test_support::unique("chsli_"));
    let store = crate::store_cluster::store_on(&cluster.nodes[0], &prefix);
    if let Err(e) = store.migrate().await {
        panic!("ON CLUSTER migration: {e}\n{}", cluster.log_tails());
    }
    sums_each_acknowledged_batch_once(&store).await;
    // Read from the other node: the same buckets through its Distributed table.
    let other = crate::store_cluster::store_on(&cluster.nodes[1], &prefix);
    let now = now_ms();
    let t0 = now - now % HOUR - 2 * HOUR;
    let b = other.sli_buckets(t0, t0 + HOUR, HOUR).await.unwrap();
    assert_eq!(b[0].counts, counts(118, 140, 7));
    store.drop_tables().await.unwrap();
}
