//! brownout's control plane.
//!
//! Data flows left to right (docs/ARCHITECTURE.md §2):
//!
//! ```text
//! ingest (OTLP, NDJSON, snapshots, webhooks) ─> store (ClickHouse | SQLite)
//!                                               ├─> patterns  (template mining + clustering)
//!                                               ├─> slo       (budgets, burn rates, alerts)
//!                                               └─> degrade   (policy, leader lease, Redis publish)
//! web (UI, JSON API, /metrics) and report (weekly roadmap) read from all of them.
//! ```
//!
//! `serve` wires them into one process; `demo` adds serving engines, simulated gpu-agents and the
//! load generator; `loadgen` drives any OpenAI-compatible endpoint; `drill` runs fault drills
//! against a deployment.

pub mod agents;
pub mod api;
pub mod auth;
pub mod config;
pub mod defaults;
pub mod degrade;
pub mod drill;
pub mod entry;
pub mod error;
pub mod ingest;
pub mod keys_cli;
pub mod loadgen;
pub mod logging;
pub mod metrics;
pub mod patterns;
pub mod plane;
pub mod report;
pub mod serve;
pub mod share_rounds;
pub mod slo;
pub mod store;
pub mod stream_outbox;
pub mod web;
