//! Small helpers shared by the kernels: the output pointer of the parallel tasks, scalar
//! multiply-add and 8-lane sums (the f32 baselines), and x86 vector pieces (the horizontal sum
//! of eight floats, Q4 nibble unpacking) used by the integer kernels.

/// An output pointer handed to parallel tasks, each writing its own columns
/// ([`super::packed::packed_matmul_on`], [`super::tiled::gemm_rows_parallel`]).
#[derive(Clone, Copy)]
pub(super) struct OutPtr(pub(super) *mut f32);
// SAFETY: the tasks write disjoint column ranges of the same output (see the callers).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

#[inline(always)]
pub(super) fn fmadd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

#[inline(always)]
pub(super) fn hsum(acc: &[f32; 8]) -> f32 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

/// The sum of the eight lanes of `a`: (lo + hi) halves, then pairs, then the last two — the
/// order every integer kernel uses, so their results agree bit for bit.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn hsum256(a: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    // SAFETY: AVX is implied by every caller's AVX2 target feature; register-only operations.
    unsafe {
        let lo = _mm256_castps256_ps128(a);
        let hi = _mm256_extractf128_ps(a, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0b01));
        _mm_cvtss_f32(s)
    }
}

/// 16 bytes of Q4 nibbles as 32 bytes: the low nibbles (values 0..16) in the low half, the high
/// nibbles (values 16..32) in the high half, each 0..=15.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) fn unpack_nibbles(raw: std::arch::x86_64::__m128i) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    // SAFETY: AVX2 is enabled in every caller; register-only operations.
    unsafe {
        let low = _mm_set1_epi8(0x0f);
        let lo = _mm_and_si128(raw, low);
        let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
        _mm256_set_m128i(hi, lo)
    }
}
