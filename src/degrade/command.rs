//! From a decision to the command that goes out, top-down: when a command is due
//! (`due`: a changed effect, a changed agent part, a new epoch, or the lease refresh), what
//! it carries (`build_command`: [`Decision::to_command`] plus the agent guards' merge,
//! [`CommandPart::apply`]). The transport signs it (`run.rs`).

use std::collections::BTreeMap;

use brownout_protocol::{Command, FeatureState};

use super::controller::Decision;
use crate::agents::CommandPart;

/// What the last publish looked like, to decide when the next is due.
pub(super) struct LastPublish {
    pub(super) decision: Decision,
    /// What the agent guards added to it.
    pub(super) agents: CommandPart,
    pub(super) issued_at_ms: u64,
    pub(super) epoch: u64,
}

pub(super) fn due(
    last: Option<&LastPublish>,
    d: &Decision,
    agents: &CommandPart,
    epoch: u64,
    now: u64,
    lease_ms: u64,
) -> bool {
    match last {
        None => true,
        Some(l) => {
            l.epoch != epoch
                || !l.decision.same_effect(d)
                || l.agents != *agents
                || now >= l.issued_at_ms + lease_ms / 3
        }
    }
}

/// The command a decision publishes, with the agent guards' breakers and loop kills merged in
/// (the one merge point, docs/AGENTS.md).
pub(super) fn build_command(
    d: &Decision,
    agents: &CommandPart,
    cluster: &str,
    epoch: u64,
    version: u64,
    now: u64,
    lease_ms: u64,
) -> brownout_protocol::Command {
    let mut cmd = d.to_command(cluster, epoch, version, now, lease_ms);
    agents.apply(&mut cmd);
    cmd
}

impl Decision {
    /// The command this decision publishes, stamped with the publisher's epoch and version.
    pub fn to_command(
        &self,
        cluster: &str,
        epoch: u64,
        version: u64,
        now_ms: u64,
        lease_ms: u64,
    ) -> Command {
        Command {
            cluster: cluster.to_string(),
            epoch,
            version,
            tier: self.tier,
            issued_at_ms: now_ms,
            expires_at_ms: now_ms.saturating_add(lease_ms),
            reason: self.reason.clone(),
            features: self.features.clone(),
            model_route: self.model_route.clone(),
            limits: self.limits.clone(),
            shed: self.shed.clone(),
            instances: self.instances.clone(),
            abort: Vec::new(),
            extra: BTreeMap::new(),
        }
    }

    /// The fields the serving tier acts on (not the time, not the reasons' wording). Two decisions
    /// with the same effect need no new command beyond the lease refresh.
    pub fn same_effect(&self, other: &Decision) -> bool {
        self.tier == other.tier
            && self.features == other.features
            && self.model_route == other.model_route
            && self.limits == other.limits
            && self.instances == other.instances
            && self
                .shed
                .as_ref()
                .map(|s| (s.admit_min_criticality, s.retry_after_s, s.admit_rps))
                == other
                    .shed
                    .as_ref()
                    .map(|s| (s.admit_min_criticality, s.retry_after_s, s.admit_rps))
    }
}

fn severity(f: &FeatureState) -> u8 {
    match f {
        FeatureState::Disabled => 2,
        FeatureState::Probe => 1,
        _ => 0,
    }
}

impl CommandPart {
    /// Merges into a command the controller built: a breaker's state replaces the policy's only
    /// when stricter (`disabled` > `probe` > `enabled`), abort entries are appended (the list
    /// stays within [`brownout_protocol::MAX_ABORT_ENTRIES`]), and `probe_ratio` is set when the
    /// command has none.
    pub fn apply(&self, cmd: &mut Command) {
        for (name, state) in &self.features {
            let stricter = cmd
                .features
                .get(name)
                .is_none_or(|cur| severity(state) > severity(cur));
            if stricter {
                cmd.features.insert(name.clone(), state.clone());
            }
        }
        let room = brownout_protocol::MAX_ABORT_ENTRIES.saturating_sub(cmd.abort.len());
        cmd.abort
            .extend(self.abort.iter().rev().take(room).rev().cloned());
        if cmd.limits.probe_ratio.is_none()
            && self.probe_ratio.is_some()
            && self.features.values().any(|f| *f == FeatureState::Probe)
        {
            cmd.limits.probe_ratio = self.probe_ratio;
        }
    }
}
