//! The Llama forward pass on the CPU over the paged KV cache.
//!
//! ```text
//!  tokens of all chunks ─ embed ─┐
//!   per layer:  x += Wo · attn(rope(Wqkv · rmsnorm(x)))      K,V of new tokens → blocks
//!               x += Wdown · (silu(Wgate · h) ⊙ (Wup · h)),  h = rmsnorm(x)
//!  last token of each chunk ─ rmsnorm ─ head (tied to the embedding) ─> logits
//! ```
//!
//! RoPE is GGML's "normal" mode (adjacent pairs `x[2i], x[2i+1]`): llama.cpp's converter permutes
//! the Q/K weights of Hugging Face Llama checkpoints for it. Attention reads each earlier position
//! straight from its block through the chunk's block table (no gather into a contiguous copy).

use rayon::prelude::*;

use super::cpu::{self, MatData, Matrix};
use super::gguf::{GgmlType, Gguf, MetaValue};
use super::{KvTensors, ModelError, SeqChunk, quant};

/// Hyper-parameters read from the GGUF metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct HyperParams {
    pub arch: String,
    pub num_layers: usize,
    pub hidden_size: usize,
    pub ffn_size: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rope_base: f32,
    pub rope_dim: usize,
    /// Positions are divided by this (`rope.scaling.type = linear`), 1 otherwise.
    pub rope_scale: f32,
    pub rms_eps: f32,
}

