//! Server-rendered SVG charts: sparkline, line chart with threshold lines, tier timeline and gauge
//! bar. No JavaScript, no external library: each function returns a finished `<svg>` element.
//!
//! Every piece of text that reaches the SVG (series names, labels, tooltips) goes through
//! [`escape`]; numbers are formatted by us. So the result can be inserted into a page unescaped
//! (`| safe` in the templates) — [`Svg`] is the only type the templates trust that way.

use std::fmt::Write as _;

use brownout_protocol::Tier;
use serde::Serialize;

use super::model::{Point, Series, TierChange};

/// A finished SVG element. Only this module constructs it, which is what makes `| safe` sound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Svg(String);

impl Svg {
    /// The markup.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

pub use brownout_protocol::html::escape;

/// How the y axis labels a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum YFormat {
    /// 0.853 → `85%`.
    Percent,
    /// 1.25 → `1.25 s`.
    Seconds,
    /// Plain number.
    Plain,
}

impl YFormat {
    /// Formats `v` for an axis or tooltip.
    pub fn fmt(self, v: f64) -> String {
        match self {
            YFormat::Percent => format!("{:.0}%", v * 100.0),
            YFormat::Seconds if v < 1.0 => format!("{:.0} ms", v * 1000.0),
            YFormat::Seconds => format!("{v:.2} s"),
            YFormat::Plain if v.abs() >= 100.0 || v.fract() == 0.0 => format!("{v:.0}"),
            YFormat::Plain => format!("{v:.1}"),
        }
    }
}

/// A horizontal reference line (an SLO target, an alert threshold).
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    pub value: f64,
    pub label: String,
    /// `warn` or `crit` (a CSS class, not user input).
    pub severity: Severity,
}

/// Colour class of a threshold or gauge zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Warn,
    Crit,
}

impl Severity {
    fn class(self) -> &'static str {
        match self {
            Severity::Warn => "warn",
            Severity::Crit => "crit",
        }
    }
}

/// Options of [`line_chart`].
#[derive(Debug, Clone, PartialEq)]
pub struct LineOpts {
    pub width: u32,
    pub height: u32,
    /// Fixed y range; `None` fits the data (and the thresholds).
    pub y_range: Option<(f64, f64)>,
    pub y_format: YFormat,
    pub thresholds: Vec<Threshold>,
    /// Accessible name of the chart.
    pub title: String,
}

impl Default for LineOpts {
    fn default() -> Self {
        LineOpts {
            width: 560,
            height: 180,
            y_range: None,
            y_format: YFormat::Plain,
            thresholds: Vec::new(),
            title: String::new(),
        }
    }
}

/// Finite values only: NaN and infinities are dropped rather than poisoning the scale.
fn finite(points: &[Point]) -> impl Iterator<Item = &Point> {
    points.iter().filter(|p| p.value.is_finite())
}

fn time_range<'a>(series: impl Iterator<Item = &'a Point>) -> Option<(u64, u64)> {
    let mut lo = u64::MAX;
    let mut hi = 0;
    for p in series {
        lo = lo.min(p.ts_ms);
        hi = hi.max(p.ts_ms);
    }
    (lo <= hi).then_some((lo, hi))
}

/// A tiny trend line without axes (e.g. 120×28), last point marked.
pub fn sparkline(points: &[Point], width: u32, height: u32) -> Svg {
    let (w, h) = (f64::from(width), f64::from(height));
    let mut s = format!(
        r#"<svg class="spark" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="trend">"#
    );
    let pts: Vec<&Point> = finite(points).collect();
    if let Some((t0, t1)) = time_range(pts.iter().copied()) {
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for p in &pts {
            lo = lo.min(p.value);
            hi = hi.max(p.value);
        }
        if hi - lo < 1e-12 {
            hi = lo + 1.0;
        }
        let x = |t: u64| {
            if t1 == t0 {
                w / 2.0
            } else {
                1.0 + (t - t0) as f64 / (t1 - t0) as f64 * (w - 4.0)
            }
        };
        let y = |v: f64| 2.0 + (1.0 - unit(v, lo, hi)) * (h - 4.0);
        let mut d = String::new();
        for (i, p) in pts.iter().enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1}",
                if i == 0 { "M" } else { "L" },
                x(p.ts_ms),
                y(p.value)
            );
        }
        let _ = write!(s, r#"<path d="{d}" class="spark-line"/>"#);
        if let Some(last) = pts.last() {
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="2" class="spark-dot"/>"#,
                x(last.ts_ms),
                y(last.value)
            );
        }
    }
    s.push_str("</svg>");
    Svg(s)
}

