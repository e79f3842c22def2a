//! The results: the Markdown table, the summary JSON, the machine's load average.

use super::cli::*;
use super::measure::*;

pub(super) fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

pub(super) fn opt_s(x: Option<f64>) -> String {
    x.map_or("—".into(), |s| format!("{s:.1} s"))
}

/// One row of the table: its cell for a configuration.
type Row = Box<dyn Fn(&Figures) -> String>;

/// The results as a Markdown table (configurations as columns).
pub fn markdown_table(runs: &[(Setup, &Figures)]) -> String {
    let mut s = String::from("| |");
    for (c, _) in runs {
        s.push_str(&format!(" {} |", c.as_str()));
    }
    s.push_str("\n|---|");
    for _ in runs {
        s.push_str("---|");
    }
    s.push('\n');
    let rows: Vec<(&str, Row)> = vec![
        (
            "flow goodput, whole run (flows/s)",
            Box::new(|f| format!("{:.2}", f.flow_goodput_per_s)),
        ),
        (
            "flow goodput during the overload (flows/s)",
            Box::new(|f| {
                format!(
                    "{:.2} ({:.0}% of capacity)",
                    f.overload_goodput_per_s,
                    f.overload_goodput_vs_capacity * 100.0
                )
            }),
        ),
        (
            "critical flow success",
            Box::new(|f| pct(f.critical_flow_success_rate)),
        ),
        (
            "default flow success",
            Box::new(|f| pct(f.default_flow_success_rate)),
        ),
        (
            "sheddable flow success",
            Box::new(|f| pct(f.sheddable_flow_success_rate)),
        ),
        (
            "TTFT p50 / p99 critical",
            Box::new(|f| {
                format!(
                    "{:.2} / {:.2} s",
                    f.ttft_p50_s["critical"], f.ttft_p99_s["critical"]
                )
            }),
        ),
        (
            "TTFT p50 / p99 default",
            Box::new(|f| {
                format!(
                    "{:.2} / {:.2} s",
                    f.ttft_p50_s["default"], f.ttft_p99_s["default"]
                )
            }),
        ),
        (
            "TTFT p50 / p99 sheddable",
            Box::new(|f| {
                format!(
                    "{:.2} / {:.2} s",
                    f.ttft_p50_s["sheddable"], f.ttft_p99_s["sheddable"]
                )
            }),
        ),
        (
            "onset → first degradation",
            Box::new(|f| opt_s(f.onset_to_first_degradation_s)),
        ),
        (
            "overload end → back to T0",
            Box::new(|f| opt_s(f.back_to_t0_s)),
        ),
        (
            "tier changes / flaps / max tier",
            Box::new(|f| format!("{} / {} / T{}", f.tier_changes, f.flaps, f.max_tier)),
        ),
        (
            "decided (dry run) changes, first",
            Box::new(|f| {
                format!(
                    "{}, {}",
                    f.decided_tier_changes,
                    opt_s(f.decided_first_degradation_s)
                )
            }),
        ),
        (
            "users / flow tries / missed deadline",
            Box::new(|f| format!("{} / {} / {}", f.users, f.flows, f.deadline_missed)),
        ),
        (
            "shed / disabled / expired / hung up",
            Box::new(|f| {
                format!(
                    "{} / {} / {} / {}",
                    f.shed, f.disabled, f.expired, f.abandoned
                )
            }),
        ),
        (
            "call retries / flow retries",
            Box::new(|f| format!("{} / {}", f.call_retries, f.flow_retries)),
        ),
        (
            "wasted tokens (engine) / generated",
            Box::new(|f| {
                format!(
                    "{} / {}",
                    f.wasted_tokens,
                    f.generated_tokens.map_or("?".into(), |g| g.to_string())
                )
            }),
        ),
    ];
    for (name, f) in rows {
        s.push_str(&format!("| {name} |"));
        for (_, fig) in runs {
            s.push_str(&format!(" {} |", f(fig)));
        }
        s.push('\n');
    }
    s
}

/// The one-line JSON the benchmark prints last.
pub fn summary_json(runs: &[(Setup, &Figures)]) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (c, f) in runs {
        m.insert(
            c.as_str().into(),
            serde_json::to_value(f).unwrap_or_default(),
        );
    }
    serde_json::Value::Object(m)
}

/// The load average of the machine (it is shared; the results say so).
pub(super) fn load_average() -> Option<String> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}
