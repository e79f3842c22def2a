//! The weekly report from the store the server uses: [`week_data`] reads a week (and the one
//! before, for trends) into a [`WeekData`]; [`router`] serves `/reports/{week}` and `/reports`;
//! [`run_weekly`] stores last week's report (doc kind `"report"`, key `<cluster>:<week>`, value:
//! the [`WeekData`] JSON) once it is over.
//!
//! Approximations (docs/REPORT.md):
//! - SLO budget: the spent ratio is `burn_week × covered / period`, where `covered` is the time
//!   the week's data spans (the week so far; from the first request when there was none before)
//!   — i.e. the period's traffic is taken to continue at the rate of what was seen (a calendar
//!   month counts as 30 days). For a whole week that is `bad_week / ((1 − objective) ×
//!   total_week × period_days / 7)`. Requests are spans with `is_request`; `bad = total − good`;
//!   requests refused on purpose are in neither (counted as `refused`). Latency SLIs use the
//!   span's duration against the threshold, so a TTFT SLO is over-counted (an upper bound).
//!   Time-sliced budgeting is counted like occurrences.
//! - Patterns: the week's and the previous week's failures (at most [`MAX_FAILURES`] in all,
//!   newest kept) — deliberate refusals excluded — go through a fresh [`PatternEngine`];
//!   `budget_impact` is the share of the week's SLO-bad events (the stored SLI buckets) that
//!   the pattern's failures explain ([`PatternEngine::patterns_by_slo_impact`]).
//! - Two views: the budget spent as users felt it counts the refusals on purpose as bad; the
//!   failures the degradation prevented are estimated per episode from the refused demand
//!   and the error ratio before the episode (docs/REPORT.md "What shedding cost and bought").
//! - Refusals: the week's deliberate failure events, by outcome, for the week and for each
//!   episode (its cost).
//! - Episodes: stored degradation decisions (not dry-run), a span from the first raise above T0
//!   to the return to T0, clipped to the week (an episode still open ends now or at the week's
//!   end).
//! - Per-instance actions: the same decisions' `instance_actions` (watches left out), each from
//!   the first decision carrying it to the first without it, with the ack the decisions
//!   recorded ([`instance_incidents_from_decisions`]).

use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use brownout_protocol::now_ms;
use chrono::Datelike as _;

use super::escape::html as escape;
use super::model::{
    Episode, IdleSlo, InstanceIncident, PatternWeek, Playbook, RefusalCount, SloWeek, TierStep,
    WeekData,
};
use super::render::{Format, render};
use crate::degrade::DecisionRecord;
use crate::error::{ApiError, Path, Query};
use crate::patterns::PatternEngine;
use crate::slo::spec::{Period, SliKind, SloSpec};
use crate::store::{CountQuery, FailureCursor, FailureQuery, FailureRow, Store};

const DAY_MS: u64 = 86_400_000;
const WEEK_MS: u64 = 7 * DAY_MS;
/// Most failures read for one report (this week and last week together).
pub const MAX_FAILURES: usize = 200_000;
/// Document kind of stored reports.
pub const REPORT_KIND: &str = "report";

/// The ISO week (`2026-W48`) holding a unix-ms instant.
pub fn iso_week_of(ms: u64) -> String {
    let t = chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms as i64).unwrap_or_default();
    let w = t.iso_week();
    format!("{}-W{:02}", w.year(), w.week())
}

/// The current ISO week.
pub fn current_week() -> String {
    iso_week_of(now_ms())
}

/// The ISO week before the current one.
pub fn last_week() -> String {
    iso_week_of(now_ms().saturating_sub(WEEK_MS))
}

/// Key of a stored report.
pub fn report_key(cluster: &str, week: &str) -> String {
    format!("{cluster}:{week}")
}

