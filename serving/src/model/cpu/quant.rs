//! The integer kernel of the fallback route: activations quantised to 8 bits per block of 32
//! ([`Q8Act`], in `q8act.rs`), each block's dot product with the Q4_0/Q4_1/Q8_0 weights exact in i32, then
//! scaled in f32; row by row, or in tiles of rows × tokens (AVX2 `maddubs`+`madd`, AVX-512 VNNI
//! `vpdpbusd`).

use rayon::prelude::*;

use super::isa::{QuantPath, has_avx2_fma};
use super::matrix::{MatData, Matrix, Prepared};
use super::q8act::Q8Act;
use super::{rows_per_task, transpose_into};
use crate::model::gguf::GgmlType;
use crate::model::quant::QK;

/// The quantised matmul (activations quantised to 8 bits per block) on a chosen path; `w`
/// quantised (raw blocks are prepared on the fly: the model prepares its matrices at load).
///
/// # Panics
/// If the shapes do not match, `w` is not quantised, or `path` is not available.
pub fn quant_matmul_on(path: QuantPath, x: &[f32], n: usize, w: &Matrix, y: &mut [f32]) {
    assert!(
        path == QuantPath::detect() || QuantPath::available().contains(&path),
        "quant_matmul_on: {path:?} is not available on this CPU"
    );
    assert_eq!(x.len(), n * w.cols, "matmul: x shape");
    assert_eq!(y.len(), n * w.rows, "matmul: y shape");
    let tmp;
    let w = match &w.data {
        MatData::Quant(..) => {
            tmp = w.clone().prepared();
            &tmp
        }
        MatData::Prepared(_) => w,
        _ => panic!("quant_matmul_on: {} matrix", w.type_name()),
    };
    let qx = Q8Act::quantize(x, n, w.cols);
    let per = rows_per_task(w.rows, rayon::current_num_threads().max(1));
    let mut yt = vec![0f32; n * w.rows];
    yt.par_chunks_mut(per * n).enumerate().for_each(|(i, out)| {
        let r0 = i * per;
        let r1 = (r0 + per).min(w.rows);
        quant_rows_task(&qx, w, r0, r1, out, path);
    });
    transpose_into(&yt, n, w.rows, y);
}

fn quant_rows_task(qx: &Q8Act, w: &Matrix, r0: usize, r1: usize, out: &mut [f32], path: QuantPath) {
    let MatData::Prepared(p) = &w.data else {
        unreachable!("quant_rows_task on a matrix that is not prepared")
    };
    let bpr = qx.blocks_per_row;
    let ql = p.qlen();
    let n = qx.n;
    let avx2 = has_avx2_fma();
    #[cfg(target_arch = "x86_64")]
    {
        if path != QuantPath::RowWise {
            // SAFETY: the path is one of QuantPath::available(): AVX2+FMA, and AVX-512
            // VNNI+VL for TilesVnni, were detected.
            unsafe { simd::quant_tiles(p, qx, r0, r1, out, path == QuantPath::TilesVnni) };
            return;
        }
    }
    for r in r0..r1 {
        let qs = &p.qs[r * bpr * ql..(r + 1) * bpr * ql];
        let wd = &p.d[r * bpr..(r + 1) * bpr];
        for t in 0..n {
            let xq = &qx.q[t * bpr * QK..(t + 1) * bpr * QK];
            let xd = &qx.d[t * bpr..(t + 1) * bpr];
            let mut s = 0f32;
            #[cfg(target_arch = "x86_64")]
            {
                if avx2 {
                    // SAFETY: AVX2+FMA detected; the slices hold `bpr` blocks each.
                    s = unsafe { simd::dot_row(p.ty, qs, wd, xq, xd) };
                }
            }
            if !avx2 {
                s = dot_row_scalar(p.ty, qs, wd, xq, xd);
            }
            if p.ty == GgmlType::Q4_1 {
                let xs = &qx.sum[t * bpr..(t + 1) * bpr];
                let wm = &p.m[r * bpr..(r + 1) * bpr];
                s += wm.iter().zip(xs).map(|(m, x)| m * x).sum::<f32>();
            }
            out[(r - r0) * n + t] = s;
        }
    }
}

