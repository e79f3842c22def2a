//! Agent guards computed centrally (docs/AGENTS.md): loop kills and tool circuit breakers from
//! the tool-call spans every agent already sends.
//!
//! ```text
//!  ingest (accepted spans) ──> AgentGuards::observe ──┬─ semconv: which spans are tool calls
//!     ^ failure events (category agent_loop)          ├─ loops: fingerprint of the last N calls
//!     └──────────────────────────────────────────────┘└─ breakers: error rate / timeouts per tool
//!  controller (every evaluation) ──> AgentGuards::command_part ──> merged into the signed command:
//!     features `tool:<name>` (disabled / probe), `abort` entries, `limits.probe_ratio`
//! ```
//!
//! - [`policy`]: the `agents:` section of the policy file;
//! - [`semconv`]: attribute names (OpenTelemetry GenAI first, brownout's as fallbacks),
//!   argument normalisation;
//! - [`loops`]: the bounded loop tracker and the abort list;
//! - [`breakers`]: the breaker state machine per tool.
//!
//! One mutex guards the state; it is held for a few hash operations per tool-call span and never
//! across an `.await`. The tracker is per control-plane replica: only the leader's reaches the
//! command (docs/AGENTS.md "Limits").

pub mod breakers;
pub mod loops;
pub mod policy;
pub mod semconv;

use std::collections::BTreeMap;
use std::collections::hash_map::RandomState;
use std::sync::{Arc, Mutex, MutexGuard};

use brownout_protocol::{AbortEntry, Category, Criticality, FailureEvent, FeatureState};
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};
use serde::Serialize;

pub use breakers::{BreakerState, BreakerView, Transition};
pub use loops::LoopKill;
pub use policy::AgentsPolicy;

use crate::store::SpanRow;

/// The `error_type` of the failure event a loop becomes.
pub const LOOP_ERROR_TYPE: &str = "AgentLoopDetected";

/// What the guards add to the next command.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CommandPart {
    /// `tool:<name>` → `disabled` (open) or `probe` (half-open).
    pub features: BTreeMap<String, FeatureState>,
    /// Loop kills in force.
    pub abort: Vec<AbortEntry>,
    /// `limits.probe_ratio` while any breaker is half-open (from the policy; `None`: the serving
    /// tier's default).
    pub probe_ratio: Option<f64>,
}

impl CommandPart {
    pub fn is_empty(&self) -> bool {
        self.features.is_empty() && self.abort.is_empty()
    }
}

/// Metrics (`brownout_agents_*`); no label takes client input.
#[derive(Clone)]
struct AgentMetrics {
    tool_calls: IntCounterVec,
    loops: IntCounter,
    tracked: IntGauge,
    evictions: IntCounterVec,
    abort_entries: IntGauge,
    breakers: IntGaugeVec,
    transitions: IntCounterVec,
    tools_untracked: IntCounter,
}

impl AgentMetrics {
    fn new() -> AgentMetrics {
        AgentMetrics {
            tool_calls: IntCounterVec::new(
                Opts::new(
                    "brownout_agents_tool_calls_total",
                    "Tool-call spans seen, by outcome (ok, error, timeout).",
                ),
                &["outcome"],
            )
            .expect("valid metric"),
            loops: IntCounter::new(
                "brownout_agents_loops_detected_total",
                "Agent loops detected (each one a failure event and abort entries).",
            )
            .expect("valid metric"),
            tracked: IntGauge::new(
                "brownout_agents_traces_tracked",
                "Traces and conversations whose tool-call window is kept.",
            )
            .expect("valid metric"),
            evictions: IntCounterVec::new(
                Opts::new(
                    "brownout_agents_trace_evictions_total",
                    "Tool-call windows forgotten, by reason (capacity, expired).",
                ),
                &["reason"],
            )
            .expect("valid metric"),
            abort_entries: IntGauge::new(
                "brownout_agents_abort_entries",
                "Loop-kill abort entries in force.",
            )
            .expect("valid metric"),
            breakers: IntGaugeVec::new(
                Opts::new(
                    "brownout_agents_breakers",
                    "Tool circuit breakers by state (closed, open, half_open).",
                ),
                &["state"],
            )
            .expect("valid metric"),
            transitions: IntCounterVec::new(
                Opts::new(
                    "brownout_agents_breaker_transitions_total",
                    "Tool breaker state changes, by the state entered.",
                ),
                &["state"],
            )
            .expect("valid metric"),
            tools_untracked: IntCounter::new(
                "brownout_agents_tools_untracked_total",
                "Tool calls of tools not tracked because every breaker slot was open or half-open.",
            )
            .expect("valid metric"),
        }
    }

