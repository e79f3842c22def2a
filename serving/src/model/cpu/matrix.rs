//! Weight matrices: f32 row-major, raw ggml blocks, blocks prepared for the integer kernel,
//! or f32 packed into panels for the packed kernel.

use super::repacked::Repacked;
use super::weight_buf::WeightBuf;
use crate::model::gguf::GgmlType;
use crate::model::quant::{self, QK};

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
    /// Quantised blocks split for the older integer kernel (see [`Prepared`]).
    Prepared(Box<Prepared>),
    /// Quantised blocks repacked at load for the default integer kernel (see [`Repacked`]).
    Repacked(Box<Repacked>),
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
    pub(super) fn from_raw(ty: GgmlType, raw: &[u8]) -> Prepared {
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

    pub(super) fn qlen(&self) -> usize {
        if self.ty == GgmlType::Q8_0 {
            QK
        } else {
            QK / 2
        }
    }

    /// Block `b` as 32 floats.
    pub(super) fn dequant_block(&self, b: usize, out: &mut [f32]) {
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
            MatData::Repacked(p) => p.bytes(),
        }
    }

    pub fn type_name(&self) -> &'static str {
        match &self.data {
            MatData::F32(_) | MatData::Packed(_) => "F32",
            MatData::Quant(t, _) => t.name(),
            MatData::Prepared(p) => p.ty.name(),
            MatData::Repacked(p) => p.ty.name(),
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
            MatData::Repacked(p) => p.row_f32(r, out),
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

    /// Quantised matrices repacked for the default integer kernel ([`Repacked`]); others
    /// unchanged.
    pub fn repacked(self) -> Matrix {
        match self.data {
            MatData::Quant(ty, raw) => Matrix {
                rows: self.rows,
                cols: self.cols,
                data: MatData::Repacked(Box::new(Repacked::from_raw(
                    ty, self.rows, self.cols, &raw,
                ))),
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
            MatData::Prepared(_) | MatData::Packed(_) | MatData::Repacked(_) => {
                panic!("concat_rows: concatenate before preparing or packing")
            }
        };
        Matrix { rows, cols, data }
    }
}

#[inline(always)]
pub(super) fn f16_le(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}