impl HyperParams {
    /// # Errors
    /// [`ModelError::Metadata`] when a required key is missing or inconsistent.
    pub fn from_gguf(g: &Gguf<'_>) -> Result<HyperParams, ModelError> {
        let arch = g
            .get("general.architecture")
            .and_then(MetaValue::as_str)
            .ok_or_else(|| meta_err("general.architecture", "missing"))?
            .to_string();
        if arch != "llama" {
            return Err(ModelError::Unsupported(format!(
                "architecture {arch:?} (only \"llama\")"
            )));
        }
        let int = |k: &str| -> Result<usize, ModelError> {
            let key = format!("{arch}.{k}");
            g.get(&key)
                .and_then(MetaValue::as_u64)
                .map(|v| v as usize)
                .ok_or_else(|| meta_err(&key, "missing or not an integer"))
        };
        let float = |k: &str, default: f32| -> f32 {
            g.get(&format!("{arch}.{k}"))
                .and_then(MetaValue::as_f64)
                .map_or(default, |v| v as f32)
        };
        let num_layers = int("block_count")?;
        let hidden_size = int("embedding_length")?;
        let ffn_size = int("feed_forward_length")?;
        let num_heads = int("attention.head_count")?;
        let num_kv_heads = int("attention.head_count_kv").unwrap_or(num_heads);
        let context_length = int("context_length")?;
        if num_heads == 0 || num_kv_heads == 0 || hidden_size % num_heads != 0 {
            return Err(meta_err(
                "attention.head_count",
                "does not divide embedding_length",
            ));
        }
        if num_heads % num_kv_heads != 0 {
            return Err(meta_err(
                "attention.head_count_kv",
                "does not divide attention.head_count",
            ));
        }
        let head_dim = hidden_size / num_heads;
        let rope_dim = int("rope.dimension_count").unwrap_or(head_dim);
        if rope_dim > head_dim || rope_dim % 2 != 0 {
            return Err(meta_err(
                "rope.dimension_count",
                "odd or larger than the head size",
            ));
        }
        let rope_scale = match g
            .get(&format!("{arch}.rope.scaling.type"))
            .and_then(MetaValue::as_str)
        {
            None | Some("none") => 1.0,
            Some("linear") => float("rope.scaling.factor", 1.0),
            Some(other) => {
                return Err(ModelError::Unsupported(format!("rope scaling {other:?}")));
            }
        };
        let vocab_size = g
            .tensor("token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .ok_or_else(|| meta_err("token_embd.weight", "tensor missing"))?
            as usize;
        if num_layers == 0 || num_layers > 1024 || context_length == 0 {
            return Err(meta_err("block_count", "out of range"));
        }
        Ok(HyperParams {
            num_layers,
            hidden_size,
            ffn_size,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size,
            context_length,
            rope_base: float("rope.freq_base", 10000.0),
            rope_dim,
            rope_scale: if rope_scale > 0.0 { rope_scale } else { 1.0 },
            rms_eps: float("attention.layer_norm_rms_epsilon", 1e-5),
            arch,
        })
    }

    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}

fn meta_err(key: &str, reason: &str) -> ModelError {
    ModelError::Metadata {
        key: key.to_string(),
        reason: reason.to_string(),
    }
}

/// One decoder layer's weights.
#[derive(Debug)]
pub struct Layer {
    pub attn_norm: Vec<f32>,
    /// Q, K and V stacked: `q_dim + 2·kv_dim` rows.
    pub wqkv: Matrix,
    pub wo: Matrix,
    pub ffn_norm: Vec<f32>,
    /// Gate and up stacked: `2·ffn` rows.
    pub w_gate_up: Matrix,
    pub w_down: Matrix,
}

/// All weights of one route.
#[derive(Debug)]
pub struct RouteWeights {
    pub embed: Matrix,
    pub layers: Vec<Layer>,
    pub out_norm: Vec<f32>,
    /// `None`: tied to `embed`.
    pub head: Option<Matrix>,
}

impl RouteWeights {
    /// Reads every tensor; `quantized` keeps Q4_0/Q4_1/Q8_0 matrices as they are, otherwise
    /// everything is dequantised to f32.
    ///
    /// # Errors
    /// A missing tensor or one whose shape does not match the hyper-parameters.
    pub fn load(
        g: &Gguf<'_>,
        hp: &HyperParams,
        quantized: bool,
    ) -> Result<RouteWeights, ModelError> {
        let h = hp.hidden_size;
        // Each matrix is finished as soon as it is read, so that only one dequantised f32
        // copy is alive at a time (its heap space is reused by the next one, and the packed
        // copies live in their own mappings): quantised matrices are repacked once for the
        // integer kernel (BROWNOUT_QUANT=tiles: only their scales converted, for the older one); f32 ones are packed for the CPU micro-kernel (unless
        // BROWNOUT_MATMUL picks another kernel).
        let pack = cpu::Kernel::from_env() == cpu::Kernel::Packed;
        let repack = cpu::repack_quantised();
        let finish = |m: Matrix| {
            let m = if repack { m.repacked() } else { m.prepared() };
            if pack { m.packed() } else { m }
        };
        let mat =
            |name: &str, rows: usize, cols: usize| load_matrix(g, name, rows, cols, quantized);
        let vec = |name: &str, len: usize| load_vector(g, name, len);
        let mut layers = Vec::with_capacity(hp.num_layers);
        for i in 0..hp.num_layers {
            let p = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(Layer {
                attn_norm: vec(&p("attn_norm"), h)?,
                wqkv: finish(Matrix::concat_rows(vec![
                    mat(&p("attn_q"), hp.q_dim(), h)?,
                    mat(&p("attn_k"), hp.kv_dim(), h)?,
                    mat(&p("attn_v"), hp.kv_dim(), h)?,
                ])),
                wo: finish(mat(&p("attn_output"), h, hp.q_dim())?),
                ffn_norm: vec(&p("ffn_norm"), h)?,
                w_gate_up: finish(Matrix::concat_rows(vec![
                    mat(&p("ffn_gate"), hp.ffn_size, h)?,
                    mat(&p("ffn_up"), hp.ffn_size, h)?,
                ])),
                w_down: finish(mat(&p("ffn_down"), h, hp.ffn_size)?),
            });
        }
        let head = if g.tensor("output.weight").is_some() {
            Some(finish(mat("output.weight", hp.vocab_size, h)?))
        } else {
            None
        };
        let w = RouteWeights {
            embed: finish(mat("token_embd.weight", hp.vocab_size, h)?),
            layers,
            out_norm: vec("output_norm.weight", h)?,
            head,
        };
        Ok(w)
    }

