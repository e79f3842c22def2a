//! The degradation state machine: inputs in, a tier and its reasons out. No IO, no clock, no tokio.
//!
//! ```text
//!  per condition:   idle ──(value > above for `for`)──> latched ──(value < exit_below)──> idle
//!                   (alerts: latched while firing)
//!  per controller:  target = highest tier with a latched condition
//!                   target > tier            → jump straight to target (enter fast)
//!                   nothing latched ≥ tier   → after `hold_down` of that tier, tier − 1 (leave slowly)
//!                   operator override        → pinned tier until it ends
//! ```
//!
//! Two mechanisms stop a signal oscillating around a threshold from flapping tiers: a condition
//! unlatches only below its separate, lower exit threshold, and a tier is left only after every
//! condition of it and the tiers above stayed clear for the whole hold-down.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use brownout_protocol::{AgentSnapshot, FeatureState, InstanceEntry, Limits, Reason, Shed, Tier};
use serde::{Deserialize, Serialize};

use super::policy::{Condition, Policy, Signal};
pub use super::stopbleed::{InstanceAction, InstanceOverride};
use super::stopbleed::{RouteContext, StopBleedState, TierContext};

/// One SLO alert's state, as the SLO engine reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SloAlert {
    pub slo: String,
    /// `page` (fast burn pair) or `ticket` (slow burn pair), as the SLO engine names them.
    pub severity: String,
    pub firing: bool,
    /// The burn rate of the pair's long window now (for reasons and the recovery trend).
    #[serde(default)]
    pub burn_rate: f64,
    /// The burn-rate threshold of the pair (e.g. 14.4).
    #[serde(default)]
    pub threshold: f64,
    /// The window pair, e.g. `5m/1h`.
    #[serde(default)]
    pub window: String,
}

/// A failure pattern first seen recently, with its current rate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PatternRate {
    pub pattern_id: String,
    pub per_min: f64,
}

/// An operator's pinned tier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Override {
    pub tier: Tier,
    pub until_ms: u64,
    pub reason: String,
}

/// Everything one evaluation looks at.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    pub now_ms: u64,
    /// The latest snapshot per host.
    pub snapshots: Vec<AgentSnapshot>,
    pub slo_alerts: Vec<SloAlert>,
    /// Names of the Alertmanager alerts firing now.
    pub alertmanager_firing: BTreeSet<String>,
    pub new_patterns: Vec<PatternRate>,
    pub operator_override: Option<Override>,
    /// Operator per-instance actions by instance id.
    pub instance_overrides: BTreeMap<String, InstanceOverride>,
}

/// Which input crossed which threshold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Crossing {
    /// The tier whose condition this is.
    pub tier: Tier,
    /// `gpu_util`, `kv_usage`, `vram`, `queue_depth`, `new_pattern`, `slo_burn`, `alertmanager`,
    /// `operator`.
    pub trigger: String,
    /// The condition as written in the policy.
    pub condition: String,
    /// The signal's value now (alerts: the burn rate when known).
    pub value: Option<f64>,
    /// The threshold crossed.
    pub threshold: Option<f64>,
    /// When the condition latched (unix ms).
    pub since_ms: u64,
}

/// How this evaluation moved the tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transition {
    /// Same tier as before.
    Hold,
    /// Raised (possibly by several tiers).
    Enter,
    /// Lowered by one tier after the hold-down.
    StepDown,
    /// Set by an operator override (either direction).
    Override,
}

