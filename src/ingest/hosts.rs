//! Per-host liveness from agent snapshots: last seen, fresh / stale / down.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use brownout_protocol::AgentSnapshot;
use serde::Serialize;

use crate::config::HostsConfig;

/// A host's heartbeat state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HostState {
    /// Seen within `stale_after`.
    Fresh,
    /// Missed heartbeats, not yet `down_after`.
    Stale,
    /// Silent for `down_after` or longer.
    Down,
}

/// One host as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostView {
    pub host: String,
    pub state: HostState,
    /// When the control plane last received a snapshot from it (unix ms).
    pub last_seen_ms: u64,
    pub age_ms: u64,
    pub snapshot: AgentSnapshot,
}

#[derive(Debug, Clone)]
struct Entry {
    last_seen_ms: u64,
    snapshot: AgentSnapshot,
}

/// Shared, cheap to clone.
#[derive(Debug, Clone)]
pub struct HostRegistry {
    config: HostsConfig,
    hosts: Arc<RwLock<HashMap<String, Entry>>>,
}

impl HostRegistry {
    pub fn new(config: HostsConfig) -> HostRegistry {
        HostRegistry {
            config,
            hosts: Arc::default(),
        }
    }

    /// Records a snapshot received at `now_ms`. An older snapshot than the one held (by the
    /// agent's clock) does not replace it but still counts as a heartbeat.
    pub fn observe(&self, snapshot: AgentSnapshot, now_ms: u64) {
        let Ok(mut map) = self.hosts.write() else {
            return;
        };
        match map.get_mut(&snapshot.host) {
            Some(e) => {
                e.last_seen_ms = e.last_seen_ms.max(now_ms);
                if snapshot.ts_ms >= e.snapshot.ts_ms {
                    e.snapshot = snapshot;
                }
            }
            None => {
                map.insert(
                    snapshot.host.clone(),
                    Entry {
                        last_seen_ms: now_ms,
                        snapshot,
                    },
                );
            }
        }
    }

    /// Seeds from stored snapshots at startup (last seen = the snapshot's own time).
    pub fn seed(&self, snapshots: Vec<AgentSnapshot>) {
        for s in snapshots {
            let ts = s.ts_ms;
            self.observe(s, ts);
        }
    }

    pub fn state_at(&self, last_seen_ms: u64, now_ms: u64) -> HostState {
        let age = now_ms.saturating_sub(last_seen_ms);
        if age < self.config.stale_after.as_millis() as u64 {
            HostState::Fresh
        } else if age < self.config.down_after.as_millis() as u64 {
            HostState::Stale
        } else {
            HostState::Down
        }
    }

    /// Every host, by name, with its state at `now_ms`.
    pub fn list(&self, now_ms: u64) -> Vec<HostView> {
        let Ok(map) = self.hosts.read() else {
            return Vec::new();
        };
        let mut out: Vec<HostView> = map
            .iter()
            .map(|(h, e)| HostView {
                host: h.clone(),
                state: self.state_at(e.last_seen_ms, now_ms),
                last_seen_ms: e.last_seen_ms,
                age_ms: now_ms.saturating_sub(e.last_seen_ms),
                snapshot: e.snapshot.clone(),
            })
            .collect();
        out.sort_by(|a, b| a.host.cmp(&b.host));
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn hosts_go_fresh_stale_down() {
        let r = HostRegistry::new(HostsConfig {
            stale_after: Duration::from_secs(5),
            down_after: Duration::from_secs(30),
        });
        r.observe(
            AgentSnapshot {
                host: "gpu-1".into(),
                ts_ms: 1_000,
                ..Default::default()
            },
            1_000,
        );
        let table = [
            (1_000, HostState::Fresh),
            (5_999, HostState::Fresh),
            (6_000, HostState::Stale),
            (30_999, HostState::Stale),
            (31_000, HostState::Down),
        ];
        for (now, want) in table {
            assert_eq!(r.list(now)[0].state, want, "at {now}");
        }
        r.observe(
            AgentSnapshot {
                host: "gpu-1".into(),
                ts_ms: 500,
                ..Default::default()
            },
            40_000,
        );
        let v = &r.list(40_000)[0];
        assert_eq!(
            (v.state, v.snapshot.ts_ms),
            (HostState::Fresh, 1_000),
            "late snapshot is a heartbeat, not a regression"
        );
    }
}
