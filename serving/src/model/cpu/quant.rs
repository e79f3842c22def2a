//! The integer kernel of the fallback route: activations quantised to 8 bits per block of 32
//! ([`Q8Act`]), each block's dot product with the Q4_0/Q4_1/Q8_0 weights exact in i32, then
//! scaled in f32; row by row, or in tiles of rows × tokens (AVX2 `maddubs`+`madd`, AVX-512 VNNI
//! `vpdpbusd`).

use rayon::prelude::*;

use super::isa::{QuantPath, has_avx2_fma};
use super::matrix::{MatData, Matrix, Prepared};
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

/// Activations quantised to 8 bits per block of 32 (scale, float sum, values).
pub struct Q8Act {
    pub(super) n: usize,
    pub(super) blocks_per_row: usize,
    pub(super) d: Vec<f32>,
    /// Σ of the block's f32 values (Q4_1's `m` term).
    pub(super) sum: Vec<f32>,
    /// Σ of the block's quantised values (the offset terms of the repacked kernel).
    pub(super) isum: Vec<i32>,
    pub(super) q: Vec<i8>,
}

impl Q8Act {
    /// [`Q8Act::quantize_on`] on the detected path.
    pub fn quantize(x: &[f32], n: usize, cols: usize) -> Q8Act {
        Q8Act::quantize_on(QuantPath::detect(), x, n, cols)
    }

    /// `n` rows of `cols` values (a multiple of 32) to 8 bits per block of 32: `d = amax/127`,
    /// `q = round_ties_even(v · (1/d))` clamped to ±127, `isum = Σq`, `sum` = Σv in eight
    /// lanes then a fixed tree ([`sum32`]; Q4_1's `m` term uses the unquantised sum, which
    /// keeps the route's perplexity closer to the primary's than `d · isum` does). The
    /// vector paths (AVX-512 for [`QuantPath::TilesVnni`], AVX2 for [`QuantPath::Tiles`]) make
    /// the same operations as the scalar one, so every path gets the same bytes.
    ///
    /// # Panics
    /// If `x` is not `n × cols` or `path` is not available.
    pub fn quantize_on(path: QuantPath, x: &[f32], n: usize, cols: usize) -> Q8Act {
        assert_eq!(x.len(), n * cols, "Q8Act: x shape");
        assert!(
            path == QuantPath::detect() || QuantPath::available().contains(&path),
            "Q8Act: {path:?} is not available on this CPU"
        );
        let bpr = cols / QK;
        let nb = n * bpr;
        let mut a = Q8Act {
            n,
            blocks_per_row: bpr,
            d: vec![0.0; nb],
            sum: vec![0.0; nb],
            isum: vec![0; nb],
            q: vec![0; nb * QK],
        };
        // Blocks are independent: split them across the threads when there are enough that
        // the hand-off pays (a batch's activations; one token's stay on this thread).
        let threads = rayon::current_num_threads().max(1);
        if nb < PAR_QUANT_BLOCKS || threads == 1 {
            quantize_blocks(path, x, &mut a.q, &mut a.d, &mut a.sum, &mut a.isum);
            return a;
        }
        let per = nb.div_ceil(threads * 2);
        a.q.par_chunks_mut(per * QK)
            .zip(a.d.par_chunks_mut(per))
            .zip(a.sum.par_chunks_mut(per))
            .zip(a.isum.par_chunks_mut(per))
            .zip(x.par_chunks(per * QK))
            .for_each(|((((q, d), sum), isum), x)| quantize_blocks(path, x, q, d, sum, isum));
        a
    }
}

/// Blocks from which [`Q8Act::quantize_on`] splits the work across threads.
const PAR_QUANT_BLOCKS: usize = 256;

