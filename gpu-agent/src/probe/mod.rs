//! GPU probes: where the per-GPU figures come from.
//!
//! [`GpuProbe`] is the seam: [`nvml::NvmlProbe`] reads real cards through NVML;
//! [`simulated::SimulatedProbe`] makes up cards whose memory and utilisation follow the engines'
//! KV pools and batches, for demos and tests on machines without a GPU. Every series from the
//! simulated probe carries `simulated="true"`.

pub mod nvml;
pub mod simulated;

use brownout_protocol::GpuStats;

use crate::engine::EngineReport;

/// Which probe produced a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    Nvml,
    Simulated,
}

/// One process's share of a GPU's memory (NVML's running compute processes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessVram {
    pub pid: u32,
    /// `/proc/<pid>/comm`, empty when unreadable (another container's pid namespace).
    pub name: String,
    pub used_bytes: u64,
}

/// One GPU as a probe sees it: the protocol's [`GpuStats`] plus what only the exporter shows.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GpuSample {
    pub stats: GpuStats,
    pub memory_free_bytes: u64,
    /// The last XID error the card reported; `None` when the card cannot report XIDs.
    pub last_xid: Option<u64>,
    /// Volatile single-/double-bit ECC error counts; `None` when ECC is off or unsupported.
    pub ecc_sbe_volatile: Option<u64>,
    pub ecc_dbe_volatile: Option<u64>,
    pub processes: Vec<ProcessVram>,
    /// SM clock in MHz (`DCGM_FI_DEV_SM_CLOCK`; NVML `clock_info(SM)`).
    pub sm_clock_mhz: Option<f64>,
    /// Share of time the graphics/compute engine was active, 0–1
    /// (`DCGM_FI_PROF_GR_ENGINE_ACTIVE`; NVML GPM `GRAPHICS_UTIL` on Hopper and newer).
    pub gr_engine_active_ratio: Option<f64>,
    /// Share of time a tensor pipe was active, 0–1 (`DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`; NVML
    /// GPM `ANY_TENSOR_UTIL` on Hopper and newer).
    pub tensor_active_ratio: Option<f64>,
}

/// Why a probe could not sample.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The probe cannot work on this machine (no libnvidia-ml, no driver, no permission).
    #[error("GPU probe unavailable: {0}")]
    Unavailable(String),
    /// A query failed this time (a card fell off the bus, a transient driver error).
    #[error("GPU query failed: {0}")]
    Query(String),
}

/// A source of per-GPU samples, called once per cycle after the engines were scraped.
pub trait GpuProbe: Send {
    fn kind(&self) -> ProbeKind;
    /// Samples every GPU. `engines` is this cycle's engine scrape; the NVML probe ignores it,
    /// the simulated probe derives memory and utilisation from it.
    ///
    /// # Errors
    /// [`ProbeError`] when the cards cannot be read this cycle.
    fn sample(&mut self, engines: &[EngineReport]) -> Result<Vec<GpuSample>, ProbeError>;
}
