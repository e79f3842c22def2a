//! CPU kernels: weight matrices (f32 or still quantised) and the batched matmul `Y = X·Wᵀ`.
//!
//! The matmul is matrix–matrix: each weight row is loaded (or dequantised) once per step and
//! multiplied with every token of the batch, so a batch of 32 costs little more weight traffic
//! than a batch of 1. Rows are split across rayon's threads. On x86-64 with AVX2+FMA the inner
//! loops are compiled a second time with those features enabled and picked at run time.
//!
//! With the default kernels (packed f32, integer quantised) every (row, token) dot product is
//! summed in the same order whatever the batch size or the token's place in it, so batching
//! never changes a result bit; `BROWNOUT_MATMUL=gemm` trades that for the `gemm` crate.
//!
//! The fallback route's quantised matrices multiply in integers: activations are quantised to 8
//! bits per block of 32 (one scale each) and each block's dot product is exact in i32 (AVX2
//! `maddubs`), then scaled — less memory traffic and fewer instructions than dequantising, and a
//! real (small) loss of precision, which is what the fallback route trades.

use rayon::prelude::*;

use super::gguf::GgmlType;
use super::quant::{self, QK};

/// A weight matrix of `rows` outputs × `cols` inputs, row-major.
#[derive(Debug, Clone)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    pub data: MatData,
}

#[derive(Debug, Clone)]
pub enum MatData {
    F32(Vec<f32>),
    /// Raw ggml blocks, `cols / 32` blocks per row.
    Quant(GgmlType, Vec<u8>),
    /// Quantised blocks split for the integer kernel (see [`Prepared`]).
    Prepared(Box<Prepared>),
    /// f32 packed for the [`Kernel::Packed`] micro-kernel: panels of [`PANEL`] rows (the last
    /// padded with zeros), each stored k-major: for every input column `k`, the panel's
    /// [`PANEL`] weights of that column side by side.
    Packed(WeightBuf),
}

/// Rows per packed panel: two AVX2 registers of f32.
pub const PANEL: usize = 16;

/// Q4_0/Q4_1/Q8_0 blocks with the f16 scales already converted: `qs` holds each block's packed
/// values (16 bytes of nibbles for Q4_x, 32 signed bytes for Q8_0), `d`/`m` one f32 each per
/// block (`m` empty unless Q4_1).
#[derive(Debug, Clone)]
pub struct Prepared {
    pub ty: GgmlType,
    pub qs: Vec<u8>,
    pub d: Vec<f32>,
    pub m: Vec<f32>,
}

impl Prepared {
    fn from_raw(ty: GgmlType, raw: &[u8]) -> Prepared {
        let bb = ty.block_bytes();
        let nb = raw.len() / bb;
        let qlen = if ty == GgmlType::Q8_0 { QK } else { QK / 2 };
        let mut p = Prepared {
            ty,
            qs: Vec::with_capacity(nb * qlen),
            d: Vec::with_capacity(nb),
            m: Vec::new(),
        };
        for b in raw.chunks_exact(bb) {
            p.d.push(f16_le(b, 0));
            match ty {
                GgmlType::Q4_1 => {
                    p.m.push(f16_le(b, 2));
                    p.qs.extend_from_slice(&b[4..20]);
                }
                _ => p.qs.extend_from_slice(&b[2..2 + qlen]),
            }
        }
        p
    }

    fn qlen(&self) -> usize {
        if self.ty == GgmlType::Q8_0 {
            QK
        } else {
            QK / 2
        }
    }

    /// Block `b` as 32 floats.
    fn dequant_block(&self, b: usize, out: &mut [f32]) {
        let ql = self.qlen();
        let q = &self.qs[b * ql..(b + 1) * ql];
        let d = self.d[b];
        match self.ty {
            GgmlType::Q4_1 => {
                let m = self.m[b];
                for j in 0..16 {
                    out[j] = f32::from(q[j] & 0x0f) * d + m;
                    out[j + 16] = f32::from(q[j] >> 4) * d + m;
                }
            }
            GgmlType::Q4_0 => {
                for j in 0..16 {
                    out[j] = (f32::from(q[j] & 0x0f) - 8.0) * d;
                    out[j + 16] = (f32::from(q[j] >> 4) - 8.0) * d;
                }
            }
            _ => {
                for j in 0..QK {
                    out[j] = f32::from(q[j] as i8) * d;
                }
            }
        }
    }
}

impl Matrix {
    pub fn f32(rows: usize, cols: usize, data: Vec<f32>) -> Matrix {
        assert_eq!(data.len(), rows * cols, "Matrix::f32: wrong size");
        Matrix {
            rows,
            cols,
            data: MatData::F32(data),
        }
    }

