//! The serving tier's command path against the real Redis: subscribe, verify, apply, ack;
//! forged and replayed commands refused and counted; lease expiry steps down one tier at a time;
//! `/v1/features` and its SSE stream.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use brownout_protocol::{
    Ack, Command, FeatureState, Limits, RedisKeys, Shed, SignedCommand, Tier, now_ms,
};
use brownout_serving::control::http::{FeaturesView, escape_html, router};
use brownout_serving::control::{
    ControlHandle, FeatureCatalog, SubscriberConfig, spawn_subscriber,
};
use brownout_test_support::{redis_url, wait_for};
use futures::StreamExt;
use http_body_util::BodyExt;
use redis::AsyncCommands;
use tower::ServiceExt;

const KEY: &[u8] = b"control-test-key";

async fn redis() -> redis::aio::MultiplexedConnection {
    let url = redis_url();
    let client = redis::Client::open(url.as_str()).unwrap();
    match tokio::time::timeout(
        Duration::from_secs(2),
        client.get_multiplexed_async_connection(),
    )
    .await
    {
        Ok(Ok(c)) => c,
        _ => panic!(
            "Redis is not reachable at {url}: start it with scripts/test.sh (or `redis-server --port 6379`)"
        ),
    }
}

fn cluster(name: &str) -> String {
    format!("t-{name}-{}", &uuid_like())
}

fn uuid_like() -> String {
    format!(
        "{:x}{:x}",
        now_ms(),
        std::process::id() ^ rand::random::<u32>()
    )
}

fn command(cluster: &str, epoch: u64, version: u64, tier: Tier, lease_ms: u64) -> Command {
    let now = now_ms();
    let mut c = Command::normal(cluster, epoch, version, now, lease_ms);
    c.tier = tier;
    c.reason.trigger = "gpu_util".into();
    c.reason.detail = "test".into();
    if tier >= Tier::T1 {
        c.features
            .insert("pdf_analysis".into(), FeatureState::Disabled);
        c.features.insert("basic_qa".into(), FeatureState::Enabled);
    }
    if tier >= Tier::T2 {
        c.model_route.insert("default".into(), "fallback".into());
        c.limits = Limits {
            max_tokens_cap: Some(64),
            max_num_seqs: Some(4),
            ..Limits::default()
        };
    }
    if tier == Tier::T3 {
        c.shed = Some(Shed {
            admit_min_criticality: brownout_protocol::Criticality::Critical,
            retry_after_s: 5,
            jitter_ratio: 0.5,
            recovery_eta_ms: now + 60_000,
            admit_rps: None,
        });
    }
    c
}

/// Writes a (possibly forged) signed command the way the publisher does: state hash, then notify.
async fn put(
    conn: &mut redis::aio::MultiplexedConnection,
    keys: &RedisKeys,
    s: &SignedCommand,
    epoch: u64,
    version: u64,
) {
    let _: () = redis::pipe()
        .atomic()
        .hset_multiple(
            keys.state(),
            &[
                ("epoch", epoch.to_string()),
                ("version", version.to_string()),
                ("command", s.json.clone()),
                ("sig", s.sig.clone()),
            ],
        )
        .ignore()
        .publish(keys.notify(), format!("{epoch}:{version}"))
        .ignore()
        .query_async(conn)
        .await
        .unwrap();
}

async fn ack_of(
    conn: &mut redis::aio::MultiplexedConnection,
    keys: &RedisKeys,
    inst: &str,
) -> Option<Ack> {
    let v: Option<String> = conn.hget(keys.acks(), inst).await.unwrap();
    // Acks are sealed with the command key for this instance; verify them as the control plane
    // does.
    v.map(|s| {
        Ack::parse_signed(&s, KEY, inst).unwrap_or_else(|e| panic!("ack {s:?} of {inst}: {e}"))
    })
}

fn fast(url: &str, cluster: &str, inst: &str) -> SubscriberConfig {
    let mut c = SubscriberConfig::new(url, cluster, KEY, inst);
    c.anti_entropy = Duration::from_millis(200);
    c.lease_check = Duration::from_millis(20);
    c
}

