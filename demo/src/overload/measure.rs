//! What a run measures: the load phases, the tier changes and decisions, the engine counters
//! read from `/metrics`, and the figures computed from them.

use std::collections::BTreeMap;
use std::time::Duration;

use brownout::loadgen::LoadReport;
use brownout_protocol::Criticality;
use brownout_protocol::wire::metric;
use serde::Serialize;

use super::cli::*;

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
    pub(super) fn from_record(
        d: &brownout::degrade::DecisionRecord,
        start_ms: u64,
    ) -> DecisionLine {
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
            metric::GENERATION_TOKENS_TOTAL => c.generated += v,
            "vllm:e2e_request_latency_seconds_count" => c.completed += v,
            metric::SERVING_ABANDONED_REQUESTS_TOTAL => c.abandoned_requests += v,
            metric::SERVING_ABANDONED_TOKENS_TOTAL => c.abandoned_tokens += v,
            _ => {}
        }
    }
    c
}

pub(super) async fn engine_counters(client: &reqwest::Client, url: &str) -> Option<EngineCounters> {
    let r = client
        .get(format!("{url}/metrics"))
        .timeout(Duration::from_secs(5))
        .send()
        .await
        .ok()?;
    r.status().is_success().then_some(())?;
    Some(parse_counters(&r.text().await.ok()?))
}

#[allow(clippy::too_many_arguments)]
pub(super) fn figures(
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
