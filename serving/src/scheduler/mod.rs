//! Scheduling: which sequences run this step, how many tokens each, and sampling.
//!
//! - [`batch`]: the continuous-batching [`Scheduler`] over a [`crate::kvcache::KvCacheManager`];
//! - [`sampling`]: greedy / temperature / top-p sampling with per-sequence seeded RNGs;
//! - [`engine`]: the engine loop on its own OS thread, driving the scheduler and a model backend;
//! - [`toy`]: a small deterministic backend and byte tokenizer for tests of the engine alone;
//! - [`bench`]: the engine's capacity benchmark over the real model, and `bench model`'s whole
//!   run ([`bench_spec`]).

pub mod batch;
pub mod bench;
pub mod engine;
pub mod sampling;
pub mod toy;

pub use batch::{
    AdmissionError, FinishReason, NewSeq, ReserveStats, ScheduledChunk, Scheduler, SchedulerConfig,
    SchedulingPolicy, StepPlan,
};
pub use bench::{BenchSpec, CapacitySpec, OVERLOAD_CALLS_PER_FLOW, bench_spec, capacity};
pub use sampling::{Sampler, SamplingParams};

#[cfg(test)]
mod tests;
