//! The policy as written: serde structs (`deny_unknown_fields`) with their defaults, before
//! [`super::validate`] checks them into a [`super::Policy`].

use serde::Deserialize;

use super::{PolicyError, invalid};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicy {
    #[serde(default = "default_eval_ms")]
    pub(super) evaluate_interval_ms: u64,
    #[serde(default = "default_lease_ms")]
    pub(super) command_lease_ms: u64,
    #[serde(default = "default_stale_ms")]
    pub(super) snapshot_stale_ms: u64,
    #[serde(default = "default_history")]
    pub(super) decision_history: usize,
    #[serde(default = "default_trend_window")]
    pub(super) trend_window_secs: u64,
    #[serde(default)]
    pub(super) dry_run: bool,
    pub(super) features: Vec<RawFeature>,
    pub(super) tiers: RawTiers,
    /// Loop kills and tool breakers (docs/AGENTS.md); defaulted when absent.
    #[serde(default)]
    pub(super) agents: Option<crate::agents::policy::RawAgents>,
    #[serde(default)]
    pub(super) instances: Option<RawInstances>,
    #[serde(default)]
    pub(super) admission_ramp: Option<RawRamp>,
    #[serde(default)]
    pub(super) recovery_storm: Option<RawStorm>,
    /// The declared capacity, requests/s over all engines (docs/DEGRADATION.md).
    #[serde(default)]
    pub(super) capacity_rps: Option<f64>,
    /// The declared capacity of the T2 route (fallback model, capped max_tokens), requests/s.
    #[serde(default)]
    pub(super) fallback_capacity_rps: Option<f64>,
    /// A tier steps down only when the demand is below this share of what the tier below
    /// serves.
    #[serde(default)]
    pub(super) exit_demand_ratio: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawInstances {
    pub(super) kv_usage: RawInstanceKv,
    #[serde(default = "default_max_num_seqs")]
    pub(super) default_max_num_seqs: u32,
    #[serde(default = "default_forget")]
    pub(super) forget_after_secs: u64,
}

pub(super) fn default_max_num_seqs() -> u32 {
    256
}
pub(super) fn default_forget() -> u64 {
    600
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawInstanceKv {
    pub(super) watch_above_ratio: f64,
    pub(super) watch_for_secs: u64,
    pub(super) halve_above_ratio: f64,
    pub(super) halve_for_secs: u64,
    pub(super) drain_after_secs: u64,
    pub(super) exit_below_ratio: f64,
    pub(super) hold_down_secs: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRamp {
    #[serde(default = "default_ramp_start")]
    pub(super) start_ratio: f64,
    #[serde(default = "default_ramp_step")]
    pub(super) step_ratio: f64,
    #[serde(default = "default_ramp_interval")]
    pub(super) step_interval_secs: u64,
    #[serde(default = "default_capacity_window")]
    pub(super) capacity_window_secs: u64,
    #[serde(default = "default_min_capacity")]
    pub(super) min_capacity_rps: f64,
}

pub(super) fn default_ramp_start() -> f64 {
    0.7
}
pub(super) fn default_ramp_step() -> f64 {
    0.1
}
pub(super) fn default_ramp_interval() -> u64 {
    10
}
pub(super) fn default_capacity_window() -> u64 {
    300
}
pub(super) fn default_min_capacity() -> f64 {
    1.0
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStorm {
    #[serde(default = "default_periods")]
    pub(super) periods_secs: Vec<u64>,
    #[serde(default = "default_storm_window")]
    pub(super) window_secs: u64,
    #[serde(default = "default_min_acf")]
    pub(super) min_autocorrelation: f64,
    #[serde(default = "default_min_rate")]
    pub(super) min_rate_rps: f64,
    #[serde(default = "default_storm_after")]
    pub(super) watch_after_t3_secs: u64,
    #[serde(default)]
    pub(super) min_for_secs_after_t3: u64,
}

pub(super) fn default_periods() -> Vec<u64> {
    vec![8, 16]
}
pub(super) fn default_storm_window() -> u64 {
    64
}
pub(super) fn default_min_acf() -> f64 {
    0.5
}
pub(super) fn default_min_rate() -> f64 {
    1.0
}
pub(super) fn default_storm_after() -> u64 {
    300
}

pub(super) fn default_eval_ms() -> u64 {
    1000
}
pub(super) fn default_lease_ms() -> u64 {
    30_000
}
pub(super) fn default_stale_ms() -> u64 {
    10_000
}
pub(super) fn default_history() -> usize {
    256
}
pub(super) fn default_trend_window() -> u64 {
    60
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFeature {
    pub(super) name: String,
    pub(super) criticality: String,
    #[serde(default)]
    pub(super) disable_at_tier: Option<u8>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTiers {
    pub(super) t1: RawTier,
    pub(super) t2: RawTier,
    pub(super) t3: RawTier,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTier {
    pub(super) hold_down_secs: u64,
    #[serde(default)]
    pub(super) enter: Vec<RawCondition>,
    #[serde(default)]
    pub(super) params: Option<serde_yaml::Value>,
}

/// One condition, written as a single-key map (`- gpu_util: {...}`). serde_yaml 0.9 reads
/// enums only from YAML tags, so this is a struct of options checked to hold exactly one.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCondition {
    pub(super) gpu_util: Option<RawRatio>,
    pub(super) kv_usage: Option<RawRatio>,
    pub(super) vram: Option<RawRatio>,
    pub(super) queue_depth: Option<RawCount>,
    pub(super) slo_alert: Option<RawSloAlert>,
    pub(super) alertmanager: Option<RawAlert>,
    pub(super) new_pattern: Option<RawPattern>,
    pub(super) ttft_p99: Option<RawSecs>,
    pub(super) queue_wait_p99: Option<RawSecs>,
    pub(super) p99_jump: Option<RawJump>,
    pub(super) demand_ratio: Option<RawLevel>,
    pub(super) fallback_demand_ratio: Option<RawLevel>,
    pub(super) expected_wait: Option<RawSecs>,
}

pub(super) enum OneCondition {
    GpuUtil(RawRatio),
    KvUsage(RawRatio),
    Vram(RawRatio),
    QueueDepth(RawCount),
    SloAlert(RawSloAlert),
    Alertmanager(RawAlert),
    NewPattern(RawPattern),
    TtftP99(RawSecs),
    QueueWaitP99(RawSecs),
    Jump(RawJump),
    Demand(RawLevel),
    FallbackDemand(RawLevel),
    ExpectedWait(RawSecs),
}

impl RawCondition {
    pub(super) fn one(self, field: &str) -> Result<OneCondition, PolicyError> {
        let mut v = Vec::new();
        if let Some(x) = self.gpu_util {
            v.push(OneCondition::GpuUtil(x));
        }
        if let Some(x) = self.kv_usage {
            v.push(OneCondition::KvUsage(x));
        }
        if let Some(x) = self.vram {
            v.push(OneCondition::Vram(x));
        }
        if let Some(x) = self.queue_depth {
            v.push(OneCondition::QueueDepth(x));
        }
        if let Some(x) = self.slo_alert {
            v.push(OneCondition::SloAlert(x));
        }
        if let Some(x) = self.alertmanager {
            v.push(OneCondition::Alertmanager(x));
        }
        if let Some(x) = self.new_pattern {
            v.push(OneCondition::NewPattern(x));
        }
        if let Some(x) = self.ttft_p99 {
            v.push(OneCondition::TtftP99(x));
        }
        if let Some(x) = self.queue_wait_p99 {
            v.push(OneCondition::QueueWaitP99(x));
        }
        if let Some(x) = self.p99_jump {
            v.push(OneCondition::Jump(x));
        }
        if let Some(x) = self.demand_ratio {
            v.push(OneCondition::Demand(x));
        }
        if let Some(x) = self.fallback_demand_ratio {
            v.push(OneCondition::FallbackDemand(x));
        }
        if let Some(x) = self.expected_wait {
            v.push(OneCondition::ExpectedWait(x));
        }
        if v.len() != 1 {
            return Err(invalid(
                field,
                "must hold exactly one of gpu_util, kv_usage, vram, queue_depth, slo_alert, alertmanager, new_pattern, ttft_p99, queue_wait_p99, p99_jump, demand_ratio, fallback_demand_ratio, expected_wait",
            ));
        }
        Ok(v.remove(0))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRatio {
    pub(super) above_ratio: f64,
    pub(super) exit_below_ratio: f64,
    #[serde(default)]
    pub(super) for_secs: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCount {
    pub(super) above: u64,
    pub(super) exit_below: u64,
    #[serde(default)]
    pub(super) for_secs: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSecs {
    pub(super) above_secs: f64,
    pub(super) exit_below_secs: f64,
    #[serde(default)]
    pub(super) for_secs: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLevel {
    pub(super) above: f64,
    pub(super) exit_below: f64,
    #[serde(default)]
    pub(super) for_secs: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJump {
    pub(super) signal: String,
    #[serde(default = "default_factor")]
    pub(super) factor: f64,
    pub(super) window_secs: u64,
    pub(super) min_secs: f64,
}

pub(super) fn default_factor() -> f64 {
    2.0
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSloAlert {
    pub(super) slo: String,
    pub(super) severity: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAlert {
    pub(super) alertname: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPattern {
    pub(super) above_per_min: f64,
    pub(super) exit_below_per_min: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawT2Params {
    #[serde(default = "default_route")]
    pub(super) model_route: String,
    pub(super) max_tokens_cap: u32,
    pub(super) max_num_seqs: u32,
}

pub(super) fn default_route() -> String {
    "fallback".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawT3Params {
    #[serde(default = "default_admit")]
    pub(super) admit_min_criticality: String,
    pub(super) retry_after_base_secs: u32,
    pub(super) jitter_ratio: f64,
    pub(super) recovery_eta_max_secs: u64,
    /// Shed only the excess: admit non-critical traffic up to this share of the T2 route's
    /// capacity.
    #[serde(default)]
    pub(super) admit_capacity_ratio: Option<f64>,
}

pub(super) fn default_admit() -> String {
    "critical".into()
}
