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

mod raw;
mod validate;
use raw::RawPolicy;
use validate::validate;

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
        Policy::from_yaml(include_str!("../../../examples/policy.yaml"))
            .expect("examples/policy.yaml is valid (checked by tests)")
    }
}
