//! CPU kernels: dequantisation known answers, matmul against a plain f64 reference, and the
//! property that batching never changes a result bit.

use brownout_serving::model::cpu::{
    Isa, Kernel, MatData, Matrix, QuantPath, Repacked, WeightBuf, matmul_with, pack_tokens,
    packed_matmul_on, quant_matmul_on, repacked_matmul_on,
};
use brownout_serving::model::gguf::GgmlType;
use brownout_serving::model::llama::{exp_approx, silu_mul};
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
        Matrix {
            rows,
            cols,
            data: MatData::Quant(GgmlType::Q4_1, quantize(GgmlType::Q4_1, &w)),
        }
        .repacked(),
        Matrix {
            rows,
            cols,
            data: MatData::Quant(GgmlType::Q8_0, quantize(GgmlType::Q8_0, &w)),
        }
        .repacked(),
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

#[test]
fn the_packed_kernel_gives_the_same_bits_on_every_instruction_set() {
    // AVX-512 (16 rows × up to 8 tokens), AVX2 (16 × 4) and the scalar loop all make one fused
    // multiply-add per (row, token, k) in k order, so a model's tokens do not depend on the
    // machine's vector width. Shapes: a partial last panel, K across two 256-column chunks,
    // token counts around the 8-token group and the 48-token block.
    let isas = Isa::available();
    println!("instruction sets on this CPU: {isas:?}");
    for &(rows, cols) in &[(37, 96), (64, 600)] {
        let w = seeded(rows * cols, 9);
        let m = Matrix::f32(rows, cols, w.clone()).packed();
        let MatData::Packed(p) = &m.data else {
            panic!("not packed")
        };
        for n in [1, 3, 8, 9, 47, 50] {
            let x = seeded(n * cols, 13 + n as u64);
            let want = reference(&x, n, &w, rows, cols);
            let mut scalar = vec![0f32; n * rows];
            packed_matmul_on(Isa::Scalar, p, rows, cols, &x, n, &mut scalar, 2);
            for (a, b) in scalar.iter().zip(&want) {
                assert!(
                    (f64::from(*a) - b).abs() < 1e-4 * (cols as f64).sqrt(),
                    "{a} vs {b}"
                );
            }
            for &isa in &isas {
                let mut y = vec![f32::NAN; n * rows];
                packed_matmul_on(isa, p, rows, cols, &x, n, &mut y, 2);
                assert_eq!(y, scalar, "{isa:?} {rows}x{cols} n={n}");
            }
        }
    }
}

#[test]
fn tokens_are_packed_k_major_in_groups_of_eight() {
    let (n, cols) = (10, 3);
    let x: Vec<f32> = (0..n * cols).map(|i| i as f32).collect();
    let (xp, stride) = pack_tokens(&x, n, cols);
    assert_eq!(stride, 8);
    assert_eq!(xp.len(), 2 * 8 * cols, "two groups, the second padded");
    // Group 0, column k = 1: tokens 0..8 → x[t][1] = 3t + 1.
    assert_eq!(&xp[8..16], &[1.0, 4.0, 7.0, 10.0, 13.0, 16.0, 19.0, 22.0]);
    // Group 1, column 2: tokens 8, 9, then zeros.
    assert_eq!(
        &xp[24 + 16..24 + 24],
        &[26.0, 29.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    );
    // Fewer tokens than a group: one group as wide as the batch.
    let (xp, stride) = pack_tokens(&x[..2 * cols], 2, cols);
    assert_eq!((stride, xp), (2, vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]));
}

#[test]
fn exp_approx_is_within_two_ulp_and_saturates_cleanly() {
    let mut worst = 0f64;
    let mut x = -87.0f32;
    while x < 88.0 {
        let want = f64::from(x).exp();
        let got = f64::from(exp_approx(x));
        worst = worst.max(((got - want) / want).abs());
        x += 0.0137;
    }
    assert!(worst < 2.5e-7, "worst relative error {worst:e}");
    // Far outside the range: finite, no NaN (silu of a large |g| must stay defined).
    assert!(exp_approx(-1e30) >= 0.0 && exp_approx(-1e30) < 1e-37);
    assert!(exp_approx(1e30).is_finite() && exp_approx(1e30) > 1e38);
    assert_eq!(exp_approx(0.0), 1.0);
}

