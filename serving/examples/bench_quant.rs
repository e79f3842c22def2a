//! The integer kernel against the f32 one, matrix by matrix, one thread:
//! `cargo run --release -p brownout-serving --example bench_quant [reps-scale]`.
//!
//! For SmolLM2-135M's matrix shapes (Q4_1 layers, the Q8_0 output head) at batch 1, 8 and 32:
//! GFLOP per CPU-second (2 · rows · cols · tokens per second of this process's CPU time, best of
//! 5 runs: on a shared machine CPU time is what the work cost; run it with RAYON_NUM_THREADS=1
//! for one core) of the repacked integer kernel on every quantised path
//! this CPU has (`TilesVnni` = AVX-512 VNNI, `Tiles` = AVX2) and of the packed f32 kernel on
//! every instruction set, and the integer / f32 ratio per instruction set.

use brownout_serving::model::cpu::{
    Isa, MatData, Matrix, QuantPath, Repacked, packed_matmul_on, repacked_matmul_on,
};
use brownout_serving::model::gguf::GgmlType;
use brownout_serving::model::quant::quantize;

fn seeded(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// CPU time of this process (all threads), seconds: what the work cost, whatever share of the
/// cores other processes took meanwhile.
fn cpu_now() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Best GFLOP per CPU-second of 5 runs of `reps` calls.
fn time(flop: f64, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    let mut best = 0f64;
    for _ in 0..5 {
        let t = cpu_now();
        for _ in 0..reps {
            f();
        }
        best = best.max(flop * reps as f64 / (cpu_now() - t) / 1e9);
    }
    best
}

fn main() {
    let scale: f64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    let shapes = [
        ("q/o 576x576", 576, 576, GgmlType::Q4_1),
        ("k/v 192x576", 192, 576, GgmlType::Q4_1),
        ("gate/up 1536x576", 1536, 576, GgmlType::Q4_1),
        ("down 576x1536", 576, 1536, GgmlType::Q4_1),
        ("head 49152x576 (Q8_0)", 49152, 576, GgmlType::Q8_0),
        ("1536x576 as Q8_0", 1536, 576, GgmlType::Q8_0),
        ("49152x576 as Q4_1", 49152, 576, GgmlType::Q4_1),
    ];
    let only: Option<String> = std::env::args().nth(2);
    let qpaths: Vec<QuantPath> = QuantPath::available()
        .into_iter()
        .filter(|p| *p != QuantPath::RowWise)
        .collect();
    let isas: Vec<Isa> = Isa::available()
        .into_iter()
        .filter(|i| *i != Isa::Scalar)
        .collect();
    for (name, rows, cols, ty) in shapes {
        if only.as_ref().is_some_and(|o| !name.contains(o.as_str())) {
            continue;
        }
        let w = seeded(rows * cols, 7);
        let rp = Repacked::from_raw(ty, rows, cols, &quantize(ty, &w));
        let pm = Matrix::f32(rows, cols, w).packed();
        let MatData::Packed(pd) = &pm.data else {
            unreachable!()
        };
        for n in [1usize, 8, 32] {
            let x = seeded(n * cols, 11 + n as u64);
            let mut y = vec![0f32; n * rows];
            let flop = 2.0 * (rows * cols * n) as f64;
            let reps = ((4e8 * scale / flop) as usize).max(2);
            let mut line = format!("{name:24} batch {n:2}:");
            let mut int = Vec::new();
            for &p in &qpaths {
                let g = time(flop, reps, || repacked_matmul_on(p, &rp, &x, n, &mut y, 1));
                line += &format!("  int8 {p:?} {g:6.1}");
                int.push((p, g));
            }
            for &isa in &isas {
                let g = time(flop, reps, || {
                    packed_matmul_on(isa, pd, rows, cols, &x, n, &mut y, 1)
                });
                line += &format!("  f32 {isa:?} {g:6.1}");
                let same = int.iter().find(|(p, _)| {
                    matches!(
                        (p, isa),
                        (QuantPath::TilesVnni, Isa::Avx512) | (QuantPath::Tiles, Isa::Avx2)
                    )
                });
                if let Some((_, gi)) = same {
                    line += &format!(" ({:.2}x)", gi / g);
                }
            }
            println!("{line}");
        }
    }
}
