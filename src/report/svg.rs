//! Inline SVG charts: built from numbers and escaped text only, so they are safe to embed
//! unescaped in the HTML (and they print: no scripts, no external assets).

use super::escape::html as escape;
use super::model::{SloWeek, TopPattern};

const W: f64 = 640.0;
const H: f64 = 220.0;
const PAD_L: f64 = 48.0;
const PAD_R: f64 = 150.0;
const PAD_T: f64 = 16.0;
const PAD_B: f64 = 28.0;
const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];
const DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];

fn frame(title: &str, y_max_label: &str, body: &str) -> String {
    let mut s = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="100%" role="img" aria-label="{t}"><title>{t}</title>"##,
        t = escape(title)
    );
    let (x0, x1, y0, y1) = (PAD_L, W - PAD_R, PAD_T, H - PAD_B);
    s.push_str(&format!(
        r##"<rect x="{x0}" y="{y0}" width="{}" height="{}" fill="none" stroke="#bbb"/>"##,
        x1 - x0,
        y1 - y0
    ));
    s.push_str(&format!(
        r##"<text x="{}" y="{}" font-size="10" text-anchor="end">{}</text>"##,
        x0 - 4.0,
        y0 + 8.0,
        escape(y_max_label)
    ));
    s.push_str(&format!(
        r##"<text x="{}" y="{}" font-size="10" text-anchor="end">0</text>"##,
        x0 - 4.0,
        y1
    ));
    for (i, d) in DAYS.iter().enumerate() {
        let x = x0 + (x1 - x0) * (i as f64 + 0.5) / 7.0;
        s.push_str(&format!(
            r##"<text x="{x:.1}" y="{:.1}" font-size="10" text-anchor="middle">{d}</text>"##,
            H - 10.0
        ));
    }
    s.push_str(body);
    s.push_str("</svg>");
    s
}

fn polyline(values: &[f64], max: f64, color: &str) -> String {
    let (x0, x1, y0, y1) = (PAD_L, W - PAD_R, PAD_T, H - PAD_B);
    let pts: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let x = x0 + (x1 - x0) * (i as f64 + 0.5) / 7.0;
            let y = y1 - (y1 - y0) * (v / max).clamp(0.0, 1.0);
            format!("{x:.1},{y:.1}")
        })
        .collect();
    format!(
        r##"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"##,
        pts.join(" ")
    )
}

fn legend(i: usize, label: &str, color: &str) -> String {
    let y = PAD_T + 12.0 + i as f64 * 16.0;
    let mut l: String = label.chars().take(22).collect();
    if label.chars().count() > 22 {
        l.push('…');
    }
    format!(
        r##"<rect x="{}" y="{}" width="10" height="10" fill="{color}"/><text x="{}" y="{}" font-size="10">{}</text>"##,
        W - PAD_R + 8.0,
        y - 9.0,
        W - PAD_R + 22.0,
        y,
        escape(&l)
    )
}

fn no_data(title: &str) -> String {
    frame(
        title,
        "",
        &format!(
            r##"<text x="{}" y="{}" font-size="13" text-anchor="middle" fill="#666">no data this week</text>"##,
            (PAD_L + W - PAD_R) / 2.0,
            H / 2.0
        ),
    )
}

/// Error budget remaining per SLO at the end of each day (1.0 = untouched).
pub fn burn_down(slos: &[SloWeek]) -> String {
    let title = "Error budget remaining by day";
    if slos.iter().all(|s| s.remaining_by_day.is_empty()) {
        return no_data(title);
    }
    let mut body = String::new();
    for (i, s) in slos
        .iter()
        .filter(|s| !s.remaining_by_day.is_empty())
        .enumerate()
    {
        let c = COLORS[i % COLORS.len()];
        body.push_str(&polyline(&s.remaining_by_day, 1.0, c));
        body.push_str(&legend(i, &s.name, c));
    }
    frame(title, "100%", &body)
}

/// Failures per day of the top patterns.
pub fn pattern_trends(top: &[TopPattern]) -> String {
    let title = "Top patterns: failures per day";
    let max = top
        .iter()
        .flat_map(|t| t.pattern.daily.iter().copied())
        .max()
        .unwrap_or(0);
    if max == 0 {
        return no_data(title);
    }
    let mut body = String::new();
    for (i, t) in top.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let v: Vec<f64> = t.pattern.daily.iter().map(|&x| x as f64).collect();
        body.push_str(&polyline(&v, max as f64, c));
        body.push_str(&legend(
            i,
            &format!("#{} {}", t.rank, t.pattern.category),
            c,
        ));
    }
    frame(title, &max.to_string(), &body)
}
