//! Loop kill: per trace or conversation, the fingerprint of the last `window` tool calls (tool
//! name + hash of the normalised arguments, [`super::semconv`]); a fingerprint seen `repeats`
//! times is an agent going in circles.
//!
//! Memory is bounded whatever the clients send: at most `max_traces` windows (each a few
//! hundred bytes: `window` step hashes and [`FINGERPRINTS_KEPT`] fingerprints), the least
//! recently seen evicted first; a window idle for `trace_ttl` expires; both are counted. The
//! `abort` list holds at most [`brownout_protocol::MAX_ABORT_ENTRIES`] entries, each with its
//! own deadline. Every operation is O(log n) (a hash map plus an ordered index by last use).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

use brownout_protocol::{AbortEntry, AbortKind, MAX_ABORT_ENTRIES};
use serde::Serialize;

use super::policy::LoopPolicy;
use super::semconv::ToolCall;

/// Distinct window fingerprints remembered per trace (the oldest is forgotten first).
pub const FINGERPRINTS_KEPT: usize = 8;
/// Loop kills kept for the UI.
pub const KILLS_KEPT: usize = 100;

struct Window {
    /// The latest step hashes, oldest first (at most `window`).
    steps: VecDeque<u64>,
    /// Window fingerprint → times seen.
    seen: VecDeque<(u64, u32)>,
    last_seen_ms: u64,
    /// Position in [`LoopTracker::order`].
    seq: u64,
    calls: u64,
    /// Already killed: no second event until the abort expires.
    killed_until_ms: u64,
}

/// One loop found (and killed).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoopKill {
    pub at_ms: u64,
    /// The conversation id, or the trace id when the spans carry no conversation.
    pub id: String,
    /// `conversation` or `trace`.
    pub kind: &'static str,
    pub trace_id: String,
    pub service: String,
    pub user: String,
    /// The tool of the call that closed the loop.
    pub tool: String,
    /// Tool calls seen in this trace or conversation so far.
    pub calls: u64,
    pub until_ms: u64,
    pub reason: String,
}

/// Counters of the tracker (also exported as metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LoopCounters {
    pub tracked: usize,
    pub evicted_capacity: u64,
    pub evicted_expired: u64,
    pub loops: u64,
    /// Abort entries dropped because the list was full (the oldest go first).
    pub aborts_dropped: u64,
}

/// The loop tracker (see the module docs). Not thread-safe by itself: [`super::AgentGuards`]
/// holds it behind its mutex.
pub struct LoopTracker<S: BuildHasher> {
    policy: LoopPolicy,
    hasher: S,
    windows: HashMap<Arc<str>, Window>,
    /// seq → key, least recently seen first.
    order: BTreeMap<u64, Arc<str>>,
    next_seq: u64,
    aborts: VecDeque<AbortEntry>,
    kills: VecDeque<LoopKill>,
    counters: LoopCounters,
}

impl<S: BuildHasher> LoopTracker<S> {
    pub fn new(policy: LoopPolicy, hasher: S) -> Self {
        LoopTracker {
            policy,
            hasher,
            windows: HashMap::new(),
            order: BTreeMap::new(),
            next_seq: 0,
            aborts: VecDeque::new(),
            kills: VecDeque::new(),
            counters: LoopCounters::default(),
        }
    }

    pub fn counters(&self) -> LoopCounters {
        LoopCounters {
            tracked: self.windows.len(),
            ..self.counters
        }
    }

    /// Forgets windows idle for longer than the TTL.
    pub fn expire(&mut self, now_ms: u64) {
        while let Some((&seq, key)) = self.order.first_key_value() {
            let idle = self
                .windows
                .get(key)
                .is_none_or(|w| w.last_seen_ms.saturating_add(self.policy.trace_ttl_ms) < now_ms);
            if !idle {
                break;
            }
            let key = Arc::clone(key);
            self.order.remove(&seq);
            self.windows.remove(&key);
            self.counters.evicted_expired += 1;
        }
    }

