//! Log search (`Store::logs`, docs/API.md `GET /api/v1/logs`) on both real stores: embedded
//! SQLite and the real ClickHouse (`CLICKHOUSE_TEST_URL`, default http://127.0.0.1:8123; tables
//! with a unique prefix, dropped at the end). Each filter returns exactly the rows that match,
//! newest first; paging by cursor neither repeats nor skips a row, also across equal timestamps.

use std::collections::HashSet;
use std::sync::Arc;

use brownout::config::ClickHouseConfig;
use brownout::store::clickhouse::ClickHouseStore;
use brownout::store::sqlite::SqliteStore;
use brownout::store::{Batch, LogCursor, LogHit, LogQuery, LogRow, Store, WriteMode};

/// 2026-11-30T00:00:00Z
const T0: u64 = 1_795_996_800_000;

async fn sqlite() -> (Arc<dyn Store>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(&dir.path().join("t.sqlite")).unwrap();
    s.migrate().await.unwrap();
    (Arc::new(s), dir)
}

async fn clickhouse() -> Arc<ClickHouseStore> {
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
        panic!("ClickHouse is not answering at {url} ({e}). Start it with scripts/test.sh");
    }
    s.migrate().await.unwrap();
    s
}

const SERVICES: [&str; 3] = ["chat", "agent", "pdf"];
const HOSTS: [&str; 2] = ["gpu-1", "gpu-2"];
const SEVERITIES: [u8; 5] = [5, 9, 13, 17, 21];

/// 90 records over two days, in 3 batches; four records share each timestamp (ties), bodies
/// unique (`rec-<n> …`), some with characters a LIKE pattern or a bind would mangle.
fn records() -> Vec<LogRow> {
    (0..90u64)
        .map(|n| {
            let k = n as usize;
            LogRow {
                // Two days apart halfway: two day partitions in ClickHouse.
                ts_us: (T0 + (n / 4) * 1_000 + if n >= 45 { 86_400_000 } else { 0 }) * 1000,
                trace_id: if n % 2 == 0 {
                    format!("{n:032x}")
                } else {
                    String::new()
                },
                span_id: format!("{n:016x}"),
                service: SERVICES[k % 3].into(),
                host: HOSTS[(k / 3) % 2].into(),
                severity_number: SEVERITIES[k % 5],
                severity_text: String::new(),
                body: match n % 6 {
                    0 => format!("rec-{n} disk 100% full_ now"),
                    1 => format!("rec-{n} it's a 'quoted' ? mark"),
                    2 => format!("rec-{n} KV cache exhausted"),
                    3 => format!("rec-{n} kv CACHE ok"),
                    4 => format!("rec-{n} <script>alert(1)</script>"),
                    _ => format!("rec-{n} tool timeout after 8 s"),
                },
                attributes: vec![("n".into(), n.to_string())],
            }
        })
        .collect()
}

async fn write_all(s: &dyn Store, rows: &[LogRow]) {
    for chunk in rows.chunks(30) {
        let b = Batch {
            logs: chunk.to_vec(),
            ..Batch::new()
        };
        s.write_batch(&b, WriteMode::Fresh).await.unwrap();
    }
}

fn all_time() -> LogQuery {
    LogQuery {
        since_ms: T0 - 1,
        until_ms: T0 + 3 * 86_400_000,
        limit: 1000,
        ..LogQuery::default()
    }
}

/// What `q` must return out of `rows` (without paging), as bodies, newest first; ties in any
/// order (the stores break them by their own unique id), so compared per timestamp.
fn expected(rows: &[LogRow], q: &LogQuery) -> Vec<(u64, String)> {
    let mut v: Vec<(u64, String)> = rows
        .iter()
        .filter(|r| {
            r.ts_us >= q.since_ms * 1000
                && r.ts_us < q.until_ms * 1000
                && q.service.as_ref().is_none_or(|s| *s == r.service)
                && q.host.as_ref().is_none_or(|s| *s == r.host)
                && r.severity_number >= q.min_severity
                && q.text.as_ref().is_none_or(|t| r.body.contains(t.as_str()))
        })
        .map(|r| (r.ts_us, r.body.clone()))
        .collect();
    v.sort_by(|a, b| b.cmp(a));
    v
}

