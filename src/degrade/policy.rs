//! The degradation policy: which features go dark at which tier, what raises each tier, what lets
//! it fall back, and the tier-2 / tier-3 parameters.
//!
//! The YAML is parsed into raw serde structs (`deny_unknown_fields`) and validated into typed
//! values ([`Policy`]). Every error names the field and the reason. `docs/DEGRADATION.md`
//! describes the format; `examples/policy.yaml` is parsed by a test.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use brownout_protocol::{Criticality, Tier};
use serde::Deserialize;

/// Why a policy was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("cannot read policy file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("policy YAML is invalid: {0}")]
    Yaml(#[from] serde_yaml::Error),
    #[error("policy field `{field}` is invalid: {reason}")]
    Invalid { field: String, reason: String },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> PolicyError {
    PolicyError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

// ---------------------------------------------------------------------------------------------
// Raw (as written)
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default = "default_eval_ms")]
    evaluate_interval_ms: u64,
    #[serde(default = "default_lease_ms")]
    command_lease_ms: u64,
    #[serde(default = "default_stale_ms")]
    snapshot_stale_ms: u64,
    #[serde(default = "default_history")]
    decision_history: usize,
    #[serde(default = "default_trend_window")]
    trend_window_secs: u64,
    #[serde(default)]
    dry_run: bool,
    features: Vec<RawFeature>,
    tiers: RawTiers,
    /// Loop kills and tool breakers (docs/AGENTS.md); defaulted when absent.
    #[serde(default)]
    agents: Option<crate::agents::policy::RawAgents>,
    #[serde(default)]
    instances: Option<RawInstances>,
    #[serde(default)]
    admission_ramp: Option<RawRamp>,
    #[serde(default)]
    recovery_storm: Option<RawStorm>,
    /// The declared capacity, requests/s over all engines (docs/DEGRADATION.md).
    #[serde(default)]
    capacity_rps: Option<f64>,
    /// The declared capacity of the T2 route (fallback model, capped max_tokens), requests/s.
    #[serde(default)]
    fallback_capacity_rps: Option<f64>,
    /// A tier steps down only when the demand is below this share of what the tier below
    /// serves.
    #[serde(default)]
    exit_demand_ratio: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInstances {
    kv_usage: RawInstanceKv,
    #[serde(default = "default_max_num_seqs")]
    default_max_num_seqs: u32,
    #[serde(default = "default_forget")]
    forget_after_secs: u64,
}