    /// Follows one tool call; a loop it closes is returned (and its abort entries queued).
    pub fn observe(&mut self, call: &ToolCall, now_ms: u64) -> Option<LoopKill> {
        if !self.policy.enabled {
            return None;
        }
        self.expire(now_ms);
        let (key, kind): (&str, AbortKind) = match &call.conversation {
            Some(c) => (c.as_str(), AbortKind::Conversation),
            None => (call.trace_id.as_str(), AbortKind::Trace),
        };
        if !self.windows.contains_key(key) {
            if self.windows.len() >= self.policy.max_traces
                && let Some((_, old)) = self.order.pop_first()
            {
                self.windows.remove(&old);
                self.counters.evicted_capacity += 1;
            }
            let k: Arc<str> = Arc::from(key);
            self.windows.insert(
                Arc::clone(&k),
                Window {
                    steps: VecDeque::with_capacity(self.policy.window),
                    seen: VecDeque::new(),
                    last_seen_ms: now_ms,
                    seq: u64::MAX,
                    calls: 0,
                    killed_until_ms: 0,
                },
            );
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let k = self
            .windows
            .get_key_value(key)
            .map(|(k, _)| Arc::clone(k))?;
        let w = self.windows.get_mut(key)?;
        self.order.remove(&w.seq);
        self.order.insert(seq, k);
        w.seq = seq;
        w.last_seen_ms = now_ms;
        w.calls += 1;
        if w.killed_until_ms > now_ms {
            return None;
        }
        w.steps.push_back(call.step);
        if w.steps.len() > self.policy.window {
            w.steps.pop_front();
        }
        if w.steps.len() < self.policy.window {
            return None;
        }
        let mut h = self.hasher.build_hasher();
        for s in &w.steps {
            h.write_u64(*s);
        }
        let fp = h.finish();
        let times = match w.seen.iter_mut().find(|(f, _)| *f == fp) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                if w.seen.len() >= FINGERPRINTS_KEPT {
                    w.seen.pop_front();
                }
                w.seen.push_back((fp, 1));
                1
            }
        };
        if times < self.policy.repeats {
            return None;
        }
        // A loop.
        let until_ms = now_ms.saturating_add(self.policy.abort_ms);
        w.killed_until_ms = until_ms;
        w.seen.clear();
        w.steps.clear();
        let calls = w.calls;
        let reason = format!(
            "agent loop: the same {} tool calls repeated {} times (latest tool {})",
            self.policy.window, times, call.tool
        );
        let mut entries = vec![AbortEntry {
            id: key.to_string(),
            kind: kind.clone(),
            until_ms,
            reason: reason.clone(),
        }];
        if kind == AbortKind::Conversation {
            // The serving tier may see only the traceparent of this trace.
            entries.push(AbortEntry {
                id: call.trace_id.clone(),
                kind: AbortKind::Trace,
                until_ms,
                reason: reason.clone(),
            });
        }
        self.prune_aborts(now_ms);
        for e in entries {
            self.aborts.retain(|a| !(a.id == e.id && a.kind == e.kind));
            if self.aborts.len() >= MAX_ABORT_ENTRIES {
                self.aborts.pop_front();
                self.counters.aborts_dropped += 1;
            }
            self.aborts.push_back(e);
        }
        self.counters.loops += 1;
        let kill = LoopKill {
            at_ms: now_ms,
            id: key.to_string(),
            kind: kind.as_str_static(),
            trace_id: call.trace_id.clone(),
            service: call.service.clone(),
            user: call.user.clone(),
            tool: call.tool.clone(),
            calls,
            until_ms,
            reason,
        };
        if self.kills.len() >= KILLS_KEPT {
            self.kills.pop_front();
        }
        self.kills.push_back(kill.clone());
        Some(kill)
    }

    fn prune_aborts(&mut self, now_ms: u64) {
        self.aborts.retain(|a| a.until_ms > now_ms);
    }

    /// The abort entries still in force, oldest first (at most
    /// [`brownout_protocol::MAX_ABORT_ENTRIES`]).
    pub fn aborts(&mut self, now_ms: u64) -> Vec<AbortEntry> {
        self.prune_aborts(now_ms);
        self.aborts.iter().cloned().collect()
    }

    /// The latest loop kills, newest first.
    pub fn kills(&self) -> Vec<LoopKill> {
        self.kills.iter().rev().cloned().collect()
    }
}

trait KindName {
    fn as_str_static(&self) -> &'static str;
}

impl KindName for AbortKind {
    fn as_str_static(&self) -> &'static str {
        match self {
            AbortKind::Trace => "trace",
            _ => "conversation",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasherDefault, DefaultHasher};

    use super::*;

    type H = BuildHasherDefault<DefaultHasher>;

    fn policy() -> LoopPolicy {
        LoopPolicy {
            enabled: true,
            window: 5,
            repeats: 3,
            abort_ms: 60_000,
            trace_ttl_ms: 10_000,
            max_traces: 1000,
        }
    }

    fn call(trace: &str, conv: Option<&str>, tool: &str, step: u64) -> ToolCall {
        ToolCall {
            tool: tool.into(),
            step,
            trace_id: trace.into(),
            conversation: conv.map(str::to_string),
            service: "orch".into(),
            user: "u1".into(),
            class: None,
            duration_us: 10,
            failed: false,
            error_type: String::new(),
        }
    }

