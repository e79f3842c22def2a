//! `brownout-demo bench overload`: the proof that the loop protects users, judged by flows.
//!
//! ```text
//!  calibrate: closed-loop flows (no think time) on a fresh engine → capacity_flows_per_s
//!             (flows that finish within their deadline, per second; best of three concurrencies)
//!  then, for each configuration, a fresh deployment and the same seeded arrival plan:
//!     0.6× capacity (warm-up) ─ ramp ─ 3× held ≥ 60 s ─ 0.6× (recovery, the retry storm)
//!  baseline  FCFS scheduling, no critical reserve, controller in dry run (a plain vLLM)
//!  loop_off  criticality-first scheduling + reserve, controller in dry run
//!  loop_on   the same, controller publishing
//! ```
//!
//! A flow succeeds only when every call finishes before the flow's deadline (8 s agent flows,
//! 3 s login, 4 s basic Q&A); at the deadline the client hangs up and the engine cancels the
//! request. Clients are a mix of well-behaved, naive (1/2/4/8 s backoff) and impatient ones, and
//! users retry failed flows. Goodput = flows finished within their deadline per second.
//!
//! Output: progress and a table on stderr; `overload.json` (everything, timelines included),
//! `goodput.svg` (goodput over time, the three configurations) and `overload.md` (the table)
//! in `--out`; the last stdout line is `{"baseline": {...}, "loop_off": {...}, "loop_on": {...}}`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use brownout::loadgen::{ClientMix, Deadlines, LoadConfig, LoadReport, LoadShape};
use brownout_protocol::{Criticality, Tier};
use brownout_serving::scheduler::SchedulingPolicy;
use serde::Serialize;

use super::world::{World, WorldOptions};

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
    /// Shares of client kinds.
    #[arg(long, default_value = "well_behaved=0.6,naive=0.3,impatient=0.1")]
    pub client_mix: ClientMix,
    /// Whole-flow deadline overrides, `KIND=SECS,…` (`agent=10`, `login=3`, …).
    #[arg(long, default_value = "")]
    pub deadline: String,
    /// Chance that a user whose flow failed retries the whole flow.
    #[arg(long, default_value_t = 0.3)]
    pub flow_retry_prob: f64,
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

    fn parse_list(s: &str) -> anyhow::Result<Vec<Setup>> {
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
/// built-in default) with the small engines' knobs ([`super::world::PolicyKnobs`]), as the
/// demo runs it.
pub fn overload_policy() -> String {
    super::world::small_engines_policy()
}

/// The load shape in seconds from the start of a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Phases {
    pub warmup_s: f64,
    pub ramp_s: f64,
    pub hold_s: f64,
    pub recovery_s: f64,
    pub base_ratio: f64,
    pub overload_factor: f64,
}

impl Phases {
    pub fn total_s(&self) -> f64 {
        self.warmup_s + self.ramp_s + self.hold_s + self.recovery_s
    }

    /// When the offered load first exceeds the capacity (during the ramp).
    pub fn onset_s(&self) -> f64 {
        let span = self.overload_factor - self.base_ratio;
        let x = if span <= 0.0 || self.base_ratio >= 1.0 {
            0.0
        } else {
            ((1.0 - self.base_ratio) / span).clamp(0.0, 1.0)
        };
        self.warmup_s + self.ramp_s * x
    }

    /// When the overload ends (the drop back to the base load).
    pub fn end_s(&self) -> f64 {
        self.warmup_s + self.ramp_s + self.hold_s
    }

    /// The rate-factor profile, relative to the capacity.
    pub fn profile(&self) -> Vec<(Duration, f64)> {
        let d = Duration::from_secs_f64;
        vec![
            (Duration::ZERO, self.base_ratio),
            (d(self.warmup_s), self.base_ratio),
            (d(self.warmup_s + self.ramp_s), self.overload_factor),
            (d(self.end_s()), self.overload_factor),
            (d(self.end_s()), self.base_ratio),
            (d(self.total_s()), self.base_ratio),
        ]
    }
}

/// One applied (or, in dry run, decided) tier change, seconds from the start of the load, and
/// why: the decision's primary trigger and its detail.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    pub at_s: f64,
    pub from: u8,
    pub to: u8,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub trigger: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// One recorded decision (the controller records those that change the tier, its triggers or
/// the per-instance actions), seconds from the start of the load.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DecisionLine {
    pub at_s: f64,
    pub tier: u8,
    pub previous: u8,
    pub transition: String,
    pub trigger: String,
    pub detail: String,
    /// Every latched condition: `T<n> <trigger> = <value> (<condition>)`.
    pub latched: Vec<String>,
    /// Per-instance actions in force: `<instance> <action> (<trigger>: <detail>)`.
    pub actions: Vec<String>,
}

impl DecisionLine {
    fn from_record(d: &brownout::degrade::DecisionRecord, start_ms: u64) -> DecisionLine {
        DecisionLine {
            at_s: d.at_ms.saturating_sub(start_ms) as f64 / 1000.0,
            tier: d.tier.as_u8(),
            previous: d.previous.as_u8(),
            transition: serde_json::to_value(d.transition)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            trigger: d.trigger.clone(),
            detail: d.detail.clone(),
            latched: d
                .reasons
                .iter()
                .map(|c| {
                    format!(
                        "T{} {} = {} ({})",
                        c.tier.as_u8(),
                        c.trigger,
                        c.value.map_or("?".into(), |v| format!("{v:.3}")),
                        c.condition
                    )
                })
                .collect(),
            actions: d
                .instance_actions
                .iter()
                .map(|a| format!("{} {} ({}: {})", a.instance, a.action, a.trigger, a.detail))
                .collect(),
        }
    }
}