#[test]
fn silu_mul_is_the_same_on_the_vector_and_scalar_paths() {
    // 21 values: two full lanes of eight and a scalar tail of five. Every element must equal
    // the scalar formula applied alone, whichever path computed it, and be close to the exact
    // silu(g)·u.
    let g: Vec<f32> = (0..21).map(|i| (i as f32 - 10.0) * 1.7).collect();
    let u: Vec<f32> = (0..21).map(|i| 0.5 + i as f32 * 0.1).collect();
    let mut out = vec![0f32; 21];
    silu_mul(&g, &u, &mut out);
    for i in 0..21 {
        let mut one = [0f32];
        silu_mul(&g[i..=i], &u[i..=i], &mut one);
        assert_eq!(out[i], one[0], "element {i}");
        let exact = f64::from(g[i]) / (1.0 + (-f64::from(g[i])).exp()) * f64::from(u[i]);
        assert!(
            (f64::from(out[i]) - exact).abs() <= 1e-6 * exact.abs().max(1.0),
            "{i}"
        );
    }
    // Saturation: silu(-1000) is a tiny negative number (not NaN), silu(1000) is 1000.
    let mut o = [0f32; 2];
    silu_mul(&[-1000.0, 1000.0], &[1.0, 1.0], &mut o);
    assert!(o[0] <= 0.0 && o[0] > -1e-30, "{}", o[0]);
    assert_eq!(o[1], 1000.0);
}

#[test]
fn weight_buffers_are_zeroed_huge_page_aligned_and_clone_deeply() {
    let mut b = WeightBuf::zeroed(1_000_003);
    assert_eq!(b.len(), 1_000_003);
    assert!(b.iter().all(|&v| v == 0.0));
    assert_eq!(
        b.as_ptr() as usize % (2 << 20),
        0,
        "starts on a 2 MiB boundary"
    );
    b[0] = 1.5;
    b[1_000_002] = -2.0;
    let c = b.clone();
    b[0] = 9.0;
    assert_eq!((c[0], c[1_000_002], b[0]), (1.5, -2.0, 9.0));
    assert!(WeightBuf::zeroed(0).is_empty());
    // Many maps and drops: each buffer gives its mapping back. 200 × 12 MiB would add 2.4 GiB
    // of address space if a mapping (or its 2 MiB alignment slack) leaked.
    let before = vm_size_kib();
    for _ in 0..200 {
        let mut t = WeightBuf::zeroed(3 << 20);
        let last = t.len() - 1;
        t[last] = 1.0;
        assert_eq!(t[last], 1.0);
    }
    if let (Some(a), Some(b)) = (before, vm_size_kib()) {
        assert!(b < a + 256 * 1024, "address space grew from {a} to {b} KiB");
    }
}

#[test]
fn the_quantised_kernel_gives_the_same_bits_on_every_path() {
    // Row by row (AVX2 dot_row), tiles of 4 rows × 4 tokens with maddubs+madd, and the same
    // tiles with AVX-512 VNNI: the same integer lanes and float operations per (row, token),
    // so the fallback route's tokens depend neither on the batch nor on the CPU's extensions.
    // Row and token counts leave remainders on both tile edges.
    let paths = QuantPath::available();
    println!("quantised paths on this CPU: {paths:?}");
    for ty in [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0] {
        for &(rows, cols) in &[(37, 96), (64, 576)] {
            let w = seeded(rows * cols, 21);
            let m = Matrix {
                rows,
                cols,
                data: MatData::Quant(ty, quantize(ty, &w)),
            }
            .prepared();
            for n in [1, 3, 4, 5, 9] {
                let x = seeded(n * cols, 40 + n as u64);
                let mut want = vec![0f32; n * rows];
                quant_matmul_on(QuantPath::RowWise, &x, n, &m, &mut want);
                for &path in &paths {
                    let mut y = vec![f32::NAN; n * rows];
                    quant_matmul_on(path, &x, n, &m, &mut y);
                    assert_eq!(y, want, "{ty:?} {path:?} {rows}x{cols} n={n}");
                }
            }
        }
    }
}

