//! Weekly stability roadmap report (docs/REQUIREMENTS.md R9: every failure becomes an
//! engineering item; the top three come first).
//!
//! - [`model`]: the input [`WeekData`], the [`Playbook`] (playbooks/default.toml, user
//!   extendable) and [`build`] → [`Report`] (pure).
//! - [`svg`]: budget burn-down and pattern-trend charts as inline SVG (pure).
//! - [`render`]: HTML (self-contained, prints), Markdown, JSON (tera templates in templates/).
//! - [`export`]: the TOP-3 roadmap items for trackers: a CSV for Jira, Markdown issue bodies
//!   for GitHub.
//! - [`escape`]: the Markdown escaping of `render` and `export`, the HTML escaping of `svg` and
//!   `store`.
//! - [`store`]: [`WeekData`] from the server's store, `/reports/{week}`, the weekly task.
//! - this file: `brownout report` and [`synth_week`] (WeekData from `patterns synth` data).

pub mod compose;
pub mod escape;
pub mod export;
pub mod model;
pub mod render;
pub mod store;
pub mod svg;

use std::path::PathBuf;

use anyhow::Context;

pub use compose::build;
pub use model::{
    Episode, IdleSlo, InstanceIncident, NO_REQUESTS, PatternWeek, Playbook, Report, SloWeek,
    WeekData,
};
pub use render::{Format, render};

use crate::patterns::PatternEngine;
use crate::patterns::synth::{SynthConfig, generate};

/// Command-line arguments of `brownout report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// ISO week, e.g. 2026-W48.
    #[arg(long)]
    week: String,
    #[arg(long, default_value = "prod")]
    cluster: String,
    /// html, md, json; or the roadmap items for a tracker: jira-csv, github-md.
    #[arg(long, value_enum, default_value_t = Format::Html)]
    format: Format,
    /// With --format github-md: only this roadmap item's issue body (1–3).
    #[arg(long)]
    item: Option<usize>,
    /// Output file (default stdout).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Read the week's data from this WeekData JSON file.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Read the week from the store `brownout serve` uses (SQLite under BROWNOUT_DATA_DIR, or
    /// ClickHouse when CLICKHOUSE_URL is set). The default when neither --data nor --synth is given.
    #[arg(long, conflicts_with = "data")]
    store: bool,
    /// Server config file naming the store (implies --store).
    #[arg(long, conflicts_with_all = ["data", "synth"])]
    config: Option<PathBuf>,
    /// Derive the week from synthetic `patterns synth` data (for trying the report out).
    #[arg(long, conflicts_with_all = ["data", "store"])]
    synth: bool,
    /// Extra playbook (TOML); its items are tried before the bundled ones.
    #[arg(long)]
    playbook: Option<PathBuf>,
    /// Seed of the synthetic data (with --synth).
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

/// Monday 00:00 UTC of an ISO week like `2026-W48`, in unix ms.
///
/// # Errors
/// A malformed week or one that does not exist.
pub fn week_start_ms(week: &str) -> anyhow::Result<u64> {
    let (y, w) = week
        .split_once("-W")
        .with_context(|| format!("week {week:?} is not like 2026-W48"))?;
    let y: i32 = y
        .parse()
        .with_context(|| format!("week {week:?}: bad year"))?;
    let w: u32 = w
        .parse()
        .with_context(|| format!("week {week:?}: bad week number"))?;
    let d = chrono::NaiveDate::from_isoywd_opt(y, w, chrono::Weekday::Mon)
        .with_context(|| format!("week {week:?} does not exist"))?;
    let ms = d
        .and_hms_opt(0, 0, 0)
        .expect("midnight exists")
        .and_utc()
        .timestamp_millis();
    u64::try_from(ms).with_context(|| format!("week {week:?} is before 1970"))
}

