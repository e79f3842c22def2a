//! Model benchmark: decode tokens/s at several batch sizes on each route, time to first token
//! of a long prompt, resident memory. Run by `cargo run --release --example bench_model`.

use std::fmt::Write as _;
use std::time::Instant;

use super::cpu::{Kernel, MatData, Matrix, matmul_with};
use super::gguf::GgmlType;
use super::loaded::argmax;
use super::quant;
use super::{LoadedModel, ModelError, Route, SeqChunk};

/// One measured figure.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchRow {
    pub route: &'static str,
    pub what: String,
    pub value: f64,
    pub unit: &'static str,
}

/// All figures of one run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchReport {
    pub model: String,
    pub device: String,
    pub threads: usize,
    pub rows: Vec<BenchRow>,
}

impl BenchReport {
    /// A Markdown table.
    pub fn to_markdown(&self) -> String {
        let mut s = format!(
            "model `{}` on {} ({} rayon threads)\n\n| route | measure | value | unit |\n|---|---|---:|---|\n",
            self.model, self.device, self.threads
        );
        for r in &self.rows {
            let _ = writeln!(
                s,
                "| {} | {} | {:.1} | {} |",
                r.route, r.what, r.value, r.unit
            );
        }
        s
    }

    pub fn get(&self, route: &str, what: &str) -> Option<f64> {
        self.rows
            .iter()
            .find(|r| r.route == route && r.what == what)
            .map(|r| r.value)
    }
}

/// Resident set size of this process in bytes (Linux; `None` elsewhere).
pub fn resident_bytes() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// CPU time (user + system) this process has used, in seconds (Linux; `None` elsewhere).
/// Reported next to wall-clock figures: on a shared machine it says what the work cost even
/// when other processes took the cores.
pub fn cpu_seconds() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the ")" that ends the command name: utime and stime are the 12th and 13th.
    let rest = s.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// Measures decode throughput at each batch size (each sequence a distinct 16-token prompt,
