//! The degradation page: the tier in force and why, the tier timeline of the last
//! [`TIER_WINDOW_MS`], and every serving instance's ack.

use std::collections::BTreeMap;

use brownout_protocol::{Reason, Tier, now_ms};

use super::{HOUR_MS, LiveDataSource};
use crate::degrade::{DecisionRecord, DegradeStatus};
use crate::store::Doc;
use crate::web::model::{
    ClusterDegradation, ClusterTier, DegradationView, InstanceAck, InstanceActionRow, TierChange,
    UiError,
};

/// Rows of the per-instance action log shown.
const ACTION_LOG_ROWS: usize = 50;

/// `max_num_seqs 128, drain, admit 12.5 req/s`.
pub fn entry_text(e: &brownout_protocol::InstanceEntry) -> String {
    let mut v = Vec::new();
    if let Some(n) = e.max_num_seqs {
        v.push(format!("max_num_seqs {n}"));
    }
    match e.drain {
        Some(true) => v.push("drain".to_string()),
        Some(false) => v.push("no drain".to_string()),
        None => {}
    }
    if let Some(r) = e.admit_rps {
        v.push(format!("admit {r} req/s"));
    }
    v.join(", ")
}

/// Longest window of the degradation timeline.
pub const TIER_WINDOW_MS: u64 = 6 * HOUR_MS;
/// Shortest window of the timeline: a plane that started a minute ago shows its minute on
/// [`TIER_WINDOW_MIN_MS`], not as a sliver at the edge of six hours.
pub const TIER_WINDOW_MIN_MS: u64 = 5 * 60_000;
/// An instance behind the command in force is shown as lagging only once the command has gone
/// unacknowledged this long (acks take a subscriber poll to arrive).
pub const ACK_GRACE_MS: u64 = 2_000;

/// The timeline's start: from the oldest decision of the last [`TIER_WINDOW_MS`] (with a
/// little room before it), at least [`TIER_WINDOW_MIN_MS`] before `now`.
pub fn window_start(records: &[DecisionRecord], now: u64) -> u64 {
    // A decision older than the window means the state has held at least that long: the
    // whole window (the clamp below).
    let first = records.iter().map(|r| r.at_ms).min().unwrap_or(now);
    let span = now.saturating_sub(first);
    let span = (span + span / 20).clamp(TIER_WINDOW_MIN_MS, TIER_WINDOW_MS);
    now.saturating_sub(span)
}

/// The reason of the first decision after start, at T0 with nothing ever raised: the
/// controller calls it `recovered` (inputs clear), but nothing has recovered from anything.
fn start_reason(r: &DecisionRecord) -> Option<Reason> {
    (r.tier == Tier::T0 && r.previous == Tier::T0 && r.trigger == "recovered").then(|| Reason {
        trigger: "none".into(),
        detail: "T0 since the control loop started: every input below its threshold".into(),
        ..Reason::default()
    })
}

/// Lagging: behind the command in force after [`ACK_GRACE_MS`] (the command was published
/// that long ago and is not applied), or its last ack older than a lease refresh (a third of
/// the lease: the controller republishes that often) plus the grace.
pub fn ack_lagging(
    behind: bool,
    acked_at_ms: u64,
    command: Option<&brownout_protocol::Command>,
    now: u64,
) -> bool {
    let Some(c) = command else {
        return behind;
    };
    let lease = c.expires_at_ms.saturating_sub(c.issued_at_ms);
    behind
        && (now.saturating_sub(c.issued_at_ms) > ACK_GRACE_MS
            || now.saturating_sub(acked_at_ms) > lease / 3 + ACK_GRACE_MS)
}

/// Decisions persisted as docs and those held in memory, one per timestamp, oldest first.
fn merge_decisions(docs: Vec<Doc>, in_memory: Vec<DecisionRecord>) -> Vec<DecisionRecord> {
    let mut by_ts: BTreeMap<u64, DecisionRecord> = BTreeMap::new();
    for d in docs {
        match serde_json::from_value::<DecisionRecord>(d.value.clone()) {
            Ok(r) => {
                by_ts.insert(r.at_ms, r);
            }
            // Older code stored the JSON as a string.
            Err(_) => {
                if let Some(r) = d
                    .value
                    .as_str()
                    .and_then(|s| serde_json::from_str::<DecisionRecord>(s).ok())
                {
                    by_ts.insert(r.at_ms, r);
                }
            }
        }
    }
    for r in in_memory {
        by_ts.insert(r.at_ms, r);
    }
    by_ts.into_values().collect()
}

