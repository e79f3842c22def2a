//! The NVML probe: real cards through `nvml-wrapper`.
//!
//! NVML is process-global state, so the library handle is initialised once per process and kept
//! in a `static` (it is `Send + Sync`); that also gives the XID event set a `'static` lifetime.
//! When `libnvidia-ml.so` is missing or the driver is not loaded, [`NvmlProbe::new`] returns
//! [`ProbeError::Unavailable`] — it never panics — and the agent keeps exporting engine metrics
//! with `brownout_gpu_probe_up 0`.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use brownout_protocol::GpuStats;
use nvml_wrapper::EventSet;
use nvml_wrapper::GpmSample;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::enums::gpm::GpmMetricId;
use nvml_wrapper::error::NvmlError;

use super::{GpuProbe, GpuSample, ProbeError, ProbeKind, ProcessVram};
use crate::engine::EngineReport;

static NVML: OnceLock<Nvml> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());

/// The process-wide NVML handle, initialising it on first success.
///
/// # Errors
/// [`ProbeError::Unavailable`] with NVML's reason (library missing, driver not loaded, no
/// permission).
pub fn nvml() -> Result<&'static Nvml, ProbeError> {
    if let Some(n) = NVML.get() {
        return Ok(n);
    }
    let _guard = INIT_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(n) = NVML.get() {
        return Ok(n);
    }
    let n = Nvml::init().map_err(|e| ProbeError::Unavailable(describe_init_error(&e)))?;
    Ok(NVML.get_or_init(|| n))
}

fn describe_init_error(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(inner) => format!(
            "libnvidia-ml.so could not be loaded ({inner}); is the NVIDIA driver installed?"
        ),
        NvmlError::DriverNotLoaded => "the NVIDIA driver is not loaded".to_string(),
        NvmlError::NoPermission => "no permission to talk to the NVIDIA driver".to_string(),
        other => other.to_string(),
    }
}

/// Reads every card NVML lists. See the module docs.
pub struct NvmlProbe {
    nvml: &'static Nvml,
    /// Critical XID events of the cards that support them; `None` when none does.
    events: Option<EventSet<'static>>,
    /// Card index → whether it reports XIDs.
    xid_capable: Vec<bool>,
    /// Card index → last XID seen (0 = none yet).
    last_xid: HashMap<u32, u64>,
    /// Card index → the previous cycle's GPM sample (GPM metrics compare two samples). A card
    /// without GPM (before Hopper, or inside a container without the capability) has none.
    gpm: HashMap<u32, GpmSample<'static>>,
    /// Cards whose GPM query failed once: not asked again.
    gpm_unsupported: Vec<bool>,
}

impl std::fmt::Debug for NvmlProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlProbe")
            .field("xid_capable", &self.xid_capable)
            .field("last_xid", &self.last_xid)
            .finish()
    }
}

impl NvmlProbe {
    /// Initialises NVML and registers for critical XID events where the cards support them.
    ///
    /// # Errors
    /// [`ProbeError::Unavailable`] when NVML cannot start or lists no device query.
    pub fn new() -> Result<Self, ProbeError> {
        let nvml = nvml()?;
        let count = nvml
            .device_count()
            .map_err(|e| ProbeError::Unavailable(format!("device count: {e}")))?;
        let mut xid_capable = vec![false; count as usize];
        let mut events = nvml.create_event_set().ok();
        for i in 0..count {
            let Ok(dev) = nvml.device_by_index(i) else {
                continue;
            };
            let supported = dev
                .supported_event_types()
                .map(|t| t.contains(EventTypes::CRITICAL_XID_ERROR))
                .unwrap_or(false);
            if !supported {
                continue;
            }
            if let Some(set) = events.take() {
                match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                    Ok(set) => {
                        events = Some(set);
                        xid_capable[i as usize] = true;
                    }
                    Err(e) => {
                        // The wrapper released the set; start a fresh one for the other cards.
                        tracing::debug!(gpu = i, error = %e, "cannot watch XID events");
                        events = nvml.create_event_set().ok();
                    }
                }
            }
        }
        Ok(Self {
            nvml,
            events,
            xid_capable,
            last_xid: HashMap::new(),
            gpm: HashMap::new(),
            gpm_unsupported: vec![false; count as usize],
        })
    }

    /// `(graphics engine active, any tensor pipe active)` as 0–1 ratios over the time since the
    /// previous cycle's GPM sample of card `i`; `(None, None)` on the first cycle and on cards
    /// without GPM.
    fn gpm_ratios(
        &mut self,
        i: u32,
        dev: &nvml_wrapper::Device<'static>,
    ) -> (Option<f64>, Option<f64>) {
        let idx = i as usize;
        if self.gpm_unsupported.get(idx).copied().unwrap_or(true) {
            return (None, None);
        }
        let sample = match dev.gpm_sample() {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(gpu = i, error = %e, "no GPM on this card: DCGM_FI_PROF_* not exported");
                self.gpm_unsupported[idx] = true;
                return (None, None);
            }
        };
        let Some(prev) = self.gpm.insert(i, sample) else {
            return (None, None);
        };
        let now = &self.gpm[&i];
        let got = nvml_wrapper::gpm::gpm_metrics_get(
            self.nvml,
            &prev,
            now,
            &[GpmMetricId::GraphicsUtil, GpmMetricId::AnyTensorUtil],
        );
        let _ = prev.free();
        match got {
            Ok(r) => {
                let ratio = |k: usize| {
                    r.get(k)
                        .and_then(|m| m.as_ref().ok())
                        .map(|m| (m.value / 100.0).clamp(0.0, 1.0))
                };
                (ratio(0), ratio(1))
            }
            Err(e) => {
                tracing::debug!(gpu = i, error = %e, "GPM metrics failed");
                (None, None)
            }
        }
    }

    /// Drains pending XID events without waiting.
    fn drain_xids(&mut self) {
        let Some(set) = &self.events else { return };
        for _ in 0..64 {
            match set.wait(0) {
                Ok(ev) => {
                    if let (Ok(idx), Some(XidError::Value(xid))) =
                        (ev.device.index(), ev.event_data)
                    {
                        tracing::warn!(gpu = idx, xid, "GPU reported a critical XID error");
                        self.last_xid.insert(idx, xid);
                    }
                }
                Err(_) => break, // Timeout: nothing pending.
            }
        }
    }
}

