//! Ed25519 command signatures against real `brownout-serve` processes and the real Redis
//! (docs/SECURITY.md "Command signatures"): each engine holds the control plane's public key(s)
//! and its own ack key only. A command signed with anything but a listed private key is refused by
//! every engine, including one sealed with another engine's key; two listed public keys keep
//! commands flowing through a rotation; one engine's ack key cannot ack for another.
//!
//! Waits poll with a generous deadline (a deadlock guard, never a timing assertion).

use std::process::{Child, Command as Proc, Stdio};
use std::time::{Duration, Instant};

use brownout_protocol::command_keys::derive_ack_key;
use brownout_protocol::{
    Ack, AckKeys, Command, CommandSigner, CommandSigningKey, RedisKeys, SignedCommand, Tier, now_ms,
};
use redis::AsyncCommands;

use brownout_test_support::{free_port, redis_url, unique};

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

struct Server {
    child: Child,
    url: String,
    instance: String,
    log: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts an engine that accepts `pubkeys` (comma-separated) and seals acks with `ack_key`.
    /// The data directory is an empty one of its own, so nothing is found there.
    async fn start(cluster: &str, instance: &str, pubkeys: &str, ack_key: &[u8]) -> Server {
        Server::start_with(
            cluster,
            instance,
            &[("BROWNOUT_COMMAND_PUBKEY", pubkeys)],
            ack_key,
        )
        .await
    }

