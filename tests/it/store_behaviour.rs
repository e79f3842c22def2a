//! The same behaviour tests against both store backends: embedded SQLite (a temp dir) and the
//! real ClickHouse (`CLICKHOUSE_TEST_URL`, default http://127.0.0.1:8123; tables with a unique
//! prefix per test, dropped at the end).

use std::collections::BTreeMap;
use std::sync::Arc;

use brownout::config::ClickHouseConfig;
use brownout::store::clickhouse::ClickHouseStore;
use brownout::store::sqlite::SqliteStore;
use brownout::store::{
    Batch, CountQuery, FailureCursor, FailureQuery, FailureRow, RequestCount, SpanRow, Store,
    WriteMode,
};
use brownout_protocol::{AgentSnapshot, Category, Criticality, FailureEvent};

const DAY_MS: u64 = 86_400_000;
/// 2026-11-30T00:00:00Z
const T0: u64 = 1_795_996_800_000;

/// A backend under test plus what must outlive it.
struct Backend {
    store: Arc<dyn Store>,
    ch: Option<Arc<ClickHouseStore>>,
    _dir: Option<tempfile::TempDir>,
}

impl Backend {
    async fn cleanup(self) {
        if let Some(ch) = self.ch {
            ch.drop_tables().await.expect("drop test tables");
        }
    }
}

async fn sqlite() -> Backend {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(&dir.path().join("t.sqlite")).unwrap();
    s.migrate().await.unwrap();
    Backend {
        store: Arc::new(s),
        ch: None,
        _dir: Some(dir),
    }
}

async fn clickhouse() -> Backend {
    let url =
        std::env::var("CLICKHOUSE_TEST_URL").unwrap_or_else(|_| "http://127.0.0.1:8123".into());
    let cfg = ClickHouseConfig {
        url: url.clone(),
        database: "default".into(),
        user: None,
        password: None,
        table_prefix: format!("t{}_", uuid::Uuid::new_v4().simple()),
        cluster: None,
        tls: None,
    };
    let s = Arc::new(ClickHouseStore::new(&cfg));
    if let Err(e) = s.ping().await {
        panic!(
            "ClickHouse is not answering at {url} ({e}). Start it with scripts/test.sh, or: clickhouse-server --config-file=/etc/clickhouse-server/config.xml (see docs/INGEST.md)"
        );
    }
    s.migrate().await.unwrap();
    Backend {
        store: s.clone(),
        ch: Some(s),
        _dir: None,
    }
}

#[allow(clippy::too_many_arguments)]
fn span(
    trace: u8,
    id: u8,
    parent: Option<u8>,
    start_ms: u64,
    dur_ms: u64,
    status: u8,
    feature: &str,
    crit: &str,
) -> SpanRow {
    SpanRow {
        trace_id: hex::encode([trace; 16]),
        span_id: hex::encode([id; 8]),
        parent_span_id: parent.map(|p| hex::encode([p; 8])).unwrap_or_default(),
        service: "muse".into(),
        name: format!("op{id}"),
        kind: if parent.is_none() { 2 } else { 1 },
        start_us: start_ms * 1000,
        duration_us: dur_ms * 1000,
        status,
        status_message: String::new(),
        feature: feature.into(),
        criticality: crit.into(),
        host: "gpu-1".into(),
        is_request: parent.is_none(),
        attributes: vec![
            ("k".into(), "v".into()),
            ("service.name".into(), "muse".into()),
        ],
    }
}

fn failure(
    id: &str,
    ts_ms: u64,
    service: &str,
    category: Category,
    feature: &str,
    pattern: &str,
) -> FailureRow {
    FailureRow {
        id: id.into(),
        pattern: pattern.into(),
        event: FailureEvent {
            ts_ms,
            service: service.into(),
            host: "gpu-1".into(),
            request_id: format!("req-{id}"),
            trace_id: String::new(),
            user_id: "u1".into(),
            feature: feature.into(),
            criticality: Criticality::Sheddable,
            category,
            error_type: "AgentExecutionFailed".into(),
            message: format!("failure {id}"),
            latency_ms: 12.5,
            attributes: BTreeMap::from([("tool".to_string(), "weather".to_string())]),
        },
    }
}