fn proc_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

impl GpuProbe for NvmlProbe {
    fn kind(&self) -> ProbeKind {
        ProbeKind::Nvml
    }

    fn sample(&mut self, _engines: &[EngineReport]) -> Result<Vec<GpuSample>, ProbeError> {
        self.drain_xids();
        let count = self
            .nvml
            .device_count()
            .map_err(|e| ProbeError::Query(format!("device count: {e}")))?;
        let mut out = Vec::with_capacity(count as usize);
        for i in 0..count {
            let dev = self
                .nvml
                .device_by_index(i)
                .map_err(|e| ProbeError::Query(format!("device {i}: {e}")))?;
            let mem = dev
                .memory_info()
                .map_err(|e| ProbeError::Query(format!("device {i} memory: {e}")))?;
            let util = dev.utilization_rates().ok();
            let processes = dev
                .running_compute_processes()
                .unwrap_or_default()
                .into_iter()
                .filter_map(|p| match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(ProcessVram {
                        pid: p.pid,
                        name: proc_name(p.pid),
                        used_bytes: bytes,
                    }),
                    UsedGpuMemory::Unavailable => None,
                })
                .collect();
            let ecc = |kind| dev.total_ecc_errors(kind, EccCounter::Volatile).ok();
            let sm_clock_mhz = dev.clock_info(Clock::SM).ok().map(f64::from);
            let (gr_engine_active_ratio, tensor_active_ratio) = self.gpm_ratios(i, &dev);
            out.push(GpuSample {
                stats: GpuStats {
                    index: dev.index().unwrap_or(i),
                    uuid: dev.uuid().unwrap_or_default(),
                    name: dev.name().unwrap_or_default(),
                    memory_total_bytes: mem.total,
                    memory_used_bytes: mem.used,
                    memory_reserved_bytes: mem.reserved,
                    gpu_util_ratio: util.as_ref().map_or(0.0, |u| f64::from(u.gpu) / 100.0),
                    mem_util_ratio: util.as_ref().map_or(0.0, |u| f64::from(u.memory) / 100.0),
                    temperature_c: dev
                        .temperature(TemperatureSensor::Gpu)
                        .map_or(0.0, f64::from),
                    power_w: dev.power_usage().map_or(0.0, |mw| f64::from(mw) / 1000.0),
                },
                memory_free_bytes: mem.free,
                last_xid: self
                    .xid_capable
                    .get(i as usize)
                    .copied()
                    .unwrap_or(false)
                    .then(|| self.last_xid.get(&i).copied().unwrap_or(0)),
                ecc_sbe_volatile: ecc(MemoryError::Corrected),
                ecc_dbe_volatile: ecc(MemoryError::Uncorrected),
                processes,
                sm_clock_mhz,
                gr_engine_active_ratio,
                tensor_active_ratio,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real NVML path on whatever machine runs the tests. Where libnvidia-ml is absent (CI,
    /// the dev machines) this must be a clean `Unavailable` error that names the library — no
    /// panic; where a GPU exists it must list the cards with sane memory figures.
    #[test]
    fn real_nvml_path_is_unavailable_without_the_library_or_reads_real_cards() {
        match NvmlProbe::new() {
            Err(ProbeError::Unavailable(reason)) => {
                assert!(!reason.is_empty());
                let lib_present = [
                    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so",
                    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                    "/usr/lib64/libnvidia-ml.so",
                ]
                .iter()
                .any(|p| std::path::Path::new(p).exists());
                if !lib_present {
                    assert!(
                        reason.contains("libnvidia-ml"),
                        "the reason names the missing library: {reason}"
                    );
                }
                // A second attempt is just as clean (the agent retries).
                assert!(matches!(NvmlProbe::new(), Err(ProbeError::Unavailable(_))));
            }
            Err(other) => panic!("unexpected probe error kind: {other}"),
            Ok(mut probe) => {
                let gpus = probe.sample(&[]).expect("NVML is up, sampling must work");
                for g in &gpus {
                    assert!(g.stats.memory_total_bytes > 0, "{g:?}");
                    assert!(
                        g.stats.memory_used_bytes <= g.stats.memory_total_bytes,
                        "{g:?}"
                    );
                    assert!(g.stats.uuid.starts_with("GPU-"), "{g:?}");
                }
            }
        }
    }
}
