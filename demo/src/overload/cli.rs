//! The command line of `bench overload`: its arguments, the configurations (setups and
//! ablations) and the policy they run under.

use std::path::PathBuf;

use anyhow::Context as _;
use brownout_serving::scheduler::SchedulingPolicy;

use crate::world::WorldOptions;

/// Arguments of `brownout-demo bench overload`.
#[derive(Debug, Clone, clap::Args)]
pub struct OverloadArgs {
    /// `smollm2`, `tiny-random` or a GGUF path (default: SmolLM2 when cached).
    #[arg(long)]
    pub model: Option<String>,
    /// Warm-up at the base load, seconds.
    #[arg(long, default_value_t = 30)]
    pub warmup_secs: u64,
    /// Ramp from the base load to the overload, seconds.
    #[arg(long, default_value_t = 10)]
    pub ramp_secs: u64,
    /// How long the overload is held, seconds (≥ 60 so the queue cannot drain by itself).
    #[arg(long, default_value_t = 60)]
    pub hold_secs: u64,
    /// Recovery at the base load after the overload, seconds.
    #[arg(long, default_value_t = 60)]
    pub recovery_secs: u64,
    /// The overload as a multiple of the measured capacity.
    #[arg(long, default_value_t = 3.0)]
    pub overload_factor: f64,
    /// The base load (warm-up, recovery) as a multiple of the measured capacity.
    #[arg(long, default_value_t = 0.6)]
    pub base_load_ratio: f64,
    /// Length of the capacity calibration, seconds (three concurrencies share it).
    #[arg(long, default_value_t = 18)]
    pub calibrate_secs: u64,
    /// Skip the calibration and use this capacity (flows/s).
    #[arg(long)]
    pub capacity_flows_per_s: Option<f64>,
    /// With --capacity-flows-per-s: the requests/s the engines finish at that capacity (the
    /// calibration prints it), declared to the controller as the policy's `capacity_rps`.
    /// Without it such a run declares no capacity.
    #[arg(long, requires = "capacity_flows_per_s")]
    pub capacity_rps: Option<f64>,
    /// With --capacity-flows-per-s: the requests/s the engines finish with T2 in force (the
    /// calibration prints it), declared as the policy's `fallback_capacity_rps`.
    #[arg(long, requires = "capacity_flows_per_s")]
    pub fallback_capacity_rps: Option<f64>,
    /// After the load, wait at most this long for the serving tier to be back at T0.
    #[arg(long, default_value_t = 45)]
    pub settle_secs: u64,
    /// Which configurations to run, in order: `baseline`, `loop_off`, `loop_on`, and ablations of
    /// the loop that switch one mechanism off: `loop_on:no-fast-triggers`,
    /// `loop_on:no-demand-trigger`, `loop_on:no-wait-trigger`, `loop_on:no-admission-ramp`,
    /// `loop_on:no-instance-actions`, `loop_on:no-critical-reserve`,
    /// `loop_on:no-critical-step-guard`, `loop_on:no-refusal-aware-slis`,
    /// `loop_on:no-declared-capacity`, `loop_on:no-excess-admission`, `loop_on:no-demand-exit`,
    /// `loop_on:no-fallback-capacity`; `all` = the three and every ablation.
    #[arg(long, default_value = "baseline,loop_off,loop_on")]
    pub configs: String,
    /// Policy YAML for the controller (default: the built-in examples/policy-overload.yaml).
    #[arg(long)]
    pub policy: Option<PathBuf>,
    /// Simulated GPU pace: every engine step takes at least this many ms (the real model still
    /// runs; see `brownout-serve --simulate-step-ms`), so capacity is bound by step time and
    /// sequence slots, not by the CPU the load generator shares. Default: 25 for tiny-random,
    /// 0 (off: the real CPU pace) otherwise.
    #[arg(long)]
    pub simulate_step_ms: Option<u64>,
    /// The serving tier's critical step guard (`brownout-serve --critical-step-tokens`) in
    /// loop_off and loop_on: while a critical request runs or waits, an engine step takes
    /// non-critical tokens only up to this many in all. Default: 0 (off) at a simulated GPU
    /// pace, where the step time does not grow with the batch; 4 at the real CPU pace.
    #[arg(long)]
    pub critical_step_tokens: Option<usize>,
    /// Hold of the overload in the ablation runs (`loop_on:…`), seconds (default: --hold-secs).
    #[arg(long)]
    pub ablation_hold_secs: Option<u64>,
    /// Recovery in the ablation runs, seconds (default: --recovery-secs).
    #[arg(long)]
    pub ablation_recovery_secs: Option<u64>,
    #[command(flatten)]
    pub clients: brownout::loadgen::ClientArgs,
    /// Think time (2–8 s between calls) is divided by this.
    #[arg(long, default_value_t = 8.0)]
    pub speed: f64,
    /// max_tokens per call.
    #[arg(long, default_value_t = 24)]
    pub max_tokens: u32,
    #[arg(long, default_value_t = 11)]
    pub seed: u64,
    /// Directory for overload.json, goodput.svg and overload.md.
    #[arg(long, default_value = "bench/out/overload")]
    pub out: PathBuf,
}

