//! The degradation command (docs/ARCHITECTURE.md §3, docs/PROTOCOL.md).
//!
//! Field names are the contract: fields may be added, never renamed.
//!
//! **Unknown fields rule.** A command is verified over its exact JSON bytes *before* it is parsed,
//! so a newer control plane may add fields without breaking older serving tiers. Unknown top-level
//! fields are *kept* in [`Command::extra`] (and written back out on re-serialisation) and otherwise
//! ignored; unknown fields inside nested objects (`reason`, `limits`, `shed`, an `instances` entry,
//! an `abort` entry) are ignored. Unknown *values* of the two open vocabularies — a feature state
//! ([`FeatureState::Unknown`], treated as enabled) and an abort kind ([`AbortKind::Unknown`],
//! matches nothing) — are kept, never an error. Parsing never panics: a malformed command is an
//! error value.
//!
//! The fields added after the first release (`instances`, `abort`, `limits.user_concurrency`,
//! `limits.probe_ratio`, the `probe` state) are left out of the JSON when unset, so a command that
//! uses none of them has the same shape as before; an older subscriber keeps `instances` and
//! `abort` in its `extra` and ignores the nested ones.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Degradation tier. Serialised as the integer 0–3.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(try_from = "u8", into = "u8")]
pub enum Tier {
    /// Normal operation: everything on.
    #[default]
    T0,
    /// Shed non-critical features (grey them out).
    T1,
    /// T1 plus lower precision: fallback model route, capped `max_tokens`, lower `max_num_seqs`.
    T2,
    /// T2 plus shed load: requests below the admitted criticality get 429 + Retry-After.
    T3,
}

/// A tier number outside 0–3.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tier must be 0, 1, 2 or 3 (got {0})")]
pub struct TierParseError(pub u64);

impl Tier {
    /// All tiers, lowest first.
    pub const ALL: [Tier; 4] = [Tier::T0, Tier::T1, Tier::T2, Tier::T3];

    /// The tier as its number.
    pub fn as_u8(self) -> u8 {
        self as u8
    }

    /// One tier lower (T0 stays T0): how a serving tier steps down when a lease expires.
    pub fn step_down(self) -> Tier {
        match self {
            Tier::T0 | Tier::T1 => Tier::T0,
            Tier::T2 => Tier::T1,
            Tier::T3 => Tier::T2,
        }
    }

    /// One tier higher (T3 stays T3).
    pub fn step_up(self) -> Tier {
        match self {
            Tier::T0 => Tier::T1,
            Tier::T1 => Tier::T2,
            Tier::T2 | Tier::T3 => Tier::T3,
        }
    }
}

impl TryFrom<u8> for Tier {
    type Error = TierParseError;
    fn try_from(v: u8) -> Result<Self, Self::Error> {
        match v {
            0 => Ok(Tier::T0),
            1 => Ok(Tier::T1),
            2 => Ok(Tier::T2),
            3 => Ok(Tier::T3),
            other => Err(TierParseError(u64::from(other))),
        }
    }
}

impl From<Tier> for u8 {
    fn from(t: Tier) -> u8 {
        t.as_u8()
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "T{}", self.as_u8())
    }
}

/// Criticality of a request or feature. Ordered: `Sheddable < Default < Critical`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Criticality {
    /// P2: PDF analysis, image generation, multilingual e-mail…
    Sheddable,
    /// P1.
    #[default]
    Default,
    /// P0: login, basic Q&A. Never shed.
    Critical,
}

impl Criticality {
    /// The wire name (`critical`, `default`, `sheddable`).
    pub fn as_str(self) -> &'static str {
        match self {
            Criticality::Critical => "critical",
            Criticality::Default => "default",
            Criticality::Sheddable => "sheddable",
        }
    }

    /// Parses the wire name or the P0/P1/P2 alias (case-insensitive).
    pub fn parse(s: &str) -> Option<Criticality> {
        match s.trim().to_ascii_lowercase().as_str() {
            "critical" | "p0" => Some(Criticality::Critical),
            "default" | "p1" => Some(Criticality::Default),
            "sheddable" | "p2" => Some(Criticality::Sheddable),
            _ => None,
        }
    }
}

