//! Acknowledged means durable: the real `brownout serve` binary is killed with SIGKILL while
//! four clients send failure events, restarted on the same data dir, and every event it
//! acknowledged with 200 must be stored exactly once — with no event stored twice. This is the
//! `brownout drill plane-kill` function, with the kill and the restart done by the test.
//!
//! - embedded SQLite (always);
//! - ClickHouse (our own clickhouse-server on its own ports and data dir, or
//!   `CLICKHOUSE_TEST_URL` when set, with a table prefix of the test's own).

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use brownout::drill::{self, Fault, Target};
use brownout_test_support::{free_port, unique};

use crate::ingest_spool_clickhouse::OwnClickHouse;

pub(crate) const INGEST: &str = "ingest-token-crash-aaaaaaa";
pub(crate) const READ: &str = "read-token-crash-bbbbbbbbb";
const ADMIN: &str = "admin-token-crash-cccccccc";

/// One `brownout serve` child on fixed ports and a data dir that outlive it.
pub(crate) struct Serve {
    pub(crate) config: std::path::PathBuf,
    http: u16,
    child: Option<Child>,
    pub(crate) log: std::path::PathBuf,
}

impl Serve {
    pub(crate) fn new(dir: &std::path::Path, clickhouse: Option<(&str, &str)>) -> Serve {
        let (http, otlp, grpc) = (free_port(), free_port(), free_port());
        let storage = match clickhouse {
            Some((url, prefix)) => {
                format!("clickhouse_url = \"{url}\"\ntable_prefix = \"{prefix}\"\n")
            }
            None => String::new(),
        };
        let toml = format!(
            "[server]\nhttp_addr = \"127.0.0.1:{http}\"\notlp_http_addr = \"127.0.0.1:{otlp}\"\n\
             otlp_grpc_addr = \"127.0.0.1:{grpc}\"\n\n[storage]\ndata_dir = \"{}\"\n{storage}",
            dir.join("data").display()
        );
        let config = dir.join("brownout.toml");
        std::fs::write(&config, toml).unwrap();
        Serve {
            config,
            http,
            child: None,
            log: dir.join("serve.log"),
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }

    pub(crate) fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_brownout"))
            .args(["serve", "--config"])
            .arg(&self.config)
            .env("BROWNOUT_INGEST_TOKEN", INGEST)
            .env("BROWNOUT_READ_TOKEN", READ)
            .env("BROWNOUT_ADMIN_TOKEN", ADMIN)
            .env("BROWNOUT_COMMAND_KEY", "crash-test-command-key-0123456789")
            .env_remove("CLICKHOUSE_URL")
            .env_remove("REDIS_URL")
            .env_remove("BROWNOUT_DATA_DIR")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
    }

