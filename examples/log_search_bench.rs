//! Log search benchmark: `Store::logs` latency over N stored OTLP log records (default 10⁶).
//!
//! ```text
//! cargo run --release --example log_search_bench -- --store sqlite --records 1000000
//! CLICKHOUSE_URL=http://127.0.0.1:8123 cargo run --release --example log_search_bench -- --store clickhouse --records 1000000
//! ```
//!
//! Writes the records (24 h of them, 8 services × 16 hosts, five severities, bodies of a few
//! templates with numbers in them, some with a rare word) through the store's own batch write,
//! then runs each query shape `--runs` times (first page of 100 and the page after it) and
//! prints p50 / p95 / max in ms and the rows returned. SQLite goes to a temp dir; ClickHouse to
//! tables with a unique prefix, dropped at the end (`--keep` keeps them).

use std::sync::Arc;
use std::time::Instant;

use brownout::config::ClickHouseConfig;
use brownout::store::clickhouse::ClickHouseStore;
use brownout::store::sqlite::SqliteStore;
use brownout::store::{Batch, LogCursor, LogQuery, LogRow, Store, WriteMode};

mod common;
use common::arg;

const DAY_MS: u64 = 86_400_000;

fn record(n: u64, t0_ms: u64, total: u64) -> LogRow {
    let k = n as usize;
    let services = [
        "chat", "agent", "pdf", "image", "email", "search", "embed", "rerank",
    ];
    let sev = [9u8, 9, 9, 13, 17];
    // Spread over 24 h, oldest first; every 7th timestamp shared by two records.
    let ts_ms = t0_ms + (n * DAY_MS / total.max(1)) / 7 * 7;
    let body = match n % 5 {
        0 => format!("request req-{n:08x} finished in {} ms", n % 997),
        1 => format!("KV cache usage {}% on engine-{}", n % 100, n % 4),
        2 => format!("tool web_search returned {} results", n % 50),
        3 => format!("upstream timeout after {} ms (attempt {})", n % 8000, n % 3),
        _ => format!("queue depth {} waiting {}", n % 64, n % 128),
    };
    let body = if n.is_multiple_of(10_007) {
        format!("{body} quasar-overflow")
    } else {
        body
    };
    LogRow {
        ts_us: ts_ms * 1000,
        trace_id: format!("{:032x}", n.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        span_id: format!("{:016x}", n),
        service: services[k % services.len()].into(),
        host: format!("gpu-{:02}", (k / 3) % 16),
        severity_number: sev[k % sev.len()],
        severity_text: String::new(),
        body,
        attributes: vec![("feature".into(), "basic_qa".into())],
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let which = arg(&args, "--store", "sqlite");
    let total: u64 = arg(&args, "--records", "1000000").parse()?;
    let runs: usize = arg(&args, "--runs", "20").parse()?;
    let dir = tempfile::tempdir()?;
    let mut ch: Option<Arc<ClickHouseStore>> = None;
    let store: Arc<dyn Store> = match which.as_str() {
        "sqlite" => {
            let s = SqliteStore::open(&dir.path().join("bench.sqlite"))?;
            s.migrate().await?;
            Arc::new(s)
        }
        "clickhouse" => {
            let url =
                std::env::var("CLICKHOUSE_URL").unwrap_or_else(|_| "http://127.0.0.1:8123".into());
            let s = Arc::new(ClickHouseStore::new(&ClickHouseConfig {
                url,
                database: "default".into(),
                user: None,
                password: None,
                table_prefix: format!("bench{}_", uuid::Uuid::new_v4().simple()),
                cluster: std::env::var("CLICKHOUSE_CLUSTER").ok(),
                tls: None,
            }));
            s.migrate().await?;
            ch = Some(s.clone());
            s
        }
        other => anyhow::bail!("--store sqlite|clickhouse, not {other:?}"),
    };
    let t0_ms = brownout_protocol::now_ms() - DAY_MS;
    let started = Instant::now();
    let batch_rows = 20_000u64;
    let mut n = 0u64;
    while n < total {
        let logs: Vec<LogRow> = (n..(n + batch_rows).min(total))
            .map(|i| record(i, t0_ms, total))
            .collect();
        n += logs.len() as u64;
        store
            .write_batch(
                &Batch {
                    logs,
                    ..Batch::new()
                },
                WriteMode::Fresh,
            )
            .await?;
    }
    println!(
        "store={which} records={total} written in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let base = LogQuery {
        since_ms: t0_ms,
        until_ms: t0_ms + DAY_MS + 60_000,
        limit: 100,
        ..LogQuery::default()
    };
    let hour = LogQuery {
        since_ms: t0_ms + 12 * 3_600_000,
        until_ms: t0_ms + 13 * 3_600_000,
        ..base.clone()
    };
    let shapes: Vec<(&str, LogQuery)> = vec![
        ("newest 100, 24 h, no filter", base.clone()),
        (
            "service",
            LogQuery {
                service: Some("agent".into()),
                ..base.clone()
            },
        ),
        (
            "service + host",
            LogQuery {
                service: Some("agent".into()),
                host: Some("gpu-00".into()),
                ..base.clone()
            },
        ),
        (
            "severity >= error",
            LogQuery {
                min_severity: 17,
                ..base.clone()
            },
        ),
        (
            "text, common (\"timeout\")",
            LogQuery {
                text: Some("timeout".into()),
                ..base.clone()
            },
        ),
        (
            "text, rare (100 matches in 24 h)",
            LogQuery {
                text: Some("quasar-overflow".into()),
                ..base.clone()
            },
        ),
        (
            "text, none match",
            LogQuery {
                text: Some("no-such-word".into()),
                ..base.clone()
            },
        ),
        (
            "one hour + service + severity + text",
            LogQuery {
                service: Some("pdf".into()),
                min_severity: 13,
                text: Some("upstream".into()),
                ..hour.clone()
            },
        ),
    ];
    println!("| query | rows | p50 ms | p95 ms | max ms | next page p50 ms |");
    println!("|---|---|---|---|---|---|");
    for (name, q) in &shapes {
        let mut first = Vec::with_capacity(runs);
        let mut second = Vec::with_capacity(runs);
        let mut rows = 0;
        for _ in 0..runs {
            let t = Instant::now();
            let page = store.logs(q).await?;
            first.push(t.elapsed().as_secs_f64() * 1000.0);
            rows = page.items.len();
            if let Some(c) = page.next_cursor {
                let q2 = LogQuery {
                    cursor: LogCursor::decode(&c),
                    ..q.clone()
                };
                let t = Instant::now();
                store.logs(&q2).await?;
                second.push(t.elapsed().as_secs_f64() * 1000.0);
            }
        }
        first.sort_by(f64::total_cmp);
        second.sort_by(f64::total_cmp);
        println!(
            "| {name} | {rows} | {:.1} | {:.1} | {:.1} | {} |",
            pct(&first, 0.5),
            pct(&first, 0.95),
            first[first.len() - 1],
            if second.is_empty() {
                "–".to_string()
            } else {
                format!("{:.1}", pct(&second, 0.5))
            }
        );
    }
    if let Some(ch) = ch
        && !args.iter().any(|a| a == "--keep")
    {
        ch.drop_tables().await?;
    }
    Ok(())
}