fn default_max_num_seqs() -> u32 {
    256
}
fn default_forget() -> u64 {
    600
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInstanceKv {
    watch_above_ratio: f64,
    watch_for_secs: u64,
    halve_above_ratio: f64,
    halve_for_secs: u64,
    drain_after_secs: u64,
    exit_below_ratio: f64,
    hold_down_secs: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRamp {
    #[serde(default = "default_ramp_start")]
    start_ratio: f64,
    #[serde(default = "default_ramp_step")]
    step_ratio: f64,
    #[serde(default = "default_ramp_interval")]
    step_interval_secs: u64,
    #[serde(default = "default_capacity_window")]
    capacity_window_secs: u64,
    #[serde(default = "default_min_capacity")]
    min_capacity_rps: f64,
}

fn default_ramp_start() -> f64 {
    0.7
}
fn default_ramp_step() -> f64 {
    0.1
}
fn default_ramp_interval() -> u64 {
    10
}
fn default_capacity_window() -> u64 {
    300
}
fn default_min_capacity() -> f64 {
    1.0
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStorm {
    #[serde(default = "default_periods")]
    periods_secs: Vec<u64>,
    #[serde(default = "default_storm_window")]
    window_secs: u64,
    #[serde(default = "default_min_acf")]
    min_autocorrelation: f64,
    #[serde(default = "default_min_rate")]
    min_rate_rps: f64,
    #[serde(default = "default_storm_after")]
    watch_after_t3_secs: u64,
    #[serde(default)]
    min_for_secs_after_t3: u64,
}

fn default_periods() -> Vec<u64> {
    vec![8, 16]
}
fn default_storm_window() -> u64 {
    64
}
fn default_min_acf() -> f64 {
    0.5
}
fn default_min_rate() -> f64 {
    1.0
}
fn default_storm_after() -> u64 {
    300
}

fn default_eval_ms() -> u64 {
    1000
}
fn default_lease_ms() -> u64 {
    30_000
}
fn default_stale_ms() -> u64 {
    10_000
}
fn default_history() -> usize {
    256
}
fn default_trend_window() -> u64 {
    60
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFeature {
    name: String,
    criticality: String,
    #[serde(default)]
    disable_at_tier: Option<u8>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTiers {
    t1: RawTier,
    t2: RawTier,
    t3: RawTier,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTier {
    hold_down_secs: u64,
    #[serde(default)]
    enter: Vec<RawCondition>,
    #[serde(default)]
    params: Option<serde_yaml::Value>,
}

/// One condition, written as a single-key map (`- gpu_util: {...}`). serde_yaml 0.9 reads
/// enums only from YAML tags, so this is a struct of options checked to hold exactly one.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCondition {
    gpu_util: Option<RawRatio>,
    kv_usage: Option<RawRatio>,
    vram: Option<RawRatio>,
    queue_depth: Option<RawCount>,
    slo_alert: Option<RawSloAlert>,
    alertmanager: Option<RawAlert>,
    new_pattern: Option<RawPattern>,
    ttft_p99: Option<RawSecs>,
    queue_wait_p99: Option<RawSecs>,
    p99_jump: Option<RawJump>,
    demand_ratio: Option<RawLevel>,
    fallback_demand_ratio: Option<RawLevel>,
    expected_wait: Option<RawSecs>,
}

enum OneCondition {
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
    fn one(self, field: &str) -> Result<OneCondition, PolicyError> {
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
struct RawRatio {
    above_ratio: f64,
    exit_below_ratio: f64,
    #[serde(default)]
    for_secs: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCount {
    above: u64,
    exit_below: u64,
    #[serde(default)]
    for_secs: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecs {
    above_secs: f64,
    exit_below_secs: f64,
    #[serde(default)]
    for_secs: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLevel {
    above: f64,
    exit_below: f64,
    #[serde(default)]
    for_secs: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJump {
    signal: String,
    #[serde(default = "default_factor")]
    factor: f64,
    window_secs: u64,
    min_secs: f64,
}

fn default_factor() -> f64 {
    2.0
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSloAlert {
    slo: String,
    severity: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAlert {
    alertname: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPattern {
    above_per_min: f64,
    exit_below_per_min: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawT2Params {
    #[serde(default = "default_route")]
    model_route: String,
    max_tokens_cap: u32,
    max_num_seqs: u32,
}

fn default_route() -> String {
    "fallback".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawT3Params {
    #[serde(default = "default_admit")]
    admit_min_criticality: String,
    retry_after_base_secs: u32,
    jitter_ratio: f64,
    recovery_eta_max_secs: u64,
    /// Shed only the excess: admit non-critical traffic up to this share of the T2 route's
    /// capacity.
    #[serde(default)]
    admit_capacity_ratio: Option<f64>,
}

fn default_admit() -> String {
    "critical".into()
}

// ---------------------------------------------------------------------------------------------
// Validated
// ---------------------------------------------------------------------------------------------

/// A numeric signal the controller derives from agent snapshots or pattern rates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    /// Highest GPU utilisation over fresh hosts (0–1).
    GpuUtil,
    /// Highest KV-cache usage over fresh engines (0–1).
    KvUsage,
    /// Highest VRAM used/total over fresh GPUs (0–1).
    Vram,
    /// Waiting requests summed over fresh engines.
    QueueDepth,
    /// Highest rate (per minute) among new failure patterns.
    NewPatternRate,
    /// Highest TTFT p99 (seconds) over fresh engines that are up.
    TtftP99,
    /// Highest queue-wait p99 (seconds) over fresh engines that are up.
    QueueWaitP99,
    /// Offered load over measured capacity: the arrival rate (every request the fresh engines
    /// answered, refusals included; mean of the last 3 s) over the highest 5 s completion rate
    /// seen in the admission ramp's capacity window (0 until 1 request/s was measured).
    DemandRatio,
    /// Offered load over what the T2 route serves: the same offered rate over the fallback
    /// route's capacity (declared `fallback_capacity_rps`, or measured while T2 or T3 was in
    /// force, never below the primary's). Above 1 even T2 cannot carry the demand: T3's
    /// trigger.
    FallbackDemandRatio,
    /// Work waiting now against the measured service rate (seconds): the requests the fresh
    /// engines hold (waiting + running) over the same measured capacity `demand_ratio` divides
    /// by. By Little's law the time a new arrival needs to get through, read from the queue
    /// as it is now rather than from latencies recorded once requests finish (0 until the
    /// capacity is measured, as for `demand_ratio`).
    ExpectedWait,
}

impl Signal {
    /// The `Reason.trigger` name for this signal.
    pub fn trigger(self) -> &'static str {
        match self {
            Signal::GpuUtil => "gpu_util",
            Signal::KvUsage => "kv_usage",
            Signal::Vram => "vram",
            Signal::QueueDepth => "queue_depth",
            Signal::NewPatternRate => "new_pattern",
            Signal::TtftP99 => "ttft_p99",
            Signal::QueueWaitP99 => "queue_wait_p99",
            Signal::DemandRatio => "demand_ratio",
            Signal::FallbackDemandRatio => "fallback_demand_ratio",
            Signal::ExpectedWait => "expected_wait",
        }
    }
    pub const ALL: [Signal; 10] = [
        Signal::GpuUtil,
        Signal::KvUsage,
        Signal::Vram,
        Signal::QueueDepth,
        Signal::NewPatternRate,
        Signal::TtftP99,
        Signal::QueueWaitP99,
        Signal::DemandRatio,
        Signal::FallbackDemandRatio,
        Signal::ExpectedWait,
    ];

    /// The per-engine latency signals a `p99_jump` may watch.
    pub fn parse_latency(s: &str) -> Option<Signal> {
        match s {
            "ttft_p99" => Some(Signal::TtftP99),
            "queue_wait_p99" => Some(Signal::QueueWaitP99),
            _ => None,
        }
    }
}

/// One enter condition of a tier. Its exit is built in: a threshold below its own enter level,
/// or the alert resolving.
#[derive(Debug, Clone, PartialEq)]
pub enum Condition {
    /// `signal > above` continuously for `for_ms` latches; `signal < exit_below` unlatches.
    Threshold {
        signal: Signal,
        above: f64,
        exit_below: f64,
        for_ms: u64,
    },
    /// An SLO alert (by SLO name and severity, e.g. `page` / `ticket`) is firing.
    SloAlert { slo: String, severity: String },
    /// An Alertmanager alert with this `alertname` is firing.
    Alertmanager { alertname: String },
    /// Rate of change: on some engine, `signal` now is at least `factor` × its lowest non-zero
    /// value over the last `window_ms`, and at least `min_value`. Latched while that holds (the
    /// window slides past the jump, so it unlatches by itself; the tier's hold-down and the
    /// level conditions keep the tier while the overload lasts).
    Jump {
        signal: Signal,
        factor: f64,
        window_ms: u64,
        min_value: f64,
    },
}

impl Condition {
    /// The `Reason.trigger` name.
    pub fn trigger(&self) -> &'static str {
        match self {
            Condition::Threshold { signal, .. } => signal.trigger(),
            Condition::SloAlert { .. } => "slo_burn",
            Condition::Alertmanager { .. } => "alertmanager",
            Condition::Jump { .. } => "p99_jump",
        }
    }

    /// Human description, used in decision reasons.
    pub fn describe(&self) -> String {
        match self {
            Condition::Threshold {
                signal,
                above,
                exit_below,
                for_ms,
            } => format!(
                "{} > {above} for {}s (exit below {exit_below})",
                signal.trigger(),
                for_ms / 1000
            ),
            Condition::SloAlert { slo, severity } => format!("SLO alert {slo}/{severity} firing"),
            Condition::Alertmanager { alertname } => {
                format!("Alertmanager alert {alertname} firing")
            }
            Condition::Jump {
                signal,
                factor,
                window_ms,
                min_value,
            } => format!(
                "{} rose x{factor} or more within {}s on an engine (to at least {min_value} s; the value is the ratio now / lowest)",
                signal.trigger(),
                window_ms / 1000
            ),
        }
    }
}

/// One feature and the tier at which it is greyed out (`None`: never).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeaturePolicy {
    pub name: String,
    pub criticality: Criticality,
    pub disable_at: Option<Tier>,
}

/// Enter conditions and hold-down of one tier (T1, T2 or T3).
#[derive(Debug, Clone, PartialEq)]
pub struct TierPolicy {
    pub tier: Tier,
    /// How long every condition of this tier and above must stay clear before stepping down.
    pub hold_down_ms: u64,
    pub enter: Vec<Condition>,
}

/// Tier-2 (precision) parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct T2Params {
    /// The route the `default` traffic class goes to.
    pub model_route: String,
    pub max_tokens_cap: u32,
    pub max_num_seqs: u32,
}

/// Tier-3 (load shedding) parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct T3Params {
    pub admit_min_criticality: Criticality,
    pub retry_after_base_secs: u32,
    pub jitter_ratio: f64,
    /// Upper bound of the recovery estimate (used when the trend gives none).
    pub recovery_eta_max_ms: u64,
    /// `Some(r)`: T3 sheds only the excess — each instance admits non-critical traffic up to
    /// `r` × the T2 route's capacity / instances (`shed.admit_rps`), critical traffic drawing
    /// on the same rate; `None`: everything below `admit_min_criticality` is shed.
    pub admit_capacity_ratio: Option<f64>,
}

/// Per-instance stop-bleed on KV usage (seed figures: watch above 85 % for 2 min, halve
/// `max_num_seqs` above 92 % for 1 min, drain when still above 92 % a minute later).
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceKvPolicy {
    pub watch_above: f64,
    pub watch_for_ms: u64,
    pub halve_above: f64,
    pub halve_for_ms: u64,
    /// After halving, still above `halve_above` for this long: drain.
    pub drain_after_ms: u64,
    pub exit_below: f64,
    /// Each action (drain, then the halving) is restored after the signal stays below
    /// `exit_below` this long.
    pub hold_down_ms: u64,
}

/// Per-instance conditions (`instances`).
#[derive(Debug, Clone, PartialEq)]
pub struct InstancePolicy {
    pub kv: InstanceKvPolicy,
    /// The `max_num_seqs` halved when an engine does not report its configured value.
    pub default_max_num_seqs: u32,
    /// An instance without a fresh snapshot this long is forgotten (its actions end).
    pub forget_after_ms: u64,
}

/// The admission ramp after T3 (`admission_ramp`).
#[derive(Debug, Clone, PartialEq)]
pub struct RampPolicy {
    /// Share of the measured capacity admitted when T3 ends.
    pub start_ratio: f64,
    /// Added to the share every `step_interval_ms` until it reaches 1 (then the ramp ends).
    pub step_ratio: f64,
    pub step_interval_ms: u64,
    /// Capacity: the highest completion rate measured over this window.
    pub capacity_window_ms: u64,
    /// No ramp when the measured capacity is below this (nothing measured).
    pub min_capacity_rps: f64,
}

/// Retry-wave detection on the arrival rate (`recovery_storm`).
#[derive(Debug, Clone, PartialEq)]
pub struct StormPolicy {
    /// Backoff periods looked for (seconds).
    pub periods_secs: Vec<u64>,
    /// Length of the arrivals series (seconds, 1 s bins).
    pub window_secs: u64,
    /// Normalised autocorrelation at a period at or above which a storm is declared.
    pub min_autocorrelation: f64,
    /// Mean arrival rate below which nothing is declared.
    pub min_rate_rps: f64,
    /// Watched while T3 is in force, during a ramp, and this long after T3 ends.
    pub watch_after_t3_ms: u64,
    /// For `watch_after_t3_ms` after T3, a threshold condition latches only once it has held
    /// at least this long (its own `for` when that is longer): one scrape of a recovery burst
    /// (the base load plus retry waves) does not raise a tier again. 0: no such rule.
    pub min_for_after_t3_ms: u64,
}

/// A validated policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub evaluate_interval: Duration,
    /// A published command expires this long after it is issued unless republished.
    pub command_lease_ms: u64,
    /// Snapshots older than this are ignored.
    pub snapshot_stale_ms: u64,
    /// How many decisions the in-memory history keeps.
    pub decision_history: usize,
    /// Window over which signal trends (for the T3 recovery estimate) are fitted.
    pub trend_window_ms: u64,
    /// Record decisions, never publish.
    pub dry_run: bool,
    pub features: Vec<FeaturePolicy>,
    /// T1, T2, T3 in order.
    pub tiers: [TierPolicy; 3],
    pub t2: T2Params,
    pub t3: T3Params,
    /// Loop kills and tool breakers (`agents:`, docs/AGENTS.md).
    pub agents: crate::agents::AgentsPolicy,
    /// Per-instance conditions; `None`: no per-instance actions (operator ones still apply).
    pub instances: Option<InstancePolicy>,
    /// `None`: admission opens at once when T3 ends.
    pub ramp: Option<RampPolicy>,
    /// `None`: no retry-wave detection.
    pub storm: Option<StormPolicy>,
    /// The declared capacity (`capacity_rps`): requests/s the engines complete together at
    /// saturation, from a load test. `demand_ratio` and `expected_wait` divide by the higher of
    /// this and the measured service rate, so they read true before the engines have been
    /// saturated once (the measured rate is only the load seen so far). `None`: the measured
    /// rate alone, after its warm-up.
    pub declared_capacity_rps: Option<f64>,
    /// The declared capacity of the T2 route (`fallback_capacity_rps`), requests/s over all
    /// engines; `None`: measured while T2 or T3 is in force.
    pub declared_fallback_capacity_rps: Option<f64>,
    /// `Some(r)`: a tier steps down only when the offered demand is below `r` × what the tier
    /// below serves (T3 → T2: the T2 route's capacity; T2 → T1 and T1 → T0: the primary's), so
    /// an exit reads the demand rather than the queue the tier itself empties. `None`, or no
    /// capacity known: the hold-down alone decides.
    pub exit_demand_ratio: Option<f64>,
}

impl Policy {
    /// Reads and validates a policy file.
    ///
    /// # Errors
    /// [`PolicyError::Io`] when unreadable, otherwise as [`Policy::from_yaml`].
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Policy::from_yaml(&text)
    }

    /// Parses and validates policy YAML.
    ///
    /// # Errors
    /// [`PolicyError::Yaml`] for syntax errors and unknown fields (with line/column),
    /// [`PolicyError::Invalid`] naming the field that breaks a rule.
    pub fn from_yaml(text: &str) -> Result<Policy, PolicyError> {
        let raw: RawPolicy = serde_yaml::from_str(text)?;
        validate(raw)
    }

    /// The policy of tier `t` (T1–T3); `None` for T0.
    pub fn tier(&self, t: Tier) -> Option<&TierPolicy> {
        match t {
            Tier::T0 => None,
            other => Some(&self.tiers[usize::from(other.as_u8()) - 1]),
        }
    }

    /// A small built-in policy with the required thresholds (docs/REQUIREMENTS.md R2.1: GPU
    /// 95% / 98% / 99.5% for 30 s; R2.2: VRAM 75%).
    pub fn seed_default() -> Policy {
        Policy::from_yaml(include_str!("../../examples/policy.yaml"))
            .expect("examples/policy.yaml is valid (checked by tests)")
    }
}

fn check_name(field: &str, name: &str) -> Result<(), PolicyError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{name:?} must be 1-64 characters of A-Z a-z 0-9 _ - ."),
        ))
    }
}

fn check_ratio(field: &str, v: f64) -> Result<(), PolicyError> {
    if v.is_finite() && (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!("{v} must be a ratio between 0 and 1"),
        ))
    }
}

fn validate(raw: RawPolicy) -> Result<Policy, PolicyError> {
    let agents = crate::agents::AgentsPolicy::validate(raw.agents.unwrap_or_default())
        .map_err(|e| invalid(format!("agents.{}", e.field), e.reason))?;
    if !(50..=60_000).contains(&raw.evaluate_interval_ms) {
        return Err(invalid(
            "evaluate_interval_ms",
            "must be between 50 and 60000",
        ));
    }
    for (field, v) in [
        ("capacity_rps", raw.capacity_rps),
        ("fallback_capacity_rps", raw.fallback_capacity_rps),
    ] {
        if let Some(c) = v
            && !(c.is_finite() && c > 0.0)
        {
            return Err(invalid(field, "must be a positive number of requests/s"));
        }
    }
    if let Some(r) = raw.exit_demand_ratio
        && !(r.is_finite() && r > 0.0 && r <= 2.0)
    {
        return Err(invalid("exit_demand_ratio", "must be in (0, 2]"));
    }
    if raw.command_lease_ms < 3 * raw.evaluate_interval_ms {
        return Err(invalid(
            "command_lease_ms",
            "must be at least 3 evaluation intervals (it is refreshed every third of it)",
        ));
    }
    if raw.snapshot_stale_ms == 0 {
        return Err(invalid("snapshot_stale_ms", "must be positive"));
    }
    if raw.decision_history == 0 || raw.decision_history > 100_000 {
        return Err(invalid("decision_history", "must be between 1 and 100000"));
    }
    if raw.trend_window_secs < 5 {
        return Err(invalid("trend_window_secs", "must be at least 5"));
    }

    let mut features = Vec::new();
    let mut seen = BTreeSet::new();
    for (i, f) in raw.features.into_iter().enumerate() {
        let field = format!("features[{i}]");
        check_name(&format!("{field}.name"), &f.name)?;
        if !seen.insert(f.name.clone()) {
            return Err(invalid(
                format!("{field}.name"),
                format!("duplicate feature {:?}", f.name),
            ));
        }
        let criticality = Criticality::parse(&f.criticality).ok_or_else(|| {
            invalid(
                format!("{field}.criticality"),
                format!("{:?} is not critical, default or sheddable", f.criticality),
            )
        })?;
        let disable_at = match f.disable_at_tier {
            None => None,
            Some(t) => {
                let tier = Tier::try_from(t)
                    .map_err(|e| invalid(format!("{field}.disable_at_tier"), e.to_string()))?;
                if tier == Tier::T0 {
                    return Err(invalid(
                        format!("{field}.disable_at_tier"),
                        "0 would disable it in normal operation; use 1-3",
                    ));
                }
                if criticality == Criticality::Critical {
                    return Err(invalid(
                        format!("{field}.disable_at_tier"),
                        format!("{:?} is critical (P0) and is never disabled", f.name),
                    ));
                }
                Some(tier)
            }
        };
        features.push(FeaturePolicy {
            name: f.name,
            criticality,
            disable_at,
        });
    }

    let t1 = validate_tier(
        "tiers.t1",
        Tier::T1,
        raw.tiers.t1.hold_down_secs,
        raw.tiers.t1.enter,
    )?;
    if raw.tiers.t1.params.is_some() {
        return Err(invalid(
            "tiers.t1.params",
            "tier 1 takes no params (features say what it sheds)",
        ));
    }
    let t2 = validate_tier(
        "tiers.t2",
        Tier::T2,
        raw.tiers.t2.hold_down_secs,
        raw.tiers.t2.enter,
    )?;
    let t3 = validate_tier(
        "tiers.t3",
        Tier::T3,
        raw.tiers.t3.hold_down_secs,
        raw.tiers.t3.enter,
    )?;

    let t2p: RawT2Params = match raw.tiers.t2.params {
        Some(v) => {
            serde_yaml::from_value(v).map_err(|e| invalid("tiers.t2.params", e.to_string()))?
        }
        None => {
            return Err(invalid(
                "tiers.t2.params",
                "required: model_route, max_tokens_cap, max_num_seqs",
            ));
        }
    };
    if !matches!(t2p.model_route.as_str(), "primary" | "fallback") {
        return Err(invalid(
            "tiers.t2.params.model_route",
            "must be `primary` or `fallback`",
        ));
    }
    if t2p.max_tokens_cap == 0 {
        return Err(invalid(
            "tiers.t2.params.max_tokens_cap",
            "must be positive",
        ));
    }
    if t2p.max_num_seqs == 0 {
        return Err(invalid("tiers.t2.params.max_num_seqs", "must be positive"));
    }
    let t3p: RawT3Params = match raw.tiers.t3.params {
        Some(v) => {
            serde_yaml::from_value(v).map_err(|e| invalid("tiers.t3.params", e.to_string()))?
        }
        None => {
            return Err(invalid(
                "tiers.t3.params",
                "required: admit_min_criticality, retry_after_base_secs, jitter_ratio, recovery_eta_max_secs",
            ));
        }
    };
    let admit = Criticality::parse(&t3p.admit_min_criticality).ok_or_else(|| {
        invalid(
            "tiers.t3.params.admit_min_criticality",
            "must be critical or default",
        )
    })?;
    if admit == Criticality::Sheddable {
        return Err(invalid(
            "tiers.t3.params.admit_min_criticality",
            "sheddable would shed nothing; use critical or default",
        ));
    }
    if t3p.retry_after_base_secs == 0 || t3p.retry_after_base_secs > 3600 {
        return Err(invalid(
            "tiers.t3.params.retry_after_base_secs",
            "must be between 1 and 3600",
        ));
    }
    check_ratio("tiers.t3.params.jitter_ratio", t3p.jitter_ratio)?;
    if t3p.recovery_eta_max_secs == 0 {
        return Err(invalid(
            "tiers.t3.params.recovery_eta_max_secs",
            "must be positive",
        ));
    }
    if let Some(r) = t3p.admit_capacity_ratio
        && !(r.is_finite() && r > 0.0 && r <= 2.0)
    {
        return Err(invalid(
            "tiers.t3.params.admit_capacity_ratio",
            "must be in (0, 2]",
        ));
    }

    let instances = raw.instances.map(validate_instances).transpose()?;
    let ramp = raw.admission_ramp.map(validate_ramp).transpose()?;
    let storm = raw.recovery_storm.map(validate_storm).transpose()?;

    Ok(Policy {
        evaluate_interval: Duration::from_millis(raw.evaluate_interval_ms),
        command_lease_ms: raw.command_lease_ms,
        snapshot_stale_ms: raw.snapshot_stale_ms,
        decision_history: raw.decision_history,
        trend_window_ms: raw.trend_window_secs * 1000,
        dry_run: raw.dry_run,
        features,
        tiers: [t1, t2, t3],
        t2: T2Params {
            model_route: t2p.model_route,
            max_tokens_cap: t2p.max_tokens_cap,
            max_num_seqs: t2p.max_num_seqs,
        },
        t3: T3Params {
            admit_min_criticality: admit,
            retry_after_base_secs: t3p.retry_after_base_secs,
            jitter_ratio: t3p.jitter_ratio,
            recovery_eta_max_ms: t3p.recovery_eta_max_secs * 1000,
            admit_capacity_ratio: t3p.admit_capacity_ratio,
        },
        agents,
        instances,
        ramp,
        storm,
        declared_capacity_rps: raw.capacity_rps,
        declared_fallback_capacity_rps: raw.fallback_capacity_rps,
        exit_demand_ratio: raw.exit_demand_ratio,
    })
}

fn validate_instances(r: RawInstances) -> Result<InstancePolicy, PolicyError> {
    let k = &r.kv_usage;
    let f = "instances.kv_usage";
    check_ratio(&format!("{f}.watch_above_ratio"), k.watch_above_ratio)?;
    check_ratio(&format!("{f}.halve_above_ratio"), k.halve_above_ratio)?;
    check_ratio(&format!("{f}.exit_below_ratio"), k.exit_below_ratio)?;
    if k.halve_above_ratio < k.watch_above_ratio {
        return Err(invalid(
            format!("{f}.halve_above_ratio"),
            "must be at least watch_above_ratio",
        ));
    }
    if k.exit_below_ratio >= k.watch_above_ratio {
        return Err(invalid(
            format!("{f}.exit_below_ratio"),
            "must be below watch_above_ratio (hysteresis)",
        ));
    }
    for (name, v) in [
        ("watch_for_secs", k.watch_for_secs),
        ("halve_for_secs", k.halve_for_secs),
        ("drain_after_secs", k.drain_after_secs),
        ("hold_down_secs", k.hold_down_secs),
    ] {
        if v > 86_400 {
            return Err(invalid(format!("{f}.{name}"), "must be at most 86400"));
        }
    }
    if r.default_max_num_seqs < 2 {
        return Err(invalid(
            "instances.default_max_num_seqs",
            "must be at least 2 (it is halved)",
        ));
    }
    if r.forget_after_secs == 0 {
        return Err(invalid("instances.forget_after_secs", "must be positive"));
    }
    Ok(InstancePolicy {
        kv: InstanceKvPolicy {
            watch_above: k.watch_above_ratio,
            watch_for_ms: k.watch_for_secs * 1000,
            halve_above: k.halve_above_ratio,
            halve_for_ms: k.halve_for_secs * 1000,
            drain_after_ms: k.drain_after_secs * 1000,
            exit_below: k.exit_below_ratio,
            hold_down_ms: k.hold_down_secs * 1000,
        },
        default_max_num_seqs: r.default_max_num_seqs,
        forget_after_ms: r.forget_after_secs * 1000,
    })
}

fn validate_ramp(r: RawRamp) -> Result<RampPolicy, PolicyError> {
    let f = "admission_ramp";
    if !(r.start_ratio.is_finite() && r.start_ratio > 0.0 && r.start_ratio < 1.0) {
        return Err(invalid(
            format!("{f}.start_ratio"),
            "must be above 0 and below 1",
        ));
    }
    if !(r.step_ratio.is_finite() && r.step_ratio > 0.0 && r.step_ratio <= 1.0) {
        return Err(invalid(
            format!("{f}.step_ratio"),
            "must be above 0 and at most 1",
        ));
    }
    if r.step_interval_secs == 0 || r.step_interval_secs > 3600 {
        return Err(invalid(
            format!("{f}.step_interval_secs"),
            "must be between 1 and 3600",
        ));
    }
    if r.capacity_window_secs < 10 || r.capacity_window_secs > 86_400 {
        return Err(invalid(
            format!("{f}.capacity_window_secs"),
            "must be between 10 and 86400",
        ));
    }
    if !(r.min_capacity_rps.is_finite() && r.min_capacity_rps >= 0.0) {
        return Err(invalid(
            format!("{f}.min_capacity_rps"),
            "must be a non-negative number",
        ));
    }
    Ok(RampPolicy {
        start_ratio: r.start_ratio,
        step_ratio: r.step_ratio,
        step_interval_ms: r.step_interval_secs * 1000,
        capacity_window_ms: r.capacity_window_secs * 1000,
        min_capacity_rps: r.min_capacity_rps,
    })
}

fn validate_storm(r: RawStorm) -> Result<StormPolicy, PolicyError> {
    let f = "recovery_storm";
    if r.periods_secs.is_empty() || r.periods_secs.len() > 8 {
        return Err(invalid(
            format!("{f}.periods_secs"),
            "must list 1-8 periods",
        ));
    }
    if !(16..=600).contains(&r.window_secs) {
        return Err(invalid(
            format!("{f}.window_secs"),
            "must be between 16 and 600",
        ));
    }
    for p in &r.periods_secs {
        if *p < 2 || p * 2 > r.window_secs {
            return Err(invalid(
                format!("{f}.periods_secs"),
                format!("{p} must be at least 2 and at most half of window_secs"),
            ));
        }
    }
    if !(r.min_autocorrelation.is_finite()
        && r.min_autocorrelation > 0.0
        && r.min_autocorrelation < 1.0)
    {
        return Err(invalid(
            format!("{f}.min_autocorrelation"),
            "must be above 0 and below 1",
        ));
    }
    if !(r.min_rate_rps.is_finite() && r.min_rate_rps >= 0.0) {
        return Err(invalid(
            format!("{f}.min_rate_rps"),
            "must be a non-negative number",
        ));
    }
    if r.min_for_secs_after_t3 > 600 {
        return Err(invalid(
            format!("{f}.min_for_secs_after_t3"),
            "must be at most 600",
        ));
    }
    Ok(StormPolicy {
        periods_secs: r.periods_secs,
        window_secs: r.window_secs,
        min_autocorrelation: r.min_autocorrelation,
        min_rate_rps: r.min_rate_rps,
        watch_after_t3_ms: r.watch_after_t3_secs * 1000,
        min_for_after_t3_ms: r.min_for_secs_after_t3 * 1000,
    })
}

fn validate_tier(
    field: &str,
    tier: Tier,
    hold_down_secs: u64,
    enter: Vec<RawCondition>,
) -> Result<TierPolicy, PolicyError> {
    if hold_down_secs > 86_400 {
        return Err(invalid(
            format!("{field}.hold_down_secs"),
            "must be at most 86400",
        ));
    }
    let mut out = Vec::new();
    for (i, c) in enter.into_iter().enumerate() {
        let f = format!("{field}.enter[{i}]");
        let ratio = |signal: Signal, r: RawRatio, name: &str| -> Result<Condition, PolicyError> {
            check_ratio(&format!("{f}.{name}.above_ratio"), r.above_ratio)?;
            check_ratio(&format!("{f}.{name}.exit_below_ratio"), r.exit_below_ratio)?;
            if r.exit_below_ratio >= r.above_ratio {
                return Err(invalid(
                    format!("{f}.{name}.exit_below_ratio"),
                    format!(
                        "{} must be below above_ratio {} (hysteresis)",
                        r.exit_below_ratio, r.above_ratio
                    ),
                ));
            }
            Ok(Condition::Threshold {
                signal,
                above: r.above_ratio,
                exit_below: r.exit_below_ratio,
                for_ms: r.for_secs * 1000,
            })
        };
        let secs = |signal: Signal, r: RawSecs, name: &str| -> Result<Condition, PolicyError> {
            let ok = r.above_secs.is_finite()
                && r.above_secs > 0.0
                && r.exit_below_secs.is_finite()
                && r.exit_below_secs >= 0.0;
            if !ok || r.exit_below_secs >= r.above_secs {
                return Err(invalid(
                    format!("{f}.{name}"),
                    "above_secs must be positive and exit_below_secs below it (hysteresis)",
                ));
            }
            Ok(Condition::Threshold {
                signal,
                above: r.above_secs,
                exit_below: r.exit_below_secs,
                for_ms: r.for_secs * 1000,
            })
        };
        let level = |signal: Signal, r: RawLevel| -> Result<Condition, PolicyError> {
            if !(r.above.is_finite() && r.above > 0.0 && r.exit_below.is_finite())
                || r.exit_below < 0.0
                || r.exit_below >= r.above
            {
                return Err(invalid(
                    format!("{f}.{}", signal.trigger()),
                    "above must be positive and exit_below in [0, above) (hysteresis)",
                ));
            }
            Ok(Condition::Threshold {
                signal,
                above: r.above,
                exit_below: r.exit_below,
                for_ms: r.for_secs * 1000,
            })
        };
        let cond = match c.one(&f)? {
            OneCondition::GpuUtil(r) => ratio(Signal::GpuUtil, r, "gpu_util")?,
            OneCondition::KvUsage(r) => ratio(Signal::KvUsage, r, "kv_usage")?,
            OneCondition::Vram(r) => ratio(Signal::Vram, r, "vram")?,
            OneCondition::QueueDepth(r) => {
                if r.exit_below >= r.above {
                    return Err(invalid(
                        format!("{f}.queue_depth.exit_below"),
                        "must be below `above` (hysteresis)",
                    ));
                }
                Condition::Threshold {
                    signal: Signal::QueueDepth,
                    above: r.above as f64,
                    exit_below: r.exit_below as f64,
                    for_ms: r.for_secs * 1000,
                }
            }
            OneCondition::SloAlert(a) => {
                if a.slo.trim().is_empty() {
                    return Err(invalid(format!("{f}.slo_alert.slo"), "must not be empty"));
                }
                if a.severity.trim().is_empty() {
                    return Err(invalid(
                        format!("{f}.slo_alert.severity"),
                        "must not be empty",
                    ));
                }
                Condition::SloAlert {
                    slo: a.slo,
                    severity: a.severity,
                }
            }
            OneCondition::Alertmanager(a) => {
                if a.alertname.trim().is_empty() {
                    return Err(invalid(
                        format!("{f}.alertmanager.alertname"),
                        "must not be empty",
                    ));
                }
                Condition::Alertmanager {
                    alertname: a.alertname,
                }
            }
            OneCondition::TtftP99(r) => secs(Signal::TtftP99, r, "ttft_p99")?,
            OneCondition::QueueWaitP99(r) => secs(Signal::QueueWaitP99, r, "queue_wait_p99")?,
            OneCondition::ExpectedWait(r) => secs(Signal::ExpectedWait, r, "expected_wait")?,
            OneCondition::Demand(r) => level(Signal::DemandRatio, r)?,
            OneCondition::FallbackDemand(r) => level(Signal::FallbackDemandRatio, r)?,
            OneCondition::Jump(j) => {
                let g = format!("{f}.p99_jump");
                let signal = Signal::parse_latency(&j.signal).ok_or_else(|| {
                    invalid(
                        format!("{g}.signal"),
                        format!("{:?} is not ttft_p99 or queue_wait_p99", j.signal),
                    )
                })?;
                if !(j.factor.is_finite() && j.factor > 1.0) {
                    return Err(invalid(format!("{g}.factor"), "must be above 1"));
                }
                if !(2..=600).contains(&j.window_secs) {
                    return Err(invalid(
                        format!("{g}.window_secs"),
                        "must be between 2 and 600",
                    ));
                }
                if !(j.min_secs.is_finite() && j.min_secs > 0.0) {
                    return Err(invalid(format!("{g}.min_secs"), "must be positive"));
                }
                Condition::Jump {
                    signal,
                    factor: j.factor,
                    window_ms: j.window_secs * 1000,
                    min_value: j.min_secs,
                }
            }
            OneCondition::NewPattern(p) => {
                let ok = p.above_per_min.is_finite()
                    && p.above_per_min > 0.0
                    && p.exit_below_per_min >= 0.0;
                if !ok || p.exit_below_per_min >= p.above_per_min {
                    return Err(invalid(
                        format!("{f}.new_pattern"),
                        "above_per_min must be positive and exit_below_per_min below it (hysteresis)",
                    ));
                }
                Condition::Threshold {
                    signal: Signal::NewPatternRate,
                    above: p.above_per_min,
                    exit_below: p.exit_below_per_min,
                    for_ms: 0,
                }
            }
        };
        out.push(cond);
    }
    Ok(TierPolicy {
        tier,
        hold_down_ms: hold_down_secs * 1000,
        enter: out,
    })
}
