//! The ClickHouse store on a real cluster (`storage.clickhouse_cluster`): ZooKeeper and two
//! clickhouse-server processes, 2 shards × 1 replica, started by
//! `brownout_test_support::clickhouse_cluster` with every file in a temp dir and killed by PID.
//! Rows spread over both shards, each is read exactly once through the Distributed tables
//! (from either node), replays do not double them, SLI counts and failure pages are whole, and
//! retention empties every shard. Says SKIPPED when zookeeper, java or clickhouse-server is not
//! installed (scripts/test.sh installs them).

use std::collections::{BTreeMap, BTreeSet};

use brownout::config::ClickHouseConfig;
use brownout::store::clickhouse::ClickHouseStore;
use brownout::store::{
    Batch, CountQuery, FailureCursor, FailureQuery, FailureRow, SpanRow, Store, WriteMode,
};
use brownout_protocol::{Category, Criticality, FailureEvent};
use brownout_test_support::clickhouse_cluster::ClickHouseCluster;
use brownout_test_support::unique;

/// 2026-11-30T00:00:00Z
const T0: u64 = 1_795_996_800_000;
const TRACES: u64 = 120;
const FAILURES: u64 = 60;

fn span(trace: u64, n: u64, start_ms: u64, error: bool, deliberate: bool) -> SpanRow {
    let mut attributes = vec![("service.name".to_string(), "muse".to_string())];
    if deliberate {
        attributes.push(("brownout.deliberate".into(), "true".into()));
    }
    SpanRow {
        trace_id: format!("{trace:032x}"),
        span_id: format!("{:016x}", trace * 10 + n),
        parent_span_id: if n == 0 {
            String::new()
        } else {
            format!("{:016x}", trace * 10)
        },
        service: "muse".into(),
        name: format!("op{n}"),
        kind: if n == 0 { 2 } else { 1 },
        start_us: start_ms * 1000 + n,
        duration_us: 5_000,
        status: if error { 2 } else { 1 },
        status_message: String::new(),
        feature: "chat".into(),
        criticality: "default".into(),
        host: "gpu-1".into(),
        is_request: n == 0,
        attributes,
    }
}

fn failure(i: u64) -> FailureRow {
    FailureRow {
        id: format!("f{i:04}"),
        pattern: format!("p{}", i % 3),
        event: FailureEvent {
            ts_ms: T0 + 1_000 + i * 10,
            service: "muse".into(),
            host: "gpu-1".into(),
            request_id: format!("req-{i}"),
            // Most failures carry no trace id: they must spread all the same.
            trace_id: String::new(),
            user_id: "u1".into(),
            feature: "chat".into(),
            criticality: Criticality::Default,
            category: Category::TimeoutNetwork,
            error_type: "Timeout".into(),
            message: format!("failure {i}"),
            latency_ms: 30.0,
            attributes: BTreeMap::new(),
        },
    }
}

async fn scalar(node: &str, sql: &str) -> u64 {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let r = reqwest::Client::new()
        .post(node)
        .body(sql.to_string())
        .send()
        .await
        .unwrap_or_else(|e| panic!("{node}: {e}"));
    let status = r.status();
    let text = r.text().await.unwrap();
    assert!(status.is_success(), "{node}: {sql}: {text}");
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("{node}: {sql}: {text:?}"))
}

