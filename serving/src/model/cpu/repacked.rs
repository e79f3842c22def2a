//! The fallback route's integer kernel over weights repacked once at load (the default for
//! quantised matrices).
//!
//! Layout ([`Repacked`]): panels of [`RP`] = 16 rows; for each panel and each block of 32 input
//! columns one record, panel-major, so a panel's weights are one sequential stream:
//!
//! ```text
//!  Q4_0 / Q4_1:  4 chunks × [16 rows × 4 bytes of nibbles]  (chunk c, byte k of row r = the
//!                row's GGUF nibble byte 4c+k: value 4c+k in its low nibble, 16+4c+k in its high)
//!  Q8_0:         8 chunks × [16 rows × 4 bytes]  (chunk c, byte k = value 4c+k, stored + 128)
//!  then          16 × f16 d, and for Q4_1 16 × f16 m   (the GGUF scales, unchanged)
//! ```
//!
//! One 64-byte chunk is one AVX-512 register holding 4 bytes of each of the 16 rows, so one
//! `vpdpbusd` with the token's 4 activation bytes broadcast adds 4 products to each row's lane:
//! each row's i32 block sum is built in its own lane — no per-(row, token) horizontal sums — and
//! the 16 rows' scales are applied with one vector multiply-add per (block, token). Activations
//! are quantised to 8 bits per block once per call ([`Q8Act`]).
//!
//! Same bits everywhere: each (row, token) gets the exact i32 sum of its block (any order gives
//! the same integer), converted to f32, then `acc = fma(isum, d_w·d_x, acc)` (and for Q4_1
//! `acc = fma(m_w, Σx, acc)`), block after block in order. The AVX-512 VNNI kernel (16 rows ×
//! up to 8 tokens), the AVX2 kernel (`maddubs`+`madd`, 16 rows × up to 6 tokens, Q8_0 4) and the scalar
//! loop do exactly that, so the result depends neither on the batch, nor on the token's place,
//! nor on the instruction set.
//!
//! The integers: Q4_1 `Σ q·x` (q 0..=15); Q4_0 `Σ q·x − 8·Σx` (= `Σ (q − 8)·x`); Q8_0 `Σ w·x`,
//! which VNNI (unsigned × signed) gets as `Σ (w + 128)·x − 128·Σx`. None can overflow i32
//! (|Σ| ≤ 32 · 255 · 127).

use rayon::prelude::*;

use super::isa::QuantPath;
use super::q8act::Q8Act;
use super::simd::OutPtr;
use crate::model::gguf::GgmlType;
use crate::model::quant::QK;

/// Rows per panel (one AVX-512 register of i32 lanes).
pub const RP: usize = 16;

/// Tokens per tile of the AVX2 kernel: 16 rows × 6 tokens for Q4 (its i16 sums leave registers
/// for six), × 4 for Q8_0 (i32 sums per chunk). Measured with `examples/bench_quant`.
const fn avx2_tokens(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q8_0 => 4,
        _ => 6,
    }
}

/// A quantised matrix repacked for [`repacked_matmul_on`].
#[derive(Clone)]
pub struct Repacked {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    data: Vec<u8>,
}

impl std::fmt::Debug for Repacked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Repacked({} {}x{}, {} bytes)",
            self.ty.name(),
            self.rows,
            self.cols,
            self.data.len()
        )
    }
}

/// Bytes of one record's quantised values.
const fn qbytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q8_0 => RP * QK,
        _ => RP * QK / 2,
    }
}