    pub fn bytes(&self) -> usize {
        let mut b = self.embed.bytes() + self.out_norm.len() * 4;
        b += self.head.as_ref().map_or(0, Matrix::bytes);
        for l in &self.layers {
            b += l.wqkv.bytes() + l.wo.bytes() + l.w_gate_up.bytes() + l.w_down.bytes();
            b += (l.attn_norm.len() + l.ffn_norm.len()) * 4;
        }
        b
    }

    pub fn head(&self) -> &Matrix {
        self.head.as_ref().unwrap_or(&self.embed)
    }
}

fn tensor<'g>(g: &'g Gguf<'_>, name: &str) -> Result<&'g super::gguf::TensorInfo, ModelError> {
    g.tensor(name)
        .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
}

fn shape_err(name: &str, want: &[u64], got: &[u64]) -> ModelError {
    ModelError::TensorShape {
        name: name.to_string(),
        expected: want.to_vec(),
        found: got.to_vec(),
    }
}

fn load_matrix(
    g: &Gguf<'_>,
    name: &str,
    rows: usize,
    cols: usize,
    quantized: bool,
) -> Result<Matrix, ModelError> {
    let t = tensor(g, name)?;
    let want = [cols as u64, rows as u64];
    if t.dims != want {
        return Err(shape_err(name, &want, &t.dims));
    }
    let data = g.tensor_data(t);
    let keep = quantized && matches!(t.ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0);
    Ok(if keep {
        Matrix {
            rows,
            cols,
            data: MatData::Quant(t.ty, data.to_vec()),
        }
    } else {
        let mut v = vec![0f32; rows * cols];
        quant::dequantize(t.ty, data, &mut v);
        Matrix::f32(rows, cols, v)
    })
}

fn load_vector(g: &Gguf<'_>, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let t = tensor(g, name)?;
    if t.dims != [len as u64] {
        return Err(shape_err(name, &[len as u64], &t.dims));
    }
    let mut v = vec![0f32; len];
    quant::dequantize(t.ty, g.tensor_data(t), &mut v);
    Ok(v)
}

/// cos/sin of every (position, pair) up to the context length.
#[derive(Debug)]
pub struct RopeTable {
    half: usize,
    /// `[pos][pair]` interleaved (cos, sin).
    cs: Vec<(f32, f32)>,
}

impl RopeTable {
    pub fn new(hp: &HyperParams) -> RopeTable {
        let half = hp.rope_dim / 2;
        let max_pos = hp.context_length.min(1 << 17);
        let inv: Vec<f32> = (0..half)
            .map(|i| hp.rope_base.powf(-(2.0 * i as f32) / hp.rope_dim as f32))
            .collect();
        let mut cs = Vec::with_capacity(max_pos * half);
        for p in 0..max_pos {
            let pos = p as f32 / hp.rope_scale;
            for &f in &inv {
                let (s, c) = (pos * f).sin_cos();
                cs.push((c, s));
            }
        }
        RopeTable { half, cs }
    }

    pub fn max_pos(&self) -> usize {
        self.cs.len() / self.half.max(1)
    }

    /// Rotates adjacent pairs of the first `rope_dim` values of one head.
    #[inline]
    pub fn apply(&self, head: &mut [f32], pos: usize) {
        let cs = &self.cs[pos * self.half..(pos + 1) * self.half];
        for (i, &(c, s)) in cs.iter().enumerate() {
            let (a, b) = (head[2 * i], head[2 * i + 1]);
            head[2 * i] = a * c - b * s;
            head[2 * i + 1] = a * s + b * c;
        }
    }
}

pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let r = 1.0 / (ss + eps).sqrt();
    for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
        *o = v * r * g;
    }
}

