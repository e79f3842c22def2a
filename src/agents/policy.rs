//! The `agents:` section of the degradation policy (docs/AGENTS.md, docs/DEGRADATION.md): loop
//! detection and tool circuit breakers. Every field has a default, so a policy without the
//! section (or with only some fields) parses; unknown fields are refused like everywhere else in
//! the policy, with the line and column.

use std::collections::BTreeMap;

use serde::Deserialize;

/// The section as written (`agents:` in the policy YAML).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAgents {
    #[serde(default)]
    loops: RawLoops,
    #[serde(default)]
    breakers: RawBreakers,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLoops {
    enabled: Option<bool>,
    window: Option<usize>,
    repeats: Option<u32>,
    abort_secs: Option<u64>,
    trace_ttl_secs: Option<u64>,
    max_traces: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBreakers {
    enabled: Option<bool>,
    window_secs: Option<u64>,
    failure_ratio: Option<f64>,
    min_calls: Option<u32>,
    cool_down_secs: Option<u64>,
    close_after_successes: Option<u32>,
    consecutive_timeouts: Option<u32>,
    probe_ratio: Option<f64>,
    max_tools: Option<usize>,
    default_class: Option<String>,
    classes: Option<BTreeMap<String, RawClass>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClass {
    timeout_ms: u64,
    #[serde(default)]
    tools: Vec<String>,
}

/// Loop detection (docs/AGENTS.md "Loop kill").
#[derive(Debug, Clone, PartialEq)]
pub struct LoopPolicy {
    pub enabled: bool,
    /// How many of the latest tool calls make one fingerprint (5).
    pub window: usize,
    /// A fingerprint seen this many times in one trace or conversation is a loop (3).
    pub repeats: u32,
    /// How long the `abort` entry of a loop lasts (10 min).
    pub abort_ms: u64,
    /// A trace or conversation without a tool call for this long is forgotten (15 min).
    pub trace_ttl_ms: u64,
    /// At most this many traces and conversations are followed; the least recently seen goes
    /// first (counted).
    pub max_traces: usize,
}

/// A class of tools sharing a timeout (seed example: `basic` 2 s, `high_risk` 5 s).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolClass {
    pub name: String,
    /// A call that takes longer counts as a failure.
    pub timeout_ms: u64,
    /// Tools in this class (by `gen_ai.tool.name`); a span may also name its class.
    pub tools: Vec<String>,
}

/// Tool circuit breakers (docs/AGENTS.md "Tool breakers").
#[derive(Debug, Clone, PartialEq)]
pub struct BreakerPolicy {
    pub enabled: bool,
    /// The sliding window the failure ratio is measured over (30 s).
    pub window_ms: u64,
    /// Open at or above this share of failed calls (0.5).
    pub failure_ratio: f64,
    /// …with at least this many calls in the window (10).
    pub min_calls: u32,
    /// Open → half-open after this long (30 s).
    pub cool_down_ms: u64,
    /// Half-open → closed after this many successful probe calls in a row (5).
    pub close_after_successes: u32,
    /// Closed → open after this many timed-out calls in a row, whatever the window says (3;
    /// 0 turns it off).
    pub consecutive_timeouts: u32,
    /// `limits.probe_ratio` sent while a breaker is half-open (`None`: the serving tier's
    /// default, 0.1).
    pub probe_ratio: Option<f64>,
    /// At most this many tools are tracked (256).
    pub max_tools: usize,
    pub classes: Vec<ToolClass>,
    /// The class of a tool no class lists (`basic`).
    pub default_class: String,
}

/// The validated section.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentsPolicy {
    pub loops: LoopPolicy,
    pub breakers: BreakerPolicy,
}

impl Default for AgentsPolicy {
    fn default() -> Self {
        AgentsPolicy::validate(RawAgents::default()).expect("the defaults are valid")
    }
}

/// A field (relative to `agents.`) and why it was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub reason: String,
}

fn bad(field: &str, reason: impl Into<String>) -> FieldError {
    FieldError {
        field: field.to_string(),
        reason: reason.into(),
    }
}

