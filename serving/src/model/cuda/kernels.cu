// The CUDA C source of every kernel of the CUDA backend (serving/src/model/cuda/), compiled with
// NVRTC when the backend starts. No includes: NVRTC provides expf, sqrtf, fmaxf, the __*_rn
// intrinsics and __shfl_xor_sync without headers.
//
// The constants the Rust launchers share with these kernels (ROW_THREADS, MM_BT, MM_BR,
// MM_THREADS, ATT_THREADS, MAX_HD) are NOT defined here: kernels.rs generates them from its own
// constants as a #define prelude put before this file (`kernels::source()`), and the test
// `shared_constants_come_only_from_the_rust_prelude` fails if this file defines one of them.
// The constants below are the kernels' own business.

#define NEG_INF __int_as_float(0xff800000)

// Matmul block tile: MM_BT tokens x MM_BR weight rows (from the prelude), MM_BK columns per
// step, MM_THREADS threads, each thread owns 2 tokens x 4 rows of the tile.
#define MM_BK 32
// Attention: positions scored per pass (threads per (token, head) and the largest head size
// come from the prelude).
#define ATT_CHUNK 1024

// The thread layout of matmul_xwt (16 x 16 threads, 2 tokens x 4 rows each) and the warp
// reductions fix these relations; a prelude that broke one would not compile.
static_assert(MM_THREADS == 256 && MM_BT == 2 * 16 && MM_BR == 4 * 16,
              "matmul_xwt maps 256 threads onto a 32-token x 64-row tile");
static_assert(ROW_THREADS % 32 == 0 && ROW_THREADS <= 1024, "ROW_THREADS: whole warps");
static_assert(ATT_THREADS % 32 == 0 && ATT_THREADS <= 1024, "ATT_THREADS: whole warps");

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

// y[t][r] = sum_k x[t][k] * w[r][k].  grid (ceil(rows / MM_BR), ceil(n / MM_BT)), block MM_THREADS.
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
        for (int e = tid; e < MM_BT * MM_BK; e += MM_THREADS) {
            const int et = e / MM_BK, ek = e % MM_BK;
            const int t = t0 + et, k = k0 + ek;
            xs[et][ek] = (t < n && k < cols) ? x[(long long)t * cols + k] : 0.f;
        }
        for (int e = tid; e < MM_BR * MM_BK; e += MM_THREADS) {
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