/// The rows of the tier timeline from the decisions (oldest first): a row for each change of
/// tier or of trigger (operator → slo_burn at the same tier is a new row), the last one before
/// `window_start` then every one inside; and whether the cluster never left T0 (its first
/// decision was the start one, and no later one raised it).
pub fn tier_changes(records: &[DecisionRecord], window_start: u64) -> (Vec<TierChange>, bool) {
    let change = |r: &DecisionRecord| TierChange {
        ts_ms: r.at_ms,
        tier: r.tier,
        reason: start_reason(r).unwrap_or_else(|| Reason {
            trigger: r.trigger.clone(),
            detail: r.detail.clone(),
            ..Reason::default()
        }),
        version: r.published.map_or(0, |(_, v)| v),
    };
    let mut changes: Vec<TierChange> = Vec::new();
    let mut last: Option<(Tier, &str)> = None;
    let mut started_quiet = false;
    for r in records {
        if last == Some((r.tier, r.trigger.as_str())) {
            continue;
        }
        if last.is_none() {
            started_quiet = start_reason(r).is_some();
        } else if r.tier != Tier::T0 {
            started_quiet = false;
        }
        last = Some((r.tier, r.trigger.as_str()));
        let c = change(r);
        if r.at_ms < window_start {
            changes.clear();
        }
        changes.push(c);
    }
    (changes, started_quiet)
}

/// The cluster's degradation from the controller's status and the decisions (oldest first):
/// what the degradation page and the overview's tier card show.
pub fn cluster_view(
    status: DegradeStatus,
    records: &[DecisionRecord],
    now: u64,
) -> ClusterDegradation {
    let window_start = window_start(records, now);
    let command = status.command.clone();
    let (mut changes, started_quiet) = tier_changes(records, window_start);
    let tier = status.tier;
    let last = changes.last().cloned();
    let since_ms = last.as_ref().map_or(window_start, |c| c.ts_ms);
    let reason = match &command {
        // Never left T0: not "recovered" but the start reason.
        Some(c) if c.tier == tier && !(started_quiet && tier == Tier::T0) => c.reason.clone(),
        _ => last
            .as_ref()
            .map(|c| c.reason.clone())
            .unwrap_or_else(|| Reason {
                trigger: "none".into(),
                detail: "no decision yet".into(),
                ..Reason::default()
            }),
    };
    if changes.is_empty() {
        changes.push(TierChange {
            ts_ms: window_start,
            tier,
            reason: reason.clone(),
            version: command.as_ref().map_or(0, |c| c.version),
        });
    }
    let acks = status
        .acks
        .iter()
        .map(|a| InstanceAck {
            instance: a.instance.clone(),
            epoch: a.epoch,
            version: a.version,
            applied_at_ms: a.at_ms,
            // Behind: how long the command in force has waited for this instance.
            lag_ms: match &command {
                Some(c) if a.behind => now.saturating_sub(c.issued_at_ms),
                _ => a.lag_ms.unwrap_or(0),
            },
            nack_reason: (a.status != "applied").then(|| {
                if a.reason.is_empty() {
                    a.status.clone()
                } else {
                    a.reason.clone()
                }
            }),
            lagging: ack_lagging(a.behind, a.at_ms, command.as_ref(), now),
        })
        .collect();
    let instance_actions = status
        .instances
        .iter()
        .map(|v| InstanceActionRow {
            ts_ms: v.action.since_ms,
            instance: v.action.instance.clone(),
            action: v.action.action.clone(),
            detail: v.action.detail.clone(),
            entry: v.entry.as_ref().map(entry_text).unwrap_or_default(),
            ack: v.ack.clone(),
        })
        .collect();
    let action_log = records
        .iter()
        .rev()
        .flat_map(|r| {
            r.instance_actions.iter().map(|a| InstanceActionRow {
                ts_ms: r.at_ms,
                instance: a.instance.clone(),
                action: a.action.clone(),
                detail: a.detail.clone(),
                entry: String::new(),
                ack: r
                    .published
                    .map_or_else(|| "-".to_string(), |(e, v)| format!("{e}:{v}")),
            })
        })
        .take(ACTION_LOG_ROWS)
        .collect();
    ClusterDegradation {
        instance_actions,
        action_log,
        current: ClusterTier {
            name: status.cluster.clone(),
            tier,
            reason,
            since_ms,
            leader: status
                .leader_epoch
                .map(|e| format!("{} (epoch {e})", status.replica_id)),
            warning: status.unacked.as_ref().map(|u| u.hint.clone()),
        },
        epoch: command.as_ref().map_or(0, |c| c.epoch),
        version: command.as_ref().map_or(0, |c| c.version),
        timeline: changes,
        window_start_ms: window_start,
        window_end_ms: now,
        acks,
    }
}

impl LiveDataSource {
    /// Decisions held in memory, plus those persisted in the store (they survive restarts).
    async fn decisions(&self, since: u64) -> Vec<DecisionRecord> {
        let docs = match self.store().list_docs("decision", since).await {
            Ok(docs) => docs,
            Err(e) => {
                tracing::warn!(error = %e, "web: cannot read stored decisions");
                Vec::new()
            }
        };
        merge_decisions(docs, self.parts.degrade.decisions())
    }

    pub(super) async fn cluster(&self, now: u64) -> ClusterDegradation {
        let window_start = now.saturating_sub(TIER_WINDOW_MS);
        let status = self.parts.degrade.status();
        let records = self
            .decisions(window_start.saturating_sub(24 * HOUR_MS))
            .await;
        cluster_view(status, &records, now)
    }

    pub(super) async fn degradation_view(&self) -> Result<DegradationView, UiError> {
        let now = now_ms();
        Ok(DegradationView {
            origin: self.parts.origin,
            generated_at_ms: now,
            clusters: vec![self.cluster(now).await],
        })
    }
}
