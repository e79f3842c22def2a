//! A standalone SVG line chart of flow goodput over time (one line per configuration), for
//! `bench overload`. Inline styles, so the file renders on its own (GitHub, a browser); every
//! text goes through the web UI's escaper.

use std::fmt::Write as _;

use brownout::web::chart::escape;

/// Line colours per series, in order (baseline grey, loop off orange, loop on blue).
const COLOURS: [&str; 6] = [
    "#7f7f7f", "#e6761e", "#1f6fd1", "#2ca02c", "#9467bd", "#d62728",
];

/// `series`: `(name, [(t seconds, flows/s)])`. A dashed line marks `capacity`; the overload
/// window `[onset_s, end_s)` is shaded.
pub fn goodput_chart(
    series: &[(&str, Vec<(f64, f64)>)],
    capacity: f64,
    onset_s: f64,
    end_s: f64,
    model: &str,
) -> String {
    const W: f64 = 760.0;
    const H: f64 = 320.0;
    const L: f64 = 56.0;
    const R: f64 = 16.0;
    const T: f64 = 34.0;
    const B: f64 = 64.0;
    let (pw, ph) = (W - L - R, H - T - B);
    let finite = |v: f64| v.is_finite().then_some(v);
    let t_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().filter_map(|x| finite(x.0)))
        .fold(end_s.max(1.0), f64::max)
        + 5.0;
    let y_max = series
        .iter()
        .flat_map(|(_, p)| p.iter().filter_map(|x| finite(x.1)))
        .fold(capacity.max(0.1), f64::max)
        * 1.15;
    let x = |t: f64| L + (t / t_max).clamp(0.0, 1.0) * pw;
    let y = |v: f64| T + (1.0 - (v / y_max).clamp(0.0, 1.0)) * ph;
    let title = format!("Flow goodput (flows/s finished within their deadline), {model}");
    let mut s = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" aria-label="{t}" font-family="sans-serif" font-size="12"><title>{t}</title><rect width="{W}" height="{H}" fill="#ffffff"/>"##,
        t = escape(&title)
    );
    let _ = write!(
        s,
        r##"<text x="{L}" y="20" font-size="14" fill="#222">{}</text>"##,
        escape(&title)
    );
    // The overload window.
    let _ = write!(
        s,
        r##"<rect x="{:.1}" y="{T}" width="{:.1}" height="{ph:.1}" fill="#f3d9d9" opacity="0.6"/><text x="{:.1}" y="{:.1}" fill="#a33" text-anchor="middle">overload</text>"##,
        x(onset_s),
        (x(end_s) - x(onset_s)).max(0.0),
        (x(onset_s) + x(end_s)) / 2.0,
        T + 14.0
    );
    // Grid and y labels.
    let step = nice_step(y_max);
    let mut v = 0.0;
    while v <= y_max + 1e-9 && step > 0.0 {
        let yy = y(v);
        let _ = write!(
            s,
            r##"<line x1="{L}" x2="{:.1}" y1="{yy:.1}" y2="{yy:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" fill="#555" text-anchor="end">{}</text>"##,
            L + pw,
            L - 6.0,
            yy + 4.0,
            fmt_num(v)
        );
        v += step;
    }
    // X labels every nice step of seconds.
    let xs = nice_step(t_max);
    let mut t = 0.0;
    while t <= t_max && xs > 0.0 {
        let _ = write!(
            s,
            r##"<text x="{:.1}" y="{:.1}" fill="#555" text-anchor="middle">{}s</text>"##,
            x(t),
            T + ph + 16.0,
            fmt_num(t)
        );
        t += xs;
    }
    let _ = write!(
        s,
        r##"<line x1="{L}" x2="{L}" y1="{T}" y2="{:.1}" stroke="#999"/><line x1="{L}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#999"/>"##,
        T + ph,
        L + pw,
        T + ph,
        T + ph
    );
    // Capacity.
    let yc = y(capacity);
    let _ = write!(
        s,
        r##"<line x1="{L}" x2="{:.1}" y1="{yc:.1}" y2="{yc:.1}" stroke="#222" stroke-dasharray="5 4"/><text x="{:.1}" y="{:.1}" fill="#222" text-anchor="end">capacity {}</text>"##,
        L + pw,
        L + pw - 4.0,
        yc - 5.0,
        fmt_num(capacity)
    );
    // Series and legend.
    let mut lx = L;
    for (i, (name, pts)) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let mut d = String::new();
        for (j, (t, v)) in pts
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .enumerate()
        {
            let _ = write!(
                d,
                "{}{:.1},{:.1}",
                if j == 0 { "M" } else { "L" },
                x(*t),
                y(*v)
            );
        }
        if !d.is_empty() {
            let _ = write!(
                s,
                r##"<path d="{d}" fill="none" stroke="{colour}" stroke-width="2"><title>{}</title></path>"##,
                escape(name)
            );
        }
        let ly = H - 16.0;
        let _ = write!(
            s,
            r##"<rect x="{lx:.1}" y="{:.1}" width="14" height="4" fill="{colour}"/><text x="{:.1}" y="{ly:.1}" fill="#222">{}</text>"##,
            ly - 5.0,
            lx + 18.0,
            escape(name)
        );
        lx += 34.0 + 7.0 * name.chars().count().min(30) as f64;
    }
    let _ = write!(
        s,
        r##"<text x="{:.1}" y="{:.1}" fill="#555" text-anchor="end">5 s windows</text>"##,
        L + pw,
        H - 16.0
    );
    s.push_str("</svg>\n");
    s
}

fn fmt_num(v: f64) -> String {
    if v.fract().abs() < 1e-9 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn nice_step(span: f64) -> f64 {
    if !(span.is_finite() && span > 0.0) {
        return 1.0;
    }
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let n = raw / mag;
    let m = if n < 1.5 {
        1.0
    } else if n < 3.0 {
        2.0
    } else if n < 7.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_has_one_line_per_series_escapes_names_and_marks_capacity() {
        let svg = goodput_chart(
            &[
                ("baseline", vec![(0.0, 1.0), (5.0, 0.2)]),
                ("<loop_on>", vec![(0.0, 1.0), (5.0, 1.8), (10.0, f64::NAN)]),
            ],
            2.0,
            3.0,
            8.0,
            "tiny & random",
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<path ").count(), 2);
        assert!(svg.contains("&lt;loop_on&gt;") && !svg.contains("<loop_on>"));
        assert!(svg.contains("tiny &amp; random"));
        assert!(svg.contains("capacity 2"));
        assert!(!svg.contains("NaN"));
    }

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(10.0), 2.0);
        assert_eq!(nice_step(170.0), 50.0);
        assert_eq!(nice_step(0.0), 1.0);
    }
}
