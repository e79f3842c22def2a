//! CPU kernels: dequantisation known answers, matmul against a plain f64 reference, and the
//! property that batching never changes a result bit.

use brownout_serving::model::cpu::{Kernel, MatData, Matrix, matmul_with};
use brownout_serving::model::gguf::GgmlType;
use brownout_serving::model::quant::{dequantize, quantize};
use half::f16;

fn h(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_le_bytes()
}

#[test]
fn dequantises_hand_made_blocks() {
    // Q4_1: d = 0.5, m = -1; byte j = (j % 16) | (15 - j % 16) << 4.
    let mut q41 = Vec::new();
    q41.extend_from_slice(&h(0.5));
    q41.extend_from_slice(&h(-1.0));
    for j in 0..16u8 {
        q41.push(j | ((15 - j) << 4));
    }
    let mut out = vec![0f32; 32];
    dequantize(GgmlType::Q4_1, &q41, &mut out);
    for j in 0..16 {
        assert_eq!(out[j], 0.5 * j as f32 - 1.0);
        assert_eq!(out[j + 16], 0.5 * (15 - j) as f32 - 1.0);
    }
    // Q4_0: d = 2, x = d·(q − 8).
    let mut q40 = h(2.0).to_vec();
    q40.extend(std::iter::repeat_n(0x3cu8, 16)); // low 12, high 3
    dequantize(GgmlType::Q4_0, &q40, &mut out);
    assert_eq!(out[0], 8.0);
    assert_eq!(out[16], -10.0);
    // Q8_0: d = 0.25.
    let mut q80 = h(0.25).to_vec();
    q80.extend((0..32).map(|j| (j as i8 - 16) as u8));
    dequantize(GgmlType::Q8_0, &q80, &mut out);
    for (j, &v) in out.iter().enumerate() {
        assert_eq!(v, 0.25 * (j as f32 - 16.0));
    }
    // F16 and F32.
    let f16s: Vec<u8> = [1.5f32, -2.25, 65504.0]
        .iter()
        .flat_map(|&v| h(v))
        .collect();
    let mut o3 = vec![0f32; 3];
    dequantize(GgmlType::F16, &f16s, &mut o3);
    assert_eq!(o3, [1.5, -2.25, 65504.0]);
    let f32s: Vec<u8> = [1.0f32, -3.5, 1e-7]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    dequantize(GgmlType::F32, &f32s, &mut o3);
    assert_eq!(o3, [1.0, -3.5, 1e-7]);
}

#[test]
fn quantise_then_dequantise_stays_within_half_a_step() {
    let x: Vec<f32> = (0..256)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
        .collect();
    // Q4_0 maps the largest magnitude to −8 and clips the other side at +7: a whole step there.
    for (ty, steps) in [
        (GgmlType::Q4_1, 15.0),
        (GgmlType::Q4_0, 8.0),
        (GgmlType::Q8_0, 254.0),
    ] {
        let mut back = vec![0f32; x.len()];
        dequantize(ty, &quantize(ty, &x), &mut back);
        for (blk, bb) in x.chunks(32).zip(back.chunks(32)) {
            let range = blk.iter().fold(0f32, |m, v| m.max(v.abs())) * 2.0;
            let tol = range / steps * 0.51 + 0.01;
            for (a, b) in blk.iter().zip(bb) {
                assert!((a - b).abs() <= tol, "{ty:?}: {a} vs {b} (tol {tol})");
            }
        }
    }
}

