//! A simulated GPU probe whose figures follow the engines on the host.
//!
//! Engine `j` is placed on GPU `j mod N`. For each GPU:
//!
//! ```text
//! used   = reserved + Σ engines on it ( context + weights + blocks_used × sim_bytes_per_block )
//! sim_bytes_per_block = kv_pool / num_blocks_total     (kv_pool: the engine's share of
//!                       kv_pool_ratio × total − reserved − contexts − weights, the way vLLM sizes
//!                       its pool from gpu_memory_utilization)
//! util   = 0 when nothing runs, else min(1, 0.35 + 0.65 × running / max_num_seqs) summed, ≤ 1
//! SM clock = 345 + (1980 − 345) × util MHz;  GR engine active = util;  tensor active = 0.4 × util
//! ```
//!
//! So VRAM moves with the KV blocks in use: an engine at 100% KV usage puts its GPU near
//! `kv_pool_ratio` (0.9), and the 75% watermark (docs/REQUIREMENTS.md R2.2) is crossed at
//! roughly 83% KV usage. A real card under vLLM shows the whole pool as used from start-up; that
//! is why the control plane takes KV usage from the engines and VRAM from NVML, and why this probe
//! says it is simulated.

use super::{GpuProbe, GpuSample, ProbeError, ProbeKind};
use crate::engine::EngineReport;
use brownout_protocol::GpuStats;

const MIB: u64 = 1024 * 1024;

/// What the simulated cards look like.
#[derive(Debug, Clone, PartialEq)]
pub struct SimulatedGpuSpec {
    pub num_gpus: u32,
    /// Seeds the UUIDs so that they are stable per host.
    pub host: String,
    /// NVML's name; shown as `modelName`.
    pub name: String,
    pub memory_total_bytes: u64,
    pub memory_reserved_bytes: u64,
    /// CUDA context per engine process.
    pub context_bytes: u64,
    /// Model weights per engine when `/debug/kv` does not say.
    pub default_weights_bytes: u64,
    /// Fraction of the card an engine's KV pool and weights may fill (vLLM's
    /// `gpu_memory_utilization`).
    pub kv_pool_ratio: f64,
    /// Batch size at which utilisation saturates when `/debug/kv` does not say.
    pub default_max_num_seqs: u32,
    pub idle_power_w: f64,
    pub max_power_w: f64,
}

impl SimulatedGpuSpec {
    /// An H100 80GB SXM-like card (NVML reports 81559 MiB total on those).
    pub fn h100(num_gpus: u32, host: &str) -> Self {
        Self {
            num_gpus,
            host: host.to_string(),
            name: "NVIDIA H100 80GB HBM3".to_string(),
            memory_total_bytes: 81_559 * MIB,
            memory_reserved_bytes: 531 * MIB,
            context_bytes: 512 * MIB,
            default_weights_bytes: 16 * 1024 * MIB,
            kv_pool_ratio: 0.9,
            default_max_num_seqs: 32,
            idle_power_w: 70.0,
            max_power_w: 700.0,
        }
    }
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct SimulatedProbe {
    spec: SimulatedGpuSpec,
    uuids: Vec<String>,
}

/// A stable, UUID-shaped id from the host name and index (FNV-1a; not random, so dashboards keep
/// their series across restarts).
fn sim_uuid(host: &str, index: u32) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in host.as_bytes().iter().chain(&index.to_le_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!(
        "GPU-5140a7ed-{:04x}-{:04x}-{:04x}-{:012x}",
        (h >> 48) & 0xffff,
        (h >> 32) & 0xffff,
        index & 0xffff,
        h & 0xffff_ffff_ffff
    )
}

impl SimulatedProbe {
    pub fn new(spec: SimulatedGpuSpec) -> Self {
        let uuids = (0..spec.num_gpus)
            .map(|i| sim_uuid(&spec.host, i))
            .collect();
        Self { spec, uuids }
    }

    pub fn spec(&self) -> &SimulatedGpuSpec {
        &self.spec
    }

    /// The figures of one GPU given the engines placed on it.
    fn gpu(&self, index: u32, engines: &[&EngineReport]) -> GpuSample {
        let s = &self.spec;
        let total = s.memory_total_bytes;
        let mut used = s.memory_reserved_bytes;
        let mut util: f64 = 0.0;
        if !engines.is_empty() {
            let n = engines.len() as u64;
            let budget = (s.kv_pool_ratio * total as f64) as u64;
            for e in engines {
                let weights = e.model_weights_bytes.unwrap_or(s.default_weights_bytes);
                let fixed = s.context_bytes + weights;
                // The engine's share of what the pool may fill, after the fixed parts.
                let pool = (budget / n).saturating_sub(fixed + s.memory_reserved_bytes / n);
                let kv = &e.stats.kv;
                let kv_bytes = match pool.checked_div(kv.num_blocks_total) {
                    Some(per_block) => kv.num_blocks_used.min(kv.num_blocks_total) * per_block,
                    None => (kv.usage_ratio.clamp(0.0, 1.0) * pool as f64) as u64,
                };
                used += if e.stats.up { fixed + kv_bytes } else { fixed };
                let running = e.stats.num_requests_running as f64;
                if e.stats.up && running > 0.0 {
                    let sat = f64::from(e.max_num_seqs.unwrap_or(s.default_max_num_seqs).max(1));
                    util += (0.35 + 0.65 * running / sat).min(1.0);
                }
            }
        }
        let used = used.min(total);
        let util = util.clamp(0.0, 1.0);
        GpuSample {
            stats: GpuStats {
                index,
                uuid: self.uuids[index as usize].clone(),
                name: s.name.clone(),
                memory_total_bytes: total,
                memory_used_bytes: used,
                memory_reserved_bytes: s.memory_reserved_bytes,
                gpu_util_ratio: util,
                mem_util_ratio: (0.6 * util).min(1.0),
                temperature_c: (32.0 + 50.0 * util).round(),
                power_w: (s.idle_power_w + (s.max_power_w - s.idle_power_w) * util).round(),
            },
            memory_free_bytes: total - used,
            last_xid: Some(0),
            ecc_sbe_volatile: Some(0),
            ecc_dbe_volatile: Some(0),
            processes: Vec::new(),
            // An H100 SXM idles near 345 MHz and boosts to 1980 MHz under load.
            sm_clock_mhz: Some((345.0 + (1980.0 - 345.0) * util).round()),
            gr_engine_active_ratio: Some(util),
            // Decoding is mostly GEMV: tensor pipes are busy for part of the engine's time.
            tensor_active_ratio: Some(0.4 * util),
        }
    }
}

impl GpuProbe for SimulatedProbe {
    fn kind(&self) -> ProbeKind {
        ProbeKind::Simulated
    }