async fn spans_are_found_by_trace(b: &Backend) {
    let mut batch = Batch::new();
    batch.spans = vec![
        span(1, 2, Some(1), T0 + 5, 3, 0, "", "default"),
        span(1, 1, None, T0, 10, 1, "pdf", "sheddable"),
        span(9, 9, None, T0, 1, 0, "", "default"),
    ];
    b.store.write_batch(&batch, WriteMode::Fresh).await.unwrap();
    let t = b.store.trace(&hex::encode([1u8; 16])).await.unwrap();
    assert_eq!(
        t.iter().map(|s| s.span_id.clone()).collect::<Vec<_>>(),
        vec![hex::encode([1u8; 8]), hex::encode([2u8; 8])],
        "by start time"
    );
    assert_eq!(t[0], batch.spans[1], "every field round-trips");
    assert!(
        b.store
            .trace(&hex::encode([3u8; 16]))
            .await
            .unwrap()
            .is_empty()
    );
}

async fn replayed_batch_is_stored_once(b: &Backend) {
    let mut batch = Batch::new();
    batch.spans = (0..5)
        .map(|i| span(2, i + 1, None, T0 + u64::from(i), 1, 0, "", "default"))
        .collect();
    batch.failures = vec![failure("a", T0, "muse", Category::Other, "", "")];
    batch.snapshots = vec![AgentSnapshot {
        host: "h".into(),
        ts_ms: T0,
        ..Default::default()
    }];
    batch.logs = vec![];
    b.store.write_batch(&batch, WriteMode::Fresh).await.unwrap();
    // The answer to the first write was "lost": the spool replays it, twice even.
    b.store
        .write_batch(&batch, WriteMode::Replay)
        .await
        .unwrap();
    b.store
        .write_batch(&batch, WriteMode::Replay)
        .await
        .unwrap();
    let n = b.store.count_rows().await.unwrap();
    assert_eq!((n.spans, n.failures, n.snapshots), (5, 1, 1));
    // A batch that never arrived is written in full by a replay.
    let mut other = Batch::new();
    other.spans = vec![span(3, 1, None, T0, 1, 0, "", "default")];
    b.store
        .write_batch(&other, WriteMode::Replay)
        .await
        .unwrap();
    assert_eq!(b.store.count_rows().await.unwrap().spans, 6);
}

async fn failures_filter_and_paginate(b: &Backend) {
    let mut batch = Batch::new();
    let mut want_all = Vec::new();
    for i in 0..23u64 {
        // Several share a timestamp so the id tie-break matters.
        let ts = T0 + (i / 3) * 1000;
        let (svc, cat, feat, pat) = match i % 3 {
            0 => ("muse", Category::ToolUnavailable, "pdf", "p1"),
            1 => ("muse", Category::KvCacheExhausted, "chat", "p2"),
            _ => ("other", Category::ToolUnavailable, "chat", "p1"),
        };
        let id = format!("f{i:02}");
        want_all.push((ts, id.clone()));
        batch.failures.push(failure(&id, ts, svc, cat, feat, pat));
    }
    batch.failures.push(failure(
        "old",
        T0 - 10 * DAY_MS,
        "muse",
        Category::Other,
        "",
        "",
    ));
    b.store.write_batch(&batch, WriteMode::Fresh).await.unwrap();
    want_all.sort_by(|a, b| b.cmp(a));

    let base = FailureQuery {
        since_ms: T0,
        until_ms: T0 + DAY_MS,
        limit: 5,
        ..FailureQuery::default()
    };
    let mut got = Vec::new();
    let mut q = base.clone();
    loop {
        let page = b.store.failures(&q).await.unwrap();
        assert!(page.items.len() <= 5);
        got.extend(page.items.iter().map(|f| (f.event.ts_ms, f.id.clone())));
        match page.next_cursor {
            Some(c) => q.cursor = Some(FailureCursor::decode(&c).unwrap()),
            None => break,
        }
    }
    assert_eq!(got, want_all, "pages cover every row once, newest first");

    let cases: Vec<(FailureQuery, usize)> = vec![
        (
            FailureQuery {
                service: Some("other".into()),
                ..base.clone()
            },
            7,
        ),
        (
            FailureQuery {
                category: Some("kv_cache_exhausted".into()),
                ..base.clone()
            },
            8,
        ),
        (
            FailureQuery {
                feature: Some("chat".into()),
                ..base.clone()
            },
            15,
        ),
        (
            FailureQuery {
                pattern: Some("p1".into()),
                ..base.clone()
            },
            15,
        ),
        (
            FailureQuery {
                criticality: Some("sheddable".into()),
                ..base.clone()
            },
            23,
        ),
        (
            FailureQuery {
                criticality: Some("critical".into()),
                ..base.clone()
            },
            0,
        ),
        (
            FailureQuery {
                service: Some("muse".into()),
                category: Some("tool_unavailable".into()),
                ..base.clone()
            },
            8,
        ),
        (
            FailureQuery {
                since_ms: T0 - 11 * DAY_MS,
                until_ms: T0,
                ..base.clone()
            },
            1,
        ),
    ];
    for (q, want) in cases {
        let q = FailureQuery { limit: 1000, ..q };
        let page = b.store.failures(&q).await.unwrap();
        assert_eq!(page.items.len(), want, "{q:?}");
        assert!(page.next_cursor.is_none());
    }
    let one = b
        .store
        .failures(&FailureQuery { limit: 1, ..base })
        .await
        .unwrap();
    assert_eq!(one.items[0], batch.failures[22], "whole row round-trips");
}