async fn read_failures(
    store: &dyn Store,
    since_ms: u64,
    until_ms: u64,
    deliberate: bool,
) -> anyhow::Result<Vec<FailureRow>> {
    let mut out = Vec::new();
    let mut cursor: Option<FailureCursor> = None;
    loop {
        let q = FailureQuery {
            since_ms,
            until_ms,
            limit: 10_000.min(MAX_FAILURES - out.len()).max(1),
            cursor: cursor.clone(),
            deliberate: Some(deliberate),
            ..FailureQuery::default()
        };
        let page = store.failures(&q).await.context("reading failures")?;
        out.extend(page.items);
        if out.len() >= MAX_FAILURES {
            tracing::warn!(
                limit = MAX_FAILURES,
                "weekly report: failures truncated to the newest"
            );
            out.truncate(MAX_FAILURES);
            break;
        }
        match page.next_cursor.as_deref().and_then(FailureCursor::decode) {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    Ok(out)
}

fn period_days(p: Period) -> f64 {
    p.nominal_secs() as f64 / 86_400.0
}

/// The first minute with requests of `spec` in `[since_ms, until_ms)`.
async fn first_request_ms(
    store: &dyn Store,
    spec: &SloSpec,
    since_ms: u64,
    until_ms: u64,
) -> anyhow::Result<Option<u64>> {
    let q = CountQuery {
        since_ms,
        until_ms,
        bucket_ms: 60_000,
        service: Some(spec.service.clone()),
        latency_threshold_ms: None,
    };
    let rows = store.request_counts(&q).await?;
    Ok(rows
        .iter()
        .filter(|r| selected(spec, r) && r.total + r.refused > 0)
        .map(|r| r.bucket_ms)
        .min())
}

fn selected(spec: &SloSpec, r: &crate::store::RequestCount) -> bool {
    if r.service != spec.service {
        return false;
    }
    if let Some(f) = &spec.selector.feature
        && &r.feature != f
    {
        return false;
    }
    spec.selector.criticality.is_empty()
        || spec
            .selector
            .criticality
            .iter()
            .any(|c| c.as_str() == r.criticality)
}

/// One SLO's stored SLI counts summed over `[from_ms, to_ms)` (minute-aligned).
async fn stored_counts(
    store: &dyn Store,
    slo: &str,
    from_ms: u64,
    to_ms: u64,
) -> anyhow::Result<crate::store::SliCounts> {
    let from = from_ms - from_ms % 60_000;
    let span = to_ms.saturating_sub(from).max(1).div_ceil(60_000) * 60_000;
    let rows = store
        .sli_buckets(from, to_ms, span)
        .await
        .with_context(|| format!("stored SLI buckets of {slo}"))?;
    let mut c = crate::store::SliCounts::default();
    for r in rows.iter().filter(|r| r.slo == slo) {
        c += r.counts;
    }
    Ok(c)
}

/// Failures the degradation prevented for one SLO (docs/REPORT.md "What shedding cost and
/// bought"): per episode, the SLO's requests refused on purpose during it (until 5 s after
/// its end) × the SLO's real error ratio in the 10 minutes before it began, from the stored
/// SLI buckets.
async fn prevented_failures(
    store: &dyn Store,
    spec: &SloSpec,
    episodes: &[Episode],
) -> anyhow::Result<f64> {
    let mut prevented = 0.0;
    for e in episodes {
        let before = stored_counts(
            store,
            &spec.name,
            e.start_ms.saturating_sub(600_000),
            e.start_ms,
        )
        .await?;
        if before.total == 0 {
            continue;
        }
        let during = stored_counts(store, &spec.name, e.start_ms, e.end_ms + 5_000).await?;
        let ratio = before.total.saturating_sub(before.good) as f64 / before.total as f64;
        prevented += during.refused as f64 * ratio;
    }
    Ok(prevented)
}

async fn slo_week(
    store: &dyn Store,
    spec: &SloSpec,
    start_ms: u64,
    as_of_ms: u64,
    episodes: &[Episode],
) -> anyhow::Result<Option<SloWeek>> {
    let latency_threshold_ms = match spec.sli.kind {
        SliKind::Latency { threshold_ms, .. } => Some(threshold_ms.max(0.0).floor() as u64),
        SliKind::Availability | SliKind::TaskSuccess => None,
    };
    let q = CountQuery {
        since_ms: start_ms - WEEK_MS,
        until_ms: start_ms + WEEK_MS,
        bucket_ms: DAY_MS,
        service: Some(spec.service.clone()),
        latency_threshold_ms,
    };
    let rows = store
        .request_counts(&q)
        .await
        .with_context(|| format!("request counts of {}", spec.name))?;
    // Per day, -7..7: (bad, total).
    let mut days = [(0u64, 0u64); 14];
    let mut refused = 0u64;
    for r in rows {
        if !selected(spec, &r) {
            continue;
        }
        let Some(d) = r
            .bucket_ms
            .checked_sub(start_ms - WEEK_MS)
            .map(|o| (o / DAY_MS) as usize)
        else {
            continue;
        };
        if d < 14 {
            days[d].0 += r.total.saturating_sub(r.good);
            days[d].1 += r.total;
            if d >= 7 {
                refused += r.refused;
            }
        }
    }
    let (last, this) = days.split_at(7);
    let sum = |s: &[(u64, u64)]| s.iter().fold((0u64, 0u64), |a, d| (a.0 + d.0, a.1 + d.1));
    let (bad, total) = sum(this);
    let (last_bad, last_total) = sum(last);
    if total == 0 && last_total == 0 && refused == 0 {
        return Ok(None);
    }
    let period_days = period_days(spec.period);
    let budget = spec.error_budget_ratio();
    // The time this week's figures cover: the week so far, from its first request when the
    // week before had none (a fresh install sees minutes, not a week).
    let end = as_of_ms.clamp(start_ms, start_ms + WEEK_MS);
    let mut covered_from = start_ms;
    if last_total == 0 {
        let first_day = this.iter().position(|d| d.1 > 0).unwrap_or(0) as u64;
        let day_start = start_ms + first_day * DAY_MS;
        if let Some(f) = first_request_ms(store, spec, day_start, day_start + DAY_MS).await? {
            covered_from = f.max(start_ms);
        }
    }
    // At least a minute, so that a first event does not divide by zero.
    let covered_days = (end.saturating_sub(covered_from).max(60_000)) as f64 / DAY_MS as f64;
    let burn = |bad: u64, total: u64| {
        if total == 0 {
            0.0
        } else {
            bad as f64 / total as f64 / budget
        }
    };
    // Share of the period's budget: the burn rate × the time it lasted / the period.
    let spent =
        |bad: u64, total: u64, days: f64| burn(bad, total) * days.min(period_days) / period_days;
    let budget_spent_ratio = spent(bad, total, covered_days);
    // As users felt it: every refusal on purpose a bad event.
    let user_felt = spent(bad + refused, total + refused, covered_days);
    let prevented = prevented_failures(store, spec, episodes).await?;
    // A prevented failure would have spent what one bad event of the week spends.
    let prevented_ratio = if total + refused == 0 {
        0.0
    } else {
        spent(prevented.round() as u64, total + refused, covered_days)
    };
    // Days reached so far (the week's last day included once the week is over).
    let days_reached = (end.saturating_sub(start_ms)).div_ceil(DAY_MS).clamp(1, 7) as usize;
    let mut remaining_by_day = Vec::with_capacity(days_reached);
    let mut cum = 0u64;
    for d in &this[..days_reached] {
        cum += d.0;
        // Each day's cumulative bad events against the period's projected budget.
        let share = if total == 0 {
            0.0
        } else {
            cum as f64 / bad.max(1) as f64
        };
        remaining_by_day.push((1.0 - budget_spent_ratio * share.min(1.0)).max(0.0));
    }
    let this_burn = burn(bad, total);
    // At this week's rate, counting from the start of this week's data, with what last week
    // spent already gone when the period reaches back over it.
    let last_spent = if period_days > 7.0 {
        spent(last_bad, last_total, 7.0)
    } else {
        0.0
    };
    let left_at_start = (1.0 - last_spent).max(0.0);
    let runs_out_ms = (this_burn > 0.0)
        .then(|| left_at_start * period_days / this_burn * DAY_MS as f64)
        .filter(|d| *d < period_days * DAY_MS as f64)
        .map(|d| covered_from + d as u64);
    Ok(Some(SloWeek {
        name: spec.name.clone(),
        objective: spec.objective_ratio,
        budget_spent_ratio,
        last_week_budget_spent_ratio: spent(last_bad, last_total, 7.0),
        remaining_by_day,
        burn_rate: Some((this_burn * 1000.0).round() / 1000.0),
        period_days: Some(period_days),
        // No data before this week: the history is what this week holds, shorter than the
        // period; say so.
        history_days: (last_total == 0 && covered_days < period_days).then_some(covered_days),
        runs_out_ms,
        refused,
        user_felt_budget_spent_ratio: Some(user_felt),
        prevented_failures: Some(prevented),
        prevented_budget_ratio: Some(prevented_ratio),
    }))
}

/// Deliberate failures, by outcome: counts and the most refused features.
pub fn refusal_counts<'a>(rows: impl Iterator<Item = &'a FailureRow>) -> Vec<RefusalCount> {
    use std::collections::BTreeMap;
    let mut by: BTreeMap<String, (u64, BTreeMap<String, u64>)> = BTreeMap::new();
    for r in rows {
        let outcome = r
            .event
            .attributes
            .get("outcome")
            .cloned()
            .filter(|o| !o.is_empty())
            .unwrap_or_else(|| r.event.error_type.clone());
        let e = by.entry(outcome).or_default();
        e.0 += 1;
        if !r.event.feature.is_empty() {
            *e.1.entry(r.event.feature.clone()).or_default() += 1;
        }
    }
    let mut out: Vec<RefusalCount> = by
        .into_iter()
        .map(|(outcome, (count, features))| {
            let mut f: Vec<(String, u64)> = features.into_iter().collect();
            f.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            RefusalCount {
                outcome,
                count,
                features: f.into_iter().take(8).map(|(n, _)| n).collect(),
            }
        })
        .collect();
    out.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then_with(|| a.outcome.cmp(&b.outcome))
    });
    out
}