/// Checks every chunk against the model and the KV tensors before anything is written.
fn validate(
    hp: &HyperParams,
    rope: &RopeTable,
    chunks: &[SeqChunk<'_>],
    kv: &KvTensors,
) -> Result<(), ModelError> {
    if kv.num_layers != hp.num_layers
        || kv.num_kv_heads != hp.num_kv_heads
        || kv.head_dim != hp.head_dim
    {
        return Err(ModelError::InvalidInput(format!(
            "KV tensors are for {} layers × {} KV heads × {} dims, the model has {} × {} × {}",
            kv.num_layers,
            kv.num_kv_heads,
            kv.head_dim,
            hp.num_layers,
            hp.num_kv_heads,
            hp.head_dim
        )));
    }
    validate_chunks(hp, rope.max_pos(), kv.block_size, kv.num_blocks, chunks)
}

/// The per-chunk checks every backend makes before it writes anything: tokens present and in
/// the vocabulary, positions within the model length (and the RoPE table, `max_pos`), and a
/// block table long enough whose ids are below `num_blocks`.
///
/// # Errors
/// [`ModelError::InvalidInput`] naming the chunk and the problem.
pub(crate) fn validate_chunks(
    hp: &HyperParams,
    max_pos: usize,
    block_size: usize,
    num_blocks: usize,
    chunks: &[SeqChunk<'_>],
) -> Result<(), ModelError> {
    for (i, c) in chunks.iter().enumerate() {
        let bad = |m: String| Err(ModelError::InvalidInput(format!("chunk {i}: {m}")));
        if c.tokens.is_empty() {
            return bad("no tokens".into());
        }
        let end = c.start_pos + c.tokens.len();
        if end > hp.context_length || end > max_pos {
            return bad(format!(
                "positions up to {end} exceed the model length {}",
                hp.context_length
            ));
        }
        if let Some(t) = c.tokens.iter().find(|&&t| t as usize >= hp.vocab_size) {
            return bad(format!("token id {t} ≥ vocabulary size {}", hp.vocab_size));
        }
        let need = end.div_ceil(block_size);
        if c.block_table.len() < need {
            return bad(format!(
                "{} blocks in the block table, {need} needed for {end} positions",
                c.block_table.len()
            ));
        }
        if let Some(b) = c.block_table[..need]
            .iter()
            .find(|&&b| b as usize >= num_blocks)
        {
            return bad(format!("block id {b} ≥ {num_blocks} blocks"));
        }
    }
    Ok(())
}

/// `out = silu(g) · u = g / (1 + e^-g) · u`, element-wise, with [`exp_approx`]: eight lanes
/// at a time on AVX2+FMA, the same operations one at a time elsewhere (and for the tail), so
/// every element gets the same value whatever path computed it.
pub fn silu_mul(g: &[f32], u: &[f32], out: &mut [f32]) {
    assert!(
        g.len() == u.len() && g.len() == out.len(),
        "silu_mul: lengths"
    );
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    {
        if cpu::Features::get().avx2_fma {
            // SAFETY: the features the function is compiled for were just detected.
            done = unsafe { silu_mul_avx2(g, u, out) };
        }
    }
    for ((o, &gv), &uv) in out[done..].iter_mut().zip(&g[done..]).zip(&u[done..]) {
        *o = gv / (1.0 + exp_approx(-gv)) * uv;
    }
}

/// Cephes' single-precision `exp` (range reduction by ln 2 in two parts, a degree-5
/// polynomial; within 2 ulp of the exact value), input clamped to where the result is a normal
/// finite float. Written with fused multiply-adds in the order the AVX2 version uses.
#[inline(always)]
pub fn exp_approx(x: f32) -> f32 {
    let x = x.clamp(EXP_LO, EXP_HI);
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = n.mul_add(-EXP_C1, x);
    let r = n.mul_add(-EXP_C2, r);
    let mut p = EXP_P[0];
    for &c in &EXP_P[1..] {
        p = p.mul_add(r, c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

const EXP_LO: f32 = -87.3;
const EXP_HI: f32 = 88.3;
const EXP_C1: f32 = 0.693_359_4;
const EXP_C2: f32 = -2.121_944_4e-4;
const EXP_P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

/// [`silu_mul`]'s eight-lane part; returns how many elements it wrote.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_avx2(g: &[f32], u: &[f32], out: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    let main = g.len() / 8 * 8;
    let one = _mm256_set1_ps(1.0);
    for i in (0..main).step_by(8) {
        // SAFETY: i + 8 <= main <= every length (asserted by the caller).
        unsafe {
            let gv = _mm256_loadu_ps(g.as_ptr().add(i));
            let x = _mm256_sub_ps(_mm256_setzero_ps(), gv);
            let x = _mm256_min_ps(
                _mm256_max_ps(x, _mm256_set1_ps(EXP_LO)),
                _mm256_set1_ps(EXP_HI),
            );
            let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
            );
            let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_C1), x);
            let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_C2), r);
            let mut p = _mm256_set1_ps(EXP_P[0]);
            for &c in &EXP_P[1..] {
                p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
            }
            let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), one);
            let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
                _mm256_cvtps_epi32(n),
                _mm256_set1_epi32(127),
            )));
            let e = _mm256_mul_ps(y, pow2);
            let s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
            let o = _mm256_mul_ps(s, _mm256_loadu_ps(u.as_ptr().add(i)));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), o);
        }
    }
    main
}

