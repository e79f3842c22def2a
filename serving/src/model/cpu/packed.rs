//! The packed f32 kernel (the primary route's default): weights packed once at load into
//! 16-row panels, k-major ([`super::Matrix::packed`]); tokens packed per call into groups of 8;
//! a 16-row × up-to-8-token outer-product micro-kernel (AVX-512; 16 × 4 on AVX2; scalar), each
//! (row, token) summed in `k` order by one fused multiply-add chain.

use rayon::prelude::*;

use super::isa::Isa;
use super::matrix::PANEL;
use super::simd::OutPtr;
use super::tiled::TOKEN_BLOCK;

/// `y[n][rows] = x[n][cols] · wᵀ` for a [`MatData::Packed`] matrix: the tokens are packed once
/// ([`pack_tokens`]), then panels are split over rayon tasks, tokens in blocks of
/// [`TOKEN_BLOCK`] (kept in cache while the task's panels stream by).
///
/// # Panics
/// If the slices do not match the shapes.
pub fn packed_matmul(
    p: &[f32],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    threads: usize,
) {
    packed_matmul_on(Isa::detect(), p, rows, cols, x, n, y, threads);
}

/// [`packed_matmul`] on a chosen instruction set (one of [`Isa::available`]).
///
/// # Panics
/// If the slices do not match the shapes, or `isa` is not available.
#[allow(clippy::too_many_arguments)]
pub fn packed_matmul_on(
    isa: Isa,
    p: &[f32],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    threads: usize,
) {
    let panels = rows.div_ceil(PANEL);
    assert_eq!(p.len(), panels * PANEL * cols, "packed_matmul: w shape");
    assert_eq!(x.len(), n * cols, "packed_matmul: x shape");
    assert_eq!(y.len(), n * rows, "packed_matmul: y shape");
    // The detected ISA needs no check (and this is the hot path); another one must exist here.
    assert!(
        isa == Isa::detect() || Isa::available().contains(&isa),
        "packed_matmul: {isa:?} is not available on this CPU"
    );
    let (xp, stride) = pack_tokens(x, n, cols);
    // Up to eight tasks per thread, at least four panels each, a multiple of the thread
    // count, panels spread evenly: a slow or preempted core leaves little of the step to wait
    // for, and no thread gets a task more than another.
    let threads = threads.max(1);
    let tasks = ((panels / 4).min(threads * 8) / threads * threads).max(1);
    let out = OutPtr(y.as_mut_ptr());
    let xp = &xp[..];
    (0..tasks).into_par_iter().for_each(|i| {
        // Capture the whole `OutPtr` (Send), not its raw-pointer field (edition 2021 closures
        // capture fields).
        #[allow(clippy::redundant_locals)]
        let out = out;
        let mut accs = [[0f32; PANEL]; TOKEN_BLOCK];
        let (p0, p1) = (i * panels / tasks, (i + 1) * panels / tasks);
        let mut tb = 0;
        while tb < n {
            let te = (tb + TOKEN_BLOCK).min(n);
            for pi in p0..p1 {
                let panel = &p[pi * PANEL * cols..(pi + 1) * PANEL * cols];
                let r0 = pi * PANEL;
                let valid = (rows - r0).min(PANEL);
                let tokens = Tokens {
                    xp,
                    stride,
                    cols,
                    t0: tb,
                    t1: te,
                };
                // SAFETY: this task alone writes columns r0..r0+valid of y (its own panels).
                unsafe { panel_tokens(isa, panel, &tokens, &mut accs, out, rows, r0, valid) };
            }
            tb = te;
        }
    });
}

/// Tokens per group of the packed input (one AVX-512 micro-kernel call).
const GROUP: usize = 8;

