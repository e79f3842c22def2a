//! Token rotation without a restart (docs/SECURITY.md "Rotating tokens"), against the real
//! `brownout serve` binary: a changed token file is picked up while the old token stays accepted
//! for the overlap; SIGHUP reloads too, and with no overlap the old token is refused at once; a
//! reload that fails keeps the running tokens.
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
