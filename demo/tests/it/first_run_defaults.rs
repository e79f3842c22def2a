//! A first run with no cluster configured anywhere: the control plane (`Config` from an empty
//! file, as `brownout serve` loads it) and a serving tier (`SubscriberConfig::from_env` with no
//! `--cluster`, as `brownout-serve` builds it) share one Redis and nothing else. They must meet on
//! the same default cluster: an operator override reaches the engine and its ack comes back to
//! the control plane. (The gpu-agent has no cluster: it pushes snapshots over HTTP.)

use std::collections::BTreeMap;
use std::time::Duration;

use brownout::config::Config;
use brownout::plane::Plane;
use brownout_protocol::{DEFAULT_CLUSTER, Tier};
use brownout_serving::control::{ControlHandle, SubscriberConfig, spawn_subscriber};
use brownout_test_support::{OwnRedis, free_port, wait_for, wait_for_async};
use serde_json::{Value, json};

const ADMIN: &str = "first-run-admin-token-0123456789";
const READ: &str = "first-run-read-token-0123456789";
const INGEST: &str = "first-run-ingest-token-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_and_serving_tier_with_no_cluster_configured_meet_and_ack() {
    // Our own Redis: the default cluster's keys are shared by every run on the shared server.
    let redis = OwnRedis::start();
    let data = tempfile::tempdir().unwrap();
    let env: BTreeMap<String, String> = [
        ("REDIS_URL", redis.url()),
        ("BROWNOUT_ADMIN_TOKEN", ADMIN.to_string()),
        ("BROWNOUT_READ_TOKEN", READ.to_string()),
        ("BROWNOUT_INGEST_TOKEN", INGEST.to_string()),
        ("BROWNOUT_DATA_DIR", data.path().display().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    // Only the listen addresses are set (the defaults' ports may be taken on a test machine).
    let http = format!("127.0.0.1:{}", free_port());
    let toml = format!(
        "[server]\nhttp_addr = \"{http}\"\notlp_http_addr = \"127.0.0.1:{}\"\notlp_grpc_addr = \"127.0.0.1:{}\"\n",
        free_port(),
        free_port()
    );
    let config = Config::from_toml_str("first-run.toml", &toml, &env).unwrap();
    assert_eq!(
        config.cluster, DEFAULT_CLUSTER,
        "the control plane's default"
    );
    let plane = Plane::from_config(config).await.unwrap();

    // The serving tier exactly as brownout-serve builds it with REDIS_URL and the control
    // plane's data directory, no cluster and no key: it finds the public key the control plane
    // generated there on first start, and derives its own ack key from the ack master.
    assert!(data.path().join("command-signing.pub").exists());
    let sub = SubscriberConfig::from_env_in(
        Some(redis.url()),
        None,
        None,
        "serve-first-run",
        data.path(),
    )
    .unwrap()
    .expect("a Redis URL gives a subscriber");
    assert!(!sub.keys.verifier.is_hmac(), "Ed25519 by default");
    assert_eq!(sub.cluster, DEFAULT_CLUSTER, "the serving tier's default");
    let engine = ControlHandle::with_instance(&sub.cluster, "serve-first-run");
    let _subscriber = spawn_subscriber(engine.clone(), sub).await;

    brownout_gpu_agent::ensure_crypto_provider();
    let c = reqwest::Client::new();
    let r = c
        .post(format!("http://{http}/api/v1/degrade/override"))
        .bearer_auth(ADMIN)
        .json(&json!({"tier": 3, "duration_secs": 60, "reason": "first run"}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    wait_for(
        "the engine applies the override",
        Duration::from_secs(15),
        || engine.tier() == Tier::T3,
    )
    .await;
    wait_for_async(
        "the control plane sees the engine's ack",
        Duration::from_secs(15),
        || {
            let (c, http) = (c.clone(), http.clone());
            async move {
                let Ok(r) = c
                    .get(format!("http://{http}/api/v1/degrade"))
                    .bearer_auth(READ)
                    .send()
                    .await
                else {
                    return false;
                };
                let v: Value = r.json().await.unwrap_or(Value::Null);
                v["acks"].as_array().is_some_and(|a| {
                    a.iter()
                        .any(|a| a["instance"] == "serve-first-run" && a["status"] == "applied")
                }) && v["unacked"].is_null()
            }
        },
    )
    .await;
    plane.stop().await.unwrap();
}