/// `x` (`n × cols`, row-major) regrouped for the micro-kernels: groups of [`GROUP`] tokens
/// (one group of `n` when `n < GROUP`), each stored k-major — for every input column `k`, the
/// group's values side by side — so the kernel broadcasts from one cache line per `k`. The
/// last group is padded with zeros. Returns the packed values and the group width.
pub fn pack_tokens(x: &[f32], n: usize, cols: usize) -> (Vec<f32>, usize) {
    let stride = n.clamp(1, GROUP);
    let groups = n.div_ceil(stride);
    let mut xp = vec![0f32; groups * stride * cols];
    for (g, dst) in xp.chunks_exact_mut(stride * cols).enumerate() {
        let tokens = &x[g * stride * cols..(g * stride + stride.min(n - g * stride)) * cols];
        for (k, col) in dst.chunks_exact_mut(stride).enumerate() {
            for (v, &xv) in col.iter_mut().zip(tokens[k..].iter().step_by(cols)) {
                *v = xv;
            }
        }
    }
    (xp, stride)
}

/// Tokens `t0..t1` of a [`pack_tokens`] result.
struct Tokens<'a> {
    xp: &'a [f32],
    stride: usize,
    cols: usize,
    t0: usize,
    t1: usize,
}

/// One panel against `tokens` (at most [`TOKEN_BLOCK`]), a group at a time, in chunks of [`KC`]
/// input columns so that a chunk of the panel and of the tokens stays in L1. Partial sums are
/// carried across chunks and each lane adds its products in `k` order with one fused
/// multiply-add each, so the result depends neither on the chunking, nor on the batch, nor on
/// the instruction set.
///
/// # Safety
/// `out` must point at an `n × rows` output of which the caller owns columns
/// `r0..r0 + valid` for tokens `t0..t1`.
#[allow(clippy::too_many_arguments)]
unsafe fn panel_tokens(
    isa: Isa,
    panel: &[f32],
    tk: &Tokens<'_>,
    accs: &mut [[f32; PANEL]; TOKEN_BLOCK],
    out: OutPtr,
    rows: usize,
    r0: usize,
    valid: usize,
) {
    let (cols, stride) = (tk.cols, tk.stride);
    assert!(
        tk.t1 - tk.t0 <= TOKEN_BLOCK && tk.t0.is_multiple_of(stride),
        "panel_tokens: a block of at most TOKEN_BLOCK tokens starting a group"
    );
    assert!(panel.len() >= cols * PANEL && tk.xp.len() >= tk.t1.div_ceil(stride) * stride * cols);
    accs[..tk.t1 - tk.t0].fill([0.0; PANEL]);
    let mut k0 = 0;
    while k0 < cols {
        let k1 = (k0 + KC).min(cols);
        let mut t = tk.t0;
        while t < tk.t1 {
            let nt = (tk.t1 - t).min(stride);
            let group = &tk.xp[t / stride * stride * cols..(t / stride + 1) * stride * cols];
            let acc = &mut accs[t - tk.t0..t - tk.t0 + nt];
            let ch = Chunk {
                panel,
                group,
                stride,
                k0,
                k1,
                prefetch: match (t == tk.t0, tk.t1 - tk.t0 > stride) {
                    (false, _) => Prefetch::None,
                    (true, false) => Prefetch::Near,
                    (true, true) => Prefetch::NextChunk,
                },
            };
            match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: AVX-512F was detected ([`Isa::detect`]).
                Isa::Avx512 => unsafe {
                    match nt {
                        8 => panel_avx512::<8>(&ch, acc),
                        7 => panel_avx512::<7>(&ch, acc),
                        6 => panel_avx512::<6>(&ch, acc),
                        5 => panel_avx512::<5>(&ch, acc),
                        4 => panel_avx512::<4>(&ch, acc),
                        3 => panel_avx512::<3>(&ch, acc),
                        2 => panel_avx512::<2>(&ch, acc),
                        _ => panel_avx512::<1>(&ch, acc),
                    }
                },
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => {
                    // Four tokens (eight accumulators) at a time: all 16 registers in use.
                    for (q, acc) in acc.chunks_mut(4).enumerate() {
                        let j0 = q * 4;
                        // SAFETY: AVX2+FMA were detected ([`Isa::detect`]).
                        unsafe {
                            match acc.len() {
                                4 => panel_avx2::<4>(&ch, j0, acc),
                                3 => panel_avx2::<3>(&ch, j0, acc),
                                2 => panel_avx2::<2>(&ch, j0, acc),
                                _ => panel_avx2::<1>(&ch, j0, acc),
                            }
                        }
                    }
                }
                _ => panel_scalar(&ch, acc),
            }
            t += nt;
        }
        k0 = k1;
    }
    for (j, a) in accs.iter().enumerate().take(tk.t1 - tk.t0) {
        // SAFETY: row t0 + j of the output, columns r0..r0+valid: in bounds, owned by us.
        unsafe {
            let dst = out.0.add((tk.t0 + j) * rows + r0);
            if valid == PANEL {
                // A constant length: one vector store rather than a call.
                std::ptr::copy_nonoverlapping(a.as_ptr(), dst, PANEL);
            } else {
                std::ptr::copy_nonoverlapping(a.as_ptr(), dst, valid);
            }
        }
    }
}

