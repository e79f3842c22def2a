//! What one cycle produced ([`CycleReport`]) and the state the cycle, the exporter and the
//! agent handles share ([`Shared`]).

use std::sync::Arc;
use std::time::Duration;

use brownout_protocol::AgentSnapshot;
use tokio::sync::watch;

use crate::engine::EngineReport;
use crate::probe::{GpuSample, ProbeKind};
use crate::push::SnapshotQueue;

/// Everything one cycle produced: the wire snapshot plus what only the exporter shows.
#[derive(Debug, Clone)]
pub struct CycleReport {
    pub snapshot: AgentSnapshot,
    pub gpus: Vec<GpuSample>,
    pub engines: Vec<EngineReport>,
    pub probe_up: bool,
    pub probe_errors_total: u64,
    pub cycles_total: u64,
    pub cycle_duration: Duration,
}

/// State shared by the cycle, the exporter and [`crate::agent::AgentHandle`]s.
#[derive(Debug)]
pub struct Shared {
    pub(crate) host: String,
    pub(crate) probe_kind: ProbeKind,
    pub(crate) vram_watermark_ratio: f64,
    pub(crate) latest: watch::Sender<Option<Arc<CycleReport>>>,
    pub(crate) queue: Option<Arc<SnapshotQueue>>,
}

impl Shared {
    pub fn latest(&self) -> Option<Arc<CycleReport>> {
        self.latest.borrow().clone()
    }
}
