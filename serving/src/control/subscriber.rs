//! The Redis subscriber (docs/ARCHITECTURE.md §3, docs/PROTOCOL.md).
//!
//! ```text
//!  connect ─> SUBSCRIBE notify ─> HGETALL state ─> verify, apply if newer, ack
//!     ^            │ "<epoch>:<version>" newer than ours (any gap) ─> HGETALL state ─> …
//!     │            │ every `anti_entropy`                           ─> HGETALL state ─> …
//!     │            │ every `lease_check`: lease expired?            ─> step down one tier
//!     └─ backoff <─┘ connection lost (lease checks keep running while disconnected)
//! ```
//!
//! Subscribing *before* reading the state means no publish can fall between the read and the
//! subscription. Pub/sub only says "something is new"; the state hash is the truth.
//!
//! With a `redis+sentinel://` URL each session starts by resolving the master through Sentinel,
//! and every anti-entropy round also checks that the node is still a master (`ROLE`), so a
//! demoted master is left within one round. Each new session first writes this instance's last
//! ack again: an ack the old master took but never replicated is not lost with it.

use std::collections::BTreeMap;
use std::time::Duration;

use brownout_protocol::{
    Ack, EngineKeys, RedisKeys, RedisTarget, SignedCommand, now_ms, parse_notify,
};
use futures::StreamExt;
use redis::AsyncCommands;
use tokio::task::JoinHandle;

use super::{ControlHandle, Receipt, receive};

/// Where and how to subscribe.
#[derive(Debug, Clone)]
pub struct SubscriberConfig {
    /// `REDIS_URL`.
    pub redis_url: String,
    /// `BROWNOUT_CLUSTER` (default `default`); must match the handle's cluster.
    pub cluster: String,
    /// The public keys commands are verified with and this instance's ack key (or, in the
    /// HMAC compatibility mode, the shared `BROWNOUT_COMMAND_KEY`).
    pub keys: EngineKeys,
    /// This instance's id in the acks hash.
    pub instance_id: String,
    /// Re-read the state at least this often even with no notification.
    pub anti_entropy: Duration,
    /// How often to check the command lease.
    pub lease_check: Duration,
    /// Per Redis operation.
    pub op_timeout: Duration,
    /// First reconnect delay (doubles up to `reconnect_max`).
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
}

/// A missing or invalid setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubscriberConfigError {
    #[error(
        "no command public key: set BROWNOUT_COMMAND_PUBKEY or BROWNOUT_COMMAND_PUBKEY_FILE (the control plane writes its key to <data dir>/command-signing.pub), or BROWNOUT_COMMAND_SIGNATURE=hmac with BROWNOUT_COMMAND_KEY (compatibility mode), when REDIS_URL is set"
    )]
    MissingKey,
    #[error("command keys: {0}")]
    Keys(String),
    #[error("BROWNOUT_CLUSTER is invalid: {0}")]
    Cluster(String),
    #[error("REDIS_URL {0:?} is not a redis:// URL: {1}")]
    Url(String, String),
}

impl SubscriberConfig {
    /// Defaults: anti-entropy 2 s, lease check 250 ms, 1 s per operation, reconnect 50–250 ms.
    pub fn new(
        redis_url: &str,
        cluster: &str,
        keys: impl Into<EngineKeys>,
        instance_id: &str,
    ) -> SubscriberConfig {
        SubscriberConfig {
            redis_url: redis_url.to_string(),
            cluster: cluster.to_string(),
            keys: keys.into(),
            instance_id: instance_id.to_string(),
            anti_entropy: Duration::from_secs(2),
            lease_check: Duration::from_millis(250),
            op_timeout: Duration::from_secs(1),
            reconnect_min: Duration::from_millis(50),
            reconnect_max: Duration::from_millis(250),
        }
    }

    /// From explicit values (flags) falling back to the environment: `REDIS_URL`,
    /// `BROWNOUT_CLUSTER` (default `default`), and the command keys of
    /// [`EngineKeys::from_env`] (`BROWNOUT_COMMAND_PUBKEY`/`_FILE` and `BROWNOUT_ACK_KEY`/`_FILE`,
    /// or `BROWNOUT_COMMAND_SIGNATURE=hmac` with `BROWNOUT_COMMAND_KEY`). `Ok(None)` when no Redis
    /// URL is given at all (the serving tier then runs without a subscriber).
    ///
    /// # Errors
    /// [`SubscriberConfigError`] for a URL that does not parse, a bad cluster name, or no key.
    pub fn from_env(
        redis_url: Option<String>,
        cluster: Option<String>,
        key: Option<String>,
        instance_id: &str,
    ) -> Result<Option<SubscriberConfig>, SubscriberConfigError> {
        let dir = brownout_protocol::command_keys::default_data_dir();
        SubscriberConfig::from_env_in(redis_url, cluster, key, instance_id, &dir)
    }