fn seeded(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn reference(x: &[f32], n: usize, w: &[f32], rows: usize, cols: usize) -> Vec<f64> {
    let mut y = vec![0f64; n * rows];
    for t in 0..n {
        for r in 0..rows {
            y[t * rows + r] = (0..cols)
                .map(|c| f64::from(x[t * cols + c]) * f64::from(w[r * cols + c]))
                .sum();
        }
    }
    y
}

#[test]
fn f32_matmul_matches_f64_reference_for_odd_shapes() {
    for &(rows, cols) in &[(1, 8), (3, 40), (4, 64), (5, 13), (17, 96), (64, 576)] {
        let w = seeded(rows * cols, rows as u64 * 31 + cols as u64);
        let m = Matrix::f32(rows, cols, w.clone());
        for n in [1, 2, 3, 4, 5, 7, 9, 50] {
            let x = seeded(n * cols, n as u64);
            let want = reference(&x, n, &w, rows, cols);
            for kernel in [Kernel::Tiled, Kernel::Simple, Kernel::Gemm, Kernel::Packed] {
                let mut y = vec![0f32; n * rows];
                // The packed kernel runs on matrices packed at load.
                let m = if kernel == Kernel::Packed {
                    m.clone().packed()
                } else {
                    m.clone()
                };
                matmul_with(kernel, &x, n, &m, &mut y);
                for (a, b) in y.iter().zip(&want) {
                    assert!(
                        (f64::from(*a) - b).abs() < 1e-4 * (cols as f64).sqrt(),
                        "{kernel:?} {rows}x{cols} n={n}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

#[test]
fn quantised_matmul_is_close_to_the_dequantised_one() {
    let (rows, cols) = (24, 256);
    let w = seeded(rows * cols, 7);
    for ty in [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0] {
        let raw = quantize(ty, &w);
        let mut deq = vec![0f32; rows * cols];
        dequantize(ty, &raw, &mut deq);
        let qm = Matrix {
            rows,
            cols,
            data: MatData::Quant(ty, raw),
        };
        let n = 5;
        let x = seeded(n * cols, 11);
        let want = reference(&x, n, &deq, rows, cols);
        for kernel in [Kernel::Tiled, Kernel::Simple, Kernel::Gemm] {
            let mut y = vec![0f32; n * rows];
            matmul_with(kernel, &x, n, &qm, &mut y);
            // Tiled (also what Gemm uses for quantised matrices) quantises the activations to 8
            // bits (error ≤ amax/254 per value): over 256 products of |w| ≤ 1 that adds up to
            // ~0.1 at worst, ~0.03 typically.
            let tol = if kernel == Kernel::Simple { 1e-3 } else { 0.15 };
            for (a, b) in y.iter().zip(&want) {
                assert!(
                    (f64::from(*a) - b).abs() < tol,
                    "{ty:?} {kernel:?}: {a} vs {b}"
                );
            }
        }
    }
}

#[test]
fn a_token_gets_the_same_bits_alone_as_in_any_batch() {
    let (rows, cols) = (37, 96);
    let w = seeded(rows * cols, 3);
    let mats = [
        Matrix::f32(rows, cols, w.clone()),
        Matrix {
            rows,
            cols,
            data: MatData::Quant(GgmlType::Q4_1, quantize(GgmlType::Q4_1, &w)),
        },
        Matrix {
            rows,
            cols,
            data: MatData::Quant(GgmlType::Q8_0, quantize(GgmlType::Q8_0, &w)),
        },
    ];
    let n = 53;
    let x = seeded(n * cols, 5);
    // The tiled and packed kernels sum each (row, token) in the same order whatever the batch:
    // same bits. The gemm crate blocks by problem size: equal within 1e-5 of the row's
    // magnitude, not bit for bit (quantised matrices always take the tiled path).
    for kernel in [Kernel::Tiled, Kernel::Packed, Kernel::Gemm] {
        for m in &mats {
            let m = &if kernel == Kernel::Packed {
                m.clone().packed()
            } else {
                m.clone()
            };
            let mut all = vec![0f32; n * rows];
            matmul_with(kernel, &x, n, m, &mut all);
            for t in [0, 1, 2, 3, 25, 52] {
                let mut one = vec![0f32; rows];
                matmul_with(kernel, &x[t * cols..(t + 1) * cols], 1, m, &mut one);
                let batched = &all[t * rows..(t + 1) * rows];
                let exact = kernel != Kernel::Gemm || !matches!(m.data, MatData::F32(_));
                if exact {
                    assert_eq!(one[..], batched[..], "{kernel:?} token {t}");
                } else {
                    let scale = one.iter().fold(1e-3f32, |a, v| a.max(v.abs()));
                    for (a, b) in one.iter().zip(batched) {
                        assert!(
                            (a - b).abs() <= 1e-5 * scale,
                            "{kernel:?} token {t}: {a} vs {b}"
                        );
                    }
                }
            }
        }
    }
}
