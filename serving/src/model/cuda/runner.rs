//! [`CudaModel`] (the primary route's weights on the GPU, uploaded once per loaded model) and
//! [`CudaRunner`] (one engine's K/V blocks in device memory and the forward pass over them).
//!
//! The primary route runs on the GPU. The fallback route (quantised weights, int8 activations)
//! has no GPU kernel yet and runs on the CPU over a host mirror of the K/V blocks: before a
//! fallback step, the blocks the step reads that the GPU wrote since they were last mirrored are
//! copied down; after it, the blocks the step wrote are copied up. Both directions move only
//! whole blocks, packed into one transfer by a gather/scatter kernel.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use cudarc::driver::CudaSlice;

use super::kernels::{AttnShape, Kernels, KvGeometry, MAX_HEAD_DIM, int};
use crate::model::cpu::{MatData, Matrix};
use crate::model::llama::{HyperParams, RopeTable, RouteWeights};
use crate::model::{KvTensors, LoadedModel, ModelError, Route, SeqChunk};

fn dev_err(e: String) -> ModelError {
    ModelError::DeviceUnavailable(format!("cuda: {e}"))
}

/// RoPE's cos/sin as `[pos][pair][cos, sin]`, read out of the CPU's own [`RopeTable`] (rotating
/// the unit vector (1, 0) yields exactly (cos, sin)), so both devices use the same bits.
/// Returns (table, pairs per head, positions).
pub fn rope_table(hp: &HyperParams) -> (Vec<f32>, usize, usize) {
    let rope = RopeTable::new(hp);
    let half = hp.rope_dim / 2;
    let max_pos = rope.max_pos();
    let mut table = Vec::with_capacity(max_pos * half * 2);
    let mut head = vec![0f32; 2 * half];
    for p in 0..max_pos {
        for pair in head.chunks_exact_mut(2) {
            pair[0] = 1.0;
            pair[1] = 0.0;
        }
        rope.apply(&mut head, p);
        table.extend_from_slice(&head);
    }
    (table, half, max_pos)
}

fn f32_rows<'a>(m: &'a Matrix, name: &str) -> Result<std::borrow::Cow<'a, [f32]>, String> {
    match &m.data {
        // Packed (CPU micro-kernel layout): unpacked once for the upload.
        MatData::F32(_) | MatData::Packed(_) => Ok(m.row_major_f32()),
        _ => Err(format!(
            "{name} is {} on the primary route; the CUDA backend needs f32",
            m.type_name()
        )),
    }
}

#[derive(Debug)]
struct DevLayer {
    attn_norm: CudaSlice<f32>,
    wqkv: CudaSlice<f32>,
    wo: CudaSlice<f32>,
    ffn_norm: CudaSlice<f32>,
    w_gate_up: CudaSlice<f32>,
    w_down: CudaSlice<f32>,
}

/// The primary route's weights in device memory, plus the RoPE table.
pub struct CudaModel {
    pub k: Arc<Kernels>,
    hp: HyperParams,
    embed: CudaSlice<f32>,
    /// `None`: tied to `embed`.
    head: Option<CudaSlice<f32>>,
    vocab: usize,
    layers: Vec<DevLayer>,
    out_norm: CudaSlice<f32>,
    rope: CudaSlice<f32>,
    rope_half: usize,
    rope_max_pos: usize,
    bytes: usize,
}

