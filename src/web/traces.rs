//! The log search page (`/logs`) and the trace waterfall (`/traces/{trace_id}`): plain functions
//! from store rows to view models, and the waterfall's SVG.
//!
//! The waterfall lists a trace's spans depth-first (each span's children by start time, then span
//! id), so a child sits under its parent; spans whose parent is not in the trace are roots. The
//! critical path is walked back from the end: from the root that ends last, in each span the
//! child that ends last, then the last child to end before that one started, and so on (the
//! spans the trace's end waited on, in turn; a child overlapping a later one on the path is
//! not on it). At most
//! [`MAX_TRACE_SPANS`] spans are drawn (the rest are counted); every string is cut
//! ([`MAX_TEXT`]) and escaped (the SVG by [`super::chart::esc`]-style escaping here, the table by
//! Tera).

use std::collections::{HashMap, HashSet};

use brownout_protocol::wire::attr;
use serde::Serialize;

use crate::store::logs::severity_name;
use crate::store::{LogHit, SpanRow};

use super::model::DataOrigin;

/// Spans drawn in one waterfall; the rest of a larger trace are counted, not drawn.
pub const MAX_TRACE_SPANS: usize = 1000;
/// Longest string shown (service, span name, attribute value, log body), characters.
pub const MAX_TEXT: usize = 500;
/// Log records on the `/logs` page.
pub const LOG_PAGE_ROWS: usize = 100;
/// Log records on an instance page.
pub const INSTANCE_LOG_ROWS: usize = 50;

/// Attributes shown beside a span (the first key present of each group).
pub const KEY_ATTRIBUTES: &[(&str, &[&str])] = &[
    (
        "queue wait",
        &[
            attr::QUEUE_TIME_S,
            "gpu.queue_wait_ms",
            "brownout.gpu_queue_wait_ms",
        ],
    ),
    ("TTFT", &[attr::TTFT_S, "gen_ai.server.time_to_first_token"]),
    ("tokens in", &["gen_ai.usage.input_tokens"]),
    ("tokens out", &["gen_ai.usage.output_tokens"]),
    ("tool", crate::agents::semconv::TOOL_NAME),
    ("model", &["gen_ai.request.model"]),
    ("error", &["error.type"]),
];

/// Cuts `s` to at most `max` characters (an ellipsis marks the cut).
pub fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_string(),
        Some((i, _)) => format!("{}…", &s[..i]),
    }
}

/// One log record as the pages show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogRecordLine {
    pub ts_ms: u64,
    /// `error`, `warn`, `info`… (from the severity number).
    pub level: String,
    pub severity_text: String,
    pub service: String,
    pub host: String,
    /// Cut to [`MAX_TEXT`].
    pub body: String,
    /// 32 hex digits or empty.
    pub trace_id: String,
    pub span_id: String,
    /// `key=value` pairs, each cut, at most 8.
    pub attributes: Vec<String>,
}

/// A log record line of the store's hit.
pub fn log_line(h: &LogHit) -> LogRecordLine {
    let r = &h.row;
    LogRecordLine {
        ts_ms: r.ts_us / 1000,
        level: severity_name(r.severity_number).to_string(),
        severity_text: cut(&r.severity_text, 32),
        service: cut(&r.service, 120),
        host: cut(&r.host, 120),
        body: cut(&r.body, MAX_TEXT),
        trace_id: if is_trace_id(&r.trace_id) {
            r.trace_id.to_ascii_lowercase()
        } else {
            String::new()
        },
        span_id: cut(&r.span_id, 32),
        attributes: r
            .attributes
            .iter()
            .take(8)
            .map(|(k, v)| format!("{}={}", cut(k, 60), cut(v, 120)))
            .collect(),
    }
}

