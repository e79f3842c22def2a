//! Control plane ↔ serving tier through the real Redis: decision → applied → ack end to end,
//! Redis restarted mid-run (own redis-server on a spare port), leader failover and fencing,
//! the operator API and the Alertmanager webhook.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use brownout::degrade::redis::{PublishOutcome, RedisBus};
use brownout::degrade::{DegradeConfig, DegradeHandle, Policy, Transport, router, run_controller};
use brownout_protocol::{Command, FeatureState, Tier};
use brownout_serving::control::{ControlHandle, SubscriberConfig, spawn_subscriber};
use http_body_util::BodyExt;
use tower::ServiceExt;

use brownout_test_support::{OwnRedis, redis_url, require_redis, unique, wait_for};

const KEY: &[u8] = b"degrade-test-key";

const POLICY: &str = r#"
evaluate_interval_ms: 50
command_lease_ms: 3000
features:
  - { name: pdf_analysis, criticality: sheddable, disable_at_tier: 1 }
  - { name: basic_qa, criticality: critical }
tiers:
  t1:
    hold_down_secs: 1
    enter:
      - alertmanager: { alertname: BrownoutGpuSaturated }
  t2:
    hold_down_secs: 1
    params: { model_route: fallback, max_tokens_cap: 128, max_num_seqs: 8 }
  t3:
    hold_down_secs: 1
    params: { admit_min_criticality: critical, retry_after_base_secs: 20, jitter_ratio: 0.5, recovery_eta_max_secs: 600 }
"#;

fn cluster(name: &str) -> String {
    unique(&format!("t-{name}-"))
}

fn cfg(cluster: &str, replica: &str) -> DegradeConfig {
    let mut c = DegradeConfig::new(cluster, KEY, Policy::from_yaml(POLICY).unwrap());
    c.replica_id = replica.to_string();
    c.leader_lease_ms = 600;
    c.redis_timeout = Duration::from_millis(200);
    c
}

fn handle(cfg: DegradeConfig) -> DegradeHandle {
    DegradeHandle::new(cfg, &prometheus::Registry::new()).unwrap()
}

fn subscriber_cfg(url: &str, cluster: &str, inst: &str) -> SubscriberConfig {
    let mut c = SubscriberConfig::new(url, cluster, KEY, inst);
    c.anti_entropy = Duration::from_millis(250);
    c.lease_check = Duration::from_millis(50);
    c.reconnect_min = Duration::from_millis(20);
    c.reconnect_max = Duration::from_millis(100);
    c
}

async fn call(app: &axum::Router, req: Request<Body>) -> (StatusCode, serde_json::Value) {
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    )
}

fn json_req(method: &str, uri: &str, body: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

/// Alertmanager's webhook as it really sends it (version 4).
fn am_payload(status: &str) -> String {
    format!(
        r#"{{
  "version": "4",
  "groupKey": "{{}}:{{alertname=\"BrownoutGpuSaturated\"}}",
  "truncatedAlerts": 0,
  "status": "{status}",
  "receiver": "brownout",
  "groupLabels": {{"alertname": "BrownoutGpuSaturated"}},
  "commonLabels": {{"alertname": "BrownoutGpuSaturated", "severity": "page", "Hostname": "gpu-1"}},
  "commonAnnotations": {{"summary": "GPU utilisation above 95% for 30s"}},
  "externalURL": "http://alertmanager:9093",
  "alerts": [{{
    "status": "{status}",
    "labels": {{"alertname": "BrownoutGpuSaturated", "severity": "page", "Hostname": "gpu-1"}},
    "annotations": {{"summary": "GPU utilisation above 95% for 30s"}},
    "startsAt": "2026-11-30T03:00:00.000Z",
    "endsAt": "0001-01-01T00:00:00Z",
    "generatorURL": "http://prometheus:9090/graph?g0.expr=...",
    "fingerprint": "c0ffee1234567890"
  }}]
}}"#
    )
}