/// A week of data derived from `patterns synth` events (this week and the one before), run
/// through the [`PatternEngine`]: SLO budget from failures against an assumed 2 M requests a
/// week at 99.5 %, degradation episodes where an hour has more than 3× the median failures.
pub fn synth_week(week: &str, cluster: &str, seed: u64, lines: usize) -> anyhow::Result<WeekData> {
    let start_ms = week_start_ms(week)?;
    let day = 86_400_000u64;
    let mut engine = PatternEngine::default();
    let last = generate(&SynthConfig {
        lines: lines * 4 / 5,
        seed: seed.wrapping_add(1),
        start_ms: start_ms - 7 * day,
        span_ms: 7 * day,
    });
    let this = generate(&SynthConfig {
        lines,
        seed,
        start_ms,
        span_ms: 7 * day,
    });
    for e in last.iter().chain(&this) {
        engine.observe(&e.event);
    }
    let patterns: Vec<PatternWeek> = engine
        .patterns(start_ms, start_ms + 7 * day)
        .iter()
        .map(|p| PatternWeek::from_pattern(p, start_ms))
        .collect();
    // Budget: 2 M requests a week at 99.5 % allow 10 000 bad events.
    let allowed = 2_000_000.0 * 0.005;
    let mut remaining = Vec::new();
    let mut spent = 0.0;
    for d in 0..7 {
        let n = this
            .iter()
            .filter(|e| (e.event.ts_ms - start_ms) / day == d)
            .count() as f64;
        spent += n / allowed;
        remaining.push((1.0 - spent).max(0.0));
    }
    let slos = vec![SloWeek {
        name: "agent-availability".into(),
        objective: 0.995,
        budget_spent_ratio: this.len() as f64 / allowed,
        last_week_budget_spent_ratio: last.len() as f64 / allowed,
        remaining_by_day: remaining,
        burn_rate: None,
        period_days: None,
        history_days: None,
        runs_out_ms: None,
        refused: 0,
        user_felt_budget_spent_ratio: None,
        prevented_failures: None,
        prevented_budget_ratio: None,
    }];
    // Episodes: runs of hours above 3× the median hourly failures.
    let mut hourly = vec![0u64; 7 * 24];
    for e in &this {
        hourly[((e.event.ts_ms - start_ms) / 3_600_000) as usize] += 1;
    }
    let mut sorted = hourly.clone();
    sorted.sort_unstable();
    let median = sorted[sorted.len() / 2].max(1);
    let mut episodes = Vec::new();
    let mut h = 0;
    while h < hourly.len() {
        if hourly[h] > 3 * median {
            let s = h;
            let mut peak = 0;
            while h < hourly.len() && hourly[h] > 3 * median {
                peak = peak.max(hourly[h]);
                h += 1;
            }
            let tier = if peak > 6 * median { 2 } else { 1 };
            episodes.push(Episode {
                start_ms: start_ms + s as u64 * 3_600_000,
                end_ms: start_ms + h as u64 * 3_600_000,
                max_tier: tier,
                trigger: "slo_burn".into(),
                detail: format!("{peak} failures/h against a median of {median}"),
                steps: Vec::new(),
                refused: Vec::new(),
            });
        }
        h += 1;
    }
    Ok(WeekData {
        week: week.into(),
        cluster: cluster.into(),
        start_ms,
        slos,
        episodes,
        patterns,
        as_of_ms: None,
        refusals: Vec::new(),
        instance_actions: Vec::new(),
        slos_without_data: Vec::new(),
    })
}

/// Runs `brownout report`.
///
/// # Errors
/// A bad week, an unreadable or invalid data or playbook file, an unwritable output.
pub async fn run(args: ReportArgs) -> anyhow::Result<()> {
    week_start_ms(&args.week)?;
    let data = match &args.data {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            serde_json::from_str::<WeekData>(&text)
                .with_context(|| format!("{}: not a WeekData document", p.display()))?
        }
        None if args.synth => synth_week(&args.week, &args.cluster, args.seed, 8000)?,
        None => {
            let config = crate::config::Config::load(args.config.as_deref())
                .context("loading the config")?;
            let st = crate::store::open(&config)
                .await
                .context("opening the store")?;
            let slos = crate::defaults::slos_or(config.slo_file.as_deref())?;
            store::week_data(st.as_ref(), &slos, &args.week, &args.cluster).await?
        }
    };
    let mut playbook = Playbook::bundled();
    if let Some(p) = &args.playbook {
        let text =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        playbook = playbook.extended_by(Playbook::parse(&p.display().to_string(), &text)?);
    }
    let report = build(&data, &playbook);
    let out = match (args.format, args.item) {
        (Format::GithubMd, Some(n)) => export::github_md(&report, Some(n))
            .with_context(|| format!("--item {n}: the report has no roadmap item {n}"))?,
        (_, Some(_)) => anyhow::bail!("--item goes with --format github-md"),
        (f, None) => render(&report, f)?,
    };
    match &args.out {
        Some(p) => std::fs::write(p, out).with_context(|| format!("writing {}", p.display()))?,
        None => print!("{out}"),
    }
    Ok(())
}
