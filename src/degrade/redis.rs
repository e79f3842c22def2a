//! Redis side of the control plane (docs/ARCHITECTURE.md §3): the leader lease with its fencing
//! epoch, the fenced atomic publisher, and the acks reader.
//!
//! Each of acquire / refresh / release / publish is one Lua script, so it is atomic and touches
//! only keys that share the cluster's hash tag.
//!
//! `url` may be `redis+sentinel://…` (brownout_protocol::redis_ha): the connection then follows
//! the master across failovers, and each publish waits (`WAIT 1`) for one replica to hold it, so
//! that a command the serving tier may already have applied survives the master's death.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use brownout_protocol::{
    Ack, AckVerifyError, BoundedConnectError, Command, HaConnection, RedisKeys, RedisTarget,
    SignedCommand,
};
use redis::{AsyncCommands, Script};
use serde::{Deserialize, Serialize};

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
/// Hands out the next override version: `INCR`, but never at or below the floor (the highest
/// this replica has seen, should Redis have lost the counter).
const OVERRIDE_VERSION: &str = r"
local v = redis.call('INCR', KEYS[1])
local floor = tonumber(ARGV[1])
if v <= floor then
  v = floor + 1
  redis.call('SET', KEYS[1], v)
end
return v
";

/// Writes the sealed override only while its version is still the counter's (a slower writer
/// with an older version does not overwrite a newer one). 1 when written.
const OVERRIDE_PUT: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1
";

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

/// The operator override as sealed in Redis: its version (from the override version counter),
/// the epoch of the leader lease the writer knew, and the override (`None`: removed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SealedOverride {
    version: u64,
    epoch: u64,
    #[serde(rename = "override")]
    r#override: Option<Override>,
}

/// What `brownout:{C}:override` holds, as read by [`RedisBus::get_override`].
#[derive(Debug, Clone, PartialEq)]
pub enum SharedOverride {
    /// Nothing valid (expired, never set, lost with Redis's data, or not sealed by us).
    Absent,
    /// Sealed by us but older than the override version: refused (a replay, or a write
    /// overtaken by a newer one).
    Stale { version: u64, current: u64 },
    /// The override in force (`None`: removed).
    Current(Option<Override>),
}

/// The control plane's connection to one cluster's keys.
#[derive(Clone)]
pub struct RedisBus {
    conn: HaConnection,
    keys: RedisKeys,
    replica_id: String,
    op_timeout: Duration,
    /// Seals the operator override (the HMAC compatibility key, or one derived from the
    /// Ed25519 private key).
    hmac_key: Vec<u8>,
    /// Verifies the serving tier's acks (per-engine keys, or the compatibility key).
    ack_keys: brownout_protocol::AckKeys,
    /// The seal and ack keys a key reload replaced, still accepted until their deadline.
    previous: Option<PreviousKeys>,
    acquire: Script,
    refresh: Script,
    release: Script,
    publish: Script,
    override_version: Script,
    override_put: Script,
    /// The highest override version this replica has written or read: anything older is
    /// refused, even if the counter in Redis were reset.
    override_seen: u64,
}

