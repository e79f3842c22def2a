//! The CUDA C source of every kernel, compiled with NVRTC when the backend starts, and the
//! launch helpers that pair each kernel with its argument list and launch configuration.
//!
//! Conventions: activations are row-major `[token][feature]` f32; a weight matrix is row-major
//! `[rows][cols]` f32 and a matmul computes `y[n][rows] = x[n][cols] · Wᵀ` (the CPU's contract).
//! The K/V memory of a runner is ONE buffer of `2 · layers` planes of
//! `num_blocks · block_size · num_kv_heads · head_dim` floats (plane `l` = K of layer `l`, plane
//! `layers + l` = V of layer `l`), each plane in vLLM's `[block][slot][kv_head][dim]` layout.
//! Every index that can exceed 2³¹ is computed in `long long`. All block sizes are multiples of
//! 32 (the warp reductions use full-warp shuffles).

use std::sync::Arc;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView, DriverError,
    LaunchConfig, PushKernelArg,
};

/// Largest head size the attention kernel holds in shared memory.
pub const MAX_HEAD_DIM: usize = 256;

/// Kernel source (CUDA C, no includes: NVRTC provides `expf`, `sqrtf`, `fmaxf`, the `__*_rn`
/// intrinsics and `__shfl_xor_sync` without headers).
pub const SOURCE: &str = r#"
#define NEG_INF __int_as_float(0xff800000)

// Threads per block of the row-wise kernels (a multiple of 32).
#define ROW_THREADS 256
// Matmul block tile: MM_BT tokens x MM_BR weight rows, MM_BK columns per step, 256 threads,
// each thread owns 2 tokens x 4 rows of the tile.
#define MM_BT 32
#define MM_BR 64
#define MM_BK 32
// Attention: threads per (token, head), positions scored per pass, largest head size.
#define ATT_THREADS 128
#define ATT_CHUNK 1024
#define MAX_HD 256

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block, returned to every thread (all threads must call it; blockDim.x a multiple
// of 32, at most 1024). `red` is 32 floats of shared memory. The leading barrier keeps a previous
// call's readers from seeing `red` overwritten.
__device__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = 0.f;
    for (int i = 0; i < nw; ++i) r += red[i];
    return r;
}

__device__ float block_max(float v, float* red) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = NEG_INF;
    for (int i = 0; i < nw; ++i) r = fmaxf(r, red[i]);
    return r;
}

// x[i][:] = embed[tokens[i]][:].  grid (n), block ROW_THREADS.
extern "C" __global__ void embed_gather(const float* __restrict__ embed,
                                        const int* __restrict__ tokens,
                                        float* __restrict__ x, int h) {
    const long long i = blockIdx.x;
    const long long src = (long long)tokens[i] * h;
    for (int c = threadIdx.x; c < h; c += blockDim.x) x[i * h + c] = embed[src + c];
}

__device__ void rmsnorm_row(const float* __restrict__ x, const float* __restrict__ w,
                            float* __restrict__ out, int h, float eps) {
    __shared__ float red[32];
    float ss = 0.f;
    for (int c = threadIdx.x; c < h; c += blockDim.x) ss += x[c] * x[c];
    ss = block_sum(ss, red);
    // Same operations as the CPU: mean, + eps, 1/sqrt, then (v * r) * g, rounded each.
    const float r = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)h), eps)));
    for (int c = threadIdx.x; c < h; c += blockDim.x) out[c] = __fmul_rn(__fmul_rn(x[c], r), w[c]);
}

// out[i] = rmsnorm(x[i]) * w.  grid (n), block ROW_THREADS.
extern "C" __global__ void rmsnorm(const float* __restrict__ x, const float* __restrict__ w,
                                   float* __restrict__ out, int h, float eps) {
    const long long i = blockIdx.x;
    rmsnorm_row(x + i * h, w, out + i * h, h, eps);
}

// out[i] = rmsnorm(x[rows[i]]) * w (the last position of each chunk).  grid (n_out).
extern "C" __global__ void rmsnorm_gather(const float* __restrict__ x, const float* __restrict__ w,
                                          float* __restrict__ out, const int* __restrict__ rows,
                                          int h, float eps) {
    const long long i = blockIdx.x;
    const long long r = rows[i];
    rmsnorm_row(x + r * h, w, out + i * h, h, eps);
}