/// The three deployments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Base {
    Baseline,
    LoopOff,
    LoopOn,
}

/// One mechanism of the loop switched off (an ablation of `loop_on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ablation {
    /// Without the TTFT / queue-wait p99 conditions and the p99 jump (the level triggers stay).
    NoFastTriggers,
    /// Without the `demand_ratio` conditions (offered load over measured capacity).
    NoDemandTrigger,
    /// Admission opens at once when T3 ends (no `admission_ramp`).
    NoAdmissionRamp,
    /// No per-instance conditions (`instances`: max_num_seqs halving, drain).
    NoInstanceActions,
    /// `--critical-reserve-ratio 0`.
    NoCriticalReserve,
    /// `--critical-step-tokens 0` (no critical step guard).
    NoCriticalStepGuard,
    /// Without the `expected_wait` conditions (work waiting now over the measured service rate).
    NoWaitTrigger,
    /// Refusals exported as plain errors, so they feed the SLO burn (as before docs/SLO.md
    /// "Deliberate refusals").
    NoRefusalAwareSlis,
    /// The calibrated capacity is not declared to the controller (`capacity_rps`): the demand
    /// and wait signals divide by the measured service rate alone.
    NoDeclaredCapacity,
    /// T3 sheds the whole class below `admit_min_criticality` (no `admit_capacity_ratio`:
    /// the first release's T3) instead of only the excess over the T2 route's capacity.
    NoExcessAdmission,
    /// Tiers step down by their hold-down alone (no `exit_demand_ratio`), whatever the demand.
    NoDemandExit,
    /// The T2 route's calibrated capacity is not declared (`fallback_capacity_rps`): it is
    /// measured while T2 runs saturated, the primary's until then.
    NoFallbackCapacity,
}

impl Ablation {
    pub const ALL: [Ablation; 12] = [
        Ablation::NoFastTriggers,
        Ablation::NoDemandTrigger,
        Ablation::NoWaitTrigger,
        Ablation::NoAdmissionRamp,
        Ablation::NoInstanceActions,
        Ablation::NoCriticalReserve,
        Ablation::NoCriticalStepGuard,
        Ablation::NoRefusalAwareSlis,
        Ablation::NoDeclaredCapacity,
        Ablation::NoExcessAdmission,
        Ablation::NoDemandExit,
        Ablation::NoFallbackCapacity,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Ablation::NoFastTriggers => "no-fast-triggers",
            Ablation::NoDemandTrigger => "no-demand-trigger",
            Ablation::NoAdmissionRamp => "no-admission-ramp",
            Ablation::NoInstanceActions => "no-instance-actions",
            Ablation::NoCriticalReserve => "no-critical-reserve",
            Ablation::NoCriticalStepGuard => "no-critical-step-guard",
            Ablation::NoWaitTrigger => "no-wait-trigger",
            Ablation::NoRefusalAwareSlis => "no-refusal-aware-slis",
            Ablation::NoDeclaredCapacity => "no-declared-capacity",
            Ablation::NoExcessAdmission => "no-excess-admission",
            Ablation::NoDemandExit => "no-demand-exit",
            Ablation::NoFallbackCapacity => "no-fallback-capacity",
        }
    }

    fn parse(s: &str) -> Option<Ablation> {
        Ablation::ALL.into_iter().find(|a| a.as_str() == s)
    }
}

/// One configuration: a deployment, optionally with one loop mechanism off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Setup {
    pub base: Base,
    pub ablation: Option<Ablation>,
}

impl Setup {
    pub const BASELINE: Setup = Setup {
        base: Base::Baseline,
        ablation: None,
    };
    pub const LOOP_OFF: Setup = Setup {
        base: Base::LoopOff,
        ablation: None,
    };
    pub const LOOP_ON: Setup = Setup {
        base: Base::LoopOn,
        ablation: None,
    };

    pub fn as_str(self) -> String {
        let base = match self.base {
            Base::Baseline => "baseline",
            Base::LoopOff => "loop_off",
            Base::LoopOn => "loop_on",
        };
        match self.ablation {
            None => base.to_string(),
            Some(a) => format!("{base}:{}", a.as_str()),
        }
    }

