//! Per-instance stop-bleed, the admission ramp after T3 and retry-wave detection: the parts of
//! the controller that act on one serving instance (or on every instance through `"*"`) rather
//! than on the cluster's tier. Pure like the controller: no IO, no clock.
//!
//! ```text
//!  per instance (KV usage of its engine, from the agent snapshots):
//!    normal ──(> halve for halve_for)──> halved ──(still > halve for drain_after)──> drained
//!       ^                                  │  ^                                         │
//!       └──(< exit for hold_down)──────────┘  └────────(< exit for hold_down)───────────┘
//!    watch: > watch_above for watch_for (a reason, no action) until < exit
//!  operator: POST /api/v1/degrade/instances/{id} pins fields of one instance's entry until it ends
//!  ramp:     T3 ends -> "*".admit_rps = start_ratio × capacity / instances, + step_ratio every
//!            step_interval (held while a retry wave is detected) until the share reaches 1
//! ```

use std::collections::{BTreeMap, VecDeque};

use brownout_protocol::{ALL_INSTANCES, AgentSnapshot, InstanceEntry};
use serde::{Deserialize, Serialize};

use super::policy::{InstancePolicy, Policy, RampPolicy, StormPolicy};

/// An operator's per-instance action (`POST /api/v1/degrade/instances/{instance_id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceOverride {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_num_seqs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<bool>,
    pub until_ms: u64,
    pub reason: String,
    /// When the operator set it (unix ms).
    #[serde(default)]
    pub set_at_ms: u64,
}

/// One per-instance action in force (or a watch, or a detected retry wave) and why: shown in
/// decisions, `GET /api/v1/degrade` and the Degradation page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceAction {
    /// The instance id (`"*"` for the ramp and retry waves).
    pub instance: String,
    /// `watch`, `halve`, `drain`, `operator`, `ramp` or `recovery_storm`.
    pub action: String,
    /// What caused it: `kv_usage`, `operator`, `admission_ramp`, `recovery_storm`.
    pub trigger: String,
    pub detail: String,
    /// The signal now (KV usage, admitted share, autocorrelation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    pub since_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Normal,
    Halved,
    Drained,
}

#[derive(Debug, Clone)]
struct InstanceState {
    last_fresh_ms: u64,
    kv: Option<f64>,
    configured_max_num_seqs: Option<u32>,
    level: Level,
    level_since: u64,
    watch_above_since: Option<u64>,
    watch_since: Option<u64>,
    halve_above_since: Option<u64>,
    below_exit_since: Option<u64>,
}

/// Latest counters of one engine, to differentiate into rates.
#[derive(Debug, Clone, Copy)]
struct Counters {
    ts_ms: u64,
    answered: u64,
    completed: u64,
    answered_rps: f64,
    completed_rps: f64,
    /// First-attempt arrivals, when the engine exports them.
    first_arrived: Option<u64>,
    first_arrived_rps: Option<f64>,
}

#[derive(Debug, Clone)]
struct RampState {
    started_ms: u64,
    share: f64,
    last_step_ms: u64,
    capacity_rps: f64,
}

/// A retry wave found in the arrival rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryWave {
    pub period_secs: u64,
    pub autocorrelation: f64,
    pub mean_rps: f64,
}

/// What the stop-bleed part adds to a decision.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StopBleed {
    pub instances: BTreeMap<String, InstanceEntry>,
    pub actions: Vec<InstanceAction>,
}

/// What the stop-bleed part needs of the tier decided in the same step.
#[derive(Debug, Clone, Copy, Default)]
pub struct TierContext {
    /// T3 is in force after this step.
    pub t3: bool,
    /// This step left T3.
    pub left_t3: bool,
    /// The cluster-wide T2 `max_num_seqs` in force, if any (a halved limit never exceeds it).
    pub t2_max_num_seqs: Option<u32>,
    /// Which route the completions seen in this step were served on: the tier before and
    /// after this step (T0–T1 the primary, T2 the fallback; T3 limits the work itself, so its
    /// completions measure no capacity).
    pub route: RouteContext,
}