/// The decisions that were carried out (not dry runs) before `end_ms`, oldest first.
fn published_until(decisions: &[DecisionRecord], end_ms: u64) -> Vec<&DecisionRecord> {
    let mut ds: Vec<&DecisionRecord> = decisions
        .iter()
        .filter(|d| !d.dry_run && d.at_ms < end_ms)
        .collect();
    ds.sort_by_key(|d| d.at_ms);
    ds
}

/// Degradation episodes of `[start_ms, start_ms + 7 d)` from stored decisions.
pub fn episodes_from_decisions(
    decisions: &[DecisionRecord],
    start_ms: u64,
    now: u64,
) -> Vec<Episode> {
    let end_ms = start_ms + WEEK_MS;
    let ds = published_until(decisions, end_ms);
    let mut out = Vec::new();
    let mut open: Option<Episode> = None;
    for d in ds {
        let tier = u8::from(d.tier);
        if tier > 0 {
            let step = TierStep {
                at_ms: d.at_ms,
                tier,
                trigger: d.trigger.clone(),
            };
            match &mut open {
                Some(e) => {
                    e.max_tier = e.max_tier.max(tier);
                    // A change of tier, or of what holds it, is a step.
                    if e.steps
                        .last()
                        .is_none_or(|l| l.tier != tier || l.trigger != d.trigger)
                    {
                        e.steps.push(step);
                    }
                }
                None => {
                    open = Some(Episode {
                        start_ms: d.at_ms,
                        end_ms: d.at_ms,
                        max_tier: tier,
                        trigger: d.trigger.clone(),
                        detail: d.detail.clone(),
                        steps: vec![step],
                        refused: Vec::new(),
                    });
                }
            }
        } else if let Some(mut e) = open.take() {
            e.end_ms = d.at_ms;
            if e.end_ms > start_ms {
                e.start_ms = e.start_ms.max(start_ms);
                out.push(e);
            }
        }
    }
    if let Some(mut e) = open {
        e.end_ms = now.clamp(start_ms, end_ms).max(e.start_ms);
        if e.end_ms > start_ms || e.start_ms >= start_ms {
            e.start_ms = e.start_ms.max(start_ms);
            e.end_ms = e.end_ms.max(e.start_ms);
            out.push(e);
        }
    }
    out
}

