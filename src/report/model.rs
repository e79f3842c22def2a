//! The report's input ([`WeekData`]), the playbook, and the [`Report`] every output format
//! renders ([`super::compose::build`] turns the one into the other).

use serde::{Deserialize, Serialize};

/// Everything a weekly report is built from. The lead's store reader fills it; `--data FILE`
/// reads it as JSON; [`super::synth_week`] derives it from `patterns synth` data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeekData {
    /// ISO week, e.g. `2026-W48`.
    pub week: String,
    pub cluster: String,
    /// Monday 00:00 UTC of the week (unix ms).
    pub start_ms: u64,
    #[serde(default)]
    pub slos: Vec<SloWeek>,
    #[serde(default)]
    pub episodes: Vec<Episode>,
    #[serde(default)]
    pub patterns: Vec<PatternWeek>,
    /// The report's "now" for a week still running (unix ms): days after it are not reached
    /// yet. Absent for a finished week.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub as_of_ms: Option<u64>,
    /// Requests brownout refused on purpose this week, by outcome (docs/SLO.md "Deliberate
    /// refusals"): its degradation cost, never ranked as failures.
    #[serde(default)]
    pub refusals: Vec<RefusalCount>,
    /// Per-instance stop-bleed actions of the week (halved `max_num_seqs`, drains, operator
    /// actions, the admission ramp, recovery storms), from the stored decisions.
    #[serde(default)]
    pub instance_actions: Vec<InstanceIncident>,
    /// Configured SLOs that had no requests this week or the week before: listed (so the
    /// report names every SLO the overview shows), with no figures.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slos_without_data: Vec<IdleSlo>,
}

/// A configured SLO without a single request in the two weeks the report reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdleSlo {
    pub name: String,
    /// e.g. 0.995
    pub objective: f64,
}

/// One per-instance action over its life: from the decision that started it to the one that
/// ended it (docs/DEGRADATION.md "Per-instance actions").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceIncident {
    /// The instance id (`"*"`: every instance, for the ramp and retry waves).
    pub instance: String,
    /// `halve`, `drain`, `operator`, `ramp` or `recovery_storm`.
    pub action: String,
    /// What caused it (`kv_usage`, `operator`, `admission_ramp`, `recovery_storm`).
    pub trigger: String,
    /// Why, as the decision that started it said.
    #[serde(default)]
    pub detail: String,
    pub start_ms: u64,
    pub end_ms: u64,
    /// Still in force at the report's end.
    #[serde(default)]
    pub open: bool,
    /// The ramp's admitted shares in order (`0.7`, `0.8`, …); empty for other actions.
    #[serde(default)]
    pub steps: Vec<f64>,
    /// `applied`, `pending`, `unknown_instance`, `-` (nothing to apply: a retry wave), or
    /// `not recorded` (decisions stored before acks were kept).
    pub ack: String,
    /// Decision → applied, when the ack said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_lag_ms: Option<u64>,
}

/// Deliberate refusals of one outcome (`feature_disabled`, `shed`, …).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefusalCount {
    pub outcome: String,
    pub count: u64,
    /// The features refused, most refused first (at most 8).
    #[serde(default)]
    pub features: Vec<String>,
}

/// One tier change inside an episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierStep {
    pub at_ms: u64,
    pub tier: u8,
    pub trigger: String,
}

/// One SLO over the week.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SloWeek {
    pub name: String,
    /// e.g. 0.995
    pub objective: f64,
    /// Share of the period's error budget spent this week (1.0 = all of it).
    pub budget_spent_ratio: f64,
    pub last_week_budget_spent_ratio: f64,
    /// Budget remaining at the end of each day of the week (1.0 = untouched), one value per
    /// day reached so far (7 for a finished week).
    #[serde(default)]
    pub remaining_by_day: Vec<f64>,
    /// This week's burn rate (error ratio / (1 − objective)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burn_rate: Option<f64>,
    /// Length of the SLO's period in days.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_days: Option<f64>,
    /// How many days of data the week's figures come from, when that is less than the week
    /// (a fresh install, the demo): the budget figures are projected from them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub history_days: Option<f64>,
    /// When the period's budget runs out at this week's burn rate (unix ms); absent when it
    /// lasts the period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs_out_ms: Option<u64>,
    /// Requests of this SLO refused on purpose this week: not in its SLI.
    #[serde(default)]
    pub refused: u64,
    /// The budget as users felt it: `budget_spent_ratio` with the refusals on purpose counted
    /// as bad events. The difference is what the degradation spent (docs/REPORT.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_felt_budget_spent_ratio: Option<f64>,
    /// Failures the degradation prevented, estimated from the refused demand: per episode, the
    /// SLO's requests refused on purpose × the SLO's real error ratio in the 10 minutes before
    /// the episode began (docs/REPORT.md "What shedding cost and bought").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prevented_failures: Option<f64>,
    /// The same as a share of the period's budget (what the degradation bought).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prevented_budget_ratio: Option<f64>,
}