/// This process's virtual size (`VmSize` in /proc/self/status), Linux only.
fn vm_size_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with("VmSize:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// GGUF blocks of `ty` for `w`, with some Q8_0 values forced to −128 (a valid byte that the
/// quantiser never writes but a file may hold: the AVX2 path's sign trick must handle it).
fn blocks_with_extremes(ty: GgmlType, w: &[f32]) -> Vec<u8> {
    let mut raw = quantize(ty, w);
    if ty == GgmlType::Q8_0 {
        for (i, b) in raw.chunks_exact_mut(34).enumerate() {
            b[2 + i % 32] = 0x80;
            b[2 + (i * 7 + 3) % 32] = 0x7f;
        }
    }
    raw
}

#[test]
fn repacked_rows_dequantise_to_the_gguf_values() {
    for ty in [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0] {
        for &(rows, cols) in &[(37, 96), (16, 32), (3, 64)] {
            let w = seeded(rows * cols, 17);
            let raw = blocks_with_extremes(ty, &w);
            let mut want = vec![0f32; rows * cols];
            dequantize(ty, &raw, &mut want);
            let m = Matrix {
                rows,
                cols,
                data: MatData::Quant(ty, raw),
            }
            .repacked();
            assert!(matches!(m.data, MatData::Repacked(_)));
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                m.row_f32(r, &mut row);
                assert_eq!(row[..], want[r * cols..(r + 1) * cols], "{ty:?} row {r}");
            }
        }
    }
}

