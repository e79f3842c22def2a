//! brownout's bundled serving tier.
//!
//! ```text
//!  api/ (OpenAI-compatible HTTP, /metrics, /debug/kv, /debug/resource, /v1/features)
//!    │ gate/ (admit or refuse: tier rules,       ▲ degradation state
//!    │   drain, admission rate, loop kill,       │
//!    │   tool breakers, per-user cap)            │
//!    v                                           │
//!  scheduler/ (continuous batching, chunked prefill, preemption)   control/ (Redis subscriber,
//!    │ batches of sequence chunks                                   signed commands, acks)
//!    v
//!  model/ (GGUF, tokenizer, Llama forward on CPU or CUDA) ── reads/writes K/V through block tables
//!    │
//!  kvcache/ (pure: block pool, prefix cache, block tables, fragmentation ratios)
//! ```
//!
//! With `--upstream URL`, upstream/ takes the place of scheduler/ and model/: the same api
//! shapes and gate, then forwarding to any OpenAI-compatible engine (docs/UPSTREAM.md).
//! serve/ is the composition root both modes start from (one listener path, the API key, the
//! graceful shutdown) and holds the bench commands.

pub mod api;
pub mod control;
pub mod gate;
pub mod kvcache;
pub mod metrics;
pub mod model;
pub mod scheduler;
pub mod serve;
pub mod telemetry;
pub mod upstream;