impl fmt::Display for Criticality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a feature is on. Front ends grey out `disabled` features.
///
/// **Tolerant parsing.** Any value this version does not know (a string such as `"half_open"`,
/// or even a number or an object from a future publisher) parses as [`FeatureState::Unknown`],
/// is kept verbatim (written back out on re-serialisation) and is *treated as enabled*: a newer
/// control plane's new state can never make a serving tier refuse the whole command. (Serving
/// tiers built before `probe` existed parse strictly and NACK a command carrying `probe` with
/// `invalid_json`; see docs/PROTOCOL.md.)
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum FeatureState {
    #[default]
    Enabled,
    Disabled,
    /// Half-open (a tool breaker testing recovery): the share [`Limits::probe_ratio`] of the calls
    /// that reach an instance passes (default [`DEFAULT_PROBE_RATIO`]), the rest are refused like
    /// `disabled`.
    Probe,
    /// A state from a newer publisher, kept as it came; behaves as `enabled`.
    Unknown(serde_json::Value),
}

/// The share of calls a `probe` feature lets through when `limits.probe_ratio` is absent.
pub const DEFAULT_PROBE_RATIO: f64 = 0.1;

impl FeatureState {
    /// The wire name of a known state (`None` for [`FeatureState::Unknown`]).
    pub fn as_str(&self) -> Option<&'static str> {
        match self {
            FeatureState::Enabled => Some("enabled"),
            FeatureState::Disabled => Some("disabled"),
            FeatureState::Probe => Some("probe"),
            FeatureState::Unknown(_) => None,
        }
    }

    /// Whether every call passes (`enabled`, and any unknown state).
    pub fn is_open(&self) -> bool {
        matches!(self, FeatureState::Enabled | FeatureState::Unknown(_))
    }
}

impl Serialize for FeatureState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            FeatureState::Unknown(v) => v.serialize(s),
            known => s.serialize_str(known.as_str().unwrap_or("enabled")),
        }
    }
}

impl<'de> Deserialize<'de> for FeatureState {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Ok(match v.as_str() {
            Some("enabled") => FeatureState::Enabled,
            Some("disabled") => FeatureState::Disabled,
            Some("probe") => FeatureState::Probe,
            _ => FeatureState::Unknown(v),
        })
    }
}

/// The prefix of a tool breaker's feature name: `tool:<function name>`.
pub const TOOL_FEATURE_PREFIX: &str = "tool:";

/// The `instances` key whose entry applies to every instance without one of its own (and
/// supplies the fields an instance's own entry leaves out).
pub const ALL_INSTANCES: &str = "*";

/// At most this many `abort` entries are honoured; a subscriber ignores the rest (and counts them).
pub const MAX_ABORT_ENTRIES: usize = 1024;

/// An `abort` id longer than this (in bytes) can match nothing and is ignored.
pub const MAX_ABORT_ID_BYTES: usize = 128;

/// Per-instance stop-bleed actions (`instances`). Every field is optional; a field an instance's
/// own entry leaves out comes from the `"*"` entry, if any.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct InstanceEntry {
    /// This instance's `max_num_seqs` (overrides `limits.max_num_seqs` here; never above the
    /// instance's configured value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_num_seqs: Option<u32>,
    /// Admit only critical traffic; the rest gets 503 `instance_draining` and `/health` says
    /// `draining`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<bool>,
    /// Admission rate for non-critical requests (token bucket, requests per second, burst of one
    /// second's worth; 0 admits none). Critical traffic is never throttled by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admit_rps: Option<f64>,
    /// Why (shown in `/debug/resource`, `/health` and logs).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// Which `instances` entries an instance applied (reported in its ack).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EntryApplied {
    /// The entry keyed by the instance's own id.
    pub own: bool,
    /// The `"*"` entry.
    pub default: bool,
}