/// The hits as `(ts, body)`, checking they are newest first and their positions strictly
/// decreasing (the unique order the cursor follows); sorted within each timestamp.
fn shape(items: &[LogHit]) -> Vec<(u64, String)> {
    for w in items.windows(2) {
        let (a, b) = (w[0].pos, w[1].pos);
        assert!(
            (a.ts_us, a.id, a.seq) > (b.ts_us, b.id, b.seq),
            "not strictly newest first: {a:?} then {b:?}"
        );
    }
    let mut v: Vec<(u64, String)> = items
        .iter()
        .map(|h| (h.row.ts_us, h.row.body.clone()))
        .collect();
    v.sort_by(|a, b| b.cmp(a));
    v
}

async fn search_by_each_filter(s: &dyn Store) {
    let rows = records();
    write_all(s, &rows).await;
    let mut queries: Vec<(&str, LogQuery)> = vec![("all", all_time())];
    for svc in SERVICES {
        queries.push((
            "service",
            LogQuery {
                service: Some(svc.into()),
                ..all_time()
            },
        ));
    }
    for h in HOSTS {
        queries.push((
            "host",
            LogQuery {
                host: Some(h.into()),
                ..all_time()
            },
        ));
    }
    for sev in [9, 17, 21] {
        queries.push((
            "severity",
            LogQuery {
                min_severity: sev,
                ..all_time()
            },
        ));
    }
    for t in [
        "100% full_",
        "it's a 'quoted' ? mark",
        "KV cache",
        "<script>",
        "rec-7 ",
        "nothing-like-this",
    ] {
        queries.push((
            "text",
            LogQuery {
                text: Some(t.into()),
                ..all_time()
            },
        ));
    }
    queries.push((
        "time range (one day, ties at both ends)",
        LogQuery {
            since_ms: T0 + 2_000,
            until_ms: T0 + 9_000,
            ..all_time()
        },
    ));
    queries.push((
        "all together",
        LogQuery {
            service: Some("agent".into()),
            host: Some("gpu-2".into()),
            min_severity: 9,
            text: Some("rec-".into()),
            since_ms: T0 + 86_400_000,
            ..all_time()
        },
    ));
    for (what, q) in &queries {
        let page = s.logs(q).await.unwrap();
        let want = expected(&rows, q);
        assert_eq!(shape(&page.items), want, "{what}: {q:?}");
        assert!(page.next_cursor.is_none(), "{what}: one page holds all");
        if *what != "all" && *what != "text" {
            assert!(
                !want.is_empty() && want.len() < rows.len(),
                "{what} filters something"
            );
        }
        // The row comes back whole.
        if let Some(h) = page.items.first() {
            let orig = rows.iter().find(|r| r.body == h.row.body).unwrap();
            assert_eq!(&h.row, orig);
        }
    }
    // Newest first across the two days: the first row is of the later day.
    let page = s.logs(&all_time()).await.unwrap();
    assert_eq!(page.items.len(), 90);
    assert!(page.items[0].row.ts_us > page.items[89].row.ts_us);
    // A text filter over the bound is refused.
    let long = LogQuery {
        text: Some("x".repeat(brownout::store::logs::LOG_TEXT_MAX + 1)),
        ..all_time()
    };
    assert!(s.logs(&long).await.is_err());
}

async fn paging_has_no_gaps_or_repeats(s: &dyn Store) {
    let rows = records();
    write_all(s, &rows).await;
    for (limit, q) in [
        (3, all_time()),
        (4, all_time()),
        (
            7,
            LogQuery {
                host: Some("gpu-1".into()),
                ..all_time()
            },
        ),
        (
            1,
            LogQuery {
                text: Some("KV cache".into()),
                ..all_time()
            },
        ),
    ] {
        let mut seen: Vec<LogHit> = Vec::new();
        let mut cursor: Option<LogCursor> = None;
        let mut pages = 0;
        loop {
            let page = s
                .logs(&LogQuery {
                    limit,
                    cursor,
                    ..q.clone()
                })
                .await
                .unwrap();
            assert!(page.items.len() <= limit);
            pages += 1;
            seen.extend(page.items);
            match page.next_cursor {
                Some(c) => cursor = Some(LogCursor::decode(&c).expect("cursor decodes")),
                None => break,
            }
            assert!(pages < 200, "paging does not end");
        }
        let ids: HashSet<String> = seen.iter().map(|h| h.id.clone()).collect();
        assert_eq!(ids.len(), seen.len(), "a row repeated (limit {limit})");
        assert_eq!(shape(&seen), expected(&rows, &q), "limit {limit}: {q:?}");
    }
}

