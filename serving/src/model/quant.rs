//! ggml block formats: dequantisation (to f32) and quantisation (to build test models).
//!
//! ```text
//!  Q4_0: f16 d,          16 B nibbles   x = d·(q − 8)       (18 B / 32 values)
//!  Q4_1: f16 d, f16 m,   16 B nibbles   x = d·q + m         (20 B / 32 values)
//!  Q8_0: f16 d,          32 × i8        x = d·q             (34 B / 32 values)
//!  nibbles: byte j holds value j (low 4 bits) and value j+16 (high 4 bits)
//! ```

use half::f16;

use super::gguf::GgmlType;

pub const QK: usize = 32;

#[inline(always)]
fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantises one Q4_1 block (20 bytes) into 32 floats.
#[inline(always)]
pub fn dequant_q4_1_block(b: &[u8], out: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    for j in 0..16 {
        out[j] = f32::from(qs[j] & 0x0f) * d + m;
        out[j + 16] = f32::from(qs[j] >> 4) * d + m;
    }
}

/// Dequantises one Q4_0 block (18 bytes) into 32 floats.
#[inline(always)]
pub fn dequant_q4_0_block(b: &[u8], out: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        out[j] = (f32::from(qs[j] & 0x0f) - 8.0) * d;
        out[j + 16] = (f32::from(qs[j] >> 4) - 8.0) * d;
    }
}

/// Dequantises one Q8_0 block (34 bytes) into 32 floats.
#[inline(always)]
pub fn dequant_q8_0_block(b: &[u8], out: &mut [f32; QK]) {
    let d = f16_at(b, 0);
    for j in 0..QK {
        out[j] = f32::from(b[2 + j] as i8) * d;
    }
}

/// Dequantises `data` (a whole number of blocks/elements of `ty`) into `out`.
///
/// # Panics
/// If `data` and `out` disagree in size (a broken invariant: callers size both from the tensor).
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) {
    let bb = ty.block_bytes();
    let be = ty.block_elems();
    assert_eq!(
        data.len() / bb * be,
        out.len(),
        "dequantize: {} bytes of {} do not hold {} values",
        data.len(),
        ty.name(),
        out.len()
    );
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(data.chunks_exact(2)) {
                *o = f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => {
            let mut tmp = [0f32; QK];
            for (o, b) in out.chunks_exact_mut(QK).zip(data.chunks_exact(bb)) {
                match ty {
                    GgmlType::Q4_0 => dequant_q4_0_block(b, &mut tmp),
                    GgmlType::Q4_1 => dequant_q4_1_block(b, &mut tmp),
                    _ => dequant_q8_0_block(b, &mut tmp),
                }
                o.copy_from_slice(&tmp);
            }
        }
    }
}

/// Quantises `x` (a multiple of 32 values for block types) into `ty`'s encoding.
///
/// # Panics
/// If `x.len()` is not a multiple of the block size.
pub fn quantize(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    assert_eq!(x.len() % ty.block_elems(), 0, "quantize: partial block");
    let mut out = Vec::with_capacity(x.len() / ty.block_elems() * ty.block_bytes());
    match ty {
        GgmlType::F32 => x
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        GgmlType::F16 => x
            .iter()
            .for_each(|v| out.extend_from_slice(&f16::from_f32(*v).to_le_bytes())),
        GgmlType::Q4_1 => {
            for blk in x.chunks_exact(QK) {
                let min = blk.iter().copied().fold(f32::INFINITY, f32::min);
                let max = blk.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let id = if d > 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
                let q = |v: f32| (((v - min) * id).round() as i32).clamp(0, 15) as u8;
                for j in 0..16 {
                    out.push(q(blk[j]) | (q(blk[j + 16]) << 4));
                }
            }
        }
        GgmlType::Q4_0 => {
            for blk in x.chunks_exact(QK) {
                // ggml: d = max / -8 where max is the value of largest magnitude.
                let mut amax = 0f32;
                let mut maxv = 0f32;
                for &v in blk {
                    if v.abs() > amax {
                        amax = v.abs();
                        maxv = v;
                    }
                }
                let d = maxv / -8.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
                for j in 0..16 {
                    out.push(q(blk[j]) | (q(blk[j + 16]) << 4));
                }
            }
        }
        GgmlType::Q8_0 => {
            for blk in x.chunks_exact(QK) {
                let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = if d > 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
                for &v in blk {
                    out.push(((v * id).round() as i32).clamp(-127, 127) as i8 as u8);
                }
            }
        }
    }
    out
}
