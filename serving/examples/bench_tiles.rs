//! Picks the f32 register-tile shape: `cargo run --release -p brownout-serving --example bench_tiles`.
//! Single-threaded; reports GFLOP per CPU-second (steadier than wall time on a shared machine).
//! The last line of each batch is the `gemm` crate on the same matrix.

use brownout_serving::model::cpu::{MatData, Matrix, gemm_f32, matmul_f32_shape, packed_matmul};
use brownout_serving::model::cpu_seconds;

fn main() {
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
        // Our packed panels (16 rows x up to 6 tokens), also single-threaded.
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
            "batch {n:2} packed 16x6: {:6.1} GFLOP/CPU-s  {:6.1} GFLOP/s wall",
            gflop / cpu,
            gflop / wall
        );
    }
}
