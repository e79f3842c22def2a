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

/// Window of the degradation timeline.
const TIER_WINDOW_MS: u64 = 6 * HOUR_MS;

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

/// The cluster's degradation from the controller's status and the decisions (oldest first).
fn cluster_view(status: DegradeStatus, records: &[DecisionRecord], now: u64) -> ClusterDegradation {
    let window_start = now.saturating_sub(TIER_WINDOW_MS);
    let command = status.command.clone();
    let change = |r: &DecisionRecord| TierChange {
        ts_ms: r.at_ms,
        tier: r.tier,
        reason: Reason {
            trigger: r.trigger.clone(),
            detail: r.detail.clone(),
            ..Reason::default()
        },
        version: r.published.map_or(0, |(_, v)| v),
    };
    // Tier changes only: the last change before the window, then every change inside.
    let mut changes: Vec<TierChange> = Vec::new();
    let mut last_tier: Option<Tier> = None;
    for r in records {
        if last_tier == Some(r.tier) {
            continue;
        }
        last_tier = Some(r.tier);
        let c = change(r);
        if r.at_ms < window_start {
            changes.clear();
        }
        changes.push(c);
    }
    let tier = status.tier;
    let last = changes.last().cloned();
    let since_ms = last.as_ref().map_or(window_start, |c| c.ts_ms);
    let reason = match &command {
        Some(c) if c.tier == tier => c.reason.clone(),
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
            lag_ms: a.lag_ms.unwrap_or(0),
            nack_reason: (a.status != "applied").then(|| {
                if a.reason.is_empty() {
                    a.status.clone()
                } else {
                    a.reason.clone()
                }
            }),
            lagging: a.behind,
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