/// Σ_b wd[b]·xd[b]·(Σ_j q_w[b,j]·q_x[b,j]) with q_w unsigned nibbles (Q4_1), nibbles − 8
/// (Q4_0) or signed bytes (Q8_0).
fn dot_row_scalar(ty: GgmlType, qs: &[u8], wd: &[f32], xq: &[i8], xd: &[f32]) -> f32 {
    let mut s = 0f32;
    for b in 0..wd.len() {
        let x = &xq[b * QK..(b + 1) * QK];
        let mut i = 0i32;
        match ty {
            GgmlType::Q8_0 => {
                for j in 0..QK {
                    i += i32::from(qs[b * QK + j] as i8) * i32::from(x[j]);
                }
            }
            _ => {
                let off = if ty == GgmlType::Q4_0 { 8 } else { 0 };
                for j in 0..16 {
                    let q = qs[b * 16 + j];
                    i += (i32::from(q & 0x0f) - off) * i32::from(x[j]);
                    i += (i32::from(q >> 4) - off) * i32::from(x[j + 16]);
                }
            }
        }
        s += wd[b] * xd[b] * i as f32;
    }
    s
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::{GgmlType, Prepared};
    use crate::model::cpu::simd::{hsum256, unpack_nibbles};

    /// The quantised matmul for rows `r0..r1` (into `out[(r - r0) * n + t]`), in tiles of
    /// rows × tokens so that each block of weights is unpacked once per tile rather than once
    /// per token. Each (row, token) gets exactly [`dot_row`]'s operations in its order — the
    /// same eight i32 lanes per block (AVX-512 VNNI's `vpdpbusd` sums the same four products
    /// per lane as `maddubs`+`madd`, and no sum of Q4/Q8 products saturates either), the same
    /// float multiply-adds, the same final sum — so the result is bit-identical whatever the
    /// tile, the batch or the instruction set.
    ///
    /// # Safety
    /// AVX2+FMA must be available, and AVX-512 VNNI+VL when `vnni`.
    pub unsafe fn quant_tiles(
        p: &Prepared,
        qx: &super::Q8Act,
        r0: usize,
        r1: usize,
        out: &mut [f32],
        vnni: bool,
    ) {
        let n = qx.n;
        assert!(out.len() >= (r1 - r0) * n, "quant_tiles: out");
        let mut r = r0;
        while r < r1 {
            let rr = if r1 - r >= 4 { 4 } else { 1 };
            let mut t = 0;
            while t < n {
                let tt = if n - t >= 4 { 4 } else { 1 };
                // SAFETY: the caller guarantees the features; tiles stay within r0..r1 × 0..n.
                unsafe {
                    match (vnni, rr, tt) {
                        (true, 4, 4) => tile_vnni::<4, 4>(p, qx, r, t, r0, out),
                        (true, 4, _) => tile_vnni::<4, 1>(p, qx, r, t, r0, out),
                        (true, _, 4) => tile_vnni::<1, 4>(p, qx, r, t, r0, out),
                        (true, _, _) => tile_vnni::<1, 1>(p, qx, r, t, r0, out),
                        (false, 4, 4) => tile_avx2::<4, 4>(p, qx, r, t, r0, out),
                        (false, 4, _) => tile_avx2::<4, 1>(p, qx, r, t, r0, out),
                        (false, _, 4) => tile_avx2::<1, 4>(p, qx, r, t, r0, out),
                        (false, _, _) => tile_avx2::<1, 1>(p, qx, r, t, r0, out),
                    }
                }
                t += tt;
            }
            r += rr;
        }
    }

    #[target_feature(enable = "avx2,fma,avx512vl,avx512vnni")]
    unsafe fn tile_vnni<const R: usize, const T: usize>(
        p: &Prepared,
        qx: &super::Q8Act,
        r: usize,
        t: usize,
        r0: usize,
        out: &mut [f32],
    ) {
        // SAFETY: forwarded from the caller; the features are enabled here.
        unsafe { tile::<R, T, true>(p, qx, r, t, r0, out) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile_avx2<const R: usize, const T: usize>(
        p: &Prepared,
        qx: &super::Q8Act,
        r: usize,
        t: usize,
        r0: usize,
        out: &mut [f32],
    ) {
        // SAFETY: forwarded from the caller; the features are enabled here.
        unsafe { tile::<R, T, false>(p, qx, r, t, r0, out) }
    }

    /// How many row tiles ahead [`tile`] prefetches the weights.
    const QUANT_PREFETCH_TILES: usize = 4;

    /// Rows `r..r + R` × tokens `t..t + T`.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn tile<const R: usize, const T: usize, const VNNI: bool>(
        p: &Prepared,
        qx: &super::Q8Act,
        r: usize,
        t: usize,
        r0: usize,
        out: &mut [f32],
    ) {
        let ty = p.ty;
        let nb = qx.blocks_per_row;
        let ql = if ty == GgmlType::Q8_0 { 32 } else { 16 };
        let n = qx.n;
        assert!(
            p.qs.len() >= (r + R) * nb * ql
                && p.d.len() >= (r + R) * nb
                && qx.q.len() >= (t + T) * nb * 32
                && qx.d.len() >= (t + T) * nb
                && out.len() >= (r + R - r0) * n,
            "quant tile sizes"
        );
        // SAFETY: every load below is inside the slices checked above; the features are
        // enabled by the caller (VNNI only in tile_vnni).
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let eight = _mm256_set1_epi8(8);
            let mut acc = [[_mm256_setzero_ps(); T]; R];
            // The weights of the tile QUANT_PREFETCH_TILES ahead, spread over the blocks: the
            // rows are short (cols / 2 bytes) and the hardware prefetcher stays too close.
            // Bytes of the tile per block (R rows × ql); no division in the loop.
            let span = R * ql;
            let ahead =
                p.qs.as_ptr()
                    .wrapping_add((r + R * QUANT_PREFETCH_TILES) * nb * ql);
            for b in 0..nb {
                let mut line = (b * span) & !63;
                while line < (b + 1) * span {
                    // A hint: never faults, even past the end of the weights.
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast::<i8>());
                    line += 64;
                }
                let xv: [__m256i; T] = std::array::from_fn(|j| {
                    _mm256_loadu_si256(qx.q.as_ptr().add(((t + j) * nb + b) * 32).cast())
                });
                for i in 0..R {
                    let base = ((r + i) * nb + b) * ql;
                    let wv = match ty {
                        GgmlType::Q8_0 => _mm256_loadu_si256(p.qs.as_ptr().add(base).cast()),
                        _ => {
                            let raw = _mm_loadu_si128(p.qs.as_ptr().add(base).cast());
                            let v = unpack_nibbles(raw);
                            if ty == GgmlType::Q4_0 {
                                _mm256_sub_epi8(v, eight)
                            } else {
                                v
                            }
                        }
                    };
                    // maddubs / dpbusd want unsigned × signed: Q4_1's nibbles are unsigned
                    // already; otherwise |w| × (x with w's sign).
                    let wa = if ty == GgmlType::Q4_1 {
                        wv
                    } else {
                        _mm256_sign_epi8(wv, wv)
                    };
                    let wd = p.d[(r + i) * nb + b];
                    for j in 0..T {
                        let xb = if ty == GgmlType::Q4_1 {
                            xv[j]
                        } else {
                            _mm256_sign_epi8(xv[j], wv)
                        };
                        let p32 = if VNNI {
                            _mm256_dpbusd_epi32(_mm256_setzero_si256(), wa, xb)
                        } else {
                            _mm256_madd_epi16(_mm256_maddubs_epi16(wa, xb), ones)
                        };
                        let pf = _mm256_cvtepi32_ps(p32);
                        let scale = wd * qx.d[(t + j) * nb + b];
                        acc[i][j] = _mm256_fmadd_ps(pf, _mm256_set1_ps(scale), acc[i][j]);
                    }
                }
            }
            for i in 0..R {
                for j in 0..T {
                    let mut v = hsum256(acc[i][j]);
                    if ty == GgmlType::Q4_1 {
                        let xs = &qx.sum[(t + j) * nb..(t + j + 1) * nb];
                        let wm = &p.m[(r + i) * nb..(r + i + 1) * nb];
                        v += wm.iter().zip(xs).map(|(m, x)| m * x).sum::<f32>();
                    }
                    out[(r + i - r0) * n + t + j] = v;
                }
            }
        }
    }

    /// AVX2 version of [`super::dot_row_scalar`] (same value up to float summation order).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_row(ty: GgmlType, qs: &[u8], wd: &[f32], x: &[i8], xd: &[f32]) -> f32 {
        let nb = wd.len();
        let ql = if ty == GgmlType::Q8_0 { 32 } else { 16 };
        assert!(
            qs.len() >= nb * ql && x.len() >= nb * 32 && xd.len() >= nb,
            "dot_row sizes"
        );
        // SAFETY: the loads stay inside `qs` and `x` (checked above).
        unsafe {
            let ones = _mm256_set1_epi16(1);
            let eight = _mm256_set1_epi8(8);
            let mut acc = _mm256_setzero_ps();
            for b in 0..nb {
                let xv = _mm256_loadu_si256(x.as_ptr().add(b * 32).cast());
                let p16 = match ty {
                    GgmlType::Q4_1 => {
                        let raw = _mm_loadu_si128(qs.as_ptr().add(b * 16).cast());
                        _mm256_maddubs_epi16(unpack_nibbles(raw), xv)
                    }
                    _ => {
                        let wv = if ty == GgmlType::Q8_0 {
                            _mm256_loadu_si256(qs.as_ptr().add(b * 32).cast())
                        } else {
                            let raw = _mm_loadu_si128(qs.as_ptr().add(b * 16).cast());
                            _mm256_sub_epi8(unpack_nibbles(raw), eight)
                        };
                        // maddubs wants unsigned × signed: |w| × (x with w's sign).
                        _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv))
                    }
                };
                let p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
                acc = _mm256_fmadd_ps(p, _mm256_set1_ps(wd[b] * xd[b]), acc);
            }
            hsum256(acc)
        }
    }
}