/// `decode_steps` steps after prefill) and the TTFT of one `ttft_prompt_len`-token prompt.
///
/// # Errors
/// As [`LoadedModel::forward`].
pub fn bench_model(
    model: &LoadedModel,
    routes: &[Route],
    batches: &[usize],
    decode_steps: usize,
    ttft_prompt_len: usize,
) -> Result<BenchReport, ModelError> {
    let mut rows = Vec::new();
    let vocab = model.config().vocab_size as u32;
    let bs = 16;
    let prompt_len = 16;
    for &route in routes {
        let r = route.as_str();
        rows.push(BenchRow {
            route: r,
            what: "weights".into(),
            value: model.weight_bytes(route) as f64 / (1 << 20) as f64,
            unit: "MiB",
        });
        for &b in batches {
            let per_seq = (prompt_len + decode_steps + 1).div_ceil(bs);
            let mut kv = model.new_kv(per_seq * b, bs);
            let tables: Vec<Vec<u32>> = (0..b)
                .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
                .collect();
            let prompts: Vec<Vec<u32>> = (0..b)
                .map(|s| {
                    (0..prompt_len)
                        .map(|i| ((s * 7919 + i * 104_729 + 17) as u32) % vocab)
                        .collect()
                })
                .collect();
            let chunks: Vec<SeqChunk<'_>> = (0..b)
                .map(|s| SeqChunk {
                    tokens: &prompts[s],
                    start_pos: 0,
                    block_table: &tables[s],
                })
                .collect();
            let mut logits = model.forward(route, &chunks, &mut kv)?;
            let t0 = Instant::now();
            let c0 = cpu_seconds();
            for step in 0..decode_steps {
                let next: Vec<u32> = logits.iter().map(|l| argmax(l)).collect();
                let chunks: Vec<SeqChunk<'_>> = (0..b)
                    .map(|s| SeqChunk {
                        tokens: std::slice::from_ref(&next[s]),
                        start_pos: prompt_len + step,
                        block_table: &tables[s],
                    })
                    .collect();
                logits = model.forward(route, &chunks, &mut kv)?;
            }
            let secs = t0.elapsed().as_secs_f64();
            rows.push(BenchRow {
                route: r,
                what: format!("decode batch {b}"),
                value: (b * decode_steps) as f64 / secs,
                unit: "tokens/s",
            });
            if let (Some(c0), Some(c1)) = (c0, cpu_seconds()) {
                rows.push(BenchRow {
                    route: r,
                    what: format!("decode batch {b}, per CPU-second"),
                    value: (b * decode_steps) as f64 / (c1 - c0).max(0.01),
                    unit: "tokens/CPU-s",
                });
            }
        }
        if ttft_prompt_len > 0 {
            let prompt: Vec<u32> = (0..ttft_prompt_len)
                .map(|i| ((i * 104_729 + 3) as u32) % vocab)
                .collect();
            let mut kv = model.new_kv(ttft_prompt_len.div_ceil(bs), bs);
            let table: Vec<u32> = (0..kv.num_blocks() as u32).collect();
            let t0 = Instant::now();
            model.forward(
                route,
                &[SeqChunk {
                    tokens: &prompt,
                    start_pos: 0,
                    block_table: &table,
                }],
                &mut kv,
            )?;
            rows.push(BenchRow {
                route: r,
                what: format!("TTFT {ttft_prompt_len}-token prompt"),
                value: t0.elapsed().as_secs_f64() * 1e3,
                unit: "ms",
            });
        }
    }
    if let Some(rss) = resident_bytes() {
        rows.push(BenchRow {
            route: "both",
            what: "resident memory (RSS)".into(),
            value: rss as f64 / (1 << 20) as f64,
            unit: "MiB",
        });
    }
    Ok(BenchReport {
        model: model.config().name.clone(),
        device: model.device_name().to_string(),
        threads: rayon::current_num_threads(),
        rows,
    })
}

/// GFLOP/s of one `rows × cols` matmul at batch `n` for each kernel and representation: the
/// measurement behind keeping the tiled kernels.
pub fn bench_matmul(rows: usize, cols: usize, batches: &[usize], reps: usize) -> Vec<BenchRow> {
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 5000.0)
        .collect();
    let mats = [
        ("f32", Matrix::f32(rows, cols, w.clone())),
        ("f32 packed", Matrix::f32(rows, cols, w.clone()).packed()),
        (
            "Q4_1",
            Matrix {
                rows,
                cols,
                data: MatData::Quant(GgmlType::Q4_1, quant::quantize(GgmlType::Q4_1, &w)),
            },
        ),
    ];
    let mut out = Vec::new();
    for (name, m) in &mats {
        let kernels: &[Kernel] = match &m.data {
            // A packed matrix always runs the packed kernel.
            MatData::Packed(_) => &[Kernel::Packed],
            _ => &[Kernel::Tiled, Kernel::Simple, Kernel::Gemm],
        };
        for &kernel in kernels {
            for &n in batches {
                let x: Vec<f32> = (0..n * cols).map(|i| (i % 13) as f32 / 13.0).collect();
                let mut y = vec![0f32; n * rows];
                matmul_with(kernel, &x, n, m, &mut y);
                let t0 = Instant::now();
                for _ in 0..reps {
                    matmul_with(kernel, &x, n, m, &mut y);
                }
                let secs = t0.elapsed().as_secs_f64();
                out.push(BenchRow {
                    route: if name.starts_with("f32") {
                        "primary"
                    } else {
                        "fallback"
                    },
                    what: format!("matmul {rows}x{cols} {name} {kernel:?} batch {n}"),
                    value: 2.0 * (rows * cols * n * reps) as f64 / secs / 1e9,
                    unit: "GFLOP/s",
                });
            }
        }
    }
    out
}
