//! The model: GGUF reading, the tokenizer, and the Llama forward pass over the paged KV cache.
//!
//! This file is the contract between the model and the engine (scheduler/api). The engine owns
//! the block *bookkeeping* (`kvcache/`); the model owns the block *memory* ([`KvTensors`]) and
//! reads/writes K/V for each sequence through the block table the engine hands it.
//!
//! K/V layout (vLLM's): per layer, K and V each `[num_blocks][block_size][num_kv_heads][head_dim]`.
//!
//! ```text
//!  gguf.rs      GGUF reader (+ writer for tiny-random)     quant.rs   ggml block formats
//!  tokenizer.rs byte-level BPE from tokenizer.ggml.*       chat.rs    SmolLM2's ChatML template
//!  llama.rs     hyper-parameters, weights, forward pass    cpu/       matrices, batched matmul
//!  tiny.rs      the seeded tiny random model               fetch.rs   model cache + fetch
//!  loaded.rs    LoadedModel: both routes resident, health check, greedy helper
//!  bench.rs     decode/TTFT benchmark                      cuda/      CUDA kernels (NVRTC) + runner
//! ```

mod bench;
mod chat;
pub mod cpu;
mod cuda;
mod fetch;
pub mod gguf;
pub mod llama;
mod loaded;
pub mod quant;
pub mod tiny;
pub mod tokenizer;

pub use bench::{
    BENCH_BLOCK, BenchReport, BenchRow, bench_blocks, bench_matmul, bench_model,
    bench_model_with_progress, cpu_seconds, median, resident_bytes,
};
pub use chat::{ChatMessage, DEFAULT_SYSTEM_PROMPT};
pub use fetch::{MODEL_FILE, fetch_model, model_dir};
pub use loaded::{Device, KvTensors, LoadedModel, ModelError, ModelRunner, RouteHealth, argmax};
pub use tokenizer::{StreamDecoder, Tokenizer};

/// Why no CUDA device can run the model here (`None`: one can). Said in the serving banner when
/// `--device auto` stays on the CPU.
pub fn cuda_unavailable() -> Option<String> {
    cuda::kernels().err()
}

/// Shape and special tokens of a loaded model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Served model name (`model_name` label, `/v1/models`).
    pub name: String,
    pub vocab_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub hidden_size: usize,
    pub max_model_len: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

/// Which weights to run: tier 2 routes default traffic to `Fallback`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// Weights dequantised to f32.
    Primary,
    /// Quantised weights (Q4_1 / Q8_0) used directly.
    Fallback,
}

impl Route {
    pub fn as_str(self) -> &'static str {
        match self {
            Route::Primary => "primary",
            Route::Fallback => "fallback",
        }
    }
}

/// One sequence's slice of work in a forward step: `tokens` are at positions
/// `start_pos .. start_pos + tokens.len()`; the K/V of positions `0 .. start_pos` are already in
/// the blocks of `block_table`, which must have room for the new positions too.
#[derive(Debug, Clone, Copy)]
pub struct SeqChunk<'a> {
    pub tokens: &'a [u32],
    pub start_pos: usize,
    /// Physical block ids, in logical order.
    pub block_table: &'a [u32],
}