fn in_range<T: PartialOrd + std::fmt::Display + Copy>(
    field: &str,
    v: T,
    lo: T,
    hi: T,
) -> Result<T, FieldError> {
    if v >= lo && v <= hi {
        Ok(v)
    } else {
        Err(bad(field, format!("{v} must be between {lo} and {hi}")))
    }
}

fn class_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

impl AgentsPolicy {
    /// Validates the raw section, defaulting what it leaves out.
    ///
    /// # Errors
    /// A [`FieldError`] naming the field (relative to `agents.`) and the rule it breaks.
    pub fn validate(raw: RawAgents) -> Result<AgentsPolicy, FieldError> {
        let l = raw.loops;
        let loops = LoopPolicy {
            enabled: l.enabled.unwrap_or(true),
            window: in_range("loops.window", l.window.unwrap_or(5), 1, 32)?,
            repeats: in_range("loops.repeats", l.repeats.unwrap_or(3), 2, 1000)?,
            abort_ms: in_range("loops.abort_secs", l.abort_secs.unwrap_or(600), 1, 86_400)? * 1000,
            trace_ttl_ms: in_range(
                "loops.trace_ttl_secs",
                l.trace_ttl_secs.unwrap_or(900),
                1,
                86_400,
            )? * 1000,
            max_traces: in_range(
                "loops.max_traces",
                l.max_traces.unwrap_or(50_000),
                1,
                10_000_000,
            )?,
        };
        let b = raw.breakers;
        let ratio = b.failure_ratio.unwrap_or(0.5);
        if !(ratio > 0.0 && ratio <= 1.0) {
            return Err(bad(
                "breakers.failure_ratio",
                format!("{ratio} must be in (0, 1]"),
            ));
        }
        let probe_ratio = match b.probe_ratio {
            None => None,
            Some(p) if (0.0..=1.0).contains(&p) => Some(p),
            Some(p) => {
                return Err(bad(
                    "breakers.probe_ratio",
                    format!("{p} must be in [0, 1]"),
                ));
            }
        };
        let mut classes: Vec<ToolClass> = Vec::new();
        let raw_classes = b.classes.unwrap_or_else(|| {
            BTreeMap::from([
                (
                    "basic".to_string(),
                    RawClass {
                        timeout_ms: 2000,
                        tools: Vec::new(),
                    },
                ),
                (
                    "high_risk".to_string(),
                    RawClass {
                        timeout_ms: 5000,
                        tools: Vec::new(),
                    },
                ),
            ])
        });
        if raw_classes.len() > 64 {
            return Err(bad("breakers.classes", "at most 64 classes"));
        }
        let mut seen_tools: BTreeMap<String, String> = BTreeMap::new();
        for (name, c) in raw_classes {
            let field = format!("breakers.classes.{name}");
            if !class_name_ok(&name) {
                return Err(bad(
                    &field,
                    "a class name is 1-64 characters of A-Z a-z 0-9 _ - .",
                ));
            }
            in_range(&format!("{field}.timeout_ms"), c.timeout_ms, 1, 3_600_000)?;
            if c.tools.len() > 1024 {
                return Err(bad(&format!("{field}.tools"), "at most 1024 tools"));
            }
            for t in &c.tools {
                if t.is_empty() || t.chars().count() > super::semconv::MAX_TOOL_NAME_CHARS {
                    return Err(bad(
                        &format!("{field}.tools"),
                        format!(
                            "{t:?}: a tool name is 1-{} characters",
                            super::semconv::MAX_TOOL_NAME_CHARS
                        ),
                    ));
                }
                if let Some(other) = seen_tools.insert(t.clone(), name.clone()) {
                    return Err(bad(
                        &format!("{field}.tools"),
                        format!("{t:?} is already in class {other}"),
                    ));
                }
            }
            classes.push(ToolClass {
                name,
                timeout_ms: c.timeout_ms,
                tools: c.tools,
            });
        }
        let default_class = b.default_class.unwrap_or_else(|| "basic".into());
        if !classes.iter().any(|c| c.name == default_class) {
            let names: Vec<&str> = classes.iter().map(|c| c.name.as_str()).collect();
            return Err(bad(
                "breakers.default_class",
                format!(
                    "{default_class:?} is not one of the classes ({})",
                    names.join(", ")
                ),
            ));
        }
        let breakers = BreakerPolicy {
            enabled: b.enabled.unwrap_or(true),
            window_ms: in_range("breakers.window_secs", b.window_secs.unwrap_or(30), 1, 600)?
                * 1000,
            failure_ratio: ratio,
            min_calls: in_range(
                "breakers.min_calls",
                b.min_calls.unwrap_or(10),
                1,
                1_000_000,
            )?,
            cool_down_ms: in_range(
                "breakers.cool_down_secs",
                b.cool_down_secs.unwrap_or(30),
                1,
                86_400,
            )? * 1000,
            close_after_successes: in_range(
                "breakers.close_after_successes",
                b.close_after_successes.unwrap_or(5),
                1,
                10_000,
            )?,
            consecutive_timeouts: in_range(
                "breakers.consecutive_timeouts",
                b.consecutive_timeouts.unwrap_or(3),
                0,
                10_000,
            )?,
            probe_ratio,
            max_tools: in_range("breakers.max_tools", b.max_tools.unwrap_or(256), 1, 4096)?,
            classes,
            default_class,
        };
        Ok(AgentsPolicy { loops, breakers })
    }

