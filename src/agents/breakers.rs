//! Tool circuit breakers, computed centrally from tool-call spans (Hystrix's states, one
//! decision for every front end and engine).
//!
//! Per tool name: calls and failures in one-second buckets over the policy's window (30 s). A
//! call fails when its span has status ERROR (or an `error.type`), or when it took longer than
//! its class's timeout (basic 2 s, high-risk 5 s in the example policy).
//!
//! ```text
//!  closed ──(≥ failure_ratio of ≥ min_calls failed in the window)──> open      feature `disabled`
//!  open ──(cool_down passed)──> half_open                                       feature `probe`
//!  half_open ──(close_after_successes probe calls succeeded)──> closed         (not listed)
//!  half_open ──(a probe call failed)──> open
//! ```
//!
//! Time is the caller's (`now_ms`): ingest time, not the span's own clock, so a client cannot
//! move a breaker by lying about timestamps, and tests run on a logical clock. At most
//! `max_tools` tools are tracked; a new one evicts the least recently seen *closed* breaker
//! (counted), and when every tracked breaker is open or half-open the new tool is not tracked
//! (counted) rather than forgetting a live decision.

use std::collections::{BTreeMap, HashMap, VecDeque};

use brownout_protocol::FeatureState;
use serde::Serialize;

use super::policy::BreakerPolicy;
use super::semconv::ToolCall;

/// Transitions kept for the UI.
pub const TRANSITIONS_KEPT: usize = 200;

/// A breaker's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    /// The feature state it publishes (`None`: not listed, enabled).
    pub fn feature(self) -> Option<FeatureState> {
        match self {
            BreakerState::Closed => None,
            BreakerState::Open => Some(FeatureState::Disabled),
            BreakerState::HalfOpen => Some(FeatureState::Probe),
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    sec: u64,
    calls: u32,
    failures: u32,
    timeouts: u32,
}

#[derive(Debug, Clone)]
struct Breaker {
    class: String,
    timeout_ms: u64,
    state: BreakerState,
    since_ms: u64,
    reason: String,
    buckets: VecDeque<Bucket>,
    probe_successes: u32,
    /// Timed-out calls in a row.
    timeouts_in_a_row: u32,
    last_seen_ms: u64,
    calls_total: u64,
    failures_total: u64,
}

/// A state change, with why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Transition {
    pub at_ms: u64,
    pub tool: String,
    pub from: BreakerState,
    pub to: BreakerState,
    pub reason: String,
}

/// One breaker as shown (UI, JSON).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BreakerView {
    pub tool: String,
    pub class: String,
    pub timeout_ms: u64,
    pub state: BreakerState,
    pub since_ms: u64,
    pub reason: String,
    /// In the window.
    pub calls: u32,
    pub failures: u32,
    pub timeouts: u32,
    pub error_ratio: f64,
    pub calls_total: u64,
    pub failures_total: u64,
    pub last_seen_ms: u64,
}

/// Counters of the set (also exported as metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BreakerCounters {
    pub tracked: usize,
    pub open: usize,
    pub half_open: usize,
    /// Closed breakers forgotten to make room.
    pub evicted: u64,
    /// Calls of tools not tracked because every slot held an open or half-open breaker.
    pub untracked: u64,
}

/// Every tool's breaker (see the module docs).
pub struct BreakerSet {
    policy: BreakerPolicy,
    tools: HashMap<String, Breaker>,
    transitions: VecDeque<Transition>,
    evicted: u64,
    untracked: u64,
}

