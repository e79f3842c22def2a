//! Rendering a [`Report`] as self-contained HTML, Markdown or JSON (tera templates under
//! `templates/`, compiled in).

use std::collections::HashMap;

use super::escape::{code_escape, md_escape};
use super::model::Report;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Html,
    Md,
    Json,
    /// The TOP-3 roadmap items as a CSV for Jira's importer ([`super::export::jira_csv`]).
    JiraCsv,
    /// The TOP-3 roadmap items as GitHub issue bodies ([`super::export::github_md`]).
    GithubMd,
}

/// Why rendering failed (a template bug; the data cannot cause it).
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("report template: {0:?}")]
    Template(#[from] tera::Error),
    #[error("report json: {0}")]
    Json(#[from] serde_json::Error),
}

fn filter(f: fn(&str) -> String) -> impl tera::Filter {
    move |v: &tera::Value, _: &HashMap<String, tera::Value>| -> tera::Result<tera::Value> {
        let s = match v {
            tera::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        Ok(tera::Value::String(f(&s)))
    }
}

fn engine() -> Result<tera::Tera, tera::Error> {
    let mut t = tera::Tera::default();
    // Names ending in .html are auto-escaped by tera; the .md one is escaped by filters.
    t.add_raw_template(
        "report.html",
        include_str!("../../templates/report.html.tera"),
    )?;
    t.add_raw_template("report.md", include_str!("../../templates/report.md.tera"))?;
    t.register_filter("md", filter(md_escape));
    t.register_filter("code", filter(code_escape));
    Ok(t)
}

/// Renders a report.
///
/// # Errors
/// Only on a broken template.
pub fn render(report: &Report, format: Format) -> Result<String, RenderError> {
    match format {
        Format::Json => Ok(serde_json::to_string_pretty(report)? + "\n"),
        Format::JiraCsv => Ok(super::export::jira_csv(report)),
        Format::GithubMd => Ok(super::export::github_md(report, None).unwrap_or_default()),
        Format::Html | Format::Md => {
            let mut ctx = tera::Context::new();
            ctx.insert("r", report);
            let name = if format == Format::Html {
                "report.html"
            } else {
                "report.md"
            };
            Ok(engine()?.render(name, &ctx)?)
        }
    }
}