    /// [`SubscriberConfig::from_env`] with the data directory (where the control plane's public
    /// key and ack master are looked for when none is configured) given instead of
    /// `BROWNOUT_DATA_DIR`.
    ///
    /// # Errors
    /// As [`SubscriberConfig::from_env`].
    pub fn from_env_in(
        redis_url: Option<String>,
        cluster: Option<String>,
        key: Option<String>,
        instance_id: &str,
        data_dir: &std::path::Path,
    ) -> Result<Option<SubscriberConfig>, SubscriberConfigError> {
        let Some(url) = redis_url
            .or_else(|| std::env::var("REDIS_URL").ok())
            .filter(|u| !u.is_empty())
        else {
            return Ok(None);
        };
        let cluster = cluster
            .filter(|c| !c.is_empty())
            .or_else(brownout_protocol::cluster_from_env)
            .unwrap_or_else(|| brownout_protocol::DEFAULT_CLUSTER.into());
        RedisKeys::new(&cluster).map_err(|e| SubscriberConfigError::Cluster(e.to_string()))?;
        RedisTarget::parse(url.as_str())
            .map_err(|e| SubscriberConfigError::Url(url.clone(), e.to_string()))?;
        let key = key
            .or_else(|| std::env::var("BROWNOUT_COMMAND_KEY").ok())
            .filter(|k| !k.is_empty());
        let keys = EngineKeys::from_env_in(instance_id, key.as_deref(), data_dir)
            .map_err(|e| SubscriberConfigError::Keys(e.to_string()))?
            .ok_or(SubscriberConfigError::MissingKey)?;
        Ok(Some(SubscriberConfig::new(
            &url,
            &cluster,
            keys,
            instance_id,
        )))
    }
}

#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis did not answer in time")]
    Timeout,
    #[error("pub/sub connection closed")]
    Closed,
    #[error("the node is no longer the master (role {0:?})")]
    Demoted(String),
}

async fn timed<T>(
    d: Duration,
    fut: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, SessionError> {
    match tokio::time::timeout(d, fut).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(SessionError::Timeout),
    }
}

struct Session<'a> {
    handle: &'a ControlHandle,
    cfg: &'a SubscriberConfig,
    keys: &'a RedisKeys,
    /// The last NACK written, so a refused state re-read by anti-entropy is NACKed once.
    last_nack: Option<(u64, u64, &'static str)>,
    /// The last ack or NACK written (signed), kept across sessions and written again at the
    /// start of each: a failover may lose a write the old master had not replicated.
    last_ack: &'a mut Option<String>,
}