    #[test]
    fn the_same_call_over_and_over_is_a_loop_at_the_configured_repeat() {
        let mut t = LoopTracker::new(policy(), H::default());
        // Window 5, repeats 3: calls 5, 6, 7 give the same fingerprint; the 7th is the loop.
        for i in 1..=6 {
            assert!(
                t.observe(&call("t1", None, "search", 42), i).is_none(),
                "call {i}"
            );
        }
        let k = t.observe(&call("t1", None, "search", 42), 7).unwrap();
        assert_eq!((k.id.as_str(), k.kind, k.calls), ("t1", "trace", 7));
        assert!(k.reason.contains("repeated 3 times"), "{}", k.reason);
        let a = t.aborts(8);
        assert_eq!(a.len(), 1);
        assert_eq!(
            (a[0].kind.clone(), a[0].until_ms),
            (AbortKind::Trace, 7 + 60_000)
        );
        // Killed once: further calls of the same trace raise nothing new.
        for i in 8..30 {
            assert!(t.observe(&call("t1", None, "search", 42), i).is_none());
        }
        assert_eq!(t.counters().loops, 1);
        // The entry expires on its own.
        assert!(t.aborts(7 + 60_001).is_empty());
    }

    #[test]
    fn a_cycle_of_distinct_calls_is_a_loop_and_progress_is_not() {
        let mut t = LoopTracker::new(policy(), H::default());
        // A B C A B C …: each phase's window repeats every 3 calls.
        let mut found = None;
        for i in 0..20u64 {
            if let Some(k) = t.observe(&call("c", None, "x", i % 3), i) {
                found = Some(i);
                assert_eq!(k.calls, i + 1);
                break;
            }
        }
        assert_eq!(found, Some(10), "5 to fill, then two more cycles of 3");
        // A trace making progress (new arguments every call) never loops.
        for i in 0..1000u64 {
            assert!(t.observe(&call("p", None, "x", i), i).is_none());
        }
    }

    #[test]
    fn conversations_abort_the_conversation_and_the_trace_other_traces_untouched() {
        let mut t = LoopTracker::new(policy(), H::default());
        for i in 0..6 {
            // Two traces of one conversation feed one window.
            let trace = if i % 2 == 0 { "ta" } else { "tb" };
            assert!(t.observe(&call(trace, Some("conv-1"), "s", 1), i).is_none());
            assert!(t.observe(&call("other", None, "s", 1 + i), i).is_none());
        }
        let k = t.observe(&call("tb", Some("conv-1"), "s", 1), 6).unwrap();
        assert_eq!((k.id.as_str(), k.kind), ("conv-1", "conversation"));
        let a = t.aborts(7);
        let got: Vec<(&str, &str)> = a.iter().map(|e| (e.id.as_str(), e.kind.as_str())).collect();
        assert_eq!(got, vec![("conv-1", "conversation"), ("tb", "trace")]);
        assert!(!a.iter().any(|e| e.id == "other"));
    }

    #[test]
    fn millions_of_distinct_traces_keep_memory_flat_and_count_evictions() {
        let mut p = policy();
        p.max_traces = 1000;
        p.trace_ttl_ms = u64::MAX / 4;
        let mut t = LoopTracker::new(p, H::default());
        let n: u64 = 1_000_000;
        for i in 0..n {
            t.observe(&call(&format!("{i:032x}"), None, "s", i), i);
            if i % 100_000 == 0 {
                assert!(t.windows.len() <= 1000 && t.order.len() <= 1000);
            }
        }
        let c = t.counters();
        assert_eq!(c.tracked, 1000);
        assert_eq!(t.order.len(), 1000);
        assert_eq!(c.evicted_capacity, n - 1000);
        assert_eq!(c.evicted_expired, 0);
        // The most recent survive, least recently seen went first.
        assert!(t.windows.contains_key(format!("{:032x}", n - 1).as_str()));
        assert!(!t.windows.contains_key(format!("{:032x}", 0).as_str()));
    }

    #[test]
    fn idle_windows_expire_and_are_counted() {
        let mut t = LoopTracker::new(policy(), H::default());
        for i in 0..4 {
            t.observe(&call("a", None, "s", 1), i);
        }
        t.observe(&call("b", None, "s", 1), 5_000);
        // 10 s TTL: at 10_004 `a` (last seen at 3) is gone, `b` stays.
        t.expire(10_004);
        assert_eq!(t.counters().tracked, 1);
        assert_eq!(t.counters().evicted_expired, 1);
        // `a` starts over: four old calls do not count towards a loop.
        for i in 0..6 {
            assert!(t.observe(&call("a", None, "s", 1), 10_010 + i).is_none());
        }
    }

    #[test]
    fn the_abort_list_is_bounded() {
        let mut p = policy();
        p.repeats = 2;
        p.window = 1;
        let mut t = LoopTracker::new(p, H::default());
        let n = MAX_ABORT_ENTRIES + 50;
        for i in 0..n {
            let id = format!("t{i}");
            t.observe(&call(&id, None, "s", 1), 1);
            assert!(t.observe(&call(&id, None, "s", 1), 1).is_some());
        }
        assert_eq!(t.aborts(2).len(), MAX_ABORT_ENTRIES);
        assert_eq!(t.counters().aborts_dropped, 50);
        assert_eq!(t.kills().len(), KILLS_KEPT);
    }
}