async fn request_counts_are_good_over_total(b: &Backend) {
    let mut batch = Batch::new();
    batch.spans = vec![
        span(4, 1, None, T0 + 1_000, 100, 0, "chat", "critical"),
        span(4, 2, None, T0 + 2_000, 900, 1, "chat", "critical"),
        span(4, 3, None, T0 + 3_000, 100, 2, "chat", "critical"),
        span(4, 4, Some(1), T0 + 3_500, 100, 2, "chat", "critical"), // not a request
        span(4, 5, None, T0 + 61_000, 100, 0, "pdf", "sheddable"),
        span(4, 6, None, T0 + 200_000, 100, 0, "pdf", "sheddable"), // outside the range
    ];
    b.store.write_batch(&batch, WriteMode::Fresh).await.unwrap();
    let q = CountQuery {
        since_ms: T0,
        until_ms: T0 + 120_000,
        bucket_ms: 60_000,
        service: Some("muse".into()),
        latency_threshold_ms: None,
    };
    let rc = |bucket_ms, feature: &str, crit: &str, good, total| RequestCount {
        bucket_ms,
        service: "muse".into(),
        feature: feature.into(),
        criticality: crit.into(),
        good,
        total,
        refused: 0,
    };
    assert_eq!(
        b.store.request_counts(&q).await.unwrap(),
        vec![
            rc(T0, "chat", "critical", 2, 3),
            rc(T0 + 60_000, "pdf", "sheddable", 1, 1)
        ]
    );
    let q = CountQuery {
        latency_threshold_ms: Some(500),
        ..q
    };
    assert_eq!(
        b.store.request_counts(&q).await.unwrap()[0],
        rc(T0, "chat", "critical", 1, 3),
        "slow requests are bad too"
    );
    let q = CountQuery {
        service: Some("nobody".into()),
        ..q
    };
    assert!(b.store.request_counts(&q).await.unwrap().is_empty());
}

