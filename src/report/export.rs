//! The TOP-3 roadmap items as tracker issues (docs/REPORT.md "Export to a tracker"):
//!
//! - [`jira_csv`]: one CSV row per item, the columns Jira's CSV importer maps (`Summary`,
//!   `Issue Type`, `Priority`, repeated `Labels`, `Description` in Jira wiki markup); RFC 4180
//!   quoting, and cells that a spreadsheet would run as a formula are prefixed with `'`;
//! - [`github_md`]: one Markdown issue body per item (for `gh issue create --body-file`), or
//!   all of them, each under its title.
//!
//! Pure: the same report gives the same bytes.

use super::escape::{code_escape, md_escape};
use super::model::{Report, RoadmapItem, TopPattern};

/// The labels every exported issue carries, then the pattern's category.
const LABELS: [&str; 2] = ["brownout", "stability"];

fn top_of<'a>(r: &'a Report, item: &RoadmapItem) -> Option<&'a TopPattern> {
    r.top.iter().find(|t| t.rank == item.rank)
}

/// The issue title: the playbook's change, with the pattern it is for.
pub fn title(item: &RoadmapItem) -> String {
    let mut label: String = item.pattern_label.chars().take(80).collect();
    if item.pattern_label.chars().count() > 80 {
        label.push('…');
    }
    let t = format!("{} ({label})", item.title);
    // Jira's summary holds at most 255 characters.
    t.chars().take(255).collect()
}

fn labels(item: &RoadmapItem) -> Vec<String> {
    let mut l: Vec<String> = LABELS.iter().map(|s| (*s).to_string()).collect();
    // Jira labels have no spaces.
    let cat: String = item
        .category
        .chars()
        .map(|c| if c.is_whitespace() { '_' } else { c })
        .collect();
    if !cat.is_empty() {
        l.push(cat);
    }
    l
}

fn priority(rank: usize) -> &'static str {
    match rank {
        1 => "Highest",
        2 => "High",
        _ => "Medium",
    }
}