/// The outcome of one evaluation: the tier and every field of the command it implies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub at_ms: u64,
    pub tier: Tier,
    pub previous: Tier,
    pub transition: Transition,
    /// Every latched condition (for tiers ≥ 1), highest tier first. Empty at T0.
    pub reasons: Vec<Crossing>,
    /// The command's `reason` (from the highest-tier crossing, or `recovered`/`operator`).
    pub reason: Reason,
    pub features: BTreeMap<String, FeatureState>,
    pub model_route: BTreeMap<String, String>,
    pub limits: Limits,
    pub shed: Option<Shed>,
    /// When a step down is next possible (unix ms), if the tier is clear now.
    pub step_down_at_ms: Option<u64>,
    /// The command's `instances` (per-instance stop-bleed, operator actions, the ramp's `"*"`).
    #[serde(default)]
    pub instances: BTreeMap<String, InstanceEntry>,
    /// Why each entry is there, plus watches and detected retry waves.
    #[serde(default)]
    pub instance_actions: Vec<InstanceAction>,
}

#[derive(Debug, Clone, Default)]
struct CondState {
    /// When the value first went above the enter threshold in the current run.
    above_since: Option<u64>,
    /// When the condition latched.
    latched_since: Option<u64>,
    /// The value at the last evaluation (alerts: burn rate).
    value: Option<f64>,
}

/// The controller: policy plus the memory hysteresis needs.
#[derive(Debug, Clone)]
pub struct Controller {
    policy: Policy,
    tier: Tier,
    /// Per tier (T1..T3), per enter condition.
    conds: [Vec<CondState>; 3],
    /// Since when every condition at or above the current tier has been clear.
    clear_since: Option<u64>,
    /// Recent values per signal (and per SLO burn rate) for the recovery trend.
    trend: BTreeMap<String, VecDeque<(u64, f64)>>,
    override_active: bool,
    /// Per engine (instance key): recent (ms, TTFT p99, queue-wait p99), for `p99_jump`.
    latency: BTreeMap<String, VecDeque<(u64, f64, f64)>>,
    /// The longest `p99_jump` window of the policy.
    jump_window_ms: u64,
    stop_bleed: StopBleedState,
}