#[tokio::test]
async fn sqlite_log_search_by_each_filter() {
    let (s, _d) = sqlite().await;
    search_by_each_filter(s.as_ref()).await;
}

#[tokio::test]
async fn sqlite_log_paging_has_no_gaps_or_repeats() {
    let (s, _d) = sqlite().await;
    paging_has_no_gaps_or_repeats(s.as_ref()).await;
}

#[tokio::test]
async fn clickhouse_log_search_by_each_filter() {
    let s = clickhouse().await;
    search_by_each_filter(s.as_ref()).await;
    s.drop_tables().await.unwrap();
}

#[tokio::test]
async fn clickhouse_log_paging_has_no_gaps_or_repeats() {
    let s = clickhouse().await;
    paging_has_no_gaps_or_repeats(s.as_ref()).await;
    s.drop_tables().await.unwrap();
}

/// On a real 2-shard cluster (`storage.clickhouse_cluster`; ZooKeeper and two clickhouse-server
/// processes, SKIPPED when not installed): records spread over both shards, and the search
/// through the Distributed table, from either node, returns each once, filtered and paged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clickhouse_cluster_log_search_reads_every_shard_once() {
    use brownout_test_support::clickhouse_cluster::ClickHouseCluster;
    let Some(cluster) = tokio::task::spawn_blocking(|| {
        ClickHouseCluster::start_or_skip(
            "store_logs::clickhouse_cluster_log_search_reads_every_shard_once",
        )
    })
    .await
    .unwrap() else {
        return;
    };
    let prefix = format!("{}_", brownout_test_support::unique("chl_"));
    let on = |node: &str| {
        ClickHouseStore::new(&ClickHouseConfig {
            url: node.to_string(),
            database: "default".into(),
            user: None,
            password: None,
            table_prefix: prefix.clone(),
            cluster: Some(ClickHouseCluster::NAME.into()),
            tls: None,
        })
    };
    let (n1, n2) = (cluster.nodes[0].clone(), cluster.nodes[1].clone());
    let store = on(&n1);
    if let Err(e) = store.migrate().await {
        panic!("ON CLUSTER migration: {e}\n{}", cluster.log_tails());
    }
    let rows = records();
    write_all(&store, &rows).await;
    let local = store.local_table(&format!("{prefix}logs"));
    let mut held = 0;
    let _ = rustls::crypto::ring::default_provider().install_default();
    for node in [&n1, &n2] {
        let body = reqwest::Client::new()
            .post(node.as_str())
            .body(format!("SELECT count() FROM {local}"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let n: u64 = body.trim().parse().unwrap();
        assert!(n > 0, "{node}: shard holds records");
        held += n;
    }
    assert_eq!(held, rows.len() as u64, "every record once over the shards");
    for node in [&n1, &n2] {
        let s = on(node);
        for q in [
            all_time(),
            LogQuery {
                service: Some("agent".into()),
                min_severity: 9,
                ..all_time()
            },
        ] {
            let page = s.logs(&q).await.unwrap();
            assert_eq!(shape(&page.items), expected(&rows, &q), "{node}: {q:?}");
        }
    }
    paging_on(&on(&n2), &rows).await;
    store.drop_tables().await.unwrap();
}

/// Pages of 4 through everything: each record once, in order.
async fn paging_on(s: &dyn Store, rows: &[LogRow]) {
    let mut seen: Vec<LogHit> = Vec::new();
    let mut cursor = None;
    loop {
        let page = s
            .logs(&LogQuery {
                limit: 4,
                cursor,
                ..all_time()
            })
            .await
            .unwrap();
        seen.extend(page.items);
        match page.next_cursor {
            Some(c) => cursor = LogCursor::decode(&c),
            None => break,
        }
    }
    assert_eq!(shape(&seen), expected(rows, &all_time()));
}