    /// SIGTERM, as a rollout sends it; waits for the exit and returns its status.
    fn term(&mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        for _ in 0..600 {
            if let Ok(Some(st)) = c.try_wait() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }

    /// SIGKILL: no shutdown flush, no lease release, as a crash.
    pub(crate) fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub(crate) async fn wait_ready(url: String, log: std::path::PathBuf) -> anyhow::Result<()> {
        let c = reqwest::Client::new();
        for _ in 0..600 {
            if c.get(format!("{url}/healthz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::bail!(
            "brownout serve did not answer on {url}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        )
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        self.kill9();
    }
}

async fn kill_mid_ingest(clickhouse: Option<(&str, &str)>, events: usize) {
    kill_mid_ingest_then(clickhouse, events, None, false).await;
}

/// The drill with the kill done by the test; `also_recover` runs after the restart (e.g. the
/// store comes back).
async fn kill_mid_ingest_then(
    clickhouse: Option<(&str, &str)>,
    events: usize,
    also_recover: Option<Box<dyn FnOnce() -> futures::future::BoxFuture<'static, ()> + Send>>,
    sigterm: bool,
) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let mut s = Serve::new(dir.path(), clickhouse);
    s.spawn();
    Serve::wait_ready(s.url(), s.log.clone()).await.unwrap();
    let (url, log) = (s.url(), s.log.clone());
    let s = Arc::new(Mutex::new(s));
    let s1 = Arc::clone(&s);
    let mut kill = Fault::Call(Box::new(move || {
        let mut s = s1.lock().unwrap();
        if !sigterm {
            s.kill9();
            return Ok(());
        }
        match s.term() {
            Some(st) if st.success() => Ok(()),
            other => anyhow::bail!("brownout serve after SIGTERM: {other:?}"),
        }
    }));
    let s2 = Arc::clone(&s);
    let also = Arc::new(Mutex::new(also_recover));
    let mut restart = Fault::Async(Box::new(move || {
        s2.lock().unwrap().spawn();
        let ready = Serve::wait_ready(url.clone(), log.clone());
        let also = also.lock().unwrap().take();
        Box::pin(async move {
            ready.await?;
            if let Some(f) = also {
                f().await;
            }
            Ok(())
        })
    }));
    let t = Target {
        plane: s.lock().unwrap().url(),
        read_token: Some(READ.into()),
        admin_token: Some(ADMIN.into()),
        ingest_token: Some(INGEST.into()),
    };
    let rep = drill::plane_kill(
        &t,
        &mut kill,
        Some(&mut restart),
        events,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    eprintln!("{}", rep.render());
    assert!(rep.passed, "{}", rep.render());
    if sigterm {
        // A graceful stop loses nothing either; the mid-ingest figures below are SIGKILL's.
        return;
    }
    // The kill came mid-ingest: some events were acknowledged before it, and not all were.
    let acked = rep.figures["acked"].as_u64().unwrap();
    let at_kill = rep.figures["acked_at_kill"].as_u64().unwrap();
    assert!(at_kill > 0, "{}", rep.render());
    assert!(
        acked < events as u64,
        "the kill came after everything was sent"
    );
    assert!(
        rep.figures["stored_rows"].as_u64().unwrap() >= acked,
        "{}",
        rep.render()
    );
}

/// SIGTERM mid-ingest instead: `brownout serve` flushes and exits 0 (the kill step fails
/// otherwise), and every acknowledged event is stored once after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_of_serve_exits_0_and_loses_no_acknowledged_event() {
    kill_mid_ingest_then(None, 20_000, None, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_serve_on_sqlite_loses_no_acknowledged_event() {
    kill_mid_ingest(None, 20_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_serve_on_clickhouse_loses_no_acknowledged_event() {
    let dir = tempfile::tempdir().unwrap();
    let mut own = None;
    let url = match std::env::var("CLICKHOUSE_TEST_URL") {
        Ok(u) if !u.is_empty() => u,
        _ => {
            let mut ch = OwnClickHouse::new(dir.path());
            ch.start().await;
            let u = ch.url();
            own = Some(ch);
            u
        }
    };
    let prefix = unique("crash_") + "_";
    kill_mid_ingest(Some((&url, &prefix)), 20_000).await;
    drop(own);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_while_spooling_for_a_dead_clickhouse_loses_nothing_acknowledged() {
    // ClickHouse is down for the whole run: every acknowledged batch is in the spool when
    // `brownout serve` is killed; it is restarted (ClickHouse still down), then ClickHouse
    // comes back and the spool is replayed exactly once.
    let dir = tempfile::tempdir().unwrap();
    let mut ch = OwnClickHouse::new(dir.path());
    ch.start().await;
    let url = ch.url();
    ch.kill();
    let ch = Arc::new(tokio::sync::Mutex::new(ch));
    let ch2 = Arc::clone(&ch);
    let back: Box<dyn FnOnce() -> futures::future::BoxFuture<'static, ()> + Send> =
        Box::new(move || {
            Box::pin(async move {
                ch2.lock().await.start().await;
            })
        });
    let prefix = unique("spoolcrash_") + "_";
    kill_mid_ingest_then(Some((&url, &prefix)), 5_000, Some(back), false).await;
    drop(ch);
}

/// Sends failure event `n` of `service` as its own request; true when acknowledged (200).
async fn send_event(c: &reqwest::Client, url: &str, service: &str, n: u64) -> bool {
    let line = format!(
        "{{\"ts\":{},\"service\":\"{service}\",\"request_id\":\"k{n}\",\"message\":\"acked {n}\"}}\n",
        brownout_protocol::now_ms()
    );
    c.post(format!("{url}/v1/failures"))
        .bearer_auth(INGEST)
        .body(line)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .is_ok_and(|r| r.status() == 200)
}

async fn ingest_status(c: &reqwest::Client, url: &str) -> Option<serde_json::Value> {
    c.get(format!("{url}/api/v1/ingest/status"))
        .bearer_auth(READ)
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()
}

/// Waits until the spool is empty and the store up (everything shipped).
async fn wait_shipped(c: &reqwest::Client, url: &str) {
    for _ in 0..1200 {
        if let Some(s) = ingest_status(c, url).await
            && s["spool_bytes"] == 0
            && s["store_up"] == true
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the spool never drained: {:?}", ingest_status(c, url).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_with_acknowledged_but_unshipped_records_stores_each_exactly_once() {
    // ClickHouse is acknowledged from the spool: while our ClickHouse is frozen (SIGSTOP, its
    // inserts hang) `brownout serve` still acknowledges — the rows are in the fsync'ed spool,
    // not yet in ClickHouse. Then serve is killed with SIGKILL (inserts cut off mid-way, the
    // cursor behind them), ClickHouse resumes, serve restarts on the same data dir, and every
    // acknowledged event is in ClickHouse exactly once.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let mut ch = OwnClickHouse::new(&dir.path().join("ch"));
    ch.start().await;
    let prefix = unique("unshipped_") + "_";
    let mut s = Serve::new(dir.path(), Some((&ch.url(), &prefix)));
    s.spawn();
    let url = s.url();
    Serve::wait_ready(url.clone(), s.log.clone()).await.unwrap();
    let c = reqwest::Client::new();
    let service = "unshipped";
    let mut acked = 0u64;
    // Some shipped the normal way first.
    for n in 0..100 {
        assert!(send_event(&c, &url, service, n).await, "event {n} refused");
        acked += 1;
    }
    wait_shipped(&c, &url).await;

    ch.pause();
    for n in 100..400 {
        assert!(
            send_event(&c, &url, service, n).await,
            "event {n} refused while ClickHouse is frozen: acknowledgements must not wait for it"
        );
        acked += 1;
    }
    let st = ingest_status(&c, &url).await.expect("status");
    assert!(
        st["spool_bytes"].as_u64().unwrap() > 0,
        "acknowledged rows are waiting in the spool: {st}"
    );
    s.kill9();
    ch.resume();
    // Let ClickHouse finish what it had fully received before the kill (an insert whose answer
    // is lost), so the restarted shipper's check sees it.
    ch.query("SELECT 1").await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    s.spawn();
    Serve::wait_ready(url.clone(), s.log.clone()).await.unwrap();
    wait_shipped(&c, &url).await;
    let got: Vec<u64> = ch
        .query(&format!(
            "SELECT count(), uniqExact(request_id) FROM {prefix}failures WHERE service = '{service}'"
        ))
        .await
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect();
    assert_eq!(
        got,
        vec![acked, acked],
        "every acknowledged event stored exactly once"
    );
    s.kill9();
}