    fn register(&self, r: &Registry) -> Result<(), prometheus::Error> {
        r.register(Box::new(self.tool_calls.clone()))?;
        r.register(Box::new(self.loops.clone()))?;
        r.register(Box::new(self.tracked.clone()))?;
        r.register(Box::new(self.evictions.clone()))?;
        r.register(Box::new(self.abort_entries.clone()))?;
        r.register(Box::new(self.breakers.clone()))?;
        r.register(Box::new(self.transitions.clone()))?;
        r.register(Box::new(self.tools_untracked.clone()))?;
        Ok(())
    }
}

struct State {
    loops: loops::LoopTracker<RandomState>,
    breakers: breakers::BreakerSet,
    /// Counters already added to the metrics (they are exported as deltas).
    exported: (u64, u64, u64),
}

/// The agent guards of one control plane (see the module docs). Cheap to share (`Arc`).
pub struct AgentGuards {
    policy: AgentsPolicy,
    hasher: RandomState,
    state: Mutex<State>,
    metrics: AgentMetrics,
}

impl std::fmt::Debug for AgentGuards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentGuards").finish_non_exhaustive()
    }
}

/// `GET /ui/api/agents` and the Agents page.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AgentsView {
    pub generated_at_ms: u64,
    /// False when the control plane runs without agent guards.
    pub enabled: bool,
    pub breakers: Vec<BreakerView>,
    /// Newest first, at most [`breakers::TRANSITIONS_KEPT`].
    pub transitions: Vec<Transition>,
    /// Newest first, at most [`loops::KILLS_KEPT`].
    pub loop_kills: Vec<LoopKill>,
    pub abort_entries: usize,
    pub loops: loops::LoopCounters,
    pub breaker_counts: breakers::BreakerCounters,
    /// The policy in words (window, thresholds, classes).
    pub policy: PolicyView,
}

/// The policy's figures as shown.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PolicyView {
    pub loop_window: usize,
    pub loop_repeats: u32,
    pub abort_secs: u64,
    pub max_traces: usize,
    pub breaker_window_secs: u64,
    pub failure_ratio: f64,
    pub min_calls: u32,
    pub cool_down_secs: u64,
    pub close_after_successes: u32,
    pub classes: Vec<ClassView>,
}

/// A tool class as shown.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClassView {
    pub name: String,
    pub timeout_ms: u64,
}

/// What [`AgentGuards::observe_at`] found in one batch of spans.
#[derive(Debug, Default)]
pub struct Observed {
    /// One `agent_loop` failure event per loop found, to store with the batch.
    pub failures: Vec<FailureEvent>,
    pub tool_calls: usize,
    pub transitions: Vec<Transition>,
}

impl AgentGuards {
    /// Guards under `policy`, with their metrics registered in `registry` when given.
    ///
    /// # Errors
    /// When a metric of the same name is already registered.
    pub fn new(
        policy: AgentsPolicy,
        registry: Option<&Registry>,
    ) -> Result<Arc<AgentGuards>, prometheus::Error> {
        let metrics = AgentMetrics::new();
        if let Some(r) = registry {
            metrics.register(r)?;
        }
        let hasher = RandomState::new();
        Ok(Arc::new(AgentGuards {
            state: Mutex::new(State {
                loops: loops::LoopTracker::new(policy.loops.clone(), hasher.clone()),
                breakers: breakers::BreakerSet::new(policy.breakers.clone()),
                exported: (0, 0, 0),
            }),
            policy,
            hasher,
            metrics,
        }))
    }

