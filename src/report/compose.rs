//! The pure step from a week's data and the playbook to the [`Report`]: the summary, the SLO
//! rows, the episodes, the ranked patterns, the roadmap and the two charts ([`super::svg`]).

use super::model::*;

fn fmt_ts(ms: u64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms as i64)
        .map_or_else(String::new, |t| {
            t.format("%a %Y-%m-%d %H:%M UTC").to_string()
        })
}

fn fmt_duration(ms: u64) -> String {
    let m = ms / 60_000;
    if m >= 60 {
        format!("{} h {:02} min", m / 60, m % 60)
    } else {
        format!("{m} min")
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn fmt_day(ms: u64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms as i64)
        .map_or_else(String::new, |t| t.format("%a %Y-%m-%d").to_string())
}

/// A span of data, in words: `5 min`, `3 h 10 min`, `2.5 days`.
fn fmt_history(days: f64) -> String {
    let ms = (days * 86_400_000.0).round().max(0.0) as u64;
    if days >= 1.0 {
        format!("{days:.1} days")
    } else {
        fmt_duration(ms.max(60_000))
    }
}

/// What the refusals of an outcome did, as a verb.
fn refusal_verb(outcome: &str) -> &'static str {
    match outcome {
        "feature_disabled" => "disabled",
        "tool_disabled" => "disabled tools in",
        "shed" => "shed",
        "drained" => "drained",
        "user_cap" => "capped per user",
        "loop_abort" => "aborted agent loops in",
        "throttled" => "throttled",
        _ => "refused",
    }
}

