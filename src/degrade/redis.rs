//! Redis side of the control plane (docs/ARCHITECTURE.md §3): the leader lease with its fencing
//! epoch, the fenced atomic publisher, and the acks reader.
//!
//! Each of acquire / refresh / release / publish is one Lua script, so it is atomic and touches
//! only keys that share the cluster's hash tag.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use brownout_protocol::{Ack, AckVerifyError, Command, RedisKeys, SignedCommand};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncCommands, Script};

use super::controller::{InstanceOverride, Override};

/// Why a Redis operation of the control plane failed.
#[derive(Debug, thiserror::Error)]
pub enum RedisBusError {
    #[error("invalid cluster name: {0}")]
    Cluster(#[from] brownout_protocol::ClusterNameError),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("publish kept conflicting on the version counter")]
    VersionConflict,
}

/// `SET leader NX PX` with an epoch from `INCR epoch`, never below any epoch seen in the state,
/// the caller's memory, or the caller's clock in unix seconds: so even a Redis that lost all its
/// data and a freshly started control plane still hand out an epoch above the one serving tiers
/// hold (as long as clocks are within a few seconds and failovers are not several per second).
const ACQUIRE: &str = r"
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local cur = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local st = tonumber(redis.call('HGET', KEYS[3], 'epoch') or '0') or 0
local floor = math.max(cur, st, tonumber(ARGV[3]) or 0, tonumber(ARGV[4]) or 0)
redis.call('SET', KEYS[2], floor)
local e = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. e, 'PX', ARGV[2])
return e
";

const REFRESH: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
";

const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
";

/// KEYS: state, log, leader, version counter. ARGV: epoch, version, json, sig, leader value,
/// notify channel. Returns `{code, n}`: `{1, version}` published; `{-1, 0}` not the leader;
/// `{-2, stored_epoch}` fenced by a higher epoch; `{-3, floor}` version must exceed `floor`.
const PUBLISH: &str = r"
if redis.call('GET', KEYS[3]) ~= ARGV[5] then return {-1, 0} end
local se = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '0') or 0
local sv = tonumber(redis.call('HGET', KEYS[1], 'version') or '0') or 0
local vc = tonumber(redis.call('GET', KEYS[4]) or '0') or 0
local e = tonumber(ARGV[1])
local v = tonumber(ARGV[2])
if e < se then return {-2, se} end
local floor = math.max(sv, vc)
if v <= floor then return {-3, floor} end
redis.call('SET', KEYS[4], v)
redis.call('HSET', KEYS[1], 'epoch', ARGV[1], 'version', ARGV[2], 'command', ARGV[3], 'sig', ARGV[4])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 10000, '*', 'epoch', ARGV[1], 'version', ARGV[2], 'command', ARGV[3], 'sig', ARGV[4])
redis.call('PUBLISH', ARGV[6], ARGV[1] .. ':' .. ARGV[2])
return {1, v}
";

/// What a publish attempt did (returned once per publish: the size difference is irrelevant).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum PublishOutcome {
    Published {
        command: Command,
        signed: SignedCommand,
        elapsed: Duration,
    },
    /// The lease is not (or no longer) ours.
    NotLeader,
    /// A higher epoch has published: this replica is a stale leader.
    Fenced { stored_epoch: u64 },
}

/// One acks-hash entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckEntry {
    Ok(Ack),
    Malformed(String),
    /// Unsigned, or not signed with the command key for this instance (forged or copied).
    Unverified {
        raw: String,
        reason: String,
    },
}

/// The control plane's connection to one cluster's keys.
#[derive(Clone)]
pub struct RedisBus {
    conn: ConnectionManager,
    keys: RedisKeys,
    replica_id: String,
    op_timeout: Duration,
    /// The command key: also seals the operator override and verifies acks.
    hmac_key: Vec<u8>,
    acquire: Script,
    refresh: Script,
    release: Script,
    publish: Script,
}