    /// Bytes of weight memory held.
    pub fn bytes(&self) -> usize {
        match &self.data {
            MatData::F32(v) => v.len() * 4,
            MatData::Quant(_, v) => v.len(),
            MatData::Prepared(p) => p.qs.len() + (p.d.len() + p.m.len()) * 4,
            MatData::Packed(v) => v.len() * 4,
        }
    }

    pub fn type_name(&self) -> &'static str {
        match &self.data {
            MatData::F32(_) | MatData::Packed(_) => "F32",
            MatData::Quant(t, _) => t.name(),
            MatData::Prepared(p) => p.ty.name(),
        }
    }

    /// Row `r` as f32 into `out` (`cols` long).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        match &self.data {
            MatData::F32(v) => out.copy_from_slice(&v[r * self.cols..(r + 1) * self.cols]),
            MatData::Quant(t, v) => {
                let rb = self.cols / QK * t.block_bytes();
                quant::dequantize(*t, &v[r * rb..(r + 1) * rb], out);
            }
            MatData::Prepared(p) => {
                let bpr = self.cols / QK;
                for (i, o) in out.chunks_exact_mut(QK).enumerate() {
                    p.dequant_block(r * bpr + i, o);
                }
            }
            MatData::Packed(v) => {
                let panel = &v[r / PANEL * PANEL * self.cols..];
                for (k, o) in out.iter_mut().enumerate() {
                    *o = panel[k * PANEL + r % PANEL];
                }
            }
        }
    }

    /// f32 matrices packed for [`Kernel::Packed`]; others unchanged.
    pub fn packed(self) -> Matrix {
        let MatData::F32(v) = &self.data else {
            return self;
        };
        let (rows, cols) = (self.rows, self.cols);
        let panels = rows.div_ceil(PANEL);
        let mut p = WeightBuf::zeroed(panels * PANEL * cols);
        for r in 0..rows {
            let base = r / PANEL * PANEL * cols + r % PANEL;
            for (k, &w) in v[r * cols..(r + 1) * cols].iter().enumerate() {
                p[base + k * PANEL] = w;
            }
        }
        Matrix {
            rows,
            cols,
            data: MatData::Packed(p),
        }
    }

    /// The weights row-major (`rows × cols`), borrowed when they are stored that way.
    ///
    /// # Panics
    /// For quantised matrices.
    pub fn row_major_f32(&self) -> std::borrow::Cow<'_, [f32]> {
        match &self.data {
            MatData::F32(v) => std::borrow::Cow::Borrowed(v),
            MatData::Packed(_) => {
                let mut out = vec![0f32; self.rows * self.cols];
                for (r, row) in out.chunks_exact_mut(self.cols).enumerate() {
                    self.row_f32(r, row);
                }
                std::borrow::Cow::Owned(out)
            }
            _ => panic!("row_major_f32: {} matrix", self.type_name()),
        }
    }

    /// Quantised matrices converted for the integer kernel; others unchanged.
    pub fn prepared(self) -> Matrix {
        match self.data {
            MatData::Quant(ty, raw) => Matrix {
                rows: self.rows,
                cols: self.cols,
                data: MatData::Prepared(Box::new(Prepared::from_raw(ty, &raw))),
            },
            data => Matrix { data, ..self },
        }
    }

    /// Stacks matrices with the same `cols` and representation (e.g. Q, K, V into one).
    pub fn concat_rows(parts: Vec<Matrix>) -> Matrix {
        let cols = parts[0].cols;
        let rows = parts.iter().map(|p| p.rows).sum();
        let data = match &parts[0].data {
            MatData::F32(_) => {
                let mut v = Vec::with_capacity(rows * cols);
                for p in &parts {
                    assert_eq!(p.cols, cols, "concat_rows: cols differ");
                    match &p.data {
                        MatData::F32(d) => v.extend_from_slice(d),
                        _ => panic!("concat_rows: mixed representations"),
                    }
                }
                MatData::F32(v)
            }
            MatData::Quant(t, _) => {
                let mut v = Vec::new();
                for p in &parts {
                    assert_eq!(p.cols, cols, "concat_rows: cols differ");
                    match &p.data {
                        MatData::Quant(t2, d) if t2 == t => v.extend_from_slice(d),
                        _ => panic!("concat_rows: mixed representations"),
                    }
                }
                MatData::Quant(*t, v)
            }
            MatData::Prepared(_) | MatData::Packed(_) => {
                panic!("concat_rows: concatenate before preparing or packing")
            }
        };
        Matrix { rows, cols, data }
    }
}

