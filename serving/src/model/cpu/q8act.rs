//! Activations quantised to 8 bits per block of 32 ([`Q8Act`]): the input of both integer
//! kernels (`quant.rs` over GGUF blocks, `repacked.rs` over repacked panels), the same bytes on
//! every path (scalar, AVX2, AVX-512).

use rayon::prelude::*;

use super::isa::QuantPath;
use crate::model::quant::QK;

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

#[cfg(target_arch = "x86_64")]
mod simd {
    use std::arch::x86_64::*;

    use super::QK;
    use crate::model::cpu::simd::hsum256;

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