/// One degradation episode (time in a tier above T0).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Episode {
    pub start_ms: u64,
    pub end_ms: u64,
    /// Highest tier reached (1–3).
    pub max_tier: u8,
    pub trigger: String,
    #[serde(default)]
    pub detail: String,
    /// Every tier change of the episode, in order (the first is the raise from T0).
    #[serde(default)]
    pub steps: Vec<TierStep>,
    /// What it cost: the requests refused on purpose while it lasted.
    #[serde(default)]
    pub refused: Vec<RefusalCount>,
}

/// One failure pattern over the week.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatternWeek {
    pub id: String,
    pub label: String,
    pub category: String,
    pub count: u64,
    pub last_week_count: u64,
    /// Share of the week's bad events it explains.
    pub budget_impact: f64,
    pub affected_users: u64,
    #[serde(default)]
    pub features: Vec<String>,
    #[serde(default)]
    pub example_trace_id: String,
    /// Failures per day (7 values).
    #[serde(default)]
    pub daily: Vec<u64>,
    /// First seen this week.
    #[serde(default)]
    pub new: bool,
}

impl PatternWeek {
    /// From a pattern computed by the engine over the week (`counts` at day steps are summed
    /// per day).
    pub fn from_pattern(p: &crate::patterns::Pattern, week_start_ms: u64) -> PatternWeek {
        let mut daily = vec![0u64; 7];
        for c in &p.counts {
            let d = (c.start_ms.saturating_sub(week_start_ms) / 86_400_000) as usize;
            if d < 7 {
                daily[d] += c.count;
            }
        }
        PatternWeek {
            id: p.id.0.clone(),
            label: p.label.clone(),
            category: p.category.as_str().to_string(),
            count: p.count,
            last_week_count: p.trend.previous_count,
            budget_impact: p.budget_impact,
            affected_users: p.affected_users,
            features: p.features.clone(),
            example_trace_id: p.example_trace_ids.first().cloned().unwrap_or_default(),
            daily,
            new: p.is_new,
        }
    }
}

/// One playbook entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlaybookItem {
    pub id: String,
    #[serde(default)]
    pub categories: Vec<String>,
    #[serde(default)]
    pub keywords: Vec<String>,
    pub title: String,
    pub change: String,
    pub verify: String,
    #[serde(default)]
    pub signal: String,
    #[serde(default)]
    pub source: String,
    pub win_back_ratio: f64,
}

/// The playbook file (TOML).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Playbook {
    #[serde(rename = "item")]
    pub items: Vec<PlaybookItem>,
}

/// Why a playbook was refused.
#[derive(Debug, thiserror::Error)]
pub enum PlaybookError {
    #[error("playbook {file}: {source}")]
    Toml {
        file: String,
        source: toml::de::Error,
    },
    #[error("playbook {file}: item {id:?}: win_back_ratio {value} is not in 0..=1")]
    Ratio {
        file: String,
        id: String,
        value: f64,
    },
}

impl Playbook {
    /// The bundled playbook (`playbooks/default.toml`).
    pub fn bundled() -> Playbook {
        Playbook::parse(
            "playbooks/default.toml",
            include_str!("../../playbooks/default.toml"),
        )
        .expect("invariant: the bundled playbook parses")
    }

    /// Parses and validates a playbook.
    ///
    /// # Errors
    /// TOML errors (with line and column) or a ratio outside 0..=1, naming the file.
    pub fn parse(file: &str, text: &str) -> Result<Playbook, PlaybookError> {
        let p: Playbook = toml::from_str(text).map_err(|source| PlaybookError::Toml {
            file: file.into(),
            source,
        })?;
        for it in &p.items {
            if !(0.0..=1.0).contains(&it.win_back_ratio) {
                return Err(PlaybookError::Ratio {
                    file: file.into(),
                    id: it.id.clone(),
                    value: it.win_back_ratio,
                });
            }
        }
        Ok(p)
    }