impl EntryApplied {
    /// `own`, `*` or `own+*` (`None` when no entry applied).
    pub fn as_str(self) -> Option<&'static str> {
        match (self.own, self.default) {
            (true, true) => Some("own+*"),
            (true, false) => Some("own"),
            (false, true) => Some("*"),
            (false, false) => None,
        }
    }

    /// Parses [`EntryApplied::as_str`]'s forms.
    pub fn parse(s: &str) -> Option<EntryApplied> {
        match s {
            "own+*" => Some(EntryApplied {
                own: true,
                default: true,
            }),
            "own" => Some(EntryApplied {
                own: true,
                default: false,
            }),
            "*" => Some(EntryApplied {
                own: false,
                default: true,
            }),
            _ => None,
        }
    }
}

/// An instance's entry after merging its own with `"*"`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResolvedInstance {
    pub entry: InstanceEntry,
    pub applied: EntryApplied,
}

impl ResolvedInstance {
    pub fn draining(&self) -> bool {
        self.entry.drain == Some(true)
    }
}

/// What an `abort` entry's id names.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AbortKind {
    /// The `x-brownout-conversation` header's value.
    #[default]
    Conversation,
    /// The trace id of the W3C `traceparent` header (32 lowercase hex digits).
    Trace,
    /// A kind from a newer publisher: kept, matches nothing here.
    Unknown(String),
}

impl AbortKind {
    pub fn as_str(&self) -> &str {
        match self {
            AbortKind::Conversation => "conversation",
            AbortKind::Trace => "trace",
            AbortKind::Unknown(s) => s,
        }
    }
}

impl Serialize for AbortKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for AbortKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Ok(match v.as_str() {
            Some("conversation") => AbortKind::Conversation,
            Some("trace") => AbortKind::Trace,
            Some(other) => AbortKind::Unknown(other.to_string()),
            None => AbortKind::Unknown(v.to_string()),
        })
    }
}

/// One loop kill (`abort`): calls carrying this id are refused 409 `agent_loop_detected` until
/// `until_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbortEntry {
    pub id: String,
    pub kind: AbortKind,
    /// Unix ms; the entry is ignored after it.
    pub until_ms: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// Why the control plane chose this tier.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Reason {
    /// Which input crossed its threshold: `slo_burn`, `kv_usage`, `gpu_util`, `vram`,
    /// `queue_depth`, `alertmanager`, `new_pattern`, `operator`, `lease_expired`, `recovered`.
    pub trigger: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slo: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burn_rate: Option<f64>,
    #[serde(default)]
    pub detail: String,
}

/// Limits the serving tier applies (tier-2 caps, agent guards).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens_cap: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_num_seqs: Option<u32>,
    /// Most agent requests one user may have in flight on one instance (the serving tier uses the
    /// lower of this and its own `--user-concurrency`, default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_concurrency: Option<u32>,
    /// Share of the calls to a `probe` feature that pass, in [0, 1] (absent:
    /// [`DEFAULT_PROBE_RATIO`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_ratio: Option<f64>,
}

/// Tier-3 load-shedding parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shed {
    /// Requests below this criticality get 429.
    pub admit_min_criticality: Criticality,
    /// Base of the Retry-After header, seconds.
    pub retry_after_s: u32,
    /// Retry-After is `retry_after_s × U[1, 1 + jitter_ratio]`.
    pub jitter_ratio: f64,
    /// When the control plane expects to leave T3 (unix ms).
    pub recovery_eta_ms: u64,
    /// Shed only the excess: requests below `admit_min_criticality` are still admitted up to
    /// this many per second on each instance (a token bucket that critical requests draw on
    /// too, without ever being refused, and that `default` traffic gets before `sheddable`);
    /// the rest get 429. Unset: everything below `admit_min_criticality` gets 429 (the first
    /// release's T3, and what a subscriber that does not know the field does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admit_rps: Option<f64>,
}