pub(crate) fn store_on(node: &str, prefix: &str) -> ClickHouseStore {
    ClickHouseStore::new(&ClickHouseConfig {
        url: node.to_string(),
        database: "default".into(),
        user: None,
        password: None,
        table_prefix: prefix.to_string(),
        cluster: Some(ClickHouseCluster::NAME.into()),
        tls: None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shards_hold_the_rows_and_distributed_reads_return_each_once() {
    let Some(cluster) = tokio::task::spawn_blocking(|| {
        ClickHouseCluster::start_or_skip(
            "store_cluster::two_shards_hold_the_rows_and_distributed_reads_return_each_once",
        )
    })
    .await
    .unwrap() else {
        return;
    };
    let prefix = format!("{}_", unique("chc_"));
    let (n1, n2) = (cluster.nodes[0].as_str(), cluster.nodes[1].as_str());
    let store = store_on(n1, &prefix);
    if let Err(e) = store.migrate().await {
        panic!("ON CLUSTER migration: {e}\n{}", cluster.log_tails());
    }
    if let Err(e) = store.migrate().await {
        panic!(
            "a second migration finds every table and column: {e}\n{}",
            cluster.log_tails()
        );
    }

    // Each trace: a root request span and one child. Every 4th request failed, every 10th
    // was refused on purpose (neither good nor bad).
    let mut batch = Batch::new();
    for t in 0..TRACES {
        let start = T0 + t * 100;
        let deliberate = t % 10 == 9;
        batch
            .spans
            .push(span(t, 0, start, t % 4 == 0 && !deliberate, deliberate));
        batch.spans.push(span(t, 1, start + 1, false, false));
    }
    batch.failures = (0..FAILURES).map(failure).collect();
    store.write_batch(&batch, WriteMode::Fresh).await.unwrap();
    // The answer was "lost": the spool replays the batch, twice even.
    store.write_batch(&batch, WriteMode::Replay).await.unwrap();
    store.write_batch(&batch, WriteMode::Replay).await.unwrap();

    // Spread: both shards hold rows, and together exactly the rows written.
    for (table, want) in [
        (store.spans_table(), 2 * TRACES),
        (store.failures_table(), FAILURES),
    ] {
        let local = store.local_table(table);
        let a = scalar(n1, &format!("SELECT count() FROM {local}")).await;
        let b = scalar(n2, &format!("SELECT count() FROM {local}")).await;
        eprintln!("{local}: shard 1 holds {a} rows, shard 2 {b}");
        assert!(a > 0 && b > 0, "{local}: rows on both shards: {a} + {b}");
        assert_eq!(a + b, want, "{local}: every row once over the shards");
    }

    // Reads through the Distributed tables, from either node: each row exactly once.
    let other = store_on(n2, &prefix);
    for (who, s) in [("node 1", &store), ("node 2", &other)] {
        let c = s.count_rows().await.unwrap();
        assert_eq!(
            (c.spans, c.failures),
            (2 * TRACES, FAILURES),
            "{who}: counts"
        );
        let t = s.trace(&format!("{:032x}", 7)).await.unwrap();
        assert_eq!(t.len(), 2, "{who}: a trace's spans, once each");
        assert_eq!(t[0], batch.spans[14], "{who}: every field round-trips");
    }
    let uniq = scalar(
        n2,
        &format!("SELECT uniqExact(span_id) FROM {}", store.spans_table()),
    )
    .await;
    assert_eq!(uniq, 2 * TRACES);

    // SLI counts: one minute bucket holds every request once.
    let counts = other
        .request_counts(&CountQuery {
            since_ms: T0,
            until_ms: T0 + 60_000,
            bucket_ms: 60_000,
            service: None,
            latency_threshold_ms: None,
        })
        .await
        .unwrap();
    assert_eq!(counts.len(), 1, "{counts:?}");
    let refused = TRACES / 10;
    let bad = (0..TRACES).filter(|t| t % 4 == 0 && t % 10 != 9).count() as u64;
    assert_eq!(
        (counts[0].good, counts[0].total, counts[0].refused),
        (TRACES - refused - bad, TRACES - refused, refused),
        "{counts:?}"
    );

    // Failure pages through the Distributed table: every event once, newest first.
    let mut seen = Vec::new();
    let mut cursor: Option<FailureCursor> = None;
    loop {
        let page = store
            .failures(&FailureQuery {
                since_ms: T0,
                until_ms: T0 + 3_600_000,
                limit: 7,
                cursor: cursor.clone(),
                ..FailureQuery::default()
            })
            .await
            .unwrap();
        seen.extend(page.items.iter().map(|f| f.id.clone()));
        match page.next_cursor {
            Some(c) => cursor = Some(FailureCursor::decode(&c).expect("cursor")),
            None => break,
        }
    }
    let mut want: Vec<String> = batch.failures.iter().map(|f| f.id.clone()).collect();
    want.reverse();
    assert_eq!(seen, want, "each failure once, newest first");
    let p1 = store
        .failures(&FailureQuery {
            since_ms: T0,
            until_ms: T0 + 3_600_000,
            pattern: Some("p1".into()),
            limit: 1000,
            ..FailureQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(p1.items.len() as u64, FAILURES / 3);

    // Documents: the latest version wins, read from the other node.
    for v in 0..3 {
        store
            .put_doc("policy", "k", &serde_json::json!({ "v": v }))
            .await
            .unwrap();
    }
    let d = other.get_doc("policy", "k").await.unwrap().expect("doc");
    assert_eq!(d.value, serde_json::json!({ "v": 2 }));

    // Retention: every day before the cutoff goes, on every shard.
    let dropped = store.drop_before(T0 + 2 * 86_400_000).await.unwrap();
    assert!(dropped >= 2, "spans and failures partitions: {dropped}");
    let c = other.count_rows().await.unwrap();
    assert_eq!((c.spans, c.failures), (0, 0));
    let mut shards = BTreeSet::new();
    for n in [n1, n2] {
        shards.insert(
            scalar(
                n,
                &format!(
                    "SELECT count() FROM {}",
                    store.local_table(store.spans_table())
                ),
            )
            .await,
        );
    }
    assert_eq!(shards, BTreeSet::from([0]));

    store.drop_tables().await.unwrap();
    let left = scalar(
        n2,
        &format!(
            "SELECT count() FROM system.tables WHERE database = 'default' AND name LIKE '{prefix}%'"
        ),
    )
    .await;
    assert_eq!(left, 0, "drop_tables removes every table on every host");
    drop(cluster);
}
