//! The f32 kernels kept to measure the packed one against (`BROWNOUT_MATMUL=gemm|tiled|simple`):
//! the `gemm` crate split by rows, 8-row × 1-token register tiles over row-major weights, one
//! row × 4 tokens, and the benchmark hook for other tile shapes.

use rayon::prelude::*;

use super::Kernel;
use super::isa::has_avx2_fma;
use super::matrix::{MatData, Matrix};
use super::simd::{OutPtr, fmadd, hsum};
use crate::model::gguf::GgmlType;
use crate::model::quant::{self, QK};

/// `dst[t][r] = Σ_k x[t][k] · w[r][k]` with the `gemm` crate, for `t < n`, `r < out_cols`:
/// `x` is `n × cols` row-major, `w` `out_cols` rows of `cols`, `dst` has row stride `dst_rs`.
///
/// # Safety
/// The pointers must cover those extents, and `dst` must not alias `x` or `w`.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_xwt(
    n: usize,
    out_cols: usize,
    cols: usize,
    dst: *mut f32,
    dst_rs: usize,
    x: *const f32,
    w: *const f32,
    parallelism: gemm::Parallelism,
) {
    let s = |v: usize| isize::try_from(v).expect("matrix dimension fits isize");
    // SAFETY: the caller's contract; rhs is the cols×out_cols view of w (element (k, r) at
    // r·cols + k).
    unsafe {
        gemm::gemm(
            n,
            out_cols,
            cols,
            dst,
            1,
            s(dst_rs),
            false,
            x,
            1,
            s(cols),
            w,
            s(cols),
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// [`gemm_f32`] split by weight rows over `threads` rayon tasks, each single-threaded gemm into
/// its own columns of `y` (the crate's own threading splits small-K problems less evenly).
pub(super) fn gemm_rows_parallel(
    w: &[f32],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    threads: usize,
) {
    assert_eq!(w.len(), rows * cols, "gemm: w shape");
    assert_eq!(x.len(), n * cols, "gemm: x shape");
    assert_eq!(y.len(), n * rows, "gemm: y shape");
    // Rows per task: a multiple of 16 (gemm's f32 micro-kernel width on AVX2), two tasks per
    // thread for balance.
    let per = rows.div_ceil(threads * 2).div_ceil(16).max(1) * 16;
    let out = OutPtr(y.as_mut_ptr());
    (0..rows.div_ceil(per)).into_par_iter().for_each(|i| {
        let r0 = i * per;
        let r1 = (r0 + per).min(rows);
        // Capture the whole `OutPtr` (Send), not its raw-pointer field (edition 2021 closures
        // capture fields).
        #[allow(clippy::redundant_locals)]
        let out = out;
        // SAFETY: dst starts at column r0 of the n×rows output (row stride `rows`) and spans
        // columns r0..r1 only, which no other task writes; lhs is x (n×cols), rhs the cols×(r1-r0)
        // view of rows r0..r1 of w. All ranges are inside the slices asserted above.
        unsafe {
            gemm_xwt(
                n,
                r1 - r0,
                cols,
                out.0.add(r0),
                rows,
                x.as_ptr(),
                w.as_ptr().add(r0 * cols),
                gemm::Parallelism::None,
            );
        }
    });
}

/// `y[n][rows] = x[n][cols] · wᵀ` for an f32 `w` (`rows × cols`, row-major) with the `gemm` crate.
///
/// # Panics
/// If the slices do not match the shapes.
pub fn gemm_f32(
    w: &[f32],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    parallelism: gemm::Parallelism,
) {
    assert_eq!(w.len(), rows * cols, "gemm_f32: w shape");
    assert_eq!(x.len(), n * cols, "gemm_f32: x shape");
    assert_eq!(y.len(), n * rows, "gemm_f32: y shape");
    // SAFETY: dst is n×rows with row stride `rows`, lhs n×cols, rhs the cols×rows view of w;
    // all three lengths were asserted above, and dst does not alias the inputs.
    unsafe {
        gemm_xwt(
            n,
            rows,
            cols,
            y.as_mut_ptr(),
            rows,
            x.as_ptr(),
            w.as_ptr(),
            parallelism,
        );
    }
}

pub(super) fn rows_task(
    kernel: Kernel,
    x: &[f32],
    n: usize,
    w: &Matrix,
    r0: usize,
    r1: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx2_fma() {
            // SAFETY: the features the function is compiled for were just detected.
            unsafe { rows_task_avx2(kernel, x, n, w, r0, r1, out) };
            return;
        }
    }
    rows_task_impl::<false>(kernel, x, n, w, r0, r1, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_task_avx2(
    kernel: Kernel,
    x: &[f32],
    n: usize,
    w: &Matrix,
    r0: usize,
    r1: usize,
    out: &mut [f32],
) {
    rows_task_impl::<true>(kernel, x, n, w, r0, r1, out);
}

#[inline(always)]
fn rows_task_impl<const FMA: bool>(
    kernel: Kernel,
    x: &[f32],
    n: usize,
    w: &Matrix,
    r0: usize,
    r1: usize,
    out: &mut [f32],
) {
    let cols = w.cols;
    match &w.data {
        MatData::Packed(_) => unreachable!("packed matrices go through packed_matmul"),
        MatData::Repacked(_) => unreachable!("repacked matrices go through repacked_matmul_on"),
        MatData::F32(d) if kernel == Kernel::Tiled => {
            tiled_f32::<FMA>(&d[r0 * cols..r1 * cols], cols, x, n, out);
        }
        MatData::F32(d) => {
            for r in r0..r1 {
                let row = &d[r * cols..(r + 1) * cols];
                dot_row_tokens::<FMA>(row, x, n, &mut out[(r - r0) * n..(r - r0 + 1) * n]);
            }
        }
        MatData::Prepared(_) => {
            let mut row = vec![0f32; cols];
            for r in r0..r1 {
                w.row_f32(r, &mut row);
                dot_row_tokens::<FMA>(&row, x, n, &mut out[(r - r0) * n..(r - r0 + 1) * n]);
            }
        }
        MatData::Quant(t, d) => {
            let bb = t.block_bytes();
            let rb = cols / QK * bb;
            let mut row = vec![0f32; cols];
            let mut tmp = [0f32; QK];
            for r in r0..r1 {
                let raw = &d[r * rb..(r + 1) * rb];
                for (o, b) in row.chunks_exact_mut(QK).zip(raw.chunks_exact(bb)) {
                    match t {
                        GgmlType::Q4_1 => quant::dequant_q4_1_block(b, &mut tmp),
                        GgmlType::Q8_0 => quant::dequant_q8_0_block(b, &mut tmp),
                        GgmlType::Q4_0 => quant::dequant_q4_0_block(b, &mut tmp),
                        GgmlType::F32 | GgmlType::F16 => {
                            unreachable!("quantised matrix of a plain type")
                        }
                    }
                    o.copy_from_slice(&tmp);
                }
                dot_row_tokens::<FMA>(&row, x, n, &mut out[(r - r0) * n..(r - r0 + 1) * n]);
            }
        }
    }
}

/// Tokens per cache block of `x` in the tiled and packed kernels (a multiple of 3 and of
/// [`GROUP`]).
pub(super) const TOKEN_BLOCK: usize = 48;

/// `out[r][t] = w[r] · x[t]` for the rows of `w`, in 8-row × 1-token register tiles (the
/// fastest shape measured by `examples/bench_tiles.rs`, see docs/BENCHMARKS.md); the row tail
/// uses 1 × 1 tiles, which sum each (row, token) in the same order.
#[inline(always)]
fn tiled_f32<const FMA: bool>(w: &[f32], cols: usize, x: &[f32], n: usize, out: &mut [f32]) {
    let rows = w.len() / cols;
    let mut tb = 0;
    while tb < n {
        let te = (tb + TOKEN_BLOCK).min(n);
        let mut r = 0;
        while r + 8 <= rows {
            for t in tb..te {
                micro::<8, 1, FMA>(w, cols, r, x, t, out, n);
            }
            r += 8;
        }
        while r < rows {
            for t in tb..te {
                micro::<1, 1, FMA>(w, cols, r, x, t, out, n);
            }
            r += 1;
        }
        tb = te;
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn micro<const R: usize, const T: usize, const FMA: bool>(
    w: &[f32],
    cols: usize,
    r0: usize,
    x: &[f32],
    t0: usize,
    out: &mut [f32],
    n: usize,
) {
    let main = cols / 8 * 8;
    let wr: [&[f32]; R] = std::array::from_fn(|i| &w[(r0 + i) * cols..(r0 + i + 1) * cols]);
    let xt: [&[f32]; T] = std::array::from_fn(|i| &x[(t0 + i) * cols..(t0 + i + 1) * cols]);
    let mut acc = [[[0f32; 8]; T]; R];
    let mut c = 0;
    while c < main {
        let wv: [[f32; 8]; R] =
            std::array::from_fn(|i| wr[i][c..c + 8].try_into().expect("8 lanes"));
        for t in 0..T {
            let xv: [f32; 8] = xt[t][c..c + 8].try_into().expect("8 lanes");
            for r in 0..R {
                for l in 0..8 {
                    acc[r][t][l] = fmadd::<FMA>(wv[r][l], xv[l], acc[r][t][l]);
                }
            }
        }
        c += 8;
    }
    for r in 0..R {
        for t in 0..T {
            let mut s = hsum(&acc[r][t]);
            for cc in main..cols {
                s = fmadd::<FMA>(wr[r][cc], xt[t][cc], s);
            }
            out[(r0 + r) * n + t0 + t] = s;
        }
    }
}

/// `out[t] = row · x[t]` for every token, four tokens at a time sharing each load of `row`.
#[inline(always)]
fn dot_row_tokens<const FMA: bool>(row: &[f32], x: &[f32], n: usize, out: &mut [f32]) {
    let cols = row.len();
    let main = cols / 8 * 8;
    let mut t = 0;
    while t + 4 <= n {
        let x0 = &x[t * cols..(t + 1) * cols];
        let x1 = &x[(t + 1) * cols..(t + 2) * cols];
        let x2 = &x[(t + 2) * cols..(t + 3) * cols];
        let x3 = &x[(t + 3) * cols..(t + 4) * cols];
        let mut a0 = [0f32; 8];
        let mut a1 = [0f32; 8];
        let mut a2 = [0f32; 8];
        let mut a3 = [0f32; 8];
        let mut c = 0;
        while c < main {
            let w: &[f32; 8] = row[c..c + 8].try_into().expect("8 lanes");
            let v0: &[f32; 8] = x0[c..c + 8].try_into().expect("8 lanes");
            let v1: &[f32; 8] = x1[c..c + 8].try_into().expect("8 lanes");
            let v2: &[f32; 8] = x2[c..c + 8].try_into().expect("8 lanes");
            let v3: &[f32; 8] = x3[c..c + 8].try_into().expect("8 lanes");
            for l in 0..8 {
                a0[l] = fmadd::<FMA>(w[l], v0[l], a0[l]);
                a1[l] = fmadd::<FMA>(w[l], v1[l], a1[l]);
                a2[l] = fmadd::<FMA>(w[l], v2[l], a2[l]);
                a3[l] = fmadd::<FMA>(w[l], v3[l], a3[l]);
            }
            c += 8;
        }
        let mut s = [hsum(&a0), hsum(&a1), hsum(&a2), hsum(&a3)];
        for c in main..cols {
            s[0] = fmadd::<FMA>(row[c], x0[c], s[0]);
            s[1] = fmadd::<FMA>(row[c], x1[c], s[1]);
            s[2] = fmadd::<FMA>(row[c], x2[c], s[2]);
            s[3] = fmadd::<FMA>(row[c], x3[c], s[3]);
        }
        out[t..t + 4].copy_from_slice(&s);
        t += 4;
    }
    while t < n {
        let x0 = &x[t * cols..(t + 1) * cols];
        let mut a0 = [0f32; 8];
        let mut c = 0;
        while c < main {
            let w: &[f32; 8] = row[c..c + 8].try_into().expect("8 lanes");
            let v0: &[f32; 8] = x0[c..c + 8].try_into().expect("8 lanes");
            for l in 0..8 {
                a0[l] = fmadd::<FMA>(w[l], v0[l], a0[l]);
            }
            c += 8;
        }
        let mut s = hsum(&a0);
        for c in main..cols {
            s = fmadd::<FMA>(row[c], x0[c], s);
        }
        out[t] = s;
        t += 1;
    }
}

/// Benchmark hook: the f32 tiled matmul with another register-tile shape (`rows`, `tokens`) ∈
/// {(4,3), (3,4), (4,2), (2,4), (8,1)}, single-threaded, into `yt[row][token]`. Used to pick
/// the shape [`matmul`] uses.
///
/// # Panics
/// On another shape or mismatched sizes.
pub fn matmul_f32_shape(shape: (usize, usize), x: &[f32], n: usize, w: &Matrix, yt: &mut [f32]) {
    let MatData::F32(d) = &w.data else {
        panic!("matmul_f32_shape: f32 matrices only")
    };
    assert_eq!(yt.len(), n * w.rows, "matmul_f32_shape: yt shape");
    assert!(has_avx2_fma(), "matmul_f32_shape: needs AVX2+FMA");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX2+FMA checked above.
    unsafe {
        shape_avx2(shape, d, w.cols, x, n, yt);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn shape_avx2(
    shape: (usize, usize),
    d: &[f32],
    cols: usize,
    x: &[f32],
    n: usize,
    yt: &mut [f32],
) {
    match shape {
        (4, 3) => tiled_shape::<4, 3>(d, cols, x, n, yt),
        (3, 4) => tiled_shape::<3, 4>(d, cols, x, n, yt),
        (4, 2) => tiled_shape::<4, 2>(d, cols, x, n, yt),
        (2, 4) => tiled_shape::<2, 4>(d, cols, x, n, yt),
        (8, 1) => tiled_shape::<8, 1>(d, cols, x, n, yt),
        _ => panic!("matmul_f32_shape: unsupported shape {shape:?}"),
    }
}

#[inline(always)]
fn tiled_shape<const R: usize, const T: usize>(
    w: &[f32],
    cols: usize,
    x: &[f32],
    n: usize,
    out: &mut [f32],
) {
    let rows = w.len() / cols;
    let mut tb = 0;
    while tb < n {
        let te = (tb + TOKEN_BLOCK).min(n);
        let mut r = 0;
        while r + R <= rows {
            let mut t = tb;
            while t + T <= te {
                micro::<R, T, true>(w, cols, r, x, t, out, n);
                t += T;
            }
            while t < te {
                micro::<R, 1, true>(w, cols, r, x, t, out, n);
                t += 1;
            }
            r += R;
        }
        while r < rows {
            for t in tb..te {
                micro::<1, 1, true>(w, cols, r, x, t, out, n);
            }
            r += 1;
        }
        tb = te;
    }
}