#[tokio::test]
async fn decision_applied_and_acked_end_to_end_via_alertmanager_webhook() {
    let url = redis_url();
    require_redis(&url);
    let cl = cluster("e2e");
    let h = handle(cfg(&cl, "cp-a"));
    let app = router(h.clone());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let ctl = tokio::spawn(run_controller(
        h.clone(),
        Transport::Redis { url: url.clone() },
        async move {
            let _ = stop_rx.await;
        },
    ));
    let serving: Vec<ControlHandle> = (0..2).map(|_| ControlHandle::new(&cl)).collect();
    let mut subs = Vec::new();
    for (i, s) in serving.iter().enumerate() {
        subs.push(
            spawn_subscriber(s.clone(), subscriber_cfg(&url, &cl, &format!("inst-{i}"))).await,
        );
    }
    wait_for("T0 published and applied", Duration::from_secs(5), || {
        serving.iter().all(|s| s.current().command.version > 0)
    })
    .await;

    // Alertmanager fires → T1 everywhere.
    let (st, body) = call(
        &app,
        json_req("POST", "/v1/alertmanager", &am_payload("firing")),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(body["firing"], 1);
    wait_for("T1 applied", Duration::from_secs(5), || {
        serving.iter().all(|s| s.tier() == Tier::T1)
    })
    .await;
    for s in &serving {
        assert_eq!(
            s.current().command.feature_state("pdf_analysis"),
            FeatureState::Disabled
        );
        assert_eq!(
            s.current().command.feature_state("basic_qa"),
            FeatureState::Enabled
        );
        assert_eq!(s.current().command.reason.trigger, "alertmanager");
    }
    // Acks visible in the operator API, with lag, for the version in force.
    let version = serving[0].current().command.version;
    let start = Instant::now();
    loop {
        let (st, v) = call(
            &app,
            Request::get("/api/v1/degrade").body(Body::empty()).unwrap(),
        )
        .await;
        assert_eq!(st, StatusCode::OK);
        let acks = v["acks"].as_array().unwrap();
        let caught_up = acks
            .iter()
            .filter(|a| a["status"] == "applied" && a["version"].as_u64() >= Some(version))
            .count();
        if caught_up == 2 {
            assert!(acks.iter().all(|a| a["lag_ms"].is_u64()), "{acks:?}");
            assert_eq!(v["tier"], 1);
            assert_eq!(v["command"]["tier"], 1);
            let decisions = v["decisions"].as_array().unwrap();
            assert_eq!(
                decisions[0]["trigger"], "alertmanager",
                "newest first: {decisions:?}"
            );
            assert!(
                decisions[0]["reasons"][0]["condition"]
                    .as_str()
                    .unwrap()
                    .contains("BrownoutGpuSaturated")
            );
            assert!(
                decisions[0]["published"].is_array(),
                "decision carries its (epoch, version)"
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "acks never caught up: {v}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let metrics = h.metrics();
    assert_eq!(metrics.tier.with_label_values(&[cl.as_str()]).get(), 1);
    assert!(
        metrics
            .decisions_total
            .with_label_values(&["alertmanager"])
            .get()
            >= 1
    );
    assert!(metrics.publish_seconds.get_sample_count() >= 2);

    // Resolved → back to T0 after the 1 s hold-down.
    let (st, _) = call(
        &app,
        json_req("POST", "/v1/alertmanager", &am_payload("resolved")),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    wait_for("T0 again", Duration::from_secs(5), || {
        serving.iter().all(|s| s.tier() == Tier::T0)
    })
    .await;

    // Operator override pins T3 with a reason, then is removed.
    let (st, o) = call(
        &app,
        json_req(
            "POST",
            "/api/v1/degrade/override",
            r#"{"tier": 3, "duration_secs": 60, "reason": "game day"}"#,
        ),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{o}");
    wait_for("T3 by operator", Duration::from_secs(5), || {
        serving.iter().all(|s| s.tier() == Tier::T3)
    })
    .await;
    let cmd = serving[0].current().command.clone();
    assert_eq!(cmd.reason.trigger, "operator");
    assert_eq!(cmd.reason.detail, "game day");
    assert!(cmd.shed.as_ref().unwrap().recovery_eta_ms > cmd.issued_at_ms);
    let (st, _) = call(
        &app,
        Request::delete("/api/v1/degrade/override")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    wait_for(
        "stepping down after the override",
        Duration::from_secs(6),
        || serving.iter().all(|s| s.tier() == Tier::T0),
    )
    .await;

    // Every published command is in the log stream.
    let mut bus = RedisBus::connect(&url, &cl, "reader", Duration::from_secs(1), KEY)
        .await
        .unwrap();
    assert!(bus.log_len().await.unwrap() >= 5);

    let _ = stop_tx.send(());
    ctl.await.unwrap().unwrap();
    assert_eq!(
        bus.leader().await.unwrap(),
        None,
        "lease released on shutdown"
    );
    for s in subs {
        s.abort();
    }
}

#[tokio::test]
async fn operator_and_webhook_input_errors_are_4xx_with_codes() {
    let h = handle(cfg(&cluster("api"), "cp-x"));
    let app = router(h);
    let cases = [
        (
            "POST",
            "/api/v1/degrade/override",
            r#"{"tier": 4, "duration_secs": 60, "reason": "x"}"#,
            "invalid_tier",
        ),
        (
            "POST",
            "/api/v1/degrade/override",
            r#"{"tier": 1, "duration_secs": 0, "reason": "x"}"#,
            "invalid_duration",
        ),
        (
            "POST",
            "/api/v1/degrade/override",
            r#"{"tier": 1, "duration_secs": 60, "reason": "  "}"#,
            "invalid_reason",
        ),
        (
            "POST",
            "/api/v1/degrade/override",
            r#"{"tier": 1, "duration_secs": 60, "reason": "x", "extra": 1}"#,
            "invalid_json",
        ),
        (
            "POST",
            "/api/v1/degrade/override",
            "not json",
            "invalid_json",
        ),
        (
            "POST",
            "/v1/alertmanager",
            r#"{"version": "3", "alerts": []}"#,
            "unsupported_version",
        ),
        (
            "POST",
            "/v1/alertmanager",
            r#"{"version": "4", "alerts": [{"status": "firing", "labels": {}}]}"#,
            "missing_alertname",
        ),
        (
            "POST",
            "/v1/alertmanager",
            r#"{"version": "4", "alerts": [{"status": "maybe", "labels": {"alertname": "A"}}]}"#,
            "bad_status",
        ),
        (
            "POST",
            "/v1/alertmanager",
            r#"{"version": "4"}"#,
            "invalid_json",
        ),
    ];
    for (m, uri, body, code) in cases {
        let (st, v) = call(&app, json_req(m, uri, body)).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{uri} {body}: {v}");
        assert_eq!(v["error"]["code"], code, "{uri} {body}: {v}");
    }
}

#[tokio::test]
async fn redis_restart_mid_run_loses_no_command_and_converges() {
    let mut own = OwnRedis::start();
    let url = own.url();
    let cl = cluster("restart");
    let h = handle(cfg(&cl, "cp-r"));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let ctl = tokio::spawn(run_controller(
        h.clone(),
        Transport::Redis { url: url.clone() },
        async move {
            let _ = stop_rx.await;
        },
    ));
    let serving: Vec<ControlHandle> = (0..3).map(|_| ControlHandle::new(&cl)).collect();
    let mut subs = Vec::new();
    for (i, s) in serving.iter().enumerate() {
        subs.push(
            spawn_subscriber(s.clone(), subscriber_cfg(&url, &cl, &format!("inst-{i}"))).await,
        );
    }
    let o = |tier| brownout::degrade::Override {
        tier,
        until_ms: brownout_protocol::now_ms() + 600_000,
        reason: "test".into(),
    };
    h.set_override(o(Tier::T1));
    wait_for("T1 before the restart", Duration::from_secs(5), || {
        serving.iter().all(|s| s.tier() == Tier::T1)
    })
    .await;
    let before = serving[0].current().command.order_key();

    // Redis dies; meanwhile the decision changes to T2.
    own.kill();
    h.set_override(o(Tier::T2));
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        serving.iter().all(|s| s.tier() == Tier::T1),
        "nothing can arrive while Redis is down"
    );

    // Redis comes back empty: the decision made during the outage must arrive everywhere.
    own.spawn();
    let back = Instant::now();
    wait_for("T2 after the restart", Duration::from_secs(5), || {
        serving.iter().all(|s| s.tier() == Tier::T2)
    })
    .await;
    let converged = back.elapsed();
    eprintln!("converged {converged:?} after Redis came back");
    for s in &serving {
        let k = s.current().command.order_key();
        assert!(
            k > before,
            "a new epoch/version supersedes the pre-restart command: {k:?} vs {before:?}"
        );
    }
    // The restarted Redis holds the state, the log entry and fresh acks.
    let mut bus = RedisBus::connect(&url, &cl, "reader", Duration::from_secs(1), KEY)
        .await
        .unwrap();
    let stored: Command = serde_json::from_str(&bus.stored().await.unwrap().unwrap().json).unwrap();
    assert_eq!(stored.tier, Tier::T2);
    assert!(bus.log_len().await.unwrap() >= 1);
    let start = Instant::now();
    while bus.acks().await.unwrap().len() < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "acks did not come back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop_tx.send(());
    ctl.await.unwrap().unwrap();
    for s in subs {
        s.abort();
    }
}

#[tokio::test]
async fn leader_failover_within_one_lease_period_and_stale_leader_is_fenced() {
    let url = redis_url();
    require_redis(&url);
    let cl = cluster("failover");
    let a = handle(cfg(&cl, "cp-a"));
    let b = handle(cfg(&cl, "cp-b"));
    let o = brownout::degrade::Override {
        tier: Tier::T2,
        until_ms: brownout_protocol::now_ms() + 600_000,
        reason: "pin".into(),
    };
    a.set_override(o.clone());
    b.set_override(o);
    let ctl_a = tokio::spawn(run_controller(
        a.clone(),
        Transport::Redis { url: url.clone() },
        std::future::pending(),
    ));
    wait_for("a leads", Duration::from_secs(5), || {
        a.leader_epoch().is_some()
    })
    .await;
    let ctl_b = tokio::spawn(run_controller(
        b.clone(),
        Transport::Redis { url: url.clone() },
        std::future::pending(),
    ));
    let serving = ControlHandle::new(&cl);
    let sub = spawn_subscriber(serving.clone(), subscriber_cfg(&url, &cl, "inst-0")).await;
    wait_for("T2 applied", Duration::from_secs(5), || {
        serving.tier() == Tier::T2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(b.leader_epoch().is_none(), "only one leader");
    let epoch_a = a.leader_epoch().unwrap();
    assert_eq!(serving.current().command.epoch, epoch_a);

    // a dies without releasing its lease.
    ctl_a.abort();
    let died = Instant::now();
    wait_for(
        "b publishes under a new epoch",
        Duration::from_secs(5),
        || serving.current().command.epoch > epoch_a,
    )
    .await;
    let took = died.elapsed();
    // One lease period (600 ms) plus one evaluation interval and the subscriber's hop.
    assert!(
        took <= Duration::from_millis(600 + 50 + 350),
        "failover took {took:?}"
    );
    assert_eq!(serving.tier(), Tier::T2, "b continues the tier in force");
    let epoch_b = b.leader_epoch().unwrap();
    assert!(epoch_b > epoch_a);

    // A stale leader (a's old epoch) cannot publish any more.
    let mut stale = RedisBus::connect(&url, &cl, "cp-a", Duration::from_secs(1), KEY)
        .await
        .unwrap();
    let out = stale
        .publish(epoch_a, 1_000_000, KEY, |v| {
            Command::normal(&cl, epoch_a, v, brownout_protocol::now_ms(), 1000)
        })
        .await
        .unwrap();
    assert!(
        matches!(
            out,
            PublishOutcome::NotLeader | PublishOutcome::Fenced { .. }
        ),
        "{out:?}"
    );
    // Even holding a forged lease value, a lower epoch is fenced by the stored one.
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let keys = brownout_protocol::RedisKeys::new(&cl).unwrap();
    let _: () = redis::cmd("SET")
        .arg(keys.leader())
        .arg(format!("cp-a:{epoch_a}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let out = stale
        .publish(epoch_a, 1_000_000, KEY, |v| {
            Command::normal(&cl, epoch_a, v, brownout_protocol::now_ms(), 1000)
        })
        .await
        .unwrap();
    assert_eq!(
        out,
        PublishOutcome::Fenced {
            stored_epoch: epoch_b
        }
    );
    assert_eq!(serving.tier(), Tier::T2);
    ctl_b.abort();
    sub.abort();
}

#[tokio::test]
async fn dry_run_records_decisions_but_publishes_nothing() {
    let url = redis_url();
    require_redis(&url);
    let cl = cluster("dry");
    let mut c = cfg(&cl, "cp-d");
    c.policy.dry_run = true;
    let h = handle(c);
    let ctl = tokio::spawn(run_controller(
        h.clone(),
        Transport::Redis { url: url.clone() },
        std::future::pending(),
    ));
    h.set_override(brownout::degrade::Override {
        tier: Tier::T3,
        until_ms: brownout_protocol::now_ms() + 60_000,
        reason: "dry".into(),
    });
    wait_for("decision recorded", Duration::from_secs(5), || {
        h.decisions().iter().any(|d| d.tier == Tier::T3)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let d = h
        .decisions()
        .into_iter()
        .find(|d| d.tier == Tier::T3)
        .unwrap();
    assert!(d.dry_run && d.published.is_none());
    let mut bus = RedisBus::connect(&url, &cl, "reader", Duration::from_secs(1), KEY)
        .await
        .unwrap();
    assert_eq!(bus.stored().await.unwrap(), None);
    assert_eq!(bus.leader().await.unwrap(), None);
    ctl.abort();
}

#[tokio::test]
async fn in_process_bus_drives_serving_handles_without_redis() {
    let cl = cluster("inproc");
    let h = handle(cfg(&cl, "cp-i"));
    let bus = brownout::degrade::InProcBus::new();
    let serving: Vec<ControlHandle> = (0..2).map(|_| ControlHandle::new(&cl)).collect();
    let tasks: Vec<_> = serving
        .iter()
        .enumerate()
        .map(|(i, s)| {
            brownout_serving::control::inproc::spawn_inproc_subscriber(
                s.clone(),
                format!("inst-{i}"),
                KEY.to_vec(),
                bus.commands(),
                bus.ack_sender(),
                Duration::from_millis(50),
            )
        })
        .collect();
    let ctl = tokio::spawn(run_controller(
        h.clone(),
        Transport::InProc(bus.clone()),
        std::future::pending(),
    ));
    h.set_override(brownout::degrade::Override {
        tier: Tier::T2,
        until_ms: brownout_protocol::now_ms() + 60_000,
        reason: "demo".into(),
    });
    wait_for("T2 in process", Duration::from_secs(5), || {
        serving.iter().all(|s| s.tier() == Tier::T2)
    })
    .await;
    wait_for("acks", Duration::from_secs(5), || {
        h.status()
            .acks
            .iter()
            .filter(|a| a.lag_ms.is_some())
            .count()
            == 2
    })
    .await;
    // A command signed with another key is refused in process too.
    bus.publish(brownout_protocol::SignedCommand::sign(
        &Command::normal(&cl, 9, 9_999, 0, 1),
        b"wrong",
    ));
    wait_for("refused", Duration::from_secs(5), || {
        serving
            .iter()
            .all(|s| s.metrics().refused("bad_signature") == 1)
    })
    .await;
    assert!(serving.iter().all(|s| s.tier() == Tier::T2));
    ctl.abort();
    for t in tasks {
        t.abort();
    }
}

#[tokio::test]
async fn override_posted_to_a_follower_is_published_by_the_leader() {
    let url = redis_url();
    require_redis(&url);
    let cl = cluster("shared-override");
    let a = handle(cfg(&cl, "cp-a"));
    let b = handle(cfg(&cl, "cp-b"));
    let ctl_a = tokio::spawn(run_controller(
        a.clone(),
        Transport::Redis { url: url.clone() },
        std::future::pending(),
    ));
    wait_for("a leads", Duration::from_secs(5), || {
        a.leader_epoch().is_some()
    })
    .await;
    let ctl_b = tokio::spawn(run_controller(
        b.clone(),
        Transport::Redis { url: url.clone() },
        std::future::pending(),
    ));
    let serving = ControlHandle::new(&cl);
    let sub = spawn_subscriber(serving.clone(), subscriber_cfg(&url, &cl, "inst-0")).await;
    wait_for("T0 published", Duration::from_secs(5), || {
        serving.current().command.version > 0
    })
    .await;
    assert!(b.leader_epoch().is_none());

    let app_b = router(b.clone());
    let (st, v) = call(
        &app_b,
        json_req(
            "POST",
            "/api/v1/degrade/override",
            r#"{"tier": 2, "duration_secs": 60, "reason": "via follower"}"#,
        ),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    wait_for(
        "leader publishes the follower's override",
        Duration::from_secs(5),
        || serving.tier() == Tier::T2,
    )
    .await;
    assert_eq!(serving.current().command.reason.detail, "via follower");
    assert_eq!(
        a.status().operator_override.map(|o| o.reason),
        Some("via follower".into())
    );

    let (st, _) = call(
        &app_b,
        Request::delete("/api/v1/degrade/override")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    wait_for(
        "override removed everywhere",
        Duration::from_secs(5),
        || a.status().operator_override.is_none(),
    )
    .await;
    wait_for("stepping down", Duration::from_secs(6), || {
        serving.tier() == Tier::T0
    })
    .await;
    ctl_a.abort();
    ctl_b.abort();
    sub.abort();
}

#[tokio::test]
async fn override_survives_redis_losing_its_data() {
    let mut own = OwnRedis::start();
    let url = own.url();
    let cl = cluster("override-loss");
    let h = handle(cfg(&cl, "cp-o"));
    let ctl = tokio::spawn(run_controller(
        h.clone(),
        Transport::Redis { url: url.clone() },
        std::future::pending(),
    ));
    let serving = ControlHandle::new(&cl);
    let sub = spawn_subscriber(serving.clone(), subscriber_cfg(&url, &cl, "inst-0")).await;
    h.set_override(brownout::degrade::Override {
        tier: Tier::T2,
        until_ms: brownout_protocol::now_ms() + 600_000,
        reason: "pinned".into(),
    });
    wait_for("T2", Duration::from_secs(5), || serving.tier() == Tier::T2).await;
    own.kill();
    own.spawn();
    let mut bus = RedisBus::connect(&url, &cl, "reader", Duration::from_secs(1), KEY)
        .await
        .unwrap();
    let start = Instant::now();
    while !matches!(
        bus.get_override().await.unwrap(),
        brownout::degrade::redis::SharedOverride::Current(Some(_))
    ) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "override not re-shared after Redis lost it"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Well past the 1 s hold-down: still pinned.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(serving.tier(), Tier::T2);
    assert_eq!(
        h.status().operator_override.map(|o| o.reason),
        Some("pinned".into())
    );
    ctl.abort();
    sub.abort();
}

/// Someone with write access to Redis but without the command key: an operator override and an
/// ack written with `redis-cli` are refused. The control plane keeps deciding by itself (no
/// pinned tier), shows the forged ack as "unverified", and still verifies the real instance's.
#[tokio::test]
async fn overrides_and_acks_written_without_the_key_are_refused() {
    let url = redis_url();
    require_redis(&url);
    let cl = cluster("forged");
    let h = handle(cfg(&cl, "cp-f"));
    let ctl = tokio::spawn(run_controller(
        h.clone(),
        Transport::Redis { url: url.clone() },
        std::future::pending(),
    ));
    let serving = ControlHandle::new(&cl);
    let sub = spawn_subscriber(serving.clone(), subscriber_cfg(&url, &cl, "inst-0")).await;
    wait_for("leader", Duration::from_secs(5), || {
        h.status().leader_epoch.is_some()
    })
    .await;
    wait_for("a verified ack from inst-0", Duration::from_secs(5), || {
        h.status()
            .acks
            .iter()
            .any(|a| a.instance == "inst-0" && a.status == "applied")
    })
    .await;

    let keys = brownout_protocol::RedisKeys::new(&cl).unwrap();
    let until = brownout_protocol::now_ms() + 600_000;
    let forged_override = format!(r#"{{"tier":3,"until_ms":{until},"reason":"forged"}}"#);
    let port = url
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_string();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &port])
            .args(args)
            .output()
            .expect("redis-cli is required (apt-get install redis-tools)");
        assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    cli(&[
        "SET",
        &keys.operator_override(),
        &forged_override,
        "PX",
        "600000",
    ]);
    // A forged "applied" ack for an instance that does not exist, and one copied from inst-0 to
    // inst-9 (a valid signature, but for another instance).
    cli(&["HSET", &keys.acks(), "ghost", "1:999:5"]);
    let real = cli(&["HGET", &keys.acks(), "inst-0"]);
    assert!(real.contains(";sig="), "acks are written signed: {real}");
    cli(&["HSET", &keys.acks(), "inst-9", &real]);

    wait_for("the forged acks to show", Duration::from_secs(5), || {
        let st = h.status();
        let of = |i: &str| {
            st.acks
                .iter()
                .find(|a| a.instance == i)
                .map(|a| a.status.clone())
        };
        of("ghost").as_deref() == Some("unverified")
            && of("inst-9").as_deref() == Some("unverified")
    })
    .await;
    // Several controller rounds later: nothing pinned, still T0 everywhere.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let st = h.status();
    assert!(st.operator_override.is_none(), "{:?}", st.operator_override);
    assert_eq!(st.tier, Tier::T0);
    assert_eq!(serving.tier(), Tier::T0);
    assert_eq!(
        st.acks
            .iter()
            .find(|a| a.instance == "inst-0")
            .map(|a| a.status.as_str()),
        Some("applied")
    );

    // An override set through the API is stored sealed and is honoured.
    h.set_override(brownout::degrade::Override {
        tier: Tier::T2,
        until_ms: brownout_protocol::now_ms() + 600_000,
        reason: "pinned by an operator".into(),
    });
    wait_for("T2 from the real override", Duration::from_secs(5), || {
        serving.tier() == Tier::T2
    })
    .await;
    let stored = cli(&["GET", &keys.operator_override()]);
    assert!(
        stored.contains(r#""override":{"tier":2"#) && stored.contains(";sig="),
        "{stored}"
    );
    ctl.abort();
    sub.abort();
}