/// Per-instance stop-bleed actions of `[start_ms, start_ms + 7 d)` from stored decisions (not
/// dry-run): each `(instance, action)` from the decision that first carries it to the first
/// one without it (still open: until `now`, or the week's end), clipped to the week. P2 watches
/// are reasons, not actions, and are left out. The ack is the best one any of its decisions
/// recorded (`applied` wins); the ramp lists its admitted shares.
pub fn instance_incidents_from_decisions(
    decisions: &[DecisionRecord],
    start_ms: u64,
    now: u64,
) -> Vec<InstanceIncident> {
    use std::collections::BTreeMap;
    let end_ms = start_ms + WEEK_MS;
    let ds = published_until(decisions, end_ms);
    let mut open: BTreeMap<(String, String), InstanceIncident> = BTreeMap::new();
    let mut done = Vec::new();
    let rank = |a: &str| match a {
        "applied" => 4,
        "pending" => 3,
        "unknown_instance" => 2,
        "-" => 1,
        _ => 0,
    };
    for d in ds {
        let mut seen = Vec::new();
        for a in d.instance_actions.iter().filter(|a| a.action != "watch") {
            let key = (a.instance.clone(), a.action.clone());
            seen.push(key.clone());
            let inc = open.entry(key).or_insert_with(|| InstanceIncident {
                instance: a.instance.clone(),
                action: a.action.clone(),
                trigger: a.trigger.clone(),
                detail: a.detail.clone(),
                start_ms: if a.since_ms > 0 && a.since_ms <= d.at_ms {
                    a.since_ms
                } else {
                    d.at_ms
                },
                end_ms: d.at_ms,
                open: true,
                steps: Vec::new(),
                ack: if a.action == "recovery_storm" {
                    "-".into()
                } else {
                    "not recorded".into()
                },
                ack_lag_ms: None,
            });
            inc.end_ms = d.at_ms;
            if a.action == "ramp"
                && let Some(v) = a.value
                && inc.steps.last().is_none_or(|l| (l - v).abs() > 1e-9)
            {
                inc.steps.push(v);
            }
            if a.action != "recovery_storm"
                && let Some(ack) = d.instance_acks.get(&a.instance)
                && rank(&ack.status) >= rank(&inc.ack)
            {
                inc.ack = ack.status.clone();
                inc.ack_lag_ms = ack.lag_ms.or(inc.ack_lag_ms);
            }
        }
        let ended: Vec<(String, String)> =
            open.keys().filter(|k| !seen.contains(k)).cloned().collect();
        for k in ended {
            if let Some(mut inc) = open.remove(&k) {
                inc.end_ms = d.at_ms;
                inc.open = false;
                done.push(inc);
            }
        }
    }
    for (_, mut inc) in open {
        inc.end_ms = now.clamp(start_ms, end_ms).max(inc.end_ms);
        done.push(inc);
    }
    done.retain(|i| i.end_ms > start_ms || (i.open && i.start_ms >= start_ms));
    for i in &mut done {
        i.start_ms = i.start_ms.max(start_ms);
        i.end_ms = i.end_ms.max(i.start_ms);
    }
    done.sort_by(|a, b| {
        (a.start_ms, &a.instance, &a.action).cmp(&(b.start_ms, &b.instance, &b.action))
    });
    done
}