/// See [`TierContext::route`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RouteContext {
    /// T0 or T1 before and after the step.
    #[default]
    Primary,
    /// T2 before and after the step.
    Fallback,
    /// T3, or a change between the routes: no capacity is measured.
    None,
}

/// The memory of the per-instance machine, the rate series, the ramp and the storm detector.
#[derive(Debug, Clone, Default)]
pub struct StopBleedState {
    instances: BTreeMap<String, InstanceState>,
    counters: BTreeMap<String, Counters>,
    /// (unix s, arrivals/s summed over fresh engines), one per second seen.
    arrivals: VecDeque<(u64, f64)>,
    /// (unix ms, completions/s summed over fresh engines).
    completions: VecDeque<(u64, f64)>,
    /// The same, only while the primary route served (T0, T1): the primary's capacity.
    primary_completions: VecDeque<(u64, f64)>,
    /// The same, only while T2's route served with work waiting (saturated): the T2 route's
    /// capacity. Below saturation the completions are the demand, not what the route can do.
    fallback_completions: VecDeque<(u64, f64)>,
    /// (unix s, offered load/s summed over fresh engines: first-attempt arrivals where the
    /// engine exports them, else every request answered), one per second seen.
    demand: VecDeque<(u64, f64)>,
    ramp: Option<RampState>,
    last_t3_ms: Option<u64>,
    storm_since: Option<u64>,
    /// When the engines first completed at least 1 request/s (the demand ratio waits for
    /// [`DEMAND_WARMUP_MS`] of completions before it says anything).
    completing_since: Option<u64>,
    last_observed_ms: u64,
    /// The policy's declared capacity (`capacity_rps`), requests/s, as of the last observation.
    declared_rps: Option<f64>,
    /// The policy's `fallback_capacity_rps`, likewise.
    declared_fallback_rps: Option<f64>,
}

/// How long completions must have been measured before [`StopBleedState::demand_ratio`] reads
/// anything but 0: at the start of a load the completions lag the arrivals, and the highest
/// completion rate seen is not yet a capacity.
pub const DEMAND_WARMUP_MS: u64 = 10_000;

/// The normalised autocorrelation of `x` at `lag` (0 when undefined).
pub fn autocorrelation(x: &[f64], lag: usize) -> f64 {
    if lag == 0 || lag >= x.len() {
        return 0.0;
    }
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var: f64 = x.iter().map(|v| (v - mean).powi(2)).sum();
    if var <= f64::EPSILON {
        return 0.0;
    }
    let cov: f64 = (0..x.len() - lag)
        .map(|i| (x[i] - mean) * (x[i + lag] - mean))
        .sum();
    // Scaled to the overlap so a long lag is not penalised for its shorter sum.
    (cov / (x.len() - lag) as f64) / (var / n)
}

