//! The operator override against the real Redis (`REDIS_TEST_URL`, a cluster name of the
//! test's own): a captured sealed override written back into `brownout:{C}:override` after
//! the operator's DELETE does not pin the tier again — neither on the replica that saw the
//! DELETE nor on a fresh one — and DELETE answers only once its tombstone is in Redis.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use brownout::degrade::{DegradeConfig, DegradeHandle, Policy, Transport, router, run_controller};
use brownout_protocol::Tier;
use brownout_test_support::{redis_url, require_redis, unique, wait_for};
use redis::AsyncCommands;
use tower::ServiceExt;

const KEY: &[u8] = b"override-replay-test-key";

/// A fast policy (50 ms rounds, 1 s hold-downs), also used by `degrade_key_rotation`.
pub(crate) const POLICY: &str = r#"
evaluate_interval_ms: 50
command_lease_ms: 3000
features:
  - { name: pdf_analysis, criticality: sheddable, disable_at_tier: 1 }
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

fn start(url: &str, cluster: &str, replica: &str) -> (DegradeHandle, tokio::task::JoinHandle<()>) {
    let mut c = DegradeConfig::new(cluster, KEY, Policy::from_yaml(POLICY).unwrap());
    c.replica_id = replica.to_string();
    c.leader_lease_ms = 600;
    c.redis_timeout = Duration::from_millis(500);
    let h = DegradeHandle::new(c, &prometheus::Registry::new()).unwrap();
    let h2 = h.clone();
    let url = url.to_string();
    let task = tokio::spawn(async move {
        let _ = run_controller(h2, Transport::Redis { url }, std::future::pending::<()>()).await;
    });
    (h, task)
}

async fn call(app: &axum::Router, method: &str, body: &str) -> (StatusCode, String) {
    let req = Request::builder()
        .method(method)
        .uri("/api/v1/degrade/override")
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    let status = res.status();
    let bytes = http_body_util::BodyExt::collect(res.into_body())
        .await
        .unwrap()
        .to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_sealed_override_after_delete_does_not_pin_again() {
    let url = redis_url();
    require_redis(&url);
    let cluster = unique("t-override-");
    let keys = brownout_protocol::RedisKeys::new(&cluster).unwrap();
    let mut r = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let (a, task_a) = start(&url, &cluster, "cp-a");
    let app = router(a.clone());

    // Pin T3; the attacker captures the sealed value from Redis.
    let (st, body) = call(
        &app,
        "POST",
        r#"{"tier":3,"duration_secs":600,"reason":"incident 42"}"#,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    let mut captured = String::new();
    for _ in 0..100 {
        let v: Option<String> = r.get(keys.operator_override()).await.unwrap();
        if let Some(v) = v.filter(|v| v.contains(r#""tier":3"#)) {
            captured = v;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        captured.contains(r#""version":"#) && captured.contains(";sig="),
        "sealed in Redis with a version: {captured}"
    );
    wait_for("T3 from the pin", Duration::from_secs(5), || {
        a.status().tier == Tier::T3
    })
    .await;

    // DELETE: its tombstone is in Redis when it answers (no waiting for a tick).
    let (st, body) = call(&app, "DELETE", "").await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert!(body.contains(r#""removed":true"#), "{body}");
    let now: String = r.get(keys.operator_override()).await.unwrap();
    assert!(
        now.contains(r#""override":null"#),
        "tombstone written before the answer: {now}"
    );

    // The attacker writes the captured sealed pin back.
    let _: () = r
        .pset_ex(keys.operator_override(), &captured, 600_000)
        .await
        .unwrap();
    // A replica that starts now must not take it either.
    let (b, task_b) = start(&url, &cluster, "cp-b");
    // Many controller rounds (50 ms each) later: still not pinned anywhere, and cp-a has left
    // T3 (one tier per 1 s hold-down).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_ne!(a.status().tier, Tier::T3, "cp-a re-pinned T3");
    for (name, h) in [("cp-a", &a), ("cp-b", &b)] {
        let s = h.status();
        assert!(
            s.operator_override.is_none(),
            "{name} took the replayed override: {:?}",
            s.operator_override
        );
    }
    // The replayed value was not refreshed or rewritten by a replica either.
    let still: String = r.get(keys.operator_override()).await.unwrap();
    assert_eq!(
        still, captured,
        "nobody wrote over the replay with it as theirs"
    );

    // A new, real pin still works (versions move on).
    let (st, body) = call(
        &app,
        "POST",
        r#"{"tier":1,"duration_secs":600,"reason":"real"}"#,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{body}");
    wait_for("cp-b sees the new pin", Duration::from_secs(5), || {
        b.status()
            .operator_override
            .as_ref()
            .is_some_and(|o| o.tier == Tier::T1)
    })
    .await;
    task_a.abort();
    task_b.abort();
}
