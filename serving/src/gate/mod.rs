//! The admission gate: admit or refuse one request from its metadata ([`RequestMeta`]), the
//! command in force ([`ControlHandle`]) and this instance's own state (its `instances` entry,
//! token bucket, per-user counts, probe counters). It knows nothing of the engine, so the same
//! gate stands in front of the bundled engine and of any other OpenAI-compatible upstream.
//!
//! ```text
//! let meta = RequestMeta::from_headers(&headers)?.with_body(body.user, tool_names)?;   // 400s
//! match gate.admit(&meta) {
//!     Ok(admitted)  => serve with admitted.route / max_tokens_cap, holding admitted.permit
//!     Err(refusal)  => answer refusal.outcome.status() with refusal.outcome.code(), Retry-After
//! }
//! ```
//!
//! Checks, in this order (the first that refuses answers; docs/SERVING.md "Admission"):
//!
//! | # | check | who | refusal |
//! |---|---|---|---|
//! | 1 | `abort` lists the `x-brownout-conversation` or the `traceparent` trace id | everyone | 409 `agent_loop_detected` |
//! | 2 | `features[x-brownout-feature]` is `disabled` (or `probe` and not in the share) | everyone | 503 `feature_disabled` |
//! | 3 | `features["tool:<name>"]` of a declared tool is `disabled` (or `probe`, not in the share) | everyone | 503 `tool_disabled` |
//! | 4 | T3: criticality below `shed.admit_min_criticality` (with `shed.admit_rps`: only past that rate, `default` before `sheddable`, critical drawing on it too) | non-critical | 429 `shed` |
//! | 5 | this instance's entry says `drain` | non-critical | 503 `instance_draining` |
//! | 6 | the user has the cap's worth of agent requests in flight | non-critical agent traffic | 429 `user_concurrency_limit` |
//! | 7 | the `admit_rps` bucket is empty | non-critical | 429 `admission_throttled` |
//!
//! Cluster-wide decisions (1–4) come before this instance's (5–7): a client told "draining" may
//! retry elsewhere, so it must not be a request any instance would refuse. The stateful checks
//! come last, so a request refused earlier takes no user slot and no token.

pub mod bucket;
pub mod meta;
pub mod users;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use brownout_protocol::{
    AbortKind, Category, Command, Criticality, FeatureState, MAX_ABORT_ENTRIES, MAX_ABORT_ID_BYTES,
    ResolvedInstance, TOOL_FEATURE_PREFIX, Tier,
};
use rand::Rng;
use serde_json::{Value, json};

pub use bucket::TokenBucket;
pub use meta::{MetaError, RequestMeta};
pub use users::{Acquire, Offender, UserTable};

use crate::control::{Applied, ControlHandle};

/// A deliberate degradation outcome: a request the serving tier refused on purpose. The names
/// are the `outcome` label of `brownout_serving_requests_total` and `brownout_serving_refusals_total`,
/// the `brownout.outcome` span attribute and the `outcome` attribute of failure events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    LoopAbort,
    FeatureDisabled,
    ToolDisabled,
    Shed,
    Drained,
    UserCap,
    Throttled,
}

impl Outcome {
    /// Every outcome, in the order of the checks that give them (the module's table;
    /// `checks_run_in_the_documented_order` holds the gate to it).
    pub const ALL: [Outcome; 7] = [
        Outcome::LoopAbort,
        Outcome::FeatureDisabled,
        Outcome::ToolDisabled,
        Outcome::Shed,
        Outcome::Drained,
        Outcome::UserCap,
        Outcome::Throttled,
    ];