// y[t][r] = sum_k x[t][k] * w[r][k].  grid (ceil(rows / MM_BR), ceil(n / MM_BT)), block 256.
// Every (t, r) is summed in the same order whatever n, so batching never changes a result.
extern "C" __global__ void matmul_xwt(const float* __restrict__ x, const float* __restrict__ w,
                                      float* __restrict__ y, int n, int rows, int cols) {
    __shared__ float xs[MM_BT][MM_BK + 1];
    __shared__ float ws[MM_BR][MM_BK + 1];
    const int tid = threadIdx.x;
    const int t0 = blockIdx.y * MM_BT;
    const int r0 = blockIdx.x * MM_BR;
    const int tt = (tid / 16) * 2;  // this thread's tokens: t0 + tt, t0 + tt + 1
    const int rr = tid % 16;        // this thread's rows: r0 + rr + 16 j, j < 4
    float acc[2][4];
    for (int a = 0; a < 2; ++a)
        for (int j = 0; j < 4; ++j) acc[a][j] = 0.f;
    for (int k0 = 0; k0 < cols; k0 += MM_BK) {
        for (int e = tid; e < MM_BT * MM_BK; e += 256) {
            const int et = e / MM_BK, ek = e % MM_BK;
            const int t = t0 + et, k = k0 + ek;
            xs[et][ek] = (t < n && k < cols) ? x[(long long)t * cols + k] : 0.f;
        }
        for (int e = tid; e < MM_BR * MM_BK; e += 256) {
            const int er = e / MM_BK, ek = e % MM_BK;
            const int r = r0 + er, k = k0 + ek;
            ws[er][ek] = (r < rows && k < cols) ? w[(long long)r * cols + k] : 0.f;
        }
        __syncthreads();
        for (int k = 0; k < MM_BK; ++k) {
            const float a0 = xs[tt][k];
            const float a1 = xs[tt + 1][k];
            for (int j = 0; j < 4; ++j) {
                const float b = ws[rr + 16 * j][k];
                acc[0][j] += a0 * b;
                acc[1][j] += a1 * b;
            }
        }
        __syncthreads();
    }
    for (int a = 0; a < 2; ++a) {
        const int t = t0 + tt + a;
        if (t >= n) continue;
        for (int j = 0; j < 4; ++j) {
            const int r = r0 + rr + 16 * j;
            if (r < rows) y[(long long)t * rows + r] = acc[a][j];
        }
    }
}

// RoPE, GGML "normal" mode, on the first `heads` heads of each token's qkv row (the Q heads then
// the K heads): pairs (2i, 2i+1), i < half, rotated by table[pos][i] = (cos, sin).
// grid (n), block ROW_THREADS. Same products and sums as the CPU, without FMA contraction.
extern "C" __global__ void rope(float* __restrict__ qkv, const float* __restrict__ table,
                                const int* __restrict__ pos, int qkv_w, int heads, int head_dim,
                                int half) {
    const long long t = blockIdx.x;
    const long long p = pos[t];
    float* row = qkv + t * qkv_w;
    for (int e = threadIdx.x; e < heads * half; e += blockDim.x) {
        const int hh = e / half, i = e % half;
        float* hp = row + (long long)hh * head_dim;
        const float c = table[(p * half + i) * 2];
        const float s = table[(p * half + i) * 2 + 1];
        const float a = hp[2 * i], b = hp[2 * i + 1];
        hp[2 * i] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
        hp[2 * i + 1] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
    }
}