/// The attention geometry [`attend`] needs.
struct AttnShape {
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    block_size: usize,
    scale: f32,
}

/// One token's query (`num_heads × head_dim`), its position, its sequence's block table, and
/// one layer's K and V blocks.
#[derive(Clone, Copy)]
struct AttnInput<'a> {
    q: &'a [f32],
    kc: &'a [f32],
    vc: &'a [f32],
    table: &'a [u32],
    pos: usize,
}

/// One token's attention over positions `0..=pos` of its sequence, read from the paged K/V
/// (`[block][slot][kv head][dim]`). Positions are visited in order and each position's K (then
/// V) row is read whole, for every head at once, so the cache is read sequentially within a
/// block (and prefetched a few positions ahead) instead of once per head. `out` gets the
/// `num_heads × head_dim` result; `scores` is scratch.
fn attend(sh: &AttnShape, a: &AttnInput<'_>, out: &mut [f32], scores: &mut Vec<f32>) {
    #[cfg(target_arch = "x86_64")]
    {
        if sh.head_dim.is_multiple_of(8) && cpu::Features::get().avx2_fma {
            // SAFETY: the features the function is compiled for were just detected, and
            // head_dim is a multiple of 8 (checked above).
            unsafe { attend_avx2(sh, a, out, scores) };
            return;
        }
    }
    attend_impl::<false>(sh, a, out, scores);
}

/// [`attend_impl`] with AVX2+FMA dot products and updates.
///
/// # Safety
/// AVX2 and FMA must be available and `head_dim` a multiple of 8.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn attend_avx2(sh: &AttnShape, a: &AttnInput<'_>, out: &mut [f32], scores: &mut Vec<f32>) {
    attend_impl::<true>(sh, a, out, scores);
}

/// Positions ahead of the one being read whose K/V row is prefetched.
const PREFETCH_AHEAD: usize = 4;

#[inline(always)]
fn attend_impl<const AVX: bool>(
    sh: &AttnShape,
    a: &AttnInput<'_>,
    out: &mut [f32],
    scores: &mut Vec<f32>,
) {
    let AttnInput {
        q,
        kc,
        vc,
        table,
        pos,
    } = *a;
    let (hd, bs, nh) = (sh.head_dim, sh.block_size, sh.num_heads);
    let group = nh / sh.num_kv_heads;
    let kvd = sh.num_kv_heads * hd;
    let n = pos + 1;
    scores.clear();
    scores.resize(nh * n, 0.0);
    let row = |j: usize| (table[j / bs] as usize * bs + j % bs) * kvd;
    for j in 0..n {
        if j + PREFETCH_AHEAD < n {
            prefetch(&kc[row(j + PREFETCH_AHEAD)..row(j + PREFETCH_AHEAD) + kvd]);
        }
        let k = &kc[row(j)..row(j) + kvd];
        for (h, qh) in q.chunks_exact(hd).enumerate() {
            let kh = &k[h / group * hd..(h / group + 1) * hd];
            scores[h * n + j] = dot::<AVX>(qh, kh) * sh.scale;
        }
    }
    for s in scores.chunks_exact_mut(n) {
        let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for v in s.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        let inv = 1.0 / sum;
        for v in s.iter_mut() {
            *v *= inv;
        }
    }
    out.fill(0.0);
    for j in 0..n {
        if j + PREFETCH_AHEAD < n {
            prefetch(&vc[row(j + PREFETCH_AHEAD)..row(j + PREFETCH_AHEAD) + kvd]);
        }
        let v = &vc[row(j)..row(j) + kvd];
        for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
            let vh = &v[h / group * hd..(h / group + 1) * hd];
            axpy::<AVX>(scores[h * n + j], vh, oh);
        }
    }
}