impl std::fmt::Debug for CudaModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaModel")
            .field("device", &self.k.name)
            .field("layers", &self.layers.len())
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl CudaModel {
    /// Uploads the primary route's f32 weights.
    ///
    /// # Errors
    /// A matrix that is not f32, a shape the kernels do not support, or a driver error (out of
    /// memory, …), as text.
    pub fn upload(
        k: Arc<Kernels>,
        hp: &HyperParams,
        w: &RouteWeights,
    ) -> Result<CudaModel, String> {
        if hp.head_dim > MAX_HEAD_DIM {
            return Err(format!(
                "head size {} > {MAX_HEAD_DIM} (attention kernel limit)",
                hp.head_dim
            ));
        }
        if hp.rope_dim > hp.head_dim || !hp.num_heads.is_multiple_of(hp.num_kv_heads) {
            return Err("inconsistent head shapes".into());
        }
        let s = k.stream.clone();
        let mut bytes = 0usize;
        let mut up = |v: &[f32], name: &str| -> Result<CudaSlice<f32>, String> {
            bytes += v.len() * 4;
            s.clone_htod(v)
                .map_err(|e| format!("uploading {name}: {e}"))
        };
        let mut layers = Vec::with_capacity(w.layers.len());
        for (i, l) in w.layers.iter().enumerate() {
            layers.push(DevLayer {
                attn_norm: up(&l.attn_norm, "attn_norm")?,
                wqkv: up(&f32_rows(&l.wqkv, "wqkv")?, &format!("blk.{i}.wqkv"))?,
                wo: up(&f32_rows(&l.wo, "wo")?, &format!("blk.{i}.wo"))?,
                ffn_norm: up(&l.ffn_norm, "ffn_norm")?,
                w_gate_up: up(&f32_rows(&l.w_gate_up, "w_gate_up")?, "w_gate_up")?,
                w_down: up(&f32_rows(&l.w_down, "w_down")?, "w_down")?,
            });
        }
        let embed = up(&f32_rows(&w.embed, "token_embd")?, "token_embd")?;
        let head = match &w.head {
            Some(m) => Some(up(&f32_rows(m, "output")?, "output")?),
            None => None,
        };
        let out_norm = up(&w.out_norm, "output_norm")?;
        let (table, rope_half, rope_max_pos) = rope_table(hp);
        let rope = up(&table, "rope table")?;
        k.sync()?;
        Ok(CudaModel {
            hp: hp.clone(),
            vocab: w.head().rows,
            embed,
            head,
            layers,
            out_norm,
            rope,
            rope_half,
            rope_max_pos,
            bytes,
            k,
        })
    }

    fn head(&self) -> &CudaSlice<f32> {
        self.head.as_ref().unwrap_or(&self.embed)
    }
}

/// Uploaded models, keyed by the loaded model they came from: several runners (engines) of one
/// model share one copy of the weights. Entries die with their model or their last runner.
type ModelCache = Vec<(Weak<LoadedModel>, Weak<CudaModel>)>;
static MODELS: Mutex<ModelCache> = Mutex::new(Vec::new());

/// The device copy of `model`'s primary weights, uploaded on first use.
///
/// # Errors
/// As [`CudaModel::upload`].
pub fn model_for(model: &Arc<LoadedModel>, k: Arc<Kernels>) -> Result<Arc<CudaModel>, String> {
    let mut cache = MODELS.lock().unwrap_or_else(PoisonError::into_inner);
    cache.retain(|(m, c)| m.strong_count() > 0 && c.strong_count() > 0);
    for (m, c) in cache.iter() {
        if std::ptr::eq(m.as_ptr(), Arc::as_ptr(model))
            && let Some(c) = c.upgrade()
        {
            return Ok(c);
        }
    }
    let t0 = std::time::Instant::now();
    let c = Arc::new(CudaModel::upload(
        k,
        model.hparams(),
        model.weights(Route::Primary),
    )?);
    tracing::info!(
        device = c.k.name,
        bytes = c.bytes,
        upload_ms = t0.elapsed().as_millis() as u64,
        "primary route uploaded to the GPU"
    );
    cache.push((Arc::downgrade(model), Arc::downgrade(&c)));
    Ok(c)
}