/// 32 hex digits (a trace id the waterfall can be asked for).
pub fn is_trace_id(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `/logs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogsView {
    pub origin: DataOrigin,
    pub generated_at_ms: u64,
    /// The filters as given (echoed into the form).
    pub filters: LogFilters,
    pub records: Vec<LogRecordLine>,
    /// The query string of the next page, when more follow.
    pub next_query: Option<String>,
    /// Why the filters were refused (then no records).
    pub error: Option<String>,
}

/// The form's fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LogFilters {
    pub service: String,
    pub host: String,
    pub instance: String,
    pub severity: String,
    pub q: String,
    pub since: String,
    pub until: String,
}

/// One span of the waterfall.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WaterfallSpan {
    pub span_id: String,
    pub parent_span_id: String,
    /// 0 for a root.
    pub depth: usize,
    pub service: String,
    pub name: String,
    pub host: String,
    pub start_us: u64,
    /// Since the trace's first start.
    pub offset_us: u64,
    pub duration_us: u64,
    /// Offset and duration for people (`12.3 ms`).
    pub offset: String,
    pub duration: String,
    /// `unset`, `ok` or `error`.
    pub status: &'static str,
    pub status_message: String,
    pub feature: String,
    pub criticality: String,
    /// On the critical path.
    pub critical: bool,
    /// [`KEY_ATTRIBUTES`] present, as (label, value).
    pub key_attributes: Vec<(String, String)>,
}

/// `/traces/{trace_id}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceView {
    pub origin: DataOrigin,
    pub generated_at_ms: u64,
    pub trace_id: String,
    pub start_us: u64,
    /// From the first start to the last end.
    pub duration_us: u64,
    pub services: Vec<String>,
    pub errors: usize,
    /// Depth-first, children by start time.
    pub spans: Vec<WaterfallSpan>,
    /// [`TraceView::duration_us`] for people.
    pub duration: String,
    /// The `/logs` query of the trace's time (a minute either side).
    pub logs_query: String,
    /// Spans of the trace not drawn (past [`MAX_TRACE_SPANS`]).
    pub not_shown: usize,
    /// The configured external trace viewer's link, when there is one.
    pub external_url: Option<String>,
}

fn status_name(s: u8) -> &'static str {
    match s {
        1 => "ok",
        2 => "error",
        _ => "unset",
    }
}

fn end(s: &SpanRow) -> u64 {
    s.start_us.saturating_add(s.duration_us)
}

/// The waterfall of a trace's spans (any order in).
pub fn waterfall(
    origin: DataOrigin,
    now_ms: u64,
    trace_id: &str,
    spans: &[SpanRow],
    external_url: Option<String>,
) -> TraceView {
    let ids: HashSet<&str> = spans.iter().map(|s| s.span_id.as_str()).collect();
    let mut children: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut roots: Vec<usize> = Vec::new();
    for (i, s) in spans.iter().enumerate() {
        if s.parent_span_id.is_empty()
            || s.parent_span_id == s.span_id
            || !ids.contains(s.parent_span_id.as_str())
        {
            roots.push(i);
        } else {
            children
                .entry(s.parent_span_id.as_str())
                .or_default()
                .push(i);
        }
    }
    let by_start = |v: &mut Vec<usize>| {
        v.sort_by(|&a, &b| {
            (spans[a].start_us, &spans[a].span_id).cmp(&(spans[b].start_us, &spans[b].span_id))
        })
    };
    by_start(&mut roots);
    for v in children.values_mut() {
        by_start(v);
    }
    // The critical path: from the root that ends last; in each span, the child that ends last,
    // then the last to end before that one started, and so on back to the span's start (what the
    // span waited on, in turn); the same inside each of those.
    let mut critical: HashSet<usize> = HashSet::new();
    let mut todo: Vec<usize> = roots
        .iter()
        .copied()
        .max_by_key(|&i| (end(&spans[i]), i))
        .into_iter()
        .collect();
    while let Some(i) = todo.pop() {
        if !critical.insert(i) {
            continue;
        }
        let Some(kids) = children.get(spans[i].span_id.as_str()) else {
            continue;
        };
        let mut kids = kids.clone();
        kids.sort_by_key(|&j| std::cmp::Reverse((end(&spans[j]), j)));
        let mut limit = end(&spans[i]);
        for j in kids {
            if end(&spans[j]) <= limit {
                todo.push(j);
                limit = spans[j].start_us;
            }
        }
    }
    let start_us = spans.iter().map(|s| s.start_us).min().unwrap_or(0);
    let end_us = spans.iter().map(end).max().unwrap_or(start_us);
    // Depth-first, iteratively (a deep trace cannot overflow the stack); a span id repeated in
    // the trace is drawn once.
    let mut order: Vec<(usize, usize)> = Vec::with_capacity(spans.len().min(MAX_TRACE_SPANS));
    let mut seen: HashSet<usize> = HashSet::new();
    // Spans only reachable through a parent cycle are drawn after, as roots of their own.
    let mut all: Vec<usize> = (0..spans.len()).collect();
    by_start(&mut all);
    for r in roots.iter().copied().chain(all) {
        let mut stack: Vec<(usize, usize)> = vec![(r, 0)];
        while let Some((i, d)) = stack.pop() {
            if !seen.insert(i) {
                continue;
            }
            order.push((i, d));
            if let Some(c) = children.get(spans[i].span_id.as_str()) {
                stack.extend(c.iter().rev().map(|&j| (j, d + 1)));
            }
        }
    }
    let total = order.len();
    order.truncate(MAX_TRACE_SPANS);
    let mut services: Vec<String> = spans.iter().map(|s| cut(&s.service, 120)).collect();
    services.sort();
    services.dedup();
    services.truncate(50);
    TraceView {
        origin,
        generated_at_ms: now_ms,
        trace_id: trace_id.to_string(),
        start_us,
        duration_us: end_us - start_us,
        duration: human_us(end_us - start_us),
        logs_query: format!(
            "since={}&until={}",
            (start_us / 1000).saturating_sub(60_000),
            end_us / 1000 + 60_000
        ),
        services,
        errors: spans.iter().filter(|s| s.status == 2).count(),
        spans: order
            .into_iter()
            .map(|(i, depth)| {
                let s = &spans[i];
                WaterfallSpan {
                    span_id: cut(&s.span_id, 32),
                    parent_span_id: cut(&s.parent_span_id, 32),
                    depth,
                    service: cut(&s.service, 120),
                    name: cut(&s.name, 200),
                    host: cut(&s.host, 120),
                    start_us: s.start_us,
                    offset_us: s.start_us - start_us,
                    duration_us: s.duration_us,
                    offset: human_us(s.start_us - start_us),
                    duration: human_us(s.duration_us),
                    status: status_name(s.status),
                    status_message: cut(&s.status_message, MAX_TEXT),
                    feature: cut(&s.feature, 120),
                    criticality: cut(&s.criticality, 32),
                    critical: critical.contains(&i),
                    key_attributes: key_attributes(&s.attributes),
                }
            })
            .collect(),
        not_shown: total.saturating_sub(MAX_TRACE_SPANS),
        external_url,
    }
}

