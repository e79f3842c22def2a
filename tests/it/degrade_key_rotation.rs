//! Rotating the control plane's command keys without a restart (issue 39), against the real
//! Redis (`REDIS_TEST_URL`, cluster names of the test's own):
//! - a running controller handed new keys ([`DegradeHandle::replace_keys`], what SIGHUP or a
//!   changed key file does in `brownout serve`) signs its next command with the new key only;
//! - acks that engines made under the old ack master still verify during the overlap, and not
//!   after it; acks under the new master verify;
//! - [`key_reload::reload_once`] reads the data directory's key files again: unchanged files
//!   change nothing, a new signing key is handed over, a malformed one is refused and the
//!   running keys kept.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use brownout::config::Config;
use brownout::degrade::redis::{AckEntry, RedisBus};
use brownout::degrade::{DegradeConfig, DegradeHandle, Policy, Transport, router, run_controller};
use brownout::plane::key_reload;
use brownout_protocol::command_keys::{
    self as ck, CommandSigningKey, CommandVerifier, derive_ack_key,
};
use brownout_protocol::{Ack, PlaneKeys, RedisKeys, Tier};
use brownout_test_support::{redis_url, require_redis, unique, wait_for};
use redis::AsyncCommands;
use tower::ServiceExt;

use crate::degrade_override::POLICY;

fn keys(seed: u8, master: &[u8]) -> (PlaneKeys, CommandVerifier) {
    let k = CommandSigningKey::from_seed(&[seed; 32]);
    let only = CommandVerifier::ed25519([k.public()]);
    (PlaneKeys::ed25519(k, [], master), only)
}