// K and V of each new token into its slot: kv[k_off + slot * kvd + c] = qkv[t][q_dim + c],
// kv[v_off + ...] = qkv[t][q_dim + kvd + c].  grid (n), block ROW_THREADS.
extern "C" __global__ void kv_write(const float* __restrict__ qkv, float* __restrict__ kv,
                                    const int* __restrict__ slots, long long k_off,
                                    long long v_off, int qkv_w, int q_dim, int kvd) {
    const long long t = blockIdx.x;
    const long long dst = (long long)slots[t] * kvd;
    const float* src = qkv + t * qkv_w + q_dim;
    for (int c = threadIdx.x; c < kvd; c += blockDim.x) {
        kv[k_off + dst + c] = src[c];
        kv[v_off + dst + c] = src[kvd + c];
    }
}

// Paged attention (vLLM's block layout). One block per (token t, query head): scores over
// positions 0..=pos[t], each read through the token's block table
// (block_tables[bt_off[t] + p / block_size]); softmax; weighted sum of V. Positions are taken
// ATT_CHUNK at a time with a running max (online softmax), so any length fits in shared memory.
// grid (n, num_heads), block ATT_THREADS.
extern "C" __global__ void paged_attention(const float* __restrict__ qkv,
                                           const float* __restrict__ kv,
                                           float* __restrict__ out,
                                           const int* __restrict__ pos,
                                           const int* __restrict__ bt_off,
                                           const int* __restrict__ block_tables,
                                           long long k_off, long long v_off, int qkv_w,
                                           int num_heads, int num_kv_heads, int head_dim,
                                           int block_size, float scale) {
    __shared__ float q_s[MAX_HD];
    __shared__ float acc_s[MAX_HD];
    __shared__ float p_s[ATT_CHUNK];
    __shared__ float red[32];
    const long long t = blockIdx.x;
    const int head = blockIdx.y;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int nwarps = blockDim.x >> 5;
    const int kvh = head / (num_heads / num_kv_heads);
    const long long kvd = (long long)num_kv_heads * head_dim;
    const int len = pos[t] + 1;
    const int* bt = block_tables + bt_off[t];
    const float* K = kv + k_off + (long long)kvh * head_dim;
    const float* V = kv + v_off + (long long)kvh * head_dim;
    for (int d = tid; d < head_dim; d += blockDim.x) {
        q_s[d] = qkv[t * qkv_w + (long long)head * head_dim + d];
        acc_s[d] = 0.f;
    }
    __syncthreads();
    float m = NEG_INF;  // running max and sum, identical in every thread
    float l = 0.f;
    for (int c0 = 0; c0 < len; c0 += ATT_CHUNK) {
        const int cl = min(ATT_CHUNK, len - c0);
        // Scores: one warp per position, lanes split the head dimension.
        for (int j = warp; j < cl; j += nwarps) {
            const int p = c0 + j;
            const long long slot = (long long)bt[p / block_size] * block_size + p % block_size;
            const float* k = K + slot * kvd;
            float s = 0.f;
            for (int d = lane; d < head_dim; d += 32) s += q_s[d] * k[d];
            s = warp_sum(s);
            if (lane == 0) p_s[j] = s * scale;
        }
        __syncthreads();
        float mx = NEG_INF;
        for (int j = tid; j < cl; j += blockDim.x) mx = fmaxf(mx, p_s[j]);
        mx = block_max(mx, red);
        const float m_new = fmaxf(m, mx);
        float sum = 0.f;
        for (int j = tid; j < cl; j += blockDim.x) {
            const float e = expf(p_s[j] - m_new);
            p_s[j] = e;
            sum += e;
        }
        sum = block_sum(sum, red);  // its barriers also publish p_s
        const float corr = (c0 == 0) ? 0.f : expf(m - m_new);
        l = l * corr + sum;
        // Weighted V: thread d owns output dimension d (coalesced reads of each V row).
        for (int d = tid; d < head_dim; d += blockDim.x) {
            float a = acc_s[d] * corr;
            for (int j = 0; j < cl; ++j) {
                const int p = c0 + j;
                const long long slot = (long long)bt[p / block_size] * block_size + p % block_size;
                a += p_s[j] * V[slot * kvd + d];
            }
            acc_s[d] = a;
        }
        m = m_new;
        __syncthreads();  // p_s is rewritten by the next pass
    }
    const float inv = 1.f / l;
    float* o = out + t * ((long long)num_heads * head_dim) + (long long)head * head_dim;
    for (int d = tid; d < head_dim; d += blockDim.x) o[d] = acc_s[d] * inv;
}

