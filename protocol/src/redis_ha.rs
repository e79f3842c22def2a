//! Redis high availability through Sentinel, for every process that takes a `REDIS_URL`.
//!
//! ```text
//! redis+sentinel://[user:password@]host1[:port1][,host2[:port2]…]/<master-name>[/<db>]
//! ```
//!
//! The hosts are Sentinels (default port 26379); `<master-name>` is the name they monitor
//! (`sentinel monitor <master-name> …`). The credentials and db are those of the data nodes (the
//! master and its replicas); the Sentinels are asked without credentials. TLS through Sentinel
//! (`rediss+sentinel://`) is refused with a clear error: not supported yet.
//!
//! Resolution asks the Sentinels in the order given (`SENTINEL get-master-addr-by-name`), connects
//! to the address the first one answers, and accepts it only if that node says `ROLE` master (a
//! Sentinel that has not yet seen a failover names the old master, which is then refused or
//! unreachable, and the next Sentinel is asked).
//!
//! [`HaConnection`] is what long-lived clients hold: for a plain URL it is the redis crate's
//! [`ConnectionManager`] (reconnects to the same address); for a Sentinel URL it is one
//! multiplexed connection to the master that is dropped on an IO error, a timeout, `READONLY`
//! (the node was demoted) or `MASTERDOWN`, and resolved again through the Sentinels on the next
//! command. The command that hit the error fails; callers already retry on their next round.
//! Pub/sub connections are opened per session from [`RedisTarget::client`].

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value,
};

/// The URL scheme of a Sentinel-resolved Redis.
pub const SENTINEL_SCHEME: &str = "redis+sentinel://";
/// The Sentinel port when a host names none.
pub const SENTINEL_DEFAULT_PORT: u16 = 26379;

fn config_err(what: &'static str, detail: String) -> RedisError {
    RedisError::from((ErrorKind::InvalidClientConfig, what, detail))
}

/// A parsed `redis+sentinel://` URL.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelSpec {
    /// Sentinel addresses, asked in this order.
    pub sentinels: Vec<(String, u16)>,
    /// The monitored master's name.
    pub master_name: String,
    /// Database on the data nodes.
    pub db: i64,
    /// `user:password@` exactly as written in the URL (percent-encoding kept), for the data nodes.
    userinfo: Option<String>,
}

impl std::fmt::Debug for SentinelSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the password.
        f.debug_struct("SentinelSpec")
            .field("sentinels", &self.sentinels)
            .field("master_name", &self.master_name)
            .field("db", &self.db)
            .field("credentials", &self.userinfo.is_some())
            .finish()
    }
}

fn parse_host(h: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = h.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("{h:?}: unclosed [ in an IPv6 address"))?;
        (host.to_string(), after.strip_prefix(':'))
    } else {
        match h.rsplit_once(':') {
            Some((host, port)) => (host.to_string(), Some(port)),
            None => (h.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err(format!("{h:?}: empty host"));
    }
    let port = match port {
        None => SENTINEL_DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("{h:?}: the port must be 1-65535"))?,
    };
    Ok((host, port))
}