/// Keys replaced by a reload ([`RedisBus::set_keys`]): what was sealed or acked with them is
/// still read until `until`.
#[derive(Clone)]
struct PreviousKeys {
    seal: Vec<u8>,
    acks: brownout_protocol::AckKeys,
    until: std::time::Instant,
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
    /// Connects (the manager reconnects by itself afterwards). `plane_keys` seal the operator override
    /// and verify the serving tier's acks (a bare byte string: the HMAC compatibility key).
    ///
    /// # Errors
    /// A bad URL or cluster name, or Redis unreachable now.
    pub async fn connect(
        url: &str,
        cluster: &str,
        replica_id: &str,
        op_timeout: Duration,
        plane_keys: impl Into<brownout_protocol::PlaneKeys>,
    ) -> Result<RedisBus, RedisBusError> {
        let pk: brownout_protocol::PlaneKeys = plane_keys.into();
        let keys = RedisKeys::new(cluster)?;
        let target = RedisTarget::parse(url)?;
        let conn = HaConnection::connect_bounded(&target, op_timeout)
            .await
            .map_err(|e| match e {
                BoundedConnectError::Redis(e) => RedisBusError::Redis(e),
                BoundedConnectError::Timeout(d) => RedisBusError::Timeout(d),
            })?;
        Ok(RedisBus {
            conn,
            keys,
            replica_id: replica_id.to_string(),
            op_timeout,
            hmac_key: pk.seal_key,
            ack_keys: pk.acks,
            previous: None,
            acquire: Script::new(ACQUIRE),
            refresh: Script::new(REFRESH),
            release: Script::new(RELEASE),
            publish: Script::new(PUBLISH),
            override_version: Script::new(OVERRIDE_VERSION),
            override_put: Script::new(OVERRIDE_PUT),
            override_seen: 0,
        })
    }

    /// Seals and verifies with `current` from now on; what `previous` sealed (overrides) or
    /// what engines acked under its ack keys is still accepted until the deadline given with it.
    pub fn set_keys(
        &mut self,
        current: &brownout_protocol::PlaneKeys,
        previous: Option<(&brownout_protocol::PlaneKeys, std::time::Instant)>,
    ) {
        self.hmac_key = current.seal_key.clone();
        self.ack_keys = current.acks.clone();
        self.previous = previous.map(|(p, until)| PreviousKeys {
            seal: p.seal_key.clone(),
            acks: p.acks.clone(),
            until,
        });
    }

    /// The replaced keys, while their overlap lasts.
    fn previous(&self) -> Option<&PreviousKeys> {
        self.previous
            .as_ref()
            .filter(|p| std::time::Instant::now() < p.until)
    }

