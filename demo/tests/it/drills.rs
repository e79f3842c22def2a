//! The `brownout drill` functions against real processes on loopback, where the bundled serving
//! tier is needed (the drills that need only the control plane are in the root crate's tests):
//!
//! - engine-kill: a serving engine (tiny-random model) runs in a **child process** (this test
//!   binary re-executed); a gpu-agent scrapes it and pushes snapshots to a running control plane.
//!   The drill opens a stream, `kill -9`s the child on the first event, and checks that the
//!   client's stream ends (no hang) and that the control plane shows the engine down.
//! - redis-restart: a control plane leading through its own `redis-server` and a serving
//!   subscriber; the drill kills Redis, pins tier 1 during the outage, restarts Redis, and checks
//!   that the instance applies and acks tier 1.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use brownout::auth::Tokens;
use brownout::config::{Config, Secret};
use brownout::degrade::Transport;
use brownout::drill::{self, Fault, Target};
use brownout::plane::{App, Listeners, Plane, PlaneOptions};
use brownout_gpu_agent::{Agent, AgentConfig, EngineTarget};
use brownout_test_support::OwnRedis;

const INGEST: &str = "ingest-token-drills-aaaa";
const READ: &str = "read-token-drills-bbbbbbb";
const ADMIN: &str = "admin-token-drills-ccccc";
const KEY: &[u8] = b"drill-command-key";
const CHILD_ENV: &str = "BROWNOUT_DRILL_CHILD";

/// Entry point of the child process (run only when re-executed with `CHILD_ENV` set): a serving
/// engine on the tiny-random model that prints its port and serves until killed.
#[test]
#[ignore = "child-process entry point of the engine-kill drill test"]
fn child_engine_process() {
    if std::env::var(CHILD_ENV).as_deref() != Ok("engine") {
        return;
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use brownout_serving::api::{self as serving_api, ServeOptions};
        let opts = ServeOptions {
            model: "tiny-random".parse().unwrap(),
            served_model_name: Some("default".into()),
            ..ServeOptions::default()
        };
        let control = brownout_serving::control::ControlHandle::new("drill");
        let state = serving_api::build_state(
            &opts,
            control,
            brownout_serving::telemetry::Telemetry::disabled(),
        )
        .await
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("PORT {}", listener.local_addr().unwrap().port());
        serving_api::run_server(state, None, listener, std::future::pending())
            .await
            .unwrap();
    });
}

struct ChildEngine {
    child: Arc<Mutex<Child>>,
    url: String,
}

fn spawn_child_engine() -> ChildEngine {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "drills::child_engine_process",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "engine")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            // The harness prints "test child_engine_process ... " before the test's own output.
            if let Some((_, p)) = line.split_once("PORT ") {
                let _ = tx.send(p.trim().to_string());
            }
        }
    });
    let port = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the child engine did not print its port within 60 s");
    ChildEngine {
        child: Arc::new(Mutex::new(child)),
        url: format!("http://127.0.0.1:{port}"),
    }
}

impl Drop for ChildEngine {
    fn drop(&mut self) {
        if let Ok(mut c) = self.child.lock() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn plane(transport: Transport, cluster: &str) -> (Plane, String, tempfile::TempDir) {
    plane_named(transport, cluster, None).await
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_killed_mid_stream_ends_the_stream_and_is_reported_down() {
    let engine = spawn_child_engine();
    let (plane, cp, _dir) = plane(
        Transport::InProc(brownout::degrade::InProcBus::new()),
        "drill",
    )
    .await;
    let mut cfg = AgentConfig::new("drill-node").with_simulated_gpus(1);
    cfg.listen = None;
    cfg.engines = vec![EngineTarget {
        id: "engine-1".into(),
        url: engine.url.parse().unwrap(),
    }];
    cfg.control_plane = Some(cp.parse().unwrap());
    cfg.ingest_token = Some(INGEST.into());
    cfg.interval = Duration::from_millis(200);
    cfg.scrape_timeout = Duration::from_millis(150);
    let agent = Agent::new(cfg).unwrap();
    let (stop_agent, rx) = tokio::sync::oneshot::channel::<()>();
    let agent_task = tokio::spawn(async move {
        agent
            .run(None, async move {
                let _ = rx.await;
            })
            .await
    });

    let t = target(&cp);
    // Wait for the agent's first snapshot with the engine up.
    let start = std::time::Instant::now();
    loop {
        let hosts: serde_json::Value = reqwest::Client::new()
            .get(format!("{cp}/api/v1/hosts"))
            .bearer_auth(READ)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if hosts.to_string().contains("\"up\":true") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the agent never reported the engine up: {hosts}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let child = Arc::clone(&engine.child);
    let mut kill = Fault::Call(Box::new(move || {
        let mut c = child.lock().unwrap();
        c.kill()?; // SIGKILL
        c.wait()?;
        Ok(())
    }));
    let rep = drill::engine_kill(
        &t,
        &engine.url,
        &mut kill,
        None,
        Duration::from_secs(5),
        Duration::from_secs(20),
    )
    .await
    .unwrap();
    eprintln!("{}", rep.render());
    assert!(rep.passed, "{}", rep.render());
    let names: Vec<&str> = rep.steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "engine reported up",
            "stream opened",
            "fault injected",
            "stream ended",
            "engine reported down"
        ]
    );
    let end_ms = rep.figures["stream_end_after_fault_ms"].as_u64().unwrap();
    assert!(end_ms < 5000, "stream ended {end_ms} ms after the kill");
    assert!(rep.figures["marked_down_after_fault_ms"].as_u64().is_some());
    let _ = stop_agent.send(());
    let _ = agent_task.await;
    plane.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_drill_converges_on_the_tier_pinned_during_the_outage() {
    let redis = Arc::new(Mutex::new(OwnRedis::start()));
    let url = format!("redis://127.0.0.1:{}", redis.lock().unwrap().port);
    let cluster = "drill-redis";
    let (plane, cp, _dir) = plane(Transport::Redis { url: url.clone() }, cluster).await;
    let serving = brownout_serving::control::ControlHandle::new(cluster);
    let mut scfg =
        brownout_serving::control::SubscriberConfig::new(&url, cluster, KEY, "engine-r1");
    scfg.anti_entropy = Duration::from_millis(250);
    scfg.reconnect_max = Duration::from_millis(200);
    let sub = brownout_serving::control::spawn_subscriber(serving.clone(), scfg).await;
    // The first command (T0) reaches the instance and is acked.
    let client = reqwest::Client::new();
    let start = std::time::Instant::now();
    loop {
        let s: serde_json::Value = client
            .get(format!("{cp}/api/v1/degrade"))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if s["acks"].to_string().contains("applied") {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "no ack: {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (r1, r2) = (Arc::clone(&redis), Arc::clone(&redis));
    let mut kill = Fault::Call(Box::new(move || {
        r1.lock().unwrap().kill();
        Ok(())
    }));
    let mut respawn = Fault::Call(Box::new(move || {
        r2.lock().unwrap().spawn();
        Ok(())
    }));
    let rep = drill::redis_restart(
        &target(&cp),
        &mut kill,
        Some(&mut respawn),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    eprintln!("{}", rep.render());
    assert!(rep.passed, "{}", rep.render());
    assert_eq!(serving.tier(), brownout_protocol::Tier::T1);
    assert!(rep.figures["converged_after_fault_ms"].as_u64().is_some());
    sub.abort();
    plane.stop().await.unwrap();
}