impl Controller {
    pub fn new(policy: Policy) -> Controller {
        let conds = [
            vec![CondState::default(); policy.tiers[0].enter.len()],
            vec![CondState::default(); policy.tiers[1].enter.len()],
            vec![CondState::default(); policy.tiers[2].enter.len()],
        ];
        let jump_window_ms = policy
            .tiers
            .iter()
            .flat_map(|t| &t.enter)
            .filter_map(|c| match c {
                Condition::Jump { window_ms, .. } => Some(*window_ms),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        Controller {
            policy,
            tier: Tier::T0,
            conds,
            clear_since: None,
            trend: BTreeMap::new(),
            override_active: false,
            latency: BTreeMap::new(),
            jump_window_ms,
            stop_bleed: StopBleedState::default(),
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    pub fn tier(&self) -> Tier {
        self.tier
    }

    /// Resumes at `tier` (e.g. a new leader reading the tier in force): it will hold it until the
    /// hold-down passes with every condition clear.
    pub fn resume_at(&mut self, tier: Tier, now_ms: u64) {
        self.tier = tier;
        self.clear_since = Some(now_ms);
    }

    /// The value of a numeric signal over fresh snapshots / patterns.
    pub fn signal_value(&self, signal: Signal, inputs: &Inputs) -> f64 {
        let fresh = inputs
            .snapshots
            .iter()
            .filter(|s| inputs.now_ms.saturating_sub(s.ts_ms) <= self.policy.snapshot_stale_ms);
        match signal {
            Signal::GpuUtil => fresh.map(AgentSnapshot::max_gpu_util).fold(0.0, f64::max),
            Signal::KvUsage => fresh.map(AgentSnapshot::max_kv_usage).fold(0.0, f64::max),
            Signal::Vram => fresh.map(AgentSnapshot::max_vram_ratio).fold(0.0, f64::max),
            Signal::QueueDepth => fresh.map(|s| s.queue_depth() as f64).sum(),
            Signal::NewPatternRate => inputs
                .new_patterns
                .iter()
                .map(|p| p.per_min)
                .fold(0.0, f64::max),
            Signal::TtftP99 => fresh
                .flat_map(|s| s.engines.iter().filter(|e| e.up))
                .map(|e| e.ttft_p99_s)
                .filter(|v| v.is_finite())
                .fold(0.0, f64::max),
            Signal::QueueWaitP99 => fresh
                .flat_map(|s| s.engines.iter().filter(|e| e.up))
                .map(|e| e.queue_wait_p99_s)
                .filter(|v| v.is_finite())
                .fold(0.0, f64::max),
            Signal::DemandRatio => self.stop_bleed.demand_ratio(),
            Signal::FallbackDemandRatio => self.stop_bleed.fallback_demand_ratio(),
            Signal::ExpectedWait => {
                let in_system: u64 = fresh
                    .flat_map(|s| s.engines.iter().filter(|e| e.up))
                    .map(|e| e.num_requests_waiting + e.num_requests_running)
                    .sum();
                self.stop_bleed
                    .expected_wait_s(in_system as f64, self.tier >= Tier::T2)
            }
        }
    }

    /// Records each fresh engine's latency p99s (for `p99_jump`).
    fn record_latency(&mut self, inputs: &Inputs) {
        if self.jump_window_ms == 0 {
            return;
        }
        let now = inputs.now_ms;
        for s in inputs
            .snapshots
            .iter()
            .filter(|s| now.saturating_sub(s.ts_ms) <= self.policy.snapshot_stale_ms)
        {
            for e in s.engines.iter().filter(|e| e.up) {
                let q = self.latency.entry(s.instance_key(e)).or_default();
                q.push_back((now, e.ttft_p99_s, e.queue_wait_p99_s));
            }
        }
        let window = self.jump_window_ms;
        self.latency.retain(|_, q| {
            while q
                .front()
                .is_some_and(|(t, _, _)| now.saturating_sub(*t) > window)
            {
                q.pop_front();
            }
            while q.len() > 4096 {
                q.pop_front();
            }
            q.back().is_some_and(|(t, _, _)| *t == now)
        });
    }

    /// The highest ratio, over engines, of `signal` now to its lowest non-zero value over the
    /// last `window_ms`, counting only engines at or above `min_value` now.
    fn jump_ratio(&self, signal: Signal, window_ms: u64, min_value: f64, now: u64) -> f64 {
        let pick = |t: &(u64, f64, f64)| {
            if signal == Signal::TtftP99 { t.1 } else { t.2 }
        };
        let mut best: f64 = 0.0;
        for q in self.latency.values() {
            let Some(last) = q.back().filter(|t| t.0 == now) else {
                continue;
            };
            let cur = pick(last);
            if !(cur.is_finite() && cur >= min_value) {
                continue;
            }
            let low = q
                .iter()
                .filter(|t| t.0 < now && now.saturating_sub(t.0) <= window_ms)
                .map(pick)
                .filter(|v| v.is_finite() && *v > 0.0)
                .fold(f64::INFINITY, f64::min);
            if low.is_finite() {
                best = best.max(cur / low);
            }
        }
        best
    }

    /// One evaluation.
    pub fn step(&mut self, inputs: &Inputs) -> Decision {
        let now = inputs.now_ms;
        let values: BTreeMap<Signal, f64> = Signal::ALL
            .iter()
            .map(|s| (*s, self.signal_value(*s, inputs)))
            .collect();
        self.record_trend(now, &values, inputs);
        self.record_latency(inputs);

        // 1. Update every condition's latch.
        let t3_now = self.tier == Tier::T3;
        for (ti, tp) in self.policy.tiers.iter().enumerate() {
            for (ci, cond) in tp.enter.iter().enumerate() {
                let st = &mut self.conds[ti][ci];
                match cond {
                    Condition::Threshold {
                        signal,
                        above,
                        exit_below,
                        for_ms,
                    } => {
                        let v = values[signal];
                        st.value = Some(v);
                        if v > *above {
                            let since = *st.above_since.get_or_insert(now);
                            let need = self.stop_bleed.effective_for_ms(
                                &self.policy,
                                *for_ms,
                                now,
                                t3_now,
                            );
                            if st.latched_since.is_none() && now.saturating_sub(since) >= need {
                                st.latched_since = Some(now);
                            }
                        } else {
                            st.above_since = None;
                        }
                        if v < *exit_below {
                            st.latched_since = None;
                        }
                    }
                    Condition::SloAlert { slo, severity } => {
                        let hit = inputs.slo_alerts.iter().find(|a| {
                            a.firing && a.slo == *slo && a.severity.eq_ignore_ascii_case(severity)
                        });
                        st.value = hit.map(|a| a.burn_rate);
                        if hit.is_some() {
                            st.latched_since.get_or_insert(now);
                        } else {
                            st.latched_since = None;
                        }
                    }
                    Condition::Alertmanager { alertname } => {
                        if inputs.alertmanager_firing.contains(alertname) {
                            st.latched_since.get_or_insert(now);
                        } else {
                            st.latched_since = None;
                        }
                    }
                    Condition::Jump { .. } => {}
                }
            }
        }
        // Rate-of-change conditions (they need `&self` for the latency history).
        for ti in 0..3 {
            for ci in 0..self.policy.tiers[ti].enter.len() {
                if let Condition::Jump {
                    signal,
                    factor,
                    window_ms,
                    min_value,
                } = self.policy.tiers[ti].enter[ci].clone()
                {
                    let ratio = self.jump_ratio(signal, window_ms, min_value, now);
                    let st = &mut self.conds[ti][ci];
                    st.value = Some(ratio);
                    if ratio >= factor {
                        st.latched_since.get_or_insert(now);
                    } else {
                        st.latched_since = None;
                    }
                }
            }
        }

        // 2. The highest tier with a latched condition.
        let target = (1..=3u8)
            .rev()
            .find(|t| {
                self.conds[usize::from(*t) - 1]
                    .iter()
                    .any(|c| c.latched_since.is_some())
            })
            .map(|t| Tier::try_from(t).expect("1..=3 is a tier"))
            .unwrap_or(Tier::T0);

        let previous = self.tier;
        let mut transition = Transition::Hold;
        let mut operator_reason = None;
        match inputs
            .operator_override
            .as_ref()
            .filter(|o| o.until_ms > now)
        {
            Some(o) => {
                self.override_active = true;
                if o.tier != self.tier {
                    transition = Transition::Override;
                }
                self.tier = o.tier;
                self.clear_since = None;
                operator_reason = Some(o.clone());
            }
            None => {
                if self.override_active {
                    // Leaving an override: hold the pinned tier until the hold-down passes clear.
                    self.override_active = false;
                    self.clear_since = Some(now);
                }
                if target > self.tier {
                    self.tier = target;
                    self.clear_since = None;
                    transition = Transition::Enter;
                } else if self.tier > Tier::T0
                    && target < self.tier
                    && self.demand_hold(self.tier, now).is_some()
                {
                    // The demand is more than the tier below can serve: the tier holds, and
                    // its hold-down starts only once the demand has fallen.
                    self.clear_since = None;
                } else if self.tier > Tier::T0 && target < self.tier {
                    let since = *self.clear_since.get_or_insert(now);
                    let hold = self.policy.tier(self.tier).map_or(0, |t| t.hold_down_ms);
                    if now.saturating_sub(since) >= hold {
                        self.tier = self.tier.step_down();
                        // The next tier down must pass its own hold-down.
                        self.clear_since = if target < self.tier { Some(now) } else { None };
                        transition = Transition::StepDown;
                    }
                } else {
                    self.clear_since = None;
                }
            }
        }

        let t2_max = (self.tier >= Tier::T2).then_some(self.policy.t2.max_num_seqs);
        let route = match (previous, self.tier) {
            (a, b) if a <= Tier::T1 && b <= Tier::T1 => RouteContext::Primary,
            (Tier::T2, Tier::T2) => RouteContext::Fallback,
            _ => RouteContext::None,
        };
        let sb = self.stop_bleed.step(
            &self.policy,
            now,
            &inputs.snapshots,
            &inputs.instance_overrides,
            TierContext {
                t3: self.tier == Tier::T3,
                left_t3: previous == Tier::T3 && self.tier < Tier::T3,
                t2_max_num_seqs: t2_max,
                route,
            },
        );
        let mut reasons = self.crossings(inputs);
        // A tier none of whose own conditions (or those above) is latched any more, held by the
        // demand: that is its reason, first (the command's reason).
        if self.tier > Tier::T0
            && operator_reason.is_none()
            && !reasons.iter().any(|r| r.tier >= self.tier)
            && let Some(c) = self.demand_hold(self.tier, now)
        {
            reasons.insert(0, c);
        }
        let reason = match &operator_reason {
            Some(o) => Reason {
                trigger: "operator".into(),
                detail: o.reason.clone(),
                ..Reason::default()
            },
            None => self.primary_reason(&reasons, inputs, transition),
        };
        let step_down_at_ms = match (&operator_reason, self.clear_since) {
            (None, Some(since)) if self.tier > Tier::T0 => {
                Some(since + self.policy.tier(self.tier).map_or(0, |t| t.hold_down_ms))
            }
            _ => None,
        };
        let mut d = self.decision(
            inputs,
            previous,
            transition,
            reasons,
            reason,
            step_down_at_ms,
        );
        d.instances = sb.instances;
        d.instance_actions = sb.actions;
        d
    }

    /// Whether the demand holds `tier` (above T0): with the policy's `exit_demand_ratio`, the
    /// offered demand is at least that share of what the tier below serves (T3 → T2: the T2
    /// route's capacity; T2 → T1 and T1 → T0: the primary's). The crossing says so; `None`
    /// when the demand is below, no ratio is set, or no capacity is known.
    fn demand_hold(&self, tier: Tier, now: u64) -> Option<Crossing> {
        let r = self.policy.exit_demand_ratio?;
        let (value, cap, what) = if tier == Tier::T3 {
            (
                self.stop_bleed.fallback_demand_ratio(),
                self.stop_bleed.fallback_rate_rps()?,
                "the T2 route's",
            )
        } else {
            (
                self.stop_bleed.demand_ratio(),
                self.stop_bleed.service_rate_rps()?,
                "the primary route's",
            )
        };
        (value >= r).then(|| Crossing {
            tier,
            trigger: "demand_hold".into(),
            condition: format!(
                "demand {:.1} req/s is at least {r} x {what} capacity {cap:.1} req/s: {tier} holds until it falls below",
                value * cap
            ),
            value: Some(value),
            threshold: Some(r),
            since_ms: now,
        })
    }

    /// What T3 admits of non-critical traffic on each instance (`shed.admit_rps`): the policy's
    /// `admit_capacity_ratio` × the T2 route's capacity / the fresh engines, to 2 decimals;
    /// `None` without the ratio or without a known capacity (then T3 sheds the whole class).
    pub fn t3_admit_rps(&self) -> Option<f64> {
        let r = self.policy.t3.admit_capacity_ratio?;
        let cap = self.stop_bleed.fallback_rate_rps()?;
        let n = self.stop_bleed.engines().max(1) as f64;
        Some((r * cap / n * 100.0).round() / 100.0)
    }

    /// The measured capacity the admission ramp starts from (requests/s, all instances).
    pub fn capacity_rps(&self) -> f64 {
        self.stop_bleed.capacity_rps()
    }

    /// The per-second arrival-rate series the retry-wave detector looks at.
    pub fn arrival_series(&self) -> Vec<f64> {
        self.stop_bleed.arrival_series()
    }

    fn record_trend(&mut self, now: u64, values: &BTreeMap<Signal, f64>, inputs: &Inputs) {
        let window = self.policy.trend_window_ms;
        let mut push = |key: String, v: f64| {
            let q = self.trend.entry(key).or_default();
            q.push_back((now, v));
            while q
                .front()
                .is_some_and(|(t, _)| now.saturating_sub(*t) > window)
            {
                q.pop_front();
            }
            // Bounded even with a silly evaluation interval.
            while q.len() > 4096 {
                q.pop_front();
            }
        };
        for (s, v) in values {
            push(format!("signal:{}", s.trigger()), *v);
        }
        for a in &inputs.slo_alerts {
            push(
                format!("slo:{}:{}", a.slo, a.severity.to_ascii_lowercase()),
                a.burn_rate,
            );
        }
    }

    /// Least-squares slope (per ms) of a trend series; `None` with fewer than 3 points.
    fn slope(&self, key: &str) -> Option<f64> {
        let q = self.trend.get(key)?;
        if q.len() < 3 {
            return None;
        }
        let n = q.len() as f64;
        let t0 = q[0].0 as f64;
        let (mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0);
        for (t, v) in q {
            let x = *t as f64 - t0;
            sx += x;
            sy += v;
            sxx += x * x;
            sxy += x * v;
        }
        let den = n * sxx - sx * sx;
        if den.abs() < f64::EPSILON {
            None
        } else {
            Some((n * sxy - sx * sy) / den)
        }
    }

    /// Estimated time (ms) until every latched T3 condition clears, from its trend; the cap when
    /// a trend is flat or rising or unknown.
    fn t3_clear_estimate_ms(&self, inputs: &Inputs) -> u64 {
        let cap = self.policy.t3.recovery_eta_max_ms;
        let mut worst: u64 = 0;
        for (ci, cond) in self.policy.tiers[2].enter.iter().enumerate() {
            let st = &self.conds[2][ci];
            if st.latched_since.is_none() {
                continue;
            }
            let (key, value, exit) = match cond {
                Condition::Threshold {
                    signal, exit_below, ..
                } => (
                    format!("signal:{}", signal.trigger()),
                    st.value.unwrap_or(0.0),
                    *exit_below,
                ),
                Condition::SloAlert { slo, severity } => {
                    let a = inputs
                        .slo_alerts
                        .iter()
                        .find(|a| a.slo == *slo && a.severity.eq_ignore_ascii_case(severity));
                    match a {
                        Some(a) if a.threshold > 0.0 => (
                            format!("slo:{}:{}", slo, severity.to_ascii_lowercase()),
                            a.burn_rate,
                            a.threshold,
                        ),
                        _ => return cap,
                    }
                }
                Condition::Alertmanager { .. } | Condition::Jump { .. } => return cap,
            };
            let est = match self.slope(&key) {
                Some(s) if s < 0.0 => {
                    let ms = ((value - exit).max(0.0) / -s).ceil();
                    if ms.is_finite() {
                        (ms as u64).min(cap)
                    } else {
                        cap
                    }
                }
                _ => cap,
            };
            worst = worst.max(est);
        }
        worst
    }

    fn crossings(&self, inputs: &Inputs) -> Vec<Crossing> {
        let mut out = Vec::new();
        for ti in (0..3).rev() {
            let tier = Tier::try_from(u8::try_from(ti + 1).unwrap_or(3)).unwrap_or(Tier::T3);
            for (ci, cond) in self.policy.tiers[ti].enter.iter().enumerate() {
                let st = &self.conds[ti][ci];
                let Some(since) = st.latched_since else {
                    continue;
                };
                let threshold = match cond {
                    Condition::Threshold { above, .. } => Some(*above),
                    Condition::SloAlert { slo, severity } => inputs
                        .slo_alerts
                        .iter()
                        .find(|a| a.slo == *slo && a.severity.eq_ignore_ascii_case(severity))
                        .map(|a| a.threshold)
                        .filter(|t| *t > 0.0),
                    Condition::Alertmanager { .. } => None,
                    Condition::Jump { factor, .. } => Some(*factor),
                };
                out.push(Crossing {
                    tier,
                    trigger: cond.trigger().to_string(),
                    condition: cond.describe(),
                    value: st.value,
                    threshold,
                    since_ms: since,
                });
            }
        }
        out
    }

    fn primary_reason(
        &self,
        reasons: &[Crossing],
        inputs: &Inputs,
        transition: Transition,
    ) -> Reason {
        let Some(top) = reasons.first() else {
            return Reason {
                trigger: "recovered".into(),
                detail: if self.tier == Tier::T0 {
                    "all inputs below exit thresholds".into()
                } else {
                    format!(
                        "inputs clear; holding {} until the hold-down passes",
                        self.tier
                    )
                },
                ..Reason::default()
            };
        };
        let mut r = Reason {
            trigger: top.trigger.clone(),
            detail: top.condition.clone(),
            ..Reason::default()
        };
        if let Some(v) = top.value {
            r.detail = if top.trigger == "p99_jump" {
                // A ratio, not seconds: "now 30.5" read as a 30 s p99 once.
                format!("{} (now x{v:.1})", top.condition)
            } else {
                format!("{} (now {v:.3})", top.condition)
            };
        }
        if top.trigger == "slo_burn" {
            // The condition text holds the slo name; take the alert's own fields.
            if let Some(a) = inputs
                .slo_alerts
                .iter()
                .find(|a| a.firing && top.condition.contains(&format!("{}/", a.slo)))
            {
                r.slo = Some(a.slo.clone());
                r.window = (!a.window.is_empty()).then(|| a.window.clone());
                r.burn_rate = Some(a.burn_rate);
            }
        }
        if transition == Transition::StepDown {
            r.detail = format!("stepped down; still latched: {}", r.detail);
        }
        r
    }

    fn decision(
        &self,
        inputs: &Inputs,
        previous: Tier,
        transition: Transition,
        reasons: Vec<Crossing>,
        reason: Reason,
        step_down_at_ms: Option<u64>,
    ) -> Decision {
        let now = inputs.now_ms;
        let tier = self.tier;
        let features = self
            .policy
            .features
            .iter()
            .map(|f| {
                let state = match f.disable_at {
                    Some(at) if tier >= at => FeatureState::Disabled,
                    _ => FeatureState::Enabled,
                };
                (f.name.clone(), state)
            })
            .collect();
        let mut model_route = BTreeMap::new();
        let mut limits = Limits::default();
        if tier >= Tier::T2 {
            model_route.insert("default".to_string(), self.policy.t2.model_route.clone());
            limits.max_tokens_cap = Some(self.policy.t2.max_tokens_cap);
            limits.max_num_seqs = Some(self.policy.t2.max_num_seqs);
        }
        let shed = (tier == Tier::T3).then(|| {
            let hold = self.policy.tiers[2].hold_down_ms;
            let eta = match step_down_at_ms {
                // Already clear: we leave when the hold-down ends.
                Some(at) => at,
                None if reasons.is_empty() => now + hold,
                None => now + self.t3_clear_estimate_ms(inputs) + hold,
            };
            Shed {
                admit_min_criticality: self.policy.t3.admit_min_criticality,
                retry_after_s: self.policy.t3.retry_after_base_secs,
                jitter_ratio: self.policy.t3.jitter_ratio,
                recovery_eta_ms: eta.min(now + self.policy.t3.recovery_eta_max_ms + hold),
                admit_rps: self.t3_admit_rps(),
            }
        });
        Decision {
            at_ms: now,
            tier,
            previous,
            transition,
            reasons,
            reason,
            features,
            model_route,
            limits,
            shed,
            step_down_at_ms,
            instances: BTreeMap::new(),
            instance_actions: Vec::new(),
        }
    }
}