/// Input columns per chunk of the packed kernel: 256 × 16 weights (16 KiB) plus a group's
/// 8 KiB of tokens fit in a 32 KiB L1.
const KC: usize = 256;

/// Columns `k0..k1` of one panel against one packed group of tokens.
struct Chunk<'a> {
    panel: &'a [f32],
    /// `stride` values per column `k`.
    group: &'a [f32],
    stride: usize,
    k0: usize,
    k1: usize,
    /// Whether and how far ahead this pass asks for the panel's lines (only the first group
    /// of a chunk does: it reads the panel from memory, the other groups find it in L1).
    prefetch: Prefetch,
}

/// How the weights are prefetched, one 64-byte line (one input column of a panel) per column
/// processed. The panels are contiguous, so this runs on into the next chunk and panel.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Prefetch {
    None,
    /// One group of tokens (batch ≤ 8): the panel is used once, so stream it into L1
    /// [`PREFETCH_NEAR`] columns ahead.
    Near,
    /// Several groups reuse each chunk from L1: ask for the next chunk ([`KC`] columns ahead)
    /// into L2 only, so it is there when needed without evicting the chunk in use. Measured:
    /// 64–72 ms per batch-32 SmolLM2 step against 68–83 ms with [`Prefetch::Near`]
    /// (docs/BENCHMARKS.md).
    NextChunk,
}

impl Prefetch {
    fn distance(self) -> usize {
        match self {
            Prefetch::Near => PREFETCH_NEAR,
            Prefetch::NextChunk => KC,
            Prefetch::None => 0,
        }
    }
}

/// Columns ahead for [`Prefetch::Near`]: a memory latency at a few cycles per column.
const PREFETCH_NEAR: usize = 64;

/// A prefetch hint for the cache line at `p` (which may lie past the end of the weights: a
/// prefetch never faults): into L1 for [`Prefetch::Near`], L2 for [`Prefetch::NextChunk`].
#[inline(always)]
fn prefetch_line(p: *const f32, how: Prefetch) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a hint only; no memory is accessed architecturally.
    unsafe {
        use std::arch::x86_64::{_MM_HINT_T0, _MM_HINT_T1, _mm_prefetch};
        match how {
            Prefetch::Near => _mm_prefetch::<_MM_HINT_T0>(p.cast::<i8>()),
            Prefetch::NextChunk => _mm_prefetch::<_MM_HINT_T1>(p.cast::<i8>()),
            Prefetch::None => {}
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, how);
}

/// Same arithmetic as the SIMD kernels (one fused multiply-add per (row, token, k), in `k`
/// order, continuing the sums in `acc`), for machines without AVX2+FMA.
fn panel_scalar(ch: &Chunk<'_>, acc: &mut [[f32; PANEL]]) {
    for (j, a) in acc.iter_mut().enumerate() {
        for k in ch.k0..ch.k1 {
            let xv = ch.group[k * ch.stride + j];
            let w = &ch.panel[k * PANEL..(k + 1) * PANEL];
            for l in 0..PANEL {
                a[l] = w[l].mul_add(xv, a[l]);
            }
        }
    }
}