    /// `user` items first, then these.
    pub fn extended_by(mut self, user: Playbook) -> Playbook {
        let mut items = user.items;
        items.append(&mut self.items);
        self.items = items;
        self
    }

    /// The first item matching a pattern.
    pub fn item_for(&self, category: &str, label: &str) -> Option<&PlaybookItem> {
        let label = label.to_lowercase();
        self.items.iter().find(|it| {
            (it.categories.is_empty() || it.categories.iter().any(|c| c == category))
                && (it.keywords.is_empty()
                    || it
                        .keywords
                        .iter()
                        .any(|k| label.contains(&k.to_lowercase())))
        })
    }
}

/// A roadmap item: a top pattern and what to change about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoadmapItem {
    pub rank: usize,
    pub pattern_id: String,
    pub pattern_label: String,
    pub category: String,
    pub playbook_id: String,
    pub title: String,
    pub change: String,
    pub verify: String,
    pub signal: String,
    pub source: String,
    /// Share of the week's bad events the item should win back.
    pub expected_budget_win_back: f64,
    /// The same, as shown (`27.4%`).
    pub win_back_pct: String,
}

/// A top pattern, as shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopPattern {
    pub rank: usize,
    #[serde(flatten)]
    pub pattern: PatternWeek,
    /// `+35%`, `-10%`, `new`.
    pub trend: String,
    /// Budget impact as shown (`34.2%`).
    pub impact_pct: String,
}

/// A degradation episode, as shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeRow {
    pub start: String,
    pub end: String,
    pub duration: String,
    pub max_tier: u8,
    pub trigger: String,
    pub detail: String,
    /// The tiers it went through with their time (`T2 1 min (operator) → T1 2 min (queue_depth)`).
    pub tiers: String,
    /// What it cost (`disabled 498 calls of image_generation, pdf_analysis; shed 12 calls`), or
    /// empty.
    pub cost: String,
    /// Left offset and width on the week's timeline, in percent.
    pub left_pct: f64,
    pub width_pct: f64,
}

/// A per-instance action, as shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceActionRow {
    pub start: String,
    pub end: String,
    pub duration: String,
    pub instance: String,
    pub action: String,
    /// The action in words (`max_num_seqs halved`, `drained`, `admission ramp 70% → 80%`).
    pub what: String,
    pub trigger: String,
    pub detail: String,
    /// `applied (lag 120 ms)`, `pending`, …
    pub ack: String,
}

/// The note on an SLO row without data.
pub const NO_REQUESTS: &str = "no requests this week or the week before";

/// An SLO row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SloRow {
    pub name: String,
    pub objective_pct: String,
    pub spent_pct: String,
    pub last_week_pct: String,
    pub delta: String,
    /// `12.3×`, or `—` when unknown.
    pub burn_rate: String,
    /// When the budget runs out at this week's rate (`Tue 2026-12-08`), or `not within the
    /// period`.
    pub runs_out: String,
    /// `projected from 5 min of data`, or empty for a full week.
    pub history_note: String,
    pub refused: u64,
    /// Budget spent as users felt it (refusals counted as bad), or `—`.
    pub felt_pct: String,
    /// What the degradation spent: felt − real, in points, or `—`.
    pub shedding_cost: String,
    /// Failures prevented (estimated) and their share of the budget, or `—`.
    pub prevented: String,
}

/// Everything every format renders.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub week: String,
    pub cluster: String,
    pub week_start: String,
    pub week_end: String,
    pub empty: bool,
    pub summary: String,
    pub slos: Vec<SloRow>,
    pub episodes: Vec<EpisodeRow>,
    pub top: Vec<TopPattern>,
    pub new_patterns: Vec<PatternWeek>,
    pub roadmap: Vec<RoadmapItem>,
    /// Requests refused on purpose this week, by outcome.
    pub refusals: Vec<RefusalCount>,
    /// The same as a sentence, or empty.
    pub refusals_text: String,
    /// Per-instance stop-bleed actions, oldest first.
    pub instance_actions: Vec<InstanceActionRow>,
    /// Inline SVG (built from numbers and escaped text only).
    pub burn_chart_svg: String,
    pub trend_chart_svg: String,
}