    pub fn policy(&self) -> &AgentsPolicy {
        &self.policy
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Follows the tool calls among `spans` at time `now_ms`.
    pub fn observe_at(&self, spans: &[SpanRow], now_ms: u64) -> Observed {
        let mut out = Observed::default();
        let calls: Vec<semconv::ToolCall> = spans
            .iter()
            .filter_map(|s| semconv::tool_call(s, &self.hasher))
            .collect();
        if calls.is_empty() {
            return out;
        }
        let mut st = self.lock();
        for c in &calls {
            let timeout_ms = self
                .policy
                .breakers
                .class_of(&c.tool, c.class.as_deref())
                .timeout_ms;
            let outcome = if c.failed {
                "error"
            } else if c.duration_us > timeout_ms.saturating_mul(1000) {
                "timeout"
            } else {
                "ok"
            };
            self.metrics.tool_calls.with_label_values(&[outcome]).inc();
            out.transitions.extend(st.breakers.record(c, now_ms));
            if let Some(kill) = st.loops.observe(c, now_ms) {
                tracing::warn!(id = %kill.id, kind = kill.kind, tool = %kill.tool, calls = kill.calls, "agent loop detected: aborting");
                out.failures.push(loop_failure(&kill, c));
            }
        }
        out.tool_calls = calls.len();
        self.export(&mut st, &out.transitions, now_ms);
        out
    }

    fn export(&self, st: &mut State, transitions: &[Transition], now_ms: u64) {
        for t in transitions {
            tracing::info!(tool = %t.tool, from = t.from.as_str(), to = t.to.as_str(), reason = %t.reason, "tool breaker");
            self.metrics
                .transitions
                .with_label_values(&[t.to.as_str()])
                .inc();
        }
        let lc = st.loops.counters();
        let bc = st.breakers.counters();
        let (cap, exp, loops) = st.exported;
        self.metrics
            .evictions
            .with_label_values(&["capacity"])
            .inc_by(lc.evicted_capacity - cap);
        self.metrics
            .evictions
            .with_label_values(&["expired"])
            .inc_by(lc.evicted_expired - exp);
        self.metrics.loops.inc_by(lc.loops - loops);
        st.exported = (lc.evicted_capacity, lc.evicted_expired, lc.loops);
        self.metrics
            .tracked
            .set(i64::try_from(lc.tracked).unwrap_or(i64::MAX));
        let untracked = bc
            .untracked
            .saturating_sub(self.metrics.tools_untracked.get());
        self.metrics.tools_untracked.inc_by(untracked);
        let aborts = st.loops.aborts(now_ms).len();
        self.metrics.abort_entries.set(aborts as i64);
        let closed = bc.tracked - bc.open - bc.half_open;
        for (s, n) in [
            ("closed", closed),
            ("open", bc.open),
            ("half_open", bc.half_open),
        ] {
            self.metrics.breakers.with_label_values(&[s]).set(n as i64);
        }
    }

    /// What the next command carries (breakers advanced to `now_ms` first, idle windows
    /// expired).
    pub fn command_part(&self, now_ms: u64) -> CommandPart {
        let mut st = self.lock();
        let transitions = st.breakers.tick(now_ms);
        st.loops.expire(now_ms);
        self.export(&mut st, &transitions, now_ms);
        let features = st.breakers.features();
        CommandPart {
            probe_ratio: self.policy.breakers.probe_ratio,
            abort: st.loops.aborts(now_ms),
            features,
        }
    }

    /// The page's view.
    pub fn view(&self, now_ms: u64) -> AgentsView {
        let mut st = self.lock();
        let transitions = st.breakers.tick(now_ms);
        self.export(&mut st, &transitions, now_ms);
        let p = &self.policy;
        AgentsView {
            generated_at_ms: now_ms,
            enabled: true,
            breakers: st.breakers.view(now_ms),
            transitions: st.breakers.transitions(),
            loop_kills: st.loops.kills(),
            abort_entries: st.loops.aborts(now_ms).len(),
            loops: st.loops.counters(),
            breaker_counts: st.breakers.counters(),
            policy: PolicyView {
                loop_window: p.loops.window,
                loop_repeats: p.loops.repeats,
                abort_secs: p.loops.abort_ms / 1000,
                max_traces: p.loops.max_traces,
                breaker_window_secs: p.breakers.window_ms / 1000,
                failure_ratio: p.breakers.failure_ratio,
                min_calls: p.breakers.min_calls,
                cool_down_secs: p.breakers.cool_down_ms / 1000,
                close_after_successes: p.breakers.close_after_successes,
                classes: p
                    .breakers
                    .classes
                    .iter()
                    .map(|c| ClassView {
                        name: c.name.clone(),
                        timeout_ms: c.timeout_ms,
                    })
                    .collect(),
            },
        }
    }
}

impl crate::ingest::SpanObserver for AgentGuards {
    fn observe(&self, spans: &[SpanRow]) -> Vec<FailureEvent> {
        self.observe_at(spans, brownout_protocol::now_ms()).failures
    }
}

/// The failure event a loop becomes (stored with the batch, so it reaches the patterns, the
/// report and the UI like any other failure).
fn loop_failure(kill: &LoopKill, call: &semconv::ToolCall) -> FailureEvent {
    let mut attributes = BTreeMap::new();
    attributes.insert("abort_kind".into(), kill.kind.to_string());
    attributes.insert("abort_id".into(), kill.id.clone());
    attributes.insert("abort_until_ms".into(), kill.until_ms.to_string());
    attributes.insert("tool".into(), kill.tool.clone());
    attributes.insert("tool_calls".into(), kill.calls.to_string());
    if let Some(c) = &call.conversation {
        attributes.insert("conversation_id".into(), c.clone());
    }
    FailureEvent {
        ts_ms: kill.at_ms,
        service: if kill.service.is_empty() {
            "unknown".into()
        } else {
            kill.service.clone()
        },
        host: String::new(),
        request_id: String::new(),
        trace_id: kill.trace_id.clone(),
        user_id: kill.user.clone(),
        feature: String::new(),
        criticality: Criticality::Default,
        category: Category::AgentLoop,
        error_type: LOOP_ERROR_TYPE.into(),
        message: kill.reason.clone(),
        latency_ms: 0.0,
        attributes,
    }
}

#[cfg(test)]
pub(crate) mod tests;