/// 16 rows (one register) × `NT` tokens, the token values broadcast from memory.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::needless_range_loop)]
unsafe fn panel_avx512<const NT: usize>(ch: &Chunk<'_>, acc: &mut [[f32; PANEL]]) {
    use std::arch::x86_64::{_mm512_fmadd_ps, _mm512_loadu_ps, _mm512_set1_ps, _mm512_storeu_ps};
    assert!(
        acc.len() == NT
            && NT <= ch.stride
            && ch.k1 <= ch.panel.len() / PANEL
            && ch.k1 * ch.stride <= ch.group.len()
    );
    // SAFETY (all): acc[j] holds 16 floats; panel[k * 16..+16] and group[k * stride + j] for
    // k < k1, j < NT <= stride are in bounds (asserted above).
    let mut a: [_; NT] = std::array::from_fn(|j| unsafe { _mm512_loadu_ps(acc[j].as_ptr()) });
    let (wp, xp) = (ch.panel.as_ptr(), ch.group.as_ptr());
    for k in ch.k0..ch.k1 {
        if ch.prefetch != Prefetch::None {
            prefetch_line(
                wp.wrapping_add((k + ch.prefetch.distance()) * PANEL),
                ch.prefetch,
            );
        }
        let w = unsafe { _mm512_loadu_ps(wp.add(k * PANEL)) };
        let xk = unsafe { xp.add(k * ch.stride) };
        for j in 0..NT {
            a[j] = _mm512_fmadd_ps(w, _mm512_set1_ps(unsafe { *xk.add(j) }), a[j]);
        }
    }
    for j in 0..NT {
        unsafe { _mm512_storeu_ps(acc[j].as_mut_ptr(), a[j]) };
    }
}

/// 16 rows (two registers) × `NT` tokens starting at token `j0` of the group.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)]
unsafe fn panel_avx2<const NT: usize>(ch: &Chunk<'_>, j0: usize, acc: &mut [[f32; PANEL]]) {
    use std::arch::x86_64::{
        _mm256_broadcast_ss, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_storeu_ps,
    };
    assert!(
        acc.len() == NT
            && j0 + NT <= ch.stride
            && ch.k1 <= ch.panel.len() / PANEL
            && ch.k1 * ch.stride <= ch.group.len()
    );
    // SAFETY (all): as in panel_avx512.
    let mut a0: [_; NT] = std::array::from_fn(|j| unsafe { _mm256_loadu_ps(acc[j].as_ptr()) });
    let mut a1: [_; NT] =
        std::array::from_fn(|j| unsafe { _mm256_loadu_ps(acc[j].as_ptr().add(8)) });
    let (wp, xp) = (ch.panel.as_ptr(), ch.group.as_ptr());
    for k in ch.k0..ch.k1 {
        if ch.prefetch != Prefetch::None && j0 == 0 {
            prefetch_line(
                wp.wrapping_add((k + ch.prefetch.distance()) * PANEL),
                ch.prefetch,
            );
        }
        let (w0, w1) = unsafe {
            (
                _mm256_loadu_ps(wp.add(k * PANEL)),
                _mm256_loadu_ps(wp.add(k * PANEL + 8)),
            )
        };
        let xk = unsafe { xp.add(k * ch.stride + j0) };
        for j in 0..NT {
            let xb = unsafe { _mm256_broadcast_ss(&*xk.add(j)) };
            a0[j] = _mm256_fmadd_ps(w0, xb, a0[j]);
            a1[j] = _mm256_fmadd_ps(w1, xb, a1[j]);
        }
    }
    for j in 0..NT {
        unsafe {
            _mm256_storeu_ps(acc[j].as_mut_ptr(), a0[j]);
            _mm256_storeu_ps(acc[j].as_mut_ptr().add(8), a1[j]);
        }
    }
}
