//! Token rotation without a restart (docs/SECURITY.md "Rotating tokens"), against the real
//! `brownout serve` binary: a changed token file is picked up while the old token stays accepted
//! for the overlap; SIGHUP reloads too, and with no overlap the old token is refused at once; a
//! reload that fails keeps the running tokens. The command signing key reloads the same way
//! (a rewritten data-directory key and SIGHUP: the next command in Redis is signed with it).
//!
//! Waits poll with a generous deadline (a deadlock guard, never a timing assertion).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use brownout_test_support::{free_port, unique};

struct Serve {
    child: Child,
    url: String,
    log: PathBuf,
    read_file: PathBuf,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const READ_A: &str = "read-token-rotation-aaaaaaaa";
const READ_B: &str = "read-token-rotation-bbbbbbbb";

impl Serve {
    async fn start(dir: &Path, overlap_s: u64) -> Serve {
        Serve::start_with(dir, overlap_s, &[]).await
    }

    /// [`Serve::start`] with more environment (`REDIS_URL` and the cluster name, say).
    async fn start_with(dir: &Path, overlap_s: u64, env: &[(&str, String)]) -> Serve {
        // reqwest is built without a default provider: not left to whichever test ran first.
        let _ = rustls::crypto::ring::default_provider().install_default();
        std::fs::create_dir_all(dir).unwrap();
        let (http, otlp, grpc) = (free_port(), free_port(), free_port());
        let config = dir.join("brownout.toml");
        std::fs::write(
            &config,
            format!(
                "[server]\nhttp_addr = \"127.0.0.1:{http}\"\notlp_http_addr = \"127.0.0.1:{otlp}\"\n\
                 otlp_grpc_addr = \"127.0.0.1:{grpc}\"\n\n[storage]\ndata_dir = \"{}\"\n",
                dir.join("data").display()
            ),
        )
        .unwrap();
        let read_file = dir.join("read.token");
        std::fs::write(&read_file, format!("{READ_A}\n")).unwrap();
        let log = dir.join("serve.log");
        let child = Command::new(env!("CARGO_BIN_EXE_brownout"))
            .args(["serve", "--config"])
            .arg(&config)
            .env("BROWNOUT_INGEST_TOKEN", "ingest-token-rotation-cccccc")
            .env("BROWNOUT_READ_TOKEN_FILE", &read_file)
            .env_remove("BROWNOUT_READ_TOKEN")
            .env("BROWNOUT_ADMIN_TOKEN", "admin-token-rotation-dddddd")
            .env("BROWNOUT_TOKEN_OVERLAP_S", overlap_s.to_string())
            .env_remove("CLICKHOUSE_URL")
            .env_remove("REDIS_URL")
            .env_remove("BROWNOUT_DATA_DIR")
            .env_remove("BROWNOUT_COMMAND_SIGNATURE")
            .env_remove("BROWNOUT_COMMAND_SIGNING_KEY_FILE")
            .env_remove("BROWNOUT_ACK_MASTER_KEY_FILE")
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let s = Serve {
            child,
            url: format!("http://127.0.0.1:{http}"),
            log,
            read_file,
        };
        let start = Instant::now();
        while s.status(READ_A).await != Some(200) {
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "brownout serve never answered:\n{}",
                s.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        s
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn status(&self, token: &str) -> Option<u16> {
        reqwest::Client::new()
            .get(format!("{}/api/v1/hosts", self.url))
            .bearer_auth(token)
            .send()
            .await
            .ok()
            .map(|r| r.status().as_u16())
    }

    async fn wait_status(&self, token: &str, want: u16, what: &str) {
        let start = Instant::now();
        while self.status(token).await != Some(want) {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{what}: never {want}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn hup(&self) {
        let st = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    }
}

#[tokio::test]
async fn a_changed_token_file_rotates_the_token_and_the_old_one_overlaps() {
    let dir = std::env::temp_dir().join(unique("token-reload-file-"));
    let s = Serve::start(&dir, 3600).await;
    assert_eq!(s.status(READ_B).await, Some(401), "B before the rotation");
    std::fs::write(&s.read_file, format!("{READ_B}\n")).unwrap();
    s.wait_status(READ_B, 200, "new token after the file changed")
        .await;
    // Within the overlap the old token is still accepted: clients switch without a 401.
    assert_eq!(
        s.status(READ_A).await,
        Some(200),
        "old token during the overlap"
    );
    assert_eq!(s.status("read-token-never-issued-xxxx").await, Some(401));
    // A bad reload (token too short) changes nothing.
    std::fs::write(&s.read_file, "short\n").unwrap();
    s.hup();
    let start = Instant::now();
    while !s.log().contains("token reload failed") {
        assert!(start.elapsed() < Duration::from_secs(30), "{}", s.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        s.status(READ_B).await,
        Some(200),
        "kept after a failed reload"
    );
    assert_eq!(s.status("short").await, Some(401));
    // Still running (SIGHUP does not end the process).
    assert!(matches!(
        Command::new("kill").args(["-0", &s.child.id().to_string()]).status(),
        Ok(st) if st.success()
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn sighup_reloads_and_without_overlap_the_old_token_is_refused() {
    let dir = std::env::temp_dir().join(unique("token-reload-hup-"));
    let s = Serve::start(&dir, 0).await;
    std::fs::write(&s.read_file, format!("{READ_B}\n")).unwrap();
    s.hup();
    s.wait_status(READ_B, 200, "new token after SIGHUP").await;
    assert_eq!(
        s.status(READ_A).await,
        Some(401),
        "no overlap: old token refused"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The control plane's own signing key rotated under a running `brownout serve` (the data
/// directory's `command-signing.key` rewritten, then SIGHUP): the next command in Redis is
/// signed with the new key only, without a restart.
#[tokio::test]
async fn a_rewritten_signing_key_signs_the_next_command_after_sighup() {
    use brownout_protocol::command_keys::{self as ck, CommandSigningKey, CommandVerifier};
    let url = brownout_test_support::redis_url();
    brownout_test_support::require_redis(&url);
    let dir = std::env::temp_dir().join(unique("key-reload-"));
    let cluster = unique("t-keyhup-");
    let s = Serve::start_with(
        &dir,
        3600,
        &[
            ("REDIS_URL", url.clone()),
            (brownout_protocol::CLUSTER_ENV, cluster.clone()),
        ],
    )
    .await;
    let data = dir.join("data");
    let old =
        ck::parse_public_keys(&std::fs::read_to_string(data.join(ck::PUBLIC_KEY_FILE)).unwrap())
            .unwrap();
    let only_old = CommandVerifier::ed25519(old);
    let new = CommandSigningKey::from_seed(&[9; 32]);
    let only_new = CommandVerifier::ed25519([new.public()]);
    let keys = brownout_protocol::RedisKeys::new(&cluster).unwrap();
    let mut r = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let pin = |tier: u8| {
        let u = format!("{}/api/v1/degrade/override", s.url);
        async move {
            let res = reqwest::Client::new()
                .post(u)
                .bearer_auth("admin-token-rotation-dddddd")
                .json(&serde_json::json!({"tier": tier, "duration_secs": 600, "reason": "key rotation"}))
                .send()
                .await
                .unwrap();
            assert_eq!(res.status().as_u16(), 200);
        }
    };
    // The stored command, once `v` verifies it at `tier`.
    let mut stored_at = async |v: &CommandVerifier, tier: u8| {
        let start = Instant::now();
        loop {
            let m: std::collections::BTreeMap<String, String> =
                redis::AsyncCommands::hgetall(&mut r, keys.state())
                    .await
                    .unwrap();
            if let (Some(json), Some(sig)) = (m.get("command"), m.get("sig")) {
                let sc = brownout_protocol::SignedCommand {
                    json: json.clone(),
                    sig: sig.clone(),
                };
                if v.verify_for(&sc, &cluster)
                    .is_ok_and(|c| c.tier.as_u8() == tier)
                {
                    return sc;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no T{tier} command under the expected key:\n{}",
                s.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    pin(1).await;
    let first = stored_at(&only_old, 1).await;
    assert!(only_new.verify_for(&first, &cluster).is_err());

    std::fs::write(data.join(ck::SIGNING_KEY_FILE), new.seed_hex()).unwrap();
    s.hup();
    tokio::time::sleep(Duration::from_millis(500)).await;
    pin(2).await;
    let second = stored_at(&only_new, 2).await;
    assert!(
        only_old.verify_for(&second, &cluster).is_err(),
        "signed with the new key only"
    );
    assert!(s.log().contains("command keys reloaded"), "{}", s.log());
}