impl SentinelSpec {
    /// Parses `redis+sentinel://[user:password@]host[:port][,host[:port]…]/<master>[/<db>]`.
    ///
    /// # Errors
    /// `InvalidClientConfig` naming what is wrong.
    pub fn parse(url: &str) -> RedisResult<SentinelSpec> {
        let bad = |d: String| config_err("invalid redis+sentinel:// URL", d);
        let rest = url
            .strip_prefix(SENTINEL_SCHEME)
            .ok_or_else(|| bad(format!("must start with {SENTINEL_SCHEME}")))?;
        let rest = rest.split(['?', '#']).next().unwrap_or_default();
        let (authority, path) = rest
            .split_once('/')
            .ok_or_else(|| bad("no /<master-name> after the Sentinel hosts".into()))?;
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u.to_string()).filter(|u| !u.is_empty()), h),
            None => (None, authority),
        };
        let sentinels = hosts
            .split(',')
            .filter(|h| !h.is_empty())
            .map(parse_host)
            .collect::<Result<Vec<_>, _>>()
            .map_err(bad)?;
        if sentinels.is_empty() {
            return Err(bad("no Sentinel host".into()));
        }
        let mut parts = path.split('/');
        let master_name = parts.next().unwrap_or_default().to_string();
        if master_name.is_empty()
            || !master_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(bad(format!(
                "master name {master_name:?}: one or more of A-Z a-z 0-9 - _ ."
            )));
        }
        let db = match parts.next().filter(|d| !d.is_empty()) {
            None => 0,
            Some(d) => d
                .parse::<i64>()
                .ok()
                .filter(|d| *d >= 0)
                .ok_or_else(|| bad(format!("db {d:?} is not a non-negative integer")))?,
        };
        if parts.any(|p| !p.is_empty()) {
            return Err(bad("nothing may follow /<master-name>/<db>".into()));
        }
        Ok(SentinelSpec {
            sentinels,
            master_name,
            db,
            userinfo,
        })
    }

    fn node_url(&self, host: &str, port: u16) -> String {
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        match &self.userinfo {
            Some(u) => format!("redis://{u}@{host}:{port}/{}", self.db),
            None => format!("redis://{host}:{port}/{}", self.db),
        }
    }

    /// The master's address as each Sentinel in turn reports it (the first that answers).
    ///
    /// # Errors
    /// No Sentinel answered with an address within `timeout` each.
    pub async fn master_addr(&self, timeout: Duration) -> RedisResult<(String, u16)> {
        self.candidates(timeout).await.map(|mut v| v.swap_remove(0))
    }

    /// The distinct addresses the Sentinels report, in the order asked.
    async fn candidates(&self, timeout: Duration) -> RedisResult<Vec<(String, u16)>> {
        let mut out: Vec<(String, u16)> = Vec::new();
        let mut errors = Vec::new();
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        for (host, port) in &self.sentinels {
            let url = SentinelSpec {
                userinfo: None,
                db: 0,
                ..self.clone()
            }
            .node_url(host, *port);
            let asked = async {
                let client = redis::Client::open(url.as_str())?;
                let mut c = client
                    .get_multiplexed_async_connection_with_config(&cfg)
                    .await?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&self.master_name)
                    .query_async::<Option<(String, String)>>(&mut c)
                    .await
            };
            match tokio::time::timeout(timeout * 2, asked).await {
                Ok(Ok(Some((h, p)))) => match p.parse::<u16>() {
                    Ok(p) if !out.contains(&(h.clone(), p)) => out.push((h, p)),
                    Ok(_) => {}
                    Err(_) => errors.push(format!("{host}:{port}: bad port {p:?}")),
                },
                Ok(Ok(None)) => errors.push(format!(
                    "{host}:{port}: does not monitor {:?}",
                    self.master_name
                )),
                Ok(Err(e)) => errors.push(format!("{host}:{port}: {e}")),
                Err(_) => errors.push(format!("{host}:{port}: no answer in {timeout:?}")),
            }
        }
        if out.is_empty() {
            return Err(RedisError::from((
                ErrorKind::Io,
                "no Sentinel named the master",
                errors.join("; "),
            )));
        }
        Ok(out)
    }

    /// A client and a connection to the current master, checked with `ROLE`.
    ///
    /// # Errors
    /// No Sentinel answered, or no node they name is reachable and a master now.
    pub async fn master(
        &self,
        timeout: Duration,
    ) -> RedisResult<(redis::Client, MultiplexedConnection)> {
        let cfg = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let mut errors = Vec::new();
        for (host, port) in self.candidates(timeout).await? {
            let client = redis::Client::open(self.node_url(&host, port).as_str())?;
            let checked = async {
                let mut c = client
                    .get_multiplexed_async_connection_with_config(&cfg)
                    .await?;
                let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut c).await?;
                let role: String = role
                    .into_iter()
                    .next()
                    .map(redis::from_redis_value)
                    .transpose()?
                    .unwrap_or_default();
                Ok::<_, RedisError>((c, role))
            };
            match tokio::time::timeout(timeout * 2, checked).await {
                Ok(Ok((c, role))) if role == "master" => return Ok((client, c)),
                Ok(Ok((_, role))) => errors.push(format!("{host}:{port}: ROLE is {role:?}")),
                Ok(Err(e)) => errors.push(format!("{host}:{port}: {e}")),
                Err(_) => errors.push(format!("{host}:{port}: no answer in {timeout:?}")),
            }
        }
        Err(RedisError::from((
            ErrorKind::Io,
            "the master named by Sentinel is not reachable as a master",
            errors.join("; "),
        )))
    }
}