/// Zeroed floats for weights that are streamed whole every step, in their own anonymous
/// mapping that starts on a 2 MiB boundary and is untouched until written, which the kernel
/// is asked (Linux `madvise(MADV_HUGEPAGE)`) to back with transparent huge pages: one TLB
/// entry then covers 512 × more of the stream, and the page walks that stalled the weight
/// loads go away (docs/BENCHMARKS.md). A heap `Vec` could not do this: its start is not
/// aligned and its pages may already be touched. Where huge pages are off this is an ordinary
/// mapping.
pub struct WeightBuf {
    ptr: std::ptr::NonNull<f32>,
    len: usize,
    /// Bytes mapped at `ptr` (len × 4 rounded up to a page, at least one page).
    bytes: usize,
}

// SAFETY: WeightBuf owns its mapping exclusively, like a Vec<f32>.
unsafe impl Send for WeightBuf {}
// SAFETY: as above; shared access is read-only.
unsafe impl Sync for WeightBuf {}

impl WeightBuf {
    /// `len` zeros.
    ///
    /// # Panics
    /// If the system cannot map the memory (as a `Vec` would abort).
    pub fn zeroed(len: usize) -> WeightBuf {
        const PAGE: usize = 4096;
        const HUGE: usize = 2 << 20;
        let bytes = (len * std::mem::size_of::<f32>())
            .max(1)
            .next_multiple_of(PAGE);
        let map_len = bytes + HUGE;
        // SAFETY: a fresh private anonymous mapping; only its own parts are unmapped below.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert!(
                p != libc::MAP_FAILED,
                "cannot map {map_len} bytes for weights: {}",
                std::io::Error::last_os_error()
            );
            let base = p as usize;
            let start = base.next_multiple_of(HUGE);
            if start > base {
                libc::munmap(p, start - base);
            }
            let end = start + bytes;
            if base + map_len > end {
                libc::munmap(end as *mut libc::c_void, base + map_len - end);
            }
            #[cfg(target_os = "linux")]
            libc::madvise(start as *mut libc::c_void, bytes, libc::MADV_HUGEPAGE);
            WeightBuf {
                ptr: std::ptr::NonNull::new(start as *mut f32).expect("mmap gave a null address"),
                len,
                bytes,
            }
        }
    }
}

impl Drop for WeightBuf {
    fn drop(&mut self) {
        // SAFETY: exactly the range `zeroed` kept mapped; nothing borrows it any more.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast::<libc::c_void>(), self.bytes);
        }
    }
}

impl std::ops::Deref for WeightBuf {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: the mapping is page-aligned, holds at least len f32s, and lives as long as
        // self; zeroed bytes are valid f32s.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for WeightBuf {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in deref, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for WeightBuf {
    fn clone(&self) -> WeightBuf {
        let mut c = WeightBuf::zeroed(self.len);
        c.copy_from_slice(self);
        c
    }
}

impl std::fmt::Debug for WeightBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WeightBuf({} floats)", self.len)
    }
}

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

/// The instruction set the packed kernel runs on ([`Isa::detect`]: once per process).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Isa {
    Avx512,
    Avx2,
    Scalar,
}

impl Isa {
    /// The best this CPU has; `BROWNOUT_ISA=avx2|scalar` caps it (to measure, and to test the
    /// other paths on an AVX-512 machine).
    pub fn detect() -> Isa {
        static I: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *I.get_or_init(|| {
            let best = Isa::best();
            match std::env::var("BROWNOUT_ISA").as_deref() {
                Ok("scalar") => Isa::Scalar,
                Ok("avx2") if best != Isa::Scalar => Isa::Avx2,
                _ => best,
            }
        })
    }

    /// Every instruction set this CPU can run the kernel on, best first.
    pub fn available() -> Vec<Isa> {
        match Isa::best() {
            Isa::Avx512 => vec![Isa::Avx512, Isa::Avx2, Isa::Scalar],
            Isa::Avx2 => vec![Isa::Avx2, Isa::Scalar],
            Isa::Scalar => vec![Isa::Scalar],
        }
    }

    fn best() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if has_avx2_fma() {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }
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

/// A pointer handed to the tasks of [`gemm_rows_parallel`], each writing its own columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: the tasks write disjoint column ranges of the same output (see gemm_rows_parallel).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

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
fn gemm_rows_parallel(
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
fn rows_per_task(rows: usize, threads: usize) -> usize {
    (rows.div_ceil(threads * 4)).max(16).div_ceil(8) * 8
}

/// `y[t][r] = yt[r][t]`.
fn transpose_into(yt: &[f32], n: usize, rows: usize, y: &mut [f32]) {
    for r in 0..rows {
        for t in 0..n {
            y[t * rows + r] = yt[r * n + t];
        }
    }
}

/// How the quantised (integer) kernel runs: one (row, token) at a time, or in tiles of rows ×
/// tokens with `maddubs`+`madd` (AVX2) or `vpdpbusd` (AVX-512 VNNI). All give the same bits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum QuantPath {
    /// Per (row, token): AVX2 `dot_row`, or the scalar loop without AVX2.
    RowWise,
    Tiles,
    TilesVnni,
}

impl QuantPath {
    /// The fastest this CPU has; `BROWNOUT_ISA=avx2` leaves out VNNI, `scalar` the tiles.
    pub fn detect() -> QuantPath {
        static Q: std::sync::OnceLock<QuantPath> = std::sync::OnceLock::new();
        *Q.get_or_init(|| {
            let mut best = QuantPath::available()[0];
            match std::env::var("BROWNOUT_ISA").as_deref() {
                Ok("scalar") => best = QuantPath::RowWise,
                Ok("avx2") if best == QuantPath::TilesVnni => best = QuantPath::Tiles,
                _ => {}
            }
            best
        })
    }

