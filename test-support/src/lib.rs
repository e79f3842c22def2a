//! Dev-only helpers for brownout's tests (never a dependency of a shipped binary).
//!
//! - [`wait_for`] / [`eventually`] (their `_async` forms, and [`poll`]): poll a condition until
//!   it holds, failing with what was awaited after a generous liveness limit. They measure nothing: the
//!   limit is there so a broken build fails instead of hanging, not to assert a speed. They use
//!   tokio's clock, so they work under `tokio::time::pause` too.
//! - [`unique`]: names (cluster ids, Redis key prefixes) no other test or run shares.
//! - [`redis_url`] / [`require_redis`]: the shared test Redis (`REDIS_TEST_URL`);
//!   [`OwnRedis`]: a redis-server of the test's own on a spare port, to kill and restart.
//! - [`repo_root`] and [`free_port`].
//! - [`clickhouse_cluster::ClickHouseCluster`]: ZooKeeper and two clickhouse-server processes
//!   (2 shards × 1 replica) of the test's own, or a SKIPPED message when they are not installed.
//! - `ui` (feature `ui`): [`ui::SampleDataSource`], the web UI over fixed sample data.
//! - `pipes`: a binary's output to pipes until its first log line, and the no-colour-codes check.
//! - `engines` (feature `engines`): fixture engines in vLLM's and the bundled tier's formats and
//!   a snapshot sink (the same file `gpu-agent bench` runs).

pub mod clickhouse_cluster;
#[cfg(feature = "engines")]
#[path = "../../gpu-agent/src/bench/engines.rs"]
pub mod engines;
pub mod pipes;
#[cfg(feature = "ui")]
pub mod ui;

use std::future::Future;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The first pause between two polls; it doubles up to [`MAX_POLL`].
const FIRST_POLL: Duration = Duration::from_millis(5);
/// The longest pause between two polls.
const MAX_POLL: Duration = Duration::from_millis(25);

fn next_pause(p: Duration) -> Duration {
    (p * 2).min(MAX_POLL)
}

/// Polls `f` until it returns true. Panics naming `what` once `limit` has passed.
pub async fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    eventually(what, limit, || f().then_some(())).await;
}

/// Polls the future `f` makes until it yields true. Panics naming `what` after `limit`.
pub async fn wait_for_async<F, Fut>(what: &str, limit: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_async(what, limit, || {
        let fut = f();
        async move { fut.await.then_some(()) }
    })
    .await;
}

/// Polls `f` until it gives `Some`, and returns the value. Panics naming `what` after `limit`.
pub async fn eventually<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    eventually_async(what, limit, || std::future::ready(f())).await
}

/// Polls the future `f` makes until it yields `Some`, and returns the value. Panics naming
/// `what` after `limit`.
pub async fn eventually_async<T, F, Fut>(what: &str, limit: Duration, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match poll(limit, f).await {
        Some(v) => v,
        None => panic!("gave up after {limit:?} waiting for {what}"),
    }
}

/// Polls the future `f` makes until it yields `Some` (the value), or `limit` passes (`None`:
/// the caller says what it waited for, with whatever it last saw).
pub async fn poll<T, F, Fut>(limit: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    let mut pause = FIRST_POLL;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(pause).await;
        pause = next_pause(pause);
    }
}

/// `{prefix}{12 random hex digits}`: a cluster id, key prefix or table prefix nobody else uses
/// (the prefix brings its separator: `unique("t-")`, `unique("tbl_")`).
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// The shared test Redis: `REDIS_TEST_URL`, else `redis://127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var("REDIS_TEST_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into())
}

/// Panics with how to start Redis when nothing answers TCP at the test Redis's address.
pub fn require_redis(url: &str) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, hp)| hp);
    let hostport = rest.split('/').next().unwrap_or_default();
    let ok = std::net::ToSocketAddrs::to_socket_addrs(hostport)
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok());
    assert!(
        ok,
        "Redis is not reachable at {url}: start it with scripts/test.sh (or `redis-server --port 6379`)"
    );
}

/// The repository's root directory (where the workspace's Cargo.toml is).
pub fn repo_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent()
        .expect("test-support lives one level below the repository root")
        .to_path_buf()
}

/// A TCP port on loopback that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port on loopback")
        .port()
}

/// A redis-server of the test's own on a spare port, without persistence (a restart loses
/// everything: the hardest case for convergence). Killed when dropped.
pub struct OwnRedis {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl OwnRedis {
    /// Starts it and waits until it accepts connections.
    ///
    /// # Panics
    /// When `redis-server` is not installed or does not start.
    pub fn start() -> OwnRedis {
        let mut r = OwnRedis {
            port: free_port(),
            dir: tempfile::tempdir().expect("a temporary directory"),
            child: None,
        };
        r.spawn();
        r
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// (Re)starts the server on the same port (after [`OwnRedis::kill`]), empty.
    pub fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (/usr/bin/redis-server)");
        self.child = Some(child);
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "own redis-server did not start on port {}",
                self.port
            );
            // Short: `degrade_bench` times convergence from the moment this returns.
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn eventually_returns_the_first_value_and_gives_up_after_the_limit() {
        let mut n = 0;
        let v = eventually("n reaches 3", Duration::from_secs(1), || {
            n += 1;
            (n >= 3).then_some(n)
        })
        .await;
        assert_eq!(v, 3);
        let r = tokio::spawn(wait_for("never", Duration::from_secs(1), || false)).await;
        let msg = *r.unwrap_err().into_panic().downcast::<String>().unwrap();
        assert!(msg.contains("waiting for never"), "{msg}");
    }

    #[test]
    fn unique_names_differ_and_keep_the_prefix() {
        let (a, b) = (unique("t-"), unique("t-"));
        assert_ne!(a, b);
        assert!(a.starts_with("t-") && a.len() == 14, "{a}");
        assert!(unique("tbl_")[4..].bytes().all(|b| b.is_ascii_hexdigit()));
    }

    #[test]
    fn the_repository_root_holds_the_workspace() {
        assert!(repo_root().join("Cargo.toml").is_file());
        assert!(repo_root().join("examples/policy.yaml").is_file());
    }
}