/// Where a `REDIS_URL` points: one node, or a master found through Sentinel.
#[derive(Clone, Debug)]
pub enum RedisTarget {
    /// `redis://` or `rediss://`.
    Direct(redis::Client),
    /// `redis+sentinel://`.
    Sentinel(SentinelSpec),
}

impl RedisTarget {
    /// Parses a URL (TLS files from the environment for `rediss://`, as [`crate::redis_client`]).
    /// Does no network IO.
    ///
    /// # Errors
    /// A malformed URL, `rediss+sentinel://`, or an unreadable TLS file.
    pub fn parse(url: &str) -> RedisResult<RedisTarget> {
        if url.starts_with(SENTINEL_SCHEME) {
            return SentinelSpec::parse(url).map(RedisTarget::Sentinel);
        }
        if url.starts_with("rediss+sentinel://") {
            return Err(config_err(
                "TLS through Sentinel is not supported",
                "use redis+sentinel:// on a trusted network, or rediss:// to one node".into(),
            ));
        }
        crate::redis_client(url).map(RedisTarget::Direct)
    }

    pub fn is_sentinel(&self) -> bool {
        matches!(self, RedisTarget::Sentinel(_))
    }

    /// A client for the node to talk to now (for Sentinel: the master resolved now).
    ///
    /// # Errors
    /// Sentinel resolution failed (see [`SentinelSpec::master`]).
    pub async fn client(&self, timeout: Duration) -> RedisResult<redis::Client> {
        match self {
            RedisTarget::Direct(c) => Ok(c.clone()),
            RedisTarget::Sentinel(s) => s.master(timeout).await.map(|(c, _)| c),
        }
    }
}

/// Errors after which a Sentinel-resolved connection is dropped and the master resolved again.
pub fn needs_reresolve(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_timeout()
        || e.is_unrecoverable_error()
        || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
}

struct SentinelConn {
    spec: SentinelSpec,
    timeout: Duration,
    /// The connection to the master and a generation (so a stale failure does not drop a
    /// connection made after it).
    cur: tokio::sync::Mutex<(u64, Option<MultiplexedConnection>)>,
}

impl SentinelConn {
    async fn get(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        let mut g = self.cur.lock().await;
        if let Some(c) = &g.1 {
            return Ok((g.0, c.clone()));
        }
        let (_, c) = self.spec.master(self.timeout).await?;
        g.0 += 1;
        g.1 = Some(c.clone());
        Ok((g.0, c))
    }

    async fn failed(&self, generation: u64, e: &RedisError) {
        if needs_reresolve(e) {
            let mut g = self.cur.lock().await;
            if g.0 == generation && g.1.take().is_some() {
                tracing::warn!(master = %self.spec.master_name, error = %e, "redis+sentinel: connection dropped; resolving the master again");
            }
        }
    }
}

#[derive(Clone)]
enum Inner {
    Direct(ConnectionManager),
    Sentinel(Arc<SentinelConn>),
}

/// Why [`HaConnection::connect_bounded`] gave no connection.
#[derive(Debug, thiserror::Error)]
pub enum BoundedConnectError {
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    #[error("Redis did not answer within {0:?}")]
    Timeout(Duration),
}

/// A long-lived connection that follows the master (see the module docs). Cheap to clone; clones
/// share the connection.
#[derive(Clone)]
pub struct HaConnection {
    inner: Inner,
    db: i64,
}

impl HaConnection {
    /// Connects now (a plain URL through a [`ConnectionManager`] with `manager`; a Sentinel URL
    /// by resolving the master with `timeout` per step).
    ///
    /// # Errors
    /// Unreachable now, or Sentinel resolution failed.
    pub async fn connect(
        target: &RedisTarget,
        manager: ConnectionManagerConfig,
        timeout: Duration,
    ) -> RedisResult<HaConnection> {
        match target {
            RedisTarget::Direct(client) => {
                let db = client.get_connection_info().redis_settings().db();
                let m = ConnectionManager::new_with_config(client.clone(), manager).await?;
                Ok(HaConnection {
                    inner: Inner::Direct(m),
                    db,
                })
            }
            RedisTarget::Sentinel(spec) => {
                let s = Arc::new(SentinelConn {
                    spec: spec.clone(),
                    timeout,
                    cur: tokio::sync::Mutex::new((0, None)),
                });
                s.get().await?;
                Ok(HaConnection {
                    inner: Inner::Sentinel(s),
                    db: spec.db,
                })
            }
        }
    }