    /// Parses the section alone (tests, tools).
    ///
    /// # Errors
    /// A YAML or validation error, as text naming the field.
    pub fn from_yaml(text: &str) -> Result<AgentsPolicy, String> {
        let raw: RawAgents = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        AgentsPolicy::validate(raw).map_err(|e| format!("agents.{}: {}", e.field, e.reason))
    }
}

impl BreakerPolicy {
    /// The class of `tool`: the one that lists it, else the span's `declared` class when it
    /// exists, else the default.
    pub fn class_of(&self, tool: &str, declared: Option<&str>) -> &ToolClass {
        self.classes
            .iter()
            .find(|c| c.tools.iter().any(|t| t == tool))
            .or_else(|| declared.and_then(|d| self.classes.iter().find(|c| c.name == d)))
            .or_else(|| self.classes.iter().find(|c| c.name == self.default_class))
            .unwrap_or(&self.classes[0])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_section_takes_the_defaults() {
        let p = AgentsPolicy::default();
        assert_eq!((p.loops.window, p.loops.repeats), (5, 3));
        assert_eq!(p.breakers.window_ms, 30_000);
        assert_eq!(p.breakers.failure_ratio, 0.5);
        assert_eq!(p.breakers.class_of("x", None).timeout_ms, 2000);
        assert_eq!(p.breakers.class_of("x", Some("high_risk")).timeout_ms, 5000);
        assert_eq!(p.breakers.class_of("x", Some("martian")).name, "basic");
    }

    #[test]
    fn partial_sections_default_the_rest_and_bad_fields_are_named() {
        let p = AgentsPolicy::from_yaml("loops: { repeats: 4 }\nbreakers: { min_calls: 3, classes: { basic: { timeout_ms: 2000 }, high_risk: { timeout_ms: 5000, tools: [code_exec] } } }").unwrap();
        assert_eq!((p.loops.repeats, p.loops.window), (4, 5));
        assert_eq!(p.breakers.min_calls, 3);
        assert_eq!(p.breakers.class_of("code_exec", None).name, "high_risk");
        assert_eq!(
            p.breakers.class_of("code_exec", Some("basic")).name,
            "high_risk",
            "the policy's list wins over the span"
        );
        for (yaml, want) in [
            ("loops: { window: 0 }", "agents.loops.window"),
            ("loops: { repeats: 1 }", "agents.loops.repeats"),
            (
                "breakers: { failure_ratio: 1.5 }",
                "agents.breakers.failure_ratio",
            ),
            (
                "breakers: { probe_ratio: -1 }",
                "agents.breakers.probe_ratio",
            ),
            (
                "breakers: { default_class: gold }",
                "agents.breakers.default_class",
            ),
            (
                "breakers: { classes: { a: { timeout_ms: 1, tools: [x] }, b: { timeout_ms: 1, tools: [x] } }, default_class: a }",
                "already in class a",
            ),
            ("loops: { colour: red }", "unknown field `colour`"),
        ] {
            let e = AgentsPolicy::from_yaml(yaml).unwrap_err();
            assert!(e.contains(want), "{yaml}: {e}");
        }
    }
}