#[test]
fn the_repacked_kernel_gives_the_same_bits_on_every_path_and_batch() {
    // AVX-512 VNNI (16 rows × ≤ 8 tokens), AVX2 maddubs (16 rows × ≤ 6 tokens, Q8_0 ≤ 4) and the scalar
    // loop: the same exact i32 block sums and the same float operations per (row, token), in
    // block order. Shapes: a partial last panel, several blocks; token counts around both
    // tiles. Each result is also close to the f64 product with the dequantised weights.
    let paths = QuantPath::available();
    println!("quantised paths on this CPU: {paths:?}");
    for ty in [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0] {
        for &(rows, cols) in &[(37, 96), (64, 576), (16, 32)] {
            let w = seeded(rows * cols, 23);
            let raw = blocks_with_extremes(ty, &w);
            let mut deq = vec![0f32; rows * cols];
            dequantize(ty, &raw, &mut deq);
            let rp = Repacked::from_raw(ty, rows, cols, &raw);
            for n in [1, 2, 3, 4, 5, 8, 9, 17, 33] {
                let x = seeded(n * cols, 60 + n as u64);
                let want = reference(&x, n, &deq, rows, cols);
                let mut scalar = vec![f32::NAN; n * rows];
                repacked_matmul_on(QuantPath::RowWise, &rp, &x, n, &mut scalar, 2);
                // 8-bit activations: |error| ≤ amax/254 per value, summed over `cols` products
                // with |w| ≤ 1 (Q8_0 here reaches ±1 ·127/127 at its forced extremes).
                let tol = 0.004 * cols as f64;
                for (a, b) in scalar.iter().zip(&want) {
                    assert!(
                        (f64::from(*a) - b).abs() < tol,
                        "{ty:?} {rows}x{cols} n={n}: {a} vs {b}"
                    );
                }
                for &path in &paths {
                    let mut y = vec![f32::NAN; n * rows];
                    repacked_matmul_on(path, &rp, &x, n, &mut y, 2);
                    assert_eq!(y, scalar, "{ty:?} {path:?} {rows}x{cols} n={n}");
                    // Alone = in the batch, token by token.
                    for t in [0, n / 2, n - 1] {
                        let mut one = vec![f32::NAN; rows];
                        repacked_matmul_on(path, &rp, &x[t * cols..(t + 1) * cols], 1, &mut one, 1);
                        assert_eq!(
                            one[..],
                            y[t * rows..(t + 1) * rows],
                            "{ty:?} {path:?} t={t}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn the_repacked_kernel_gives_the_same_bits_for_a_tall_output() {
    // More than 1 MiB of output (33 tokens × 8229 rows, like the output head at a batch): the
    // kernel walks runs of panels per token group instead of one panel at a time. Same bits as
    // the scalar loop, and as each token alone, on every path; a partial last panel.
    let (rows, cols, n) = (8229, 64, 33);
    assert!(n * rows * 4 > 1 << 20);
    for ty in [GgmlType::Q8_0, GgmlType::Q4_1] {
        let raw = blocks_with_extremes(ty, &seeded(rows * cols, 31));
        let rp = Repacked::from_raw(ty, rows, cols, &raw);
        let x = seeded(n * cols, 77);
        let mut scalar = vec![f32::NAN; n * rows];
        repacked_matmul_on(QuantPath::RowWise, &rp, &x, n, &mut scalar, 2);
        for path in QuantPath::available() {
            let mut y = vec![f32::NAN; n * rows];
            repacked_matmul_on(path, &rp, &x, n, &mut y, 2);
            assert!(y == scalar, "{ty:?} {path:?}: differs from the scalar loop");
            for t in [0, 7, n - 1] {
                let mut one = vec![f32::NAN; rows];
                repacked_matmul_on(path, &rp, &x[t * cols..(t + 1) * cols], 1, &mut one, 1);
                assert!(
                    one[..] == y[t * rows..(t + 1) * rows],
                    "{ty:?} {path:?} t={t}"
                );
            }
        }
    }
}

#[test]
fn the_repacked_kernel_is_exact_at_the_largest_products() {
    // Every nibble 15 (Q4_1, Q4_0) or ±127/−128 byte (Q8_0) against activations that quantise
    // to ±127: the integer sums reach their bounds (the AVX2 path adds Q4 products in i16).
    let (rows, cols, n) = (16, 64, 3);
    let x: Vec<f32> = (0..n * cols)
        .map(|i| if (i / 7) % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    let mut x_pos = x.clone();
    x_pos.iter_mut().for_each(|v| *v = 1.0);
    for ty in [GgmlType::Q4_1, GgmlType::Q4_0, GgmlType::Q8_0] {
        let bb = ty.block_bytes();
        let mut raw = Vec::new();
        for i in 0..rows * cols / 32 {
            let mut b = vec![0u8; bb];
            b[..2].copy_from_slice(&h(0.5));
            match ty {
                GgmlType::Q4_1 => {
                    b[2..4].copy_from_slice(&h(-0.25));
                    b[4..].fill(0xff);
                }
                GgmlType::Q4_0 => b[2..].fill(if i % 2 == 0 { 0xff } else { 0x00 }),
                _ => b[2..].fill(if i % 2 == 0 { 0x7f } else { 0x80 }),
            }
            raw.extend(b);
        }
        let mut deq = vec![0f32; rows * cols];
        dequantize(ty, &raw, &mut deq);
        let rp = Repacked::from_raw(ty, rows, cols, &raw);
        for xs in [&x, &x_pos] {
            // ±1 quantise exactly to ±127 with d = 1/127: the products are exact.
            let want = reference(xs, n, &deq, rows, cols);
            for path in QuantPath::available() {
                let mut y = vec![f32::NAN; n * rows];
                repacked_matmul_on(path, &rp, xs, n, &mut y, 1);
                for (a, b) in y.iter().zip(&want) {
                    assert!(
                        (f64::from(*a) - b).abs() < 1e-3 * (1.0 + b.abs()),
                        "{ty:?} {path:?}: {a} vs {b}"
                    );
                }
            }
        }
    }
}

#[test]
fn matmul_runs_repacked_matrices_with_the_detected_path() {
    let (rows, cols, n) = (40, 64, 6);
    let w = seeded(rows * cols, 5);
    let m = Matrix {
        rows,
        cols,
        data: MatData::Quant(GgmlType::Q4_1, quantize(GgmlType::Q4_1, &w)),
    };
    let rp = m.clone().repacked();
    let MatData::Repacked(inner) = &rp.data else {
        panic!("not repacked")
    };
    let x = seeded(n * cols, 9);
    let mut via_matmul = vec![0f32; n * rows];
    matmul_with(Kernel::Packed, &x, n, &rp, &mut via_matmul);
    let mut direct = vec![0f32; n * rows];
    repacked_matmul_on(QuantPath::detect(), inner, &x, n, &mut direct, 3);
    assert_eq!(via_matmul, direct);
    // Same quantisation of the activations as the older kernel: close, not bit for bit (it
    // sums in 8 float lanes per block, this kernel exact integers per block).
    let mut old = vec![0f32; n * rows];
    quant_matmul_on(QuantPath::RowWise, &x, n, &m.prepared(), &mut old);
    for (a, b) in direct.iter().zip(&old) {
        assert!((a - b).abs() < 1e-3 * (1.0 + b.abs()), "{a} vs {b}");
    }
    // The GGUF's 20 bytes per block and row, with the last panel padded to 16 rows.
    assert_eq!(rp.bytes(), 48 * (cols / 32) * 20);
}