/// Where `v` sits between `lo` and `hi` (0 at `lo`, 1 at `hi`); 0.5 when that is not a finite
/// number (infinite span, NaN), so no coordinate is ever NaN or infinite.
fn unit(v: f64, lo: f64, hi: f64) -> f64 {
    let f = (v - lo) / (hi - lo);
    if f.is_finite() { f } else { 0.5 }
}

fn nice_step(span: f64) -> f64 {
    let raw = span / 4.0;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let step = if norm < 1.5 {
        1.0
    } else if norm < 3.0 {
        2.0
    } else if norm < 7.0 {
        5.0
    } else {
        10.0
    };
    step * mag
}

/// An axis label for `ts_ms` on an axis spanning `span_ms`: `HH:MM` within a day and a half,
/// `MM-DD` beyond (a 30-day burn-down would otherwise read `03:50 03:50 03:50`).
fn axis_time(ts_ms: u64, span_ms: u64) -> String {
    let fmt = if span_ms > 36 * 3_600_000 {
        "%m-%d"
    } else {
        "%H:%M"
    };
    chrono::DateTime::from_timestamp_millis(i64::try_from(ts_ms).unwrap_or(0))
        .map(|t| t.format(fmt).to_string())
        .unwrap_or_default()
}

fn clock(ts_ms: u64) -> String {
    chrono::DateTime::from_timestamp_millis(i64::try_from(ts_ms).unwrap_or(0))
        .map(|t| t.format("%H:%M").to_string())
        .unwrap_or_default()
}

/// A line chart with axes, a legend and horizontal threshold lines.
pub fn line_chart(series: &[Series], opts: &LineOpts) -> Svg {
    const PAD_L: f64 = 52.0;
    const PAD_R: f64 = 12.0;
    const PAD_T: f64 = 10.0;
    const PAD_B: f64 = 38.0;
    let (width, height) = (opts.width, opts.height);
    let (w, h) = (f64::from(width), f64::from(height));
    let (pw, ph) = (w - PAD_L - PAD_R, h - PAD_T - PAD_B);
    let mut s = format!(
        r#"<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{}"><title>{}</title>"#,
        escape(&opts.title),
        escape(&opts.title)
    );
    let all = || series.iter().flat_map(|se| finite(&se.points));
    let Some((t0, t1)) = time_range(all()) else {
        let _ = write!(
            s,
            r#"<text x="{:.0}" y="{:.0}" class="empty" text-anchor="middle">no data</text></svg>"#,
            w / 2.0,
            h / 2.0
        );
        return Svg(s);
    };
    let (lo, hi) = match opts.y_range {
        Some(r) => r,
        None => {
            let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
            for v in all().map(|p| p.value).chain(
                opts.thresholds
                    .iter()
                    .map(|t| t.value)
                    .filter(|v| v.is_finite()),
            ) {
                lo = lo.min(v);
                hi = hi.max(v);
            }
            let lo = if lo >= 0.0 { 0.0 } else { lo };
            let hi = if hi - lo < 1e-12 { lo + 1.0 } else { hi * 1.1 };
            (lo, hi)
        }
    };
    let x = |t: u64| {
        if t1 == t0 {
            PAD_L + pw / 2.0
        } else {
            PAD_L + (t - t0) as f64 / (t1 - t0) as f64 * pw
        }
    };
    let y = |v: f64| PAD_T + (1.0 - unit(v, lo, hi).clamp(-0.05, 1.05)) * ph;

    // Grid and y labels.
    let step = nice_step(hi - lo);
    let mut v = (lo / step).ceil() * step;
    let mut lines = 0;
    while step.is_finite() && step > 0.0 && v.is_finite() && v <= hi + step * 1e-9 && lines < 12 {
        lines += 1;
        let yy = y(v);
        let _ = write!(
            s,
            r#"<line x1="{PAD_L}" x2="{:.1}" y1="{yy:.1}" y2="{yy:.1}" class="grid"/><text x="{:.1}" y="{:.1}" class="axis" text-anchor="end">{}</text>"#,
            PAD_L + pw,
            PAD_L - 6.0,
            yy + 4.0,
            escape(&opts.y_format.fmt(v))
        );
        v += step;
    }
    // X labels: start, middle, end.
    for (t, anchor) in [(t0, "start"), (t0 + (t1 - t0) / 2, "middle"), (t1, "end")] {
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" class="axis" text-anchor="{anchor}">{}</text>"#,
            x(t),
            PAD_T + ph + 16.0,
            axis_time(t, t1 - t0)
        );
    }
    // Thresholds.
    for th in opts.thresholds.iter().filter(|t| t.value.is_finite()) {
        let yy = y(th.value);
        let _ = write!(
            s,
            r#"<line x1="{PAD_L}" x2="{:.1}" y1="{yy:.1}" y2="{yy:.1}" class="threshold {}"><title>{}</title></line><text x="{:.1}" y="{:.1}" class="threshold-label {}" text-anchor="end">{}</text>"#,
            PAD_L + pw,
            th.severity.class(),
            escape(&th.label),
            PAD_L + pw - 2.0,
            if th.severity == Severity::Warn {
                yy + 11.0
            } else {
                yy - 3.0
            },
            th.severity.class(),
            escape(&th.label)
        );
    }
    // Series.
    let mut legend_x = PAD_L;
    for (i, se) in series.iter().enumerate() {
        let class = format!("s{}", i % 6);
        let mut d = String::new();
        for (j, p) in finite(&se.points).enumerate() {
            let _ = write!(
                d,
                "{}{:.1},{:.1}",
                if j == 0 { "M" } else { "L" },
                x(p.ts_ms),
                y(p.value)
            );
        }
        let last = finite(&se.points)
            .last()
            .map(|p| opts.y_format.fmt(p.value))
            .unwrap_or_default();
        let _ = write!(
            s,
            r#"<path d="{d}" class="line {class}"><title>{}: {}</title></path>"#,
            escape(&se.name),
            escape(&last)
        );
        if series.len() > 1 || !se.name.is_empty() {
            let label = escape(&se.name);
            let _ = write!(
                s,
                r#"<rect x="{legend_x:.1}" y="{:.1}" width="10" height="10" class="swatch {class}"/><text x="{:.1}" y="{:.1}" class="legend">{label}</text>"#,
                h - 12.0,
                legend_x + 14.0,
                h - 3.0
            );
            legend_x += 24.0 + 7.0 * se.name.chars().count().min(24) as f64;
        }
    }
    s.push_str("</svg>");
    Svg(s)
}