    /// Every path this CPU can run, fastest first.
    pub fn available() -> Vec<QuantPath> {
        match (has_avx2_fma(), has_avx512_vnni()) {
            (true, true) => vec![QuantPath::TilesVnni, QuantPath::Tiles, QuantPath::RowWise],
            (true, false) => vec![QuantPath::Tiles, QuantPath::RowWise],
            _ => vec![QuantPath::RowWise],
        }
    }
}

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

fn has_avx512_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512vnni")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn rows_task(
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
const TOKEN_BLOCK: usize = 48;

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

/// Activations quantised to 8 bits per block of 32 (scale, float sum, values).
pub struct Q8Act {
    n: usize,
    blocks_per_row: usize,
    d: Vec<f32>,
    sum: Vec<f32>,
    q: Vec<i8>,
}

impl Q8Act {
    pub fn quantize(x: &[f32], n: usize, cols: usize) -> Q8Act {
        let bpr = cols / QK;
        let nb = n * bpr;
        let mut a = Q8Act {
            n,
            blocks_per_row: bpr,
            d: vec![0.0; nb],
            sum: vec![0.0; nb],
            q: vec![0; nb * QK],
        };
        for (b, blk) in x.chunks_exact(QK).enumerate() {
            let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            for (q, &v) in a.q[b * QK..(b + 1) * QK].iter_mut().zip(blk) {
                *q = (v * id).round().clamp(-127.0, 127.0) as i8;
            }
            a.d[b] = d;
            a.sum[b] = blk.iter().sum();
        }
        a
    }
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

    use super::GgmlType;

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
        p: &super::Prepared,
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
        p: &super::Prepared,
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
        p: &super::Prepared,
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
        p: &super::Prepared,
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
            let low = _mm_set1_epi8(0x0f);
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
                            let lo = _mm_and_si128(raw, low);
                            let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
                            let v = _mm256_set_m128i(hi, lo);
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
                    let a = acc[i][j];
                    let lo = _mm256_castps256_ps128(a);
                    let hi = _mm256_extractf128_ps(a, 1);
                    let s = _mm_add_ps(lo, hi);
                    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0b01));
                    let mut v = _mm_cvtss_f32(s);
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
            let low = _mm_set1_epi8(0x0f);
            let eight = _mm256_set1_epi8(8);
            let mut acc = _mm256_setzero_ps();
            for b in 0..nb {
                let xv = _mm256_loadu_si256(x.as_ptr().add(b * 32).cast());
                let p16 = match ty {
                    GgmlType::Q4_1 => {
                        let raw = _mm_loadu_si128(qs.as_ptr().add(b * 16).cast());
                        let lo = _mm_and_si128(raw, low);
                        let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
                        _mm256_maddubs_epi16(_mm256_set_m128i(hi, lo), xv)
                    }
                    _ => {
                        let wv = if ty == GgmlType::Q8_0 {
                            _mm256_loadu_si256(qs.as_ptr().add(b * 32).cast())
                        } else {
                            let raw = _mm_loadu_si128(qs.as_ptr().add(b * 16).cast());
                            let lo = _mm_and_si128(raw, low);
                            let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
                            _mm256_sub_epi8(_mm256_set_m128i(hi, lo), eight)
                        };
                        // maddubs wants unsigned × signed: |w| × (x with w's sign).
                        _mm256_maddubs_epi16(_mm256_sign_epi8(wv, wv), _mm256_sign_epi8(xv, wv))
                    }
                };
                let p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));
                acc = _mm256_fmadd_ps(p, _mm256_set1_ps(wd[b] * xd[b]), acc);
            }
            let lo = _mm256_castps256_ps128(acc);
            let hi = _mm256_extractf128_ps(acc, 1);
            let s = _mm_add_ps(lo, hi);
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0b01));
            _mm_cvtss_f32(s)
        }
    }
}

#[inline(always)]
fn f16_le(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

#[inline(always)]
fn fmadd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

#[inline(always)]
fn hsum(acc: &[f32; 8]) -> f32 {
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
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
