//! The `brownout drill` functions that need only the control plane, against real processes on
//! loopback (engine-kill and redis-restart, which need the bundled serving tier, are in the
//! brownout-demo crate's tests):
//!
//! - leader-kill: two control-plane replicas leading through their own `redis-server`; the
//!   leader is killed without releasing the lease and the peer must take it over.
//! - the CLI: `brownout drill` with a shell `--inject` that fails reports the failure and exits 1.

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use brownout::auth::Tokens;
use brownout::config::{Config, Secret};
use brownout::degrade::Transport;
use brownout::drill::{self, Fault, Target};
use brownout::plane::{App, Listeners, Plane, PlaneOptions};
use brownout_test_support::OwnRedis;

const INGEST: &str = "ingest-token-drills-aaaa";
const READ: &str = "read-token-drills-bbbbbbb";
const ADMIN: &str = "admin-token-drills-ccccc";
const KEY: &[u8] = b"drill-command-key";

async fn plane_named(
    transport: Transport,
    cluster: &str,
    replica: Option<&str>,
) -> (Plane, String, tempfile::TempDir) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::defaults();
    config.data_dir = dir.path().to_path_buf();
    config.ingest.batch_max_delay = Duration::from_millis(20);
    let tokens = Tokens::new(
        Some(Secret::new(INGEST)),
        Some(Secret::new(READ)),
        Some(Secret::new(ADMIN)),
    );
    let app = App::build(config, tokens).await.unwrap();
    let listeners = Listeners::loopback().await.unwrap();
    let http = listeners.addrs().0;
    let mut opts = PlaneOptions::defaults(cluster, KEY, transport).unwrap();
    opts.replica_id = replica.map(String::from);
    let plane = Plane::start(app, listeners, opts).await.unwrap();
    (plane, format!("http://{http}"), dir)
}

fn target(plane: &str) -> Target {
    Target {
        plane: plane.to_string(),
        read_token: Some(READ.into()),
        admin_token: Some(ADMIN.into()),
        ingest_token: Some(INGEST.into()),
    }
}

#[test]
fn cli_reports_a_failed_injection_and_exits_non_zero() {
    let out = Command::new(env!("CARGO_BIN_EXE_brownout"))
        .args([
            "drill",
            "leader-kill",
            "--target",
            "http://127.0.0.1:9",
            "--inject",
            "exit 3",
            "--peer",
            "http://127.0.0.1:9",
            "--timeout-secs",
            "1",
        ])
        .env("BROWNOUT_READ_TOKEN", READ)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("drill leader-kill: FAILED"), "{stdout}");
    // The control plane is unreachable, so the first step fails and says why.
    assert!(stdout.contains("target is the leader"), "{stdout}");
    assert!(stderr.contains("drill leader-kill failed"), "{stderr}");
}

/// A control-plane replica on its own runtime thread, so that the test can kill it abruptly
/// (runtime dropped: no lease release, sockets closed), as a crashed process would die.
struct Replica {
    http: String,
    kill: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Replica {
    fn start(url: &str, cluster: &str, name: &str) -> Replica {
        let (url, cluster, name) = (url.to_string(), cluster.to_string(), name.to_string());
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (kill_tx, kill_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            let (plane, http, dir) =
                rt.block_on(plane_named(Transport::Redis { url }, &cluster, Some(&name)));
            addr_tx.send(http).unwrap();
            let _ = kill_rx.recv();
            std::mem::forget(plane); // no graceful stop: the lease is not released
            rt.shutdown_background();
            drop(dir);
        });
        let http = addr_rx.recv_timeout(Duration::from_secs(60)).unwrap();
        Replica {
            http,
            kill: Some(kill_tx),
            thread: Some(thread),
        }
    }

    fn kill(&mut self) {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_drill_sees_a_peer_take_the_lease() {
    let _redis = OwnRedis::start();
    let url = format!("redis://127.0.0.1:{}", _redis.port);
    let cluster = "drill-leader";
    let a = Arc::new(Mutex::new(Replica::start(&url, cluster, "cp-a")));
    // cp-a leads before cp-b starts.
    let a_http = a.lock().unwrap().http.clone();
    let client = reqwest::Client::new();
    let start = std::time::Instant::now();
    loop {
        let s: serde_json::Value = client
            .get(format!("{a_http}/api/v1/degrade"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if s["leader_epoch"].is_u64() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "cp-a never led: {s}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let b = Replica::start(&url, cluster, "cp-b");
    let a2 = Arc::clone(&a);
    let mut kill = Fault::Call(Box::new(move || {
        a2.lock().unwrap().kill();
        Ok(())
    }));
    let rep = drill::leader_kill(
        &target(&a_http),
        std::slice::from_ref(&b.http),
        &mut kill,
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    eprintln!("{}", rep.render());
    assert!(rep.passed, "{}", rep.render());
    // The lease is 5 s: a peer takes over after it expires, not before.
    let ms = rep.figures["takeover_after_fault_ms"].as_u64().unwrap();
    assert!((1000..=20_000).contains(&ms), "takeover after {ms} ms");
}