fn tier_class(t: Tier) -> &'static str {
    match t {
        Tier::T0 => "t0",
        Tier::T1 => "t1",
        Tier::T2 => "t2",
        Tier::T3 => "t3",
    }
}

/// The tier over time as a stepped band: height and colour grow with the tier, each segment has
/// a tooltip with its reason. `changes` is oldest first; each lasts until the next (the last until
/// `end_ms`). Segments before `start_ms` are clipped.
pub fn tier_timeline(changes: &[TierChange], start_ms: u64, end_ms: u64, width: u32) -> Svg {
    const PAD_L: f64 = 28.0;
    const ROW: f64 = 14.0;
    let height = 4.0 * ROW + 24.0;
    let w = f64::from(width);
    let pw = w - PAD_L - 8.0;
    let mut s = format!(
        r#"<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height:.0}" viewBox="0 0 {width} {height:.0}" role="img" aria-label="tier timeline">"#
    );
    for t in Tier::ALL {
        let yy = 4.0 + (3 - t.as_u8()) as f64 * ROW;
        let _ = write!(
            s,
            r#"<text x="2" y="{:.1}" class="axis">{t}</text><line x1="{PAD_L}" x2="{:.1}" y1="{:.1}" y2="{:.1}" class="grid"/>"#,
            yy + ROW - 3.0,
            PAD_L + pw,
            yy + ROW,
            yy + ROW
        );
    }
    let span = end_ms.saturating_sub(start_ms).max(1) as f64;
    let x = |t: u64| PAD_L + (t.clamp(start_ms, end_ms) - start_ms) as f64 / span * pw;
    for (i, c) in changes.iter().enumerate() {
        let until = changes.get(i + 1).map_or(end_ms, |n| n.ts_ms);
        if until <= start_ms || c.ts_ms >= end_ms {
            continue;
        }
        let (x0, x1) = (x(c.ts_ms), x(until));
        let level = f64::from(c.tier.as_u8());
        let top = 4.0 + (3.0 - level) * ROW;
        let bar_h = (level + 1.0) * ROW;
        let tip = format!(
            "{} from {} — {}{}",
            c.tier,
            clock(c.ts_ms),
            c.reason.trigger,
            if c.reason.detail.is_empty() {
                String::new()
            } else {
                format!(": {}", c.reason.detail)
            }
        );
        let _ = write!(
            s,
            r#"<rect x="{x0:.1}" y="{top:.1}" width="{:.1}" height="{bar_h:.1}" class="tier {}"><title>{}</title></rect>"#,
            (x1 - x0).max(1.0),
            tier_class(c.tier),
            escape(&tip)
        );
    }
    let mid = start_ms + end_ms.saturating_sub(start_ms) / 2;
    for (t, anchor) in [(start_ms, "start"), (mid, "middle"), (end_ms, "end")] {
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}" class="axis" text-anchor="{anchor}">{}</text>"#,
            x(t),
            height - 4.0,
            axis_time(t, end_ms.saturating_sub(start_ms))
        );
    }
    s.push_str("</svg>");
    Svg(s)
}