/// The week's data from the store: patterns (with last week's counts), SLO budgets, episodes.
/// A week without data gives a [`WeekData`] with every list empty (rendered as "no data").
///
/// # Errors
/// A malformed week, or a store that does not answer.
pub async fn week_data(
    store: &dyn Store,
    slos: &[SloSpec],
    week: &str,
    cluster: &str,
) -> anyhow::Result<WeekData> {
    week_data_at(store, slos, week, cluster, now_ms()).await
}

/// [`week_data`] as of `now` (a week still running is cut there).
///
/// # Errors
/// A malformed week, or a store that does not answer.
pub async fn week_data_at(
    store: &dyn Store,
    slos: &[SloSpec],
    week: &str,
    cluster: &str,
    now: u64,
) -> anyhow::Result<WeekData> {
    let start_ms = super::week_start_ms(week)?;
    let end_ms = start_ms + WEEK_MS;
    let as_of_ms = (now < end_ms).then_some(now.max(start_ms));

    let mut failures =
        read_failures(store, start_ms.saturating_sub(WEEK_MS), end_ms, false).await?;
    failures.sort_by(|a, b| {
        a.event
            .ts_ms
            .cmp(&b.event.ts_ms)
            .then_with(|| a.id.cmp(&b.id))
    });
    let mut engine = PatternEngine::default();
    for f in &failures {
        engine.observe(&f.event);
    }
    let days_reached = as_of_ms.map_or(7, |t| {
        (t.saturating_sub(start_ms) / DAY_MS + 1).clamp(1, 7) as usize
    });
    // Ranked by real impact: each pattern's share of the week's SLO-bad events (stored SLI
    // buckets).
    let slo_bad = crate::slo::persist::slo_bad_events(store, slos, start_ms, end_ms)
        .await
        .context("reading the week's SLO-bad events")?;
    let ranked = match &slo_bad {
        Some(bad) => engine.patterns_by_slo_impact(start_ms, end_ms, bad),
        // No SLI bucket stored for the week (data from before they existed): by failures.
        None => engine.patterns(start_ms, end_ms),
    };
    let patterns: Vec<PatternWeek> = ranked
        .iter()
        .map(|p| {
            let mut w = PatternWeek::from_pattern(p, start_ms);
            // Days not reached yet are not drawn.
            w.daily.truncate(days_reached);
            w
        })
        .collect();
    let refused_rows = read_failures(store, start_ms, end_ms, true).await?;

    let docs = store
        .list_docs("decision", 0)
        .await
        .context("reading degradation decisions")?;
    let decisions: Vec<DecisionRecord> = docs
        .into_iter()
        .filter_map(|d| serde_json::from_value::<DecisionRecord>(d.value).ok())
        .collect();
    let instance_actions = instance_incidents_from_decisions(&decisions, start_ms, now);
    let mut episodes = episodes_from_decisions(&decisions, start_ms, now);
    for e in &mut episodes {
        // A refusal belongs to the episode it happened in (plus the command's propagation:
        // a few seconds after the return to T0 the serving tiers may still refuse).
        let until = e.end_ms + 5_000;
        e.refused = refusal_counts(
            refused_rows
                .iter()
                .filter(|r| r.event.ts_ms >= e.start_ms && r.event.ts_ms < until),
        );
    }

    let mut slo_weeks = Vec::new();
    let mut slos_without_data = Vec::new();
    for spec in slos {
        match slo_week(store, spec, start_ms, as_of_ms.unwrap_or(end_ms), &episodes).await? {
            Some(s) => slo_weeks.push(s),
            None => slos_without_data.push(IdleSlo {
                name: spec.name.clone(),
                objective: spec.objective_ratio,
            }),
        }
    }

    Ok(WeekData {
        week: week.to_string(),
        cluster: cluster.to_string(),
        start_ms,
        slos: slo_weeks,
        episodes,
        patterns,
        as_of_ms,
        refusals: refusal_counts(refused_rows.iter()),
        instance_actions,
        slos_without_data,
    })
}