fn secs(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

impl Breaker {
    fn window(&mut self, now_ms: u64, window_ms: u64) -> (u32, u32, u32) {
        let oldest = now_ms.saturating_sub(window_ms) / 1000;
        while self.buckets.front().is_some_and(|b| b.sec < oldest) {
            self.buckets.pop_front();
        }
        self.buckets.iter().fold((0, 0, 0), |(c, f, t), b| {
            (c + b.calls, f + b.failures, t + b.timeouts)
        })
    }

    fn add(&mut self, now_ms: u64, failed: bool, timed_out: bool) {
        let sec = now_ms / 1000;
        match self.buckets.back_mut() {
            Some(b) if b.sec == sec => {
                b.calls += 1;
                b.failures += u32::from(failed);
                b.timeouts += u32::from(timed_out);
            }
            // A clock going backwards lands in the newest bucket rather than reordering.
            Some(b) if b.sec > sec => {
                b.calls += 1;
                b.failures += u32::from(failed);
                b.timeouts += u32::from(timed_out);
            }
            _ => self.buckets.push_back(Bucket {
                sec,
                calls: 1,
                failures: u32::from(failed),
                timeouts: u32::from(timed_out),
            }),
        }
    }
}

impl BreakerSet {
    pub fn new(policy: BreakerPolicy) -> BreakerSet {
        BreakerSet {
            policy,
            tools: HashMap::new(),
            transitions: VecDeque::new(),
            evicted: 0,
            untracked: 0,
        }
    }

    fn transition(
        &mut self,
        tool: &str,
        to: BreakerState,
        now_ms: u64,
        reason: String,
    ) -> Transition {
        let b = self.tools.get_mut(tool).expect("a tracked tool");
        let t = Transition {
            at_ms: now_ms,
            tool: tool.to_string(),
            from: b.state,
            to,
            reason: reason.clone(),
        };
        b.state = to;
        b.since_ms = now_ms;
        b.reason = reason;
        b.probe_successes = 0;
        b.timeouts_in_a_row = 0;
        if to != BreakerState::Open {
            // Half-open and closed start from a clean window.
            b.buckets.clear();
        }
        if self.transitions.len() >= TRANSITIONS_KEPT {
            self.transitions.pop_front();
        }
        self.transitions.push_back(t.clone());
        t
    }

    /// Open breakers whose cool-down has passed go half-open.
    pub fn tick(&mut self, now_ms: u64) -> Vec<Transition> {
        if !self.policy.enabled {
            return Vec::new();
        }
        let due: Vec<String> = self
            .tools
            .iter()
            .filter(|(_, b)| {
                b.state == BreakerState::Open
                    && now_ms >= b.since_ms.saturating_add(self.policy.cool_down_ms)
            })
            .map(|(n, _)| n.clone())
            .collect();
        let reason = format!(
            "cool-down of {} over: probing ({} successes close it)",
            secs(self.policy.cool_down_ms),
            self.policy.close_after_successes
        );
        due.into_iter()
            .map(|n| self.transition(&n, BreakerState::HalfOpen, now_ms, reason.clone()))
            .collect()
    }

    fn make_room(&mut self) -> bool {
        if self.tools.len() < self.policy.max_tools {
            return true;
        }
        let victim = self
            .tools
            .iter()
            .filter(|(_, b)| b.state == BreakerState::Closed)
            .min_by_key(|(_, b)| b.last_seen_ms)
            .map(|(n, _)| n.clone());
        match victim {
            Some(v) => {
                self.tools.remove(&v);
                self.evicted += 1;
                true
            }
            None => false,
        }
    }

    /// Records one tool call; returns the transitions it caused.
    pub fn record(&mut self, call: &ToolCall, now_ms: u64) -> Vec<Transition> {
        if !self.policy.enabled {
            return Vec::new();
        }
        let mut out = self.tick(now_ms);
        if !self.tools.contains_key(&call.tool) {
            if !self.make_room() {
                self.untracked += 1;
                return out;
            }
            let class = self.policy.class_of(&call.tool, call.class.as_deref());
            let b = Breaker {
                class: class.name.clone(),
                timeout_ms: class.timeout_ms,
                state: BreakerState::Closed,
                since_ms: now_ms,
                reason: "no failures seen".into(),
                buckets: VecDeque::new(),
                probe_successes: 0,
                timeouts_in_a_row: 0,
                last_seen_ms: now_ms,
                calls_total: 0,
                failures_total: 0,
            };
            self.tools.insert(call.tool.clone(), b);
        }
        let p = &self.policy;
        let b = self.tools.get_mut(&call.tool).expect("inserted above");
        let timed_out = call.duration_us > b.timeout_ms.saturating_mul(1000);
        let failed = call.failed || timed_out;
        b.last_seen_ms = now_ms;
        b.calls_total += 1;
        b.failures_total += u64::from(failed);
        b.add(now_ms, failed, timed_out);
        b.timeouts_in_a_row = if timed_out {
            b.timeouts_in_a_row.saturating_add(1)
        } else {
            0
        };
        let why_failed = || {
            if timed_out {
                format!(
                    "took {} over the {} {} timeout",
                    secs(call.duration_us / 1000),
                    secs(b.timeout_ms),
                    b.class
                )
            } else if call.error_type.is_empty() {
                "failed".to_string()
            } else {
                format!("failed ({})", call.error_type)
            }
        };
        let next = match b.state {
            BreakerState::Closed
                if p.consecutive_timeouts > 0 && b.timeouts_in_a_row >= p.consecutive_timeouts =>
            {
                Some((
                    BreakerState::Open,
                    format!(
                        "{} calls in a row took longer than the {} {} timeout",
                        b.timeouts_in_a_row,
                        secs(b.timeout_ms),
                        b.class
                    ),
                ))
            }
            BreakerState::Closed => {
                let (calls, failures, timeouts) = b.window(now_ms, p.window_ms);
                let ratio = f64::from(failures) / f64::from(calls.max(1));
                (calls >= p.min_calls && ratio >= p.failure_ratio).then(|| {
                    (
                        BreakerState::Open,
                        format!(
                            "{:.0}% of {calls} calls failed in the last {} ({} errors, {timeouts} over the {} {} timeout; opens at {:.0}% of at least {})",
                            ratio * 100.0,
                            secs(p.window_ms),
                            failures - timeouts.min(failures),
                            secs(b.timeout_ms),
                            b.class,
                            p.failure_ratio * 100.0,
                            p.min_calls
                        ),
                    )
                })
            }
            BreakerState::Open => None,
            BreakerState::HalfOpen if failed => Some((
                BreakerState::Open,
                format!("a probe call {}: open again", why_failed()),
            )),
            BreakerState::HalfOpen => {
                b.probe_successes += 1;
                (b.probe_successes >= p.close_after_successes).then(|| {
                    (
                        BreakerState::Closed,
                        format!("{} probe calls in a row succeeded", b.probe_successes),
                    )
                })
            }
        };
        if let Some((to, reason)) = next {
            out.push(self.transition(&call.tool, to, now_ms, reason));
        }
        out
    }

    /// `tool:<name>` → `disabled` / `probe` for every open and half-open breaker.
    pub fn features(&self) -> BTreeMap<String, FeatureState> {
        self.tools
            .iter()
            .filter_map(|(n, b)| {
                b.state
                    .feature()
                    .map(|f| (format!("{}{n}", brownout_protocol::TOOL_FEATURE_PREFIX), f))
            })
            .collect()
    }

    pub fn counters(&self) -> BreakerCounters {
        let count = |s| self.tools.values().filter(|b| b.state == s).count();
        BreakerCounters {
            tracked: self.tools.len(),
            open: count(BreakerState::Open),
            half_open: count(BreakerState::HalfOpen),
            evicted: self.evicted,
            untracked: self.untracked,
        }
    }

    /// Every breaker, open ones first, then half-open, then by name.
    pub fn view(&mut self, now_ms: u64) -> Vec<BreakerView> {
        let window_ms = self.policy.window_ms;
        let mut v: Vec<BreakerView> = self
            .tools
            .iter_mut()
            .map(|(n, b)| {
                let (calls, failures, timeouts) = b.window(now_ms, window_ms);
                BreakerView {
                    tool: n.clone(),
                    class: b.class.clone(),
                    timeout_ms: b.timeout_ms,
                    state: b.state,
                    since_ms: b.since_ms,
                    reason: b.reason.clone(),
                    calls,
                    failures,
                    timeouts,
                    error_ratio: f64::from(failures) / f64::from(calls.max(1)),
                    calls_total: b.calls_total,
                    failures_total: b.failures_total,
                    last_seen_ms: b.last_seen_ms,
                }
            })
            .collect();
        let rank = |s: BreakerState| match s {
            BreakerState::Open => 0,
            BreakerState::HalfOpen => 1,
            BreakerState::Closed => 2,
        };
        v.sort_by(|a, b| (rank(a.state), &a.tool).cmp(&(rank(b.state), &b.tool)));
        v
    }

    /// The latest transitions, newest first.
    pub fn transitions(&self) -> Vec<Transition> {
        self.transitions.iter().rev().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agents::policy::AgentsPolicy;

    fn policy() -> BreakerPolicy {
        let mut p = AgentsPolicy::default().breakers;
        p.min_calls = 10;
        p.cool_down_ms = 30_000;
        p.close_after_successes = 3;
        p.classes[1].tools = vec!["code_exec".into()];
        p
    }

    fn call(tool: &str, failed: bool, duration_ms: u64) -> ToolCall {
        ToolCall {
            tool: tool.into(),
            step: 0,
            trace_id: "t".into(),
            conversation: None,
            service: "s".into(),
            user: String::new(),
            class: None,
            duration_us: duration_ms * 1000,
            failed,
            error_type: if failed {
                "HTTPError".into()
            } else {
                String::new()
            },
        }
    }

    /// Ten calls one per second, 60 % failing: open on the 10th (min_calls) with the reason.
    #[test]
    fn sixty_percent_failures_open_then_probe_then_close_on_a_logical_clock() {
        let mut s = BreakerSet::new(policy());
        let mut t = 1_000_000u64;
        for i in 0..9 {
            assert!(
                s.record(&call("weather", i % 5 < 3, 100), t).is_empty(),
                "{i}"
            );
            t += 1000;
        }
        assert!(s.features().is_empty(), "below min_calls nothing opens");
        let tr = s.record(&call("weather", false, 100), t);
        assert_eq!(tr.len(), 1);
        assert_eq!(
            (tr[0].from, tr[0].to),
            (BreakerState::Closed, BreakerState::Open)
        );
        assert!(
            tr[0]
                .reason
                .starts_with("60% of 10 calls failed in the last 30 s"),
            "{}",
            tr[0].reason
        );
        assert_eq!(s.features()["tool:weather"], FeatureState::Disabled);
        // Open: calls do not move it; the cool-down does.
        assert!(s.record(&call("weather", false, 1), t + 10_000).is_empty());
        assert!(s.tick(t + 29_999).is_empty());
        let tr = s.tick(t + 30_000);
        assert_eq!(tr[0].to, BreakerState::HalfOpen);
        assert_eq!(s.features()["tool:weather"], FeatureState::Probe);
        // Half-open: a failed probe reopens.
        let tr = s.record(&call("weather", true, 1), t + 30_001);
        assert_eq!(
            (tr[0].from, tr[0].to),
            (BreakerState::HalfOpen, BreakerState::Open)
        );
        assert!(
            tr[0].reason.contains("probe call failed (HTTPError)"),
            "{}",
            tr[0].reason
        );
        // Cool down again, then three good probes close it.
        t += 60_001;
        assert_eq!(s.tick(t)[0].to, BreakerState::HalfOpen);
        assert!(s.record(&call("weather", false, 1), t).is_empty());
        assert!(s.record(&call("weather", false, 1), t + 1).is_empty());
        let tr = s.record(&call("weather", false, 1), t + 2);
        assert_eq!(tr[0].to, BreakerState::Closed);
        assert!(s.features().is_empty());
        let v = s.view(t + 3);
        assert_eq!(
            (v[0].state, v[0].calls),
            (BreakerState::Closed, 0),
            "a clean window"
        );
        assert_eq!(s.transitions().len(), 5);
    }

    #[test]
    fn forty_percent_or_old_failures_keep_it_closed() {
        let mut s = BreakerSet::new(policy());
        for i in 0..100u64 {
            s.record(&call("a", i % 5 >= 3, 1), i * 100);
        }
        assert!(s.features().is_empty(), "40 % stays closed");
        // 9 failures, then 31 s later 10 successes: the old failures are out of the window.
        for i in 0..9u64 {
            s.record(&call("b", true, 1), 1_000_000 + i);
        }
        for i in 0..10u64 {
            s.record(&call("b", false, 1), 1_031_000 + i);
        }
        assert!(s.features().is_empty());
        let v = s.view(1_031_010);
        let b = v.iter().find(|b| b.tool == "b").unwrap();
        assert_eq!((b.calls, b.failures, b.calls_total), (10, 0, 19));
    }

    #[test]
    fn slow_calls_fail_against_their_class_timeout() {
        let mut s = BreakerSet::new(policy());
        // 3 s: over basic's 2 s, under high_risk's 5 s. Three in a row open it.
        for i in 0..3u64 {
            s.record(&call("search", false, 3000), i);
            s.record(&call("code_exec", false, 3000), i);
        }
        let f = s.features();
        assert_eq!(f.get("tool:search"), Some(&FeatureState::Disabled));
        assert_eq!(f.get("tool:code_exec"), None);
        let v = s.view(10);
        let b = v.iter().find(|b| b.tool == "search").unwrap();
        assert_eq!(
            b.reason,
            "3 calls in a row took longer than the 2 s basic timeout"
        );
        let c = v.iter().find(|b| b.tool == "code_exec").unwrap();
        assert_eq!(
            (c.class.as_str(), c.timeout_ms, c.state),
            ("high_risk", 5000, BreakerState::Closed)
        );
        // Without the consecutive rule the window decides: 10 slow calls, reason with counts.
        let mut p = policy();
        p.consecutive_timeouts = 0;
        let mut s = BreakerSet::new(p);
        for i in 0..10u64 {
            s.record(&call("search", false, 3000), i);
        }
        let v = s.view(10);
        assert!(
            v[0].reason.contains("10 over the 2 s basic timeout"),
            "{}",
            v[0].reason
        );
        // Timeouts interrupted by a fast call do not count in a row.
        let mut s = BreakerSet::new(policy());
        for i in 0..9u64 {
            s.record(&call("x", false, if i % 3 == 2 { 1 } else { 3000 }), i);
        }
        assert!(s.features().is_empty());
    }

    #[test]
    fn the_set_is_bounded_and_never_forgets_an_open_breaker() {
        let mut p = policy();
        p.max_tools = 4;
        p.min_calls = 1;
        let mut s = BreakerSet::new(p);
        for i in 0..4 {
            s.record(&call(&format!("bad{i}"), true, 1), 1);
        }
        assert_eq!(s.counters().open, 4);
        for i in 0..1000 {
            s.record(&call(&format!("new{i}"), false, 1), 2);
        }
        let c = s.counters();
        assert_eq!((c.tracked, c.open, c.untracked, c.evicted), (4, 4, 1000, 0));
        // Closed breakers make room, least recently seen first.
        let mut p = policy();
        p.max_tools = 2;
        let mut s = BreakerSet::new(p);
        s.record(&call("a", false, 1), 1);
        s.record(&call("b", false, 1), 2);
        s.record(&call("c", false, 1), 3);
        let names: Vec<String> = s.view(3).into_iter().map(|b| b.tool).collect();
        assert_eq!(names, vec!["b", "c"]);
        assert_eq!(s.counters().evicted, 1);
    }
}