/// A degradation command as published on Redis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Command {
    pub cluster: String,
    /// Leader epoch (the fencing token of the lease that published it).
    pub epoch: u64,
    /// Monotonic within a cluster; bumped atomically by the publisher.
    pub version: u64,
    pub tier: Tier,
    pub issued_at_ms: u64,
    /// After this the serving tier steps down one tier per lease period unless refreshed.
    pub expires_at_ms: u64,
    pub reason: Reason,
    /// Feature name → state. Features not listed keep their default (enabled).
    #[serde(default)]
    pub features: BTreeMap<String, FeatureState>,
    /// Traffic class → route name (`primary` or `fallback`).
    #[serde(default)]
    pub model_route: BTreeMap<String, String>,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub shed: Option<Shed>,
    /// Instance id (the serving tier's `--instance-id`) or `"*"` → stop-bleed actions.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub instances: BTreeMap<String, InstanceEntry>,
    /// Loop kills: conversations and traces refused with 409 (at most [`MAX_ABORT_ENTRIES`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub abort: Vec<AbortEntry>,
    /// Unknown top-level fields from a newer publisher, kept verbatim (see module docs).
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl Command {
    /// A T0 command that turns everything back on.
    pub fn normal(cluster: &str, epoch: u64, version: u64, now_ms: u64, lease_ms: u64) -> Command {
        Command {
            cluster: cluster.to_string(),
            epoch,
            version,
            tier: Tier::T0,
            issued_at_ms: now_ms,
            expires_at_ms: now_ms.saturating_add(lease_ms),
            reason: Reason {
                trigger: "recovered".into(),
                detail: "all inputs below exit thresholds".into(),
                ..Reason::default()
            },
            features: BTreeMap::new(),
            model_route: BTreeMap::new(),
            limits: Limits::default(),
            shed: None,
            instances: BTreeMap::new(),
            abort: Vec::new(),
            extra: BTreeMap::new(),
        }
    }

    /// `(epoch, version)`: the order in which commands supersede each other.
    pub fn order_key(&self) -> (u64, u64) {
        (self.epoch, self.version)
    }

    /// True once `now_ms` is past `expires_at_ms`.
    pub fn is_expired(&self, now_ms: u64) -> bool {
        now_ms > self.expires_at_ms
    }

    /// The state of `feature` under this command (unlisted features are enabled).
    pub fn feature_state(&self, feature: &str) -> FeatureState {
        self.features.get(feature).cloned().unwrap_or_default()
    }

    /// The share of calls a `probe` feature lets through (`limits.probe_ratio` clamped to [0, 1],
    /// else [`DEFAULT_PROBE_RATIO`]).
    pub fn probe_ratio(&self) -> f64 {
        match self.limits.probe_ratio {
            Some(r) if r.is_finite() => r.clamp(0.0, 1.0),
            _ => DEFAULT_PROBE_RATIO,
        }
    }

    /// The `instances` entry for `instance_id`: its own entry with the fields it leaves out taken
    /// from `"*"`; `None` when neither exists.
    pub fn instance_entry(&self, instance_id: &str) -> Option<ResolvedInstance> {
        let own = if instance_id == ALL_INSTANCES {
            None
        } else {
            self.instances.get(instance_id)
        };
        let all = self.instances.get(ALL_INSTANCES);
        if own.is_none() && all.is_none() {
            return None;
        }
        let pick =
            |f: &dyn Fn(&InstanceEntry) -> bool| own.filter(|e| f(e)).or(all.filter(|e| f(e)));
        let entry = InstanceEntry {
            max_num_seqs: own
                .and_then(|e| e.max_num_seqs)
                .or(all.and_then(|e| e.max_num_seqs)),
            drain: own.and_then(|e| e.drain).or(all.and_then(|e| e.drain)),
            admit_rps: own
                .and_then(|e| e.admit_rps)
                .or(all.and_then(|e| e.admit_rps))
                .filter(|r| r.is_finite() && *r >= 0.0),
            reason: pick(&|e| !e.reason.is_empty())
                .map(|e| e.reason.clone())
                .unwrap_or_default(),
        };
        Some(ResolvedInstance {
            entry,
            applied: EntryApplied {
                own: own.is_some(),
                default: all.is_some(),
            },
        })
    }

    /// `max_num_seqs` on `instance_id`: its instance entry's, else `limits.max_num_seqs`.
    pub fn max_num_seqs_for(&self, instance_id: &str) -> Option<u32> {
        self.instance_entry(instance_id)
            .and_then(|r| r.entry.max_num_seqs)
            .or(self.limits.max_num_seqs)
    }

    /// The route for a traffic class (`default` when absent → `primary`).
    pub fn route_for(&self, class: &str) -> &str {
        self.model_route
            .get(class)
            .map(String::as_str)
            .unwrap_or("primary")
    }

    /// Serialises to the canonical JSON bytes that get signed.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self)
            .expect("a Command always serialises (string keys, finite floats)")
    }
}