    pub(super) fn parse_list(s: &str) -> anyhow::Result<Vec<Setup>> {
        let mut v = Vec::new();
        for p in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let found: Vec<Setup> = match p {
                "baseline" => vec![Setup::BASELINE],
                "loop_off" => vec![Setup::LOOP_OFF],
                "loop_on" => vec![Setup::LOOP_ON],
                "all" => [Setup::BASELINE, Setup::LOOP_OFF, Setup::LOOP_ON]
                    .into_iter()
                    .chain(Ablation::ALL.into_iter().map(|a| Setup {
                        base: Base::LoopOn,
                        ablation: Some(a),
                    }))
                    .collect(),
                o => match o.strip_prefix("loop_on:").and_then(Ablation::parse) {
                    Some(a) => vec![Setup {
                        base: Base::LoopOn,
                        ablation: Some(a),
                    }],
                    None => anyhow::bail!(
                        "unknown configuration {o:?} (baseline, loop_off, loop_on, all, or loop_on:ABLATION with ABLATION one of {})",
                        Ablation::ALL.map(Ablation::as_str).join(", ")
                    ),
                },
            };
            for c in found {
                if !v.contains(&c) {
                    v.push(c);
                }
            }
        }
        anyhow::ensure!(!v.is_empty(), "--configs names no configuration");
        Ok(v)
    }

    /// The deployment of this configuration, with the controller's policy `policy_yaml`.
    ///
    /// # Errors
    /// A policy that is not YAML.
    pub fn world_options(
        self,
        model: &str,
        policy_yaml: &str,
        simulate_step_ms: u64,
        critical_step_tokens: usize,
    ) -> anyhow::Result<WorldOptions> {
        let mut o = WorldOptions {
            model: model.to_string(),
            dry_run: self.base != Base::LoopOn,
            num_engines: 1,
            policy_yaml: ablate_policy(policy_yaml, self.ablation)?,
            ..WorldOptions::default()
        };
        o.engine.simulate_step_ms = simulate_step_ms;
        o.engine.critical_step_tokens = critical_step_tokens;
        // Latency p99s over seconds, not the agent's default 30 s (issue 19: fast triggers).
        o.agent_window_scrapes = Some(5);
        if self.base == Base::Baseline {
            o.engine.scheduling_policy = SchedulingPolicy::Fcfs;
            o.engine.critical_reserve_ratio = 0.0;
            o.engine.critical_step_tokens = 0;
        }
        match self.ablation {
            Some(Ablation::NoCriticalReserve) => o.engine.critical_reserve_ratio = 0.0,
            Some(Ablation::NoCriticalStepGuard) => o.engine.critical_step_tokens = 0,
            Some(Ablation::NoRefusalAwareSlis) => o.refusals_as_errors = true,
            _ => {}
        }
        Ok(o)
    }
}

/// The policy with one mechanism removed (unchanged for ablations that are not in the policy).
///
/// # Errors
/// YAML that does not parse.
pub fn ablate_policy(yaml: &str, ablation: Option<Ablation>) -> anyhow::Result<String> {
    let Some(a) = ablation else {
        return Ok(yaml.to_string());
    };
    let mut v: serde_yaml::Value = serde_yaml::from_str(yaml).context("the policy YAML")?;
    let Some(m) = v.as_mapping_mut() else {
        anyhow::bail!("the policy YAML is not a mapping");
    };
    match a {
        Ablation::NoFastTriggers | Ablation::NoDemandTrigger | Ablation::NoWaitTrigger => {
            let kinds: &[&str] = match a {
                Ablation::NoFastTriggers => &["ttft_p99", "queue_wait_p99", "p99_jump"],
                Ablation::NoDemandTrigger => &["demand_ratio"],
                _ => &["expected_wait"],
            };
            if let Some(tiers) = m.get_mut("tiers").and_then(|t| t.as_mapping_mut()) {
                for (_, tier) in tiers.iter_mut() {
                    if let Some(enter) = tier.get_mut("enter").and_then(|e| e.as_sequence_mut()) {
                        enter.retain(|c| !kinds.iter().any(|k| c.get(*k).is_some()));
                    }
                }
            }
        }
        Ablation::NoAdmissionRamp => {
            m.remove("admission_ramp");
        }
        Ablation::NoDeclaredCapacity => {
            m.remove("capacity_rps");
        }
        Ablation::NoFallbackCapacity => {
            m.remove("fallback_capacity_rps");
        }
        Ablation::NoDemandExit => {
            m.remove("exit_demand_ratio");
        }
        Ablation::NoExcessAdmission => {
            if let Some(p) = m
                .get_mut("tiers")
                .and_then(|t| t.get_mut("t3"))
                .and_then(|t| t.get_mut("params"))
                .and_then(|p| p.as_mapping_mut())
            {
                p.remove("admit_capacity_ratio");
            }
        }
        Ablation::NoInstanceActions => {
            m.remove("instances");
        }
        Ablation::NoCriticalReserve
        | Ablation::NoCriticalStepGuard
        | Ablation::NoRefusalAwareSlis => {}
    }
    Ok(serde_yaml::to_string(&v)?)
}

/// The controller's policy in the benchmark: the one policy (`examples/policy.yaml`, the
/// built-in default) with the small engines' knobs ([`crate::world::PolicyKnobs`]), as the
/// demo runs it.
pub fn overload_policy() -> String {
    crate::world::small_engines_policy()
}