    fn sample(&mut self, engines: &[EngineReport]) -> Result<Vec<GpuSample>, ProbeError> {
        let n = self.spec.num_gpus;
        let mut per_gpu: Vec<Vec<&EngineReport>> = vec![Vec::new(); n as usize];
        for (j, e) in engines.iter().enumerate() {
            per_gpu[j % n as usize].push(e);
        }
        Ok(per_gpu
            .iter()
            .enumerate()
            .map(|(i, es)| self.gpu(i as u32, es))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use brownout_protocol::{EngineStats, KvStats};

    fn engine(used: u64, total: u64, running: u64, up: bool) -> EngineReport {
        EngineReport {
            stats: EngineStats {
                up,
                kv: KvStats {
                    num_blocks_total: total,
                    num_blocks_used: used,
                    usage_ratio: used as f64 / total.max(1) as f64,
                    ..Default::default()
                },
                num_requests_running: running,
                ..Default::default()
            },
            model_weights_bytes: Some(16 * 1024 * MIB),
            max_num_seqs: Some(32),
            ..Default::default()
        }
    }

    #[test]
    fn vram_follows_kv_blocks_in_use() {
        // (blocks used of 1000, expected VRAM ratio band, expected watermark crossing)
        let cases = [
            (0u64, 0.20, 0.22, false),
            (500, 0.55, 0.57, false),
            (800, 0.76, 0.78, true),
            (1000, 0.89, 0.90, true),
        ];
        let mut probe = SimulatedProbe::new(SimulatedGpuSpec::h100(1, "h"));
        for (used, lo, hi, over) in cases {
            let g = &probe.sample(&[engine(used, 1000, 0, true)]).unwrap()[0];
            let r = g.stats.vram_used_ratio();
            assert!(
                (lo..=hi).contains(&r),
                "{used} blocks: ratio {r} not in {lo}..{hi}"
            );
            assert_eq!(r > 0.75, over, "{used} blocks: watermark");
            assert_eq!(
                g.memory_free_bytes + g.stats.memory_used_bytes,
                g.stats.memory_total_bytes
            );
        }
    }

    #[test]
    fn utilisation_follows_running_requests_and_saturates() {
        let mut probe = SimulatedProbe::new(SimulatedGpuSpec::h100(1, "h"));
        let util = |p: &mut SimulatedProbe, running| {
            p.sample(&[engine(0, 10, running, true)]).unwrap()[0]
                .stats
                .gpu_util_ratio
        };
        assert_eq!(util(&mut probe, 0), 0.0);
        let (u1, u16, u32, u64) = (
            util(&mut probe, 1),
            util(&mut probe, 16),
            util(&mut probe, 32),
            util(&mut probe, 64),
        );
        assert!(u1 > 0.3 && u1 < u16 && u16 < u32, "{u1} {u16} {u32}");
        assert_eq!((u32, u64), (1.0, 1.0));
    }

    #[test]
    fn engines_are_spread_round_robin_and_idle_gpus_stay_idle() {
        let mut probe = SimulatedProbe::new(SimulatedGpuSpec::h100(3, "h"));
        let gpus = probe
            .sample(&[engine(900, 1000, 8, true), engine(100, 1000, 0, true)])
            .unwrap();
        assert_eq!(gpus.len(), 3);
        assert!(gpus[0].stats.vram_used_ratio() > gpus[1].stats.vram_used_ratio());
        assert!(gpus[0].stats.gpu_util_ratio > 0.0 && gpus[1].stats.gpu_util_ratio == 0.0);
        assert_eq!(
            gpus[2].stats.memory_used_bytes,
            gpus[2].stats.memory_reserved_bytes
        );
        let ids: std::collections::HashSet<_> = gpus.iter().map(|g| g.stats.uuid.clone()).collect();
        assert_eq!(ids.len(), 3, "distinct UUIDs");
        assert_eq!(
            SimulatedProbe::new(SimulatedGpuSpec::h100(3, "h")).uuids,
            probe.uuids,
            "stable per host"
        );
    }

    #[test]
    fn a_down_engine_keeps_its_weights_but_no_kv() {
        let mut probe = SimulatedProbe::new(SimulatedGpuSpec::h100(1, "h"));
        let up = probe.sample(&[engine(900, 1000, 4, true)]).unwrap()[0]
            .stats
            .clone();
        let down = probe.sample(&[engine(900, 1000, 4, false)]).unwrap()[0]
            .stats
            .clone();
        assert!(down.memory_used_bytes < up.memory_used_bytes);
        assert!(down.memory_used_bytes > 16 * 1024 * MIB);
        assert_eq!(down.gpu_util_ratio, 0.0);
    }
}