/// A horizontal bar for a 0–1 ratio, coloured by zone, with tick marks at `warn` and `crit` and
/// the value (or `text`, when given) to its right.
pub fn gauge_bar(ratio: f64, warn: f64, crit: f64, label: &str, text: Option<&str>) -> Svg {
    let zone = if ratio >= crit {
        "crit"
    } else if ratio >= warn {
        "warn"
    } else {
        "ok"
    };
    let value = if ratio.is_finite() {
        format!("{:.0}%", ratio * 100.0)
    } else {
        "n/a".into()
    };
    let shown = escape(text.unwrap_or(&value));
    let label = escape(label);
    bar(BarParts {
        class: "gauge",
        title: &format!("{label}: {shown}"),
        fill: ratio,
        zone,
        ticks: [(warn, "warn"), (crit, "crit")],
        shown: &shown,
    })
}

/// The bar of an error budget: filled by what is *left* (full at 100 %, empty when spent or
/// overspent), amber from half spent, red from three quarters spent, with ticks there, and
/// `text` (the remaining budget as shown) to its right and in its tooltip.
pub fn budget_bar(remaining: f64, text: &str) -> Svg {
    let zone = if !remaining.is_finite() || remaining <= 0.25 {
        "crit"
    } else if remaining <= 0.5 {
        "warn"
    } else {
        "ok"
    };
    let shown = escape(text);
    bar(BarParts {
        class: "gauge budget",
        title: &format!("error budget left: {shown}"),
        fill: remaining,
        zone,
        ticks: [(0.5, "warn"), (0.25, "crit")],
        shown: &shown,
    })
}

