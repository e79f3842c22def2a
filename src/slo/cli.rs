//! `brownout slo check | rules | eval | bench`.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context as _;
use brownout_protocol::{Criticality, FailureEvent};

use super::eval::{Evaluator, EventKind, Observation, SloStatus};
use super::{bench, rules, spec};

/// Command-line arguments of `brownout slo`.
#[derive(Debug, clap::Args)]
pub struct SloArgs {
    #[command(subcommand)]
    pub cmd: SloCmd,
}

#[derive(Debug, clap::Subcommand)]
pub enum SloCmd {
    /// Validate spec files (brownout/v1, Sloth prometheus/v1, OpenSLO v1) and list their SLOs.
    Check {
        #[arg(required = true)]
        specs: Vec<PathBuf>,
    },
    /// Print Prometheus recording and alerting rules (YAML) for the SLOs in the spec files.
    Rules {
        #[arg(required = true)]
        specs: Vec<PathBuf>,
        /// Write to this file instead of standard output.
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
    /// Evaluate SLOs over NDJSON events (request lines and failure events) and print status.
    Eval {
        #[arg(required = true)]
        specs: Vec<PathBuf>,
        /// NDJSON file: request events `{"ts", "service", "ok", …}` and failure events.
        #[arg(long)]
        events: PathBuf,
        /// Evaluate at this instant (RFC 3339 or unix ms); default: the last event's time.
        #[arg(long)]
        at: Option<String>,
        /// Step of the alert state machines while replaying, e.g. 10s.
        #[arg(long, default_value = "10s")]
        step: String,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Measure evaluation cost: N SLOs, M events spread over the window.
    Bench {
        #[arg(long, default_value_t = 100)]
        slos: usize,
        #[arg(long, default_value_t = 10_000_000)]
        events: u64,
        /// How far back the events go.
        #[arg(long, default_value = "28d")]
        span: String,
    },
}

/// Runs `brownout slo`.
///
/// # Errors
/// Bad specs (with file, field and reason), unreadable files, bad event lines.
pub async fn run(args: SloArgs) -> anyhow::Result<()> {
    match args.cmd {
        SloCmd::Check { specs } => {
            let slos = spec::load_files(&specs)?;
            for s in &slos {
                println!(
                    "{}\t{}\t{}%\t{}\t{:?}\t{}",
                    s.name,
                    s.service,
                    s.objective_ratio * 100.0,
                    s.period.label(),
                    s.source.format,
                    s.source.file
                );
            }
            eprintln!("{} SLO(s) valid", slos.len());
            Ok(())
        }
        SloCmd::Rules { specs, out } => {
            let slos = spec::load_files(&specs)?;
            let yaml = rules::generate(&slos)?;
            match out {
                Some(p) => {
                    std::fs::write(&p, yaml).with_context(|| format!("writing {}", p.display()))?
                }
                None => std::io::stdout().write_all(yaml.as_bytes())?,
            }
            Ok(())
        }
        SloCmd::Eval {
            specs,
            events,
            at,
            step,
            json,
        } => {
            let slos = spec::load_files(&specs)?;
            let step_ms = super::duration::parse_secs(&step).context("--step")? * 1000;
            let text = std::fs::read_to_string(&events)
                .with_context(|| format!("reading {}", events.display()))?;
            let lines = parse_events(&text).with_context(|| events.display().to_string())?;
            let at_ms = match at {
                Some(t) => Some(parse_instant(&t).context("--at")?),
                None => None,
            };
            let (statuses, transitions) = replay(Evaluator::new(slos), &lines, step_ms, at_ms);
            if json {
                println!("{}", serde_json::to_string_pretty(&statuses)?);
            } else {
                for t in &transitions {
                    println!("{t}");
                }
                print!("{}", render_statuses(&statuses));
            }
            Ok(())
        }
        SloCmd::Bench { slos, events, span } => {
            let span_secs = super::duration::parse_secs(&span).context("--span")?;
            let r = tokio::task::spawn_blocking(move || bench::run(slos, events, span_secs * 1000))
                .await?;
            println!("{r}");
            Ok(())
        }
    }
}

/// One event line of `slo eval`, owned.
#[derive(Debug, Clone, PartialEq)]
pub struct EventLine {
    pub ts_ms: u64,
    pub kind: EventKind,
    pub service: String,
    pub feature: String,
    pub criticality: Criticality,
    pub ok: bool,
    /// Refused on purpose (docs/SLO.md "Deliberate refusals").
    pub deliberate: bool,
    pub latency_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
}

impl EventLine {
    pub fn observation(&self) -> Observation<'_> {
        Observation {
            ts_ms: self.ts_ms,
            kind: self.kind,
            service: &self.service,
            feature: &self.feature,
            criticality: self.criticality,
            ok: self.ok,
            deliberate: self.deliberate,
            latency_ms: self.latency_ms,
            ttft_ms: self.ttft_ms,
        }
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequestLine {
    ts: serde_json::Value,
    #[serde(default = "default_kind")]
    kind: EventKind,
    service: String,
    #[serde(default)]
    feature: String,
    #[serde(default)]
    criticality: Option<String>,
    ok: bool,
    #[serde(default)]
    deliberate: bool,
    #[serde(default)]
    latency_ms: Option<f64>,
    #[serde(default)]
    ttft_ms: Option<f64>,
}

fn default_kind() -> EventKind {
    EventKind::Request
}

/// Parses NDJSON: a line with an `ok` field is a request/task event, any other line a failure
/// event (docs/ARCHITECTURE.md §5, docs/PROTOCOL.md). Blank lines are skipped.
///
/// # Errors
/// The first bad line, with its number and reason.
pub fn parse_events(text: &str) -> anyhow::Result<Vec<EventLine>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("line {n}"))?;
        if value.get("ok").is_some() {
            let r: RawRequestLine =
                serde_json::from_value(value).with_context(|| format!("line {n}"))?;
            let ts_ms = match &r.ts {
                serde_json::Value::Number(x) => x.as_u64().context("ts must be unix ms ≥ 0")?,
                serde_json::Value::String(s) => parse_instant(s)?,
                _ => anyhow::bail!("line {n}: ts must be RFC 3339 text or unix ms"),
            };
            let criticality = match r.criticality.as_deref() {
                None | Some("") => Criticality::Default,
                Some(c) => {
                    Criticality::parse(c).with_context(|| format!("line {n}: criticality {c:?}"))?
                }
            };
            for (name, v) in [("latency_ms", r.latency_ms), ("ttft_ms", r.ttft_ms)] {
                if v.is_some_and(|x| !x.is_finite() || x < 0.0) {
                    anyhow::bail!("line {n}: {name} must be a finite number ≥ 0");
                }
            }
            out.push(EventLine {
                ts_ms,
                kind: r.kind,
                service: r.service,
                feature: r.feature,
                criticality,
                ok: r.ok,
                deliberate: r.deliberate,
                latency_ms: r.latency_ms,
                ttft_ms: r.ttft_ms,
            });
        } else {
            let ev = FailureEvent::parse_line(line.as_bytes())
                .map_err(|e| anyhow::anyhow!("line {n}: {e}"))?;
            let o = Observation::from_failure(&ev);
            out.push(EventLine {
                ts_ms: o.ts_ms,
                kind: o.kind,
                service: ev.service.clone(),
                feature: ev.feature.clone(),
                criticality: o.criticality,
                ok: false,
                deliberate: o.deliberate,
                latency_ms: o.latency_ms,
                ttft_ms: None,
            });
        }
    }
    Ok(out)
}