    /// Unseals with the current seal key, else with the replaced one during its overlap.
    fn unseal<'a>(
        &self,
        domain: &str,
        v: &'a str,
    ) -> Result<&'a str, brownout_protocol::UnsealError> {
        match brownout_protocol::unseal(&self.hmac_key, domain, v) {
            Err(e) => match self.previous() {
                Some(p) => brownout_protocol::unseal(&p.seal, domain, v).map_err(|_| e),
                None => Err(e),
            },
            ok => ok,
        }
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
        signer: impl Into<brownout_protocol::CommandSigner>,
        build: impl Fn(u64) -> Command,
    ) -> Result<PublishOutcome, RedisBusError> {
        let signer: brownout_protocol::CommandSigner = signer.into();
        let start = Instant::now();
        let mut version = next_version.max(1);
        for _ in 0..4 {
            let command = build(version);
            let signed = signer.sign(&command);
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
                    if self.conn.is_sentinel() {
                        self.wait_for_replica().await;
                    }
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

    /// `WAIT 1`: until one replica holds what this connection wrote, at most half an operation
    /// timeout. Not holding it is logged, not an error: the command is published on the master.
    async fn wait_for_replica(&mut self) {
        let ms = (self.op_timeout / 2).as_millis().max(1) as u64;
        let r: Result<i64, _> = timed(
            self.op_timeout,
            redis::cmd("WAIT")
                .arg(1)
                .arg(ms)
                .query_async(&mut self.conn),
        )
        .await;
        match r {
            Ok(n) if n >= 1 => {}
            Ok(_) => tracing::warn!(
                cluster = %self.keys.cluster(),
                "degrade: no replica acknowledged the published command; it is lost if the master dies now"
            ),
            Err(e) => tracing::warn!(error = %e, "degrade: WAIT for a replica failed"),
        }
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
                let parsed = match Ack::parse_signed(&v, &self.ack_keys.key_for(&inst), &inst) {
                    Err(AckVerifyError::Signature(e)) => match self.previous() {
                        Some(p) => Ack::parse_signed(&v, &p.acks.key_for(&inst), &inst)
                            .map_err(|_| AckVerifyError::Signature(e)),
                        None => Err(AckVerifyError::Signature(e)),
                    },
                    other => other,
                };
                let e = match parsed {
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
    /// write access to Redis alone cannot pin a tier) together with a fresh version from
    /// `brownout:{C}:override_version` and the writer's leader epoch. `None` writes a tombstone
    /// (`null`, kept a week) so that "removed" and "lost with Redis's data" can be told apart;
    /// it takes a version too, so a sealed override captured before it and written back later is
    /// older than the counter and refused. Returns the version written, or `None` when a newer
    /// version was written meanwhile by another replica (which then wins).
    ///
    /// # Errors
    /// Redis errors and timeouts.
    pub async fn put_override(
        &mut self,
        o: Option<&Override>,
        now_ms: u64,
        epoch: u64,
    ) -> Result<Option<u64>, RedisBusError> {
        let (o, px) = match o {
            Some(o) if o.until_ms > now_ms => (Some(o), o.until_ms - now_ms),
            _ => (None, 7 * 24 * 3600 * 1000),
        };
        let mut inv = self.override_version.prepare_invoke();
        inv.key(self.keys.override_version())
            .arg(self.override_seen);
        let version: u64 = timed(self.op_timeout, inv.invoke_async(&mut self.conn)).await?;
        let json = serde_json::to_string(&SealedOverride {
            version,
            epoch,
            r#override: o.cloned(),
        })
        .expect("an Override always serialises");
        let sealed = brownout_protocol::seal(&self.hmac_key, &self.override_domain(), &json);
        let mut inv = self.override_put.prepare_invoke();
        inv.key(self.keys.override_version())
            .key(self.keys.operator_override())
            .arg(version)
            .arg(sealed)
            .arg(px);
        let written: i64 = timed(self.op_timeout, inv.invoke_async(&mut self.conn)).await?;
        self.override_seen = self.override_seen.max(version);
        Ok((written == 1).then_some(version))
    }

    /// The shared operator override. Values that are malformed, unsigned or not sealed with the
    /// command key read as [`SharedOverride::Absent`] (and are logged), so a replica with an
    /// active override of its own writes it back over them; values older than the version
    /// counter (or than a version this replica has seen) are [`SharedOverride::Stale`] and
    /// change nothing: a replayed sealed value never takes effect.
    ///
    /// # Errors
    /// Redis errors and timeouts.
    pub async fn get_override(&mut self) -> Result<SharedOverride, RedisBusError> {
        let (v, counter): (Option<String>, Option<u64>) = timed(
            self.op_timeout,
            redis::cmd("MGET")
                .arg(self.keys.operator_override())
                .arg(self.keys.override_version())
                .query_async(&mut self.conn),
        )
        .await?;
        let Some(v) = v else {
            return Ok(SharedOverride::Absent);
        };
        let key = self.keys.operator_override();
        let sealed = match self.unseal(&self.override_domain(), &v) {
            Ok(json) => match serde_json::from_str::<SealedOverride>(json) {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, %key, "degrade: ignoring an operator override without a version");
                    return Ok(SharedOverride::Absent);
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, %key, "degrade: ignoring an operator override that is not sealed with the command key");
                return Ok(SharedOverride::Absent);
            }
        };
        let current = counter.unwrap_or(0).max(self.override_seen);
        if sealed.version < current {
            tracing::warn!(
                version = sealed.version,
                current,
                %key,
                "degrade: refusing an operator override older than the override version (replayed?)"
            );
            return Ok(SharedOverride::Stale {
                version: sealed.version,
                current,
            });
        }
        self.override_seen = sealed.version;
        Ok(SharedOverride::Current(sealed.r#override))
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
        match self.unseal(&self.instance_overrides_domain(), &v) {
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
