//! Three-tier degradation: policy, controller, leader lease, signed publishing, operator API.
//!
//! ```text
//!  inputs (snapshots, SLO alerts, Alertmanager, new patterns, operator override)
//!     │  DegradeHandle::push_* / POST /v1/alertmanager / POST /api/v1/degrade/override
//!     v
//!  controller (pure state machine: Inputs -> Decision, hysteresis, hold-down)
//!     │  every evaluation interval, in run_controller
//!     v
//!  transport ── Redis: leader lease (fencing epoch) + one Lua script per publish
//!            └─ in-process bus (brownout-demo): a watch channel the serving tiers read
//!     │
//!     v  acks (Redis hash / channel) -> per-instance decision→applied lag
//! ```
//!
//! - [`policy`]: the YAML policy, validated;
//! - [`controller`]: the pure state machine;
//! - [`stopbleed`]: per-instance actions, the admission ramp after T3, retry-wave detection;
//! - [`redis`]: leader lease, fenced publisher, acks reader;
//! - [`bus`]: the in-process transport;
//! - [`handle`]: [`DegradeHandle`], the shared state (inputs, decisions, command in force);
//! - [`acks`]: the ack ledger (acks seen, commands issued, the "nothing acks" warning, the
//!   per-instance acks a stored decision keeps);
//! - [`metrics`]: [`DegradeMetrics`];
//! - [`command`]: from a decision to the command that goes out (when it is due, what it
//!   carries, the agent guards' merge);
//! - [`http`]: the router (Alertmanager webhook and its translation, operator API);
//! - [`run`]: [`run_controller`], the loop that decides, signs and publishes (its Redis side is
//!   `run::Publisher`).
//!
//! Imports go one way: `run` → `command`, `handle` → `acks`, `metrics` → `controller`;
//! `http` → `handle`.

pub mod acks;
pub mod bus;
pub mod command;
pub mod controller;
pub mod handle;
pub mod http;
pub mod metrics;
pub mod policy;
pub mod redis;
pub mod run;
pub mod stopbleed;

pub use acks::{AckView, InstanceAckRecord, InstanceActionView, UNACKED_WARN_MS, Unacked};
pub use bus::InProcBus;
pub use controller::{
    Controller, Crossing, Decision, Inputs, InstanceAction, InstanceOverride, Override,
    PatternRate, SloAlert, Transition,
};
pub use handle::{AlertChange, DecisionRecord, DegradeConfig, DegradeHandle, DegradeStatus};
pub use http::{AlertmanagerAlert, AlertmanagerWebhook, OverrideRequest, router};
pub use metrics::DegradeMetrics;
pub use policy::{Condition, FeaturePolicy, Policy, PolicyError, Signal};
pub use run::{Transport, run_controller};