fn parse_instant(s: &str) -> anyhow::Result<u64> {
    if let Ok(ms) = s.parse::<u64>() {
        return Ok(ms);
    }
    let t = chrono::DateTime::parse_from_rfc3339(s)
        .with_context(|| format!("{s:?} is not RFC 3339 or unix ms"))?;
    u64::try_from(t.timestamp_millis()).context("before 1970")
}

/// Replays events in time order, evaluating every `step_ms` of event time so alert state
/// machines see the same sequence a live evaluator would; returns the final statuses (at `at_ms`
/// or the last event) and every alert state change as a line of text.
pub fn replay(
    mut ev: Evaluator,
    lines: &[EventLine],
    step_ms: u64,
    at_ms: Option<u64>,
) -> (Vec<SloStatus>, Vec<String>) {
    let mut sorted: Vec<&EventLine> = lines.iter().collect();
    sorted.sort_by_key(|l| l.ts_ms);
    let end = at_ms.unwrap_or_else(|| sorted.last().map_or(0, |l| l.ts_ms));
    let mut transitions = Vec::new();
    let mut last_states: Vec<Vec<&'static str>> = Vec::new();
    let mut observe = |statuses: &[SloStatus], at: u64, transitions: &mut Vec<String>| {
        if last_states.is_empty() {
            last_states = statuses
                .iter()
                .map(|s| s.alerts.iter().map(|_| "inactive").collect())
                .collect();
        }
        for (s, prev) in statuses.iter().zip(last_states.iter_mut()) {
            for (a, p) in s.alerts.iter().zip(prev.iter_mut()) {
                let now = a.state.name();
                if now != *p {
                    transitions.push(format!(
                        "{} {} {} {} {} -> {} (burn {:.2}/{:.2}, factor {})",
                        fmt_ts(at),
                        s.name,
                        a.severity.as_str(),
                        a.window,
                        p,
                        now,
                        a.long_burn_rate,
                        a.short_burn_rate,
                        a.factor
                    ));
                    *p = now;
                }
            }
        }
    };
    let mut next_eval = sorted
        .first()
        .map_or(end, |l| (l.ts_ms / step_ms + 1) * step_ms);
    for l in sorted.iter().filter(|l| l.ts_ms <= end) {
        while l.ts_ms >= next_eval && next_eval < end {
            let st = ev.evaluate(next_eval);
            observe(&st, next_eval, &mut transitions);
            next_eval += step_ms;
        }
        ev.record(&l.observation());
    }
    while next_eval < end {
        let st = ev.evaluate(next_eval);
        observe(&st, next_eval, &mut transitions);
        next_eval += step_ms;
    }
    let st = ev.evaluate(end);
    observe(&st, end, &mut transitions);
    (st, transitions)
}

