//! CPU kernels: weight matrices (f32 or still quantised) and the batched matmul `Y = X·Wᵀ`.
//!
//! The matmul is matrix–matrix: each weight row is loaded (or unpacked) once per step and
//! multiplied with every token of the batch, so a batch of 32 costs little more weight traffic
//! than a batch of 1. Work is split across rayon's threads by weight rows.
//!
//! ```text
//!  mod.rs         Kernel (BROWNOUT_MATMUL), matmul: picks the kernel for each matrix
//!  matrix.rs      Matrix / MatData: f32, raw ggml blocks, prepared blocks, packed panels
//!  weight_buf.rs  WeightBuf: 2 MiB-aligned, huge-page-advised memory for packed weights
//!  isa.rs         Features (detected once), BROWNOUT_ISA (read once), Isa, QuantPath
//!  packed.rs      the packed f32 kernel (default): AVX-512, AVX2+FMA or scalar
//!  tiled.rs       the f32 kernels kept to measure against: gemm crate, tiled, simple
//!  repacked.rs    the integer kernel (default) over weights repacked at load: AVX-512 VNNI,
//!                 AVX2 or scalar, 16-row panels, activations quantised once per call
//!  q8act.rs       Q8Act: activations quantised to 8 bits per block (both integer kernels)
//!  quant.rs       the older integer kernel over GGUF blocks (BROWNOUT_QUANT=tiles)
//!  simd.rs        helpers shared by the kernels
//! ```
//!
//! Instruction sets: every vector kernel is compiled for its extensions with
//! `#[target_feature]` and picked at run time from [`Features`] — AVX-512F, AVX2+FMA or plain
//! Rust for f32 ([`Isa`]); AVX-512 VNNI, AVX2 or row by row for the integer kernel
//! ([`QuantPath`]). `BROWNOUT_ISA=avx2|scalar` caps both.
//!
//! With the default kernels (packed f32, integer quantised) every (row, token) dot product is
//! summed in the same order whatever the batch size, the token's place in it or the instruction
//! set, so batching never changes a result bit; `BROWNOUT_MATMUL=gemm` trades that for the
//! `gemm` crate.
//!
//! The fallback route's quantised matrices multiply in integers: activations are quantised to 8
//! bits per block of 32 (one scale each) and each block's dot product is exact in i32 (AVX2
//! `maddubs`+`madd`, AVX-512 VNNI `vpdpbusd`), then scaled — less memory traffic and fewer
//! instructions than dequantising, and a real (small) loss of precision, which is what the
//! fallback route trades.

mod isa;
mod matrix;
mod packed;
mod q8act;
mod quant;
mod repacked;
mod simd;
mod tiled;
mod weight_buf;

use rayon::prelude::*;

pub use isa::{Cap, Features, Isa, QuantPath};
pub use matrix::{MatData, Matrix, PANEL, Prepared};
pub use packed::{pack_tokens, packed_matmul, packed_matmul_on};
pub use q8act::Q8Act;
pub use quant::quant_matmul_on;
pub use repacked::{RP, Repacked, repacked_matmul_on};
pub use tiled::{gemm_f32, matmul_f32_shape};
pub use weight_buf::WeightBuf;

use tiled::{gemm_rows_parallel, rows_task};

/// Which kernels [`matmul`] uses (the simple ones are kept to measure against).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// f32: 8 rows × 1 token register tiles; quantised: int8 dot products (activations
    /// quantised to 8 bits per block of 32, as llama.cpp does).
    Tiled,
    /// f32: one row × 4 tokens; quantised: dequantise each row to f32 first.
    Simple,
    /// f32: the `gemm` crate (packed operands, cache blocking, outer-product micro-kernels);
    /// quantised matrices use [`Kernel::Tiled`].
    Gemm,
    /// f32 packed once at load ([`MatData::Packed`]): a 16-row × up-to-8-token outer-product
    /// micro-kernel (AVX-512; 16 × 4 on AVX2), each (row, token) summed in `k` order whatever
    /// the batch and the instruction set. Matrices not
    /// packed use [`Kernel::Gemm`].
    Packed,
}