    /// The outcome label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::LoopAbort => "loop_abort",
            Outcome::FeatureDisabled => "feature_disabled",
            Outcome::ToolDisabled => "tool_disabled",
            Outcome::Shed => "shed",
            Outcome::Drained => "drained",
            Outcome::UserCap => "user_cap",
            Outcome::Throttled => "throttled",
        }
    }

    /// Whether `s` is a deliberate outcome's label.
    pub fn parse(s: &str) -> Option<Outcome> {
        Outcome::ALL.into_iter().find(|o| o.as_str() == s)
    }

    /// The OpenAI-style error `code`.
    pub fn code(self) -> &'static str {
        match self {
            Outcome::LoopAbort => "agent_loop_detected",
            Outcome::FeatureDisabled => "feature_disabled",
            Outcome::ToolDisabled => "tool_disabled",
            Outcome::Shed => "shed",
            Outcome::Drained => "instance_draining",
            Outcome::UserCap => "user_concurrency_limit",
            Outcome::Throttled => "admission_throttled",
        }
    }

    /// The HTTP status.
    pub fn status(self) -> u16 {
        match self {
            Outcome::LoopAbort => 409,
            Outcome::FeatureDisabled | Outcome::ToolDisabled | Outcome::Drained => 503,
            Outcome::Shed | Outcome::UserCap | Outcome::Throttled => 429,
        }
    }

    /// The failure-event category (R1 taxonomy): load refusals are `rate_limited`, turned-off
    /// capability is `degraded`.
    pub fn category(self) -> Category {
        match self {
            Outcome::Shed | Outcome::UserCap | Outcome::Throttled => Category::RateLimited,
            Outcome::LoopAbort
            | Outcome::FeatureDisabled
            | Outcome::ToolDisabled
            | Outcome::Drained => Category::Degraded,
        }
    }

    /// The failure event's `error_type`.
    pub fn error_type(self) -> &'static str {
        match self {
            Outcome::LoopAbort => "AgentLoopAborted",
            Outcome::FeatureDisabled => "FeatureDisabled",
            Outcome::ToolDisabled => "ToolDisabled",
            Outcome::Shed => "LoadShed",
            Outcome::Drained => "InstanceDraining",
            Outcome::UserCap => "UserConcurrencyLimit",
            Outcome::Throttled => "AdmissionThrottled",
        }
    }

    fn index(self) -> usize {
        Outcome::ALL
            .iter()
            .position(|o| *o == self)
            .expect("listed")
    }
}

/// Which model route the command gives the request (the engine maps it to its routes; an
/// upstream proxy to its upstream models).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteChoice {
    Primary,
    Fallback,
}

/// The gate's own settings (flags of `brownout-serve`).
#[derive(Debug, Clone, PartialEq)]
pub struct GateConfig {
    /// Most agent requests in flight per user (`--user-concurrency`, default 3; 0 = no cap).
    /// `limits.user_concurrency` can only lower it.
    pub user_concurrency: u32,
    /// Users the per-user table tracks (`--max-tracked-users`, default 16384).
    pub max_tracked_users: usize,
    /// `Retry-After` of `instance_draining` (seconds).
    pub drain_retry_after_s: u64,
    /// `Retry-After` of `user_concurrency_limit` (seconds).
    pub user_cap_retry_after_s: u64,
    /// Probe counters kept (one per feature in `probe`); features past it are refused as
    /// `disabled`.
    pub max_probes: usize,
}

impl Default for GateConfig {
    fn default() -> GateConfig {
        GateConfig {
            user_concurrency: 3,
            max_tracked_users: 16_384,
            drain_retry_after_s: 2,
            user_cap_retry_after_s: 1,
            max_probes: 1024,
        }
    }
}

/// An admitted request: what the command lets it have.
#[derive(Debug)]
pub struct Admitted {
    pub tier: Tier,
    /// `(epoch, version)` of the command decided under.
    pub command: (u64, u64),
    pub route: RouteChoice,
    /// `limits.max_tokens_cap` for non-critical traffic.
    pub max_tokens_cap: Option<u32>,
    /// The user slot, held while the request is in flight (dropping it gives the slot back).
    pub permit: Option<UserPermit>,
}

/// A refused request.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub outcome: Outcome,
    /// For the client.
    pub message: String,
    pub retry_after_s: Option<u64>,
    /// Extra fields of the error object (`hint`, `feature`, `tool`, `estimated_recovery_at`…).
    pub extra: serde_json::Map<String, Value>,
    pub tier: Tier,
    pub command: (u64, u64),
    /// For logs and the failure event.
    pub detail: String,
}