/// What tells one bar ([`gauge_bar`], [`budget_bar`]) from another; the text is escaped already.
struct BarParts<'a> {
    class: &'static str,
    title: &'a str,
    /// How much of the bar is filled, 0–1 (clamped; not finite: empty).
    fill: f64,
    zone: &'static str,
    /// Tick marks at these 0–1 positions (one outside the bar is not drawn).
    ticks: [(f64, &'static str); 2],
    shown: &'a str,
}

/// A 150×14 bar: the background, the fill in its zone's colour, the ticks, and the shown value
/// to its right; the title is its tooltip and accessible name.
fn bar(p: BarParts<'_>) -> Svg {
    const W: f64 = 150.0;
    const BAR: f64 = 96.0;
    const H: f64 = 14.0;
    let BarParts {
        class,
        title,
        fill,
        zone,
        ticks,
        shown,
    } = p;
    let fill = if fill.is_finite() {
        fill.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let mut s = format!(
        r#"<svg class="{class}" xmlns="http://www.w3.org/2000/svg" width="{W:.0}" height="{H:.0}" viewBox="0 0 {W:.0} {H:.0}" role="img" aria-label="{title}"><title>{title}</title><rect x="0" y="1" width="{BAR:.0}" height="{:.0}" class="gauge-bg"/><rect x="0" y="1" width="{:.1}" height="{:.0}" class="gauge-fill {zone}"/>"#,
        H - 2.0,
        fill * BAR,
        H - 2.0,
    );
    for (v, class) in ticks {
        if (0.0..=1.0).contains(&v) {
            let _ = write!(
                s,
                r#"<line x1="{0:.1}" x2="{0:.1}" y1="0" y2="{H:.0}" class="tick {class}"/>"#,
                v * BAR
            );
        }
    }
    let _ = write!(
        s,
        r#"<text x="{:.0}" y="11" class="gauge-text">{shown}</text></svg>"#,
        BAR + 6.0
    );
    Svg(s)
}

/// A window name (`5m`, `1h`, `3d`, `30s`, `1w`, or compound like `2m30s`) in seconds; `None`
/// when it is not one.
pub fn window_secs(w: &str) -> Option<u64> {
    let mut rest = w.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0u64;
    while !rest.is_empty() {
        let split = rest.find(|c: char| !c.is_ascii_digit())?;
        let (n, tail) = rest.split_at(split);
        let n: u64 = n.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let mult = match unit {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            "w" => 7 * 86_400,
            _ => return None,
        };
        total = total.checked_add(n.checked_mul(mult)?)?;
        rest = next;
    }
    Some(total)
}

/// The union of the windows in `lists`, shortest first (names that are no duration last, in
/// the order first seen): the columns of a table whose rows have different windows.
pub fn window_union<'a>(lists: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for w in lists {
        if !out.iter().any(|o| o == w) {
            out.push(w.to_string());
        }
    }
    // Stable: unknown names keep their first-seen order.
    out.sort_by_key(|w| window_secs(w).unwrap_or(u64::MAX));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use brownout_protocol::Reason;

    fn pts(vals: &[f64]) -> Vec<Point> {
        vals.iter()
            .enumerate()
            .map(|(i, v)| Point {
                ts_ms: i as u64 * 60_000,
                value: *v,
            })
            .collect()
    }

    #[test]
    fn escape_covers_markup_characters() {
        assert_eq!(
            escape(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }

    #[test]
    fn text_in_charts_is_escaped() {
        let evil = "</text><script>alert(1)</script>";
        let line = line_chart(
            &[Series {
                name: evil.into(),
                points: pts(&[1.0, 2.0]),
            }],
            &LineOpts {
                title: evil.into(),
                thresholds: vec![Threshold {
                    value: 1.5,
                    label: evil.into(),
                    severity: Severity::Crit,
                }],
                ..LineOpts::default()
            },
        );
        let reason = Reason {
            trigger: evil.into(),
            detail: evil.into(),
            ..Reason::default()
        };
        let tl = tier_timeline(
            &[TierChange {
                ts_ms: 0,
                tier: Tier::T2,
                reason,
                version: 1,
            }],
            0,
            10,
            300,
        );
        let g = gauge_bar(0.5, 0.85, 0.92, evil, Some(evil));
        for svg in [line, tl, g] {
            assert!(!svg.as_str().contains("<script>"), "{}", svg.as_str());
            assert!(svg.as_str().contains("&lt;script&gt;"));
        }
    }

    #[test]
    fn empty_and_non_finite_input_render_without_panicking() {
        let empty = line_chart(&[], &LineOpts::default());
        assert!(empty.as_str().contains("no data"));
        let nan = sparkline(&pts(&[f64::NAN, f64::INFINITY]), 100, 20);
        assert!(!nan.as_str().contains("NaN"));
        let one = sparkline(&pts(&[3.0]), 100, 20);
        assert!(one.as_str().contains("<circle"));
        assert!(
            gauge_bar(f64::NAN, 0.8, 0.9, "x", None)
                .as_str()
                .contains("n/a")
        );
    }

    #[test]
    fn budget_bar_is_full_when_untouched_and_empty_when_spent() {
        let full = budget_bar(1.0, "100.0%");
        assert!(
            full.as_str()
                .contains(r#"width="96.0" height="12" class="gauge-fill ok""#)
        );
        assert!(
            full.as_str()
                .contains("<title>error budget left: 100.0%</title>")
        );
        assert!(!full.as_str().contains("used"));
        let half = budget_bar(0.4, "40.0%");
        assert!(
            half.as_str()
                .contains(r#"width="38.4" height="12" class="gauge-fill warn""#)
        );
        let spent = budget_bar(-3.2, "-320.0%");
        assert!(
            spent
                .as_str()
                .contains(r#"width="0.0" height="12" class="gauge-fill crit""#)
        );
    }

    #[test]
    fn window_union_orders_by_duration() {
        assert_eq!(window_secs("5m"), Some(300));
        assert_eq!(window_secs("3d"), Some(259_200));
        assert_eq!(window_secs("soon"), None);
        assert_eq!(window_secs("2m30s"), Some(150));
        assert_eq!(window_secs("1h5"), None);
        assert_eq!(window_secs(""), None);
        // The demo's timeslice SLO has a 2m30s window: it sorts by its length (first), not last.
        assert_eq!(
            window_union(["1h", "6h", "3d", "5m", "2m30s", "30m", "1h", "6h", "x"]),
            vec!["2m30s", "5m", "30m", "1h", "6h", "3d", "x"]
        );
    }

    #[test]
    fn gauge_zone_follows_thresholds() {
        let cases = [
            (0.5, "gauge-fill ok"),
            (0.86, "gauge-fill warn"),
            (0.95, "gauge-fill crit"),
            (1.7, "gauge-fill crit"),
        ];
        for (ratio, class) in cases {
            assert!(
                gauge_bar(ratio, 0.85, 0.92, "kv", None)
                    .as_str()
                    .contains(class),
                "{ratio}"
            );
        }
    }

    #[test]
    fn threshold_line_sits_at_its_value() {
        let svg = line_chart(
            &[Series {
                name: "p99".into(),
                points: pts(&[0.0, 4.0]),
            }],
            &LineOpts {
                height: 148,
                y_range: Some((0.0, 4.0)),
                thresholds: vec![Threshold {
                    value: 2.0,
                    label: "SLO 2 s".into(),
                    severity: Severity::Crit,
                }],
                ..LineOpts::default()
            },
        );
        // Plot height 100 from y=10: value 2 of 0–4 sits at y=60.
        assert!(
            svg.as_str()
                .contains(r#"y1="60.0" y2="60.0" class="threshold crit""#),
            "{}",
            svg.as_str()
        );
    }

    #[test]
    fn long_axes_show_dates_short_axes_show_times() {
        let day = 24 * 3_600_000;
        let month = line_chart(
            &[Series {
                name: String::new(),
                points: pts(&[0.0])
                    .into_iter()
                    .chain([Point {
                        ts_ms: 30 * day,
                        value: 1.0,
                    }])
                    .collect(),
            }],
            &LineOpts::default(),
        );
        assert!(
            month.as_str().contains(">01-01<") && month.as_str().contains(">01-31<"),
            "{}",
            month.as_str()
        );
        let hour = line_chart(
            &[Series {
                name: String::new(),
                points: pts(&[0.0, 1.0]),
            }],
            &LineOpts::default(),
        );
        assert!(hour.as_str().contains(">00:00<") && hour.as_str().contains(">00:01<"));
    }

    #[test]
    fn timeline_clips_to_window_and_sizes_by_tier() {
        let r = Reason::default();
        let changes = [
            TierChange {
                ts_ms: 0,
                tier: Tier::T1,
                reason: r.clone(),
                version: 1,
            },
            TierChange {
                ts_ms: 500,
                tier: Tier::T3,
                reason: r.clone(),
                version: 2,
            },
            TierChange {
                ts_ms: 2_000,
                tier: Tier::T0,
                reason: r,
                version: 3,
            },
        ];
        let svg = tier_timeline(&changes, 250, 1_000, 128);
        let s = svg.as_str();
        assert_eq!(
            s.matches("class=\"tier ").count(),
            2,
            "the change after the window is dropped"
        );
        assert!(s.contains("class=\"tier t1\"") && s.contains("class=\"tier t3\""));
    }

    proptest::proptest! {
        /// Any text and any numbers: no panic, and no character of markup from the input
        /// survives unescaped.
        #[test]
        fn charts_never_panic_and_always_escape(
            name in "\\PC{0,24}",
            values in proptest::collection::vec(proptest::num::f64::ANY, 0..20),
            ratio in proptest::num::f64::ANY,
            start in 0u64..2_000_000,
            span in 0u64..2_000_000,
        ) {
            let name = format!("<{name}>");
            let points: Vec<Point> =
                values.iter().enumerate().map(|(i, v)| Point { ts_ms: start + i as u64 * 1_000, value: *v }).collect();
            let series = [Series { name: name.clone(), points: points.clone() }];
            let th = vec![Threshold { value: ratio, label: name.clone(), severity: Severity::Warn }];
            let reason = Reason { trigger: name.clone(), detail: name.clone(), ..Reason::default() };
            let change = TierChange { ts_ms: start, tier: Tier::T1, reason, version: 1 };
            let svgs = [
                line_chart(&series, &LineOpts { thresholds: th, title: name.clone(), ..LineOpts::default() }),
                sparkline(&points, 100, 20),
                tier_timeline(&[change], start, start + span, 300),
                gauge_bar(ratio, 0.85, 0.92, &name, Some(&name)),
            ];
            for svg in svgs {
                proptest::prop_assert!(!svg.as_str().contains(&name), "raw input in {}", svg.as_str());
                if !name.contains("NaN") && !name.contains("inf") {
                    proptest::prop_assert!(!svg.as_str().contains("NaN") && !svg.as_str().contains("inf"), "{}", svg.as_str());
                }
            }
        }
    }
}
