//! The controller loop ([`run_controller`]): evaluates the policy every interval, records the
//! decision, and publishes it through the transport: the in-process bus ([`InProcPublisher`]),
//! or Redis under the leader lease ([`Publisher`]: the connection, the lease epoch, the versions
//! and the last publish).

use brownout_protocol::now_ms;

use super::bus::InProcBus;
use super::command::{LastPublish, build_command, due};
use super::controller::{Controller, Decision};
use super::handle::{DegradeConfig, DegradeHandle};
use super::redis::{AckEntry, PublishOutcome, RedisBus, RedisBusError, SharedOverride};

async fn b_override(p: &mut Publisher) -> Result<SharedOverride, RedisBusError> {
    match p.bus.as_mut() {
        Some(b) => b.get_override().await,
        None => Ok(SharedOverride::Absent),
    }
}
use crate::agents::CommandPart;

/// How commands leave the controller.
#[derive(Debug, Clone)]
pub enum Transport {
    /// Real Redis at this URL (leader lease, fenced publish, acks hash).
    Redis { url: String },
    /// The in-process bus of `brownout-demo`.
    InProc(InProcBus),
}

/// Runs the controller until `shutdown` resolves: evaluates every policy interval, records
/// decisions, and (unless dry-run) publishes through `transport` while holding the lease. On
/// the way out it releases the lease it holds.
///
/// Redis being down is not an error: the task retries every interval and republishes the
/// decision in force as soon as Redis answers (with a new epoch if the lease was lost).
///
/// # Errors
/// Only when the cluster name is invalid for Redis keys.
pub async fn run_controller(
    handle: DegradeHandle,
    transport: Transport,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RedisBusError> {
    let cfg = handle.config().clone();
    let mut key_reloads = handle.key_reloads();
    brownout_protocol::RedisKeys::new(&cfg.cluster)?;
    let mut controller = Controller::new(cfg.policy.clone());
    let mut tick = tokio::time::interval(cfg.policy.evaluate_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);

    let mut inproc = InProcPublisher::default();
    let mut redis = Publisher::default();
    // Only a Redis transport outside dry run shares the override: elsewhere a change is
    // "shared" as soon as it is made.
    let sharing = matches!(transport, Transport::Redis { .. }) && !cfg.policy.dry_run;
    handle.set_override_sharing(sharing);
    let wake = handle.override_wake();
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tick.tick() => {}
            () = wake.notified(), if sharing => {
                // An operator changed the override: write it now, not at the next tick, so
                // that the API answers only once it is in Redis.
                if let Transport::Redis { url } = &transport
                    && redis.connect(url, &cfg).await
                    && let Err(e) = redis.share_override(&handle, now_ms()).await
                {
                    tracing::warn!(error = %e, "degrade: sharing the operator override failed; retrying next interval");
                }
                continue;
            }
            // An operator instance action: decide and publish now, not at the next interval.
            () = handle.woken() => {}
            Ok(()) = key_reloads.changed() => {
                let reloaded = key_reloads.borrow_and_update().clone();
                if let Some((keys, overlap)) = reloaded {
                    redis.rotate_keys(&cfg.keys, keys, overlap);
                }
                continue;
            }
        }
        let now = now_ms();
        let mut decision = controller.step(&handle.inputs(now));
        handle.record(&decision);
        let agents = handle
            .agent_guards()
            .map(|g| g.command_part(now))
            .unwrap_or_default();
        if cfg.policy.dry_run {
            continue;
        }
        match &transport {
            Transport::InProc(bus) => inproc.round(bus, &handle, &decision, &agents, now),
            Transport::Redis { url } => {
                if !redis.connect(url, &cfg).await {
                    continue;
                }
                if let Err(e) = redis
                    .round(&handle, &mut controller, &mut decision, &agents, now)
                    .await
                {
                    tracing::warn!(error = %e, "degrade: redis round failed; retrying next interval");
                }
                handle.set_leader(redis.epoch);
            }
        }
    }
    // A change made during shutdown is written before the lease goes.
    if sharing && let Err(e) = redis.share_override(&handle, now_ms()).await {
        tracing::warn!(error = %e, "degrade: the last operator override change was not shared");
    }
    redis.release().await;
    handle.set_leader(None);
    Ok(())
}