async fn pin(app: &axum::Router, tier: u8) {
    let req = Request::builder()
        .method("POST")
        .uri("/api/v1/degrade/override")
        .header("content-type", "application/json")
        .body(Body::from(format!(
            r#"{{"tier":{tier},"duration_secs":600,"reason":"key rotation test"}}"#
        )))
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

/// The stored command once `ok` holds for it (within 5 s).
async fn stored_when(
    reader: &mut RedisBus,
    ok: impl Fn(&Option<brownout_protocol::SignedCommand>) -> bool,
) -> Option<brownout_protocol::SignedCommand> {
    let started = Instant::now();
    loop {
        let s = reader.stored().await.unwrap();
        if ok(&s) {
            return s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the command in Redis never became the expected one: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reloaded_signing_key_signs_the_next_command() {
    let url = redis_url();
    require_redis(&url);
    let cluster = unique("t-keyrot-");
    let (a, only_a) = keys(1, b"ack-master-a-0123456789abcdef0123");
    let (b, only_b) = keys(2, b"ack-master-b-0123456789abcdef0123");
    let mut c = DegradeConfig::new(&cluster, a, Policy::from_yaml(POLICY).unwrap());
    c.leader_lease_ms = 600;
    let h = DegradeHandle::new(c, &prometheus::Registry::new()).unwrap();
    let task = tokio::spawn({
        let (h, url) = (h.clone(), url.clone());
        async move {
            let _ = run_controller(h, Transport::Redis { url }, std::future::pending::<()>()).await;
        }
    });
    let app = router(h.clone());
    let mut reader = RedisBus::connect(&url, &cluster, "reader", Duration::from_millis(500), b"x")
        .await
        .unwrap();
    let stored_tier = |v: &CommandVerifier, s: &Option<brownout_protocol::SignedCommand>| {
        s.as_ref()
            .and_then(|s| v.verify_for(s, &cluster).ok())
            .map(|c| c.tier)
    };

    pin(&app, 1).await;
    let s = stored_when(&mut reader, |s| stored_tier(&only_a, s) == Some(Tier::T1)).await;
    assert_eq!(
        stored_tier(&only_b, &s),
        None,
        "not signed with the new key yet"
    );

    h.replace_keys(b, Duration::from_secs(60));
    tokio::time::sleep(Duration::from_millis(200)).await;
    pin(&app, 2).await;
    let s = stored_when(&mut reader, |s| stored_tier(&only_b, s) == Some(Tier::T2)).await;
    assert_eq!(
        stored_tier(&only_a, &s),
        None,
        "the old key no longer signs"
    );
    wait_for("T2 in force", Duration::from_secs(5), || {
        h.status().tier == Tier::T2
    })
    .await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_under_the_replaced_ack_master_verify_for_the_overlap_only() {
    let url = redis_url();
    require_redis(&url);
    let cluster = unique("t-ackrot-");
    let (ma, mb) = (
        b"ack-master-a-0123456789abcdef0123",
        b"ack-master-b-0123456789abcdef0123",
    );
    let ((a, _), (b, _)) = (keys(1, ma), keys(2, mb));
    let mut bus = RedisBus::connect(&url, &cluster, "t", Duration::from_millis(500), a.clone())
        .await
        .unwrap();
    let mut r = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let ack = Ack::Applied {
        epoch: 1,
        version: 1,
        applied_at_ms: brownout_protocol::now_ms(),
        entry: None,
    };
    let acks = RedisKeys::new(&cluster).unwrap().acks();
    let _: () = r
        .hset(&acks, "e1", ack.to_signed(&derive_ack_key(ma, "e1"), "e1"))
        .await
        .unwrap();
    let _: () = r
        .hset(&acks, "e2", ack.to_signed(&derive_ack_key(mb, "e2"), "e2"))
        .await
        .unwrap();
    let ok =
        |m: &BTreeMap<String, AckEntry>, inst: &str| matches!(m.get(inst), Some(AckEntry::Ok(_)));

    let m = bus.acks().await.unwrap();
    assert!(
        ok(&m, "e1") && !ok(&m, "e2"),
        "before: only the old master's ack"
    );
    bus.set_keys(&b, Some((&a, Instant::now() + Duration::from_secs(60))));
    let m = bus.acks().await.unwrap();
    assert!(ok(&m, "e1") && ok(&m, "e2"), "during the overlap: both");
    bus.set_keys(&b, Some((&a, Instant::now())));
    let m = bus.acks().await.unwrap();
    assert!(
        !ok(&m, "e1") && ok(&m, "e2"),
        "after the overlap: only the new master's"
    );
    let _: () = r.del(&acks).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_once_reads_the_data_directorys_key_files_again() {
    // The data directory's keys (no key environment variables in this test process).
    if std::env::var_os(ck::SIGNING_KEY_FILE_ENV).is_some()
        || std::env::var_os(ck::SIGNATURE_ENV).is_some()
    {
        eprintln!("SKIPPED reload_once: a command key variable is set in the test environment");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::from_toml_str("k.toml", "", &BTreeMap::new()).unwrap();
    config.data_dir = dir.path().to_path_buf();
    let mut current = brownout::plane::plane_keys(&config).unwrap();
    let h = DegradeHandle::new(
        DegradeConfig::new(
            "t-reload",
            current.clone(),
            Policy::from_yaml(POLICY).unwrap(),
        ),
        &prometheus::Registry::new(),
    )
    .unwrap();
    let overlap = Duration::from_secs(5);
    assert!(
        !key_reload::reload_once(&h, &config, &mut current, overlap).unwrap(),
        "unchanged"
    );

    let new = CommandSigningKey::from_seed(&[7; 32]);
    std::fs::write(dir.path().join(ck::SIGNING_KEY_FILE), new.seed_hex()).unwrap();
    assert!(
        key_reload::reload_once(&h, &config, &mut current, overlap).unwrap(),
        "a new signing key"
    );
    assert_eq!(
        current.signer.sign_bytes(b"probe"),
        brownout_protocol::CommandSigner::Ed25519(new).sign_bytes(b"probe"),
        "the running keys are the new file's"
    );

    std::fs::write(dir.path().join(ck::SIGNING_KEY_FILE), "not a key").unwrap();
    let before = current.signer.sign_bytes(b"probe");
    assert!(key_reload::reload_once(&h, &config, &mut current, overlap).is_err());
    assert_eq!(
        current.signer.sign_bytes(b"probe"),
        before,
        "a bad file changes nothing"
    );
}