/// Bytes of one record (values, d, and m for Q4_1).
const fn record_bytes(ty: GgmlType) -> usize {
    qbytes(ty)
        + 2 * RP
        + match ty {
            GgmlType::Q4_1 => 2 * RP,
            _ => 0,
        }
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

impl Repacked {
    /// Repacks `rows` rows of raw GGUF blocks (`cols / 32` blocks per row). The last panel is
    /// padded with zero rows (scale 0), which are computed and never stored.
    ///
    /// # Panics
    /// If `ty` is not Q4_0, Q4_1 or Q8_0, or `raw` is not `rows` rows of blocks.
    pub fn from_raw(ty: GgmlType, rows: usize, cols: usize, raw: &[u8]) -> Repacked {
        assert!(
            matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0),
            "repack: {} is not a block type",
            ty.name()
        );
        let (bb, nb) = (ty.block_bytes(), cols / QK);
        assert_eq!(raw.len(), rows * nb * bb, "repack: size");
        let (qb, rec) = (qbytes(ty), record_bytes(ty));
        let panels = rows.div_ceil(RP);
        let mut data = vec![0u8; panels * nb * rec];
        for (pr, out) in data.chunks_exact_mut(rec).enumerate() {
            let (p, b) = (pr / nb, pr % nb);
            for r in 0..RP {
                let row = p * RP + r;
                if row >= rows {
                    continue;
                }
                let blk = &raw[(row * nb + b) * bb..(row * nb + b + 1) * bb];
                out[qb + 2 * r..qb + 2 * r + 2].copy_from_slice(&blk[0..2]);
                match ty {
                    GgmlType::Q8_0 => {
                        for v in 0..QK {
                            out[v / 4 * 64 + r * 4 + v % 4] = blk[2 + v] ^ 0x80;
                        }
                    }
                    _ => {
                        let off = if ty == GgmlType::Q4_1 { 4 } else { 2 };
                        for j in 0..QK / 2 {
                            out[j / 4 * 64 + r * 4 + j % 4] = blk[off + j];
                        }
                        if ty == GgmlType::Q4_1 {
                            out[qb + 2 * RP + 2 * r..qb + 2 * RP + 2 * r + 2]
                                .copy_from_slice(&blk[2..4]);
                        }
                    }
                }
            }
        }
        Repacked {
            ty,
            rows,
            cols,
            data,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    fn blocks(&self) -> usize {
        self.cols / QK
    }

    fn record(&self, panel: usize, b: usize) -> &[u8] {
        let rec = record_bytes(self.ty);
        let i = (panel * self.blocks() + b) * rec;
        &self.data[i..i + rec]
    }

    /// Value `v` (0..32) of row `r` (0..16) of a record, as the integer the kernels multiply:
    /// the nibble (Q4) or the signed byte (Q8_0).
    fn q(&self, rec: &[u8], r: usize, v: usize) -> i32 {
        match self.ty {
            GgmlType::Q8_0 => i32::from((rec[v / 4 * 64 + r * 4 + v % 4] ^ 0x80) as i8),
            _ => {
                let j = v % 16;
                let byte = rec[j / 4 * 64 + r * 4 + j % 4];
                i32::from(if v < 16 { byte & 0x0f } else { byte >> 4 })
            }
        }
    }

    /// Row `r` as f32 (the same values as dequantising the GGUF blocks).
    pub fn row_f32(&self, row: usize, out: &mut [f32]) {
        let (p, r) = (row / RP, row % RP);
        let qb = qbytes(self.ty);
        for (b, o) in out.chunks_exact_mut(QK).enumerate() {
            let rec = self.record(p, b);
            let d = f16_at(rec, qb + 2 * r);
            match self.ty {
                GgmlType::Q4_1 => {
                    let m = f16_at(rec, qb + 2 * RP + 2 * r);
                    for (v, o) in o.iter_mut().enumerate() {
                        *o = self.q(rec, r, v) as f32 * d + m;
                    }
                }
                GgmlType::Q4_0 => {
                    for (v, o) in o.iter_mut().enumerate() {
                        *o = (self.q(rec, r, v) as f32 - 8.0) * d;
                    }
                }
                _ => {
                    for (v, o) in o.iter_mut().enumerate() {
                        *o = self.q(rec, r, v) as f32 * d;
                    }
                }
            }
        }
    }
}

/// `y[n][rows] = x[n][cols] · wᵀ` on a chosen path (one of [`QuantPath::available`]):
/// [`QuantPath::TilesVnni`] the AVX-512 VNNI kernel, [`QuantPath::Tiles`] the AVX2 one,
/// [`QuantPath::RowWise`] the scalar loop. All give the same bits.
///
/// # Panics
/// If the shapes do not match or `path` is not available.
pub fn repacked_matmul_on(
    path: QuantPath,
    w: &Repacked,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    threads: usize,
) {
    assert_eq!(x.len(), n * w.cols, "repacked_matmul: x shape");
    assert_eq!(y.len(), n * w.rows, "repacked_matmul: y shape");
    assert!(
        path == QuantPath::detect() || QuantPath::available().contains(&path),
        "repacked_matmul: {path:?} is not available on this CPU"
    );
    if n == 0 || w.rows == 0 {
        return;
    }
    let qx = Q8Act::quantize_on(path, x, n, w.cols);
    let panels = w.rows.div_ceil(RP);
    let threads = threads.max(1);
    // As the packed kernel: up to eight tasks per thread, a multiple of the thread count.
    let tasks = ((panels / 4).min(threads * 8) / threads * threads).max(1);
    let out = OutPtr(y.as_mut_ptr());
    let qx = &qx;
    let group = tile_tokens(path, w.ty, n);
    // A tall matrix at a batch (the output head): one panel at a time would write one line
    // into each of `n` output rows per panel, `n` scattered store streams into memory that is
    // not in cache. A run of panels (in L2) per token group writes longer runs instead.
    let run = if n > group && n * w.rows * 4 > TALL_OUTPUT_BYTES {
        PANEL_RUN
    } else {
        1
    };
    (0..tasks).into_par_iter().for_each(|i| {
        #[allow(clippy::redundant_locals)]
        let out = out;
        let (p0, p1) = (i * panels / tasks, (i + 1) * panels / tasks);
        let mut ps = p0;
        while ps < p1 {
            let pe = (ps + run).min(p1);
            let mut t = 0;
            while t < n {
                let tt = tile_tokens(path, w.ty, n - t);
                for p in ps..pe {
                    // SAFETY: this task alone writes rows p·16.. of every token (its own
                    // panels), and the path is available (asserted above).
                    unsafe { tile(path, w, qx, p, t, tt, out) };
                }
                t += tt;
            }
            ps = pe;
        }
    });
}

/// Output bytes above which [`repacked_matmul_on`] walks runs of [`PANEL_RUN`] panels per token
/// group.
const TALL_OUTPUT_BYTES: usize = 1 << 20;

/// Panels per run (16 × 16 rows of 576 columns of Q8_0: 157 KiB, in L2).
const PANEL_RUN: usize = 16;

/// Tokens of the next tile when `left` remain.
fn tile_tokens(path: QuantPath, ty: GgmlType, left: usize) -> usize {
    match path {
        QuantPath::TilesVnni => left.min(8),
        QuantPath::Tiles => left.min(avx2_tokens(ty)),
        QuantPath::RowWise => 1,
    }
}

/// Panel `p` against tokens `t..t + tt`.
///
/// # Safety
/// `out` is the `n × rows` output, whose columns of this panel only the caller writes; the
/// path's features are present.
unsafe fn tile(
    path: QuantPath,
    w: &Repacked,
    qx: &Q8Act,
    p: usize,
    t: usize,
    tt: usize,
    out: OutPtr,
) {
    let mut acc = [[0f32; RP]; 8];
    let acc = &mut acc[..tt];
    match path {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512 F/BW/VNNI are present (the path is available).
        QuantPath::TilesVnni => unsafe { x86::panel_vnni(w, qx, p, t, acc) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX2, FMA and F16C are present (the path is available).
        QuantPath::Tiles => unsafe { x86::panel_avx2(w, qx, p, t, acc) },
        _ => panel_scalar(w, qx, p, t, acc),
    }
    let r0 = p * RP;
    let valid = (w.rows - r0).min(RP);
    for (j, a) in acc.iter().enumerate() {
        // SAFETY: row t + j of the output, columns r0..r0 + valid: in bounds, ours.
        unsafe {
            std::ptr::copy_nonoverlapping(a.as_ptr(), out.0.add((t + j) * w.rows + r0), valid);
        }
    }
}

/// The reference arithmetic, one (row, token) at a time.
fn panel_scalar(w: &Repacked, qx: &Q8Act, p: usize, t0: usize, acc: &mut [[f32; RP]]) {
    let nb = w.blocks();
    let qb = qbytes(w.ty);
    for b in 0..nb {
        let rec = w.record(p, b);
        for (j, a) in acc.iter_mut().enumerate() {
            let xb = (t0 + j) * nb + b;
            let x = &qx.q[xb * QK..(xb + 1) * QK];
            for (r, a) in a.iter_mut().enumerate() {
                let mut is: i32 = (0..QK).map(|v| w.q(rec, r, v) * i32::from(x[v])).sum();
                if w.ty == GgmlType::Q4_0 {
                    is -= 8 * qx.isum[xb];
                }
                let wd = f16_at(rec, qb + 2 * r);
                *a = (is as f32).mul_add(wd * qx.d[xb], *a);
                if w.ty == GgmlType::Q4_1 {
                    *a = f16_at(rec, qb + 2 * RP + 2 * r).mul_add(qx.sum[xb], *a);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{GgmlType, Q8Act, QK, RP, Repacked, avx2_tokens, qbytes, record_bytes};

    /// Four activation bytes `x[o..o + 4]` of block `xb`, in every i32 lane.
    #[inline(always)]
    unsafe fn bcast4_512(qx: &Q8Act, xb: usize, o: usize) -> __m512i {
        // SAFETY: xb < n · blocks and o + 4 <= 32 (callers); an unaligned 4-byte read.
        unsafe {
            _mm512_set1_epi32(std::ptr::read_unaligned(
                qx.q.as_ptr().add(xb * QK + o).cast::<i32>(),
            ))
        }
    }

    #[inline(always)]
    unsafe fn bcast4_256(qx: &Q8Act, xb: usize, o: usize) -> __m256i {
        // SAFETY: as bcast4_512.
        unsafe {
            _mm256_set1_epi32(std::ptr::read_unaligned(
                qx.q.as_ptr().add(xb * QK + o).cast::<i32>(),
            ))
        }
    }

    /// 16 rows × `acc.len()` (≤ 8) tokens from `t0`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) unsafe fn panel_vnni(
        w: &Repacked,
        qx: &Q8Act,
        p: usize,
        t0: usize,
        acc: &mut [[f32; RP]],
    ) {
        // Q4_1 has a kernel for every width; the others 8, 4, 2, 1 and the rest in parts.
        match (w.ty, acc.len()) {
            (_, 0) => {}
            (GgmlType::Q4_1, 8) => unsafe { vnni::<1, 8>(w, qx, p, t0, acc) },
            (GgmlType::Q4_1, 7) => unsafe { vnni::<1, 7>(w, qx, p, t0, acc) },
            (GgmlType::Q4_1, 6) => unsafe { vnni::<1, 6>(w, qx, p, t0, acc) },
            (GgmlType::Q4_1, 5) => unsafe { vnni::<1, 5>(w, qx, p, t0, acc) },
            (GgmlType::Q4_1, 4) => unsafe { vnni::<1, 4>(w, qx, p, t0, acc) },
            (GgmlType::Q4_1, 3) => unsafe { vnni::<1, 3>(w, qx, p, t0, acc) },
            (GgmlType::Q4_1, 2) => unsafe { vnni::<1, 2>(w, qx, p, t0, acc) },
            (GgmlType::Q4_1, _) => unsafe { vnni::<1, 1>(w, qx, p, t0, acc) },
            (GgmlType::Q8_0, 8) => unsafe { vnni::<2, 8>(w, qx, p, t0, acc) },
            (GgmlType::Q8_0, 4..=7) => {
                unsafe { vnni::<2, 4>(w, qx, p, t0, &mut acc[..4]) };
                unsafe { panel_vnni(w, qx, p, t0 + 4, &mut acc[4..]) };
            }
            (GgmlType::Q8_0, 2 | 3) => {
                unsafe { vnni::<2, 2>(w, qx, p, t0, &mut acc[..2]) };
                unsafe { panel_vnni(w, qx, p, t0 + 2, &mut acc[2..]) };
            }
            (GgmlType::Q8_0, _) => unsafe { vnni::<2, 1>(w, qx, p, t0, acc) },
            (_, 8) => unsafe { vnni::<0, 8>(w, qx, p, t0, acc) },
            (_, 4..=7) => {
                unsafe { vnni::<0, 4>(w, qx, p, t0, &mut acc[..4]) };
                unsafe { panel_vnni(w, qx, p, t0 + 4, &mut acc[4..]) };
            }
            (_, 2 | 3) => {
                unsafe { vnni::<0, 2>(w, qx, p, t0, &mut acc[..2]) };
                unsafe { panel_vnni(w, qx, p, t0 + 2, &mut acc[2..]) };
            }
            (_, _) => unsafe { vnni::<0, 1>(w, qx, p, t0, acc) },
        }
    }

    /// A tile's blocks per row, quant bytes and record bytes, after checking that panel `p` and
    /// tokens `t0..t0 + t` are inside `w` and `qx` and that `acc` holds `t` rows: what makes
    /// every load of the tile kernels in bounds.
    #[inline(always)]
    fn tile_dims(
        w: &Repacked,
        qx: &Q8Act,
        p: usize,
        t0: usize,
        t: usize,
        acc_rows: usize,
    ) -> (usize, usize, usize) {
        let nb = w.blocks();
        let (qb, rec) = (qbytes(w.ty), record_bytes(w.ty));
        assert!(
            acc_rows == t
                && (p + 1) * nb * rec <= w.data.len()
                && (t0 + t) * nb <= qx.d.len()
                && qx.q.len() >= (t0 + t) * nb * QK,
            "repacked tile sizes"
        );
        (nb, qb, rec)
    }

    /// Records ahead of the one in use that are prefetched (one token group streams the
    /// panel from memory).
    const PREFETCH_RECORDS: usize = 8;

    /// `K`: 0 = Q4_0, 1 = Q4_1, 2 = Q8_0.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn vnni<const K: u8, const T: usize>(
        w: &Repacked,
        qx: &Q8Act,
        p: usize,
        t0: usize,
        acc: &mut [[f32; RP]],
    ) {
        let (nb, qb, rec) = tile_dims(w, qx, p, t0, T, acc.len());
        // SAFETY: every load is inside the panel's records or the tokens' blocks (asserted);
        // the features are enabled by the caller.
        unsafe {
            let base = w.data.as_ptr().add(p * nb * rec);
            let m0f = _mm512_set1_epi8(0x0f);
            let mut a = [_mm512_setzero_ps(); T];
            for b in 0..nb {
                let r = base.add(b * rec);
                let ahead = r.wrapping_add(PREFETCH_RECORDS * rec);
                let mut l = 0;
                while l < rec {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(l).cast::<i8>());
                    l += 64;
                }
                // wv[c] pairs with activation bytes 4c..4c+4 (c < 4) and 16 + 4(c − 4)..
                let mut wv = [_mm512_setzero_si512(); 8];
                if K == 2 {
                    for c in 0..8 {
                        wv[c] = _mm512_loadu_si512(r.add(c * 64).cast());
                    }
                } else {
                    for c in 0..4 {
                        let v = _mm512_loadu_si512(r.add(c * 64).cast());
                        wv[c] = _mm512_and_si512(v, m0f);
                        wv[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m0f);
                    }
                }
                let wd = _mm512_cvtph_ps(_mm256_loadu_si256(r.add(qb).cast()));
                let wm = if K == 1 {
                    _mm512_cvtph_ps(_mm256_loadu_si256(r.add(qb + 2 * RP).cast()))
                } else {
                    _mm512_setzero_ps()
                };
                for j in 0..T {
                    let xb = (t0 + j) * nb + b;
                    let mut i0 = _mm512_setzero_si512();
                    let mut i1 = _mm512_setzero_si512();
                    for c in 0..4 {
                        i0 = _mm512_dpbusd_epi32(i0, wv[c], bcast4_512(qx, xb, 4 * c));
                        i1 = _mm512_dpbusd_epi32(i1, wv[c + 4], bcast4_512(qx, xb, 16 + 4 * c));
                    }
                    let mut is = _mm512_add_epi32(i0, i1);
                    match K {
                        0 => is = _mm512_sub_epi32(is, _mm512_set1_epi32(8 * qx.isum[xb])),
                        2 => is = _mm512_sub_epi32(is, _mm512_set1_epi32(128 * qx.isum[xb])),
                        _ => {}
                    }
                    let sc = _mm512_mul_ps(wd, _mm512_set1_ps(qx.d[xb]));
                    a[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), sc, a[j]);
                    if K == 1 {
                        a[j] = _mm512_fmadd_ps(wm, _mm512_set1_ps(qx.sum[xb]), a[j]);
                    }
                }
            }
            for j in 0..T {
                _mm512_storeu_ps(acc[j].as_mut_ptr(), a[j]);
            }
        }
    }

    /// 16 rows × `acc.len()` (≤ [`avx2_tokens`]) tokens.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn panel_avx2(
        w: &Repacked,
        qx: &Q8Act,
        p: usize,
        t0: usize,
        acc: &mut [[f32; RP]],
    ) {
        debug_assert!(acc.len() <= avx2_tokens(w.ty));
        match (w.ty, acc.len()) {
            (_, 0) => {}
            (GgmlType::Q4_1, 6) => unsafe { avx2::<1, 6>(w, qx, p, t0, acc) },
            (GgmlType::Q4_1, 5) => unsafe { avx2::<1, 5>(w, qx, p, t0, acc) },
            (GgmlType::Q4_1, 4) => unsafe { avx2::<1, 4>(w, qx, p, t0, acc) },
            (GgmlType::Q4_1, 3) => unsafe { avx2::<1, 3>(w, qx, p, t0, acc) },
            (GgmlType::Q4_1, 2) => unsafe { avx2::<1, 2>(w, qx, p, t0, acc) },
            (GgmlType::Q4_1, _) => unsafe { avx2::<1, 1>(w, qx, p, t0, acc) },
            (GgmlType::Q8_0, 4) => unsafe { avx2::<2, 4>(w, qx, p, t0, acc) },
            (GgmlType::Q8_0, 3) => unsafe { avx2::<2, 3>(w, qx, p, t0, acc) },
            (GgmlType::Q8_0, 2) => unsafe { avx2::<2, 2>(w, qx, p, t0, acc) },
            (GgmlType::Q8_0, _) => unsafe { avx2::<2, 1>(w, qx, p, t0, acc) },
            (_, 6) => unsafe { avx2::<0, 6>(w, qx, p, t0, acc) },
            (_, 5) => unsafe { avx2::<0, 5>(w, qx, p, t0, acc) },
            (_, 4) => unsafe { avx2::<0, 4>(w, qx, p, t0, acc) },
            (_, 3) => unsafe { avx2::<0, 3>(w, qx, p, t0, acc) },
            (_, 2) => unsafe { avx2::<0, 2>(w, qx, p, t0, acc) },
            (_, _) => unsafe { avx2::<0, 1>(w, qx, p, t0, acc) },
        }
    }

    /// All 16 rows of the panel (two registers of 8 rows' i32 lanes) × `T` tokens, chunk by
    /// chunk: each 4-byte activation broadcast serves both halves, and each chunk of weights
    /// is unpacked once for the `T` tokens. `maddubs` (unsigned × signed bytes to i16 pairs)
    /// then one `madd` with ones gives each row's four products in its i32 lane.
    ///
    /// Q4: each i16 of a `maddubs` is at most 2 · 15 · 127 in magnitude, so a block's eight
    /// chunks add up in i16 (≤ 30 480) and one `madd` per (half, token, block) widens them.
    /// Q8_0: `maddubs(|w|, sign(x, w))` (|w| ≤ 128, so a pair ≤ 2 · 128 · 127 = 32 512, no
    /// saturation); two pairs could overflow i16, so each chunk is widened with its own `madd`.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn avx2<const K: u8, const T: usize>(
        w: &Repacked,
        qx: &Q8Act,
        p: usize,
        t0: usize,
        acc: &mut [[f32; RP]],
    ) {
        let (nb, qb, rec) = tile_dims(w, qx, p, t0, T, acc.len());
        // SAFETY: as in vnni.
        unsafe {
            let base = w.data.as_ptr().add(p * nb * rec);
            let m0f = _mm256_set1_epi8(0x0f);
            let bias = _mm256_set1_epi8(-128);
            let ones = _mm256_set1_epi16(1);
            let mut a = [[_mm256_setzero_ps(); 2]; T];
            for b in 0..nb {
                let r = base.add(b * rec);
                let ahead = r.wrapping_add(PREFETCH_RECORDS * rec);
                let mut l = 0;
                while l < rec {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(l).cast::<i8>());
                    l += 64;
                }
                // i16 sums (Q4) or i32 sums (Q8_0) per (token, half).
                let mut s = [[_mm256_setzero_si256(); 2]; T];
                if K == 2 {
                    for c in 0..8 {
                        let o = if c < 4 { 4 * c } else { 16 + 4 * (c - 4) };
                        let mut wv = [_mm256_setzero_si256(); 2];
                        let mut wa = [_mm256_setzero_si256(); 2];
                        for h in 0..2 {
                            wv[h] = _mm256_xor_si256(
                                _mm256_loadu_si256(r.add(c * 64 + 32 * h).cast()),
                                bias,
                            );
                            wa[h] = _mm256_sign_epi8(wv[h], wv[h]);
                        }
                        for j in 0..T {
                            let x = bcast4_256(qx, (t0 + j) * nb + b, o);
                            for h in 0..2 {
                                let p16 = _mm256_maddubs_epi16(wa[h], _mm256_sign_epi8(x, wv[h]));
                                s[j][h] = _mm256_add_epi32(s[j][h], _mm256_madd_epi16(p16, ones));
                            }
                        }
                    }
                } else {
                    for c in 0..4 {
                        let mut lo = [_mm256_setzero_si256(); 2];
                        let mut hi = [_mm256_setzero_si256(); 2];
                        for h in 0..2 {
                            let v = _mm256_loadu_si256(r.add(c * 64 + 32 * h).cast());
                            lo[h] = _mm256_and_si256(v, m0f);
                            hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f);
                        }
                        for j in 0..T {
                            let xb = (t0 + j) * nb + b;
                            let xl = bcast4_256(qx, xb, 4 * c);
                            let xh = bcast4_256(qx, xb, 16 + 4 * c);
                            for h in 0..2 {
                                let p16 = _mm256_add_epi16(
                                    _mm256_maddubs_epi16(lo[h], xl),
                                    _mm256_maddubs_epi16(hi[h], xh),
                                );
                                s[j][h] = _mm256_add_epi16(s[j][h], p16);
                            }
                        }
                    }
                }
                for h in 0..2 {
                    let wd = _mm256_cvtph_ps(_mm_loadu_si128(r.add(qb + 16 * h).cast()));
                    let wm = if K == 1 {
                        _mm256_cvtph_ps(_mm_loadu_si128(r.add(qb + 2 * RP + 16 * h).cast()))
                    } else {
                        _mm256_setzero_ps()
                    };
                    for j in 0..T {
                        let xb = (t0 + j) * nb + b;
                        let mut is = if K == 2 {
                            s[j][h]
                        } else {
                            _mm256_madd_epi16(s[j][h], ones)
                        };
                        if K == 0 {
                            is = _mm256_sub_epi32(is, _mm256_set1_epi32(8 * qx.isum[xb]));
                        }
                        let sc = _mm256_mul_ps(wd, _mm256_set1_ps(qx.d[xb]));
                        a[j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), sc, a[j][h]);
                        if K == 1 {
                            a[j][h] = _mm256_fmadd_ps(wm, _mm256_set1_ps(qx.sum[xb]), a[j][h]);
                        }
                    }
                }
            }
            for j in 0..T {
                for h in 0..2 {
                    _mm256_storeu_ps(acc[j].as_mut_ptr().add(8 * h), a[j][h]);
                }
            }
        }
    }
}