async fn latest_snapshot_per_host(b: &Backend) {
    let snap = |host: &str, ts_ms: u64, kv: f64| AgentSnapshot {
        host: host.into(),
        ts_ms,
        engines: vec![brownout_protocol::EngineStats {
            id: "e0".into(),
            up: true,
            kv: brownout_protocol::KvStats {
                usage_ratio: kv,
                ..Default::default()
            },
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut b1 = Batch::new();
    b1.snapshots = vec![
        snap("gpu-1", T0, 0.1),
        snap("gpu-1", T0 + 2000, 0.3),
        snap("gpu-2", T0 + 1000, 0.5),
    ];
    let mut b2 = Batch::new();
    b2.snapshots = vec![
        snap("gpu-1", T0 + 1000, 0.2),
        snap("gpu-3", T0 - DAY_MS, 0.9),
    ];
    b.store.write_batch(&b1, WriteMode::Fresh).await.unwrap();
    b.store.write_batch(&b2, WriteMode::Fresh).await.unwrap();
    let latest = b.store.latest_snapshots(T0 - 1000).await.unwrap();
    assert_eq!(
        latest,
        vec![snap("gpu-1", T0 + 2000, 0.3), snap("gpu-2", T0 + 1000, 0.5)]
    );
}

async fn documents_put_get_list(b: &Backend) {
    let s = &b.store;
    assert!(s.get_doc("pattern", "p1").await.unwrap().is_none());
    s.put_doc(
        "pattern",
        "p1",
        &serde_json::json!({"template": "tool <*> timed out", "n": 1}),
    )
    .await
    .unwrap();
    s.put_doc(
        "pattern",
        "p2",
        &serde_json::json!({"template": "kv cache exhausted"}),
    )
    .await
    .unwrap();
    s.put_doc("decision", "d1", &serde_json::json!({"tier": 2}))
        .await
        .unwrap();
    s.put_doc(
        "pattern",
        "p1",
        &serde_json::json!({"template": "tool <*> timed out", "n": 2}),
    )
    .await
    .unwrap();
    let p1 = s.get_doc("pattern", "p1").await.unwrap().unwrap();
    assert_eq!(p1.value["n"], 2, "latest write wins");
    assert!(p1.updated_ms >= brownout_protocol::now_ms() - 60_000);
    let keys: Vec<String> = s
        .list_docs("pattern", 0)
        .await
        .unwrap()
        .into_iter()
        .map(|d| d.key)
        .collect();
    assert_eq!(keys, vec!["p1", "p2"]);
    assert!(
        s.list_docs("pattern", brownout_protocol::now_ms() + 60_000)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        s.list_docs("decision", 0).await.unwrap()[0].value["tier"],
        2
    );
}

async fn retention_drops_old_days(b: &Backend) {
    let mut batch = Batch::new();
    batch.spans = vec![
        span(5, 1, None, T0 - 3 * DAY_MS, 1, 0, "", "default"),
        span(5, 2, None, T0, 1, 0, "", "default"),
    ];
    batch.failures = vec![
        failure("old", T0 - 3 * DAY_MS, "s", Category::Other, "", ""),
        failure("new", T0 + 5, "s", Category::Other, "", ""),
    ];
    batch.snapshots = vec![AgentSnapshot {
        host: "h".into(),
        ts_ms: T0 - 3 * DAY_MS,
        ..Default::default()
    }];
    b.store.write_batch(&batch, WriteMode::Fresh).await.unwrap();
    let dropped = b.store.drop_before(T0 - DAY_MS + 5).await.unwrap();
    assert!(dropped > 0);
    let n = b.store.count_rows().await.unwrap();
    assert_eq!((n.spans, n.failures, n.snapshots), (1, 1, 0));
}

/// brownout's own refusals (docs/SLO.md "Deliberate refusals"): spans marked
/// `brownout.deliberate = true` are counted as `refused`, in neither good nor total; failure
/// events marked `deliberate = "true"` are kept and can be filtered in or out.
async fn deliberate_refusals_are_kept_apart(b: &Backend) {
    let mut batch = Batch::new();
    let mut refused_span = span(7, 1, None, T0 + 1_000, 1, 0, "pdf", "sheddable");
    refused_span
        .attributes
        .push(("brownout.deliberate".into(), "true".into()));
    let mut served = span(7, 2, None, T0 + 2_000, 100, 1, "pdf", "sheddable");
    served
        .attributes
        .push(("brownout.deliberate".into(), "false".into()));
    let failed = span(7, 3, None, T0 + 3_000, 100, 2, "pdf", "sheddable");
    let mut refused_too = span(8, 1, None, T0 + 4_000, 1, 0, "pdf", "sheddable");
    refused_too
        .attributes
        .push(("brownout.deliberate".into(), "true".into()));
    batch.spans = vec![refused_span, served, failed, refused_too];
    let mut disabled = failure("d1", T0 + 1_000, "muse", Category::Degraded, "pdf", "");
    disabled
        .event
        .attributes
        .insert("deliberate".into(), "true".into());
    disabled
        .event
        .attributes
        .insert("outcome".into(), "feature_disabled".into());
    let real = failure(
        "r1",
        T0 + 3_000,
        "muse",
        Category::TimeoutResource,
        "pdf",
        "p1",
    );
    batch.failures = vec![disabled.clone(), real.clone()];
    b.store.write_batch(&batch, WriteMode::Fresh).await.unwrap();

    let q = CountQuery {
        since_ms: T0,
        until_ms: T0 + 60_000,
        bucket_ms: 60_000,
        service: Some("muse".into()),
        latency_threshold_ms: None,
    };
    assert_eq!(
        b.store.request_counts(&q).await.unwrap(),
        vec![RequestCount {
            bucket_ms: T0,
            service: "muse".into(),
            feature: "pdf".into(),
            criticality: "sheddable".into(),
            good: 1,
            total: 2,
            refused: 2,
        }],
        "two refusals, one served, one failed"
    );
    let fq = |deliberate| FailureQuery {
        since_ms: T0,
        until_ms: T0 + 60_000,
        limit: 100,
        deliberate,
        ..FailureQuery::default()
    };
    let ids =
        |p: brownout::store::FailurePage| p.items.into_iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(
        ids(b.store.failures(&fq(Some(false))).await.unwrap()),
        ["r1"]
    );
    assert_eq!(
        ids(b.store.failures(&fq(Some(true))).await.unwrap()),
        ["d1"]
    );
    assert_eq!(
        ids(b.store.failures(&fq(None)).await.unwrap()),
        ["r1", "d1"]
    );
    // The refusal round-trips whole.
    assert_eq!(
        b.store.failures(&fq(Some(true))).await.unwrap().items[0],
        disabled
    );
}

/// A database written before the `deliberate` columns existed gets them on open, computed for
/// the rows it already holds.
#[tokio::test]
async fn an_older_sqlite_database_gains_the_deliberate_columns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.sqlite");
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        // The schema before the columns (as released), with one refusal and one served span.
        c.execute_batch(
            "CREATE TABLE batches (id INTEGER PRIMARY KEY, written_ms INTEGER NOT NULL);
             CREATE TABLE spans (
               trace_id TEXT NOT NULL, span_id TEXT NOT NULL, parent_span_id TEXT NOT NULL,
               service TEXT NOT NULL, name TEXT NOT NULL, kind INTEGER NOT NULL,
               start_us INTEGER NOT NULL, duration_us INTEGER NOT NULL,
               status INTEGER NOT NULL, status_message TEXT NOT NULL,
               feature TEXT NOT NULL, criticality TEXT NOT NULL, host TEXT NOT NULL,
               is_request INTEGER NOT NULL, attrs TEXT NOT NULL, batch_id INTEGER NOT NULL);
             CREATE TABLE failures (
               id TEXT NOT NULL, ts_ms INTEGER NOT NULL, service TEXT NOT NULL, host TEXT NOT NULL,
               request_id TEXT NOT NULL, trace_id TEXT NOT NULL, user_id TEXT NOT NULL, feature TEXT NOT NULL,
               criticality TEXT NOT NULL, category TEXT NOT NULL, error_type TEXT NOT NULL, message TEXT NOT NULL,
               latency_ms REAL NOT NULL, pattern TEXT NOT NULL, attrs TEXT NOT NULL, batch_id INTEGER NOT NULL);",
        )
        .unwrap();
        let start_us = (T0 + 1_000) * 1000;
        for (n, attrs) in [(1, r#"{"brownout.deliberate":"true"}"#), (2, "{}")] {
            c.execute(
                "INSERT INTO spans VALUES ('t', ?1, '', 'muse', 'chat', 2, ?2, 1000, 0, '', 'pdf', 'default', 'h', 1, ?3, 1)",
                rusqlite::params![format!("s{n}"), start_us as i64, attrs],
            )
            .unwrap();
        }
        c.execute(
            "INSERT INTO failures VALUES ('f1', ?1, 'muse', 'h', '', '', '', 'pdf', 'default', 'degraded', 'FeatureDisabled', 'feature pdf disabled at tier 1', 0, '', '{\"deliberate\":\"true\"}', 1)",
            rusqlite::params![(T0 + 1_000) as i64],
        )
        .unwrap();
    }
    let s = SqliteStore::open(&path).unwrap();
    s.migrate().await.unwrap();
    let q = CountQuery {
        since_ms: T0,
        until_ms: T0 + 60_000,
        bucket_ms: 60_000,
        service: None,
        latency_threshold_ms: None,
    };
    let rows = s.request_counts(&q).await.unwrap();
    assert_eq!(
        (rows[0].good, rows[0].total, rows[0].refused),
        (1, 1, 1),
        "{rows:?}"
    );
    let real = s
        .failures(&FailureQuery {
            since_ms: T0,
            until_ms: T0 + 60_000,
            limit: 10,
            deliberate: Some(false),
            ..FailureQuery::default()
        })
        .await
        .unwrap();
    assert!(
        real.items.is_empty(),
        "the old refusal is not a real failure"
    );
    // Writing through the store still works with the generated columns in place.
    let mut b = Batch::new();
    b.spans = vec![span(9, 1, None, T0 + 5_000, 10, 1, "pdf", "default")];
    s.write_batch(&b, WriteMode::Fresh).await.unwrap();
    assert_eq!(s.request_counts(&q).await.unwrap().len(), 1);
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite_backend {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { let b = super::sqlite().await; super::$name(&b).await; b.cleanup().await; })*
        }
        mod clickhouse_backend {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() { let b = super::clickhouse().await; super::$name(&b).await; b.cleanup().await; })*
        }
    };
}