// act[t][c] = silu(gu[t][c]) * gu[t][f + c] (gate rows first, then up).  Grid-stride over n*f.
extern "C" __global__ void silu_mul(const float* __restrict__ gu, float* __restrict__ act,
                                    long long total, int f) {
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long t = e / f, c = e % f;
        const float g = gu[t * 2 * f + c];
        const float u = gu[t * 2 * f + f + c];
        act[e] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.f, expf(-g))), u);
    }
}

// x[e] += o[e].  Grid-stride over total.
extern "C" __global__ void add_inplace(float* __restrict__ x, const float* __restrict__ o,
                                       long long total) {
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        x[e] += o[e];
    }
}

// staging[(p * nblk + b) * block_len + e] = kv[p * plane_len + blocks[b] * block_len + e]
// for every plane p < planes.  Grid-stride.
extern "C" __global__ void kv_gather_blocks(const float* __restrict__ kv,
                                            float* __restrict__ staging,
                                            const int* __restrict__ blocks, int nblk, int planes,
                                            long long plane_len, int block_len) {
    const long long total = (long long)planes * nblk * block_len;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long i = e % block_len;
        const long long rest = e / block_len;
        const long long b = rest % nblk;
        const long long p = rest / nblk;
        staging[e] = kv[p * plane_len + (long long)blocks[b] * block_len + i];
    }
}

// The inverse of kv_gather_blocks.
extern "C" __global__ void kv_scatter_blocks(float* __restrict__ kv,
                                             const float* __restrict__ staging,
                                             const int* __restrict__ blocks, int nblk, int planes,
                                             long long plane_len, int block_len) {
    const long long total = (long long)planes * nblk * block_len;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long i = e % block_len;
        const long long rest = e / block_len;
        const long long b = rest % nblk;
        const long long p = rest / nblk;
        kv[p * plane_len + (long long)blocks[b] * block_len + i] = staging[e];
    }
}

// Block src copied to block dst in every plane (copy-on-write).  Grid-stride.
extern "C" __global__ void kv_copy_block(float* __restrict__ kv, int src, int dst, int planes,
                                         long long plane_len, int block_len) {
    const long long total = (long long)planes * block_len;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const long long i = e % block_len;
        const long long p = e / block_len;
        kv[p * plane_len + (long long)dst * block_len + i] =
            kv[p * plane_len + (long long)src * block_len + i];
    }
}
"#;

/// Threads per block of the row-wise kernels (`ROW_THREADS` in the source).
const ROW_THREADS: u32 = 256;
const MM_BT: u32 = 32;
const MM_BR: u32 = 64;
const MM_THREADS: u32 = 256;
const ATT_THREADS: u32 = 128;
/// Grid-stride kernels: at most this many blocks (plenty for any GPU).
const MAX_STRIDE_BLOCKS: usize = 65_535;

/// Names of every kernel in [`SOURCE`] (the NVRTC test checks each is in the PTX).
pub const KERNEL_NAMES: [&str; 12] = [
    "embed_gather",
    "rmsnorm",
    "rmsnorm_gather",
    "matmul_xwt",
    "rope",
    "kv_write",
    "paged_attention",
    "silu_mul",
    "add_inplace",
    "kv_gather_blocks",
    "kv_scatter_blocks",
    "kv_copy_block",
];

/// Compiles [`SOURCE`] to PTX with NVRTC.
///
/// # Errors
/// libnvrtc missing, or the compiler's log.
pub fn compile() -> Result<cudarc::nvrtc::Ptx, String> {
    // SAFETY: only tries to dlopen libnvrtc.
    let present = std::panic::catch_unwind(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
        .unwrap_or(false);
    if !present {
        return Err("libnvrtc not found (needs libnvrtc.so.13 on the library path)".to_string());
    }
    let opts = cudarc::nvrtc::CompileOptions {
        name: Some("brownout_kernels.cu".to_string()),
        ..Default::default()
    };
    match std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts)) {
        Ok(Ok(ptx)) => Ok(ptx),
        Ok(Err(cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. })) => Err(format!(
            "NVRTC failed ({nvrtc:?}): {}",
            log.to_string_lossy()
        )),
        Ok(Err(e)) => Err(format!("NVRTC failed: {e}")),
        Err(_) => Err("NVRTC panicked (a symbol missing from libnvrtc?)".to_string()),
    }
}