impl Refusal {
    fn new(outcome: Outcome, p: &Policy, message: String, detail: String) -> Refusal {
        let c = &p.applied.command;
        Refusal {
            outcome,
            message,
            retry_after_s: None,
            extra: serde_json::Map::new(),
            tier: c.tier,
            command: c.order_key(),
            detail,
        }
    }
    fn with(mut self, k: &str, v: Value) -> Refusal {
        self.extra.insert(k.to_string(), v);
        self
    }
    fn retry(mut self, s: u64) -> Refusal {
        self.retry_after_s = Some(s);
        self
    }
}

/// A user slot; given back on drop.
pub struct UserPermit {
    inner: Arc<Inner>,
    slot: u32,
}

impl std::fmt::Debug for UserPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserPermit")
            .field("slot", &self.slot)
            .finish()
    }
}

impl Drop for UserPermit {
    fn drop(&mut self) {
        self.inner.users().release(self.slot);
    }
}

#[derive(Debug, Clone)]
struct AbortInfo {
    until_ms: u64,
    reason: String,
}

/// The command in force, digested for this instance (rebuilt when the command changes).
#[derive(Debug)]
struct Policy {
    applied: Arc<Applied>,
    instance: Option<ResolvedInstance>,
    user_cap: u32,
    user_cap_from_limits: bool,
    probe_ratio: f64,
    abort_conversations: HashMap<String, AbortInfo>,
    abort_traces: HashMap<String, AbortInfo>,
    /// Entries past the bound, of an unknown kind, or with an over-long id.
    abort_ignored: usize,
}

impl Policy {
    fn build(applied: Arc<Applied>, instance_id: &str, cfg: &GateConfig) -> Policy {
        let c = &applied.command;
        let instance = c.instance_entry(instance_id);
        let (user_cap, from_limits) = match c.limits.user_concurrency {
            // 0 from the command is ignored (the cap is switched off only by the flag).
            Some(l) if l > 0 && (cfg.user_concurrency == 0 || l < cfg.user_concurrency) => {
                (l, true)
            }
            _ => (cfg.user_concurrency, false),
        };
        let mut abort_conversations = HashMap::new();
        let mut abort_traces = HashMap::new();
        let mut ignored = c.abort.len().saturating_sub(MAX_ABORT_ENTRIES);
        for a in c.abort.iter().take(MAX_ABORT_ENTRIES) {
            if a.id.is_empty() || a.id.len() > MAX_ABORT_ID_BYTES {
                ignored += 1;
                continue;
            }
            let info = AbortInfo {
                until_ms: a.until_ms,
                reason: a.reason.chars().take(200).collect(),
            };
            let slot = match &a.kind {
                AbortKind::Conversation => abort_conversations.entry(a.id.clone()),
                AbortKind::Trace => abort_traces.entry(a.id.to_ascii_lowercase()),
                AbortKind::Unknown(_) => {
                    ignored += 1;
                    continue;
                }
            };
            // The same id twice: the later deadline wins.
            slot.and_modify(|i: &mut AbortInfo| {
                if info.until_ms > i.until_ms {
                    *i = info.clone();
                }
            })
            .or_insert(info);
        }
        if ignored > 0 {
            tracing::warn!(
                ignored,
                epoch = c.epoch,
                version = c.version,
                "abort entries ignored (over {MAX_ABORT_ENTRIES}, an id over {MAX_ABORT_ID_BYTES} bytes, or an unknown kind)"
            );
        }
        Policy {
            user_cap,
            user_cap_from_limits: from_limits,
            probe_ratio: c.probe_ratio(),
            instance,
            applied,
            abort_conversations,
            abort_traces,
            abort_ignored: ignored,
        }
    }

    fn command(&self) -> &Command {
        &self.applied.command
    }

    fn draining(&self) -> bool {
        self.instance
            .as_ref()
            .is_some_and(ResolvedInstance::draining)
    }

