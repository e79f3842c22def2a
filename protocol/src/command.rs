//! The degradation command (docs/ARCHITECTURE.md §3, docs/PROTOCOL.md).
//!
//! Field names are the contract: fields may be added, never renamed.
//!
//! **Unknown fields rule.** A command is verified over its exact JSON bytes *before* it is parsed,
//! so a newer control plane may add fields without breaking older serving tiers. Unknown top-level
//! fields are *kept* in [`Command::extra`] (and written back out on re-serialisation) and otherwise
//! ignored; unknown fields inside nested objects (`reason`, `limits`, `shed`) are ignored. Parsing
//! never panics: a malformed command is an error value.

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeatureState {
    #[default]
    Enabled,
    Disabled,
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

/// Tier-2 limits the serving tier applies.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens_cap: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_num_seqs: Option<u32>,
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
        self.features.get(feature).copied().unwrap_or_default()
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

    #[test]
    fn expiry_is_strictly_after_expires_at() {
        let c = Command::normal("c", 1, 1, 1000, 500);
        assert!(!c.is_expired(1500));
        assert!(c.is_expired(1501));
    }
}
