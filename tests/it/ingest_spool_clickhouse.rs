//! Nothing accepted is lost: a real ClickHouse server of our own (temp dir, its own ports; the
//! shared one on 8123 is left alone) is killed in the middle of ingest, the control plane is
//! restarted while it is down, then ClickHouse comes back — and every accepted row is stored
//! exactly once. Also: a full spool answers 503 with Retry-After.

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use brownout::auth::Tokens;
use brownout::config::{ClickHouseConfig, Config, Secret};
use brownout::plane::{App, Listeners, Running};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value::Value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;

const INGEST: &str = "ingest-token-aaaaaaaaaaaa";
const READ: &str = "read-token-bbbbbbbbbbbbbb";

/// Our own clickhouse-server: started as a child (not `--daemon`) so we hold its PID.
pub(crate) struct OwnClickHouse {
    dir: std::path::PathBuf,
    http_port: u16,
    tcp_port: u16,
    inter_port: u16,
    child: Option<Child>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl OwnClickHouse {
    pub(crate) fn new(dir: &std::path::Path) -> OwnClickHouse {
        OwnClickHouse {
            dir: dir.to_path_buf(),
            http_port: free_port(),
            tcp_port: free_port(),
            inter_port: free_port(),
            child: None,
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    pub(crate) async fn start(&mut self) {
        // reqwest is built without a default crypto provider; do not rely on another test in
        // this binary having installed it first.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let d = self.dir.display();
        for sub in ["log", "tmp", "user_files", "format_schemas"] {
            std::fs::create_dir_all(self.dir.join(sub)).unwrap();
        }
        let child = Command::new("clickhouse-server")
            .arg("--config-file=/etc/clickhouse-server/config.xml")
            .arg("--")
            .arg(format!("--path={d}/"))
            .arg(format!("--tmp_path={d}/tmp/"))
            .arg(format!("--user_files_path={d}/user_files/"))
            .arg(format!("--format_schema_path={d}/format_schemas/"))
            .arg(format!("--logger.log={d}/log/server.log"))
            .arg(format!("--logger.errorlog={d}/log/err.log"))
            .arg(format!("--http_port={}", self.http_port))
            .arg(format!("--tcp_port={}", self.tcp_port))
            .arg(format!("--interserver_http_port={}", self.inter_port))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "clickhouse-server is installed (apt-get install clickhouse-server; see STACK.md)",
            );
        self.child = Some(child);
        let c = reqwest::Client::new();
        for _ in 0..200 {
            if c.get(format!("{}/ping", self.url()))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let err = std::fs::read_to_string(self.dir.join("log/err.log")).unwrap_or_default();
        panic!(
            "our clickhouse-server did not come up on {}: {}",
            self.url(),
            err.lines().rev().take(10).collect::<Vec<_>>().join("\n")
        );
    }

    /// SIGKILL: a hard stop, mid-insert if one is running.
    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGSTOP: the server hangs (connections open, no answers), as a stalled ClickHouse.
    pub(crate) fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT after [`OwnClickHouse::pause`].
    pub(crate) fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("started").id();
        let ok = Command::new("kill")
            .arg(sig)
            .arg(pid.to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    }

    pub(crate) async fn query(&self, sql: &str) -> String {
        let r = reqwest::Client::new()
            .post(self.url())
            .body(sql.to_string())
            .send()
            .await
            .unwrap();
        let ok = r.status().is_success();
        let t = r.text().await.unwrap();
        assert!(ok, "{sql}: {t}");
        t.trim().to_string()
    }
}

impl Drop for OwnClickHouse {
    fn drop(&mut self) {
        self.kill();
    }
}

fn config(dir: &std::path::Path, ch_url: &str, prefix: &str, spool_max: u64) -> Config {
    let mut c = Config::defaults();
    c.data_dir = dir.to_path_buf();
    c.clickhouse = Some(ClickHouseConfig {
        url: ch_url.into(),
        database: "default".into(),
        user: None,
        password: None,
        table_prefix: prefix.into(),
        cluster: None,
        tls: None,
    });
    c.ingest.batch_max_delay = Duration::from_millis(20);
    c.ingest.batch_max_rows = std::num::NonZeroUsize::new(500).unwrap();
    c.store_write_timeout = Duration::from_secs(2);
    c.spool.max_bytes = spool_max;
    c.spool.segment_bytes = 64 << 10;
    c.spool.retry_after_secs = 3;
    c
}

async fn start_cp(cfg: Config) -> Running {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tokens = Tokens::new(
        Some(Secret::new(INGEST)),
        Some(Secret::new(READ)),
        Some(Secret::new("admin-token-cccccccccccc")),
    );
    let app = App::build(cfg, tokens).await.unwrap();
    app.spawn(Listeners::loopback().await.unwrap(), axum::Router::new())
}

fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.into(),
        value: Some(AnyValue {
            value: Some(Value::StringValue(v.into())),
        }),
        ..Default::default()
    }
}

/// Request `n` carries 5 spans with ids derived from `n` (unique across the test) and one
/// NDJSON failure line with request_id `r<n>`.
fn spans_for(n: u64) -> Vec<u8> {
    let t0 = brownout_protocol::now_ms() * 1_000_000;
    let spans = (0..5u64)
        .map(|i| {
            let mut tid = [0u8; 16];
            tid[..8].copy_from_slice(&(n + 1).to_be_bytes());
            let mut sid = [0u8; 8];
            sid.copy_from_slice(&((n << 8) | (i + 1)).to_be_bytes());
            Span {
                trace_id: tid.to_vec(),
                span_id: sid.to_vec(),
                name: "op".into(),
                start_time_unix_nano: t0,
                end_time_unix_nano: t0 + 1000,
                ..Default::default()
            }
        })
        .collect();
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![kv("service.name", "spooltest")],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

#[derive(Default)]
struct Accepted {
    spans: AtomicU64,
    failures: AtomicU64,
    refused: AtomicU64,
}

/// Sends request pairs `from..` until `stop`, counting what the server accepted (200).
async fn load(
    run_otlp: std::net::SocketAddr,
    run_http: std::net::SocketAddr,
    from: u64,
    stop: Arc<AtomicBool>,
    acc: Arc<Accepted>,
) -> u64 {
    let c = reqwest::Client::new();
    let mut n = from;
    while !stop.load(Ordering::Relaxed) {
        let r = c
            .post(format!("http://{run_otlp}/v1/traces"))
            .bearer_auth(INGEST)
            .header("content-type", "application/x-protobuf")
            .body(spans_for(n))
            .send()
            .await;
        match r {
            Ok(r) if r.status() == 200 => {
                acc.spans.fetch_add(5, Ordering::Relaxed);
            }
            _ => {
                acc.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
        let line = format!(
            "{{\"ts\":{},\"service\":\"spooltest\",\"request_id\":\"r{n}\",\"message\":\"boom {n}\"}}\n",
            brownout_protocol::now_ms()
        );
        let r = c
            .post(format!("http://{run_http}/v1/failures"))
            .bearer_auth(INGEST)
            .body(line)
            .send()
            .await;
        match r {
            Ok(r) if r.status() == 200 => {
                acc.failures.fetch_add(1, Ordering::Relaxed);
            }
            _ => {
                acc.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
        n += 1;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    n
}

async fn status(run: &Running) -> serde_json::Value {
    reqwest::Client::new()
        .get(format!("http://{}/api/v1/ingest/status", run.http_addr))
        .bearer_auth(READ)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clickhouse_killed_mid_ingest_and_control_plane_restarted_loses_nothing_and_doubles_nothing()
 {
    let tmp = tempfile::tempdir().unwrap();
    let mut ch = OwnClickHouse::new(&tmp.path().join("ch"));
    ch.start().await;
    let prefix = format!("s{}_", uuid::Uuid::new_v4().simple());
    let cp_dir = tmp.path().join("cp");
    let acc = Arc::new(Accepted::default());

    // Phase 1: load, kill ClickHouse mid-ingest, keep loading (spooled).
    let run = start_cp(config(&cp_dir, &ch.url(), &prefix, 256 << 20)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let loader = tokio::spawn(load(
        run.otlp_http_addr,
        run.http_addr,
        0,
        stop.clone(),
        acc.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(700)).await;
    ch.kill();
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Ordering::Relaxed);
    let next = loader.await.unwrap();
    let s = status(&run).await;
    assert_eq!(s["store_up"], false, "{s}");
    assert!(
        s["spool_bytes"].as_u64().unwrap() > 0,
        "accepted data went to the spool: {s}"
    );
    run.stop().await.unwrap();

    // Phase 2: restart the control plane while ClickHouse is still down; it starts, accepts
    // more (spooled behind the rest).
    let run = start_cp(config(&cp_dir, &ch.url(), &prefix, 256 << 20)).await;
    assert!(
        status(&run).await["spool_bytes"].as_u64().unwrap() > 0,
        "the spool survived the restart"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let loader = tokio::spawn(load(
        run.otlp_http_addr,
        run.http_addr,
        next,
        stop.clone(),
        acc.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(400)).await;

    // Phase 3: ClickHouse returns (same data), load continues; the spool drains in order.
    ch.start().await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    stop.store(true, Ordering::Relaxed);
    loader.await.unwrap();
    let mut drained = false;
    for _ in 0..400 {
        let s = status(&run).await;
        if s["spool_bytes"] == 0 && s["store_up"] == true {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(drained, "spool never drained: {}", status(&run).await);
    run.stop().await.unwrap();

    let want_spans = acc.spans.load(Ordering::Relaxed);
    let want_failures = acc.failures.load(Ordering::Relaxed);
    assert!(
        want_spans > 100 && want_failures > 20,
        "the load ran: {want_spans} spans, {want_failures} failures"
    );
    let spans: Vec<u64> = ch
        .query(&format!(
            "SELECT count(), uniqExact(trace_id, span_id) FROM {prefix}spans"
        ))
        .await
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(
        spans,
        vec![want_spans, want_spans],
        "every accepted span stored exactly once"
    );
    let failures: Vec<u64> = ch
        .query(&format!(
            "SELECT count(), uniqExact(request_id) FROM {prefix}failures"
        ))
        .await
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(
        failures,
        vec![want_failures, want_failures],
        "every accepted failure stored exactly once"
    );
    for t in ["spans", "logs", "failures", "snapshots", "docs"] {
        ch.query(&format!("DROP TABLE IF EXISTS {prefix}{t}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_spool_answers_503_with_retry_after() {
    let tmp = tempfile::tempdir().unwrap();
    // Nothing listens on this port: the store is down from the start.
    let url = format!("http://127.0.0.1:{}", free_port());
    let mut cfg = config(&tmp.path().join("cp"), &url, "x_", 64 << 10);
    cfg.store_write_timeout = Duration::from_millis(500);
    let run = start_cp(cfg).await;
    let c = reqwest::Client::new();
    let mut first_503 = None;
    for n in 0..400u64 {
        let r = c
            .post(format!("http://{}/v1/traces", run.otlp_http_addr))
            .bearer_auth(INGEST)
            .header("content-type", "application/x-protobuf")
            .body(spans_for(n))
            .send()
            .await
            .unwrap();
        if r.status() == 503 {
            first_503 = Some((
                n,
                r.headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().to_string()),
            ));
            break;
        }
        assert_eq!(r.status(), 200);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (n, retry_after) = first_503.expect("a full spool refuses with 503");
    assert!(n > 10, "accepted until the spool filled ({n} requests)");
    assert_eq!(retry_after.as_deref(), Some("3"));
    let m = c
        .get(format!("http://{}/metrics", run.http_addr))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        m.contains("brownout_ingest_rejected_total{reason=\"spool_full\"} 1"),
        "{m}"
    );
    run.stop().await.unwrap();
}

/// `brownout drill clickhouse-kill`'s function against this server: the store is killed, 300
/// failure events are sent while it is down, it comes back, and each event is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clickhouse_kill_drill_stores_every_event_exactly_once() {
    let ch_dir = tempfile::tempdir().unwrap();
    let cp_dir = tempfile::tempdir().unwrap();
    let mut ch = OwnClickHouse::new(ch_dir.path());
    ch.start().await;
    let prefix = format!("drill_{}_", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let run = start_cp(config(cp_dir.path(), &ch.url(), &prefix, 64 << 20)).await;
    let ch = Arc::new(tokio::sync::Mutex::new(ch));
    let (k, r) = (Arc::clone(&ch), Arc::clone(&ch));
    let mut kill = brownout::drill::Fault::Async(Box::new(move || {
        let k = Arc::clone(&k);
        Box::pin(async move {
            k.lock().await.kill();
            Ok(())
        })
    }));
    let mut recover = brownout::drill::Fault::Async(Box::new(move || {
        let r = Arc::clone(&r);
        Box::pin(async move {
            r.lock().await.start().await;
            Ok(())
        })
    }));
    let target = brownout::drill::Target {
        plane: format!("http://{}", run.http_addr),
        read_token: Some(READ.into()),
        admin_token: None,
        ingest_token: Some(INGEST.into()),
    };
    let rep = brownout::drill::clickhouse_kill(
        &target,
        &mut kill,
        Some(&mut recover),
        300,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    eprintln!("{}", rep.render());
    assert!(rep.passed, "{}", rep.render());
    assert!(
        rep.steps
            .iter()
            .any(|s| s.name == "every event stored exactly once"
                && s.detail.starts_with("300 rows, 300 distinct")),
        "{}",
        rep.render()
    );
    run.stop().await.unwrap();
}

fn span_row(batch: u64, i: u64) -> brownout::store::SpanRow {
    brownout::store::SpanRow {
        trace_id: format!("{batch:016x}{i:016x}"),
        span_id: format!("{i:016x}"),
        parent_span_id: String::new(),
        service: "merged".into(),
        name: "op".into(),
        kind: 2,
        start_us: brownout_protocol::now_ms() * 1000,
        duration_us: 10,
        status: 0,
        status_message: String::new(),
        feature: String::new(),
        criticality: "default".into(),
        host: "h".into(),
        is_request: true,
        attributes: vec![("k".into(), format!("v{i}"))],
    }
}

fn batch_of(id: u64, spans: std::ops::Range<u64>) -> Arc<brownout::store::Batch> {
    Arc::new(brownout::store::Batch {
        id,
        spans: spans.map(|i| span_row(id, i)).collect(),
        ..Default::default()
    })
}

/// ClickHouse for a store test — `CLICKHOUSE_TEST_URL`, or a server of our own with its data
/// in `dir` (kept while the returned guard lives) — and a config whose tables get a fresh
/// prefix starting with `tag`.
pub(crate) async fn clickhouse_for_test(
    dir: &std::path::Path,
    tag: &str,
) -> (ClickHouseConfig, Option<OwnClickHouse>) {
    let mut own = None;
    let url = match std::env::var("CLICKHOUSE_TEST_URL") {
        Ok(u) if !u.is_empty() => u,
        _ => {
            let mut ch = OwnClickHouse::new(dir);
            ch.start().await;
            let u = ch.url();
            own = Some(ch);
            u
        }
    };
    let cfg = ClickHouseConfig {
        url,
        database: "default".into(),
        user: None,
        password: None,
        table_prefix: format!("{tag}{}_", uuid::Uuid::new_v4().simple()),
        cluster: None,
        tls: None,
    };
    (cfg, own)
}

/// A merged insert (several spool records, one INSERT) that reached ClickHouse but whose answer
/// was lost is retried in replay mode: each row carries its own batch id and index, so the
/// retry writes only what is missing — also for a batch that landed only in part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merged_insert_whose_answer_was_lost_is_not_doubled_on_replay() {
    use brownout::store::{Store, WriteMode, clickhouse::ClickHouseStore};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tmp = tempfile::tempdir().unwrap();
    let (cfg, own) = clickhouse_for_test(tmp.path(), "m").await;
    let (url, prefix) = (cfg.url.clone(), cfg.table_prefix.clone());
    let store = ClickHouseStore::new(&cfg);
    store.migrate().await.unwrap();
    let (a, b, c, d) = (
        batch_of(11, 0..3),
        batch_of(12, 0..2),
        batch_of(13, 0..4),
        batch_of(14, 0..5),
    );
    // A and B merged into one insert: it lands, the answer is lost.
    store
        .write_merged(vec![
            (Arc::clone(&a), WriteMode::Fresh),
            (Arc::clone(&b), WriteMode::Fresh),
        ])
        .await
        .unwrap();
    // D landed only in part (its first two rows) before the failure.
    store
        .write_merged(vec![(batch_of(14, 0..2), WriteMode::Fresh)])
        .await
        .unwrap();
    // The retry merges the uncertain records (replay mode) with a new one (C, fresh).
    store
        .write_merged(vec![
            (Arc::clone(&a), WriteMode::Replay),
            (Arc::clone(&b), WriteMode::Replay),
            (Arc::clone(&d), WriteMode::Replay),
            (Arc::clone(&c), WriteMode::Fresh),
        ])
        .await
        .unwrap();
    // And once more, all uncertain (a restart after the retry's answer was lost too).
    store
        .write_merged(
            [&a, &b, &c, &d]
                .into_iter()
                .map(|x| (Arc::clone(x), WriteMode::Replay))
                .collect(),
        )
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let q = |sql: String| {
        let http = http.clone();
        let url = url.clone();
        async move {
            http.post(&url)
                .body(sql)
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap()
        }
    };
    let got = q(format!(
        "SELECT batch_id, count(), uniqExact(seq), uniqExact(trace_id) FROM {prefix}spans \
         GROUP BY batch_id ORDER BY batch_id FORMAT CSV"
    ))
    .await;
    assert_eq!(
        got.trim(),
        "11,3,3,3\n12,2,2,2\n13,4,4,4\n14,5,5,5",
        "each row of each merged batch stored exactly once"
    );
    for t in ["spans", "logs", "failures", "snapshots", "docs"] {
        q(format!("DROP TABLE IF EXISTS {prefix}{t}")).await;
    }
    drop(own);
}

/// An insert ClickHouse is still writing when a replay of the same rows begins (the control
/// plane was killed, or its side timed out, after ClickHouse had the whole INSERT): the replay
/// waits until every insert its writer started earlier — a predecessor's on the same spool
/// included — has finished, and only then asks which rows are there; so it finds the rows and
/// does not store them twice. Past the settle bound it fails instead, without checking or
/// inserting, and a later retry writes nothing twice. Another writer's inserts are not waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_waits_for_an_insert_still_running_in_clickhouse_and_does_not_double_it() {
    use brownout::store::{Store, StoreError, WriteMode, clickhouse::ClickHouseStore};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tmp = tempfile::tempdir().unwrap();
    let (cfg, own) = clickhouse_for_test(tmp.path(), "s").await;
    let (url, prefix) = (cfg.url.clone(), cfg.table_prefix.clone());
    let store = ClickHouseStore::new(&cfg);
    store.migrate().await.unwrap();
    // The writer id a spool directory would give; unique per test run.
    let writer = format!("{:016x}", rand::random::<u64>());
    store.set_writer(&writer, Duration::from_secs(30));
    let http = reqwest::Client::new();
    let q = |sql: String| {
        let http = http.clone();
        let url = url.clone();
        async move {
            let r = http.post(&url).body(sql).send().await.unwrap();
            let ok = r.status().is_success();
            let text = r.text().await.unwrap();
            assert!(ok, "{text}");
            text
        }
    };
    // An INSERT of batch `batch`'s rows 0..3 that ClickHouse holds for ~3 s (a slow source),
    // sent by another client with query id `query_id`.
    let slow_insert = |batch: u64, query_id: String| {
        let http = http.clone();
        let url = url.clone();
        let sql = format!(
            "INSERT INTO {prefix}spans (ts, start_us, service, batch_id, seq) \
             SELECT now(), toUInt64(now()) * 1000000, 'slow', {batch}, toUInt32(number) \
             FROM (SELECT number FROM system.numbers LIMIT 3) WHERE sleep(3) = 0"
        );
        tokio::spawn(async move {
            let r = http
                .post(format!(
                    "{}/?query_id={query_id}",
                    url.trim_end_matches('/')
                ))
                .body(sql)
                .send()
                .await
                .unwrap();
            let ok = r.status().is_success();
            let text = r.text().await.unwrap();
            assert!(ok, "slow insert: {text}");
        })
    };
    let running = |query_id: String| async move {
        for _ in 0..200 {
            let n = q(format!(
                "SELECT count() FROM system.processes WHERE query_id = '{query_id}'"
            ))
            .await;
            if n.trim() == "1" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("{query_id} never showed up in system.processes");
    };
    let stored = |batch: u64| {
        let prefix = prefix.clone();
        async move {
            q(format!(
                "SELECT service, count(), uniqExact(seq) FROM {prefix}spans \
                 WHERE batch_id = {batch} GROUP BY service ORDER BY service FORMAT CSV"
            ))
            .await
            .trim()
            .to_string()
        }
    };

    // 1. A predecessor on this spool (another run of the same writer) left an insert of batch
    //    21 running; the restarted process replays batch 21.
    let id = format!("brownout-{writer}-0dead0-1");
    let slow = slow_insert(21, id.clone());
    running(id).await;
    store
        .write_merged(vec![(batch_of(21, 0..3), WriteMode::Replay)])
        .await
        .expect("the replay waits for the running insert, then checks");
    slow.await.unwrap();
    assert_eq!(
        stored(21).await,
        "\"slow\",3,3",
        "the replay found the running insert's rows once it finished and wrote none again"
    );

    // 2. With the wait bounded below the insert's run time, the replay fails rather than
    //    check too early; another writer's replay does not wait for this writer's insert.
    store.set_writer(&writer, Duration::from_millis(200));
    let id = format!("brownout-{writer}-0dead0-2");
    let slow = slow_insert(22, id.clone());
    running(id).await;
    let r = store
        .write_merged(vec![(batch_of(22, 0..3), WriteMode::Replay)])
        .await;
    assert!(
        matches!(r, Err(StoreError::Unsettled(_))),
        "a replay whose writer's earlier insert still runs past the bound fails: {r:?}"
    );
    let other = ClickHouseStore::new(&cfg);
    other.set_writer("0123456789abcdef", Duration::from_millis(200));
    other
        .write_merged(vec![(batch_of(23, 0..2), WriteMode::Replay)])
        .await
        .expect("another writer's running insert is not waited for");
    slow.await.unwrap();
    // The retry (as the shipper makes after its backoff) now settles at once.
    store
        .write_merged(vec![(batch_of(22, 0..3), WriteMode::Replay)])
        .await
        .unwrap();
    assert_eq!(
        stored(22).await,
        "\"slow\",3,3",
        "nothing of batch 22 doubled"
    );
    assert_eq!(stored(23).await, "\"merged\",2,2");

    // 3. This store's own insert, timed out on our side while ClickHouse goes on with it (a
    //    materialized view that sleeps keeps the INSERT running): it runs under the writer's
    //    query id, and the retry's replay returns only once it has finished.
    q(format!(
        "CREATE MATERIALIZED VIEW {prefix}slow_mv ENGINE = Memory AS \
         SELECT batch_id FROM {prefix}spans WHERE sleep(2) = 0"
    ))
    .await;
    store.set_writer(&writer, Duration::from_secs(30));
    let timed_out = tokio::time::timeout(
        Duration::from_millis(300),
        store.write_merged(vec![(batch_of(25, 0..3), WriteMode::Fresh)]),
    )
    .await;
    assert!(timed_out.is_err(), "the insert outlives our timeout");
    let ours = format!(
        "SELECT count() FROM system.processes WHERE startsWith(query_id, 'brownout-{writer}-')"
    );
    assert_eq!(
        q(ours.clone()).await.trim(),
        "1",
        "the store's INSERT runs under its writer's query id"
    );
    store
        .write_merged(vec![(batch_of(25, 0..3), WriteMode::Replay)])
        .await
        .unwrap();
    assert_eq!(
        q(ours).await.trim(),
        "0",
        "the replay returned only after the timed-out insert had finished"
    );
    assert_eq!(
        stored(25).await,
        "\"merged\",3,3",
        "nothing of batch 25 doubled"
    );
    q(format!("DROP TABLE IF EXISTS {prefix}slow_mv")).await;

    for t in ["spans", "logs", "failures", "snapshots", "docs"] {
        q(format!("DROP TABLE IF EXISTS {prefix}{t}")).await;
    }
    drop(own);
}
