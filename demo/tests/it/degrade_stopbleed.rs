//! Per-instance stop-bleed end to end through the real Redis (a unique cluster per test): the
//! control plane's automatic KV actions reach the serving tier they address and no other, and an
//! operator's hand-pinned drain makes a real serving tier (the tiny-random model behind real
//! HTTP) answer 503 `instance_draining` to default traffic and 200 to critical traffic.
//!
//! Waits poll with a generous deadline (a deadlock guard, never a timing assertion).

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use brownout::degrade::{DegradeConfig, DegradeHandle, Policy, Transport, router, run_controller};
use brownout_protocol::{AgentSnapshot, EngineStats, KvStats, now_ms};
use brownout_serving::control::{ControlHandle, SubscriberConfig, spawn_subscriber};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use brownout_test_support::{redis_url, require_redis, unique, wait_for};

const KEY: &[u8] = b"stopbleed-test-key";
const LIMIT: Duration = Duration::from_secs(30);

/// Fast timings, the seed's shape: watch > 0.85, halve > 0.92 for 1 s, drain 1 s later,
/// restore each after 1 s below 0.80.
const POLICY: &str = r#"
evaluate_interval_ms: 50
command_lease_ms: 3000
snapshot_stale_ms: 2000
features:
  - { name: basic_qa, criticality: critical }
tiers:
  t1: { hold_down_secs: 1 }
  t2:
    hold_down_secs: 1
    params: { model_route: fallback, max_tokens_cap: 128, max_num_seqs: 8 }
  t3:
    hold_down_secs: 1
    params: { admit_min_criticality: critical, retry_after_base_secs: 2, jitter_ratio: 0.5, recovery_eta_max_secs: 60 }
instances:
  kv_usage:
    watch_above_ratio: 0.85
    watch_for_secs: 0
    halve_above_ratio: 0.92
    halve_for_secs: 1
    drain_after_secs: 1
    exit_below_ratio: 0.80
    hold_down_secs: 1
"#;

fn handle(cluster: &str) -> DegradeHandle {
    let mut c = DegradeConfig::new(cluster, KEY, Policy::from_yaml(POLICY).unwrap());
    c.leader_lease_ms = 600;
    c.redis_timeout = Duration::from_millis(300);
    DegradeHandle::new(c, &prometheus::Registry::new()).unwrap()
}

fn subscriber_cfg(url: &str, cluster: &str, inst: &str) -> SubscriberConfig {
    let mut c = SubscriberConfig::new(url, cluster, KEY, inst);
    c.anti_entropy = Duration::from_millis(250);
    c.lease_check = Duration::from_millis(50);
    c.reconnect_min = Duration::from_millis(20);
    c.reconnect_max = Duration::from_millis(100);
    c
}