fn fmt_ts(ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(ms as i64).map_or_else(
        || ms.to_string(),
        |t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
    )
}

/// A plain-text table of statuses.
pub fn render_statuses(statuses: &[SloStatus]) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    for s in statuses {
        let _ = writeln!(
            o,
            "{} (service {}, objective {}%, period {}) at {}",
            s.name,
            s.service,
            s.objective * 100.0,
            s.period,
            fmt_ts(s.evaluated_at_ms)
        );
        let _ = writeln!(
            o,
            "  budget remaining {:.1}% ({} bad of {} in period), exhausted in {}",
            s.budget_remaining_ratio * 100.0,
            s.period_events.bad(),
            s.period_events.total,
            s.time_to_exhaustion_secs.map_or_else(
                || "never at this rate".to_string(),
                |t| super::duration::format_secs(t as u64)
            ),
        );
        let burns: Vec<String> = s
            .burn_rates
            .iter()
            .map(|w| format!("{} {:.2}x", w.window, w.burn_rate))
            .collect();
        let _ = writeln!(o, "  burn rate: {}", burns.join(", "));
        for a in &s.alerts {
            let since = match a.state {
                super::alert::AlertState::Inactive => String::new(),
                super::alert::AlertState::Pending { since_ms }
                | super::alert::AlertState::Firing { since_ms } => {
                    format!(" since {}", fmt_ts(since_ms))
                }
                super::alert::AlertState::Resolved {
                    since_ms,
                    fired_since_ms,
                } => {
                    format!(
                        " at {} (fired since {})",
                        fmt_ts(since_ms),
                        fmt_ts(fired_since_ms)
                    )
                }
            };
            let _ = writeln!(
                o,
                "  {:<6} {:<9} {:<9} factor {:<8} {}{}",
                a.severity.as_str(),
                a.window,
                a.state.name(),
                a.factor,
                a.alert,
                since
            );
        }
    }
    o
}