/// Asks for the cache lines of `row` ahead of use (a hint; nothing on other architectures).
#[inline(always)]
fn prefetch(row: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    for line in row.chunks(16) {
        // SAFETY: a prefetch hint on an address inside a live slice; it never faults.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                line.as_ptr().cast::<i8>(),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

/// `Σ a·b`. With `AVX` (caller compiled for AVX2+FMA, length a multiple of 8): two 8-lane
/// fused accumulators; otherwise in order.
#[inline(always)]
fn dot<const AVX: bool>(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if AVX {
        use std::arch::x86_64::*;
        assert!(a.len() == b.len() && a.len().is_multiple_of(8));
        // SAFETY: AVX2+FMA are enabled in every caller with AVX = true; every load is of
        // 8 floats at i < len, len a multiple of 8 (asserted).
        unsafe {
            let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut i = 0;
            while i + 16 <= a.len() {
                s0 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i)),
                    _mm256_loadu_ps(b.as_ptr().add(i)),
                    s0,
                );
                s1 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i + 8)),
                    _mm256_loadu_ps(b.as_ptr().add(i + 8)),
                    s1,
                );
                i += 16;
            }
            if i < a.len() {
                s0 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i)),
                    _mm256_loadu_ps(b.as_ptr().add(i)),
                    s0,
                );
            }
            let s = _mm256_add_ps(s0, s1);
            let h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps::<1>(s));
            let h = _mm_add_ps(h, _mm_movehl_ps(h, h));
            let h = _mm_add_ss(h, _mm_shuffle_ps::<1>(h, h));
            return _mm_cvtss_f32(h);
        }
    }
    a.iter().zip(b).fold(0f32, |s, (&x, &y)| x.mul_add(y, s))
}

/// `o += p·v`. With `AVX`: 8 lanes at a time (caller compiled for AVX2+FMA, length a multiple
/// of 8); the same fused multiply-adds either way.
#[inline(always)]
fn axpy<const AVX: bool>(p: f32, v: &[f32], o: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if AVX {
        use std::arch::x86_64::*;
        assert!(v.len() == o.len() && v.len().is_multiple_of(8));
        // SAFETY: as in `dot`.
        unsafe {
            let pv = _mm256_set1_ps(p);
            for i in (0..v.len()).step_by(8) {
                let acc = _mm256_loadu_ps(o.as_ptr().add(i));
                let r = _mm256_fmadd_ps(pv, _mm256_loadu_ps(v.as_ptr().add(i)), acc);
                _mm256_storeu_ps(o.as_mut_ptr().add(i), r);
            }
        }
        return;
    }
    for (o, &vv) in o.iter_mut().zip(v) {
        *o = p.mul_add(vv, *o);
    }
}