impl Session<'_> {
    /// Reads the state hash; verifies, applies if newer, acks or NACKs.
    async fn resync(
        &mut self,
        conn: &mut redis::aio::MultiplexedConnection,
    ) -> Result<(), SessionError> {
        let m: BTreeMap<String, String> =
            timed(self.cfg.op_timeout, conn.hgetall(self.keys.state())).await?;
        let (Some(json), Some(sig)) = (m.get("command"), m.get("sig")) else {
            return Ok(());
        };
        let signed = SignedCommand {
            json: json.clone(),
            sig: sig.clone(),
        };
        let receipt = receive(self.handle, &self.cfg.keys.verifier, &signed, now_ms());
        self.ack(conn, receipt).await
    }

    async fn ack(
        &mut self,
        conn: &mut redis::aio::MultiplexedConnection,
        r: Receipt,
    ) -> Result<(), SessionError> {
        let ack = match r {
            Receipt::Unchanged => return Ok(()),
            Receipt::Applied {
                epoch,
                version,
                applied_at_ms,
                entry,
            } => {
                self.last_nack = None;
                Ack::Applied {
                    epoch,
                    version,
                    applied_at_ms,
                    entry,
                }
            }
            Receipt::Refused {
                reason,
                epoch,
                version,
                ..
            } => {
                if self.last_nack == Some((epoch, version, reason)) {
                    return Ok(());
                }
                self.last_nack = Some((epoch, version, reason));
                Ack::Refused {
                    epoch,
                    version,
                    at_ms: now_ms(),
                    reason: reason.to_string(),
                }
            }
        };
        let signed = ack.to_signed(&self.cfg.keys.current_ack_key(), &self.cfg.instance_id);
        *self.last_ack = Some(signed);
        self.write_last_ack(conn).await
    }

    async fn write_last_ack(
        &mut self,
        conn: &mut redis::aio::MultiplexedConnection,
    ) -> Result<(), SessionError> {
        let Some(signed) = self.last_ack.clone() else {
            return Ok(());
        };
        let _: i64 = timed(
            self.cfg.op_timeout,
            conn.hset(self.keys.acks(), &self.cfg.instance_id, signed),
        )
        .await?;
        Ok(())
    }

    /// Fails with [`SessionError::Demoted`] when the node is no longer a master.
    async fn check_master(
        &self,
        conn: &mut redis::aio::MultiplexedConnection,
    ) -> Result<(), SessionError> {
        let role: Vec<redis::Value> =
            timed(self.cfg.op_timeout, redis::cmd("ROLE").query_async(conn)).await?;
        let role: String = role
            .into_iter()
            .next()
            .and_then(|v| redis::from_redis_value(v).ok())
            .unwrap_or_default();
        if role == "master" {
            Ok(())
        } else {
            Err(SessionError::Demoted(role))
        }
    }

    async fn run(&mut self, target: &RedisTarget) -> Result<(), SessionError> {
        let t = self.cfg.op_timeout;
        let client = &target.client(t).await?;
        let mut pubsub = match tokio::time::timeout(t, client.get_async_pubsub()).await {
            Ok(r) => r?,
            Err(_) => return Err(SessionError::Timeout),
        };
        timed(t, pubsub.subscribe(self.keys.notify())).await?;
        let mut conn = timed(t, client.get_multiplexed_async_connection()).await?;
        tracing::info!(cluster = %self.keys.cluster(), instance = %self.cfg.instance_id, "degradation subscriber connected");
        self.write_last_ack(&mut conn).await?;
        self.resync(&mut conn).await?;
        let mut messages = pubsub.on_message();
        let mut anti_entropy = tokio::time::interval(self.cfg.anti_entropy);
        anti_entropy.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        anti_entropy.tick().await;
        let mut lease = tokio::time::interval(self.cfg.lease_check);
        lease.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                msg = messages.next() => {
                    let Some(msg) = msg else { return Err(SessionError::Closed) };
                    let payload: String = msg.get_payload().unwrap_or_default();
                    let newer = match parse_notify(&payload) {
                        Some(ev) => ev > self.handle.current().command.order_key(),
                        None => true,
                    };
                    if newer {
                        self.resync(&mut conn).await?;
                    }
                }
                _ = anti_entropy.tick() => {
                    if target.is_sentinel() {
                        self.check_master(&mut conn).await?;
                    }
                    self.resync(&mut conn).await?;
                }
                _ = lease.tick() => { self.handle.step_down_if_expired(now_ms()); }
            }
        }
    }
}

/// Starts the subscriber task. It runs until aborted, reconnecting forever; while Redis is
/// unreachable it keeps enforcing the command lease (stepping down one tier per lease period).
pub async fn spawn_subscriber(handle: ControlHandle, cfg: SubscriberConfig) -> JoinHandle<()> {
    handle.bind_instance(&cfg.instance_id);
    tokio::spawn(async move {
        let keys = match RedisKeys::new(&cfg.cluster) {
            Ok(k) => k,
            Err(e) => {
                tracing::error!(error = %e, "degradation subscriber not started");
                return;
            }
        };
        if cfg.cluster != handle.cluster() {
            tracing::error!(
                subscriber = %cfg.cluster, handle = %handle.cluster(),
                "degradation subscriber not started: cluster differs from the handle's"
            );
            return;
        }
        let target = match RedisTarget::parse(cfg.redis_url.as_str()) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "degradation subscriber not started: bad REDIS_URL");
                return;
            }
        };
        let mut delay = cfg.reconnect_min;
        let mut last_ack = None;
        loop {
            let mut s = Session {
                handle: &handle,
                cfg: &cfg,
                keys: &keys,
                last_nack: None,
                last_ack: &mut last_ack,
            };
            let started = tokio::time::Instant::now();
            if let Err(e) = s.run(&target).await {
                tracing::warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "degradation subscriber disconnected");
            }
            if started.elapsed() > cfg.reconnect_max * 4 {
                delay = cfg.reconnect_min;
            }
            // Keep enforcing the lease while waiting to reconnect.
            let until = tokio::time::Instant::now() + delay;
            while tokio::time::Instant::now() < until {
                handle.step_down_if_expired(now_ms());
                tokio::time::sleep(cfg.lease_check.min(until - tokio::time::Instant::now())).await;
            }
            delay = (delay * 2).min(cfg.reconnect_max);
        }
    })
}