fn key_attributes(attrs: &[(String, String)]) -> Vec<(String, String)> {
    KEY_ATTRIBUTES
        .iter()
        .filter_map(|(label, keys)| {
            keys.iter().find_map(|k| {
                attrs
                    .iter()
                    .find(|(ak, _)| ak == k)
                    .map(|(_, v)| (label.to_string(), cut(v, 120)))
            })
        })
        .collect()
}

fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '&' => o.push_str("&amp;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c if c.is_control() => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

/// A duration for people: `850 µs`, `12.3 ms`, `4.20 s`.
pub fn human_us(us: u64) -> String {
    if us < 1000 {
        format!("{us} µs")
    } else if us < 1_000_000 {
        format!("{:.1} ms", us as f64 / 1000.0)
    } else {
        format!("{:.2} s", us as f64 / 1e6)
    }
}

/// Row height and label width of the waterfall SVG, px.
const ROW: usize = 22;
const LABEL_W: usize = 330;
const BAR_W: usize = 620;

/// The waterfall as SVG: one row per span (indented by depth), a bar from its offset for its
/// duration; critical-path bars are outlined, errors red. Every text is escaped.
pub fn waterfall_svg(v: &TraceView) -> String {
    let h = ROW * (v.spans.len() + 1) + 8;
    let w = LABEL_W + BAR_W + 90;
    let total = v.duration_us.max(1) as f64;
    let mut o = format!(
        r#"<svg class="waterfall" xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="trace waterfall">"#
    );
    for k in 0..=4 {
        let x = LABEL_W as f64 + BAR_W as f64 * k as f64 / 4.0;
        o.push_str(&format!(
            r#"<line x1="{x:.1}" y1="14" x2="{x:.1}" y2="{h}" class="wf-grid"/><text x="{x:.1}" y="11" class="wf-axis" text-anchor="middle">{}</text>"#,
            esc(&human_us((total * k as f64 / 4.0) as u64))
        ));
    }
    for (n, s) in v.spans.iter().enumerate() {
        let y = ROW * (n + 1);
        let indent = (s.depth.min(20) * 12) as f64;
        let label = cut(
            &format!("{} {}", s.service, s.name),
            44usize.saturating_sub(s.depth.min(20)),
        );
        let x = LABEL_W as f64 + BAR_W as f64 * s.offset_us as f64 / total;
        let bw = (BAR_W as f64 * s.duration_us as f64 / total).max(1.5);
        let mut class = String::from("wf-bar");
        if s.status == "error" {
            class.push_str(" wf-error");
        }
        if s.critical {
            class.push_str(" wf-critical");
        }
        o.push_str(&format!(
            r#"<g class="wf-row" data-span="{id}"><title>{title}</title><text x="{tx:.1}" y="{ty}" class="wf-label">{crit}{label}</text><rect x="{x:.1}" y="{ry}" width="{bw:.1}" height="14" rx="2" class="{class}"/><text x="{dx:.1}" y="{ty}" class="wf-dur">{dur}</text></g>"#,
            id = esc(&s.span_id),
            title = esc(&format!(
                "{} {} · {} · {}",
                s.service,
                s.name,
                human_us(s.duration_us),
                s.status
            )),
            tx = 4.0 + indent,
            ty = y + 12,
            crit = if s.critical { "▸ " } else { "" },
            label = esc(&label),
            ry = y + 1,
            dx = (x + bw + 4.0).min((w - 60) as f64),
            dur = esc(&human_us(s.duration_us)),
        ));
    }
    o.push_str("</svg>");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(id: &str, parent: &str, start: u64, dur: u64) -> SpanRow {
        SpanRow {
            trace_id: "ab".repeat(16),
            span_id: id.into(),
            parent_span_id: parent.into(),
            service: "svc".into(),
            name: format!("op-{id}"),
            kind: 0,
            start_us: start,
            duration_us: dur,
            status: 0,
            status_message: String::new(),
            feature: String::new(),
            criticality: "default".into(),
            host: "h".into(),
            is_request: parent.is_empty(),
            attributes: vec![("gen_ai.tool.name".into(), "<search>".into())],
        }
    }

    #[test]
    fn nests_depth_first_by_start_and_marks_the_last_finisher_chain() {
        // root(0..100) → a(10..40), b(20..95) → b1(30..90); a → a1(12..15); orphan's parent is
        // missing: a root of its own.
        let spans = vec![
            span("b1", "b", 30, 60),
            span("a", "r", 10, 30),
            span("r", "", 0, 100),
            span("b", "r", 20, 75),
            span("a1", "a", 12, 3),
            span("o", "missing", 50, 5),
        ];
        let v = waterfall(DataOrigin::Sample, 0, "t", &spans, None);
        let got: Vec<(&str, usize, bool)> = v
            .spans
            .iter()
            .map(|s| (s.span_id.as_str(), s.depth, s.critical))
            .collect();
        assert_eq!(
            got,
            vec![
                ("r", 0, true),
                ("a", 1, false),
                ("a1", 2, false),
                ("b", 1, true),
                ("b1", 2, true),
                ("o", 0, false)
            ]
        );
        assert_eq!(v.duration_us, 100);
        assert_eq!(
            v.spans[1].key_attributes,
            vec![("tool".to_string(), "<search>".to_string())]
        );
        let svg = waterfall_svg(&v);
        assert!(svg.contains("&lt;search&gt;") || !svg.contains("<search>"));
        assert!(!svg.contains("<search>"));
    }

    #[test]
    fn a_cycle_and_a_huge_trace_stay_bounded() {
        let mut spans = vec![span("x", "y", 0, 1), span("y", "x", 0, 1)];
        let v = waterfall(DataOrigin::Sample, 0, "t", &spans, None);
        assert_eq!(v.spans.len(), 2, "{v:?}");
        assert_eq!((v.spans[0].depth, v.spans[1].depth), (0, 1));
        spans = (0..MAX_TRACE_SPANS + 5)
            .map(|i| span(&format!("s{i}"), "", i as u64, 1))
            .collect();
        let v = waterfall(DataOrigin::Sample, 0, "t", &spans, None);
        assert_eq!(v.spans.len(), MAX_TRACE_SPANS);
        assert_eq!(v.not_shown, 5);
    }

    #[test]
    fn cuts_at_characters() {
        assert_eq!(cut("héllo", 2), "hé…");
        assert_eq!(cut("hi", 2), "hi");
    }
}