both_backends!(
    spans_are_found_by_trace,
    replayed_batch_is_stored_once,
    failures_filter_and_paginate,
    request_counts_are_good_over_total,
    latest_snapshot_per_host,
    documents_put_get_list,
    retention_drops_old_days,
    deliberate_refusals_are_kept_apart,
);

/// ClickHouse tables made before the `deliberate` column get it from `migrate` (an `ALTER …
/// ADD COLUMN … DEFAULT` after asking `system.columns`); rows already there have it computed
/// from their attributes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_clickhouse_table_gains_the_deliberate_columns() {
    let url =
        std::env::var("CLICKHOUSE_TEST_URL").unwrap_or_else(|_| "http://127.0.0.1:8123".into());
    let prefix = format!("t{}_", uuid::Uuid::new_v4().simple());
    let http = brownout::loadgen::http_client().expect("HTTP client");
    let sql = |q: String| {
        let (http, url) = (http.clone(), url.clone());
        async move {
            let r = http.post(&url).body(q.clone()).send().await.unwrap();
            assert!(r.status().is_success(), "{q}: {}", r.text().await.unwrap());
        }
    };
    // The spans and failures tables as released before the column.
    sql(format!(
        "CREATE TABLE {prefix}spans (ts DateTime, start_us UInt64, duration_us UInt64, trace_id String, \
         span_id String, parent_span_id String, service String, name String, kind UInt8, status UInt8, \
         status_message String, feature String, criticality String, host String, is_request UInt8, \
         attr_keys Array(String), attr_values Array(String), batch_id UInt64, seq UInt32) \
         ENGINE = MergeTree() PARTITION BY toYYYYMMDD(ts) ORDER BY (service, ts)"
    ))
    .await;
    sql(format!(
        "CREATE TABLE {prefix}failures (ts DateTime, ts_ms UInt64, id String, service String, host String, \
         request_id String, trace_id String, user_id String, feature String, criticality String, \
         category String, error_type String, message String, latency_ms Float64, pattern String, \
         attr_keys Array(String), attr_values Array(String), batch_id UInt64, seq UInt32) \
         ENGINE = MergeTree() PARTITION BY toYYYYMMDD(ts) ORDER BY (ts, id)"
    ))
    .await;
    let (secs, us) = ((T0 + 1_000) / 1000, (T0 + 1_000) * 1000);
    sql(format!(
        "INSERT INTO {prefix}spans VALUES \
         ({secs}, {us}, 1000, 't', 's1', '', 'muse', 'chat', 2, 0, '', 'pdf', 'default', 'h', 1, ['brownout.deliberate'], ['true'], 1, 0), \
         ({secs}, {us}, 1000, 't', 's2', '', 'muse', 'chat', 2, 1, '', 'pdf', 'default', 'h', 1, [], [], 1, 1)"
    ))
    .await;
    sql(format!(
        "INSERT INTO {prefix}failures VALUES ({secs}, {}, 'f1', 'muse', 'h', '', '', '', 'pdf', 'default', \
         'degraded', 'FeatureDisabled', 'feature pdf disabled at tier 1', 0, '', ['deliberate'], ['true'], 1, 0)",
        T0 + 1_000
    ))
    .await;
    let cfg = ClickHouseConfig {
        url: url.clone(),
        database: "default".into(),
        user: None,
        password: None,
        table_prefix: prefix.clone(),
        cluster: None,
        tls: None,
    };
    let s = Arc::new(ClickHouseStore::new(&cfg));
    s.migrate().await.unwrap();
    s.migrate()
        .await
        .expect("a second migration finds the columns");
    let q = CountQuery {
        since_ms: T0,
        until_ms: T0 + 60_000,
        bucket_ms: 60_000,
        service: None,
        latency_threshold_ms: None,
    };
    let rows = s.request_counts(&q).await.unwrap();
    assert_eq!(
        (rows[0].good, rows[0].total, rows[0].refused),
        (1, 1, 1),
        "{rows:?}"
    );
    let fq = |deliberate| FailureQuery {
        since_ms: T0,
        until_ms: T0 + 60_000,
        limit: 10,
        deliberate: Some(deliberate),
        ..FailureQuery::default()
    };
    assert!(s.failures(&fq(false)).await.unwrap().items.is_empty());
    assert_eq!(s.failures(&fq(true)).await.unwrap().items.len(), 1);
    s.drop_tables().await.expect("drop test tables");
}