/// Retry waves in a per-second arrival-rate series: the shortest of `periods` whose
/// autocorrelation is at least `min_acf` and exceeds that at half the period by at least
/// `min_acf / 2` (a peak, not a trend), with a mean rate of at least `min_rps` and a coefficient
/// of variation of at least 0.2 (a steady rate is no wave).
pub fn detect_retry_waves(
    series: &[f64],
    periods: &[u64],
    min_acf: f64,
    min_rps: f64,
) -> Option<RetryWave> {
    if series.len() < 8 {
        return None;
    }
    let n = series.len() as f64;
    let mean = series.iter().sum::<f64>() / n;
    if mean < min_rps || mean <= 0.0 {
        return None;
    }
    let sd = (series.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
    if sd / mean < 0.2 {
        return None;
    }
    let mut sorted: Vec<u64> = periods.to_vec();
    sorted.sort_unstable();
    for p in sorted {
        let lag = usize::try_from(p).unwrap_or(usize::MAX);
        if lag * 2 > series.len() {
            continue;
        }
        let r = autocorrelation(series, lag);
        let half = autocorrelation(series, (lag / 2).max(1));
        if r >= min_acf && r - half >= min_acf / 2.0 {
            return Some(RetryWave {
                period_secs: p,
                autocorrelation: r,
                mean_rps: mean,
            });
        }
    }
    None
}

/// The highest mean over 5 seconds of a (unix ms, rate) series.
fn best_5s_mean(v: &VecDeque<(u64, f64)>) -> f64 {
    let mut best: f64 = 0.0;
    let mut j = 0;
    let mut sum = 0.0;
    for i in 0..v.len() {
        sum += v[i].1;
        while v[i].0.saturating_sub(v[j].0) >= 5000 {
            sum -= v[j].1;
            j += 1;
        }
        let n = (i - j + 1) as f64;
        best = best.max(sum / n);
    }
    best
}

fn fmt_ratio(v: f64) -> String {
    format!("{:.0}%", v * 100.0)
}

impl StopBleedState {
    /// Feeds the fresh snapshots: per-instance KV usage and the rate series.
    fn observe(
        &mut self,
        policy: &Policy,
        now: u64,
        snapshots: &[AgentSnapshot],
        route: RouteContext,
    ) {
        let stale = policy.snapshot_stale_ms;
        self.declared_rps = policy.declared_capacity_rps;
        self.declared_fallback_rps = policy.declared_fallback_capacity_rps;
        let mut arrivals = 0.0;
        let mut completions = 0.0;
        let mut demand = 0.0;
        let mut waiting = 0;
        let mut seen = Vec::new();
        for s in snapshots
            .iter()
            .filter(|s| now.saturating_sub(s.ts_ms) <= stale)
        {
            for e in &s.engines {
                let key = s.instance_key(e);
                seen.push(key.clone());
                if e.up {
                    waiting += e.num_requests_waiting;
                }
                // Rates from the counters (a restart, i.e. a counter going down, resets them).
                let c = self.counters.entry(key.clone()).or_insert(Counters {
                    ts_ms: s.ts_ms,
                    answered: e.requests_answered_total,
                    completed: e.requests_completed_total,
                    answered_rps: 0.0,
                    completed_rps: 0.0,
                    first_arrived: e.requests_first_arrived_total,
                    first_arrived_rps: None,
                });
                if s.ts_ms > c.ts_ms {
                    let dt = (s.ts_ms - c.ts_ms) as f64 / 1000.0;
                    c.first_arrived_rps = match (e.requests_first_arrived_total, c.first_arrived) {
                        (Some(now_n), Some(before)) => {
                            Some(now_n.saturating_sub(before) as f64 / dt)
                        }
                        (Some(_), None) => Some(0.0),
                        (None, _) => None,
                    };
                    c.first_arrived = e.requests_first_arrived_total;
                    c.answered_rps =
                        e.requests_answered_total.saturating_sub(c.answered) as f64 / dt;
                    c.completed_rps =
                        e.requests_completed_total.saturating_sub(c.completed) as f64 / dt;
                    c.ts_ms = s.ts_ms;
                    c.answered = e.requests_answered_total;
                    c.completed = e.requests_completed_total;
                }
                arrivals += c.answered_rps;
                completions += c.completed_rps;
                demand += c.first_arrived_rps.unwrap_or(c.answered_rps);
                if policy.instances.is_some() {
                    let st = self.instances.entry(key).or_insert_with(|| InstanceState {
                        last_fresh_ms: now,
                        kv: None,
                        configured_max_num_seqs: None,
                        level: Level::Normal,
                        level_since: now,
                        watch_above_since: None,
                        watch_since: None,
                        halve_above_since: None,
                        below_exit_since: None,
                    });
                    st.last_fresh_ms = now;
                    st.kv = e.up.then_some(e.kv.usage_ratio);
                    if e.configured_max_num_seqs.is_some() {
                        st.configured_max_num_seqs = e.configured_max_num_seqs;
                    }
                }
            }
        }
        // Instances without a fresh, up engine this round: no value (neither escalate nor restore).
        for (k, st) in &mut self.instances {
            if !seen.contains(k) {
                st.kv = None;
            }
        }
        self.counters.retain(|k, c| {
            seen.contains(k) || now.saturating_sub(c.ts_ms) <= stale.saturating_mul(3)
        });
        let sec = now / 1000;
        match self.arrivals.back_mut() {
            Some((t, v)) if *t == sec => *v = arrivals,
            _ => self.arrivals.push_back((sec, arrivals)),
        }
        match self.demand.back_mut() {
            Some((t, v)) if *t == sec => *v = demand,
            _ => self.demand.push_back((sec, demand)),
        }
        while self.demand.len() > 8 {
            self.demand.pop_front();
        }
        self.completions.push_back((now, completions));
        match route {
            RouteContext::Primary => self.primary_completions.push_back((now, completions)),
            RouteContext::Fallback if waiting > 0 => {
                self.fallback_completions.push_back((now, completions));
            }
            _ => {}
        }
        self.last_observed_ms = now;
        if completions >= 1.0 {
            self.completing_since.get_or_insert(now);
        }
        let keep_s = policy.storm.as_ref().map_or(64, |s| s.window_secs);
        while self
            .arrivals
            .front()
            .is_some_and(|(t, _)| sec.saturating_sub(*t) >= keep_s)
        {
            self.arrivals.pop_front();
        }
        let keep_ms = policy
            .ramp
            .as_ref()
            .map_or(60_000, |r| r.capacity_window_ms);
        while self
            .completions
            .front()
            .is_some_and(|(t, _)| now.saturating_sub(*t) > keep_ms)
        {
            self.completions.pop_front();
        }
        while self.completions.len() > 8192 {
            self.completions.pop_front();
        }
        // While T3 limits the work, nothing measures a route's capacity: keep what was
        // measured before (else a long T3 would forget it, and admit less and less).
        for q in [
            &mut self.primary_completions,
            &mut self.fallback_completions,
        ] {
            while q.len() > 8192
                || (route != RouteContext::None
                    && q.front()
                        .is_some_and(|(t, _)| now.saturating_sub(*t) > keep_ms))
            {
                q.pop_front();
            }
        }
    }

    /// The measured capacity (requests/s, all instances): the highest 5-second mean of the
    /// completion rate over the ramp's capacity window.
    pub fn capacity_rps(&self) -> f64 {
        best_5s_mean(&self.completions)
    }

    /// The primary route's measured capacity: as [`Self::capacity_rps`], over the
    /// completions seen while T0 or T1 was in force.
    pub fn primary_capacity_rps(&self) -> f64 {
        best_5s_mean(&self.primary_completions)
    }

    /// The T2 route's measured capacity: the highest 5-second mean of the completions seen
    /// while T2 was in force with work waiting; `None` before 5 s of such samples.
    pub fn measured_fallback_rps(&self) -> Option<f64> {
        let (first, last) = (
            self.fallback_completions.front()?,
            self.fallback_completions.back()?,
        );
        (last.0.saturating_sub(first.0) >= 5000).then(|| best_5s_mean(&self.fallback_completions))
    }

    /// What the T2 route serves (requests/s, all instances): the declared
    /// `fallback_capacity_rps` or the measured one, whichever is higher, and never below the
    /// primary's [`Self::service_rate_rps`] (the fallback is the cheaper route). `None` when
    /// nothing is known.
    pub fn fallback_rate_rps(&self) -> Option<f64> {
        let primary = self.service_rate_rps();
        [
            self.declared_fallback_rps,
            self.measured_fallback_rps(),
            primary,
        ]
        .into_iter()
        .flatten()
        .filter(|v| v.is_finite() && *v > 0.0)
        .reduce(f64::max)
    }

    /// The mean offered rate of the last 3 seconds seen (requests/s, all instances).
    pub fn offered_rps(&self) -> f64 {
        let n = self.demand.len().min(3);
        if n == 0 {
            return 0.0;
        }
        let sum: f64 = self.demand.iter().rev().take(n).map(|(_, v)| v).sum();
        sum / n as f64
    }

    /// [`Signal::FallbackDemandRatio`](super::policy::Signal): the offered rate over
    /// [`Self::fallback_rate_rps`]; 0 while nothing is known.
    pub fn fallback_demand_ratio(&self) -> f64 {
        self.fallback_rate_rps()
            .map_or(0.0, |cap| self.offered_rps() / cap)
    }

    /// Fresh engines seen (the instances a cluster-wide rate is shared between).
    pub fn engines(&self) -> usize {
        self.counters.len()
    }

    /// Offered load over measured capacity ([`Signal::DemandRatio`](super::policy::Signal)):
    /// the mean offered rate of the last 3 seconds seen over [`Self::service_rate_rps`] (the
    /// declared capacity from the start, else the measured one after its warm-up); 0 while
    /// neither is known. The offered rate of an engine is its first-attempt
    /// arrivals (`requests_first_arrived_total`: counted on arrival, the clients' retries left
    /// out) when it exports them, else every request it answered (refusals included, so
    /// retries of refused calls count).
    pub fn demand_ratio(&self) -> f64 {
        self.service_rate_rps()
            .map_or(0.0, |cap| self.offered_rps() / cap)
    }

    /// The service rate (requests/s, all instances) the demand and wait signals divide by: the
    /// measured one ([`Self::capacity_rps`], once the engines have completed at least 1
    /// request/s for [`DEMAND_WARMUP_MS`] and at least 1 request/s was measured), or the
    /// policy's declared capacity (`capacity_rps`) when that is higher or nothing is measured
    /// yet — the measured rate is the highest completion rate seen, which before the first
    /// saturation is only the load so far, not what the engines can do. `None` when neither
    /// is known.
    pub fn service_rate_rps(&self) -> Option<f64> {
        let warm = self
            .completing_since
            .is_some_and(|t| self.last_observed_ms.saturating_sub(t) >= DEMAND_WARMUP_MS);
        let cap = self.primary_capacity_rps();
        let measured = (warm && cap >= 1.0).then_some(cap);
        match (self.declared_rps, measured) {
            (Some(d), Some(m)) => Some(d.max(m)),
            (d, m) => d.or(m),
        }
    }

    /// [`Signal::ExpectedWait`](super::policy::Signal): `in_system` requests (waiting +
    /// running, summed over the fresh engines) over [`Self::service_rate_rps`] — over
    /// [`Self::fallback_rate_rps`] when `fallback` (T2 or T3 in force: the route that serves
    /// now) —, in seconds; 0 while no service rate is measured.
    pub fn expected_wait_s(&self, in_system: f64, fallback: bool) -> f64 {
        let mu = if fallback {
            self.fallback_rate_rps()
        } else {
            self.service_rate_rps()
        };
        mu.map_or(0.0, |mu| in_system / mu)
    }

    /// The per-second arrival series, oldest first (missing seconds are 0).
    pub fn arrival_series(&self) -> Vec<f64> {
        let (Some(first), Some(last)) = (self.arrivals.front(), self.arrivals.back()) else {
            return Vec::new();
        };
        let mut out = vec![0.0; usize::try_from(last.0 - first.0 + 1).unwrap_or(0)];
        for (t, v) in &self.arrivals {
            if let Some(slot) = out.get_mut(usize::try_from(t - first.0).unwrap_or(usize::MAX)) {
                *slot = *v;
            }
        }
        out
    }

    fn step_instances(&mut self, ip: &InstancePolicy, now: u64) {
        let k = &ip.kv;
        self.instances
            .retain(|_, st| now.saturating_sub(st.last_fresh_ms) <= ip.forget_after_ms);
        for st in self.instances.values_mut() {
            let Some(v) = st.kv else {
                st.watch_above_since = None;
                st.halve_above_since = None;
                st.below_exit_since = None;
                continue;
            };
            // Watch (P2): a reason only.
            if v > k.watch_above {
                let since = *st.watch_above_since.get_or_insert(now);
                if st.watch_since.is_none() && now.saturating_sub(since) >= k.watch_for_ms {
                    st.watch_since = Some(now);
                }
            } else {
                st.watch_above_since = None;
            }
            if v < k.exit_below {
                st.watch_since = None;
            }
            // Escalation.
            if v > k.halve_above {
                let since = *st.halve_above_since.get_or_insert(now);
                match st.level {
                    Level::Normal if now.saturating_sub(since) >= k.halve_for_ms => {
                        st.level = Level::Halved;
                        st.level_since = now;
                    }
                    Level::Halved
                        if now.saturating_sub(since.max(st.level_since)) >= k.drain_after_ms =>
                    {
                        st.level = Level::Drained;
                        st.level_since = now;
                    }
                    _ => {}
                }
            } else {
                st.halve_above_since = None;
            }
            // Restoration, one action per hold-down.
            if v < k.exit_below {
                let since = *st.below_exit_since.get_or_insert(now);
                if st.level > Level::Normal && now.saturating_sub(since) >= k.hold_down_ms {
                    st.level = if st.level == Level::Drained {
                        Level::Halved
                    } else {
                        Level::Normal
                    };
                    st.level_since = now;
                    st.below_exit_since = Some(now);
                }
            } else {
                st.below_exit_since = None;
            }
        }
    }

    fn step_ramp(
        &mut self,
        rp: &RampPolicy,
        now: u64,
        t3: bool,
        left_t3: bool,
        storm: bool,
    ) -> Option<(f64, f64, u64)> {
        if t3 {
            self.ramp = None;
            return None;
        }
        if left_t3 {
            let capacity = self.capacity_rps();
            self.ramp = (capacity >= rp.min_capacity_rps && capacity > 0.0).then_some(RampState {
                started_ms: now,
                share: rp.start_ratio,
                last_step_ms: now,
                capacity_rps: capacity,
            });
        }
        let r = self.ramp.as_mut()?;
        if now.saturating_sub(r.last_step_ms) >= rp.step_interval_ms {
            r.last_step_ms = now;
            // A retry wave holds the ramp where it is.
            if !storm {
                r.share += rp.step_ratio;
            }
        }
        if r.share >= 1.0 - 1e-9 {
            self.ramp = None;
            return None;
        }
        Some((r.share, r.capacity_rps, r.started_ms))
    }

    /// One evaluation of the stop-bleed part, after the tier of this step was decided.
    pub fn step(
        &mut self,
        policy: &Policy,
        now: u64,
        snapshots: &[AgentSnapshot],
        overrides: &BTreeMap<String, InstanceOverride>,
        tier: TierContext,
    ) -> StopBleed {
        let TierContext {
            t3: tier_t3,
            left_t3,
            t2_max_num_seqs,
            route,
        } = tier;
        self.observe(policy, now, snapshots, route);
        let mut out = StopBleed::default();
        if tier_t3 {
            self.last_t3_ms = Some(now);
        }
        // Retry waves: watched in T3, during the ramp and for a while after T3.
        let storm = match &policy.storm {
            Some(sp) if self.storm_watched(sp, now, tier_t3) => self.storm(sp),
            _ => None,
        };
        match (storm, self.storm_since) {
            (Some(_), None) => self.storm_since = Some(now),
            (None, _) => self.storm_since = None,
            _ => {}
        }
        if let Some(ip) = &policy.instances {
            self.step_instances(ip, now);
            let k = &ip.kv;
            for (id, st) in &self.instances {
                if let Some(since) = st.watch_since.filter(|_| st.level == Level::Normal) {
                    out.actions.push(InstanceAction {
                        instance: id.clone(),
                        action: "watch".into(),
                        trigger: "kv_usage".into(),
                        detail: format!(
                            "P2 watch: kv_usage > {} for {}s",
                            fmt_ratio(k.watch_above),
                            k.watch_for_ms / 1000
                        ),
                        value: st.kv,
                        since_ms: since,
                    });
                }
                if st.level == Level::Normal {
                    continue;
                }
                let configured = st
                    .configured_max_num_seqs
                    .unwrap_or(ip.default_max_num_seqs);
                let mut halved = (configured / 2).max(1);
                if let Some(t2) = t2_max_num_seqs {
                    halved = halved.min(t2);
                }
                let drained = st.level == Level::Drained;
                let (action, detail) = if drained {
                    (
                        "drain",
                        format!(
                            "kv_usage still > {} {}s after halving: drained (max_num_seqs {configured} -> {halved})",
                            fmt_ratio(k.halve_above),
                            k.drain_after_ms / 1000
                        ),
                    )
                } else {
                    (
                        "halve",
                        format!(
                            "kv_usage > {} for {}s: max_num_seqs {configured} -> {halved}",
                            fmt_ratio(k.halve_above),
                            k.halve_for_ms / 1000
                        ),
                    )
                };
                out.instances.insert(
                    id.clone(),
                    InstanceEntry {
                        max_num_seqs: Some(halved),
                        drain: drained.then_some(true),
                        admit_rps: None,
                        reason: format!("P1 stop-bleed: {detail}"),
                    },
                );
                out.actions.push(InstanceAction {
                    instance: id.clone(),
                    action: action.into(),
                    trigger: "kv_usage".into(),
                    detail,
                    value: st.kv,
                    since_ms: st.level_since,
                });
            }
        }
        // Operator actions win field by field over the automatic ones.
        for (id, o) in overrides.iter().filter(|(_, o)| o.until_ms > now) {
            let e = out.instances.entry(id.clone()).or_default();
            if o.max_num_seqs.is_some() {
                e.max_num_seqs = o.max_num_seqs;
            }
            if o.drain.is_some() {
                e.drain = o.drain;
            }
            e.reason = format!("operator: {}", o.reason);
            let mut what = Vec::new();
            if let Some(n) = o.max_num_seqs {
                what.push(format!("max_num_seqs {n}"));
            }
            if let Some(d) = o.drain {
                what.push(if d { "drain".into() } else { "no drain".into() });
            }
            out.actions.push(InstanceAction {
                instance: id.clone(),
                action: "operator".into(),
                trigger: "operator".into(),
                detail: format!("{} until {} ({})", what.join(", "), o.until_ms, o.reason),
                value: None,
                since_ms: if o.set_at_ms == 0 { now } else { o.set_at_ms },
            });
        }
        if let Some(rp) = &policy.ramp
            && let Some((share, capacity, started)) =
                self.step_ramp(rp, now, tier_t3, left_t3, storm.is_some())
        {
            let n = self.counters.len().max(1);
            let rps = (share * capacity / n as f64 * 100.0).round() / 100.0;
            let pct = fmt_ratio(share);
            let e = out.instances.entry(ALL_INSTANCES.to_string()).or_default();
            e.admit_rps = Some(rps);
            e.reason = format!("admission ramp after T3: {pct} of the measured capacity");
            out.actions.push(InstanceAction {
                instance: ALL_INSTANCES.into(),
                action: "ramp".into(),
                trigger: "admission_ramp".into(),
                detail: format!(
                    "admit {pct} of {capacity:.1} req/s measured over {n} instance(s): {rps} req/s each; +{} every {}s",
                    fmt_ratio(rp.step_ratio),
                    rp.step_interval_ms / 1000
                ),
                value: Some(share),
                since_ms: started,
            });
        }
        if let (Some(w), Some(since)) = (storm, self.storm_since) {
            out.actions.push(InstanceAction {
                instance: ALL_INSTANCES.into(),
                action: "recovery_storm".into(),
                trigger: "recovery_storm".into(),
                detail: format!(
                    "retry waves every {}s in the arrival rate (autocorrelation {:.2}, mean {:.1} req/s){}",
                    w.period_secs,
                    w.autocorrelation,
                    w.mean_rps,
                    if self.ramp.is_some() {
                        "; admission ramp held"
                    } else {
                        ""
                    }
                ),
                value: Some(w.autocorrelation),
                since_ms: since,
            });
        }
        out
    }

    /// The `for` a threshold condition needs now: its own, or `min_for_after_t3_ms` when that
    /// is longer and T3 ended less than `watch_after_t3_ms` ago (T3 itself not in force).
    pub fn effective_for_ms(&self, policy: &Policy, for_ms: u64, now: u64, t3_now: bool) -> u64 {
        let Some(sp) = &policy.storm else {
            return for_ms;
        };
        let recovering = !t3_now
            && self
                .last_t3_ms
                .is_some_and(|t| now.saturating_sub(t) <= sp.watch_after_t3_ms);
        if recovering {
            for_ms.max(sp.min_for_after_t3_ms)
        } else {
            for_ms
        }
    }

    fn storm_watched(&self, sp: &StormPolicy, now: u64, t3: bool) -> bool {
        t3 || self.ramp.is_some()
            || self
                .last_t3_ms
                .is_some_and(|t| now.saturating_sub(t) <= sp.watch_after_t3_ms)
    }

    fn storm(&self, sp: &StormPolicy) -> Option<RetryWave> {
        detect_retry_waves(
            &self.arrival_series(),
            &sp.periods_secs,
            sp.min_autocorrelation,
            sp.min_rate_rps,
        )
    }
}