/// Publishing on the in-process bus: always the leader (epoch 1).
struct InProcPublisher {
    next_version: u64,
    last: Option<LastPublish>,
}

impl Default for InProcPublisher {
    fn default() -> Self {
        InProcPublisher {
            next_version: 1,
            last: None,
        }
    }
}

impl InProcPublisher {
    fn round(
        &mut self,
        bus: &InProcBus,
        handle: &DegradeHandle,
        decision: &Decision,
        agents: &CommandPart,
        now: u64,
    ) {
        let cfg = handle.config();
        let lease_ms = cfg.policy.command_lease_ms;
        if due(self.last.as_ref(), decision, agents, 1, now, lease_ms) {
            let cmd = build_command(
                decision,
                agents,
                &cfg.cluster,
                1,
                self.next_version,
                now,
                lease_ms,
            );
            self.next_version += 1;
            bus.publish(cfg.keys.signer.sign(&cmd));
            handle.published(&cmd, None);
            self.last = Some(LastPublish {
                decision: decision.clone(),
                agents: agents.clone(),
                issued_at_ms: now,
                epoch: 1,
            });
        }
        handle.set_leader(Some(1));
        handle.set_acks(
            bus.acks()
                .into_iter()
                .map(|(k, a)| (k, AckEntry::Ok(a)))
                .collect(),
        );
    }
}

/// Publishing through Redis: what this replica knows of the connection, the lease and the
/// versions between two rounds.
struct Publisher {
    /// `None` until connected (retried every interval).
    bus: Option<RedisBus>,
    /// The epoch of the lease held, if any.
    epoch: Option<u64>,
    /// The highest epoch seen (ours, or a stored command's), so a new lease is newer.
    max_epoch_seen: u64,
    next_version: u64,
    last: Option<LastPublish>,
    /// The keys a reload replaced, and until when they are still accepted.
    previous_keys: Option<(brownout_protocol::PlaneKeys, std::time::Instant)>,
    /// The keys of the last reload (`None`: the handle's, from the start): what this
    /// publisher signs, seals and verifies with.
    keys: Option<brownout_protocol::PlaneKeys>,
}

impl Default for Publisher {
    fn default() -> Self {
        Publisher {
            bus: None,
            epoch: None,
            max_epoch_seen: 0,
            next_version: 1,
            last: None,
            previous_keys: None,
            keys: None,
        }
    }
}

impl Publisher {
    /// Signs with `keys` from now on. The replaced public key keeps verifying stored commands,
    /// and the replaced seal and ack keys stay accepted for `overlap` (also by a bus
    /// connected later).
    fn rotate_keys(
        &mut self,
        start: &brownout_protocol::PlaneKeys,
        mut keys: brownout_protocol::PlaneKeys,
        overlap: std::time::Duration,
    ) {
        let old = self.keys.take().unwrap_or_else(|| start.clone());
        if let brownout_protocol::CommandSigner::Ed25519(o) = &old.signer {
            keys.verifier.add(o.public());
        }
        let until = std::time::Instant::now() + overlap;
        if let Some(b) = self.bus.as_mut() {
            b.set_keys(&keys, Some((&old, until)));
        }
        tracing::info!(
            overlap_s = overlap.as_secs(),
            "degrade: command keys reloaded; the replaced ones are accepted for the overlap"
        );
        self.keys = Some(keys);
        self.previous_keys = Some((old, until));
    }