/// Per-step device buffers, grown (never shrunk) to the largest step seen.
#[derive(Debug)]
struct Scratch {
    tokens: usize,
    chunks: usize,
    x: CudaSlice<f32>,
    hbuf: CudaSlice<f32>,
    qkv: CudaSlice<f32>,
    att: CudaSlice<f32>,
    o: CudaSlice<f32>,
    gu: CudaSlice<f32>,
    act: CudaSlice<f32>,
    last: CudaSlice<f32>,
    logits: CudaSlice<f32>,
}

impl Scratch {
    fn new(m: &CudaModel, tokens: usize, chunks: usize) -> Result<Scratch, String> {
        let hp = &m.hp;
        let s = &m.k.stream;
        let qkv_w = hp.q_dim() + 2 * hp.kv_dim();
        let a = |len: usize| {
            s.alloc_zeros::<f32>(len.max(1))
                .map_err(|e| format!("allocating step buffers: {e}"))
        };
        Ok(Scratch {
            tokens,
            chunks,
            x: a(tokens * hp.hidden_size)?,
            hbuf: a(tokens * hp.hidden_size)?,
            qkv: a(tokens * qkv_w)?,
            att: a(tokens * hp.q_dim())?,
            o: a(tokens * hp.hidden_size)?,
            gu: a(tokens * 2 * hp.ffn_size)?,
            act: a(tokens * hp.ffn_size)?,
            last: a(chunks * hp.hidden_size)?,
            logits: a(chunks * m.vocab)?,
        })
    }
}

/// One engine's K/V blocks on the GPU and the forward pass over them.
pub struct CudaRunner {
    m: Arc<CudaModel>,
    /// `2 · layers` planes (K of each layer, then V of each layer) of `num_blocks` blocks.
    kv: CudaSlice<f32>,
    geo: KvGeometry,
    num_blocks: usize,
    block_size: usize,
    /// Host copy of the blocks for steps run on the CPU (created on the first one).
    mirror: Option<KvTensors>,
    /// Per block: the GPU holds data the mirror lacks.
    dev_newer: Vec<bool>,
    scratch: Option<Scratch>,
}

impl std::fmt::Debug for CudaRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaRunner")
            .field("model", &self.m)
            .field("num_blocks", &self.num_blocks)
            .field("block_size", &self.block_size)
            .field("mirror", &self.mirror.is_some())
            .finish_non_exhaustive()
    }
}