/// One CSV cell, RFC 4180-quoted; a leading `= + - @` (or tab / CR) is neutralised with `'` so
/// that a spreadsheet opening the file runs nothing.
fn cell(s: &str) -> String {
    let s = if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{s}")
    } else {
        s.to_string()
    };
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// Text for Jira wiki markup: no markup characters from user-controlled strings.
fn jira_text(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '{' | '}' | '[' | ']' | '|' | '*' | '_' | '^' | '~' | '+' | '-' | '#' | '!' | '?' => {
                o.push('\\');
                o.push(c);
            }
            '\n' | '\r' => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

/// How one export writes the parts of an item both exports carry.
struct Markup {
    /// A labelled line's start: `*Label:* ` or `- **Label:** `.
    field: fn(&str) -> String,
    /// User-controlled text.
    text: fn(&str) -> String,
    /// A trace id.
    id: fn(&str) -> String,
    /// A section heading, with what follows it up to the section's text.
    heading: fn(&str) -> String,
    /// What stands before the verify step (Markdown makes it a task list item).
    task: &'static str,
}

const JIRA: Markup = Markup {
    field: |l| format!("*{l}:* "),
    text: jira_text,
    id: jira_text,
    heading: |h| format!("h3. {h}\n"),
    task: "",
};

const MARKDOWN: Markup = Markup {
    field: |l| format!("- **{l}:** "),
    text: md,
    id: |s| format!("`{}`", code(s)),
    heading: |h| format!("## {h}\n\n"),
    task: "- [ ] ",
};

/// An item's week figures, expected win-back, change, verify step and detection signal.
fn facts(m: &Markup, r: &Report, item: &RoadmapItem, out: &mut String) {
    if let Some(t) = top_of(r, item) {
        out.push_str(&format!(
            "{}{} failures, {} of the bad events, {} users, trend {}\n",
            (m.field)("This week"),
            t.pattern.count,
            t.impact_pct,
            t.pattern.affected_users,
            (m.text)(&t.trend)
        ));
        if !t.pattern.features.is_empty() {
            out.push_str(&format!(
                "{}{}\n",
                (m.field)("Features"),
                (m.text)(&t.pattern.features.join(", "))
            ));
        }
        if !t.pattern.example_trace_id.is_empty() {
            out.push_str(&format!(
                "{}{}\n",
                (m.field)("Example trace"),
                (m.id)(&t.pattern.example_trace_id)
            ));
        }
    }
    out.push_str(&format!(
        "{}about {} of the week's bad events\n\n",
        (m.field)("Expected win-back"),
        item.win_back_pct
    ));
    out.push_str(&format!(
        "{}{}\n\n",
        (m.heading)("Change"),
        (m.text)(&item.change)
    ));
    out.push_str(&format!(
        "{}{}{}\n",
        (m.heading)("Verify"),
        m.task,
        (m.text)(&item.verify)
    ));
    if !item.signal.is_empty() {
        out.push_str(&format!(
            "\n{}{}\n",
            (m.heading)("Detection signal"),
            (m.text)(&item.signal)
        ));
    }
}

fn jira_description(r: &Report, item: &RoadmapItem) -> String {
    let mut d = String::new();
    d.push_str(&format!(
        "From brownout's weekly stability report {} (cluster {}).\n\n",
        jira_text(&r.week),
        jira_text(&r.cluster)
    ));
    d.push_str(&format!(
        "*Pattern:* {{noformat}}{}{{noformat}}\n",
        item.pattern_label.replace("{noformat}", "")
    ));
    d.push_str(&format!("*Category:* {}\n", jira_text(&item.category)));
    facts(&JIRA, r, item, &mut d);
    d.push_str(&format!(
        "\nPlaybook {} · {}",
        jira_text(&item.playbook_id),
        jira_text(&item.source)
    ));
    d
}

/// The roadmap items as a CSV file for Jira's importer (System → External system import →
/// CSV): a header row, then one row per item. With no items, the header alone.
pub fn jira_csv(r: &Report) -> String {
    let n_labels = r
        .roadmap
        .iter()
        .map(|i| labels(i).len())
        .max()
        .unwrap_or(LABELS.len());
    let mut header = vec!["Summary", "Issue Type", "Priority"];
    header.extend(std::iter::repeat_n("Labels", n_labels));
    header.push("Description");
    let mut out = header.iter().map(|h| cell(h)).collect::<Vec<_>>().join(",");
    out.push_str("\r\n");
    for item in &r.roadmap {
        let mut row = vec![cell(&title(item)), cell("Task"), cell(priority(item.rank))];
        let mut l = labels(item);
        l.resize(n_labels, String::new());
        row.extend(l.iter().map(|x| cell(x)));
        row.push(cell(&jira_description(r, item)));
        out.push_str(&row.join(","));
        out.push_str("\r\n");
    }
    out
}

/// Text for a Markdown paragraph (the report's own escaping rules).
fn md(s: &str) -> String {
    md_escape(s)
}

/// Text inside an inline code span.
fn code(s: &str) -> String {
    code_escape(s)
}

/// One item's GitHub issue body (Markdown).
pub fn github_body(r: &Report, item: &RoadmapItem) -> String {
    let mut b = String::new();
    b.push_str(&format!(
        "From brownout's weekly stability report **{}** (cluster {}), roadmap item {}.\n\n",
        md(&r.week),
        md(&r.cluster),
        item.rank
    ));
    b.push_str(&format!(
        "- **Pattern:** `{}` ({})\n",
        code(&item.pattern_label),
        md(&item.category)
    ));
    facts(&MARKDOWN, r, item, &mut b);
    b.push_str(&format!(
        "\n---\nPlaybook `{}` · {} · labels: {}\n",
        code(&item.playbook_id),
        md(&item.source),
        labels(item).join(", ")
    ));
    b
}

/// `Some(n)`: the body of roadmap item `n` alone (`None` when there is no such item); `None`:
/// every item, each under `# <title>` and separated by a rule.
pub fn github_md(r: &Report, item: Option<usize>) -> Option<String> {
    match item {
        Some(n) => r
            .roadmap
            .iter()
            .find(|i| i.rank == n)
            .map(|i| github_body(r, i)),
        None => {
            if r.roadmap.is_empty() {
                return Some(format!(
                    "No roadmap items for {}: no failure patterns this week.\n",
                    md(&r.week)
                ));
            }
            Some(
                r.roadmap
                    .iter()
                    .map(|i| format!("# {}\n\n{}", md(&title(i)), github_body(r, i)))
                    .collect::<Vec<_>>()
                    .join("\n\n"),
            )
        }
    }
}