#[tokio::test]
async fn applies_newer_commands_acks_them_and_reads_state_on_start() {
    let mut conn = redis().await;
    let cl = cluster("apply");
    let keys = RedisKeys::new(&cl).unwrap();
    // A command is already stored before the subscriber starts: it must be read at once.
    let c1 = command(&cl, 1, 1, Tier::T1, 60_000);
    put(&mut conn, &keys, &SignedCommand::sign(&c1, KEY), 1, 1).await;
    let h = ControlHandle::new(&cl);
    let task = spawn_subscriber(h.clone(), fast(&redis_url(), &cl, "i1")).await;
    wait_for("initial state", Duration::from_secs(5), || {
        h.tier() == Tier::T1
    })
    .await;
    // Then a notification.
    let c2 = command(&cl, 1, 2, Tier::T2, 60_000);
    put(&mut conn, &keys, &SignedCommand::sign(&c2, KEY), 1, 2).await;
    wait_for("T2", Duration::from_secs(5), || h.tier() == Tier::T2).await;
    assert_eq!(h.current().command, c2);
    wait_for("ack", Duration::from_secs(5), || true).await;
    let start = Instant::now();
    loop {
        if let Some(Ack::Applied {
            epoch: 1,
            version: 2,
            applied_at_ms,
            ..
        }) = ack_of(&mut conn, &keys, "i1").await
        {
            assert!(applied_at_ms >= c2.issued_at_ms);
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "no ack for 1:2");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(h.metrics().applied_total.get(), 2);
    task.abort();
}

#[tokio::test]
async fn forged_and_replayed_commands_are_refused_counted_and_nacked() {
    let mut conn = redis().await;
    let cl = cluster("forge");
    let keys = RedisKeys::new(&cl).unwrap();
    let h = ControlHandle::new(&cl);
    let task = spawn_subscriber(h.clone(), fast(&redis_url(), &cl, "i1")).await;
    let good = command(&cl, 2, 10, Tier::T1, 60_000);
    tokio::time::sleep(Duration::from_millis(100)).await;
    put(&mut conn, &keys, &SignedCommand::sign(&good, KEY), 2, 10).await;
    wait_for("T1", Duration::from_secs(5), || h.tier() == Tier::T1).await;

    // Forged: a T0 command signed with the wrong key, with a higher version.
    let forged_cmd = command(&cl, 2, 11, Tier::T0, 60_000);
    let forged = SignedCommand::sign(&forged_cmd, b"attacker-key");
    put(&mut conn, &keys, &forged, 2, 11).await;
    wait_for("bad_signature counted", Duration::from_secs(5), || {
        h.metrics().refused("bad_signature") >= 1
    })
    .await;
    assert_eq!(h.tier(), Tier::T1, "forged command not applied");
    // Tampered bytes under a valid signature of other bytes.
    let s = SignedCommand::sign(&command(&cl, 2, 12, Tier::T1, 60_000), KEY);
    let tampered = SignedCommand {
        json: s.json.replace("\"tier\":1", "\"tier\":0"),
        sig: s.sig,
    };
    put(&mut conn, &keys, &tampered, 2, 12).await;
    wait_for("second bad_signature", Duration::from_secs(5), || {
        h.metrics().refused("bad_signature") >= 2
    })
    .await;
    let nack = ack_of(&mut conn, &keys, "i1").await.unwrap();
    assert!(
        matches!(&nack, Ack::Refused { epoch: 2, version: 12, reason, .. } if reason == "bad_signature"),
        "{nack:?}"
    );

    // Replayed: a validly signed but older command (version 5 < 10).
    let old = command(&cl, 2, 5, Tier::T0, 60_000);
    put(&mut conn, &keys, &SignedCommand::sign(&old, KEY), 2, 5).await;
    wait_for("older_version counted", Duration::from_secs(5), || {
        h.metrics().refused("older_version") >= 1
    })
    .await;
    assert_eq!(h.tier(), Tier::T1);
    assert_eq!(h.current().command.order_key(), (2, 10));
    // Older epoch with a higher version is older too.
    let stale_leader = command(&cl, 1, 99, Tier::T0, 60_000);
    put(
        &mut conn,
        &keys,
        &SignedCommand::sign(&stale_leader, KEY),
        1,
        99,
    )
    .await;
    wait_for("older epoch counted", Duration::from_secs(5), || {
        h.metrics().refused("older_version") >= 2
    })
    .await;
    assert_eq!(h.tier(), Tier::T1);
    let nack = ack_of(&mut conn, &keys, "i1").await.unwrap();
    assert!(
        matches!(&nack, Ack::Refused { epoch: 1, version: 99, reason, .. } if reason == "older_version"),
        "{nack:?}"
    );
    // Wrong cluster.
    let other = command("elsewhere", 3, 50, Tier::T0, 60_000);
    put(&mut conn, &keys, &SignedCommand::sign(&other, KEY), 3, 50).await;
    wait_for("wrong_cluster counted", Duration::from_secs(5), || {
        h.metrics().refused("wrong_cluster") >= 1
    })
    .await;
    assert_eq!(h.tier(), Tier::T1);
    assert_eq!(h.metrics().applied_total.get(), 1);
    task.abort();
}

#[test]
fn lease_expiry_steps_down_one_tier_per_lease_period() {
    let h = ControlHandle::new("c");
    let mut c = command("c", 1, 7, Tier::T3, 1000);
    c.issued_at_ms = 10_000;
    c.expires_at_ms = 11_000;
    h.apply(c, 10_000).unwrap();
    // (now, expected tier after the check)
    let table = [
        (10_500, Tier::T3),
        (11_000, Tier::T3), // expiry is strictly after expires_at
        (11_001, Tier::T2),
        (11_500, Tier::T2),
        (12_001, Tier::T2), // the new lease ends at 12_001, not yet past it
        (12_002, Tier::T1),
        (13_003, Tier::T0),
        (99_000, Tier::T0), // never below T0, never stuck
    ];
    for (now, want) in table {
        h.step_down_if_expired(now);
        assert_eq!(h.tier(), want, "at {now}");
        let cur = h.current();
        match want {
            Tier::T2 => {
                assert!(cur.command.shed.is_none());
                assert_eq!(cur.command.route_for("default"), "fallback");
            }
            Tier::T1 => {
                assert_eq!(cur.command.route_for("default"), "primary");
                assert_eq!(cur.command.limits, Limits::default());
                assert_eq!(
                    cur.command.feature_state("pdf_analysis"),
                    FeatureState::Disabled
                );
            }
            Tier::T0 => assert_eq!(
                cur.command.feature_state("pdf_analysis"),
                FeatureState::Enabled
            ),
            Tier::T3 => {}
        }
    }
    assert_eq!(h.metrics().lease_stepdowns_total.get(), 3);
    assert_eq!(
        h.current().command.order_key(),
        (1, 7),
        "step-downs keep the version"
    );
    assert_eq!(h.current().command.reason.trigger, "lease_expired");
    // A newer command still supersedes a stepped-down state.
    let mut fresh = command("c", 1, 8, Tier::T2, 1000);
    fresh.issued_at_ms = 99_000;
    fresh.expires_at_ms = 100_000;
    assert!(h.apply(fresh, 99_000).unwrap());
    assert_eq!(h.tier(), Tier::T2);
}

#[tokio::test]
async fn unrefreshed_lease_steps_down_through_the_subscriber_even_with_redis_silent() {
    let mut conn = redis().await;
    let cl = cluster("lease");
    let keys = RedisKeys::new(&cl).unwrap();
    let h = ControlHandle::new(&cl);
    let task = spawn_subscriber(h.clone(), fast(&redis_url(), &cl, "i1")).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    put(
        &mut conn,
        &keys,
        &SignedCommand::sign(&command(&cl, 1, 1, Tier::T2, 300), KEY),
        1,
        1,
    )
    .await;
    wait_for("T2", Duration::from_secs(5), || h.tier() == Tier::T2).await;
    let mut seen = vec![Tier::T2];
    let start = Instant::now();
    while h.tier() != Tier::T0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "stuck at {}",
            h.tier()
        );
        if *seen.last().unwrap() != h.tier() {
            seen.push(h.tier());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    seen.push(Tier::T0);
    assert_eq!(
        seen,
        vec![Tier::T2, Tier::T1, Tier::T0],
        "one tier per lease period"
    );
    task.abort();
}

#[tokio::test]
async fn features_endpoint_and_sse_stream_follow_the_state() {
    let h = ControlHandle::new("ui");
    let catalog = FeatureCatalog::new(vec![
        (
            "pdf_analysis".into(),
            brownout_protocol::Criticality::Sheddable,
        ),
        ("basic_qa".into(), brownout_protocol::Criticality::Critical),
        ("<script>x".into(), brownout_protocol::Criticality::Default),
    ]);
    let app = router(h.clone(), catalog);
    let res = app
        .clone()
        .oneshot(Request::get("/v1/features").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let v: FeaturesView =
        serde_json::from_slice(&res.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(v.tier, Tier::T0);
    assert!(v.features.iter().all(|f| f.state == FeatureState::Enabled));

    let res = app
        .clone()
        .oneshot(
            Request::get("/v1/features/stream")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.headers()["content-type"], "text/event-stream");
    let mut body = res.into_body().into_data_stream();
    let first = String::from_utf8(body.next().await.unwrap().unwrap().to_vec()).unwrap();
    assert!(
        first.contains("event: features") && first.contains("\"tier\":0"),
        "{first}"
    );

    h.apply(command("ui", 1, 1, Tier::T1, 60_000), now_ms())
        .unwrap();
    let ev = String::from_utf8(body.next().await.unwrap().unwrap().to_vec()).unwrap();
    let data = ev.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
    let v: FeaturesView = serde_json::from_str(data).unwrap();
    let states: BTreeMap<&str, FeatureState> = v
        .features
        .iter()
        .map(|f| (f.name.as_str(), f.state.clone()))
        .collect();
    assert_eq!(states["pdf_analysis"], FeatureState::Disabled);
    assert_eq!(states["basic_qa"], FeatureState::Enabled);
    let pdf = v
        .features
        .iter()
        .find(|f| f.name == "pdf_analysis")
        .unwrap();
    assert!(pdf.reason.contains("gpu_util"), "{}", pdf.reason);

    // A refresh with the same effect (new version, same tier and features) sends no event;
    // the next real change does.
    h.apply(command("ui", 1, 2, Tier::T1, 60_000), now_ms())
        .unwrap();
    h.apply(command("ui", 1, 3, Tier::T0, 60_000), now_ms())
        .unwrap();
    let ev = String::from_utf8(body.next().await.unwrap().unwrap().to_vec()).unwrap();
    assert!(
        ev.contains("\"version\":3") && ev.contains("\"tier\":0"),
        "the version-2 refresh made no event: {ev}"
    );

    // The page escapes feature names.
    let res = app
        .oneshot(Request::get("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let page =
        String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(!page.contains("<script>x"), "unescaped name in page");
    assert!(page.contains(&escape_html("<script>x")));
    assert!(page.contains("data-feature=\"pdf_analysis\""));
}

#[test]
fn config_from_flags_and_env() {
    assert_eq!(
        SubscriberConfig::from_env(Some(String::new()), None, None, "i")
            .unwrap()
            .map(|c| c.cluster),
        None
    );
    // The HMAC key alone is not enough: the default scheme is Ed25519 and needs a public key
    // (none is set here, and this test's working directory has no data/command-signing.pub).
    if std::env::var_os("BROWNOUT_COMMAND_PUBKEY").is_none()
        && std::env::var_os("BROWNOUT_COMMAND_SIGNATURE").is_none()
    {
        assert_eq!(
            SubscriberConfig::from_env(
                Some("redis://127.0.0.1:6379".into()),
                None,
                Some("k".into()),
                "i",
            )
            .unwrap_err(),
            brownout_serving::control::SubscriberConfigError::MissingKey
        );
    }
    assert!(
        SubscriberConfig::from_env(
            Some("redis://127.0.0.1:6379".into()),
            Some("a{b".into()),
            Some("k".into()),
            "i"
        )
        .is_err()
    );
    assert!(
        SubscriberConfig::from_env(Some("http://nope".into()), None, Some("k".into()), "i")
            .is_err()
    );
}

/// A lost control plane must not keep an instance drained or a tool breaker open: the first
/// step-down drops the `instances` entries, T0 re-enables every feature (tools included) — even
/// when the expired command was already at T0 — while `abort` entries keep their own deadline.
#[test]
fn lease_expiry_drops_instance_entries_and_reopens_breakers_even_at_t0() {
    use brownout_protocol::{AbortEntry, AbortKind, InstanceEntry};
    let h = ControlHandle::with_instance("c", "gpu-3/engine-0");
    let mut c = command("c", 1, 1, Tier::T0, 1000);
    c.issued_at_ms = 10_000;
    c.expires_at_ms = 11_000;
    c.instances.insert(
        "gpu-3/engine-0".into(),
        InstanceEntry {
            drain: Some(true),
            ..InstanceEntry::default()
        },
    );
    c.features
        .insert("tool:web_search".into(), FeatureState::Probe);
    c.limits.user_concurrency = Some(1);
    c.abort = vec![AbortEntry {
        id: "conv".into(),
        kind: AbortKind::Conversation,
        until_ms: 50_000,
        reason: String::new(),
    }];
    h.apply(c, 10_000).unwrap();
    assert!(h.instance_entry().unwrap().draining());
    assert_eq!(h.step_down_if_expired(10_500), None);
    assert_eq!(h.step_down_if_expired(11_001), Some(Tier::T0));
    let cur = h.current();
    assert!(h.instance_entry().is_none(), "drain dropped");
    assert!(cur.command.instances.is_empty());
    assert!(cur.command.feature_state("tool:web_search").is_open());
    assert_eq!(cur.command.limits, Limits::default());
    assert_eq!(cur.command.abort.len(), 1, "aborts keep their own deadline");
    assert_eq!(cur.command.order_key(), (1, 1));
    // Plain T0 now: nothing more to step down.
    assert_eq!(h.step_down_if_expired(99_000), None);

    // Above T0 the entries go at the first step.
    let mut t2 = command("c", 1, 2, Tier::T2, 1000);
    t2.issued_at_ms = 20_000;
    t2.expires_at_ms = 21_000;
    t2.instances.insert(
        "*".into(),
        InstanceEntry {
            admit_rps: Some(3.0),
            ..InstanceEntry::default()
        },
    );
    h.apply(t2, 20_000).unwrap();
    assert_eq!(h.instance_entry().unwrap().entry.admit_rps, Some(3.0));
    assert_eq!(h.step_down_if_expired(21_001), Some(Tier::T1));
    assert!(h.instance_entry().is_none());
}

/// `/v1/features` and its SSE stream show tool breakers (`tool:<name>`) with their state,
/// `probe` included.
#[tokio::test]
async fn features_show_tool_breakers_and_their_probe_state() {
    let h = ControlHandle::new("ui2");
    let app = router(h.clone(), FeatureCatalog::seed_default());
    let res = app
        .clone()
        .oneshot(
            Request::get("/v1/features/stream")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    let mut body = res.into_body().into_data_stream();
    let _first = body.next().await.unwrap().unwrap();
    let mut c = command("ui2", 1, 1, Tier::T0, 60_000);
    c.features
        .insert("tool:web_search".into(), FeatureState::Disabled);
    c.features
        .insert("tool:code_exec".into(), FeatureState::Probe);
    c.limits.probe_ratio = Some(0.2);
    h.apply(c, now_ms()).unwrap();
    let ev = String::from_utf8(body.next().await.unwrap().unwrap().to_vec()).unwrap();
    let data = ev.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
    let v: FeaturesView = serde_json::from_str(data).unwrap();
    let get = |n: &str| v.features.iter().find(|f| f.name == n).unwrap().clone();
    assert_eq!(get("tool:web_search").state, FeatureState::Disabled);
    assert!(get("tool:web_search").reason.contains("breaker open"));
    assert_eq!(get("tool:code_exec").state, FeatureState::Probe);
    assert!(get("tool:code_exec").reason.contains("20% of calls pass"));
    let raw: serde_json::Value = serde_json::from_str(data).unwrap();
    assert!(
        raw["features"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["name"] == "tool:code_exec" && f["state"] == "probe"),
        "on the wire the state is the string `probe`"
    );
}