impl CudaRunner {
    /// Uploads `model`'s primary route (once per model) and allocates zeroed K/V blocks.
    ///
    /// # Errors
    /// No usable CUDA device, kernels that do not compile, a failed upload or allocation.
    pub fn new(
        model: &Arc<LoadedModel>,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<CudaRunner, String> {
        if num_blocks == 0 || block_size == 0 {
            return Err("num_blocks and block_size must be positive".into());
        }
        int(num_blocks * block_size, "num_blocks × block_size")?;
        let k = super::kernels()?;
        let m = model_for(model, k)?;
        let hp = &m.hp;
        let block_len = block_size * hp.kv_dim();
        let geo = KvGeometry {
            planes: 2 * hp.num_layers,
            plane_len: num_blocks * block_len,
            block_len,
        };
        let kv =
            m.k.stream
                .alloc_zeros::<f32>(geo.planes * geo.plane_len)
                .map_err(|e| {
                    format!(
                        "allocating {} MiB of K/V blocks: {e}",
                        (geo.planes * geo.plane_len * 4) >> 20
                    )
                })?;
        m.k.sync()?;
        Ok(CudaRunner {
            kv,
            geo,
            num_blocks,
            block_size,
            mirror: None,
            dev_newer: vec![false; num_blocks],
            scratch: None,
            m,
        })
    }

    pub fn device_name(&self) -> &str {
        &self.m.k.name
    }

    /// One step: the primary route on the GPU, the fallback route on the CPU (see the module
    /// documentation). Same contract as [`LoadedModel::forward`].
    ///
    /// # Errors
    /// [`ModelError::InvalidInput`] for a chunk that does not fit (nothing is written then);
    /// [`ModelError::DeviceUnavailable`] when a CUDA call fails.
    pub fn forward(
        &mut self,
        model: &LoadedModel,
        route: Route,
        chunks: &[SeqChunk<'_>],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        self.validate(chunks)?;
        if chunks.is_empty() {
            return Ok(Vec::new());
        }
        match route {
            Route::Primary => self.forward_gpu(chunks),
            Route::Fallback => self.forward_cpu(model, route, chunks),
        }
    }

    /// The same checks, in the same order and with the same messages, as the CPU forward.
    fn validate(&self, chunks: &[SeqChunk<'_>]) -> Result<(), ModelError> {
        crate::model::llama::validate_chunks(
            &self.m.hp,
            self.m.rope_max_pos,
            self.block_size,
            self.num_blocks,
            chunks,
        )
    }

    fn forward_gpu(&mut self, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, ModelError> {
        let bs = self.block_size;
        let n: usize = chunks.iter().map(|c| c.tokens.len()).sum();
        let nc = chunks.len();
        // One index upload per step: tokens | positions | slots | table offsets | last rows |
        // block tables (each chunk's table up to the blocks it needs).
        let mut tokens = Vec::with_capacity(n);
        let mut pos = Vec::with_capacity(n);
        let mut slots = Vec::with_capacity(n);
        let mut bt_off = Vec::with_capacity(n);
        let mut last = Vec::with_capacity(nc);
        let mut tables: Vec<i32> = Vec::new();
        for c in chunks {
            let end = c.start_pos + c.tokens.len();
            let off = tables.len() as i32;
            tables.extend(c.block_table[..end.div_ceil(bs)].iter().map(|&b| b as i32));
            for (j, &t) in c.tokens.iter().enumerate() {
                let p = c.start_pos + j;
                tokens.push(t as i32);
                pos.push(p as i32);
                slots.push((c.block_table[p / bs] as usize * bs + p % bs) as i32);
                bt_off.push(off);
            }
            last.push(tokens.len() as i32 - 1);
        }
        if tables.len() > i32::MAX as usize {
            return Err(ModelError::InvalidInput("block tables too long".into()));
        }
        let mut meta = tokens;
        meta.extend_from_slice(&pos);
        meta.extend_from_slice(&slots);
        meta.extend_from_slice(&bt_off);
        meta.extend_from_slice(&last);
        meta.extend_from_slice(&tables);
        // Marked before the step runs: a step that fails half-way may still have written.
        for c in chunks {
            let end = c.start_pos + c.tokens.len();
            for &b in &c.block_table[c.start_pos / bs..end.div_ceil(bs)] {
                self.dev_newer[b as usize] = true;
            }
        }
        let logits = self.run_gpu(&meta, n, nc).map_err(dev_err)?;
        let vocab = self.m.vocab;
        Ok(logits.chunks_exact(vocab).map(<[f32]>::to_vec).collect())
    }

    fn run_gpu(&mut self, meta: &[i32], n: usize, nc: usize) -> Result<Vec<f32>, String> {
        let m = &*self.m;
        let k = &*m.k;
        let hp = &m.hp;
        if self
            .scratch
            .as_ref()
            .is_none_or(|s| s.tokens < n || s.chunks < nc)
        {
            let (t, c) = self
                .scratch
                .as_ref()
                .map_or((0, 0), |s| (s.tokens, s.chunks));
            self.scratch = None; // free before allocating the larger set
            self.scratch = Some(Scratch::new(
                m,
                n.max(t).next_power_of_two().max(16),
                nc.max(c).next_power_of_two().max(16),
            )?);
        }
        let Some(s) = self.scratch.as_mut() else {
            unreachable!("scratch allocated above")
        };
        let kv = &mut self.kv;
        let dmeta = k
            .stream
            .clone_htod(meta)
            .map_err(|e| format!("uploading step indices: {e}"))?;
        let tok_v = dmeta.slice(0..n);
        let pos_v = dmeta.slice(n..2 * n);
        let slot_v = dmeta.slice(2 * n..3 * n);
        let bt_v = dmeta.slice(3 * n..4 * n);
        let last_v = dmeta.slice(4 * n..4 * n + nc);
        let tables_v = dmeta.slice(4 * n + nc..);

        let h = hp.hidden_size;
        let (qd, kvd, hd) = (hp.q_dim(), hp.kv_dim(), hp.head_dim);
        let qkv_w = qd + 2 * kvd;
        let f = hp.ffn_size;
        let layers = hp.num_layers;
        let shape = AttnShape {
            n,
            qkv_w,
            num_heads: hp.num_heads,
            num_kv_heads: hp.num_kv_heads,
            head_dim: hd,
            block_size: self.block_size,
        };
        k.embed_gather(&m.embed, &tok_v, &mut s.x, n, h)?;
        for (l, w) in m.layers.iter().enumerate() {
            let (k_off, v_off) = (l * self.geo.plane_len, (layers + l) * self.geo.plane_len);
            k.rmsnorm(&s.x, &w.attn_norm, &mut s.hbuf, n, h, hp.rms_eps)?;
            k.matmul(&s.hbuf, &w.wqkv, &mut s.qkv, n, qkv_w, h)?;
            k.rope(
                &mut s.qkv,
                &m.rope,
                &pos_v,
                n,
                qkv_w,
                hp.num_heads + hp.num_kv_heads,
                hd,
                m.rope_half,
            )?;
            k.kv_write(&s.qkv, kv, &slot_v, k_off, v_off, n, qkv_w, qd, kvd)?;
            k.paged_attention(
                &s.qkv, kv, &mut s.att, &pos_v, &bt_v, &tables_v, k_off, v_off, shape,
            )?;
            k.matmul(&s.att, &w.wo, &mut s.o, n, h, qd)?;
            k.add(&mut s.x, &s.o, n * h)?;
            k.rmsnorm(&s.x, &w.ffn_norm, &mut s.hbuf, n, h, hp.rms_eps)?;
            k.matmul(&s.hbuf, &w.w_gate_up, &mut s.gu, n, 2 * f, h)?;
            k.silu_mul(&s.gu, &mut s.act, n, f)?;
            k.matmul(&s.act, &w.w_down, &mut s.o, n, h, f)?;
            k.add(&mut s.x, &s.o, n * h)?;
        }
        k.rmsnorm_gather(&s.x, &m.out_norm, &mut s.last, &last_v, nc, h, hp.rms_eps)?;
        k.matmul(&s.last, m.head(), &mut s.logits, nc, m.vocab, h)?;
        let mut out = vec![0f32; nc * m.vocab];
        k.stream
            .memcpy_dtoh(&s.logits.slice(0..nc * m.vocab), &mut out)
            .map_err(|e| format!("downloading logits: {e}"))?;
        k.sync()?;
        Ok(out)
    }

    /// A step on the CPU over the host mirror of the blocks.
    fn forward_cpu(
        &mut self,
        model: &LoadedModel,
        route: Route,
        chunks: &[SeqChunk<'_>],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let bs = self.block_size;
        let mut read: Vec<u32> = Vec::new();
        let mut written: Vec<u32> = Vec::new();
        for c in chunks {
            let end = c.start_pos + c.tokens.len();
            read.extend_from_slice(&c.block_table[..end.div_ceil(bs)]);
            written.extend_from_slice(&c.block_table[c.start_pos / bs..end.div_ceil(bs)]);
        }
        read.retain(|&b| self.dev_newer[b as usize]);
        read.sort_unstable();
        read.dedup();
        written.sort_unstable();
        written.dedup();
        if self.mirror.is_none() {
            let hp = &self.m.hp;
            self.mirror = Some(KvTensors::new(
                hp.num_layers,
                self.num_blocks,
                bs,
                hp.num_kv_heads,
                hp.head_dim,
            ));
        }
        self.download(&read).map_err(dev_err)?;
        let Some(mirror) = self.mirror.as_mut() else {
            unreachable!("mirror created above")
        };
        let out = model.forward(route, chunks, mirror)?;
        self.upload(&written).map_err(dev_err)?;
        Ok(out)
    }

    /// Plane `p` of the mirror: K of layer `p` for `p < layers`, else V of layer `p − layers`.
    fn mirror_plane(mirror: &mut KvTensors, layers: usize, p: usize) -> &mut [f32] {
        let (k, v) = mirror.layer_mut(p % layers);
        if p < layers { k } else { v }
    }

    /// Device → mirror for `blocks` (all planes).
    fn download(&mut self, blocks: &[u32]) -> Result<(), String> {
        if blocks.is_empty() {
            return Ok(());
        }
        let k = &*self.m.k;
        let geo = self.geo;
        let ids: Vec<i32> = blocks.iter().map(|&b| b as i32).collect();
        let dids = k.stream.clone_htod(&ids).map_err(|e| e.to_string())?;
        let total = geo.planes * blocks.len() * geo.block_len;
        let mut staging = k
            .stream
            .alloc_zeros::<f32>(total)
            .map_err(|e| format!("allocating {} MiB of staging: {e}", (total * 4) >> 20))?;
        k.kv_gather_blocks(&self.kv, &mut staging, &dids, geo)?;
        let host = k
            .stream
            .clone_dtoh(&staging)
            .map_err(|e| format!("downloading K/V blocks: {e}"))?;
        k.sync()?;
        let layers = self.m.hp.num_layers;
        let Some(mirror) = self.mirror.as_mut() else {
            unreachable!("download without a mirror")
        };
        let bl = geo.block_len;
        for p in 0..geo.planes {
            let plane = Self::mirror_plane(mirror, layers, p);
            for (i, &b) in blocks.iter().enumerate() {
                let src = (p * blocks.len() + i) * bl;
                plane[b as usize * bl..(b as usize + 1) * bl].copy_from_slice(&host[src..src + bl]);
            }
        }
        for &b in blocks {
            self.dev_newer[b as usize] = false;
        }
        Ok(())
    }

    /// Mirror → device for `blocks` (all planes).
    fn upload(&mut self, blocks: &[u32]) -> Result<(), String> {
        if blocks.is_empty() {
            return Ok(());
        }
        let geo = self.geo;
        let bl = geo.block_len;
        let layers = self.m.hp.num_layers;
        let Some(mirror) = self.mirror.as_mut() else {
            unreachable!("upload without a mirror")
        };
        let mut host = Vec::with_capacity(geo.planes * blocks.len() * bl);
        for p in 0..geo.planes {
            let plane = Self::mirror_plane(mirror, layers, p);
            for &b in blocks {
                host.extend_from_slice(&plane[b as usize * bl..(b as usize + 1) * bl]);
            }
        }
        let k = &*self.m.k;
        let ids: Vec<i32> = blocks.iter().map(|&b| b as i32).collect();
        let dids = k.stream.clone_htod(&ids).map_err(|e| e.to_string())?;
        let staging = k
            .stream
            .clone_htod(&host)
            .map_err(|e| format!("uploading K/V blocks: {e}"))?;
        k.kv_scatter_blocks(&mut self.kv, &staging, &dids, geo)?;
        k.sync()
    }

    /// Copies block `src` into `dst` in every layer (copy-on-write of a shared prefix block).
    ///
    /// # Errors
    /// A block id out of range, or a CUDA error.
    pub fn copy_block(&mut self, src: u32, dst: u32) -> Result<(), ModelError> {
        let (s, d) = ModelError::check_block_pair(src, dst, self.num_blocks)?;
        let k = &*self.m.k;
        k.kv_copy_block(&mut self.kv, s, d, self.geo)
            .and_then(|()| k.sync())
            .map_err(dev_err)?;
        if let Some(m) = self.mirror.as_mut() {
            m.copy_block(src, dst)?;
        }
        self.dev_newer[d] = self.dev_newer[s];
        Ok(())
    }
}

/// Each kernel on its own, over host data, for the tests that compare them with the CPU.
#[derive(Debug, Clone)]
pub struct KernelHarness {
    k: Arc<Kernels>,
}

impl KernelHarness {
    /// # Errors
    /// As [`super::kernels()`].
    pub fn new() -> Result<KernelHarness, String> {
        Ok(KernelHarness {
            k: super::kernels()?,
        })
    }

    pub fn device_name(&self) -> &str {
        &self.k.name
    }

    fn up<T: cudarc::driver::DeviceRepr>(&self, v: &[T]) -> Result<CudaSlice<T>, String> {
        self.k.stream.clone_htod(v).map_err(|e| e.to_string())
    }

    fn zeros(&self, len: usize) -> Result<CudaSlice<f32>, String> {
        self.k
            .stream
            .alloc_zeros::<f32>(len.max(1))
            .map_err(|e| e.to_string())
    }

    fn down(&self, d: &CudaSlice<f32>, len: usize) -> Result<Vec<f32>, String> {
        let mut v = self.k.stream.clone_dtoh(d).map_err(|e| e.to_string())?;
        self.k.sync()?;
        v.truncate(len);
        Ok(v)
    }

    fn ints(v: &[usize]) -> Result<Vec<i32>, String> {
        v.iter().map(|&x| int(x, "index")).collect()
    }

    /// `out[i] = rmsnorm(x[i]) · w` for `x` of `n` rows of `w.len()`.
    ///
    /// # Errors
    /// A CUDA error.
    pub fn rmsnorm(&self, x: &[f32], w: &[f32], eps: f32) -> Result<Vec<f32>, String> {
        let h = w.len();
        let n = x.len() / h;
        let (dx, dw, mut out) = (self.up(x)?, self.up(w)?, self.zeros(n * h)?);
        self.k.rmsnorm(&dx, &dw, &mut out, n, h, eps)?;
        self.down(&out, n * h)
    }

    /// `y[n][rows] = x[n][cols] · wᵀ`.
    ///
    /// # Errors
    /// A CUDA error.
    pub fn matmul(
        &self,
        x: &[f32],
        n: usize,
        w: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<Vec<f32>, String> {
        let (dx, dw, mut y) = (self.up(x)?, self.up(w)?, self.zeros(n * rows)?);
        self.k.matmul(&dx, &dw, &mut y, n, rows, cols)?;
        self.down(&y, n * rows)
    }

    /// RoPE on the Q and K heads of `n` qkv rows (`qkv_w = q_dim + 2·kv_dim` wide), token `i` at
    /// `positions[i]`, with the model's table.
    ///
    /// # Errors
    /// A CUDA error.
    pub fn rope(
        &self,
        hp: &HyperParams,
        qkv: &[f32],
        positions: &[usize],
    ) -> Result<Vec<f32>, String> {
        let n = positions.len();
        let qkv_w = hp.q_dim() + 2 * hp.kv_dim();
        let (table, half, _) = rope_table(hp);
        let mut d = self.up(qkv)?;
        let dt = self.up(&table)?;
        let dp = self.up(&Self::ints(positions)?)?;
        let heads = hp.num_heads + hp.num_kv_heads;
        self.k.rope(
            &mut d,
            &dt,
            &dp.as_view(),
            n,
            qkv_w,
            heads,
            hp.head_dim,
            half,
        )?;
        self.down(&d, n * qkv_w)
    }

    /// `silu(gate) · up` for `n` rows of `gu = [gate (f) | up (f)]`.
    ///
    /// # Errors
    /// A CUDA error.
    pub fn silu_mul(&self, gu: &[f32], f: usize) -> Result<Vec<f32>, String> {
        let n = gu.len() / (2 * f);
        let (dg, mut act) = (self.up(gu)?, self.zeros(n * f)?);
        self.k.silu_mul(&dg, &mut act, n, f)?;
        self.down(&act, n * f)
    }

    /// `x + o`.
    ///
    /// # Errors
    /// A CUDA error.
    pub fn add(&self, x: &[f32], o: &[f32]) -> Result<Vec<f32>, String> {
        let (mut dx, dout) = (self.up(x)?, self.up(o)?);
        self.k.add(&mut dx, &dout, x.len())?;
        self.down(&dx, x.len())
    }

    /// Rows `tokens` of `embed` (`h` wide).
    ///
    /// # Errors
    /// A CUDA error.
    pub fn embed(&self, embed: &[f32], h: usize, tokens: &[usize]) -> Result<Vec<f32>, String> {
        let n = tokens.len();
        let (de, dt, mut x) = (
            self.up(embed)?,
            self.up(&Self::ints(tokens)?)?,
            self.zeros(n * h)?,
        );
        self.k.embed_gather(&de, &dt.as_view(), &mut x, n, h)?;
        self.down(&x, n * h)
    }

    /// Writes the K and V parts of `n` qkv rows into zeroed K and V caches of `cache_len`
    /// floats each at `slots`; returns (K, V).
    ///
    /// # Errors
    /// A CUDA error.
    pub fn kv_write(
        &self,
        hp: &HyperParams,
        qkv: &[f32],
        slots: &[usize],
        cache_len: usize,
    ) -> Result<(Vec<f32>, Vec<f32>), String> {
        let n = slots.len();
        let (qd, kvd) = (hp.q_dim(), hp.kv_dim());
        let dq = self.up(qkv)?;
        let ds = self.up(&Self::ints(slots)?)?;
        let mut kv = self.zeros(2 * cache_len)?;
        self.k.kv_write(
            &dq,
            &mut kv,
            &ds.as_view(),
            0,
            cache_len,
            n,
            qd + 2 * kvd,
            qd,
            kvd,
        )?;
        let all = self.down(&kv, 2 * cache_len)?;
        Ok((all[..cache_len].to_vec(), all[cache_len..].to_vec()))
    }

    /// Paged attention: token `i` (query row `qkv[i]`, `qkv_w` wide, Q heads first) attends to
    /// positions `0..=positions[i]` of the caches through `tables[i]`.
    ///
    /// # Errors
    /// A CUDA error.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_attention(
        &self,
        hp: &HyperParams,
        qkv: &[f32],
        positions: &[usize],
        tables: &[&[u32]],
        k_cache: &[f32],
        v_cache: &[f32],
        block_size: usize,
    ) -> Result<Vec<f32>, String> {
        let n = positions.len();
        let qd = hp.q_dim();
        let mut off = Vec::with_capacity(n);
        let mut flat: Vec<i32> = Vec::new();
        for t in tables {
            off.push(flat.len() as i32);
            flat.extend(t.iter().map(|&b| b as i32));
        }
        let mut kv_host = k_cache.to_vec();
        kv_host.extend_from_slice(v_cache);
        let dq = self.up(qkv)?;
        let dkv = self.up(&kv_host)?;
        let dp = self.up(&Self::ints(positions)?)?;
        let doff = self.up(&off)?;
        let dflat = self.up(&flat)?;
        let mut out = self.zeros(n * qd)?;
        let shape = AttnShape {
            n,
            qkv_w: qd + 2 * hp.kv_dim(),
            num_heads: hp.num_heads,
            num_kv_heads: hp.num_kv_heads,
            head_dim: hp.head_dim,
            block_size,
        };
        self.k.paged_attention(
            &dq,
            &dkv,
            &mut out,
            &dp.as_view(),
            &doff.as_view(),
            &dflat.as_view(),
            0,
            k_cache.len(),
            shape,
        )?;
        self.down(&out, n * qd)
    }
}
