//! The ack ledger: what the serving instances acknowledged, the commands this replica issued
//! (for the decision → applied lag), the "nothing acks" warning, and the per-instance entries'
//! acks a stored decision keeps.

use std::collections::{BTreeMap, VecDeque};

use brownout_protocol::{Ack, Command};
use serde::{Deserialize, Serialize};

use super::controller::{Decision, InstanceAction};
use super::redis::AckEntry;

/// The ack of one instance's entry, as a stored decision keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceAckRecord {
    /// `applied`, `pending` or `unknown_instance` (as in [`InstanceActionView::ack`]).
    pub status: String,
    /// Decision → applied, when known (for `"*"`: the slowest instance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_ms: Option<u64>,
}

/// One serving instance's ack, as shown by the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AckView {
    pub instance: String,
    pub status: String,
    pub epoch: u64,
    pub version: u64,
    pub at_ms: u64,
    /// Decision (issue) → applied, when the acked version is one this replica published.
    pub lag_ms: Option<u64>,
    /// True when the instance is behind the command in force.
    pub behind: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Which `instances` entries the instance applied (`own`, `*`, `own+*`), when any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<String>,
}

/// One per-instance action with its ack, in `GET /api/v1/degrade`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceActionView {
    #[serde(flatten)]
    pub action: InstanceAction,
    /// The entry the command in force carries for it (`None` for watches and retry waves).
    pub entry: Option<brownout_protocol::InstanceEntry>,
    /// `applied` (the instance acked the command in force with this entry), `pending`, or
    /// `unknown_instance` (no ack from that id: no serving tier answers to it). For `"*"`:
    /// `applied` once every acking instance applied it.
    pub ack: String,
}

/// How long a published command may stay without any ack before the warning (log line,
/// `DegradeStatus::unacked`, `brownout_degradation_unacked_commands`).
pub const UNACKED_WARN_MS: u64 = 5_000;

/// Published commands that no serving instance acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unacked {
    /// Issue time of the oldest command without an ack at or above its version.
    pub since_ms: u64,
    /// Commands published since then.
    pub commands: u64,
    /// What to check, for the log and the UI.
    pub hint: String,
}

/// How many issued commands the ledger remembers (for the lag of a late ack).
const ISSUED_KEPT: usize = 1024;

/// The acks seen, the commands issued and the warning state, kept in the handle's state.
#[derive(Debug, Default)]
pub(super) struct AckLedger {
    /// The latest ack per serving instance.
    pub(super) acks: Vec<AckView>,
    /// version → issued_at_ms of commands this replica published (bounded by [`ISSUED_KEPT`]).
    issued: VecDeque<(u64, u64)>,
    pub(super) unacked: Option<Unacked>,
}

impl AckLedger {
    /// Remembers a command this replica published.
    pub(super) fn issued(&mut self, version: u64, issued_at_ms: u64) {
        self.issued.push_back((version, issued_at_ms));
        while self.issued.len() > ISSUED_KEPT {
            self.issued.pop_front();
        }
    }

    /// The views of the acks read from the transport, against the command in force.
    pub(super) fn views(
        &self,
        acks: BTreeMap<String, AckEntry>,
        command: Option<&Command>,
    ) -> Vec<AckView> {
        let mut views = Vec::with_capacity(acks.len());
        let cur = command.map(Command::order_key);
        for (instance, entry) in acks {
            let v = match entry {
                AckEntry::Ok(Ack::Applied {
                    epoch,
                    version,
                    applied_at_ms,
                    entry,
                }) => {
                    let lag_ms = self
                        .issued
                        .iter()
                        .rev()
                        .find(|(v, _)| *v == version)
                        .map(|(_, issued)| applied_at_ms.saturating_sub(*issued));
                    AckView {
                        instance,
                        status: "applied".into(),
                        epoch,
                        version,
                        at_ms: applied_at_ms,
                        lag_ms,
                        behind: cur.is_some_and(|c| (epoch, version) < c),
                        reason: String::new(),
                        entry: entry.and_then(|e| e.as_str()).map(str::to_string),
                    }
                }
                AckEntry::Ok(Ack::Refused {
                    epoch,
                    version,
                    at_ms,
                    reason,
                }) => AckView {
                    instance,
                    status: "refused".into(),
                    epoch,
                    version,
                    at_ms,
                    lag_ms: None,
                    behind: true,
                    reason,
                    entry: None,
                },
                AckEntry::Malformed(raw) => AckView {
                    instance,
                    status: "malformed".into(),
                    epoch: 0,
                    version: 0,
                    at_ms: 0,
                    lag_ms: None,
                    behind: true,
                    reason: raw,
                    entry: None,
                },
                AckEntry::Unverified { raw, reason } => AckView {
                    instance,
                    status: "unverified".into(),
                    epoch: 0,
                    version: 0,
                    at_ms: 0,
                    lag_ms: None,
                    behind: true,
                    reason: format!("{reason}: {raw}"),
                    entry: None,
                },
            };
            views.push(v);
        }
        views
    }

