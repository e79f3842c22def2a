//! The gpu-agent snapshot (gpu-agent → `POST /v1/agents/snapshot`, every second).

use serde::{Deserialize, Serialize};

/// One GPU as NVML (or the simulated probe) reports it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct GpuStats {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_total_bytes: u64,
    pub memory_used_bytes: u64,
    /// Reserved by the driver/firmware (NVML `reserved`).
    #[serde(default)]
    pub memory_reserved_bytes: u64,
    /// 0–1.
    pub gpu_util_ratio: f64,
    /// 0–1 (memory-copy utilisation).
    #[serde(default)]
    pub mem_util_ratio: f64,
    #[serde(default)]
    pub temperature_c: f64,
    #[serde(default)]
    pub power_w: f64,
}

impl GpuStats {
    /// Used over total, 0 when total is unknown (the watermark is 0.75: docs/REQUIREMENTS.md R2.2).
    pub fn vram_used_ratio(&self) -> f64 {
        if self.memory_total_bytes == 0 {
            0.0
        } else {
            self.memory_used_bytes as f64 / self.memory_total_bytes as f64
        }
    }
}

/// KV-cache figures over physical blocks (docs/ARCHITECTURE.md §5). `B` block size, `N` usable
/// blocks, `A` blocks in use.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct KvStats {
    pub block_size: u32,
    pub num_blocks_total: u64,
    pub num_blocks_used: u64,
    /// `A / N` (vLLM's `kv_cache_usage_perc`, a 0–1 ratio despite the name).
    pub usage_ratio: f64,
    /// Slack in each sequence's last block over `A·B`.
    pub internal_fragmentation_ratio: f64,
    /// Whole blocks allocated ahead of tokens over `A·B`.
    pub reserved_unused_ratio: f64,
    /// `1 −` the two above.
    pub token_occupancy_ratio: f64,
    /// `1 − largest_free_run / free_blocks` (0 for paging by construction).
    pub external_fragmentation_ratio: f64,
}

/// One serving engine on the host, as scraped by the agent.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct EngineStats {
    /// Stable id (the agent's name for it, e.g. `engine-0`).
    pub id: String,
    pub url: String,
    pub model: String,
    /// False when the last scrape failed.
    pub up: bool,
    pub kv: KvStats,
    pub num_requests_running: u64,
    pub num_requests_waiting: u64,
    pub num_preemptions_total: u64,
    /// Current tier the engine has applied.
    #[serde(default)]
    pub tier: u8,
    #[serde(default)]
    pub ttft_p50_s: f64,
    #[serde(default)]
    pub ttft_p99_s: f64,
    /// p99 of the time requests waited in the engine's queue over the agent's window (vLLM's
    /// `vllm:request_queue_time_seconds`; 0 when the engine does not export it).
    #[serde(default)]
    pub queue_wait_p99_s: f64,
    /// The serving tier's `--instance-id` (the key of the command's `instances`), when the
    /// engine reports it (the bundled tier's `/debug/kv`). Empty: the control plane addresses
    /// the engine as `<host>/<id>` (see [`AgentSnapshot::instance_key`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instance_id: String,
    /// The engine's configured `max_num_seqs` (before any command lowers it), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configured_max_num_seqs: Option<u32>,
    /// Requests answered since the engine started (finished or refused; the bundled tier's
    /// `brownout_serving_requests_total`, else the count of `vllm:e2e_request_latency_seconds`).
    /// The control plane differentiates it into the arrival rate.
    #[serde(default)]
    pub requests_answered_total: u64,
    /// Requests completed by the engine since it started (the count of
    /// `vllm:e2e_request_latency_seconds`): differentiated into the measured capacity.
    #[serde(default)]
    pub requests_completed_total: u64,
    /// Requests counted on arrival at the engine's admission gate, retries included (the
    /// bundled tier's `brownout_serving_arrivals_total`); `None` when the engine does not
    /// export it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_arrived_total: Option<u64>,
    /// The same, first attempts only (`attempt="first"`: no `x-brownout-attempt` above 1): the
    /// offered load without the clients' retries, which the demand signal reads when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_first_arrived_total: Option<u64>,
}

/// What one agent reports each interval.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AgentSnapshot {
    pub host: String,
    pub ts_ms: u64,
    /// True when the GPU figures come from the simulated probe.
    #[serde(default)]
    pub simulated: bool,
    /// False when the GPU probe could not start (no NVML): `gpus` is then empty.
    #[serde(default)]
    pub probe_up: bool,
    #[serde(default)]
    pub gpus: Vec<GpuStats>,
    #[serde(default)]
    pub engines: Vec<EngineStats>,
}

impl AgentSnapshot {
    /// The highest VRAM used ratio over this host's GPUs.
    pub fn max_vram_ratio(&self) -> f64 {
        self.gpus
            .iter()
            .map(GpuStats::vram_used_ratio)
            .fold(0.0, f64::max)
    }
    /// The highest GPU utilisation over this host's GPUs.
    pub fn max_gpu_util(&self) -> f64 {
        self.gpus
            .iter()
            .map(|g| g.gpu_util_ratio)
            .fold(0.0, f64::max)
    }
    /// The highest KV usage over this host's engines that are up.
    pub fn max_kv_usage(&self) -> f64 {
        self.engines
            .iter()
            .filter(|e| e.up)
            .map(|e| e.kv.usage_ratio)
            .fold(0.0, f64::max)
    }
    /// The id the control plane addresses `engine` by in a command's `instances`: the serving
    /// tier's own `--instance-id` when the agent learned it, else `<host>/<engine id>` (so a
    /// serving tier started with `--instance-id <host>/<engine id>` matches either way).
    pub fn instance_key(&self, engine: &EngineStats) -> String {
        if engine.instance_id.is_empty() {
            format!("{}/{}", self.host, engine.id)
        } else {
            engine.instance_id.clone()
        }
    }

    /// Total waiting requests over engines.
    pub fn queue_depth(&self) -> u64 {
        self.engines.iter().map(|e| e.num_requests_waiting).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_round_trips_and_aggregates() {
        let s = AgentSnapshot {
            host: "gpu-1".into(),
            ts_ms: 1,
            simulated: true,
            probe_up: true,
            gpus: vec![
                GpuStats {
                    index: 0,
                    memory_total_bytes: 100,
                    memory_used_bytes: 80,
                    gpu_util_ratio: 0.5,
                    ..Default::default()
                },
                GpuStats {
                    index: 1,
                    memory_total_bytes: 100,
                    memory_used_bytes: 10,
                    gpu_util_ratio: 0.99,
                    ..Default::default()
                },
            ],
            engines: vec![
                EngineStats {
                    id: "e0".into(),
                    up: true,
                    kv: KvStats {
                        usage_ratio: 0.9,
                        ..Default::default()
                    },
                    num_requests_waiting: 3,
                    ..Default::default()
                },
                EngineStats {
                    id: "e1".into(),
                    up: false,
                    kv: KvStats {
                        usage_ratio: 1.0,
                        ..Default::default()
                    },
                    num_requests_waiting: 4,
                    ..Default::default()
                },
            ],
        };
        let back: AgentSnapshot =
            serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert!((s.max_vram_ratio() - 0.8).abs() < 1e-12);
        assert!((s.max_gpu_util() - 0.99).abs() < 1e-12);
        assert!(
            (s.max_kv_usage() - 0.9).abs() < 1e-12,
            "down engines are ignored"
        );
        assert_eq!(s.queue_depth(), 7);
    }
}