/// Runs one step over all chunks; returns the logits of each chunk's last position.
///
/// # Errors
/// [`ModelError::InvalidInput`] when a chunk does not fit the model or the KV tensors.
pub fn forward(
    hp: &HyperParams,
    w: &RouteWeights,
    rope: &RopeTable,
    chunks: &[SeqChunk<'_>],
    kv: &mut KvTensors,
) -> Result<Vec<Vec<f32>>, ModelError> {
    validate(hp, rope, chunks, kv)?;
    if chunks.is_empty() {
        return Ok(Vec::new());
    }
    let h = hp.hidden_size;
    let (qd, kvd, hd) = (hp.q_dim(), hp.kv_dim(), hp.head_dim);
    let qkv_w = qd + 2 * kvd;
    // token index → (chunk, position)
    let mut tok: Vec<(usize, usize)> = Vec::new();
    for (ci, c) in chunks.iter().enumerate() {
        for j in 0..c.tokens.len() {
            tok.push((ci, c.start_pos + j));
        }
    }
    let n = tok.len();
    let mut x = vec![0f32; n * h];
    {
        let mut i = 0;
        for c in chunks {
            for &t in c.tokens {
                w.embed.row_f32(t as usize, &mut x[i * h..(i + 1) * h]);
                i += 1;
            }
        }
    }
    let mut hbuf = vec![0f32; n * h];
    let mut qkv = vec![0f32; n * qkv_w];
    let mut att = vec![0f32; n * qd];
    let mut o = vec![0f32; n * h];
    let mut gu = vec![0f32; n * 2 * hp.ffn_size];
    let mut act = vec![0f32; n * hp.ffn_size];
    let bs = kv.block_size;
    let nkv = hp.num_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    for (l, layer) in w.layers.iter().enumerate() {
        for i in 0..n {
            rmsnorm(
                &x[i * h..(i + 1) * h],
                &layer.attn_norm,
                hp.rms_eps,
                &mut hbuf[i * h..(i + 1) * h],
            );
        }
        cpu::matmul(&hbuf, n, &layer.wqkv, &mut qkv);
        // RoPE on Q and K; K/V of the new positions into their blocks.
        let (kc, vc) = kv.layer_mut(l);
        for (i, &(ci, pos)) in tok.iter().enumerate() {
            let row = &mut qkv[i * qkv_w..(i + 1) * qkv_w];
            for hh in 0..hp.num_heads + nkv {
                rope.apply(&mut row[hh * hd..(hh + 1) * hd], pos);
            }
            let blk = chunks[ci].block_table[pos / bs] as usize;
            let base = (blk * bs + pos % bs) * kvd;
            kc[base..base + kvd].copy_from_slice(&row[qd..qd + kvd]);
            vc[base..base + kvd].copy_from_slice(&row[qd + kvd..qd + 2 * kvd]);
        }
        let (kc, vc) = (&*kc, &*vc);
        let qkv_ref = &qkv;
        let tok_ref = &tok;
        let shape = AttnShape {
            num_heads: hp.num_heads,
            num_kv_heads: nkv,
            head_dim: hd,
            block_size: bs,
            scale,
        };
        att.par_chunks_mut(qd)
            .enumerate()
            .for_each_init(Vec::new, |scores, (i, out)| {
                let (ci, pos) = tok_ref[i];
                let q = &qkv_ref[i * qkv_w..i * qkv_w + qd];
                let input = AttnInput {
                    q,
                    kc,
                    vc,
                    table: chunks[ci].block_table,
                    pos,
                };
                attend(&shape, &input, out, scores);
            });
        cpu::matmul(&att, n, &layer.wo, &mut o);
        for (xv, ov) in x.iter_mut().zip(&o) {
            *xv += ov;
        }
        for i in 0..n {
            rmsnorm(
                &x[i * h..(i + 1) * h],
                &layer.ffn_norm,
                hp.rms_eps,
                &mut hbuf[i * h..(i + 1) * h],
            );
        }
        cpu::matmul(&hbuf, n, &layer.w_gate_up, &mut gu);
        let f = hp.ffn_size;
        act.par_chunks_mut(f)
            .zip(gu.par_chunks(2 * f))
            .with_min_len(4)
            .for_each(|(a, gu)| {
                let (g, u) = gu.split_at(f);
                silu_mul(g, u, a);
            });
        cpu::matmul(&act, n, &layer.w_down, &mut o);
        for (xv, ov) in x.iter_mut().zip(&o) {
            *xv += ov;
        }
    }
    // Last position of each chunk.
    let nc = chunks.len();
    let mut last = vec![0f32; nc * h];
    let mut end = 0;
    for (ci, c) in chunks.iter().enumerate() {
        end += c.tokens.len();
        rmsnorm(
            &x[(end - 1) * h..end * h],
            &w.out_norm,
            hp.rms_eps,
            &mut last[ci * h..(ci + 1) * h],
        );
    }
    let head = w.head();
    let mut logits = vec![0f32; nc * head.rows];
    cpu::matmul(&last, nc, head, &mut logits);
    Ok(logits
        .chunks_exact(head.rows)
        .map(<[f32]>::to_vec)
        .collect())
}