/// Stores the report of `week` unless one is stored already. Returns whether it wrote one.
///
/// # Errors
/// A malformed week, or a store that does not answer.
pub async fn ensure_stored(
    store: &dyn Store,
    slos: &[SloSpec],
    cluster: &str,
    week: &str,
) -> anyhow::Result<bool> {
    let key = report_key(cluster, week);
    if store
        .get_doc(REPORT_KIND, &key)
        .await
        .context("reading stored reports")?
        .is_some()
    {
        return Ok(false);
    }
    let data = week_data(store, slos, week, cluster).await?;
    let value = serde_json::to_value(&data)?;
    store
        .put_doc(REPORT_KIND, &key, &value)
        .await
        .context("storing the report")?;
    tracing::info!(week, cluster, "weekly report stored");
    Ok(true)
}

/// On start and then hourly: stores last week's report if it is not stored yet. A pass that has
/// begun finishes before `shutdown` is honoured.
pub async fn run_weekly(
    store: Arc<dyn Store>,
    slos: Arc<Vec<SloSpec>>,
    cluster: String,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        if let Err(e) = ensure_stored(store.as_ref(), &slos, &cluster, &last_week()).await {
            tracing::warn!(error = %e, "cannot store last week's report");
        }
        tokio::select! {
            () = &mut shutdown => break,
            () = tokio::time::sleep(std::time::Duration::from_secs(3600)) => {}
        }
    }
}