/// One feature as shown to front ends (`GET /v1/features`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeatureStatus {
    pub name: String,
    pub state: FeatureState,
    pub criticality: Criticality,
    /// The tier in force when this state was set.
    pub tier: Tier,
    /// Human text for the grey-out tooltip.
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../fixtures/command_t2.json");

    #[test]
    fn architecture_example_parses_with_contract_field_names() {
        let c: Command = serde_json::from_str(EXAMPLE).unwrap();
        assert_eq!(c.cluster, "prod");
        assert_eq!(c.tier, Tier::T2);
        assert_eq!(c.order_key(), (3, 1042));
        assert_eq!(c.feature_state("pdf_analysis"), FeatureState::Disabled);
        assert_eq!(c.feature_state("not_listed"), FeatureState::Enabled);
        assert_eq!(c.route_for("default"), "fallback");
        assert_eq!(c.limits.max_tokens_cap, Some(256));
        assert_eq!(c.reason.burn_rate, Some(16.2));
        assert!(c.shed.is_none());
        assert!(c.extra.is_empty());
    }

    #[test]
    fn unknown_top_level_fields_are_kept_and_round_trip() {
        let mut v: serde_json::Value = serde_json::from_str(EXAMPLE).unwrap();
        v["future_field"] = serde_json::json!({"x": [1, 2]});
        v["reason"]["nested_unknown"] = serde_json::json!(true);
        let c: Command = serde_json::from_value(v).unwrap();
        assert_eq!(c.extra["future_field"], serde_json::json!({"x": [1, 2]}));
        let back: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(back["future_field"], serde_json::json!({"x": [1, 2]}));
        assert!(
            back["reason"].get("nested_unknown").is_none(),
            "nested unknowns are ignored"
        );
    }

    #[test]
    fn out_of_range_tier_is_an_error_not_a_panic() {
        let bad = EXAMPLE.replace("\"tier\": 2", "\"tier\": 7");
        let err = serde_json::from_str::<Command>(&bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("tier must be 0, 1, 2 or 3"), "{err}");
    }

    #[test]
    fn tiers_step_one_at_a_time() {
        assert_eq!(Tier::T3.step_down(), Tier::T2);
        assert_eq!(Tier::T1.step_down(), Tier::T0);
        assert_eq!(Tier::T0.step_down(), Tier::T0);
        assert_eq!(Tier::T2.step_up(), Tier::T3);
        assert_eq!(Tier::T3.step_up(), Tier::T3);
    }

    #[test]
    fn criticality_orders_sheddable_below_critical() {
        assert!(Criticality::Sheddable < Criticality::Default);
        assert!(Criticality::Default < Criticality::Critical);
        assert_eq!(Criticality::parse("P0"), Some(Criticality::Critical));
        assert_eq!(
            Criticality::parse(" Sheddable "),
            Some(Criticality::Sheddable)
        );
        assert_eq!(Criticality::parse("urgent"), None);
    }

    #[test]
    fn t3_shed_block_parses() {
        let json = EXAMPLE.replace(
            "\"shed\": null",
            r#""shed": {"admit_min_criticality": "critical", "retry_after_s": 20, "jitter_ratio": 0.5, "recovery_eta_ms": 1764460890000}"#,
        );
        let c: Command = serde_json::from_str(&json).unwrap();
        let shed = c.shed.unwrap();
        assert_eq!(shed.admit_min_criticality, Criticality::Critical);
        assert_eq!(shed.retry_after_s, 20);
    }

    const GUARDS: &str = include_str!("../fixtures/command_guards.json");

    #[test]
    fn guards_fixture_parses_and_its_signature_is_the_independent_one() {
        // The signature was computed independently with
        //   openssl dgst -sha256 -hmac 'brownout-test-key-0001' -r protocol/fixtures/command_guards.json
        let sig = include_str!("../fixtures/command_guards.sig");
        crate::signing::verify(b"brownout-test-key-0001", GUARDS.as_bytes(), sig).unwrap();
        let c: Command = serde_json::from_str(GUARDS).unwrap();
        assert!(c.extra.is_empty(), "{:?}", c.extra);
        assert_eq!(c.feature_state("tool:web_search"), FeatureState::Disabled);
        assert_eq!(c.feature_state("tool:code_exec"), FeatureState::Probe);
        assert_eq!(c.limits.user_concurrency, Some(2));
        assert_eq!(c.probe_ratio(), 0.25);
        assert_eq!(c.abort.len(), 2);
        assert_eq!(c.abort[0].kind, AbortKind::Conversation);
        assert_eq!(c.abort[1].kind, AbortKind::Trace);
        // The drained instance: its own entry, the ramp from "*".
        let r = c.instance_entry("gpu-3/engine-0").unwrap();
        assert!(r.draining());
        assert_eq!(r.entry.max_num_seqs, Some(128));
        assert_eq!(r.entry.admit_rps, Some(20.0));
        assert_eq!(r.entry.reason, "xid 79 on gpu-3");
        assert_eq!(r.applied.as_str(), Some("own+*"));
        assert_eq!(c.max_num_seqs_for("gpu-3/engine-0"), Some(128));
        // Any other instance: only "*".
        let o = c.instance_entry("gpu-4/engine-0").unwrap();
        assert!(!o.draining());
        assert_eq!(o.entry.admit_rps, Some(20.0));
        assert_eq!(o.applied.as_str(), Some("*"));
        assert_eq!(c.max_num_seqs_for("gpu-4/engine-0"), None);
        // Round trip keeps every new field.
        let back: Command = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn unset_new_fields_leave_the_json_as_before() {
        let c: Command = serde_json::from_str(EXAMPLE).unwrap();
        let v: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
        for k in ["instances", "abort"] {
            assert!(v.get(k).is_none(), "{k} written while unset");
        }
        for k in ["user_concurrency", "probe_ratio"] {
            assert!(
                v["limits"].get(k).is_none(),
                "limits.{k} written while unset"
            );
        }
        assert_eq!(c.instance_entry("anyone"), None);
        assert_eq!(c.probe_ratio(), DEFAULT_PROBE_RATIO);
    }

    #[test]
    fn unknown_feature_states_are_kept_and_behave_as_enabled() {
        let json = EXAMPLE.replace(
            r#""basic_qa": "enabled""#,
            r#""basic_qa": "half_open", "x": {"state": "probe", "ratio": 0.3}, "y": 7"#,
        );
        let c: Command = serde_json::from_str(&json).unwrap();
        let half = c.feature_state("basic_qa");
        assert_eq!(half, FeatureState::Unknown(serde_json::json!("half_open")));
        assert!(half.is_open());
        assert!(c.feature_state("x").is_open());
        assert!(c.feature_state("y").is_open());
        assert!(!c.feature_state("pdf_analysis").is_open());
        assert!(!FeatureState::Probe.is_open());
        let back: serde_json::Value = serde_json::from_str(&c.to_json()).unwrap();
        assert_eq!(back["features"]["basic_qa"], "half_open");
        assert_eq!(back["features"]["x"]["ratio"], 0.3);
        assert_eq!(back["features"]["y"], 7);
        // Unknown abort kinds are kept too (and match nothing in a serving tier).
        let a: AbortEntry =
            serde_json::from_str(r#"{"id": "u1", "kind": "user", "until_ms": 5}"#).unwrap();
        assert_eq!(a.kind, AbortKind::Unknown("user".into()));
        assert_eq!(serde_json::to_value(&a).unwrap()["kind"], "user");
    }

    /// `Command` and `FeatureState` exactly as the first release defined them: what a serving
    /// tier built before `instances`/`abort`/`probe` parses a new command into.
    mod first_release {
        use std::collections::BTreeMap;

        use serde::Deserialize;

        #[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
        #[serde(rename_all = "lowercase")]
        pub enum FeatureState {
            Enabled,
            Disabled,
        }

        #[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
        pub struct Limits {
            pub max_tokens_cap: Option<u32>,
            pub max_num_seqs: Option<u32>,
        }

        #[derive(Debug, Deserialize)]
        #[allow(dead_code)]
        pub struct Command {
            pub cluster: String,
            pub epoch: u64,
            pub version: u64,
            pub tier: super::Tier,
            pub issued_at_ms: u64,
            pub expires_at_ms: u64,
            pub reason: super::Reason,
            #[serde(default)]
            pub features: BTreeMap<String, FeatureState>,
            #[serde(default)]
            pub model_route: BTreeMap<String, String>,
            #[serde(default)]
            pub limits: Limits,
            #[serde(default)]
            pub shed: Option<super::Shed>,
            #[serde(flatten)]
            pub extra: BTreeMap<String, serde_json::Value>,
        }
    }

    #[test]
    fn a_first_release_subscriber_keeps_the_new_fields_in_extra() {
        // Without `probe` (what a control plane publishes while old subscribers remain).
        let json = GUARDS.replace(r#""probe""#, r#""disabled""#);
        let old: first_release::Command = serde_json::from_str(&json).unwrap();
        assert_eq!(old.version, 1044);
        assert!(old.extra.contains_key("instances"));
        assert!(old.extra.contains_key("abort"));
        assert_eq!(old.extra.len(), 2, "{:?}", old.extra.keys());
        assert_eq!(old.limits.max_num_seqs, None, "nested unknowns ignored");
        assert_eq!(
            old.features["tool:web_search"],
            first_release::FeatureState::Disabled
        );
        // With `probe`, the first release's strict enum refuses the whole command: the reason
        // this version parses feature states tolerantly, and why docs/PROTOCOL.md says to send
        // `probe` only once every subscriber acks this version's commands.
        let err = serde_json::from_str::<first_release::Command>(GUARDS).unwrap_err();
        assert!(err.to_string().contains("probe"), "{err}");
    }

    #[test]
    fn instance_entries_merge_own_over_default_field_by_field() {
        let mut c = Command::normal("c", 1, 1, 0, 1);
        c.limits.max_num_seqs = Some(64);
        c.instances.insert(
            "*".into(),
            InstanceEntry {
                drain: Some(true),
                admit_rps: Some(5.0),
                reason: "cluster".into(),
                ..InstanceEntry::default()
            },
        );
        c.instances.insert(
            "a".into(),
            InstanceEntry {
                drain: Some(false),
                admit_rps: Some(-1.0),
                ..InstanceEntry::default()
            },
        );
        let a = c.instance_entry("a").unwrap();
        assert!(!a.draining(), "own drain=false overrides *");
        assert_eq!(a.entry.admit_rps, None, "a negative rate is ignored");
        assert_eq!(a.entry.reason, "cluster", "reason falls back to *");
        assert_eq!(
            c.max_num_seqs_for("a"),
            Some(64),
            "limits when no entry sets it"
        );
        assert!(c.instance_entry("b").unwrap().draining());
        assert_eq!(
            c.instance_entry("*").unwrap().applied.as_str(),
            Some("*"),
            "the id * is never its own entry"
        );
    }

    #[test]
    fn expiry_is_strictly_after_expires_at() {
        let c = Command::normal("c", 1, 1, 1000, 500);
        assert!(!c.is_expired(1500));
        assert!(c.is_expired(1501));
    }
}