/// Quantises consecutive blocks (`x`: 32 values per block) into `q`, `d`, `sum`, `isum`.
fn quantize_blocks(
    path: QuantPath,
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    sum: &mut [f32],
    isum: &mut [i32],
) {
    for (b, blk) in x.chunks_exact(QK).enumerate() {
        let q = &mut q[b * QK..(b + 1) * QK];
        let blk: &[f32; QK] = blk.try_into().expect("32 values");
        let (db, ib) = match path {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512 F/BW are present for TilesVnni (QuantPath::available).
            QuantPath::TilesVnni => unsafe { simd::quantize_block_avx512(blk, q) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX2 is present for Tiles (QuantPath::available).
            QuantPath::Tiles => unsafe { simd::quantize_block_avx2(blk, q) },
            _ => quantize_block(blk, q),
        };
        d[b] = db;
        isum[b] = ib;
        sum[b] = match path {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX is implied by both vector paths' features.
            QuantPath::TilesVnni | QuantPath::Tiles => unsafe { simd::sum32_avx(blk) },
            _ => sum32(blk),
        };
    }
}

/// Σ of 32 values in a fixed order: lane `l` = ((v[l] + v[8+l]) + v[16+l]) + v[24+l], then
/// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) — what `simd::sum32_avx` computes.
fn sum32(v: &[f32; QK]) -> f32 {
    let a: [f32; 8] = std::array::from_fn(|l| ((v[l] + v[8 + l]) + v[16 + l]) + v[24 + l]);
    ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
}

/// One block: returns `(d, Σq)`.
fn quantize_block(blk: &[f32; QK], q: &mut [i8]) -> (f32, i32) {
    let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut isum = 0;
    for (q, &v) in q.iter_mut().zip(blk) {
        *q = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
        isum += i32::from(*q);
    }
    (d, isum)
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

    use super::{GgmlType, Prepared, QK};
    use crate::model::cpu::simd::{hsum256, unpack_nibbles};

    /// [`super::quantize_block`] with AVX-512 (F, BW): the same max, division, products,
    /// rounding (ties to even) and clamp.
    ///
    /// # Safety
    /// AVX-512 F and BW must be available.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn quantize_block_avx512(blk: &[f32; QK], q: &mut [i8]) -> (f32, i32) {
        assert!(q.len() >= QK);
        // SAFETY: 32 floats in, 32 bytes out (asserted); the features are enabled.
        unsafe {
            let v0 = _mm512_loadu_ps(blk.as_ptr());
            let v1 = _mm512_loadu_ps(blk.as_ptr().add(16));
            // max(|v|, m): a NaN value leaves m, as f32::max does.
            let m = _mm512_max_ps(_mm512_abs_ps(v1), _mm512_abs_ps(v0));
            let amax = _mm512_reduce_max_ps(m).max(0.0);
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
            let idv = _mm512_set1_ps(id);
            let r = |v: __m512| {
                let x = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm512_mul_ps(v, idv),
                );
                _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(x, lo), hi))
            };
            let (i0, i1) = (r(v0), r(v1));
            _mm_storeu_si128(q.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(i0));
            _mm_storeu_si128(q.as_mut_ptr().add(16).cast(), _mm512_cvtepi32_epi8(i1));
            (d, _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1)))
        }
    }

    /// [`super::sum32`] with 8-lane vectors.
    ///
    /// # Safety
    /// AVX must be available.
    #[target_feature(enable = "avx")]
    pub unsafe fn sum32_avx(v: &[f32; QK]) -> f32 {
        // SAFETY: four loads of 8 floats inside the block; AVX enabled.
        unsafe {
            let l = |i: usize| _mm256_loadu_ps(v.as_ptr().add(8 * i));
            let s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(l(0), l(1)), l(2)), l(3));
            hsum256(s)
        }
    }

    /// [`super::quantize_block`] with AVX2, the same operations.
    ///
    /// # Safety
    /// AVX2 must be available.
    #[target_feature(enable = "avx2")]
    pub unsafe fn quantize_block_avx2(blk: &[f32; QK], q: &mut [i8]) -> (f32, i32) {
        assert!(q.len() >= QK);
        // SAFETY: 32 floats in, 32 bytes out (asserted); the features are enabled.
        unsafe {
            let sign = _mm256_set1_ps(-0.0);
            let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(blk.as_ptr().add(8 * i)));
            let mut m = _mm256_setzero_ps();
            for x in v {
                m = _mm256_max_ps(_mm256_andnot_ps(sign, x), m);
            }
            let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            let h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
            let amax = _mm_cvtss_f32(h).max(0.0);
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
            let idv = _mm256_set1_ps(id);
            let i: [__m256i; 4] = std::array::from_fn(|k| {
                let x = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                    _mm256_mul_ps(v[k], idv),
                );
                _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(x, lo), hi))
            });
            let s = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
            let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
            // packs interleave the 128-bit halves; the permutation puts the bytes back in order.
            let p16 = _mm256_packs_epi16(
                _mm256_packs_epi32(i[0], i[1]),
                _mm256_packs_epi32(i[2], i[3]),
            );
            let p8 = _mm256_permutevar8x32_epi32(p16, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(q.as_mut_ptr().cast(), p8);
            (d, _mm_cvtsi128_si32(s))
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activations_quantise_to_the_same_bytes_on_every_path() {
        // Block 0 has amax 127 (d = 1): its halves are rounding ties (to even); block 1 is
        // all zeros (d = 0); the rest are spread values, one of them with a negative amax.
        let mut x: Vec<f32> = (0..32).map(|i| i as f32 - 15.5).collect();
        x[31] = 127.0;
        x.extend([0f32; 32]);
        x.extend((0..64 * 3).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.3));
        x[100] = -9.0;
        let n = 2;
        let cols = x.len() / n;
        let want = Q8Act::quantize_on(QuantPath::RowWise, &x, n, cols);
        assert_eq!(&want.q[..4], &[-16, -14, -14, -12], "ties to even");
        assert_eq!((want.d[1], want.isum[1]), (0.0, 0));
        for b in 0..want.d.len() {
            let s: i32 = want.q[b * QK..(b + 1) * QK]
                .iter()
                .map(|&q| i32::from(q))
                .sum();
            assert_eq!(want.isum[b], s);
            let blk: &[f32; QK] = x[b * QK..(b + 1) * QK].try_into().unwrap();
            assert_eq!(want.sum[b], sum32(blk));
            let plain: f32 = blk.iter().sum();
            assert!((want.sum[b] - plain).abs() <= 1e-4 * (1.0 + plain.abs()));
        }
        for path in QuantPath::available() {
            let got = Q8Act::quantize_on(path, &x, n, cols);
            assert_eq!(got.q, want.q, "{path:?}");
            assert_eq!(got.d, want.d, "{path:?}");
            assert_eq!(got.isum, want.isum, "{path:?}");
            assert_eq!(got.sum, want.sum, "{path:?}");
        }
    }

    #[test]
    fn a_batch_quantises_the_same_split_across_threads_as_on_one() {
        // 288 blocks: split into 6 tasks of 48 on 3 threads; on one thread in one piece.
        let (n, cols) = (12, 768);
        assert!(n * cols / QK >= PAR_QUANT_BLOCKS);
        let x: Vec<f32> = (0..n * cols)
            .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 97.0)
            .collect();
        let pool = |t| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap()
        };
        let (one, three) = (pool(1), pool(3));
        for path in QuantPath::available() {
            let a = one.install(|| Q8Act::quantize_on(path, &x, n, cols));
            let b = three.install(|| Q8Act::quantize_on(path, &x, n, cols));
            assert_eq!((&a.q, &a.d, &a.isum, &a.sum), (&b.q, &b.d, &b.isum, &b.sum));
            let bpr = cols / QK;
            for t in 0..n {
                let r = Q8Act::quantize_on(path, &x[t * cols..(t + 1) * cols], 1, cols);
                assert_eq!(r.q[..], b.q[t * cols..(t + 1) * cols], "{path:?} t={t}");
                assert_eq!(r.d[..], b.d[t * bpr..(t + 1) * bpr], "{path:?} t={t}");
                assert_eq!(r.sum[..], b.sum[t * bpr..(t + 1) * bpr], "{path:?} t={t}");
            }
        }
    }
}