async fn call(
    app: &axum::Router,
    method: &str,
    uri: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// One agent snapshot per host with one engine at `kv` KV usage.
fn snapshot(host: &str, kv: f64) -> AgentSnapshot {
    AgentSnapshot {
        host: host.into(),
        ts_ms: now_ms(),
        probe_up: true,
        engines: vec![EngineStats {
            id: "engine-0".into(),
            up: true,
            kv: KvStats {
                usage_ratio: kv,
                ..KvStats::default()
            },
            configured_max_num_seqs: Some(64),
            ..EngineStats::default()
        }],
        ..AgentSnapshot::default()
    }
}

fn entry(h: &ControlHandle) -> (Option<u32>, Option<bool>) {
    h.instance_entry()
        .map_or((None, None), |r| (r.entry.max_num_seqs, r.entry.drain))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_held_above_92_percent_is_halved_then_drained_its_peer_not_and_both_recover() {
    let url = redis_url();
    require_redis(&url);
    let cl = unique("t-stopbleed-");
    let h = handle(&cl);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let ctl = tokio::spawn(run_controller(
        h.clone(),
        Transport::Redis { url: url.clone() },
        async move {
            let _ = stop_rx.await;
        },
    ));
    // Two serving tiers, addressed as `<host>/<engine id>` (what the snapshots say).
    let a = ControlHandle::with_instance(&cl, "gpu-1/engine-0");
    let b = ControlHandle::with_instance(&cl, "gpu-2/engine-0");
    let _sa = spawn_subscriber(a.clone(), subscriber_cfg(&url, &cl, "gpu-1/engine-0")).await;
    let _sb = spawn_subscriber(b.clone(), subscriber_cfg(&url, &cl, "gpu-2/engine-0")).await;
    // The agents: A at 0.95, B at 0.50, a snapshot every 50 ms.
    let kv_a = std::sync::Arc::new(std::sync::Mutex::new(0.95f64));
    let feeder = {
        let h = h.clone();
        let kv_a = kv_a.clone();
        tokio::spawn(async move {
            loop {
                let v = *kv_a.lock().unwrap();
                h.push_snapshot(snapshot("gpu-1", v));
                h.push_snapshot(snapshot("gpu-2", 0.5));
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    // Halved (64 -> 32) on A only.
    wait_for("A halved", LIMIT, || entry(&a).0 == Some(32)).await;
    assert_eq!(entry(&b), (None, None), "the peer is unaffected");
    // Still above 92 % a second later: drained.
    wait_for("A drained", LIMIT, || entry(&a) == (Some(32), Some(true))).await;
    assert_eq!(entry(&b), (None, None), "the peer is unaffected");
    // The API shows the action with its ack; the decision log recorded both steps.
    wait_for("drain acked", LIMIT, || {
        h.status().instances.iter().any(|v| {
            v.action.instance == "gpu-1/engine-0"
                && v.action.action == "drain"
                && v.ack == "applied"
        })
    })
    .await;
    let app = router(h.clone());
    let (s, v) = call(&app, "GET", "/api/v1/degrade", None).await;
    assert_eq!(s, StatusCode::OK);
    let inst = v["instances"].as_array().unwrap();
    assert!(
        inst.iter().all(|x| x["instance"] != "gpu-2/engine-0"),
        "{inst:?}"
    );
    assert_eq!(v["command"]["instances"]["gpu-1/engine-0"]["drain"], true);
    let logged: Vec<String> = h
        .decisions()
        .iter()
        .flat_map(|d| d.instance_actions.iter().map(|a| a.action.clone()))
        .collect();
    for want in ["watch", "halve", "drain"] {
        assert!(
            logged.iter().any(|a| a == want),
            "{want} not logged: {logged:?}"
        );
    }
    let acks = h.status().acks;
    let ack_a = acks
        .iter()
        .find(|x| x.instance == "gpu-1/engine-0")
        .unwrap();
    assert_eq!(ack_a.entry.as_deref(), Some("own"));
    let ack_b = acks
        .iter()
        .find(|x| x.instance == "gpu-2/engine-0")
        .unwrap();
    assert_eq!(ack_b.entry, None, "the peer was not addressed");

    // Recovery: below 0.80, the drain ends first, then the halving.
    *kv_a.lock().unwrap() = 0.5;
    wait_for("A undrained", LIMIT, || entry(&a) == (Some(32), None)).await;
    wait_for("A restored", LIMIT, || entry(&a) == (None, None)).await;
    assert_eq!(entry(&b), (None, None));
    wait_for("no action left", LIMIT, || h.status().instances.is_empty()).await;

    feeder.abort();
    let _ = stop_tx.send(());
    ctl.await.unwrap().unwrap();
}

/// A serving tier on the tiny-random model behind real HTTP, subscribed to the cluster.
async fn serving(url: &str, cluster: &str, instance: &str) -> (ControlHandle, String) {
    use brownout_serving::api::{self as serving_api, ServeOptions};
    let opts = ServeOptions {
        model: "tiny-random".parse().unwrap(),
        served_model_name: Some("default".into()),
        ..ServeOptions::default()
    };
    let control = ControlHandle::with_instance(cluster, instance);
    let sub = spawn_subscriber(control.clone(), subscriber_cfg(url, cluster, instance)).await;
    let state = serving_api::build_state(
        &opts,
        control.clone(),
        brownout_serving::telemetry::Telemetry::disabled(),
    )
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _keep = sub;
        serving_api::run_server(state, None, listener, std::future::pending())
            .await
            .unwrap();
    });
    (control, base)
}

async fn complete(base: &str, criticality: Option<&str>) -> (u16, Option<String>, Value) {
    let mut b = reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .timeout(Duration::from_secs(60))
        .json(&json!({"model": "default", "prompt": "hello", "max_tokens": 2, "temperature": 0}));
    if let Some(c) = criticality {
        b = b.header("x-brownout-criticality", c);
    }
    let r = b.send().await.unwrap();
    let s = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let v = r.json::<Value>().await.unwrap_or(Value::Null);
    (s, retry, v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_pinned_drain_refuses_default_traffic_on_that_instance_only() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = redis_url();
    require_redis(&url);
    let cl = unique("t-pin-");
    let h = handle(&cl);
    let app = router(h.clone());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let ctl = tokio::spawn(run_controller(
        h.clone(),
        Transport::Redis { url: url.clone() },
        async move {
            let _ = stop_rx.await;
        },
    ));
    let (a, base_a) = serving(&url, &cl, "gpu-7/engine-0").await;
    let (b, base_b) = serving(&url, &cl, "gpu-8/engine-0").await;
    wait_for("both acked", LIMIT, || h.status().acks.len() == 2).await;

    // Bad requests first: clear codes, nothing pinned.
    for (body, code) in [
        (json!({"duration_secs": 60, "reason": "x"}), "empty_action"),
        (
            json!({"drain": true, "duration_secs": 0, "reason": "x"}),
            "invalid_duration",
        ),
        (
            json!({"drain": true, "duration_secs": 60, "reason": " "}),
            "invalid_reason",
        ),
        (
            json!({"max_num_seqs": 0, "duration_secs": 60, "reason": "x"}),
            "invalid_max_num_seqs",
        ),
        (
            json!({"drain": true, "duration_secs": 60, "reason": "x", "extra": 1}),
            "invalid_json",
        ),
    ] {
        let (s, v) = call(
            &app,
            "POST",
            "/api/v1/degrade/instances/gpu-7%2Fengine-0",
            Some(body),
        )
        .await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some(code)),
            "{v}"
        );
    }
    let (s, v) = call(
        &app,
        "POST",
        "/api/v1/degrade/instances/*",
        Some(json!({"drain": true, "duration_secs": 60, "reason": "x"})),
    )
    .await;
    assert_eq!(v["error"]["code"], "invalid_instance", "{s} {v}");
    assert!(h.instance_overrides().is_empty());

    // Pin a drain on gpu-7/engine-0 (the id written with its slash as is).
    let (s, v) = call(
        &app,
        "POST",
        "/api/v1/degrade/instances/gpu-7/engine-0",
        Some(json!({"drain": true, "duration_secs": 600, "reason": "<b>xid 79</b>"})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["instance"], "gpu-7/engine-0");
    wait_for("A draining", LIMIT, || {
        a.instance_entry().is_some_and(|r| r.draining())
    })
    .await;
    assert!(b.instance_entry().is_none(), "the peer has no entry");

    let (s, retry, v) = complete(&base_a, None).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("instance_draining")),
        "{v}"
    );
    assert!(
        retry.is_some(),
        "a Retry-After so the client goes elsewhere"
    );
    let (s, _, v) = complete(&base_a, Some("critical")).await;
    assert_eq!(s, 200, "critical traffic is still served: {v}");
    let (s, _, v) = complete(&base_b, None).await;
    assert_eq!(s, 200, "the peer serves default traffic: {v}");

    // Visible with its ack; the operator action is in the decision log.
    wait_for("operator action acked", LIMIT, || {
        h.status()
            .instances
            .iter()
            .any(|v| v.action.action == "operator" && v.ack == "applied")
    })
    .await;
    assert!(
        h.decisions()
            .iter()
            .any(|d| d.instance_actions.iter().any(|a| a.action == "operator"))
    );

    // DELETE ends it.
    let (s, v) = call(
        &app,
        "DELETE",
        "/api/v1/degrade/instances/gpu-7%2Fengine-0",
        None,
    )
    .await;
    assert_eq!(
        (s, v["removed"].as_bool()),
        (StatusCode::OK, Some(true)),
        "{v}"
    );
    wait_for("A undrained", LIMIT, || a.instance_entry().is_none()).await;
    let (s, _, v) = complete(&base_a, None).await;
    assert_eq!(s, 200, "{v}");

    let _ = stop_tx.send(());
    ctl.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_action_posted_to_a_follower_is_published_by_the_leader() {
    let url = redis_url();
    require_redis(&url);
    let cl = unique("t-inst-follower-");
    let a = handle(&cl);
    let b = handle(&cl);
    let ctl_a = tokio::spawn(run_controller(
        a.clone(),
        Transport::Redis { url: url.clone() },
        std::future::pending(),
    ));
    wait_for("a leads", LIMIT, || a.leader_epoch().is_some()).await;
    let ctl_b = tokio::spawn(run_controller(
        b.clone(),
        Transport::Redis { url: url.clone() },
        std::future::pending(),
    ));
    let serving = ControlHandle::with_instance(&cl, "gpu-5/engine-1");
    let sub = spawn_subscriber(serving.clone(), subscriber_cfg(&url, &cl, "gpu-5/engine-1")).await;
    wait_for("T0 published", LIMIT, || {
        serving.current().command.version > 0
    })
    .await;
    assert!(b.leader_epoch().is_none());

    let app_b = router(b.clone());
    let (s, v) = call(
        &app_b,
        "POST",
        "/api/v1/degrade/instances/gpu-5%2Fengine-1",
        Some(json!({"max_num_seqs": 16, "duration_secs": 60, "reason": "via follower"})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    wait_for("the leader publishes it", LIMIT, || {
        serving.instance_entry().and_then(|r| r.entry.max_num_seqs) == Some(16)
    })
    .await;
    assert!(a.instance_overrides().contains_key("gpu-5/engine-1"));
    let (s, _) = call(
        &app_b,
        "DELETE",
        "/api/v1/degrade/instances/gpu-5/engine-1",
        None,
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    wait_for("removed everywhere", LIMIT, || {
        a.instance_overrides().is_empty() && serving.instance_entry().is_none()
    })
    .await;
    ctl_a.abort();
    ctl_b.abort();
    sub.abort();
}