    /// How the control plane opens its long-lived connections (the command bus, the shared SLO
    /// counters, the shared failure stream): [`HaConnection::connect`] with `op_timeout` to
    /// connect and per answer, reconnects backing off 20–250 ms with two retries, and the whole
    /// connect bounded by 4 × `op_timeout`.
    ///
    /// # Errors
    /// What [`HaConnection::connect`] returns, or [`BoundedConnectError::Timeout`].
    pub async fn connect_bounded(
        target: &RedisTarget,
        op_timeout: Duration,
    ) -> Result<HaConnection, BoundedConnectError> {
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(op_timeout))
            .set_response_timeout(Some(op_timeout))
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(250))
            .set_number_of_retries(2);
        let bound = op_timeout * 4;
        match tokio::time::timeout(bound, HaConnection::connect(target, cfg, op_timeout)).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(BoundedConnectError::Timeout(bound)),
        }
    }

    pub fn is_sentinel(&self) -> bool {
        matches!(self.inner, Inner::Sentinel(_))
    }
}

impl ConnectionLike for HaConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match &mut self.inner {
            Inner::Direct(m) => m.req_packed_command(cmd),
            Inner::Sentinel(s) => {
                let s = s.clone();
                Box::pin(async move {
                    let (g, mut c) = s.get().await?;
                    let r = c.req_packed_command(cmd).await;
                    if let Err(e) = &r {
                        s.failed(g, e).await;
                    }
                    r
                })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match &mut self.inner {
            Inner::Direct(m) => m.req_packed_commands(pipeline, offset, count),
            Inner::Sentinel(s) => {
                let s = s.clone();
                Box::pin(async move {
                    let (g, mut c) = s.get().await?;
                    let r = c.req_packed_commands(pipeline, offset, count).await;
                    if let Err(e) = &r {
                        s.failed(g, e).await;
                    }
                    r
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls_parse_with_hosts_master_db_and_credentials() {
        let s = SentinelSpec::parse(
            "redis+sentinel://app:p%40ss@10.0.0.1:26380,sentinel-b,[::1]:26381/mymaster/2",
        )
        .unwrap();
        assert_eq!(
            s.sentinels,
            vec![
                ("10.0.0.1".to_string(), 26380),
                ("sentinel-b".to_string(), SENTINEL_DEFAULT_PORT),
                ("::1".to_string(), 26381)
            ]
        );
        assert_eq!(s.master_name, "mymaster");
        assert_eq!(s.db, 2);
        assert_eq!(s.node_url("::1", 6379), "redis://app:p%40ss@[::1]:6379/2");
        assert!(!format!("{s:?}").contains("p%40ss"), "{s:?}");
        let plain = SentinelSpec::parse("redis+sentinel://h:1/m").unwrap();
        assert_eq!(
            (plain.db, plain.node_url("h", 7)),
            (0, "redis://h:7/0".into())
        );
    }

    #[test]
    fn bad_sentinel_urls_say_what_is_wrong() {
        for (url, needle) in [
            ("redis+sentinel://h:1", "master-name"),
            ("redis+sentinel:///m", "no Sentinel host"),
            ("redis+sentinel://h:0/m", "1-65535"),
            ("redis+sentinel://h:x/m", "1-65535"),
            ("redis+sentinel://h/m/x", "db"),
            ("redis+sentinel://h/m y", "master name"),
            ("redis+sentinel://h/m/1/2", "nothing may follow"),
        ] {
            let e = SentinelSpec::parse(url).unwrap_err().to_string();
            assert!(e.contains(needle), "{url}: {e}");
        }
        let e = RedisTarget::parse("rediss+sentinel://h/m").unwrap_err();
        assert!(e.to_string().contains("TLS through Sentinel"), "{e}");
        assert!(RedisTarget::parse("redis://127.0.0.1:6379").is_ok());
        assert!(
            RedisTarget::parse("redis+sentinel://a,b/m")
                .unwrap()
                .is_sentinel()
        );
    }
}