impl Kernel {
    /// The kernel [`matmul`] uses: `BROWNOUT_MATMUL=packed|gemm|tiled|simple` (read once),
    /// default [`Kernel::Packed`] — the fastest in decode (docs/BENCHMARKS.md). With
    /// [`Kernel::Gemm`] f32 results depend on the problem size in the last bits; the packed and
    /// tiled kernels sum every (row, token) in the same order whatever the batch.
    pub fn from_env() -> Kernel {
        static K: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *K.get_or_init(|| match std::env::var("BROWNOUT_MATMUL").as_deref() {
            Ok("tiled") => Kernel::Tiled,
            Ok("simple") => Kernel::Simple,
            Ok("gemm") => Kernel::Gemm,
            _ => Kernel::Packed,
        })
    }
}

/// How quantised matrices are kept at load: `BROWNOUT_QUANT=tiles` keeps the GGUF blocks
/// ([`MatData::Prepared`], the older 4 × 4-tile integer kernel, kept to measure against);
/// otherwise (default) they are repacked ([`MatData::Repacked`]). Read once.
pub fn repack_quantised() -> bool {
    static R: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *R.get_or_init(|| std::env::var("BROWNOUT_QUANT").as_deref() != Ok("tiles"))
}

/// `y[n][w.rows] = x[n][w.cols] · wᵀ`.
///
/// # Panics
/// If the slices do not match the shapes (a broken invariant in the caller).
pub fn matmul(x: &[f32], n: usize, w: &Matrix, y: &mut [f32]) {
    matmul_with(Kernel::from_env(), x, n, w, y);
}

/// [`matmul`] with a chosen kernel.
///
/// # Panics
/// As [`matmul`].
pub fn matmul_with(kernel: Kernel, x: &[f32], n: usize, w: &Matrix, y: &mut [f32]) {
    assert_eq!(x.len(), n * w.cols, "matmul: x shape");
    assert_eq!(y.len(), n * w.rows, "matmul: y shape");
    if n == 0 {
        return;
    }
    let threads = rayon::current_num_threads().max(1);
    if let MatData::Packed(p) = &w.data {
        packed_matmul(p, w.rows, w.cols, x, n, y, threads);
        return;
    }
    if let MatData::Repacked(p) = &w.data {
        repacked_matmul_on(QuantPath::detect(), p, x, n, y, threads);
        return;
    }
    let kernel = match (&w.data, kernel) {
        (MatData::F32(d), Kernel::Gemm | Kernel::Packed) => {
            gemm_rows_parallel(d, w.rows, w.cols, x, n, y, threads);
            return;
        }
        (_, Kernel::Gemm | Kernel::Packed) => Kernel::Tiled,
        (_, k) => k,
    };
    if matches!(w.data, MatData::Quant(..) | MatData::Prepared(_)) && kernel == Kernel::Tiled {
        quant_matmul_on(QuantPath::detect(), x, n, w, y);
        return;
    }
    // Computed transposed ([row][token]) so each task owns a contiguous slice, then transposed.
    let per = rows_per_task(w.rows, threads);
    let mut yt = vec![0f32; n * w.rows];
    yt.par_chunks_mut(per * n).enumerate().for_each(|(i, out)| {
        let r0 = i * per;
        let r1 = (r0 + per).min(w.rows);
        rows_task(kernel, x, n, w, r0, r1, out);
    });
    transpose_into(&yt, n, w.rows, y);
}

/// Enough tasks to balance, rows per task a multiple of 8, at least 16.
pub(super) fn rows_per_task(rows: usize, threads: usize) -> usize {
    (rows.div_ceil(threads * 4)).max(16).div_ceil(8) * 8
}

/// `y[t][r] = yt[r][t]`.
pub(super) fn transpose_into(yt: &[f32], n: usize, rows: usize, y: &mut [f32]) {
    for r in 0..rows {
        for t in 0..n {
            y[t * rows + r] = yt[r * n + t];
        }
    }
}