impl std::fmt::Debug for RedisBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBus")
            .field("cluster", &self.keys.cluster())
            .field("replica_id", &self.replica_id)
            .finish()
    }
}

async fn timed<T>(
    d: Duration,
    fut: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, RedisBusError> {
    match tokio::time::timeout(d, fut).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(RedisBusError::Timeout(d)),
    }
}

impl RedisBus {
    /// Connects (the manager reconnects by itself afterwards). `hmac_key` is the command key;
    /// it also seals the operator override and verifies the serving tier's acks.
    ///
    /// # Errors
    /// A bad URL or cluster name, or Redis unreachable now.
    pub async fn connect(
        url: &str,
        cluster: &str,
        replica_id: &str,
        op_timeout: Duration,
        hmac_key: &[u8],
    ) -> Result<RedisBus, RedisBusError> {
        let keys = RedisKeys::new(cluster)?;
        let client = brownout_protocol::redis_client(url)?;
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(op_timeout))
            .set_response_timeout(Some(op_timeout))
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(250))
            .set_number_of_retries(2);
        let conn = timed(
            op_timeout * 4,
            ConnectionManager::new_with_config(client, cfg),
        )
        .await?;
        Ok(RedisBus {
            conn,
            keys,
            replica_id: replica_id.to_string(),
            op_timeout,
            hmac_key: hmac_key.to_vec(),
            acquire: Script::new(ACQUIRE),
            refresh: Script::new(REFRESH),
            release: Script::new(RELEASE),
            publish: Script::new(PUBLISH),
        })
    }

    pub fn keys(&self) -> &RedisKeys {
        &self.keys
    }

    pub fn replica_id(&self) -> &str {
        &self.replica_id
    }

    fn leader_value(&self, epoch: u64) -> String {
        format!("{}:{epoch}", self.replica_id)
    }

    /// Tries to take the lease. `Some(epoch)` when this replica is now the leader.
    ///
    /// # Errors
    /// Redis errors and timeouts.
    pub async fn try_acquire(
        &mut self,
        lease_ms: u64,
        min_epoch: u64,
    ) -> Result<Option<u64>, RedisBusError> {
        let mut inv = self.acquire.prepare_invoke();
        inv.key(self.keys.leader())
            .key(self.keys.epoch_counter())
            .key(self.keys.state())
            .arg(&self.replica_id)
            .arg(lease_ms)
            .arg(min_epoch)
            .arg(brownout_protocol::now_ms() / 1000);
        let e: u64 = timed(self.op_timeout, inv.invoke_async(&mut self.conn)).await?;
        Ok((e > 0).then_some(e))
    }

    /// Extends the lease if it is still ours.
    ///
    /// # Errors
    /// Redis errors and timeouts.
    pub async fn refresh(&mut self, epoch: u64, lease_ms: u64) -> Result<bool, RedisBusError> {
        let mut inv = self.refresh.prepare_invoke();
        inv.key(self.keys.leader())
            .arg(self.leader_value(epoch))
            .arg(lease_ms);
        let r: i64 = timed(self.op_timeout, inv.invoke_async(&mut self.conn)).await?;
        Ok(r == 1)
    }

    /// Gives the lease up (graceful shutdown) so another replica takes over at once.
    ///
    /// # Errors
    /// Redis errors and timeouts.
    pub async fn release(&mut self, epoch: u64) -> Result<bool, RedisBusError> {
        let mut inv = self.release.prepare_invoke();
        inv.key(self.keys.leader()).arg(self.leader_value(epoch));
        let r: i64 = timed(self.op_timeout, inv.invoke_async(&mut self.conn)).await?;
        Ok(r == 1)
    }

    /// Who holds the lease (`"<replica>:<epoch>"`), if anyone.
    ///
    /// # Errors
    /// Redis errors and timeouts.
    pub async fn leader(&mut self) -> Result<Option<String>, RedisBusError> {
        let k = self.keys.leader();
        timed(self.op_timeout, self.conn.get(k)).await
    }

    /// The command stored in the state hash (signed), if any.
    ///
    /// # Errors
    /// Redis errors and timeouts.
    pub async fn stored(&mut self) -> Result<Option<SignedCommand>, RedisBusError> {
        let k = self.keys.state();
        let m: BTreeMap<String, String> = timed(self.op_timeout, self.conn.hgetall(k)).await?;
        Ok(match (m.get("command"), m.get("sig")) {
            (Some(json), Some(sig)) => Some(SignedCommand {
                json: json.clone(),
                sig: sig.clone(),
            }),
            _ => None,
        })
    }

    /// Publishes atomically: state, stream, notify. `build(version)` makes the command for the
    /// version chosen; `next_version` is the caller's guess (retried upward on conflict).
    ///
    /// # Errors
    /// Redis errors, timeouts, or repeated version conflicts.
    pub async fn publish(
        &mut self,
        epoch: u64,
        next_version: u64,
        hmac_key: &[u8],
        build: impl Fn(u64) -> Command,
    ) -> Result<PublishOutcome, RedisBusError> {
        let start = Instant::now();
        let mut version = next_version.max(1);
        for _ in 0..4 {
            let command = build(version);
            let signed = SignedCommand::sign(&command, hmac_key);
            let mut inv = self.publish.prepare_invoke();
            inv.key(self.keys.state())
                .key(self.keys.log())
                .key(self.keys.leader())
                .key(self.keys.version_counter())
                .arg(epoch)
                .arg(version)
                .arg(&signed.json)
                .arg(&signed.sig)
                .arg(self.leader_value(epoch))
                .arg(self.keys.notify());
            let (code, n): (i64, u64) =
                timed(self.op_timeout, inv.invoke_async(&mut self.conn)).await?;
            match code {
                1 => {
                    return Ok(PublishOutcome::Published {
                        command,
                        signed,
                        elapsed: start.elapsed(),
                    });
                }
                -1 => return Ok(PublishOutcome::NotLeader),
                -2 => return Ok(PublishOutcome::Fenced { stored_epoch: n }),
                _ => version = n + 1,
            }
        }
        Err(RedisBusError::VersionConflict)
    }

    /// Every instance's ack, each verified against the command key and its instance id.
    ///
    /// # Errors
    /// Redis errors and timeouts.
    pub async fn acks(&mut self) -> Result<BTreeMap<String, AckEntry>, RedisBusError> {
        let k = self.keys.acks();
        let m: BTreeMap<String, String> = timed(self.op_timeout, self.conn.hgetall(k)).await?;
        Ok(m.into_iter()
            .map(|(inst, v)| {
                let e = match Ack::parse_signed(&v, &self.hmac_key, &inst) {
                    Ok(a) => AckEntry::Ok(a),
                    Err(AckVerifyError::Malformed(_)) => AckEntry::Malformed(v),
                    Err(AckVerifyError::Signature(e)) => AckEntry::Unverified {
                        raw: v,
                        reason: e.to_string(),
                    },
                };
                (inst, e)
            })
            .collect())
    }

    fn override_domain(&self) -> String {
        format!("brownout-override:{}", self.keys.cluster())
    }

    /// Stores the operator override for every replica, sealed with the command key (so that
    /// write access to Redis alone cannot pin a tier). `None` writes a tombstone (`null`, kept a
    /// week) so that "removed" and "lost with Redis's data" can be told apart.
    ///
    /// # Errors
    /// Redis errors and timeouts.
    pub async fn put_override(
        &mut self,
        o: Option<&Override>,
        now_ms: u64,
    ) -> Result<(), RedisBusError> {
        let k = self.keys.operator_override();
        let (json, px) = match o {
            Some(o) if o.until_ms > now_ms => (
                serde_json::to_string(o).expect("an Override always serialises"),
                o.until_ms - now_ms,
            ),
            _ => ("null".to_string(), 7 * 24 * 3600 * 1000),
        };
        let sealed = brownout_protocol::seal(&self.hmac_key, &self.override_domain(), &json);
        let _: () = timed(self.op_timeout, self.conn.pset_ex(k, sealed, px)).await?;
        Ok(())
    }

    /// The shared operator override: `None` when the key is absent (unknown: e.g. Redis lost its
    /// data), `Some(None)` when removed, `Some(Some(o))` when pinned. Values that are malformed,
    /// unsigned or not sealed with the command key read as absent (and are logged), so a replica
    /// with an active override of its own writes it back over them.
    ///
    /// # Errors
    /// Redis errors and timeouts.
    pub async fn get_override(&mut self) -> Result<Option<Option<Override>>, RedisBusError> {
        let k = self.keys.operator_override();
        let v: Option<String> = timed(self.op_timeout, self.conn.get(k)).await?;
        let Some(v) = v else { return Ok(None) };
        match brownout_protocol::unseal(&self.hmac_key, &self.override_domain(), &v) {
            Ok(json) => Ok(serde_json::from_str::<Option<Override>>(json).ok()),
            Err(e) => {
                tracing::warn!(error = %e, key = %self.keys.operator_override(), "degrade: ignoring an operator override that is not sealed with the command key");
                Ok(None)
            }
        }
    }

    fn instance_overrides_domain(&self) -> String {
        format!("brownout-instance-overrides:{}", self.keys.cluster())
    }

    /// Stores the operator's per-instance actions for every replica (sealed like the override;
    /// expired entries dropped). The key lives until the last action ends (an empty map: a week,
    /// so that "none" and "lost with Redis's data" can be told apart).
    ///
    /// # Errors
    /// Redis errors and timeouts.
    pub async fn put_instance_overrides(
        &mut self,
        map: &BTreeMap<String, InstanceOverride>,
        now_ms: u64,
    ) -> Result<(), RedisBusError> {
        let k = self.keys.instance_overrides();
        let live: BTreeMap<&String, &InstanceOverride> =
            map.iter().filter(|(_, o)| o.until_ms > now_ms).collect();
        let px = live
            .values()
            .map(|o| o.until_ms - now_ms)
            .max()
            .unwrap_or(7 * 24 * 3600 * 1000);
        let json = serde_json::to_string(&live).expect("instance overrides always serialise");
        let sealed =
            brownout_protocol::seal(&self.hmac_key, &self.instance_overrides_domain(), &json);
        let _: () = timed(self.op_timeout, self.conn.pset_ex(k, sealed, px)).await?;
        Ok(())
    }

    /// The shared per-instance actions: `None` when absent (or not sealed with the command key),
    /// else the map (possibly empty).
    ///
    /// # Errors
    /// Redis errors and timeouts.
    pub async fn get_instance_overrides(
        &mut self,
    ) -> Result<Option<BTreeMap<String, InstanceOverride>>, RedisBusError> {
        let k = self.keys.instance_overrides();
        let v: Option<String> = timed(self.op_timeout, self.conn.get(k)).await?;
        let Some(v) = v else { return Ok(None) };
        match brownout_protocol::unseal(&self.hmac_key, &self.instance_overrides_domain(), &v) {
            Ok(json) => Ok(serde_json::from_str(json).ok()),
            Err(e) => {
                tracing::warn!(error = %e, key = %self.keys.instance_overrides(), "degrade: ignoring instance actions not sealed with the command key");
                Ok(None)
            }
        }
    }

    /// Length of the command log stream (audit).
    ///
    /// # Errors
    /// Redis errors and timeouts.
    pub async fn log_len(&mut self) -> Result<u64, RedisBusError> {
        let k = self.keys.log();
        timed(self.op_timeout, self.conn.xlen(k)).await
    }
}
