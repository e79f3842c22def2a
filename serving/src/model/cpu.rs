//! CPU kernels: weight matrices (f32 or still quantised) and the batched matmul `Y = X·Wᵀ`.
//!
//! The matmul is matrix–matrix: each weight row is loaded (or dequantised) once per step and
//! multiplied with every token of the batch, so a batch of 32 costs little more weight traffic
//! than a batch of 1. Rows are split across rayon's threads. On x86-64 with AVX2+FMA the inner
//! loops are compiled a second time with those features enabled and picked at run time.
//!
//! Every (row, token) dot product is summed in the same order whatever the batch size or the
//! token's place in it, so batching never changes a result bit.

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
        }
    }

    pub fn type_name(&self) -> &'static str {
        match &self.data {
            MatData::F32(_) => "F32",
            MatData::Quant(t, _) => t.name(),
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
                        MatData::Quant(..) => panic!("concat_rows: mixed representations"),
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
        };
        Matrix { rows, cols, data }
    }
}

/// `y[n][w.rows] = x[n][w.cols] · wᵀ`.
///
/// # Panics
/// If the slices do not match the shapes (a broken invariant in the caller).
pub fn matmul(x: &[f32], n: usize, w: &Matrix, y: &mut [f32]) {
    assert_eq!(x.len(), n * w.cols, "matmul: x shape");
    assert_eq!(y.len(), n * w.rows, "matmul: y shape");
    if n == 0 {
        return;
    }
    let threads = rayon::current_num_threads().max(1);
    // Enough tasks to balance, rows per task a multiple of 4, at least 16.
    let per = (w.rows.div_ceil(threads * 4)).max(16).div_ceil(4) * 4;
    // Computed transposed ([row][token]) so each task owns a contiguous slice, then transposed.
    let mut yt = vec![0f32; n * w.rows];
    yt.par_chunks_mut(per * n).enumerate().for_each(|(i, out)| {
        let r0 = i * per;
        let r1 = (r0 + per).min(w.rows);
        rows_task(x, n, w, r0, r1, out);
    });
    for r in 0..w.rows {
        for t in 0..n {
            y[t * w.rows + r] = yt[r * n + t];
        }
    }
}

fn rows_task(x: &[f32], n: usize, w: &Matrix, r0: usize, r1: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: the features the function is compiled for were just detected.
            unsafe { rows_task_avx2(x, n, w, r0, r1, out) };
            return;
        }
    }
    rows_task_impl::<false>(x, n, w, r0, r1, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn rows_task_avx2(x: &[f32], n: usize, w: &Matrix, r0: usize, r1: usize, out: &mut [f32]) {
    rows_task_impl::<true>(x, n, w, r0, r1, out);
}

#[inline(always)]
fn rows_task_impl<const FMA: bool>(
    x: &[f32],
    n: usize,
    w: &Matrix,
    r0: usize,
    r1: usize,
    out: &mut [f32],
) {
    let cols = w.cols;
    match &w.data {
        MatData::F32(d) => {
            for r in r0..r1 {
                let row = &d[r * cols..(r + 1) * cols];
                dot_row_tokens::<FMA>(row, x, n, &mut out[(r - r0) * n..(r - r0 + 1) * n]);
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

/// Same result as [`dot_row_tokens`] for one token (used by attention).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let main = a.len() / 8 * 8;
    for (ca, cb) in a[..main].chunks_exact(8).zip(b[..main].chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += ca[l] * cb[l];
        }
    }
    let mut s = hsum(&acc);
    for i in main..a.len() {
        s += a[i] * b[i];
    }
    s
}