/// The tier timeline as text: one line per tier change with its reason.
pub fn timeline_text(changes: &[Change]) -> String {
    changes
        .iter()
        .map(|c| {
            format!(
                "{:>7.1} s  T{} → T{}  {}{}{}",
                c.at_s,
                c.from,
                c.to,
                c.trigger,
                if c.detail.is_empty() { "" } else { ": " },
                c.detail
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// What the tier did, from its changes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TierFigures {
    pub tier_changes: usize,
    /// Rises after a fall: the tier went down and came back up.
    pub flaps: usize,
    pub max_tier: u8,
    /// From the onset of the overload to the first change above T0 (negative: before it).
    pub onset_to_first_degradation_s: Option<f64>,
    /// From the end of the overload to the last return to T0 (0 when it was there already);
    /// `None` when it never left T0 or never came back.
    pub back_to_t0_s: Option<f64>,
}

/// Tier figures from the changes of one run.
pub fn tier_figures(changes: &[Change], onset_s: f64, end_s: f64) -> TierFigures {
    let mut flaps = 0;
    let mut last_down = false;
    for c in changes {
        let up = c.to > c.from;
        if up && last_down {
            flaps += 1;
        }
        last_down = !up;
    }
    let first = changes.iter().find(|c| c.to > 0).map(|c| c.at_s - onset_s);
    let back = match changes.last() {
        None => None,
        Some(l) if l.to != 0 => None,
        Some(l) => Some((l.at_s - end_s).max(0.0)),
    };
    TierFigures {
        tier_changes: changes.len(),
        flaps,
        max_tier: changes.iter().map(|c| c.to).max().unwrap_or(0),
        onset_to_first_degradation_s: first,
        back_to_t0_s: back,
    }
}

/// The figures of one configuration (the stdout JSON's parts).
#[derive(Debug, Clone, Serialize)]
pub struct Figures {
    /// Flows finished within their deadline per second, over the whole load.
    pub flow_goodput_per_s: f64,
    /// The same, between the overload's onset and its end.
    pub overload_goodput_per_s: f64,
    pub capacity_flows_per_s: f64,
    /// overload_goodput_per_s / capacity_flows_per_s.
    pub overload_goodput_vs_capacity: f64,
    pub critical_flow_success_rate: f64,
    pub default_flow_success_rate: f64,
    pub sheddable_flow_success_rate: f64,
    pub ttft_p50_s: BTreeMap<String, f64>,
    pub ttft_p99_s: BTreeMap<String, f64>,
    pub onset_to_first_degradation_s: Option<f64>,
    pub back_to_t0_s: Option<f64>,
    pub flaps: usize,
    pub tier_changes: usize,
    pub max_tier: u8,
    /// What the controller decided (in dry run: would have done).
    pub decided_tier_changes: usize,
    pub decided_first_degradation_s: Option<f64>,
    /// Requests refused with 429 / 503 `feature_disabled`, dropped from the engine's queue
    /// (expired), and hung up on by clients.
    pub shed: u64,
    pub disabled: u64,
    pub expired: u64,
    pub abandoned: u64,
    /// Users, flow tries (whole-flow retries included), and tries that missed their deadline.
    pub users: u64,
    pub flows: u64,
    pub deadline_missed: u64,
    pub flow_retries: u64,
    pub call_retries: u64,
    /// Tokens the engine generated that no successful flow used (the engine's count minus the
    /// tokens of flows that succeeded; the client's own count when /metrics was unreadable).
    pub wasted_tokens: u64,
    /// Tokens streamed to flows that failed anyway (what the client saw).
    pub wasted_tokens_client: u64,
    pub generated_tokens: Option<u64>,
    /// Requests the engine cancelled because the client hung up, and their tokens.
    pub engine_abandoned_requests: Option<u64>,
    pub engine_abandoned_tokens: Option<u64>,
    pub scheduling_policy: &'static str,
    pub controller: &'static str,
    /// The simulated GPU pace of the engine (ms per step; 0: the real CPU pace).
    pub simulate_step_ms: u64,
    /// The engine's critical step guard (tokens; 0: off).
    pub critical_step_tokens: usize,
    /// Onset and end of the overload in this run (ablations may use shorter phases).
    pub onset_s: f64,
    pub end_s: f64,
}

/// Everything one configuration produced (overload.json).
#[derive(Debug, Clone, Serialize)]
pub struct RunDetail {
    pub figures: Figures,
    pub phases: Phases,
    /// Applied tier changes with their reasons.
    pub changes: Vec<Change>,
    pub decided_changes: Vec<Change>,
    /// Every recorded decision of the run (reasons, latched conditions, per-instance actions).
    pub decisions: Vec<DecisionLine>,
    /// `(seconds, applied tier)` sampled every 500 ms.
    pub tier_samples: Vec<(f64, u8)>,
    /// `(seconds, requests waiting, requests running)` from the control plane's latest agent
    /// snapshots, sampled every 500 ms (what `queue_depth` and `expected_wait` read).
    pub engine_samples: Vec<(f64, u64, u64)>,
    /// `(window start s, flows/s)` in 5 s windows.
    pub goodput_series: Vec<(f64, f64)>,
    pub load: LoadReport,
}

/// Engine counters read from `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineCounters {
    pub generated: f64,
    /// Requests completed (`vllm:e2e_request_latency_seconds_count`: aborted ones left out),
    /// what the agent reports as `requests_completed_total` and the controller's measured
    /// service rate counts.
    pub completed: f64,
    pub abandoned_requests: f64,
    pub abandoned_tokens: f64,
}

/// Sums the series of the counters we need in a Prometheus text exposition.
pub fn parse_counters(text: &str) -> EngineCounters {
    let mut c = EngineCounters::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name_labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = name_labels.split('{').next().unwrap_or("");
        let Ok(v) = value.trim().parse::<f64>() else {
            continue;
        };
        match name {
            "vllm:generation_tokens_total" => c.generated += v,
            "vllm:e2e_request_latency_seconds_count" => c.completed += v,
            "brownout_serving_abandoned_requests_total" => c.abandoned_requests += v,
            "brownout_serving_abandoned_tokens_total" => c.abandoned_tokens += v,
            _ => {}
        }
    }
    c
}

async fn engine_counters(client: &reqwest::Client, url: &str) -> Option<EngineCounters> {
    let r = client
        .get(format!("{url}/metrics"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    r.status().is_success().then_some(())?;
    Some(parse_counters(&r.text().await.ok()?))
}

fn load_config(
    args: &OverloadArgs,
    targets: Vec<String>,
    shape: LoadShape,
    label: &str,
) -> anyhow::Result<LoadConfig> {
    let mut deadlines = Deadlines::default();
    deadlines
        .apply(&args.deadline)
        .map_err(anyhow::Error::msg)?;
    let mut c = LoadConfig::new(targets, shape);
    c.speed = args.speed;
    c.client_mix = args.client_mix;
    c.deadlines = deadlines;
    c.flow_retry_prob = args.flow_retry_prob;
    c.max_tokens = args.max_tokens;
    c.seed = args.seed;
    c.label = label.to_string();
    Ok(c)
}

/// Flows per second a fresh engine completes within their deadlines, closed loop without think
/// time: the best of `max_num_seqs/2`, `max_num_seqs` and `2×max_num_seqs` concurrent users.
async fn calibrate(
    args: &OverloadArgs,
    model: &str,
    policy: &str,
    step_ms: u64,
    guard: usize,
) -> anyhow::Result<Capacity> {
    let opts = WorldOptions {
        agents: false,
        ..Setup::LOOP_OFF.world_options(model, policy, step_ms, guard)?
    };
    let cfg = load_config(args, Vec::new(), LoadShape::default(), "calibrate")?;
    calibrate_capacity(
        opts,
        &cfg,
        Duration::from_secs(args.calibrate_secs),
        "bench overload",
    )
    .await
}

/// What a calibration measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Capacity {
    /// Flows finished within their deadlines per second, at the best concurrency.
    pub flows_per_s: f64,
    /// Requests the engines completed per second at that concurrency (all engines, aborted
    /// ones left out, as the controller's measured service rate counts them): the capacity in
    /// the unit the controller's `demand_ratio` and `expected_wait` divide by. `None` when an engine's
    /// counters could not be read.
    pub requests_per_s: Option<f64>,
    /// Requests/s the engines finished at the same concurrency with the policy's T2 in force
    /// (the fallback route, `max_tokens` capped): the capacity T2 adds, declared to the
    /// controller as `fallback_capacity_rps`. `None` when not measured.
    pub fallback_requests_per_s: Option<f64>,
}

/// The capacity of a fresh deployment built from `opts` (start it without agents and in dry
/// run, so nothing degrades while it is measured), in flows per second that finish within
/// their deadlines: users in a closed loop without think time on `template`'s flows (its
/// targets are replaced by the deployment's engines), the best of `max_num_seqs/2`,
/// `max_num_seqs` and `2×max_num_seqs` users per engine, `total` shared between the three;
/// and the request rate the engines finished at that concurrency. Used by `brownout-demo
/// bench overload` and by `brownout-demo demo` (which scales its evening peak to it).
/// Progress lines on stderr start with `label`.
///
/// # Errors
/// When the deployment cannot start or the load cannot run.
pub async fn calibrate_capacity(
    opts: WorldOptions,
    template: &LoadConfig,
    total: Duration,
    label: &str,
) -> anyhow::Result<Capacity> {
    let seqs = opts.engine.max_num_seqs.max(1);
    let t2 = brownout::degrade::Policy::from_yaml(&opts.policy_yaml)
        .ok()
        .map(|p| p.t2);
    let t2 = t2.as_ref();
    let world = World::start(opts).await?;
    let engines = world.engine_urls();
    let n = engines.len().max(1);
    let http = brownout::loadgen::http_client()?;
    let completed = async || -> Option<f64> {
        let mut sum = 0.0;
        for u in &engines {
            sum += engine_counters(&http, u).await?.completed;
        }
        Some(sum)
    };
    let mut cfg = template.clone();
    cfg.targets = engines.clone();
    cfg.label = "calibrate".into();
    cfg.progress = false;
    // No think time: a closed-loop user is then always on the engine, so the figure is what the
    // engine can serve (think time costs the engine nothing in the open-loop runs either).
    cfg.speed = 1e9;
    let each = Duration::from_secs_f64((total.as_secs_f64() / 3.0).max(2.0));
    let mut best = Capacity {
        flows_per_s: 0.0,
        requests_per_s: None,
        fallback_requests_per_s: None,
    };
    // Flows/s within deadline and requests/s finished by `users` in a closed loop.
    let measure = async |users: usize| -> anyhow::Result<(f64, Option<f64>)> {
        let before = completed().await;
        let started = Instant::now();
        let r = brownout::loadgen::closed_loop_flows_per_s(&cfg, users, each).await?;
        let secs = started.elapsed().as_secs_f64();
        let rps = match (before, completed().await) {
            (Some(b), Some(a)) if secs > 0.0 => Some((a - b).max(0.0) / secs),
            _ => None,
        };
        Ok((r, rps))
    };
    let mut best_users = 0;
    for c in [(seqs / 2).max(1), seqs, seqs * 2] {
        let users = c * n;
        let (r, rps) = measure(users).await?;
        eprintln!(
            "{label}: calibration: {users} users in a closed loop → {r:.2} flows/s within deadline, {} requests/s finished",
            rps.map_or_else(|| "?".to_string(), |v| format!("{v:.2}"))
        );
        if r > best.flows_per_s {
            best = Capacity {
                flows_per_s: r,
                requests_per_s: rps,
                fallback_requests_per_s: None,
            };
            best_users = users;
        }
    }
    // The T2 route at the best concurrency: each engine is told T2 directly (the controller
    // is in dry run), for as long as one concurrency took.
    if best_users > 0
        && let Some(t2) = t2
    {
        for (i, h) in world.engine_controls().iter().enumerate() {
            let cur = h.current().command.order_key();
            let mut cmd = brownout_protocol::Command::normal(
                h.cluster(),
                cur.0.max(1),
                cur.1 + 1,
                brownout_protocol::now_ms(),
                3_600_000,
            );
            cmd.tier = Tier::T2;
            cmd.reason.trigger = "operator".into();
            cmd.reason.detail = "calibration of the T2 route".into();
            cmd.model_route
                .insert("default".into(), t2.model_route.clone());
            cmd.limits.max_tokens_cap = Some(t2.max_tokens_cap);
            cmd.limits.max_num_seqs = Some(t2.max_num_seqs);
            h.apply(cmd, brownout_protocol::now_ms())
                .with_context(|| format!("pinning T2 on engine {i} for the calibration"))?;
        }
        let (r, rps) = measure(best_users).await?;
        eprintln!(
            "{label}: calibration: {best_users} users in a closed loop with T2 in force (route {}, max_tokens {}) → {r:.2} flows/s within deadline, {} requests/s finished",
            t2.model_route,
            t2.max_tokens_cap,
            rps.map_or_else(|| "?".to_string(), |v| format!("{v:.2}"))
        );
        best.fallback_requests_per_s = rps;
    }
    world.stop().await?;
    Ok(best)
}

/// `policy` with `capacity_rps` and `fallback_capacity_rps` (the calibrated capacities of the
/// primary and the T2 route, declared to the controller as a load test would tell an
/// operator), each unless the policy declares it already or it is unknown.
///
/// # Errors
/// YAML that does not parse.
pub fn declare_capacity(policy: &str, c: &Capacity) -> anyhow::Result<String> {
    let mut v: serde_yaml::Value = serde_yaml::from_str(policy).context("the policy YAML")?;
    let Some(m) = v.as_mapping_mut() else {
        anyhow::bail!("the policy YAML is not a mapping");
    };
    let mut changed = false;
    for (key, rps) in [
        ("capacity_rps", c.requests_per_s),
        ("fallback_capacity_rps", c.fallback_requests_per_s),
    ] {
        if let Some(rps) = rps.filter(|r| r.is_finite() && *r > 0.0)
            && !m.contains_key(key)
        {
            m.insert(key.into(), ((rps * 100.0).round() / 100.0).into());
            changed = true;
        }
    }
    if !changed {
        return Ok(policy.to_string());
    }
    Ok(serde_yaml::to_string(&v)?)
}

#[allow(clippy::too_many_arguments)]
async fn one_run(
    args: &OverloadArgs,
    model: &str,
    policy: &str,
    step_ms: u64,
    guard: usize,
    setup: Setup,
    capacity: f64,
    phases: &Phases,
) -> anyhow::Result<RunDetail> {
    let world = World::start(setup.world_options(model, policy, step_ms, guard)?).await?;
    let url = world.engine_urls().remove(0);
    let http = brownout::loadgen::http_client()?;
    let before = engine_counters(&http, &url).await;
    let shape = LoadShape {
        duration: Duration::from_secs_f64(phases.total_s()),
        base_rate: capacity,
        peak_factor: 1.0,
        burst_prob_per_s: 0.0,
        profile: phases.profile(),
        ..LoadShape::default()
    };
    let cfg = load_config(args, vec![url.clone()], shape, &setup.as_str())?;
    let start_ms = brownout_protocol::now_ms();
    let started = Instant::now();
    let control = world.engine_controls().remove(0);
    let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(f64, u8)>::new()));
    let queue = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(f64, u64, u64)>::new()));
    let sampler = {
        let (control, samples, queue) = (control.clone(), samples.clone(), queue.clone());
        let degrade = world.plane().degrade.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                let t = started.elapsed().as_secs_f64();
                let mut v = samples
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if v.len() < 100_000 {
                    v.push((t, control.tier().as_u8()));
                }
                drop(v);
                // What the control plane's latest snapshots say the engine holds.
                let snaps = degrade.inputs(brownout_protocol::now_ms()).snapshots;
                let (w, r) = snaps
                    .iter()
                    .flat_map(|s| &s.engines)
                    .fold((0, 0), |(w, r), e| {
                        (w + e.num_requests_waiting, r + e.num_requests_running)
                    });
                let mut q = queue
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if q.len() < 100_000 {
                    q.push((t, w, r));
                }
            }
        })
    };
    let load = brownout::loadgen::run_load(cfg).await?;
    // Let the tier come back to T0 (the loop's recovery), bounded.
    let settle_until = Instant::now() + Duration::from_secs(args.settle_secs);
    while setup.base == Base::LoopOn && control.tier() != Tier::T0 && Instant::now() < settle_until
    {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let after = engine_counters(&http, &url).await;
    sampler.abort();
    let tier_samples = samples
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let engine_samples = queue
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let decisions = world.plane().degrade.decisions();
    world.stop().await?;

    let to_change = |d: &brownout::degrade::DecisionRecord| Change {
        at_s: d.at_ms.saturating_sub(start_ms) as f64 / 1000.0,
        from: d.previous.as_u8(),
        to: d.tier.as_u8(),
        trigger: d.trigger.clone(),
        detail: d.detail.clone(),
    };
    let decision_lines: Vec<DecisionLine> = decisions
        .iter()
        .filter(|d| d.at_ms >= start_ms)
        .map(|d| DecisionLine::from_record(d, start_ms))
        .collect();
    let decided: Vec<Change> = decisions
        .iter()
        .filter(|d| d.tier != d.previous && d.at_ms >= start_ms)
        .map(to_change)
        .collect();
    let applied: Vec<Change> = decisions
        .iter()
        .filter(|d| d.tier != d.previous && d.at_ms >= start_ms && !d.dry_run)
        .map(to_change)
        .collect();
    let tf = tier_figures(&applied, phases.onset_s(), phases.end_s());
    let df = tier_figures(&decided, phases.onset_s(), phases.end_s());
    let mut figs = figures(setup, &load, capacity, phases, &tf, &df, before, after);
    figs.simulate_step_ms = step_ms;
    figs.critical_step_tokens = setup
        .world_options(model, policy, step_ms, guard)?
        .engine
        .critical_step_tokens;
    Ok(RunDetail {
        figures: figs,
        phases: *phases,
        changes: applied,
        decided_changes: decided,
        decisions: decision_lines,
        tier_samples,
        engine_samples,
        goodput_series: load.timeline.goodput_series(5),
        load,
    })
}

