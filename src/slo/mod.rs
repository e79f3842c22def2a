//! SLO specs, error budgets, multi-window burn rates, alert states, Prometheus rule generation.
//!
//! ```text
//! spec files ─ spec (+ raw | sloth | openslo) ─> SloSpec ─┬─> rules ─> Prometheus rule YAML
//!                                                         └─> eval::Evaluator (pure core)
//! spans, failure events ─> Observation ─> Evaluator.record     │  rings (10 s/1 m/1 h buckets)
//!                                         Evaluator.evaluate ──┤  budget (math), alert (states)
//!                                                              v
//!            task::run (tokio, every few s) ─> SloReport ─> watch ─> http::router, degrade,
//!                                                              └─> brownout_slo_* gauges
//! ```
//!
//! - [`spec`]: the validated model and the loader (three input formats);
//! - [`budget`]: burn rates, budgets, window pairs and their period-derived factors — pure;
//! - [`ring`]: bucketed good/total counters; [`alert`]: pending/firing/resolved;
//! - [`eval`]: the evaluator; [`task`]: the shared handle, the periodic task and the gauges;
//! - [`http`]: `GET /api/v1/slos`; [`rules`]: rule generation; [`cli`]: `brownout slo …`;
//! - [`persist`]: SLI counts stored per SLO and minute at ingest; the evaluator seeded and
//!   refreshed from them, so budgets survive restarts and replicas agree;
//! - [`share`]: counters shared by N control-plane replicas through Redis (each replica's
//!   per-second deltas on one stream), so every replica's burn rates cover the whole traffic.
//!
//! docs/SLO.md describes the spec format, the metrics assumed and the alert conventions.

pub mod alert;
pub mod bench;
pub mod budget;
pub mod cli;
pub mod duration;
pub mod eval;
pub mod http;
pub mod model;
pub mod observe;
pub mod openslo;
pub mod persist;
pub mod raw;
pub mod ring;
pub mod rules;
pub mod share;
pub mod sloth;
pub mod spec;
pub mod task;

pub use alert::AlertState;
pub use budget::{Counts, PairKind, Severity};
pub use cli::{SloArgs, SloCmd};
pub use eval::{
    AlertStatus, BudgetView, CountSource, Evaluator, EventKind, Observation, SloId, SloStatus,
    WindowBurn,
};
pub use http::router;
pub use spec::{SloSpec, SpecError, load_file, load_files};
pub use task::{SloHandle, SloMetrics, SloReport};

/// Runs `brownout slo`.
///
/// # Errors
/// Bad specs (file, field, reason), unreadable inputs, bad event lines.
pub async fn run(args: SloArgs) -> anyhow::Result<()> {
    cli::run(args).await
}