/// The compiled kernels on device 0, and the stream every launch goes to.
pub struct Kernels {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    /// E.g. `cuda:0 (NVIDIA H200, sm_90)`.
    pub name: String,
    _module: Arc<CudaModule>,
    embed_gather: CudaFunction,
    rmsnorm: CudaFunction,
    rmsnorm_gather: CudaFunction,
    matmul_xwt: CudaFunction,
    rope: CudaFunction,
    kv_write: CudaFunction,
    paged_attention: CudaFunction,
    silu_mul: CudaFunction,
    add_inplace: CudaFunction,
    kv_gather_blocks: CudaFunction,
    kv_scatter_blocks: CudaFunction,
    kv_copy_block: CudaFunction,
}

impl std::fmt::Debug for Kernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernels")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

fn drv(what: &str) -> impl Fn(DriverError) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Grid-stride launch over `total` elements.
fn stride_cfg(total: usize) -> LaunchConfig {
    let blocks = total
        .div_ceil(ROW_THREADS as usize)
        .clamp(1, MAX_STRIDE_BLOCKS);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (ROW_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn rows_cfg(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (ROW_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `i32` for a kernel argument.
///
/// # Errors
/// A value that does not fit.
pub fn int(v: usize, what: &str) -> Result<i32, String> {
    i32::try_from(v).map_err(|_| format!("{what} = {v} does not fit a 32-bit kernel argument"))
}

impl Kernels {
    /// Creates the context on device 0, compiles and loads every kernel. The caller has checked
    /// that libcuda is present (`CudaContext::new` panics otherwise).
    ///
    /// # Errors
    /// A driver, NVRTC or module error, as text.
    pub fn load() -> Result<Kernels, String> {
        let ptx = compile()?;
        let ctx = std::panic::catch_unwind(|| CudaContext::new(0))
            .map_err(|_| "creating a CUDA context panicked".to_string())?
            .map_err(|e| format!("no usable CUDA device: {e}"))?;
        let dev = ctx.name().map_err(drv("querying the CUDA device"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(drv("querying the compute capability"))?;
        let module = ctx
            .load_module(ptx)
            .map_err(drv("loading the PTX module"))?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| format!("kernel {name}: {e}"))
        };
        let stream = ctx.default_stream();
        Ok(Kernels {
            name: format!("cuda:0 ({dev}, sm_{major}{minor})"),
            embed_gather: f("embed_gather")?,
            rmsnorm: f("rmsnorm")?,
            rmsnorm_gather: f("rmsnorm_gather")?,
            matmul_xwt: f("matmul_xwt")?,
            rope: f("rope")?,
            kv_write: f("kv_write")?,
            paged_attention: f("paged_attention")?,
            silu_mul: f("silu_mul")?,
            add_inplace: f("add_inplace")?,
            kv_gather_blocks: f("kv_gather_blocks")?,
            kv_scatter_blocks: f("kv_scatter_blocks")?,
            kv_copy_block: f("kv_copy_block")?,
            _module: module,
            stream,
            ctx,
        })
    }

    /// `x[i] = embed[tokens[i]]` for `n` tokens of width `h`.
    pub fn embed_gather(
        &self,
        embed: &CudaSlice<f32>,
        tokens: &CudaView<'_, i32>,
        x: &mut CudaSlice<f32>,
        n: usize,
        h: usize,
    ) -> Result<(), String> {
        if n == 0 {
            return Ok(());
        }
        let h = int(h, "hidden size")?;
        let mut b = self.stream.launch_builder(&self.embed_gather);
        b.arg(embed).arg(tokens).arg(x).arg(&h);
        // SAFETY: argument list matches the kernel; x holds n·h, tokens n ids < embed rows.
        unsafe { b.launch(rows_cfg(n)) }
            .map(drop)
            .map_err(drv("embed_gather"))
    }

    /// `out[i] = rmsnorm(x[i]) · w` for `n` rows of width `h`.
    pub fn rmsnorm(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        n: usize,
        h: usize,
        eps: f32,
    ) -> Result<(), String> {
        if n == 0 {
            return Ok(());
        }
        let h = int(h, "hidden size")?;
        let mut b = self.stream.launch_builder(&self.rmsnorm);
        b.arg(x).arg(w).arg(out).arg(&h).arg(&eps);
        // SAFETY: argument list matches the kernel; x and out hold n·h floats, w h.
        unsafe { b.launch(rows_cfg(n)) }
            .map(drop)
            .map_err(drv("rmsnorm"))
    }

    /// `out[i] = rmsnorm(x[rows[i]]) · w` for the `n_out` rows listed.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_gather(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        rows: &CudaView<'_, i32>,
        n_out: usize,
        h: usize,
        eps: f32,
    ) -> Result<(), String> {
        if n_out == 0 {
            return Ok(());
        }
        let h = int(h, "hidden size")?;
        let mut b = self.stream.launch_builder(&self.rmsnorm_gather);
        b.arg(x).arg(w).arg(out).arg(rows).arg(&h).arg(&eps);
        // SAFETY: argument list matches the kernel; rows index rows of x; out holds n_out·h.
        unsafe { b.launch(rows_cfg(n_out)) }
            .map(drop)
            .map_err(drv("rmsnorm_gather"))
    }

    /// `y[n][rows] = x[n][cols] · wᵀ`.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        n: usize,
        rows: usize,
        cols: usize,
    ) -> Result<(), String> {
        if n == 0 || rows == 0 {
            return Ok(());
        }
        let grid_y = n.div_ceil(MM_BT as usize);
        if grid_y > 65_535 {
            return Err(format!("matmul over {n} tokens exceeds the grid"));
        }
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(MM_BR as usize) as u32, grid_y as u32, 1),
            block_dim: (MM_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ni, ri, ci) = (int(n, "tokens")?, int(rows, "rows")?, int(cols, "cols")?);
        let mut b = self.stream.launch_builder(&self.matmul_xwt);
        b.arg(x).arg(w).arg(y).arg(&ni).arg(&ri).arg(&ci);
        // SAFETY: argument list matches the kernel; x holds n·cols, w rows·cols, y n·rows.
        unsafe { b.launch(cfg) }
            .map(drop)
            .map_err(drv("matmul_xwt"))
    }

    /// RoPE on the first `heads` heads of each of the `n` qkv rows (row width `qkv_w`),
    /// `table` = `[pos][half][cos, sin]`.
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &self,
        qkv: &mut CudaSlice<f32>,
        table: &CudaSlice<f32>,
        pos: &CudaView<'_, i32>,
        n: usize,
        qkv_w: usize,
        heads: usize,
        head_dim: usize,
        half: usize,
    ) -> Result<(), String> {
        if n == 0 || half == 0 {
            return Ok(());
        }
        let (w, hh, hd, hf) = (
            int(qkv_w, "qkv width")?,
            int(heads, "heads")?,
            int(head_dim, "head size")?,
            int(half, "rope pairs")?,
        );
        let mut b = self.stream.launch_builder(&self.rope);
        b.arg(qkv)
            .arg(table)
            .arg(pos)
            .arg(&w)
            .arg(&hh)
            .arg(&hd)
            .arg(&hf);
        // SAFETY: argument list matches the kernel; positions < table rows (validated).
        unsafe { b.launch(rows_cfg(n)) }
            .map(drop)
            .map_err(drv("rope"))
    }

    /// K/V of `n` tokens into their slots of the K plane at `k_off` and V plane at `v_off`.
    #[allow(clippy::too_many_arguments)]
    pub fn kv_write(
        &self,
        qkv: &CudaSlice<f32>,
        kv: &mut CudaSlice<f32>,
        slots: &CudaView<'_, i32>,
        k_off: usize,
        v_off: usize,
        n: usize,
        qkv_w: usize,
        q_dim: usize,
        kv_dim: usize,
    ) -> Result<(), String> {
        if n == 0 {
            return Ok(());
        }
        let (ko, vo) = (k_off as i64, v_off as i64);
        let (w, qd, kd) = (
            int(qkv_w, "qkv width")?,
            int(q_dim, "q dim")?,
            int(kv_dim, "kv dim")?,
        );
        let mut b = self.stream.launch_builder(&self.kv_write);
        b.arg(qkv)
            .arg(kv)
            .arg(slots)
            .arg(&ko)
            .arg(&vo)
            .arg(&w)
            .arg(&qd)
            .arg(&kd);
        // SAFETY: argument list matches the kernel; slots < blocks·block_size (validated).
        unsafe { b.launch(rows_cfg(n)) }
            .map(drop)
            .map_err(drv("kv_write"))
    }

    /// Paged attention of `n` tokens into `out[n][num_heads·head_dim]`.
    #[allow(clippy::too_many_arguments)]
    pub fn paged_attention(
        &self,
        qkv: &CudaSlice<f32>,
        kv: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        pos: &CudaView<'_, i32>,
        bt_off: &CudaView<'_, i32>,
        block_tables: &CudaView<'_, i32>,
        k_off: usize,
        v_off: usize,
        shape: AttnShape,
    ) -> Result<(), String> {
        if shape.n == 0 {
            return Ok(());
        }
        if shape.head_dim > MAX_HEAD_DIM || shape.num_heads > 65_535 {
            return Err(format!(
                "attention with head size {} and {} heads is not supported",
                shape.head_dim, shape.num_heads
            ));
        }
        let cfg = LaunchConfig {
            grid_dim: (shape.n as u32, shape.num_heads as u32, 1),
            block_dim: (ATT_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (ko, vo) = (k_off as i64, v_off as i64);
        let w = int(shape.qkv_w, "qkv width")?;
        let nh = int(shape.num_heads, "heads")?;
        let nkv = int(shape.num_kv_heads, "kv heads")?;
        let hd = int(shape.head_dim, "head size")?;
        let bs = int(shape.block_size, "block size")?;
        let scale = 1.0 / (shape.head_dim as f32).sqrt();
        let mut b = self.stream.launch_builder(&self.paged_attention);
        b.arg(qkv)
            .arg(kv)
            .arg(out)
            .arg(pos)
            .arg(bt_off)
            .arg(block_tables)
            .arg(&ko)
            .arg(&vo)
            .arg(&w)
            .arg(&nh)
            .arg(&nkv)
            .arg(&hd)
            .arg(&bs)
            .arg(&scale);
        // SAFETY: argument list matches the kernel; every block id read is < num_blocks and
        // every table long enough (validated before the step).
        unsafe { b.launch(cfg) }
            .map(drop)
            .map_err(drv("paged_attention"))
    }

    /// `act[n][f] = silu(gu[:, :f]) · gu[:, f:]`.
    pub fn silu_mul(
        &self,
        gu: &CudaSlice<f32>,
        act: &mut CudaSlice<f32>,
        n: usize,
        f: usize,
    ) -> Result<(), String> {
        let total = n * f;
        if total == 0 {
            return Ok(());
        }
        let (t, fi) = (total as i64, int(f, "ffn size")?);
        let mut b = self.stream.launch_builder(&self.silu_mul);
        b.arg(gu).arg(act).arg(&t).arg(&fi);
        // SAFETY: argument list matches the kernel; gu holds n·2f, act n·f.
        unsafe { b.launch(stride_cfg(total)) }
            .map(drop)
            .map_err(drv("silu_mul"))
    }

    /// `x[..total] += o[..total]`.
    pub fn add(
        &self,
        x: &mut CudaSlice<f32>,
        o: &CudaSlice<f32>,
        total: usize,
    ) -> Result<(), String> {
        if total == 0 {
            return Ok(());
        }
        let t = total as i64;
        let mut b = self.stream.launch_builder(&self.add_inplace);
        b.arg(x).arg(o).arg(&t);
        // SAFETY: argument list matches the kernel; both hold at least `total` floats.
        unsafe { b.launch(stride_cfg(total)) }
            .map(drop)
            .map_err(drv("add_inplace"))
    }

    /// Copies the listed blocks of every plane into `staging` (`[plane][block][block_len]`).
    pub fn kv_gather_blocks(
        &self,
        kv: &CudaSlice<f32>,
        staging: &mut CudaSlice<f32>,
        blocks: &CudaSlice<i32>,
        geo: KvGeometry,
    ) -> Result<(), String> {
        let total = geo.planes * blocks.len() * geo.block_len;
        if total == 0 {
            return Ok(());
        }
        let (nb, pl, plen, bl) = geo.args(blocks.len())?;
        let mut b = self.stream.launch_builder(&self.kv_gather_blocks);
        b.arg(kv)
            .arg(staging)
            .arg(blocks)
            .arg(&nb)
            .arg(&pl)
            .arg(&plen)
            .arg(&bl);
        // SAFETY: argument list matches the kernel; staging holds `total`, block ids valid.
        unsafe { b.launch(stride_cfg(total)) }
            .map(drop)
            .map_err(drv("kv_gather_blocks"))
    }

    /// The inverse of [`Kernels::kv_gather_blocks`].
    pub fn kv_scatter_blocks(
        &self,
        kv: &mut CudaSlice<f32>,
        staging: &CudaSlice<f32>,
        blocks: &CudaSlice<i32>,
        geo: KvGeometry,
    ) -> Result<(), String> {
        let total = geo.planes * blocks.len() * geo.block_len;
        if total == 0 {
            return Ok(());
        }
        let (nb, pl, plen, bl) = geo.args(blocks.len())?;
        let mut b = self.stream.launch_builder(&self.kv_scatter_blocks);
        b.arg(kv)
            .arg(staging)
            .arg(blocks)
            .arg(&nb)
            .arg(&pl)
            .arg(&plen)
            .arg(&bl);
        // SAFETY: argument list matches the kernel; staging holds `total`, block ids valid.
        unsafe { b.launch(stride_cfg(total)) }
            .map(drop)
            .map_err(drv("kv_scatter_blocks"))
    }

    /// Block `src` copied onto block `dst` in every plane.
    pub fn kv_copy_block(
        &self,
        kv: &mut CudaSlice<f32>,
        src: usize,
        dst: usize,
        geo: KvGeometry,
    ) -> Result<(), String> {
        let total = geo.planes * geo.block_len;
        if total == 0 || src == dst {
            return Ok(());
        }
        let (s, d) = (int(src, "block id")?, int(dst, "block id")?);
        let (_, pl, plen, bl) = geo.args(1)?;
        let mut b = self.stream.launch_builder(&self.kv_copy_block);
        b.arg(kv).arg(&s).arg(&d).arg(&pl).arg(&plen).arg(&bl);
        // SAFETY: argument list matches the kernel; src, dst < num_blocks (checked by caller).
        unsafe { b.launch(stride_cfg(total)) }
            .map(drop)
            .map_err(drv("kv_copy_block"))
    }

    /// Waits for the stream and reports any error recorded by an asynchronous call.
    ///
    /// # Errors
    /// The driver's error.
    pub fn sync(&self) -> Result<(), String> {
        self.stream
            .synchronize()
            .map_err(drv("synchronizing the stream"))?;
        self.ctx.check_err().map_err(drv("CUDA error"))
    }
}

/// Shape of one attention launch.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n: usize,
    pub qkv_w: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
}

/// Shape of the K/V buffer: `planes` planes of `plane_len` floats, blocks of `block_len`.
#[derive(Debug, Clone, Copy)]
pub struct KvGeometry {
    pub planes: usize,
    pub plane_len: usize,
    pub block_len: usize,
}

impl KvGeometry {
    fn args(&self, nblk: usize) -> Result<(i32, i32, i64, i32), String> {
        Ok((
            int(nblk, "blocks")?,
            int(self.planes, "planes")?,
            self.plane_len as i64,
            int(self.block_len, "block length")?,
        ))
    }
}