#[derive(Clone)]
struct ReportState {
    store: Arc<dyn Store>,
    slos: Arc<Vec<SloSpec>>,
    cluster: String,
}

#[derive(serde::Deserialize)]
struct FormatQuery {
    format: Option<String>,
}

#[derive(serde::Deserialize)]
struct ItemQuery {
    item: Option<String>,
}

fn bad_request(msg: String) -> Response {
    ApiError::bad_request("bad_parameter", msg).into_response()
}

fn unavailable(e: &anyhow::Error) -> Response {
    tracing::warn!(error = %format!("{e:#}"), "report: store error");
    ApiError::unavailable(
        "store_unavailable",
        "the store is not answering; try again later",
        5,
    )
    .into_response()
}

/// `GET /reports/{week}` (`current`, `last` or `2026-W48`; `?format=html|md|json`) and
/// `GET /reports` (index of stored reports). Mount behind the read token.
pub fn router(store: Arc<dyn Store>, slos: Arc<Vec<SloSpec>>, cluster: String) -> Router {
    Router::new()
        .route("/reports", axum::routing::get(index))
        .route("/reports/{week}", axum::routing::get(report))
        .route("/reports/{week}/export.csv", axum::routing::get(export_csv))
        .route("/reports/{week}/export.md", axum::routing::get(export_md))
        .with_state(ReportState {
            store,
            slos,
            cluster,
        })
}

/// The built report of a week (`current`, `last` or `2026-W48`): the stored one for a past week
/// when there is one, else built from the store.
async fn load_report(st: &ReportState, week: &str) -> Result<super::Report, Response> {
    let week = match week {
        "current" => current_week(),
        "last" => last_week(),
        w => w.to_string(),
    };
    let start_ms = match super::week_start_ms(&week) {
        Ok(s) => s,
        Err(e) => {
            return Err(bad_request(format!(
                "{e:#}; use a week like 2026-W48, current or last"
            )));
        }
    };
    // Past weeks: the stored report when there is one.
    let mut data = None;
    if start_ms + WEEK_MS <= now_ms() {
        match st
            .store
            .get_doc(REPORT_KIND, &report_key(&st.cluster, &week))
            .await
        {
            Ok(Some(doc)) => data = serde_json::from_value::<WeekData>(doc.value).ok(),
            Ok(None) => {}
            Err(e) => return Err(unavailable(&e.into())),
        }
    }
    let data = match data {
        Some(d) => d,
        None => match week_data(st.store.as_ref(), &st.slos, &week, &st.cluster).await {
            Ok(d) => d,
            Err(e) => return Err(unavailable(&e)),
        },
    };
    Ok(super::build(&data, &Playbook::bundled()))
}

