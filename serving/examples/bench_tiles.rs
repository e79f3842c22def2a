//! Picks the f32 register-tile shape: `cargo run --release -p brownout-serving --example bench_tiles`.
//! Single-threaded; reports GFLOP per CPU-second (steadier than wall time on a shared machine).
//! The last line of each batch is the `gemm` crate on the same matrix.

use brownout_serving::model::cpu::{MatData, Matrix, gemm_f32, matmul_f32_shape, packed_matmul};
use brownout_serving::model::cpu_seconds;

/// Peak FMA rate of this CPU: 12 independent chains of 8-lane (AVX2) or 16-lane (AVX-512)
/// fused multiply-adds, no memory traffic; GFLOP/s of one thread.
#[cfg(target_arch = "x86_64")]
fn fma_peak() -> Vec<(&'static str, f64)> {
    use std::arch::x86_64::*;
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2(iters: usize) -> f32 {
        let mut a = [_mm256_set1_ps(1.0); 12];
        let (b, c) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
        for _ in 0..iters {
            for r in a.iter_mut() {
                *r = _mm256_fmadd_ps(*r, b, c);
            }
        }
        // Every chain feeds the result, so none is dead code.
        let s = a
            .iter()
            .fold(_mm256_setzero_ps(), |s, &r| _mm256_add_ps(s, r));
        let mut o = [0f32; 8];
        // SAFETY: o holds 8 floats.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), s) };
        o.iter().sum()
    }
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512(iters: usize) -> f32 {
        let mut a = [_mm512_set1_ps(1.0); 12];
        let (b, c) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
        for _ in 0..iters {
            for r in a.iter_mut() {
                *r = _mm512_fmadd_ps(*r, b, c);
            }
        }
        a.iter().map(|&r| _mm512_reduce_add_ps(r)).sum()
    }
    let iters = 50_000_000;
    let mut out = Vec::new();
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        let t = std::time::Instant::now();
        // SAFETY: AVX2+FMA detected.
        std::hint::black_box(unsafe { avx2(iters) });
        out.push((
            "avx2",
            (iters * 12 * 8 * 2) as f64 / t.elapsed().as_secs_f64() / 1e9,
        ));
    }
    if is_x86_feature_detected!("avx512f") {
        let t = std::time::Instant::now();
        // SAFETY: AVX-512F detected.
        std::hint::black_box(unsafe { avx512(iters) });
        out.push((
            "avx512",
            (iters * 12 * 16 * 2) as f64 / t.elapsed().as_secs_f64() / 1e9,
        ));
    }
    out
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    for (isa, g) in fma_peak() {
        println!("FMA peak, one thread, {isa}: {g:.1} GFLOP/s");
    }
    let (rows, cols) = (3072, 576);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 5000.0)
        .collect();
    let m = Matrix::f32(rows, cols, w);
    for n in [1usize, 8, 32] {
        let x: Vec<f32> = (0..n * cols).map(|i| (i % 13) as f32 / 13.0).collect();
        let mut yt = vec![0f32; n * rows];
        for shape in [(4, 3), (3, 4), (4, 2), (2, 4), (8, 1)] {
            matmul_f32_shape(shape, &x, n, &m, &mut yt);
            let reps = 2000 / n.max(1) + 10;
            let c0 = cpu_seconds().unwrap_or(0.0);
            let t0 = std::time::Instant::now();
            for _ in 0..reps {
                matmul_f32_shape(shape, &x, n, &m, &mut yt);
            }
            let wall = t0.elapsed().as_secs_f64();
            let cpu = (cpu_seconds().unwrap_or(0.0) - c0).max(0.01);
            let gflop = 2.0 * (rows * cols * n * reps) as f64 / 1e9;
            println!(
                "batch {n:2} tile {}x{}: {:6.1} GFLOP/CPU-s  {:6.1} GFLOP/s wall",
                shape.0,
                shape.1,
                gflop / cpu,
                gflop / wall
            );
        }
        // The gemm crate, also single-threaded, into y[token][row].
        let mut y = vec![0f32; n * rows];
        let MatData::F32(d) = &m.data else {
            unreachable!()
        };
        gemm_f32(d, rows, cols, &x, n, &mut y, gemm::Parallelism::None);
        let reps = 2000 / n.max(1) + 10;
        let c0 = cpu_seconds().unwrap_or(0.0);
        let t0 = std::time::Instant::now();
        for _ in 0..reps {
            gemm_f32(d, rows, cols, &x, n, &mut y, gemm::Parallelism::None);
        }
        let wall = t0.elapsed().as_secs_f64();
        let cpu = (cpu_seconds().unwrap_or(0.0) - c0).max(0.01);
        let gflop = 2.0 * (rows * cols * n * reps) as f64 / 1e9;
        println!(
            "batch {n:2} gemm crate: {:6.1} GFLOP/CPU-s  {:6.1} GFLOP/s wall",
            gflop / cpu,
            gflop / wall
        );
        // Our packed panels (16 rows x up to 8 tokens on AVX-512), one task per thread count 1.
        let pm = m.clone().packed();
        let MatData::Packed(pd) = &pm.data else {
            unreachable!()
        };
        packed_matmul(pd, rows, cols, &x, n, &mut y, 1);
        let c0 = cpu_seconds().unwrap_or(0.0);
        let t0 = std::time::Instant::now();
        for _ in 0..reps {
            packed_matmul(pd, rows, cols, &x, n, &mut y, 1);
        }
        let wall = t0.elapsed().as_secs_f64();
        let cpu = (cpu_seconds().unwrap_or(0.0) - c0).max(0.01);
        println!(
            "batch {n:2} packed 16x8: {:6.1} GFLOP/CPU-s  {:6.1} GFLOP/s wall",
            gflop / cpu,
            gflop / wall
        );
    }
}
