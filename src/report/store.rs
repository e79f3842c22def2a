//! The weekly report from the store the server uses: [`week_data`] reads a week (and the one
//! before, for trends) into a [`WeekData`]; [`router`] serves `/reports/{week}` and `/reports`;
//! [`run_weekly`] stores last week's report (doc kind `"report"`, key `<cluster>:<week>`, value:
//! the [`WeekData`] JSON) once it is over.
//!
//! Approximations (docs/REPORT.md):
//! - SLO budget: the spent ratio is `bad_week / ((1 − objective) × total_week × period_days / 7)`,
//!   i.e. the week's traffic is assumed to repeat over the SLO's whole period (a calendar month
//!   counts as 30 days). Requests are spans with `is_request`; `bad = total − good`. Latency SLIs
//!   use the span's duration against the threshold, so a TTFT SLO is over-counted (an upper
//!   bound). Time-sliced budgeting is counted like occurrences.
//! - Patterns: the week's and the previous week's failures (at most [`MAX_FAILURES`] in all,
//!   newest kept) go through a fresh [`PatternEngine`]; `budget_impact` is the share of the week's
//!   failures.
//! - Episodes: stored degradation decisions (not dry-run), a span from the first raise above T0
//!   to the return to T0, clipped to the week (an episode still open ends now or at the week's
//!   end).

use std::sync::Arc;

use anyhow::Context as _;
use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use brownout_protocol::now_ms;
use chrono::Datelike as _;

use super::model::{Episode, PatternWeek, Playbook, SloWeek, WeekData};
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
) -> anyhow::Result<Vec<FailureRow>> {
    let mut out = Vec::new();
    let mut cursor: Option<FailureCursor> = None;
    loop {
        let q = FailureQuery {
            since_ms,
            until_ms,
            limit: 10_000.min(MAX_FAILURES - out.len()).max(1),
            cursor: cursor.clone(),
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

async fn slo_week(
    store: &dyn Store,
    spec: &SloSpec,
    start_ms: u64,
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
    for r in rows {
        if r.service != spec.service {
            continue;
        }
        if let Some(f) = &spec.selector.feature
            && &r.feature != f
        {
            continue;
        }
        if !spec.selector.criticality.is_empty()
            && !spec
                .selector
                .criticality
                .iter()
                .any(|c| c.as_str() == r.criticality)
        {
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
        }
    }
    let (last, this) = days.split_at(7);
    let sum = |s: &[(u64, u64)]| s.iter().fold((0u64, 0u64), |a, d| (a.0 + d.0, a.1 + d.1));
    let (bad, total) = sum(this);
    let (last_bad, last_total) = sum(last);
    if total == 0 && last_total == 0 {
        return Ok(None);
    }
    let scale = spec.error_budget_ratio() * period_days(spec.period) / 7.0;
    let ratio = |bad: u64, total: u64| {
        if total == 0 {
            0.0
        } else {
            bad as f64 / (scale * total as f64)
        }
    };
    let mut remaining_by_day = Vec::with_capacity(7);
    let mut cum = 0u64;
    for d in this {
        cum += d.0;
        remaining_by_day.push((1.0 - ratio(cum, total)).max(0.0));
    }
    Ok(Some(SloWeek {
        name: spec.name.clone(),
        objective: spec.objective_ratio,
        budget_spent_ratio: ratio(bad, total),
        last_week_budget_spent_ratio: ratio(last_bad, last_total),
        remaining_by_day,
    }))
}

/// Degradation episodes of `[start_ms, start_ms + 7 d)` from stored decisions.
pub fn episodes_from_decisions(
    decisions: &[DecisionRecord],
    start_ms: u64,
    now: u64,
) -> Vec<Episode> {
    let end_ms = start_ms + WEEK_MS;
    let mut ds: Vec<&DecisionRecord> = decisions
        .iter()
        .filter(|d| !d.dry_run && d.at_ms < end_ms)
        .collect();
    ds.sort_by_key(|d| d.at_ms);
    let mut out = Vec::new();
    let mut open: Option<Episode> = None;
    for d in ds {
        let tier = u8::from(d.tier);
        if tier > 0 {
            match &mut open {
                Some(e) => e.max_tier = e.max_tier.max(tier),
                None => {
                    open = Some(Episode {
                        start_ms: d.at_ms,
                        end_ms: d.at_ms,
                        max_tier: tier,
                        trigger: d.trigger.clone(),
                        detail: d.detail.clone(),
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
    let start_ms = super::week_start_ms(week)?;
    let end_ms = start_ms + WEEK_MS;

    let mut failures = read_failures(store, start_ms.saturating_sub(WEEK_MS), end_ms).await?;
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
    let patterns: Vec<PatternWeek> = engine
        .patterns(start_ms, end_ms)
        .iter()
        .map(|p| PatternWeek::from_pattern(p, start_ms))
        .collect();

    let mut slo_weeks = Vec::new();
    for spec in slos {
        if let Some(s) = slo_week(store, spec, start_ms).await? {
            slo_weeks.push(s);
        }
    }

    let docs = store
        .list_docs("decision", 0)
        .await
        .context("reading degradation decisions")?;
    let decisions: Vec<DecisionRecord> = docs
        .into_iter()
        .filter_map(|d| serde_json::from_value::<DecisionRecord>(d.value).ok())
        .collect();
    let episodes = episodes_from_decisions(&decisions, start_ms, now_ms());

    Ok(WeekData {
        week: week.to_string(),
        cluster: cluster.to_string(),
        start_ms,
        slos: slo_weeks,
        episodes,
        patterns,
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
        .with_state(ReportState {
            store,
            slos,
            cluster,
        })
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
    let week = match week.as_str() {
        "current" => current_week(),
        "last" => last_week(),
        w => w.to_string(),
    };
    let start_ms = match super::week_start_ms(&week) {
        Ok(s) => s,
        Err(e) => return bad_request(format!("{e:#}; use a week like 2026-W48, current or last")),
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
            Err(e) => return unavailable(&e.into()),
        }
    }
    let data = match data {
        Some(d) => d,
        None => match week_data(st.store.as_ref(), &st.slos, &week, &st.cluster).await {
            Ok(d) => d,
            Err(e) => return unavailable(&e),
        },
    };
    let body = match render(&super::build(&data, &Playbook::bundled()), format) {
        Ok(b) => b,
        Err(e) => {
            return ApiError::internal("the report could not be rendered", &e).into_response();
        }
    };
    let ct = match format {
        Format::Html => "text/html; charset=utf-8",
        Format::Md => "text/markdown; charset=utf-8",
        Format::Json => "application/json",
    };
    ([(header::CONTENT_TYPE, ct)], body).into_response()
}

fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
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