    /// [`Server::start`] with the key variables given (set after the defaults are cleared; they
    /// may also set `RUST_LOG`).
    async fn start_with(
        cluster: &str,
        instance: &str,
        env: &[(&str, &str)],
        ack_key: &[u8],
    ) -> Server {
        let port = free_port();
        let log = std::env::temp_dir().join(format!("{cluster}-{instance}.log"));
        let data = std::env::temp_dir().join(format!("{cluster}-{instance}-data"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Proc::new(env!("CARGO_BIN_EXE_brownout-serve"))
            .args(["--model", "toy", "--host", "127.0.0.1"])
            .args(["--port", &port.to_string()])
            .args(["--redis-url", &redis_url(), "--cluster", cluster])
            .args(["--instance-id", instance])
            .env("BROWNOUT_ACK_KEY", hex::encode(ack_key))
            .env("BROWNOUT_DATA_DIR", &data)
            .env_remove("BROWNOUT_COMMAND_KEY")
            .env_remove("BROWNOUT_COMMAND_SIGNATURE")
            .env_remove("BROWNOUT_COMMAND_PUBKEY")
            .env_remove("BROWNOUT_COMMAND_PUBKEY_FILE")
            .env_remove("BROWNOUT_COMMAND_PUBKEY_OVERLAP_S")
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("BROWNOUT_CONTROL_PLANE")
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("brownout-serve starts");
        let s = Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
            instance: instance.to_string(),
            log,
        };
        let _ = rustls::crypto::ring::default_provider().install_default();
        let c = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let start = Instant::now();
        loop {
            if let Ok(r) = c.get(format!("{}/health", s.url)).send().await
                && r.status() == 200
            {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "{instance} never became healthy:\n{}",
                s.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        s
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

fn command(cluster: &str, version: u64, tier: Tier) -> Command {
    let mut c = Command::normal(cluster, 1, version, now_ms(), 60_000);
    c.tier = tier;
    c.reason.trigger = "gpu_util".into();
    c.reason.detail = "command_keys_process".into();
    c
}

/// Writes `s` the way the publisher does (state hash, then notify) and waits until every engine
/// has acked version `version` (applied or refused); returns the acks, verified with the control
/// plane's per-engine keys.
async fn put_and_wait(
    cl: &str,
    s: &SignedCommand,
    version: u64,
    acks: &AckKeys,
    servers: &[&Server],
) -> Vec<Ack> {
    let mut conn = redis().await;
    let keys = RedisKeys::new(cl).unwrap();
    let _: () = redis::pipe()
        .atomic()
        .hset_multiple(
            keys.state(),
            &[
                ("epoch", "1".to_string()),
                ("version", version.to_string()),
                ("command", s.json.clone()),
                ("sig", s.sig.clone()),
            ],
        )
        .ignore()
        .publish(keys.notify(), format!("1:{version}"))
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut out = Vec::new();
    for srv in servers {
        let start = Instant::now();
        loop {
            let v: Option<String> = conn.hget(keys.acks(), &srv.instance).await.unwrap();
            if let Some(v) = v {
                let ack = Ack::parse_signed(&v, &acks.key_for(&srv.instance), &srv.instance)
                    .unwrap_or_else(|e| panic!("ack {v:?} of {}: {e}", srv.instance));
                let acked = match &ack {
                    Ack::Applied { version: a, .. } | Ack::Refused { version: a, .. } => *a,
                };
                if acked == version {
                    out.push(ack);
                    break;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{} never acked {version}:\n{}",
                srv.instance,
                srv.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    out
}

fn assert_applied(acks: &[Ack], what: &str) {
    for a in acks {
        assert!(matches!(a, Ack::Applied { .. }), "{what}: {a:?}");
    }
}

fn assert_refused(acks: &[Ack], reason: &str, what: &str) {
    for a in acks {
        assert!(
            matches!(a, Ack::Refused { reason: r, .. } if r == reason),
            "{what}: expected refusal {reason}, got {a:?}"
        );
    }
}

#[tokio::test]
async fn only_the_control_planes_private_key_commands_every_engine() {
    let cl = unique("ck-forge-");
    let plane = CommandSigningKey::generate();
    let master = rand::random::<[u8; 32]>().to_vec();
    let acks = AckKeys::Derived(master.clone());
    let pk = plane.public().to_string();
    let e1 = Server::start(&cl, "e1", &pk, &derive_ack_key(&master, "e1")).await;
    let e2 = Server::start(&cl, "e2", &pk, &derive_ack_key(&master, "e2")).await;
    let both = [&e1, &e2];
    let signer = CommandSigner::Ed25519(plane.clone());

    let good = signer.sign(&command(&cl, 1, Tier::T1));
    assert_applied(
        &put_and_wait(&cl, &good, 1, &acks, &both).await,
        "plane-signed",
    );

    // Another Ed25519 key (an attacker's, or a key no longer listed): its key id is unknown.
    let other = CommandSigningKey::generate();
    let s = CommandSigner::Ed25519(other.clone()).sign(&command(&cl, 2, Tier::T3));
    assert_refused(
        &put_and_wait(&cl, &s, 2, &acks, &both).await,
        "unknown_key",
        "other key",
    );

    // The same signature relabelled with the control plane's key id.
    let relabelled = SignedCommand {
        json: s.json.replace("\"version\":2", "\"version\":3"),
        sig: s.sig.replace(other.id(), plane.id()),
    };
    assert_refused(
        &put_and_wait(&cl, &relabelled, 3, &acks, &both).await,
        "bad_signature",
        "relabelled",
    );

    // Signed with an engine's own key (what a compromised engine holds), in the only scheme
    // that key could sign: HMAC. Refused by every engine, the signer's own included.
    let by_engine =
        CommandSigner::Hmac(derive_ack_key(&master, "e1")).sign(&command(&cl, 4, Tier::T3));
    assert_refused(
        &put_and_wait(&cl, &by_engine, 4, &acks, &both).await,
        "scheme_not_accepted",
        "engine-signed",
    );

    // Plane-signed bytes changed after signing.
    let s = signer.sign(&command(&cl, 5, Tier::T1));
    let tampered = SignedCommand {
        json: s.json.replace("\"tier\":1", "\"tier\":3"),
        sig: s.sig,
    };
    assert_refused(
        &put_and_wait(&cl, &tampered, 5, &acks, &both).await,
        "bad_signature",
        "tampered",
    );

    // Plane-signed commands still flow; replaying an old one, validly signed, is refused.
    let good6 = signer.sign(&command(&cl, 6, Tier::T2));
    assert_applied(
        &put_and_wait(&cl, &good6, 6, &acks, &both).await,
        "plane-signed again",
    );
    assert_refused(
        &put_and_wait(&cl, &good, 1, &acks, &both).await,
        "older_version",
        "replayed",
    );

    // One engine's ack, copied to another's field, does not verify as the other's; and e1's key
    // cannot seal an ack for e2.
    let mut conn = redis().await;
    let keys = RedisKeys::new(&cl).unwrap();
    let v1: String = conn.hget(keys.acks(), "e1").await.unwrap();
    assert!(Ack::parse_signed(&v1, &acks.key_for("e2"), "e2").is_err());
    let forged = Ack::Applied {
        epoch: 1,
        version: 99,
        applied_at_ms: now_ms(),
        entry: None,
    }
    .to_signed(&derive_ack_key(&master, "e1"), "e2");
    assert!(Ack::parse_signed(&forged, &acks.key_for("e2"), "e2").is_err());
}

#[tokio::test]
async fn two_public_keys_keep_commands_flowing_through_a_rotation() {
    let cl = unique("ck-rotate-");
    let old = CommandSigningKey::generate();
    let new = CommandSigningKey::generate();
    let master = rand::random::<[u8; 32]>().to_vec();
    let acks = AckKeys::Derived(master.clone());
    let listed = format!("{},{}", old.public(), new.public());
    let e1 = Server::start(&cl, "r1", &listed, &derive_ack_key(&master, "r1")).await;
    let e2 = Server::start(&cl, "r2", &listed, &derive_ack_key(&master, "r2")).await;
    let both = [&e1, &e2];
    // Before the switch: the old key signs.
    let s = CommandSigner::Ed25519(old.clone()).sign(&command(&cl, 1, Tier::T1));
    assert_applied(&put_and_wait(&cl, &s, 1, &acks, &both).await, "old key");
    // The control plane switches to the new key: no engine restarts, nothing refused.
    let s = CommandSigner::Ed25519(new.clone()).sign(&command(&cl, 2, Tier::T2));
    assert_applied(&put_and_wait(&cl, &s, 2, &acks, &both).await, "new key");
    // A replica still on the old key (mid-rollout) is accepted too.
    let s = CommandSigner::Ed25519(old).sign(&command(&cl, 3, Tier::T1));
    assert_applied(
        &put_and_wait(&cl, &s, 3, &acks, &both).await,
        "old key again",
    );
    // An unlisted key is not.
    let s = CommandSigner::Ed25519(CommandSigningKey::generate()).sign(&command(&cl, 4, Tier::T3));
    assert_refused(
        &put_and_wait(&cl, &s, 4, &acks, &both).await,
        "unknown_key",
        "unlisted",
    );
}

/// A running engine's key file is rotated (as a ConfigMap update or an operator's edit does)
/// and the engine gets SIGHUP: the new key's commands apply, the dropped key's are refused
/// (no overlap configured here), with no restart.
#[tokio::test]
async fn a_rotated_key_file_is_picked_up_by_a_running_engine() {
    let cl = unique("ck-keyfile-");
    let old = CommandSigningKey::generate();
    let new = CommandSigningKey::generate();
    let master = rand::random::<[u8; 32]>().to_vec();
    let acks = AckKeys::Derived(master.clone());
    let file = std::env::temp_dir().join(format!("{cl}.pub"));
    std::fs::write(&file, format!("{}\n", old.public())).unwrap();
    let path = file.display().to_string();
    let e = Server::start_with(
        &cl,
        "k1",
        &[
            ("BROWNOUT_COMMAND_PUBKEY_FILE", path.as_str()),
            ("BROWNOUT_COMMAND_PUBKEY_OVERLAP_S", "0"),
            // The SIGHUP handler's line, which the test waits for.
            ("RUST_LOG", "warn,brownout_serve=info"),
        ],
        &derive_ack_key(&master, "k1"),
    )
    .await;
    let one = [&e];
    let s = CommandSigner::Ed25519(old.clone()).sign(&command(&cl, 1, Tier::T1));
    assert_applied(&put_and_wait(&cl, &s, 1, &acks, &one).await, "old key");
    let s = CommandSigner::Ed25519(new.clone()).sign(&command(&cl, 2, Tier::T2));
    assert_refused(
        &put_and_wait(&cl, &s, 2, &acks, &one).await,
        "unknown_key",
        "new key before the rotation",
    );
    // The file now lists the new key only; SIGHUP asks for it to be read at once.
    std::fs::write(&file, format!("# rotated\n{}\n", new.public())).unwrap();
    let hup = Proc::new("kill")
        .args(["-HUP", &e.child.id().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    // The signal is handled on the engine's runtime: wait until it is (the reload then happens
    // at the next command), so a loaded machine does not race the command past it.
    let start = std::time::Instant::now();
    while !e
        .log()
        .contains("SIGHUP: the command public keys are read again")
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the engine never handled SIGHUP:\n{}",
            e.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let s = CommandSigner::Ed25519(new).sign(&command(&cl, 3, Tier::T2));
    assert_applied(
        &put_and_wait(&cl, &s, 3, &acks, &one).await,
        "new key after the rotation",
    );
    let s = CommandSigner::Ed25519(old).sign(&command(&cl, 4, Tier::T3));
    assert_refused(
        &put_and_wait(&cl, &s, 4, &acks, &one).await,
        "unknown_key",
        "the dropped key",
    );
    let _ = std::fs::remove_file(&file);
}

/// An engine with a public key but no ack key (and nothing in its data directory) refuses to
/// start, saying what to set.
#[test]
fn an_engine_without_an_ack_key_says_so() {
    let cl = unique("ck-noack-");
    let data = std::env::temp_dir().join(format!("{cl}-data"));
    let out = Proc::new(env!("CARGO_BIN_EXE_brownout-serve"))
        .args(["--model", "toy", "--host", "127.0.0.1", "--port", "0"])
        .args(["--redis-url", &redis_url(), "--cluster", &cl])
        .env(
            "BROWNOUT_COMMAND_PUBKEY",
            CommandSigningKey::generate().public().to_string(),
        )
        .env("BROWNOUT_DATA_DIR", &data)
        .env_remove("BROWNOUT_ACK_KEY")
        .env_remove("BROWNOUT_ACK_KEY_FILE")
        .env_remove("BROWNOUT_COMMAND_SIGNATURE")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("BROWNOUT_ACK_KEY"), "{err}");
}