    /// Whether the commands this replica published are acknowledged by anyone: sets
    /// [`AckLedger::unacked`] (what `brownout_degradation_unacked_commands` and
    /// `DegradeStatus::unacked` show), and logs a warning once when they become
    /// unacknowledged.
    pub(super) fn check_unacked(&mut self, cluster: &str, now: u64) {
        // The newest version any instance answered (applied or refused: it is listening).
        let answered = self
            .acks
            .iter()
            .filter(|a| a.status == "applied" || a.status == "refused")
            .map(|a| a.version)
            .max()
            .unwrap_or(0);
        let pending: Vec<u64> = self
            .issued
            .iter()
            .filter(|(v, _)| *v > answered)
            .map(|(_, at)| *at)
            .collect();
        let oldest = pending.iter().copied().min();
        let next = match oldest {
            Some(since) if now.saturating_sub(since) >= UNACKED_WARN_MS => Some(Unacked {
                since_ms: since,
                commands: pending.len() as u64,
                hint: format!(
                    "no serving instance acknowledged the commands published for cluster {:?} \
                     in the last {} s: check that the serving tiers use the same cluster \
                     (BROWNOUT_CLUSTER), command key (BROWNOUT_COMMAND_KEY) and Redis",
                    cluster,
                    now.saturating_sub(since) / 1000
                ),
            }),
            _ => None,
        };
        if let Some(u) = &next
            && self.unacked.is_none()
        {
            tracing::warn!(
                cluster = %cluster,
                commands = u.commands,
                "degrade: {}", u.hint
            );
        }
        self.unacked = next;
    }

    /// The acks of the per-instance actions in force, to copy into the latest recorded
    /// decision (`rec_actions`, `rec_acks`); returns whether `rec_acks` changed (the record is
    /// then stored again). Only while the latest decision is the recorded one's continuation
    /// (same actions), never for a dry-run record.
    pub(super) fn record_instance_acks(
        &self,
        last: Option<&Decision>,
        command: Option<&Command>,
        rec_actions: &[InstanceAction],
        rec_acks: &mut BTreeMap<String, InstanceAckRecord>,
    ) -> bool {
        let views = instance_views(last, command, &self.acks);
        let mut acks: BTreeMap<String, InstanceAckRecord> = BTreeMap::new();
        for v in views.iter().filter(|v| v.entry.is_some()) {
            let lag_ms = if v.action.instance == brownout_protocol::ALL_INSTANCES {
                (v.ack == "applied")
                    .then(|| self.acks.iter().filter_map(|a| a.lag_ms).max())
                    .flatten()
            } else {
                self.acks
                    .iter()
                    .find(|a| a.instance == v.action.instance)
                    .filter(|_| v.ack == "applied")
                    .and_then(|a| a.lag_ms)
            };
            acks.insert(
                v.action.instance.clone(),
                InstanceAckRecord {
                    status: v.ack.clone(),
                    lag_ms,
                },
            );
        }
        let same =
            last.is_some_and(|d| action_keys(&d.instance_actions) == action_keys(rec_actions));
        if !same {
            return false;
        }
        // An ack once applied stays as it was for this decision (a later "pending" or lag is a
        // republished command's), so the record is stored again only when an ack changes state.
        for (k, old) in rec_acks.iter() {
            if old.status == "applied"
                && let Some(new) = acks.get_mut(k)
            {
                *new = old.clone();
            }
        }
        if acks.is_empty() || acks == *rec_acks {
            return false;
        }
        *rec_acks = acks;
        true
    }
}

/// The per-instance actions of the last decision with the entry in force and its ack.
pub(super) fn instance_views(
    last: Option<&Decision>,
    command: Option<&Command>,
    acks: &[AckView],
) -> Vec<InstanceActionView> {
    let Some(d) = last else { return Vec::new() };
    let cur = command.map(Command::order_key);
    d.instance_actions
        .iter()
        .map(|a| {
            let entry = command
                .and_then(|c| c.instances.get(&a.instance))
                .cloned()
                .filter(|_| !matches!(a.action.as_str(), "watch" | "recovery_storm"));
            let applied = |v: &AckView, want: &str| {
                v.status == "applied"
                    && cur.is_some_and(|c| (v.epoch, v.version) >= c)
                    && v.entry.as_deref().is_some_and(|e| e.contains(want))
            };
            let ack = if entry.is_none() {
                "-".to_string()
            } else if a.instance == brownout_protocol::ALL_INSTANCES {
                let ok = !acks.is_empty() && acks.iter().all(|v| applied(v, "*"));
                String::from(if ok { "applied" } else { "pending" })
            } else {
                match acks.iter().find(|v| v.instance == a.instance) {
                    None => "unknown_instance".into(),
                    Some(v) if applied(v, "own") => "applied".into(),
                    Some(_) => "pending".into(),
                }
            };
            InstanceActionView {
                action: a.clone(),
                entry,
                ack,
            }
        })
        .collect()
}

pub(super) fn action_keys(a: &[InstanceAction]) -> Vec<(&str, &str)> {
    a.iter()
        .map(|x| (x.instance.as_str(), x.action.as_str()))
        .collect()
}