    fn admit_rps(&self) -> Option<f64> {
        self.instance.as_ref().and_then(|i| i.entry.admit_rps)
    }
}

/// How long a session T3 admitted keeps being admitted without a token (its calls still draw
/// one): longer than a flow's deadline (8 s for agent flows), so a flow that started finishes,
/// and short enough that a busy session cannot hold the capacity for a whole overload.
pub const EXCESS_SESSION_SECS: u64 = 10;

/// Calls seen and passed by one feature in `probe`.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
struct Probe {
    seen: u64,
    passed: u64,
}

impl Probe {
    /// Passes the call iff fewer than `ceil(seen × ratio)` passed so far (counting this one): the
    /// first call passes, then one in every `1/ratio`; exactly `ceil(n × ratio)` of `n` calls.
    fn pass(&mut self, ratio: f64) -> bool {
        self.seen += 1;
        let allowed = (self.seen as f64 * ratio - 1e-9).ceil().max(0.0) as u64;
        let ok = self.passed < allowed;
        if ok {
            self.passed += 1;
        }
        ok
    }
}

#[derive(Debug, Default)]
struct Mutable {
    policy: Option<Arc<Policy>>,
    bucket: TokenBucket,
    /// T3's excess bucket (`shed.admit_rps`).
    excess: TokenBucket,
    /// Sessions (conversation, else user) T3 admitted, and when it first did: their next calls
    /// for [`EXCESS_SESSION_SECS`] go on without a token (drawing one), so T3 refuses whole new
    /// flows rather than a share of every flow's calls.
    excess_sessions: HashMap<String, Instant>,
    probes: BTreeMap<String, Probe>,
}

struct Inner {
    control: ControlHandle,
    cfg: GateConfig,
    state: Mutex<Mutable>,
    users: Mutex<UserTable>,
    refused: [std::sync::atomic::AtomicU64; Outcome::ALL.len()],
}

impl Inner {
    fn users(&self) -> MutexGuard<'_, UserTable> {
        self.users
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    fn state(&self) -> MutexGuard<'_, Mutable> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The gate (cheap to clone; one per instance).
#[derive(Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("instance", &self.inner.control.instance_id())
            .finish_non_exhaustive()
    }
}

/// Figures for `/metrics` (see [`Gate::figures`]).
#[derive(Debug, Clone, PartialEq)]
pub struct GateFigures {
    pub draining: bool,
    /// `None`: no rate (unlimited).
    pub admit_rps: Option<f64>,
    pub admit_tokens: Option<f64>,
    pub user_cap: u32,
    pub users_tracked: usize,
    pub users_untracked_total: u64,
    pub abort_entries: usize,
    pub command: (u64, u64),
}

impl Gate {
    pub fn new(control: ControlHandle, cfg: GateConfig) -> Gate {
        let users = UserTable::new(cfg.max_tracked_users);
        Gate {
            inner: Arc::new(Inner {
                control,
                cfg,
                state: Mutex::new(Mutable::default()),
                users: Mutex::new(users),
                refused: Default::default(),
            }),
        }
    }

    pub fn config(&self) -> &GateConfig {
        &self.inner.cfg
    }

    pub fn control(&self) -> &ControlHandle {
        &self.inner.control
    }

    /// The policy for the command in force (rebuilt once per command), with the bucket's rate
    /// and the probe counters brought in line with it.
    fn policy(&self, st: &mut Mutable, now: Instant) -> Arc<Policy> {
        let applied = self.inner.control.current();
        if let Some(p) = &st.policy
            && Arc::ptr_eq(&p.applied, &applied)
        {
            return p.clone();
        }
        let p = Arc::new(Policy::build(
            applied,
            self.inner.control.instance_id(),
            &self.inner.cfg,
        ));
        st.bucket.set_rate(p.admit_rps(), now);
        st.excess
            .set_rate(p.command().shed.as_ref().and_then(|s| s.admit_rps), now);
        if st.excess.rate().is_none() {
            st.excess_sessions.clear();
        }
        let cmd = p.command();
        st.probes
            .retain(|name, _| cmd.feature_state(name) == FeatureState::Probe);
        st.policy = Some(p.clone());
        p
    }