    /// Connects when not connected; false (said in the log) when Redis does not answer.
    async fn connect(&mut self, url: &str, cfg: &DegradeConfig) -> bool {
        if self.bus.is_some() {
            return true;
        }
        let keys = self.keys.as_ref().unwrap_or(&cfg.keys);
        match RedisBus::connect(url, &cfg.cluster, &cfg.replica_id, cfg.redis_timeout, keys).await {
            Ok(mut b) => {
                if let Some((old, until)) = &self.previous_keys {
                    b.set_keys(keys, Some((old, *until)));
                }
                self.bus = Some(b);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "degrade: redis unreachable; retrying next interval");
                false
            }
        }
    }

    /// Writes a pending override change (a pin or a tombstone) to Redis and tells the handle
    /// which change is now shared (what `DELETE /api/v1/degrade/override` waits for).
    async fn share_override(
        &mut self,
        handle: &DegradeHandle,
        now: u64,
    ) -> Result<(), RedisBusError> {
        let Some(b) = self.bus.as_mut() else {
            return Ok(());
        };
        let (pending, seq) = {
            let mut s = handle.lock();
            (s.override_to_share.take(), s.override_seq)
        };
        let Some(o) = pending else {
            return Ok(());
        };
        let epoch = self.epoch.unwrap_or(self.max_epoch_seen);
        match b.put_override(o.as_ref(), now, epoch).await {
            Ok(_) => {
                handle.override_shared(seq);
                Ok(())
            }
            Err(e) => {
                handle.lock().override_to_share.get_or_insert(o);
                Err(e)
            }
        }
    }

    /// One interval against Redis: share the operator override, keep or take the lease,
    /// publish when due (as leader) or show the leader's command (as follower), read the acks.
    /// May re-step the controller (`decision`) when the shared override or the stored command
    /// changes what is in force.
    async fn round(
        &mut self,
        handle: &DegradeHandle,
        controller: &mut Controller,
        decision: &mut Decision,
        agents: &CommandPart,
        now: u64,
    ) -> Result<(), RedisBusError> {
        if self.bus.is_none() {
            return Ok(());
        }
        let cfg = handle.config();
        let lease_ms = cfg.policy.command_lease_ms;
        // The operator override is shared through Redis: write a local change, then read the truth.
        self.share_override(handle, now).await?;
        match b_override(self).await? {
            // Absent (expired, never set, or lost with Redis's data): share ours again if active.
            SharedOverride::Absent => {
                let mut s = handle.lock();
                if s.override_to_share.is_none()
                    && s.operator_override
                        .as_ref()
                        .is_some_and(|o| o.until_ms > now)
                {
                    s.override_to_share = Some(s.operator_override.clone());
                }
            }
            // An older sealed value (a replay): nothing changes here.
            SharedOverride::Stale { .. } => {}
            SharedOverride::Current(shared) => {
                let mut s = handle.lock();
                if s.override_to_share.is_none() && s.operator_override != shared {
                    s.operator_override = shared;
                    drop(s);
                    *decision = controller.step(&handle.inputs(now));
                    handle.record(decision);
                }
            }
        }
        let Some(b) = self.bus.as_mut() else {
            return Ok(());
        };
        // The operator's per-instance actions, shared the same way.
        let dirty = {
            let mut s = handle.lock();
            std::mem::take(&mut s.instance_overrides_dirty).then(|| s.instance_overrides.clone())
        };
        if let Some(map) = dirty
            && let Err(e) = b.put_instance_overrides(&map, now).await
        {
            handle.lock().instance_overrides_dirty = true;
            return Err(e);
        }
        match b.get_instance_overrides().await? {
            None => {
                let mut s = handle.lock();
                if s.instance_overrides.values().any(|o| o.until_ms > now) {
                    s.instance_overrides_dirty = true;
                }
            }
            Some(mut shared) => {
                shared.retain(|_, o| o.until_ms > now);
                let mut s = handle.lock();
                s.instance_overrides.retain(|_, o| o.until_ms > now);
                if !s.instance_overrides_dirty && s.instance_overrides != shared {
                    s.instance_overrides = shared;
                    drop(s);
                    *decision = controller.step(&handle.inputs(now));
                    handle.record(decision);
                }
            }
        }
        let keys = self.keys.as_ref().unwrap_or(&cfg.keys);
        // Keep or take the leader lease. Refreshed every round (one cheap script): this is also
        // how a Redis that restarted empty is noticed within one interval.
        if let Some(e) = self.epoch
            && !b.refresh(e, cfg.leader_lease_ms).await?
        {
            tracing::warn!(epoch = e, "degrade: leader lease lost");
            self.epoch = None;
        }
        if self.epoch.is_none() {
            if let Some(e) = b
                .try_acquire(cfg.leader_lease_ms, self.max_epoch_seen)
                .await?
            {
                tracing::info!(epoch = e, replica = %cfg.replica_id, "degrade: became leader");
                self.epoch = Some(e);
                self.max_epoch_seen = self.max_epoch_seen.max(e);
                // Continue from the tier in force rather than dropping it on failover.
                if let Some(stored) = b.stored().await?
                    && let Ok(cmd) = keys.verifier.verify_for(&stored, &cfg.cluster)
                {
                    self.next_version = self.next_version.max(cmd.version + 1);
                    if cmd.tier > controller.tier() && !cmd.is_expired(now) {
                        controller.resume_at(cmd.tier, now);
                        *decision = controller.step(&handle.inputs(now));
                        handle.record(decision);
                    }
                }
            } else {
                // Follower: show the leader's command and acks.
                if let Some(stored) = b.stored().await?
                    && let Ok(cmd) = keys.verifier.verify_for(&stored, &cfg.cluster)
                {
                    self.max_epoch_seen = self.max_epoch_seen.max(cmd.epoch);
                    self.next_version = self.next_version.max(cmd.version + 1);
                    handle.lock().command = Some(cmd);
                }
                handle.set_acks(b.acks().await?);
                return Ok(());
            }
        }
        let Some(e) = self.epoch else { return Ok(()) };
        if due(self.last.as_ref(), decision, agents, e, now, lease_ms) {
            let d = decision.clone();
            let cluster = cfg.cluster.clone();
            let out = match b
                .publish(e, self.next_version, &keys.signer, |v| {
                    build_command(&d, agents, &cluster, e, v, now, lease_ms)
                })
                .await
            {
                Ok(out) => out,
                Err(err) => {
                    // The command may have been stored (and applied by a serving tier) before
                    // the error, e.g. a master that died after executing it: never reuse its
                    // version for different bytes.
                    self.next_version += 1;
                    return Err(err);
                }
            };
            match out {
                PublishOutcome::Published {
                    command, elapsed, ..
                } => {
                    tracing::debug!(epoch = e, version = command.version, tier = %command.tier, "degrade: published");
                    self.next_version = command.version + 1;
                    handle.published(&command, Some(elapsed));
                    self.last = Some(LastPublish {
                        decision: d,
                        agents: agents.clone(),
                        issued_at_ms: now,
                        epoch: e,
                    });
                }
                PublishOutcome::NotLeader => {
                    tracing::warn!(epoch = e, "degrade: publish refused: lease not held");
                    self.epoch = None;
                }
                PublishOutcome::Fenced { stored_epoch } => {
                    tracing::warn!(
                        epoch = e,
                        stored_epoch,
                        "degrade: publish fenced by a newer leader"
                    );
                    self.max_epoch_seen = self.max_epoch_seen.max(stored_epoch);
                    self.epoch = None;
                }
            }
        }
        handle.set_acks(b.acks().await?);
        Ok(())
    }

    /// Releases the lease this replica holds (so a peer takes over at once, not after expiry).
    async fn release(&mut self) {
        if let (Some(b), Some(e)) = (self.bus.as_mut(), self.epoch) {
            match b.release(e).await {
                Ok(true) => tracing::info!(epoch = e, "degrade: leader lease released"),
                Ok(false) => {}
                Err(err) => tracing::warn!(error = %err, "degrade: could not release the lease"),
            }
        }
    }
}