async fn report(
    State(st): State<ReportState>,
    Path(week): Path<String>,
    q: Result<Query<FormatQuery>, ApiError>,
) -> Response {
    let Ok(Query(q)) = q else {
        return bad_request("bad query; use ?format=html|md|json".into());
    };
    let format = match q.format.as_deref().unwrap_or("html") {
        "html" => Format::Html,
        "md" | "markdown" => Format::Md,
        "json" => Format::Json,
        _ => return bad_request("format must be html, md or json".into()),
    };
    let report = match load_report(&st, &week).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let body = match render(&report, format) {
        Ok(b) => b,
        Err(e) => {
            return ApiError::internal("the report could not be rendered", &e).into_response();
        }
    };
    let ct = match format {
        Format::Html => "text/html; charset=utf-8",
        Format::Md | Format::GithubMd => "text/markdown; charset=utf-8",
        Format::Json => "application/json",
        Format::JiraCsv => "text/csv; charset=utf-8",
    };
    ([(header::CONTENT_TYPE, ct)], body).into_response()
}

/// `GET /reports/{week}/export.csv`: the roadmap items as a CSV for Jira's importer.
async fn export_csv(State(st): State<ReportState>, Path(week): Path<String>) -> Response {
    let report = match load_report(&st, &week).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let disposition = format!(
        "attachment; filename=\"brownout-roadmap-{}.csv\"",
        report
            .week
            .replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_")
    );
    (
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_string()),
            (header::CONTENT_DISPOSITION, disposition),
        ],
        super::export::jira_csv(&report),
    )
        .into_response()
}

/// `GET /reports/{week}/export.md[?item=N]`: the roadmap items as GitHub issue bodies (all of
/// them under their titles, or item `N`'s body alone).
async fn export_md(
    State(st): State<ReportState>,
    Path(week): Path<String>,
    q: Result<Query<ItemQuery>, ApiError>,
) -> Response {
    let Ok(Query(q)) = q else {
        return bad_request("bad query; use ?item=1|2|3".into());
    };
    let item = match q.item.as_deref().map(str::parse::<usize>) {
        None => None,
        Some(Ok(n)) if (1..=3).contains(&n) => Some(n),
        Some(_) => return bad_request("query parameter `item` must be 1, 2 or 3".into()),
    };
    let report = match load_report(&st, &week).await {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    match super::export::github_md(&report, item) {
        Some(body) => (
            [(header::CONTENT_TYPE, "text/markdown; charset=utf-8")],
            body,
        )
            .into_response(),
        None => ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            "roadmap_item_not_found",
            format!(
                "the report of {} has no roadmap item {}",
                report.week,
                item.unwrap_or(0)
            ),
        )
        .into_response(),
    }
}

async fn index(State(st): State<ReportState>) -> Response {
    let docs = match st.store.list_docs(REPORT_KIND, 0).await {
        Ok(d) => d,
        Err(e) => return unavailable(&e.into()),
    };
    let prefix = format!("{}:", st.cluster);
    let mut weeks: Vec<String> = docs
        .iter()
        .filter_map(|d| d.key.strip_prefix(&prefix))
        .filter(|w| super::week_start_ms(w).is_ok())
        .map(str::to_string)
        .collect();
    weeks.sort_unstable_by(|a, b| b.cmp(a));
    weeks.dedup();
    let mut items = String::new();
    for w in &weeks {
        let w = escape(w);
        items.push_str(&format!(
            "<li><a href=\"/reports/{w}\">{w}</a> (<a href=\"/reports/{w}?format=md\">md</a>, <a href=\"/reports/{w}?format=json\">json</a>)</li>\n"
        ));
    }
    if items.is_empty() {
        items.push_str("<li>No stored reports yet (last week's is stored within an hour of the server starting).</li>\n");
    }
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>brownout: weekly reports ({c})</title></head>\
         <body><h1>Weekly stability reports — cluster {c}</h1>\
         <p><a href=\"/reports/current\">This week so far</a> · <a href=\"/reports/last\">Last week</a></p>\
         <ul>\n{items}</ul></body></html>",
        c = escape(&st.cluster)
    );
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], html).into_response()
}