/// `disabled 498 calls of image_generation, pdf_analysis; shed 12 calls of trip_planner`.
pub fn refusals_sentence(r: &[RefusalCount]) -> String {
    r.iter()
        .filter(|c| c.count > 0)
        .map(|c| {
            let calls = if c.count == 1 { "call" } else { "calls" };
            if c.features.is_empty() {
                format!("{} {} {calls}", refusal_verb(&c.outcome), c.count)
            } else {
                format!(
                    "{} {} {calls} of {}",
                    refusal_verb(&c.outcome),
                    c.count,
                    c.features.join(", ")
                )
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A span of a per-instance action: seconds count (a drain can be short).
fn fmt_span(ms: u64) -> String {
    if ms < 60_000 {
        format!("{} s", ms / 1000)
    } else {
        fmt_duration(ms)
    }
}

/// What a per-instance action did, in words.
fn action_words(i: &InstanceIncident) -> String {
    match i.action.as_str() {
        "halve" => "max_num_seqs halved".into(),
        "drain" => "drained (only critical admitted)".into(),
        "operator" => "operator action".into(),
        "ramp" => {
            let steps: Vec<String> = i
                .steps
                .iter()
                .map(|s| format!("{:.0}%", s * 100.0))
                .collect();
            if steps.is_empty() {
                "admission ramp".into()
            } else {
                format!("admission ramp {}", steps.join(" \u{2192} "))
            }
        }
        "recovery_storm" => "recovery storm (retry waves)".into(),
        other => other.to_string(),
    }
}

fn ack_words(i: &InstanceIncident) -> String {
    match (i.ack.as_str(), i.ack_lag_ms) {
        ("applied", Some(l)) => format!("applied (lag {l} ms)"),
        (a, _) => a.to_string(),
    }
}

/// `T2 1 min (operator) → T1 2 min (queue_depth)`: each step with the time until the next (or
/// the episode's end).
fn tiers_text(e: &Episode) -> String {
    if e.steps.is_empty() {
        return format!(
            "T{} {} ({})",
            e.max_tier,
            fmt_duration(e.end_ms.saturating_sub(e.start_ms)),
            e.trigger
        );
    }
    let mut parts = Vec::new();
    for (i, st) in e.steps.iter().enumerate() {
        let until = e.steps.get(i + 1).map_or(e.end_ms, |n| n.at_ms);
        let from = st.at_ms.max(e.start_ms);
        parts.push(format!(
            "T{} {} ({})",
            st.tier,
            fmt_duration(until.saturating_sub(from)),
            st.trigger
        ));
    }
    parts.join(" \u{2192} ")
}

fn trend(now: u64, before: u64, new: bool) -> String {
    if new || before == 0 {
        "new".into()
    } else {
        let r = now as f64 / before as f64 - 1.0;
        format!("{}{:.0}%", if r >= 0.0 { "+" } else { "" }, r * 100.0)
    }
}

/// Builds the report. Pure: the same data and playbook give the same report.
pub fn build(data: &WeekData, playbook: &Playbook) -> Report {
    let week_ms = 7 * 86_400_000;
    let mut patterns = data.patterns.clone();
    patterns.sort_by(|a, b| {
        b.budget_impact
            .total_cmp(&a.budget_impact)
            .then(b.count.cmp(&a.count))
            .then(a.id.cmp(&b.id))
    });
    let top: Vec<TopPattern> = patterns
        .iter()
        .take(3)
        .enumerate()
        .map(|(i, p)| TopPattern {
            rank: i + 1,
            pattern: p.clone(),
            trend: trend(p.count, p.last_week_count, p.new),
            impact_pct: pct(p.budget_impact),
        })
        .collect();
    let roadmap: Vec<RoadmapItem> = top
        .iter()
        .filter_map(|t| {
            let it = playbook.item_for(&t.pattern.category, &t.pattern.label)?;
            Some(RoadmapItem {
                rank: t.rank,
                pattern_id: t.pattern.id.clone(),
                pattern_label: t.pattern.label.clone(),
                category: t.pattern.category.clone(),
                playbook_id: it.id.clone(),
                title: it.title.clone(),
                change: it.change.clone(),
                verify: it.verify.clone(),
                signal: it.signal.clone(),
                source: it.source.clone(),
                expected_budget_win_back: t.pattern.budget_impact * it.win_back_ratio,
                win_back_pct: pct(t.pattern.budget_impact * it.win_back_ratio),
            })
        })
        .collect();
    let new_patterns: Vec<PatternWeek> = patterns.iter().filter(|p| p.new).cloned().collect();
    let slos: Vec<SloRow> = data
        .slos
        .iter()
        .map(|s| SloRow {
            name: s.name.clone(),
            objective_pct: format!("{:.2}%", s.objective * 100.0),
            spent_pct: pct(s.budget_spent_ratio),
            last_week_pct: pct(s.last_week_budget_spent_ratio),
            delta: format!(
                "{:+.1} pp",
                (s.budget_spent_ratio - s.last_week_budget_spent_ratio) * 100.0
            ),
            burn_rate: s
                .burn_rate
                .map_or_else(|| "\u{2014}".into(), |b| format!("{b:.1}\u{d7}")),
            runs_out: match (s.runs_out_ms, s.burn_rate) {
                (Some(t), _) => fmt_day(t),
                (None, Some(_)) => "not within the period".into(),
                (None, None) => "\u{2014}".into(),
            },
            history_note: s.history_days.map_or_else(String::new, |d| {
                format!("projected from {} of data", fmt_history(d))
            }),
            refused: s.refused,
            felt_pct: s
                .user_felt_budget_spent_ratio
                .map_or_else(|| "\u{2014}".into(), pct),
            shedding_cost: s.user_felt_budget_spent_ratio.map_or_else(
                || "\u{2014}".into(),
                |u| format!("{:+.1} pp", (u - s.budget_spent_ratio) * 100.0),
            ),
            prevented: match (s.prevented_failures, s.prevented_budget_ratio) {
                (Some(n), Some(r)) => format!("{n:.0} ({})", pct(r)),
                _ => "\u{2014}".into(),
            },
        })
        .chain(data.slos_without_data.iter().map(|s| SloRow {
            name: s.name.clone(),
            objective_pct: format!("{:.2}%", s.objective * 100.0),
            spent_pct: "\u{2014}".into(),
            last_week_pct: "\u{2014}".into(),
            delta: "\u{2014}".into(),
            burn_rate: "\u{2014}".into(),
            runs_out: "\u{2014}".into(),
            history_note: NO_REQUESTS.into(),
            refused: 0,
            felt_pct: "\u{2014}".into(),
            shedding_cost: "\u{2014}".into(),
            prevented: "\u{2014}".into(),
        }))
        .collect();
    let mut episodes_sorted = data.episodes.clone();
    episodes_sorted.sort_by_key(|e| (e.start_ms, e.end_ms));
    let episodes: Vec<EpisodeRow> = episodes_sorted
        .iter()
        .map(|e| {
            let end = e.end_ms.max(e.start_ms);
            let left = e.start_ms.saturating_sub(data.start_ms).min(week_ms) as f64
                / week_ms as f64
                * 100.0;
            let width = ((end - e.start_ms) as f64 / week_ms as f64 * 100.0)
                .max(0.4)
                .min(100.0 - left);
            EpisodeRow {
                start: fmt_ts(e.start_ms),
                end: fmt_ts(end),
                duration: fmt_duration(end - e.start_ms),
                max_tier: e.max_tier,
                trigger: e.trigger.clone(),
                detail: e.detail.clone(),
                tiers: tiers_text(e),
                cost: refusals_sentence(&e.refused),
                left_pct: (left * 10.0).round() / 10.0,
                width_pct: (width * 10.0).round() / 10.0,
            }
        })
        .collect();
    let mut incidents = data.instance_actions.clone();
    incidents.sort_by(|a, b| {
        (a.start_ms, a.end_ms, &a.instance, &a.action).cmp(&(
            b.start_ms,
            b.end_ms,
            &b.instance,
            &b.action,
        ))
    });
    let instance_actions: Vec<InstanceActionRow> = incidents
        .iter()
        .map(|i| {
            let end = i.end_ms.max(i.start_ms);
            InstanceActionRow {
                start: fmt_ts(i.start_ms),
                end: if i.open {
                    "still in force".into()
                } else {
                    fmt_ts(end)
                },
                duration: fmt_span(end - i.start_ms),
                instance: i.instance.clone(),
                action: i.action.clone(),
                what: action_words(i),
                trigger: i.trigger.clone(),
                detail: i.detail.clone(),
                ack: ack_words(i),
            }
        })
        .collect();
    let empty = data.slos.is_empty()
        && data.episodes.is_empty()
        && data.patterns.is_empty()
        && data.refusals.is_empty()
        && data.instance_actions.is_empty();
    let summary = if empty {
        format!(
            "No data was recorded for {} on cluster {}: no SLO budgets, no degradation episodes and no failures.",
            data.week, data.cluster
        )
    } else {
        let mut s = String::new();
        for slo in &data.slos {
            let period = slo
                .period_days
                .map_or_else(String::new, |d| format!("{d:.0}-day "));
            s.push_str(&format!(
                "{} spent {} of its {period}error budget ({} the week before)",
                slo.name,
                pct(slo.budget_spent_ratio),
                pct(slo.last_week_budget_spent_ratio)
            ));
            if let Some(b) = slo.burn_rate {
                s.push_str(&format!(", burning at {b:.1}\u{d7}"));
                match slo.runs_out_ms {
                    Some(t) => s.push_str(&format!(
                        "; at this rate the budget runs out on {}",
                        fmt_day(t)
                    )),
                    None => s.push_str("; at this rate the budget lasts the period"),
                }
            }
            if let Some(d) = slo.history_days {
                s.push_str(&format!(
                    " (only {} of data so far: projected from it)",
                    fmt_history(d)
                ));
            }
            s.push_str(". ");
        }
        if !data.slos_without_data.is_empty() {
            let names: Vec<&str> = data
                .slos_without_data
                .iter()
                .map(|s| s.name.as_str())
                .collect();
            s.push_str(&format!(
                "{} had no requests this week or the week before. ",
                names.join(", ")
            ));
        }
        let total_ms: u64 = data
            .episodes
            .iter()
            .map(|e| e.end_ms.saturating_sub(e.start_ms))
            .sum();
        match data.episodes.len() {
            0 => s.push_str("The service was never degraded. "),
            n => s.push_str(&format!(
                "The service was degraded {n} time{} for {} in total (longest to recover: {}, highest tier T{}). ",
                if n == 1 { "" } else { "s" },
                fmt_duration(total_ms),
                fmt_duration(data.episodes.iter().map(|e| e.end_ms.saturating_sub(e.start_ms)).max().unwrap_or(0)),
                data.episodes.iter().map(|e| e.max_tier).max().unwrap_or(0)
            )),
        }
        if !incidents.is_empty() {
            let mut instances: Vec<&str> = incidents
                .iter()
                .filter(|i| i.instance != brownout_protocol::ALL_INSTANCES)
                .map(|i| i.instance.as_str())
                .collect();
            instances.sort_unstable();
            instances.dedup();
            let count = |a: &str| incidents.iter().filter(|i| i.action == a).count();
            let mut what = Vec::new();
            for (a, one, many) in [
                ("halve", "max_num_seqs halving", "max_num_seqs halvings"),
                ("drain", "drain", "drains"),
                ("operator", "operator action", "operator actions"),
                ("ramp", "admission ramp", "admission ramps"),
                ("recovery_storm", "recovery storm", "recovery storms"),
            ] {
                match count(a) {
                    0 => {}
                    1 => what.push(format!("1 {one}")),
                    n => what.push(format!("{n} {many}")),
                }
            }
            s.push_str(&format!(
                "Stop-bleed acted on single instances: {}{}. ",
                what.join(", "),
                match instances.len() {
                    0 => String::new(),
                    1 => " on 1 instance".into(),
                    n => format!(" on {n} instances"),
                }
            ));
        }
        let refused: u64 = data.refusals.iter().map(|r| r.count).sum();
        if refused > 0 {
            s.push_str(&format!(
                "brownout refused {refused} requests on purpose ({}): the cost of degrading, not failures, so they are not ranked below. ",
                refusals_sentence(&data.refusals)
            ));
        }
        let failures: u64 = data.patterns.iter().map(|p| p.count).sum();
        if let Some(t) = top.first() {
            s.push_str(&format!(
                "{failures} failures fell into {} patterns; the top three explain {} of the bad events, led by \u{201c}{}\u{201d} ({}).",
                data.patterns.len(),
                pct(top.iter().map(|t| t.pattern.budget_impact).sum()),
                t.pattern.label,
                pct(t.pattern.budget_impact)
            ));
        }
        s
    };
    Report {
        week: data.week.clone(),
        cluster: data.cluster.clone(),
        week_start: fmt_ts(data.start_ms),
        week_end: fmt_ts(data.start_ms + week_ms),
        empty,
        summary,
        burn_chart_svg: super::svg::burn_down(&data.slos),
        trend_chart_svg: super::svg::pattern_trends(&top),
        slos,
        episodes,
        top,
        new_patterns,
        roadmap,
        refusals_text: refusals_sentence(&data.refusals),
        refusals: data.refusals.clone(),
        instance_actions,
    }
}
