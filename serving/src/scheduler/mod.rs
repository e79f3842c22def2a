//! Scheduling: which sequences run this step, how many tokens each, and sampling.
//!
//! - [`batch`]: the continuous-batching [`Scheduler`] over a [`crate::kvcache::KvCacheManager`];
//! - [`sampling`]: greedy / temperature / top-p sampling with per-sequence seeded RNGs;
//! - [`engine`]: the engine loop on its own OS thread, driving the scheduler and a model backend;
//! - [`toy`]: a small deterministic backend and byte tokenizer for tests of the engine alone.

pub mod batch;
pub mod engine;
pub mod sampling;
pub mod toy;

pub use batch::{
    AdmissionError, FinishReason, NewSeq, ReserveStats, ScheduledChunk, Scheduler, SchedulerConfig,
    SchedulingPolicy, StepPlan,
};
pub use sampling::{Sampler, SamplingParams};

#[cfg(test)]
mod tests;