#[allow(clippy::too_many_arguments)]
fn figures(
    setup: Setup,
    load: &LoadReport,
    capacity: f64,
    phases: &Phases,
    tf: &TierFigures,
    df: &TierFigures,
    before: Option<EngineCounters>,
    after: Option<EngineCounters>,
) -> Figures {
    let classes = [
        Criticality::Critical,
        Criticality::Default,
        Criticality::Sheddable,
    ];
    let class = |c: Criticality| load.class(c);
    let success = |c| class(c).map_or(1.0, |x| x.flows.success_rate);
    let sum = |f: &dyn Fn(&brownout::loadgen::stats::ClassReport) -> u64| -> u64 {
        load.by_criticality.values().map(f).sum()
    };
    let useful = sum(&|c| c.flows.useful_tokens);
    let delta = match (before, after) {
        (Some(b), Some(a)) => Some(EngineCounters {
            generated: a.generated - b.generated,
            abandoned_requests: a.abandoned_requests - b.abandoned_requests,
            abandoned_tokens: a.abandoned_tokens - b.abandoned_tokens,
            completed: a.completed - b.completed,
        }),
        _ => None,
    };
    let generated = delta.map(|d| d.generated.max(0.0) as u64);
    let overload_goodput = load.timeline.goodput_between(
        Duration::from_secs_f64(phases.onset_s()),
        Duration::from_secs_f64(phases.end_s()),
    );
    Figures {
        flow_goodput_per_s: {
            let ok = sum(&|c| c.flows.by_end.get("ok").copied().unwrap_or(0));
            ok as f64 / phases.total_s().max(1e-9)
        },
        overload_goodput_per_s: overload_goodput,
        capacity_flows_per_s: capacity,
        overload_goodput_vs_capacity: if capacity > 0.0 {
            overload_goodput / capacity
        } else {
            0.0
        },
        critical_flow_success_rate: success(Criticality::Critical),
        default_flow_success_rate: success(Criticality::Default),
        sheddable_flow_success_rate: success(Criticality::Sheddable),
        ttft_p50_s: classes
            .iter()
            .map(|c| {
                (
                    c.as_str().to_string(),
                    class(*c).map_or(0.0, |x| x.ttft_p50_s),
                )
            })
            .collect(),
        ttft_p99_s: classes
            .iter()
            .map(|c| {
                (
                    c.as_str().to_string(),
                    class(*c).map_or(0.0, |x| x.ttft_p99_s),
                )
            })
            .collect(),
        onset_to_first_degradation_s: tf.onset_to_first_degradation_s,
        back_to_t0_s: tf.back_to_t0_s,
        flaps: tf.flaps,
        tier_changes: tf.tier_changes,
        max_tier: tf.max_tier,
        decided_tier_changes: df.tier_changes,
        decided_first_degradation_s: df.onset_to_first_degradation_s,
        shed: sum(&|c| c.shed),
        disabled: sum(&|c| c.disabled),
        expired: sum(&|c| c.expired),
        abandoned: sum(&|c| c.abandoned),
        users: sum(&|c| c.flows.users),
        flows: sum(&|c| c.flows.attempts),
        deadline_missed: sum(&|c| c.flows.by_end.get("deadline").copied().unwrap_or(0)),
        flow_retries: sum(&|c| c.flows.flow_retries),
        call_retries: sum(&|c| c.retries),
        wasted_tokens: generated.map_or(load.wasted_tokens, |g| g.saturating_sub(useful)),
        wasted_tokens_client: load.wasted_tokens,
        generated_tokens: generated,
        engine_abandoned_requests: delta.map(|d| d.abandoned_requests.max(0.0) as u64),
        engine_abandoned_tokens: delta.map(|d| d.abandoned_tokens.max(0.0) as u64),
        scheduling_policy: if setup.base == Base::Baseline {
            "fcfs"
        } else {
            "priority"
        },
        controller: if setup.base == Base::LoopOn {
            "on"
        } else {
            "dry_run"
        },
        simulate_step_ms: 0,
        critical_step_tokens: 0,
        onset_s: phases.onset_s(),
        end_s: phases.end_s(),
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn opt_s(x: Option<f64>) -> String {
    x.map_or("—".into(), |s| format!("{s:.1} s"))
}

/// One row of the table: its cell for a configuration.
type Row = Box<dyn Fn(&Figures) -> String>;

/// The results as a Markdown table (configurations as columns).
pub fn markdown_table(runs: &[(Setup, &Figures)]) -> String {
    let mut s = String::from("| |");
    for (c, _) in runs {
        s.push_str(&format!(" {} |", c.as_str()));
    }
    s.push_str("\n|---|");
    for _ in runs {
        s.push_str("---|");
    }
    s.push('\n');
    let rows: Vec<(&str, Row)> = vec![
        (
            "flow goodput, whole run (flows/s)",
            Box::new(|f| format!("{:.2}", f.flow_goodput_per_s)),
        ),
        (
            "flow goodput during the overload (flows/s)",
            Box::new(|f| {
                format!(
                    "{:.2} ({:.0}% of capacity)",
                    f.overload_goodput_per_s,
                    f.overload_goodput_vs_capacity * 100.0
                )
            }),
        ),
        (
            "critical flow success",
            Box::new(|f| pct(f.critical_flow_success_rate)),
        ),
        (
            "default flow success",
            Box::new(|f| pct(f.default_flow_success_rate)),
        ),
        (
            "sheddable flow success",
            Box::new(|f| pct(f.sheddable_flow_success_rate)),
        ),
        (
            "TTFT p50 / p99 critical",
            Box::new(|f| {
                format!(
                    "{:.2} / {:.2} s",
                    f.ttft_p50_s["critical"], f.ttft_p99_s["critical"]
                )
            }),
        ),
        (
            "TTFT p50 / p99 default",
            Box::new(|f| {
                format!(
                    "{:.2} / {:.2} s",
                    f.ttft_p50_s["default"], f.ttft_p99_s["default"]
                )
            }),
        ),
        (
            "TTFT p50 / p99 sheddable",
            Box::new(|f| {
                format!(
                    "{:.2} / {:.2} s",
                    f.ttft_p50_s["sheddable"], f.ttft_p99_s["sheddable"]
                )
            }),
        ),
        (
            "onset → first degradation",
            Box::new(|f| opt_s(f.onset_to_first_degradation_s)),
        ),
        (
            "overload end → back to T0",
            Box::new(|f| opt_s(f.back_to_t0_s)),
        ),
        (
            "tier changes / flaps / max tier",
            Box::new(|f| format!("{} / {} / T{}", f.tier_changes, f.flaps, f.max_tier)),
        ),
        (
            "decided (dry run) changes, first",
            Box::new(|f| {
                format!(
                    "{}, {}",
                    f.decided_tier_changes,
                    opt_s(f.decided_first_degradation_s)
                )
            }),
        ),
        (
            "users / flow tries / missed deadline",
            Box::new(|f| format!("{} / {} / {}", f.users, f.flows, f.deadline_missed)),
        ),
        (
            "shed / disabled / expired / hung up",
            Box::new(|f| {
                format!(
                    "{} / {} / {} / {}",
                    f.shed, f.disabled, f.expired, f.abandoned
                )
            }),
        ),
        (
            "call retries / flow retries",
            Box::new(|f| format!("{} / {}", f.call_retries, f.flow_retries)),
        ),
        (
            "wasted tokens (engine) / generated",
            Box::new(|f| {
                format!(
                    "{} / {}",
                    f.wasted_tokens,
                    f.generated_tokens.map_or("?".into(), |g| g.to_string())
                )
            }),
        ),
    ];
    for (name, f) in rows {
        s.push_str(&format!("| {name} |"));
        for (_, fig) in runs {
            s.push_str(&format!(" {} |", f(fig)));
        }
        s.push('\n');
    }
    s
}

/// The one-line JSON the benchmark prints last.
pub fn summary_json(runs: &[(Setup, &Figures)]) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (c, f) in runs {
        m.insert(
            c.as_str().into(),
            serde_json::to_value(f).unwrap_or_default(),
        );
    }
    serde_json::Value::Object(m)
}

/// The load average of the machine (it is shared; the results say so).
fn load_average() -> Option<String> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

/// Runs the benchmark; the last stdout line is `{"baseline": {...}, "loop_off": {...}, "loop_on": {...}}`.
///
/// # Errors
/// Bad arguments, a deployment that cannot start, an output directory that cannot be written.
pub async fn run(args: OverloadArgs) -> anyhow::Result<()> {
    let setups = Setup::parse_list(&args.configs)?;
    anyhow::ensure!(
        args.overload_factor > 1.0 && args.overload_factor.is_finite(),
        "--overload-factor must be above 1"
    );
    anyhow::ensure!(
        args.base_load_ratio > 0.0 && args.base_load_ratio < 1.0,
        "--base-load-ratio must be in (0, 1)"
    );
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.flow_retry_prob),
        "--flow-retry-prob must be in [0, 1]"
    );
    anyhow::ensure!(
        args.speed > 0.0 && args.speed.is_finite(),
        "--speed must be positive"
    );
    Deadlines::default()
        .apply(&args.deadline)
        .map_err(anyhow::Error::msg)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let model = args.model.clone().unwrap_or_else(super::default_model);
    let policy = match &args.policy {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("reading --policy {}", p.display()))?,
        None => overload_policy(),
    };
    for s in &setups {
        let o = s.world_options(&model, &policy, 0, 0)?;
        brownout::degrade::Policy::from_yaml(&o.policy_yaml)
            .with_context(|| format!("the policy of {}", s.as_str()))?;
    }
    let step_ms = args
        .simulate_step_ms
        .unwrap_or(if model == "tiny-random" { 25 } else { 0 });
    let guard = args
        .critical_step_tokens
        .unwrap_or(if step_ms > 0 { 0 } else { 4 });
    let pace = if step_ms > 0 {
        format!("simulated GPU pace {step_ms} ms/step")
    } else {
        "real CPU pace".to_string()
    };
    let phases = Phases {
        warmup_s: args.warmup_secs as f64,
        ramp_s: args.ramp_secs as f64,
        hold_s: args.hold_secs as f64,
        recovery_s: args.recovery_secs as f64,
        base_ratio: args.base_load_ratio,
        overload_factor: args.overload_factor,
    };
    let ablation_phases = Phases {
        hold_s: args.ablation_hold_secs.unwrap_or(args.hold_secs) as f64,
        recovery_s: args.ablation_recovery_secs.unwrap_or(args.recovery_secs) as f64,
        ..phases
    };
    eprintln!(
        "bench overload: model {model} ({pace}, critical step guard {guard} tokens); load average {}; configurations {}",
        load_average().unwrap_or_else(|| "?".into()),
        setups
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let measured = match args.capacity_flows_per_s {
        Some(c) => {
            anyhow::ensure!(
                c > 0.0 && c.is_finite(),
                "--capacity-flows-per-s must be positive"
            );
            if let Some(r) = args.capacity_rps {
                anyhow::ensure!(r > 0.0 && r.is_finite(), "--capacity-rps must be positive");
            }
            Capacity {
                flows_per_s: c,
                requests_per_s: args.capacity_rps,
                fallback_requests_per_s: args.fallback_capacity_rps,
            }
        }
        None => calibrate(&args, &model, &policy, step_ms, guard)
            .await
            .context("calibrating the capacity")?,
    };
    let capacity = measured.flows_per_s;
    anyhow::ensure!(
        capacity > 0.0,
        "no flow finished within its deadline while calibrating: the model is too slow for these deadlines (try --deadline agent=20,login=8,basic_qa=10)"
    );
    // The controller is told the capacity the calibration measured, in requests/s, as a load
    // test would tell an operator (`capacity_rps`, docs/DEGRADATION.md), unless the policy
    // declares its own.
    let policy = declare_capacity(&policy, &measured)?;
    let declared_policy = brownout::degrade::Policy::from_yaml(&policy)
        .context("the policy with the declared capacity")?;
    let declared = declared_policy.declared_capacity_rps;
    let declared_fallback = declared_policy.declared_fallback_capacity_rps;
    eprintln!(
        "bench overload: capacity {capacity:.2} flows/s, declared to the controller: {}; {:.0} s warm-up at {:.1}×, {:.0} s ramp, {:.0} s at {:.1}×, {:.0} s recovery (onset at {:.1} s, end at {:.0} s)",
        match (declared, declared_fallback) {
            (None, None) => "none (pass --capacity-rps with --capacity-flows-per-s)".to_string(),
            (p, f) => format!(
                "capacity_rps {}, fallback_capacity_rps {}",
                p.map_or_else(|| "-".into(), |r| format!("{r:.2}")),
                f.map_or_else(|| "-".into(), |r| format!("{r:.2}"))
            ),
        },
        phases.warmup_s,
        phases.base_ratio,
        phases.ramp_s,
        phases.hold_s,
        phases.overload_factor,
        phases.recovery_s,
        phases.onset_s(),
        phases.end_s()
    );
    let mut details: Vec<(Setup, RunDetail)> = Vec::new();
    let write = |name: &str, body: &str| {
        let p = args.out.join(name);
        std::fs::write(&p, body).with_context(|| format!("writing {}", p.display()))
    };
    for (i, setup) in setups.iter().enumerate() {
        let ph = if setup.ablation.is_some() {
            &ablation_phases
        } else {
            &phases
        };
        eprintln!(
            "bench overload: run {}/{}: {} (onset at {:.1} s, end at {:.0} s)",
            i + 1,
            setups.len(),
            setup.as_str(),
            ph.onset_s(),
            ph.end_s()
        );
        let d = one_run(&args, &model, &policy, step_ms, guard, *setup, capacity, ph)
            .await
            .with_context(|| format!("the {} run", setup.as_str()))?;
        eprintln!("{}", d.load.human());
        if !d.changes.is_empty() {
            eprintln!(
                "bench overload: {} tier timeline:\n{}",
                setup.as_str(),
                timeline_text(&d.changes)
            );
        }
        details.push((*setup, d));
        // Written after every run, so a run cut short keeps what it measured.
        let figs: Vec<(Setup, &Figures)> = details.iter().map(|(s, d)| (*s, &d.figures)).collect();
        let mut md = markdown_table(&figs);
        for (s, d) in &details {
            if !d.changes.is_empty() {
                md.push_str(&format!(
                    "\n{} tier timeline (applied; s from the start, onset {:.1} s, end {:.0} s):\n\n```\n{}\n```\n",
                    s.as_str(),
                    d.phases.onset_s(),
                    d.phases.end_s(),
                    timeline_text(&d.changes)
                ));
            }
        }
        let all = serde_json::json!({
            "model": model,
            "pace": pace,
            "simulate_step_ms": step_ms,
            "critical_step_tokens": guard,
            "load_average_at_start": load_average(),
            "phases": phases,
            "ablation_phases": ablation_phases,
            "capacity_flows_per_s": capacity,
            "capacity_rps": measured.requests_per_s,
            "fallback_capacity_rps": measured.fallback_requests_per_s,
            "declared_capacity_rps": declared,
            "declared_fallback_capacity_rps": declared_fallback,
            "runs": details.iter().map(|(s, d)| (s.as_str(), d)).collect::<BTreeMap<_, _>>(),
        });
        write("overload.json", &serde_json::to_string_pretty(&all)?)?;
        write("overload.md", &md)?;
    }
    let figs: Vec<(Setup, &Figures)> = details.iter().map(|(s, d)| (*s, &d.figures)).collect();
    let table = markdown_table(&figs);
    // The chart: the three configurations without ablations (they share the phases).
    let names: Vec<String> = details
        .iter()
        .filter(|(s, _)| s.ablation.is_none())
        .map(|(s, _)| s.as_str())
        .collect();
    let series: Vec<(&str, Vec<(f64, f64)>)> = details
        .iter()
        .filter(|(s, _)| s.ablation.is_none())
        .zip(&names)
        .map(|((_, d), n)| (n.as_str(), d.goodput_series.clone()))
        .collect();
    let title = format!("{model}, {pace}");
    let svg =
        super::chart::goodput_chart(&series, capacity, phases.onset_s(), phases.end_s(), &title);
    write("goodput.svg", &svg)?;
    eprintln!("{table}");
    eprintln!(
        "bench overload: wrote {0}/overload.json, {0}/goodput.svg, {0}/overload.md",
        args.out.display()
    );
    println!("{}", summary_json(&figs));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ch(at_s: f64, from: u8, to: u8) -> Change {
        Change {
            at_s,
            from,
            to,
            trigger: String::new(),
            detail: String::new(),
        }
    }

    #[test]
    fn tier_figures_count_flaps_onset_and_recovery() {
        // Up at 42 s (onset 40), T3, down, up again (a flap), back to T0 at 130 s (end 100).
        let c = [
            ch(42.0, 0, 1),
            ch(45.0, 1, 3),
            ch(90.0, 3, 2),
            ch(95.0, 2, 3),
            ch(110.0, 3, 1),
            ch(130.0, 1, 0),
        ];
        let f = tier_figures(&c, 40.0, 100.0);
        assert_eq!((f.tier_changes, f.flaps, f.max_tier), (6, 1, 3));
        assert_eq!(f.onset_to_first_degradation_s, Some(2.0));
        assert_eq!(f.back_to_t0_s, Some(30.0));
        // Never degraded; degraded and never back.
        let none = tier_figures(&[], 40.0, 100.0);
        assert_eq!(
            (none.onset_to_first_degradation_s, none.back_to_t0_s),
            (None, None)
        );
        let stuck = tier_figures(&c[..2], 40.0, 100.0);
        assert_eq!(stuck.back_to_t0_s, None);
        assert_eq!(stuck.flaps, 0);
        // Back at T0 before the overload ended: 0.
        assert_eq!(
            tier_figures(&[ch(50.0, 0, 1), ch(80.0, 1, 0)], 40.0, 100.0).back_to_t0_s,
            Some(0.0)
        );
    }

    #[test]
    fn phases_place_the_onset_where_the_ramp_crosses_capacity() {
        let p = Phases {
            warmup_s: 30.0,
            ramp_s: 12.0,
            hold_s: 60.0,
            recovery_s: 60.0,
            base_ratio: 0.6,
            overload_factor: 3.0,
        };
        assert!((p.onset_s() - 32.0).abs() < 1e-9);
        assert_eq!(p.end_s(), 102.0);
        assert_eq!(p.total_s(), 162.0);
        let shape = LoadShape {
            duration: Duration::from_secs(162),
            profile: p.profile(),
            ..LoadShape::default()
        };
        assert!((shape.factor(Duration::from_secs_f64(32.0)) - 1.0).abs() < 1e-9);
        assert_eq!(shape.factor(Duration::from_secs(70)), 3.0);
        assert_eq!(shape.factor(Duration::from_secs(120)), 0.6);
    }

    #[test]
    fn counters_are_summed_from_the_exposition() {
        let text = "# HELP x\nvllm:generation_tokens_total{model_name=\"a\"} 120\nvllm:generation_tokens_total{model_name=\"b\"} 5\nbrownout_serving_abandoned_tokens_total{model_name=\"a\"} 7\nbrownout_serving_abandoned_requests_total 2\nother 9\nvllm:e2e_request_latency_seconds_count{model_name=\"a\"} 30\nvllm:e2e_request_latency_seconds_count{model_name=\"b\"} 4\nvllm:request_success_total{model_name=\"a\",finished_reason=\"abort\"} 4\n";
        let c = parse_counters(text);
        assert_eq!(
            (
                c.generated,
                c.abandoned_tokens,
                c.abandoned_requests,
                c.completed
            ),
            (125.0, 7.0, 2.0, 34.0)
        );
    }

    #[test]
    fn configurations_parse_and_deploy_as_documented() {
        assert_eq!(
            Setup::parse_list("loop_on, baseline,loop_on").unwrap(),
            vec![Setup::LOOP_ON, Setup::BASELINE]
        );
        assert!(Setup::parse_list("vllm").is_err());
        assert!(Setup::parse_list("loop_on:no-such-thing").is_err());
        assert!(Setup::parse_list(" ").is_err());
        assert_eq!(
            Setup::parse_list("all").unwrap().len(),
            3 + Ablation::ALL.len()
        );
        let owned = overload_policy();
        let p = owned.as_str();
        let b = Setup::BASELINE
            .world_options("tiny-random", p, 25, 4)
            .unwrap();
        assert_eq!(b.engine.scheduling_policy, SchedulingPolicy::Fcfs);
        assert_eq!(b.engine.critical_reserve_ratio, 0.0);
        assert_eq!(b.engine.simulate_step_ms, 25);
        assert!(b.dry_run);
        let off = Setup::LOOP_OFF
            .world_options("tiny-random", p, 25, 4)
            .unwrap();
        assert_eq!(off.engine.scheduling_policy, SchedulingPolicy::Priority);
        assert!(off.engine.critical_reserve_ratio > 0.0);
        assert_eq!(off.engine.critical_step_tokens, 4);
        assert_eq!(
            b.engine.critical_step_tokens, 0,
            "the baseline has no guard"
        );
        assert!(off.dry_run);
        assert!(
            !Setup::LOOP_ON
                .world_options("tiny-random", p, 25, 4)
                .unwrap()
                .dry_run
        );
        let abl = |a| {
            Setup::parse_list(&format!("loop_on:{}", Ablation::as_str(a))).unwrap()[0]
                .world_options("tiny-random", p, 25, 4)
                .unwrap()
        };
        assert_eq!(
            abl(Ablation::NoCriticalReserve)
                .engine
                .critical_reserve_ratio,
            0.0
        );
        assert!(abl(Ablation::NoRefusalAwareSlis).refusals_as_errors);
        assert_eq!(
            abl(Ablation::NoCriticalStepGuard)
                .engine
                .critical_step_tokens,
            0
        );
        assert_eq!(abl(Ablation::NoFastTriggers).engine.critical_step_tokens, 4);
        assert!(!abl(Ablation::NoFastTriggers).refusals_as_errors);
    }

    #[test]
    fn ablations_remove_exactly_their_mechanism_from_the_policy() {
        use brownout::degrade::policy::{Condition, Signal};
        let owned = overload_policy();
        let op = owned.as_str();
        let full = brownout::degrade::Policy::from_yaml(op).unwrap();
        assert!(full.ramp.is_some() && full.instances.is_some());
        let fast = |p: &brownout::degrade::Policy| {
            p.tiers
                .iter()
                .flat_map(|t| &t.enter)
                .filter(|c| match c {
                    Condition::Jump { .. } => true,
                    Condition::Threshold { signal, .. } => {
                        matches!(signal, Signal::TtftP99 | Signal::QueueWaitP99)
                    }
                    _ => false,
                })
                .count()
        };
        assert!(fast(&full) > 0);
        let get =
            |a| brownout::degrade::Policy::from_yaml(&ablate_policy(op, Some(a)).unwrap()).unwrap();
        let nf = get(Ablation::NoFastTriggers);
        assert_eq!(fast(&nf), 0);
        let total =
            |p: &brownout::degrade::Policy| p.tiers.iter().map(|t| t.enter.len()).sum::<usize>();
        assert_eq!(
            total(&nf) + fast(&full),
            total(&full),
            "only the fast triggers go"
        );
        assert_eq!(nf.ramp, full.ramp);
        // Entry conditions on one signal, over every tier.
        let on = |p: &brownout::degrade::Policy, sig: Signal| {
            p.tiers
                .iter()
                .flat_map(|t| &t.enter)
                .filter(|c| matches!(c, Condition::Threshold { signal, .. } if *signal == sig))
                .count()
        };
        let demand = |p: &brownout::degrade::Policy| on(p, Signal::DemandRatio);
        assert!(demand(&full) > 0);
        assert_eq!(demand(&nf), demand(&full));
        let nd = get(Ablation::NoDemandTrigger);
        assert_eq!((demand(&nd), fast(&nd)), (0, fast(&full)));
        let wait = |p: &brownout::degrade::Policy| on(p, Signal::ExpectedWait);
        assert!(wait(&full) > 0);
        assert_eq!(wait(&nf), wait(&full), "expected_wait is not a latency p99");
        let nw = get(Ablation::NoWaitTrigger);
        assert_eq!(wait(&nw), 0);
        assert_eq!(total(&nw) + wait(&full), total(&full));
        let nr = get(Ablation::NoAdmissionRamp);
        assert!(nr.ramp.is_none());
        assert_eq!(nr.tiers, full.tiers);
        let ni = get(Ablation::NoInstanceActions);
        assert!(ni.instances.is_none());
        assert_eq!(ni.ramp, full.ramp);
        assert_eq!(get(Ablation::NoCriticalReserve), full);
        assert_eq!(ablate_policy(op, None).unwrap(), op);
        // The calibrated capacity is declared, and its ablation takes only that away.
        assert_eq!(full.declared_capacity_rps, None, "the file declares none");
        let cap = |p: Option<f64>, f: Option<f64>| Capacity {
            flows_per_s: 1.0,
            requests_per_s: p,
            fallback_requests_per_s: f,
        };
        let declared = declare_capacity(op, &cap(Some(7.5), Some(15.25))).unwrap();
        let with = brownout::degrade::Policy::from_yaml(&declared).unwrap();
        assert_eq!(with.declared_capacity_rps, Some(7.5));
        assert_eq!(with.declared_fallback_capacity_rps, Some(15.25));
        assert_eq!((&with.tiers, &with.ramp), (&full.tiers, &full.ramp));
        let again = declare_capacity(&declared, &cap(Some(99.0), None)).unwrap();
        assert_eq!(
            brownout::degrade::Policy::from_yaml(&again)
                .unwrap()
                .declared_capacity_rps,
            Some(7.5),
            "a policy's own capacity_rps is kept"
        );
        assert_eq!(declare_capacity(op, &cap(None, None)).unwrap(), op);
        let without = brownout::degrade::Policy::from_yaml(
            &ablate_policy(&declared, Some(Ablation::NoDeclaredCapacity)).unwrap(),
        )
        .unwrap();
        assert_eq!(without.declared_capacity_rps, None);
        assert_eq!(without.declared_fallback_capacity_rps, Some(15.25));
        assert_eq!(without.tiers, full.tiers);
        let nf = brownout::degrade::Policy::from_yaml(
            &ablate_policy(&declared, Some(Ablation::NoFallbackCapacity)).unwrap(),
        )
        .unwrap();
        assert_eq!(
            (nf.declared_capacity_rps, nf.declared_fallback_capacity_rps),
            (Some(7.5), None)
        );
        // The loop's own mechanisms: excess-only T3 and exits that read the demand.
        assert!(full.t3.admit_capacity_ratio.is_some());
        assert!(full.exit_demand_ratio.is_some());
        let ne = get(Ablation::NoExcessAdmission);
        assert_eq!((ne.t3.admit_capacity_ratio, &ne.tiers), (None, &full.tiers));
        let nx = get(Ablation::NoDemandExit);
        assert_eq!((nx.exit_demand_ratio, &nx.tiers), (None, &full.tiers));
    }
}