    /// Decides now.
    ///
    /// # Errors
    /// [`Refusal`] when a check refuses (see the module docs for the order).
    pub fn admit(&self, meta: &RequestMeta) -> Result<Admitted, Refusal> {
        self.admit_at(meta, Instant::now(), brownout_protocol::now_ms())
    }

    /// Decides at a given monotonic time (the token bucket) and unix time (abort deadlines).
    ///
    /// # Errors
    /// As [`Gate::admit`].
    pub fn admit_at(
        &self,
        meta: &RequestMeta,
        now: Instant,
        now_ms: u64,
    ) -> Result<Admitted, Refusal> {
        let r = self.decide(meta, now, now_ms);
        if let Err(refusal) = &r {
            self.inner.refused[refusal.outcome.index()]
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        r
    }

    fn decide(&self, meta: &RequestMeta, now: Instant, now_ms: u64) -> Result<Admitted, Refusal> {
        let mut st = self.inner.state();
        let p = self.policy(&mut st, now);
        let cmd = p.command();
        let tier = cmd.tier;
        let t = tier.as_u8();
        let critical = meta.criticality == Criticality::Critical;

        // 1. Loop kill.
        let hit = meta
            .conversation
            .as_ref()
            .and_then(|c| p.abort_conversations.get(c).map(|a| ("conversation", c, a)))
            .or_else(|| {
                meta.trace_id
                    .as_ref()
                    .and_then(|t| p.abort_traces.get(t).map(|a| ("trace", t, a)))
            })
            .filter(|(_, _, a)| a.until_ms >= now_ms);
        if let Some((kind, id, a)) = hit {
            let until = rfc3339(a.until_ms);
            return Err(Refusal::new(
                Outcome::LoopAbort,
                &p,
                format!(
                    "This {kind} was stopped: the control plane detected an agent loop{}. Start a new {kind}, or wait until {}.",
                    if a.reason.is_empty() { String::new() } else { format!(" ({})", a.reason) },
                    until.as_deref().unwrap_or("the abort expires")
                ),
                format!("{kind} {id} aborted until {}", a.until_ms),
            )
            .with("kind", json!(kind))
            .with("until", json!(until)));
        }

        // 2. The feature.
        if !meta.feature.is_empty() {
            let state = cmd.feature_state(&meta.feature);
            if !self.passes(&mut st, &meta.feature, &state, p.probe_ratio) {
                let f = &meta.feature;
                let (what, detail) = match state {
                    FeatureState::Probe => (
                        "is being re-enabled (only a share of calls passes)",
                        "probe",
                    ),
                    _ => ("is temporarily disabled", "disabled"),
                };
                return Err(Refusal::new(
                    Outcome::FeatureDisabled,
                    &p,
                    format!("The feature `{f}` {what} to protect the service (tier T{t})."),
                    format!("feature {f} {detail} at tier T{t}"),
                )
                .with("hint", json!("Grey this feature out in the UI; GET /v1/features lists feature states and streams changes."))
                .with("feature", json!(f))
                .with("tier", json!(t)));
            }
        }

        // 3. Tool breakers.
        for tool in &meta.tools {
            let name = format!("{TOOL_FEATURE_PREFIX}{tool}");
            let state = cmd.feature_state(&name);
            if !self.passes(&mut st, &name, &state, p.probe_ratio) {
                let s = if state == FeatureState::Probe {
                    "probe"
                } else {
                    "disabled"
                };
                return Err(Refusal::new(
                    Outcome::ToolDisabled,
                    &p,
                    format!(
                        "The tool `{tool}` is {} (its circuit breaker is {}).",
                        if s == "probe" { "being re-tested: only a share of calls may use it" } else { "unavailable" },
                        if s == "probe" { "half-open" } else { "open" }
                    ),
                    format!("tool {tool} {s}"),
                )
                .with("hint", json!(format!("Answer without `{tool}` (drop it from `tools`), or retry later; GET /v1/features shows `{name}`.")))
                .with("tool", json!(tool))
                .with("feature", json!(name))
                .with("state", json!(s))
                .with("tier", json!(t)));
            }
        }

        // 4. Load shedding (T3): the whole class below `admit_min_criticality`, or with
        // `admit_rps` only the excess over that rate (critical requests draw on it too).
        if let Some(shed) = &cmd.shed {
            if critical || meta.criticality >= shed.admit_min_criticality {
                st.excess.draw(now);
            } else if !self.excess_admits(&mut st, meta, now) {
                let retry = shed_retry_after(shed, now_ms);
                let c = meta.criticality;
                let (message, detail) = match shed.admit_rps {
                    Some(r) => (
                        format!(
                            "The service is at capacity and sheds the excess of {c} traffic to protect critical requests (tier T{t}, {r} requests/s admitted here); retry after {retry} s."
                        ),
                        format!("{c} request over the T3 admission rate {r}/s"),
                    ),
                    None => (
                        format!(
                            "The service is shedding {c} traffic to protect critical requests (tier T{t}); retry after {retry} s."
                        ),
                        format!("{c} request shed at tier T{t}"),
                    ),
                };
                let mut r = Refusal::new(Outcome::Shed, &p, message, detail)
                    .with(
                        "estimated_recovery_at",
                        json!(rfc3339(shed.recovery_eta_ms)),
                    )
                    .with("tier", json!(t))
                    .retry(retry);
                if let Some(rate) = shed.admit_rps {
                    r = r.with("admit_rps", json!(rate));
                }
                return Err(r);
            }
        }

        // 5. Drain.
        if !critical && p.draining() {
            let reason = p.instance.as_ref().map_or("", |i| i.entry.reason.as_str());
            return Err(Refusal::new(
                Outcome::Drained,
                &p,
                format!(
                    "This instance is draining{}: it admits only critical requests. Retry on another instance.",
                    if reason.is_empty() { String::new() } else { format!(" ({reason})") }
                ),
                format!("instance {} draining", self.inner.control.instance_id()),
            )
            .with("instance", json!(self.inner.control.instance_id()))
            .retry(self.inner.cfg.drain_retry_after_s));
        }

        // 6. Per-user cap (agent traffic).
        let mut permit = None;
        if !critical
            && p.user_cap > 0
            && meta.is_agent()
            && let Some(user) = &meta.user
        {
            match self.inner.users().acquire(user, p.user_cap) {
                Acquire::Counted(slot) => {
                    permit = Some(UserPermit {
                        inner: self.inner.clone(),
                        slot,
                    });
                }
                Acquire::Untracked => {}
                Acquire::Over(n) => {
                    let cap = p.user_cap;
                    return Err(Refusal::new(
                        Outcome::UserCap,
                        &p,
                        format!(
                            "This user already has {n} agent requests in flight on this instance; at most {cap} at a time. Retry when one has finished."
                        ),
                        format!("user over the cap of {cap} ({n} in flight)"),
                    )
                    .with("limit", json!(cap))
                    .retry(self.inner.cfg.user_cap_retry_after_s));
                }
            }
        }

        // 7. Admission rate.
        if !critical && let Err(retry) = st.bucket.try_take(now) {
            let rate = st.bucket.rate().unwrap_or(0.0);
            return Err(Refusal::new(
                Outcome::Throttled,
                &p,
                format!("This instance admits {rate} non-critical requests per second while it ramps up; retry after {retry} s."),
                format!("admission rate {rate}/s exhausted"),
            )
            .with("admit_rps", json!(rate))
            .retry(retry));
        }

        let class = match meta.criticality {
            Criticality::Critical => "critical",
            Criticality::Default => "default",
            Criticality::Sheddable if cmd.model_route.contains_key("sheddable") => "sheddable",
            Criticality::Sheddable => "default",
        };
        Ok(Admitted {
            tier,
            command: cmd.order_key(),
            route: if cmd.route_for(class) == "fallback" {
                RouteChoice::Fallback
            } else {
                RouteChoice::Primary
            },
            max_tokens_cap: if critical {
                None
            } else {
                cmd.limits.max_tokens_cap.map(|c| c.max(1))
            },
            permit,
        })
    }

    /// At T3 with `shed.admit_rps`: whether the excess bucket admits a request of this
    /// criticality (`sheddable` leaves the last half of the burst to `default`). Without the
    /// rate nothing below the admitted criticality passes.
    ///
    /// A session (conversation, else user) admitted less than [`EXCESS_SESSION_SECS`] ago goes
    /// on and draws a token like a critical request: a flow's later calls are not refused once
    /// its first was admitted. The session table is bounded by `max_tracked_users`; past it,
    /// sessions older than the window go, and a new one that still does not fit is not
    /// remembered (its next calls need a token of their own).
    fn excess_admits(&self, st: &mut Mutable, meta: &RequestMeta, now: Instant) -> bool {
        if st.excess.rate().is_none() {
            return false;
        }
        let window = std::time::Duration::from_secs(EXCESS_SESSION_SECS);
        let key = meta.conversation.as_ref().or(meta.user.as_ref());
        if let Some(k) = key
            && st
                .excess_sessions
                .get(k)
                .is_some_and(|t| now.saturating_duration_since(*t) < window)
        {
            st.excess.draw(now);
            return true;
        }
        let reserve = if meta.criticality == Criticality::Sheddable {
            st.excess.burst() / 2.0
        } else {
            0.0
        };
        if st.excess.try_take_above(now, reserve).is_err() {
            return false;
        }
        if let Some(k) = key {
            let cap = self.inner.cfg.max_tracked_users.max(1);
            if st.excess_sessions.len() >= cap {
                st.excess_sessions
                    .retain(|_, t| now.saturating_duration_since(*t) < window);
            }
            if st.excess_sessions.len() < cap {
                st.excess_sessions.insert(k.clone(), now);
            }
        }
        true
    }

    /// Whether a call to a feature in `state` passes (counting probes).
    fn passes(&self, st: &mut Mutable, name: &str, state: &FeatureState, ratio: f64) -> bool {
        match state {
            FeatureState::Disabled => false,
            FeatureState::Probe => {
                if !st.probes.contains_key(name) && st.probes.len() >= self.inner.cfg.max_probes {
                    return false;
                }
                st.probes.entry(name.to_string()).or_default().pass(ratio)
            }
            FeatureState::Enabled | FeatureState::Unknown(_) => true,
        }
    }

    /// This instance's entry when it says drain (for `/health`).
    pub fn draining(&self) -> Option<ResolvedInstance> {
        let mut st = self.inner.state();
        let p = self.policy(&mut st, Instant::now());
        p.instance.clone().filter(ResolvedInstance::draining)
    }

    /// Refusals counted by outcome since start.
    pub fn refused(&self, o: Outcome) -> u64 {
        self.inner.refused[o.index()].load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Gauges for `/metrics`.
    pub fn figures(&self) -> GateFigures {
        let now = Instant::now();
        let now_ms = brownout_protocol::now_ms();
        let (draining, rps, tokens, cap, aborts, order) = {
            let mut st = self.inner.state();
            let p = self.policy(&mut st, now);
            let active = active_aborts(&p, now_ms);
            (
                p.draining(),
                st.bucket.rate(),
                st.bucket.tokens(now),
                p.user_cap,
                active,
                p.command().order_key(),
            )
        };
        let users = self.inner.users();
        GateFigures {
            draining,
            admit_rps: rps,
            admit_tokens: tokens,
            user_cap: cap,
            users_tracked: users.len(),
            users_untracked_total: users.untracked_total,
            abort_entries: aborts,
            command: order,
        }
    }

    /// The gate's part of `/debug/resource`.
    pub fn debug(&self) -> Value {
        let now = Instant::now();
        let now_ms = brownout_protocol::now_ms();
        let mut st = self.inner.state();
        let p = self.policy(&mut st, now);
        let c = p.command();
        let entry = p.instance.as_ref().map(|i| {
            json!({
                "applied": i.applied.as_str(),
                "drain": i.draining(),
                "max_num_seqs": i.entry.max_num_seqs,
                "admit_rps": i.entry.admit_rps,
                "reason": i.entry.reason,
            })
        });
        let rate = st.bucket.rate();
        let tokens = st.bucket.tokens(now);
        let throttled = st.bucket.throttled_total;
        let excess = json!({
            "admit_rps": st.excess.rate(),
            "tokens": st.excess.tokens(now),
            "shed_total": st.excess.throttled_total,
            "sessions": st.excess_sessions.len(),
        });
        let probes: serde_json::Map<String, Value> = st
            .probes
            .iter()
            .map(|(k, v)| (k.clone(), json!({"seen": v.seen, "passed": v.passed})))
            .collect();
        let active = active_aborts(&p, now_ms);
        let (convs, traces) = (p.abort_conversations.len(), p.abort_traces.len());
        let ignored = p.abort_ignored;
        let (cap, from_limits, ratio) = (p.user_cap, p.user_cap_from_limits, p.probe_ratio);
        let draining = p.draining();
        drop(st);
        let users = self.inner.users();
        let refused: serde_json::Map<String, Value> = Outcome::ALL
            .iter()
            .map(|o| (o.as_str().to_string(), json!(self.refused(*o))))
            .collect();
        json!({
            "instance_id": self.inner.control.instance_id(),
            "command": {"epoch": c.epoch, "version": c.version, "tier": c.tier.as_u8()},
            "draining": draining,
            "instance_entry": entry,
            "admission": {
                "admit_rps": rate,
                "burst": rate.map(|r| if r > 0.0 { r.max(1.0) } else { 0.0 }),
                "tokens": tokens,
                "throttled_total": throttled,
                "t3_excess": excess,
            },
            "user_concurrency": {
                "cap": cap,
                "source": if from_limits { "limits.user_concurrency" } else { "--user-concurrency" },
                "applies_to": "non-critical agent requests (tools or x-brownout-conversation) with a user",
                "tracked_users": users.len(),
                "active_users": users.active(),
                "in_flight_requests": users.in_flight_total(),
                "capacity": users.capacity(),
                "evicted_total": users.evicted_total,
                "untracked_total": users.untracked_total,
                "approx_bytes": users.approx_bytes(),
                "top_offenders": users.top_offenders(10),
            },
            "abort": {
                "active": active,
                "conversations": convs,
                "traces": traces,
                "ignored": ignored,
            },
            "probes": {"ratio": ratio, "features": probes},
            "refused": refused,
        })
    }
}

/// The `Retry-After` of a T3 refusal. Shedding the whole class (no `admit_rps`):
/// `retry_after_s × U[1, 1 + jitter_ratio]` (docs/REQUIREMENTS.md R3.3). Shedding the excess:
/// uniform from `retry_after_s` up to the time left until the recovery estimate (at least the
/// jittered span, at most [`bucket::MAX_RETRY_AFTER_S`]), so the refused do not all come back
/// as one wave while the overload drains.
fn shed_retry_after(shed: &brownout_protocol::Shed, now_ms: u64) -> u64 {
    let base = f64::from(shed.retry_after_s.max(1));
    let jitter = shed.jitter_ratio.clamp(0.0, 10.0);
    let mut hi = base * (1.0 + jitter);
    if shed.admit_rps.is_some() {
        let left = shed.recovery_eta_ms.saturating_sub(now_ms) as f64 / 1000.0;
        hi = hi.max(left.min(bucket::MAX_RETRY_AFTER_S as f64));
    }
    let v = if hi > base {
        rand::rng().random_range(base..=hi)
    } else {
        base
    };
    v.ceil() as u64
}

fn active_aborts(p: &Policy, now_ms: u64) -> usize {
    p.abort_conversations
        .values()
        .chain(p.abort_traces.values())
        .filter(|a| a.until_ms >= now_ms)
        .count()
}

fn rfc3339(ms: u64) -> Option<String> {
    chrono::DateTime::from_timestamp_millis(i64::try_from(ms).ok()?)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

#[cfg(test)]
mod tests;
