//! Model benchmark: decode tokens/s at several batch sizes on each route, time to first token
//! of a long prompt, resident memory. Run by `cargo run --release --example bench_model`.

use std::fmt::Write as _;
use std::time::Instant;

use super::cpu::{Kernel, MatData, Matrix, matmul_with};
use super::gguf::GgmlType;
use super::loaded::argmax;
use super::quant;
use super::{ModelError, ModelRunner, Route, SeqChunk};

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

/// Rounds the decode measurement is split into (see [`bench_model`]).
pub const BENCH_ROUNDS: usize = 8;

/// One batch size's sequences, KV and figures while [`bench_model`] runs.
struct DecodeRun {
    route: Route,
    batch: usize,
    tables: Vec<Vec<u32>>,
    next: Vec<u32>,
    pos: usize,
    tok_per_s: Vec<f64>,
    tokens: usize,
    cpu: f64,
}

/// The middle value (mean of the two middle ones for an even count); 0 for none.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Positions per KV block in [`bench_model`].
pub const BENCH_BLOCK: usize = 16;
/// Prompt tokens of each decoding sequence in [`bench_model`].
const BENCH_PROMPT: usize = 16;

/// KV blocks (of [`BENCH_BLOCK`] positions) a [`ModelRunner`] needs for [`bench_model`] over
/// `routes` routes: each (route, batch size)'s sequences get blocks of their own; the long
/// prompt reuses the first ones afterwards.
pub fn bench_blocks(
    routes: usize,
    batches: &[usize],
    decode_steps: usize,
    ttft_prompt_len: usize,
) -> usize {
    let per_seq = bench_positions(decode_steps).div_ceil(BENCH_BLOCK);
    let decode: usize = routes * batches.iter().map(|b| b * per_seq).sum::<usize>();
    decode.max(ttft_prompt_len.div_ceil(BENCH_BLOCK)).max(1)
}

/// Rounds and steps per round for about `decode_steps` steps.
fn bench_rounds(decode_steps: usize) -> (usize, usize) {
    let rounds = BENCH_ROUNDS.min(decode_steps.max(1));
    (rounds, decode_steps.div_ceil(rounds).max(1))
}

/// Positions each decoding sequence of [`bench_model`] uses: the prompt, then per round one
/// untimed step and the timed ones.
fn bench_positions(decode_steps: usize) -> usize {
    let (rounds, per_round) = bench_rounds(decode_steps);
    BENCH_PROMPT + rounds * (per_round + 1)
}

/// Measures, on the runner's device, decode throughput of each route at each batch size (each
/// sequence a distinct 16-token prompt, about `decode_steps` timed steps after prefill) and the
/// TTFT of one `ttft_prompt_len`-token prompt. The runner needs [`bench_blocks`] blocks of
/// [`BENCH_BLOCK`] positions.
///
/// Every (route, batch size) gets its own sequences, then they all take turns, a round of steps
/// each ([`BENCH_ROUNDS`] rounds, one untimed step at the start of each), so that every figure
/// sees the same machine: on a shared host the speed drifts by tens of percent over seconds,
/// and measuring batch 1 and batch 32, or the two routes, minutes apart made their ratios swing
/// with it. Each throughput is the median over rounds; each ratio (batch N / batch 1 of a
/// route, fallback / primary at batch 1) is the median of the per-round ratios.
///
/// # Errors
/// As [`ModelRunner::forward`]; [`ModelError::InvalidInput`] when the runner's KV memory is
/// too small or has another block size.
pub fn bench_model(
    runner: &mut ModelRunner,
    routes: &[Route],
    batches: &[usize],
    decode_steps: usize,
    ttft_prompt_len: usize,
) -> Result<BenchReport, ModelError> {
    bench_model_with_progress(
        runner,
        routes,
        batches,
        decode_steps,
        ttft_prompt_len,
        &mut |_| {},
    )
}

/// [`bench_model`], calling `progress` with a line as each phase starts and each round ends.
///
/// # Errors
/// As [`bench_model`].
pub fn bench_model_with_progress(
    runner: &mut ModelRunner,
    routes: &[Route],
    batches: &[usize],
    decode_steps: usize,
    ttft_prompt_len: usize,
    progress: &mut dyn FnMut(&str),
) -> Result<BenchReport, ModelError> {
    let need = bench_blocks(routes.len(), batches, decode_steps, ttft_prompt_len);
    let (have, block) = runner.kv_shape();
    if have < need || block != BENCH_BLOCK {
        return Err(ModelError::InvalidInput(format!(
            "the benchmark needs {need} KV blocks of {BENCH_BLOCK}; the runner has {have} of {block}"
        )));
    }
    let model = runner.model.clone();
    let rss_before = resident_bytes();
    let vocab = model.config().vocab_size as u32;
    let bs = BENCH_BLOCK;
    let (rounds, steps_per_round) = bench_rounds(decode_steps);
    let per_seq = bench_positions(decode_steps).div_ceil(bs);
    let mut runs: Vec<DecodeRun> = Vec::new();
    let mut first_block = 0;
    progress(&format!(
        "prefill: {} sequences of {BENCH_PROMPT} tokens",
        routes.len() * batches.iter().sum::<usize>()
    ));
    for &route in routes {
        for &b in batches {
            let tables: Vec<Vec<u32>> = (0..b)
                .map(|s| {
                    let s0 = first_block + s * per_seq;
                    (s0 as u32..(s0 + per_seq) as u32).collect()
                })
                .collect();
            first_block += b * per_seq;
            let prompts: Vec<Vec<u32>> = (0..b)
                .map(|s| {
                    (0..BENCH_PROMPT)
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
            let logits = runner.forward(route, &chunks)?;
            runs.push(DecodeRun {
                route,
                batch: b,
                tables,
                next: logits.iter().map(|l| argmax(l)).collect(),
                pos: BENCH_PROMPT,
                tok_per_s: Vec::new(),
                tokens: 0,
                cpu: 0.0,
            });
        }
    }
    for i in 0..rounds {
        for run in &mut runs {
            run.round(runner, steps_per_round)?;
        }
        let last: Vec<String> = runs
            .iter()
            .map(|r| {
                let v = r.tok_per_s.last().copied().unwrap_or(0.0);
                format!("{} b{} {v:.0}", r.route.as_str(), r.batch)
            })
            .collect();
        progress(&format!(
            "decode round {}/{rounds} (tokens/s): {}",
            i + 1,
            last.join(", ")
        ));
    }
    let mut rows = Vec::new();
    for &route in routes {
        let r = route.as_str();
        rows.push(BenchRow {
            route: r,
            what: "weights".into(),
            value: model.weight_bytes(route) as f64 / (1 << 20) as f64,
            unit: "MiB",
        });
        let mine: Vec<&DecodeRun> = runs.iter().filter(|x| x.route == route).collect();
        let base = mine.iter().find(|x| x.batch == 1);
        for run in &mine {
            let b = run.batch;
            rows.push(BenchRow {
                route: r,
                what: format!("decode batch {b}"),
                value: median(&run.tok_per_s),
                unit: "tokens/s",
            });
            if run.cpu > 0.0 {
                rows.push(BenchRow {
                    route: r,
                    what: format!("decode batch {b}, per CPU-second"),
                    value: run.tokens as f64 / run.cpu.max(0.01),
                    unit: "tokens/CPU-s",
                });
            }
            if let Some(base) = base.filter(|_| b > 1) {
                rows.push(BenchRow {
                    route: r,
                    what: format!("decode batch {b} / batch 1 (median of {rounds} paired rounds)"),
                    value: paired_ratio(run, base),
                    unit: "×",
                });
            }
        }
        if route == Route::Fallback {
            // T2's effect on throughput at each batch size, paired round by round.
            for &b in batches {
                let at = |rt: Route| runs.iter().find(|x| x.route == rt && x.batch == b);
                if let (Some(f), Some(p)) = (at(Route::Fallback), at(Route::Primary)) {
                    rows.push(BenchRow {
                        route: r,
                        what: format!(
                            "decode batch {b} / primary batch {b} (median of {rounds} paired rounds)"
                        ),
                        value: paired_ratio(f, p),
                        unit: "×",
                    });
                }
            }
        }
        if ttft_prompt_len > 0 {
            progress(&format!("{r}: TTFT of a {ttft_prompt_len}-token prompt"));
            let prompt: Vec<u32> = (0..ttft_prompt_len)
                .map(|i| ((i * 104_729 + 3) as u32) % vocab)
                .collect();
            let table: Vec<u32> = (0..ttft_prompt_len.div_ceil(bs) as u32).collect();
            let t0 = Instant::now();
            runner.forward(
                route,
                &[SeqChunk {
                    tokens: &prompt,
                    start_pos: 0,
                    block_table: &table,
                }],
            )?;
            rows.push(BenchRow {
                route: r,
                what: format!("TTFT {ttft_prompt_len}-token prompt"),
                value: t0.elapsed().as_secs_f64() * 1e3,
                unit: "ms",
            });
        }
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    if let Some(rss) = rss_before {
        rows.push(BenchRow {
            route: "both",
            what: "resident memory (RSS) loaded and health-checked".into(),
            value: mib(rss),
            unit: "MiB",
        });
    }
    if let Some(rss) = resident_bytes() {
        let seqs: usize = runs.iter().map(|r| r.batch).sum();
        rows.push(BenchRow {
            route: "both",
            what: format!("resident memory (RSS) after, with the K/V of {seqs} sequences"),
            value: mib(rss),
            unit: "MiB",
        });
    }
    Ok(BenchReport {
        model: model.config().name.clone(),
        device: runner.device_name(),
        threads: rayon::current_num_threads(),
        rows,
    })
}

/// The median of `a`'s per-round throughput over `b`'s in the same rounds.
fn paired_ratio(a: &DecodeRun, b: &DecodeRun) -> f64 {
    let ratios: Vec<f64> = a
        .tok_per_s
        .iter()
        .zip(&b.tok_per_s)
        .map(|(x, y)| x / y)
        .collect();
    median(&ratios)
}

impl DecodeRun {
    /// One untimed step (the previous round, another route or batch size, left the caches,
    /// the TLB and the idle worker threads in its own state), then `steps` timed ones.
    fn round(&mut self, runner: &mut ModelRunner, steps: usize) -> Result<(), ModelError> {
        let (mut t0, mut c0) = (Instant::now(), cpu_seconds());
        for step in 0..=steps {
            if step == 1 {
                (t0, c0) = (Instant::now(), cpu_seconds());
            }
            let chunks: Vec<SeqChunk<'_>> = (0..self.batch)
                .map(|s| SeqChunk {
                    tokens: std::slice::from_ref(&self.next[s]),
                    start_pos: self.pos,
                    block_table: &self.tables[s],
                })
                .collect();
            let logits = runner.forward(self.route, &chunks)?;
            self.next = logits.iter().map(|l| argmax(l)).collect();
            self.pos += 1;
        }
        let secs = t0.elapsed().as_secs_f64();
        self.tok_per_s.push((self.batch * steps) as f64 / secs);
        self.tokens += self.batch * steps;
        if let (Some(c0), Some(c1)) = (c0, cpu_seconds()) {
            self.cpu += c1 - c0;
        }
        Ok(())
    }
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
            }
            .prepared(),
        ),
        (
            "Q4_1 repacked",
            Matrix {
                rows,
                cols,
                data: MatData::Quant(GgmlType::Q4_1, quant::quantize(GgmlType::Q4_1, &w)),
            }
            .repacked(),
        ),
    ];
    let mut out = Vec::new();
    for (name, m) in &mats {
        let kernels: &[Kernel] = match &m.data {
            // A packed (repacked) matrix always runs the packed (repacked) kernel.
            MatData::Packed(_) | MatData::Repacked(_) => &[Kernel::Packed],
            MatData::Prepared(_) => &[Kernel::Tiled, Kernel::Simple],
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Device, LoadedModel};

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn interleaved_rounds_report_every_batch_and_the_ratio_to_batch_1() {
        let model = LoadedModel::load("tiny-random", Device::Cpu).expect("tiny-random loads");
        let need = bench_blocks(1, &[1, 4], 10, 8);
        // 16 prompt + 8 rounds × (2 timed + 1 untimed) = 40 positions: 3 blocks a sequence,
        // 5 sequences.
        assert_eq!(need, 15);
        let mut small = ModelRunner::cpu(std::sync::Arc::new(model), need - 1, BENCH_BLOCK);
        let err = bench_model(&mut small, &[Route::Primary], &[1, 4], 10, 8).unwrap_err();
        assert!(err.to_string().contains("needs 15 KV blocks"), "{err}");
        let mut runner = ModelRunner::cpu(small.model.clone(), need, BENCH_BLOCK);
        let report =
            bench_model(&mut runner, &[Route::Primary], &[1, 4], 10, 8).expect("bench runs");
        let one = report
            .get("primary", "decode batch 1")
            .expect("batch 1 row");
        let four = report
            .get("primary", "decode batch 4")
            .expect("batch 4 row");
        assert!(one > 0.0 && four > 0.0, "{one} {four}");
        // 10 steps in 8 rounds: 2 timed steps and an untimed one a round, all within the KV
        // made for them (a step past it would be an error, not a row).
        let ratio = report
            .get(
                "primary",
                &format!("decode batch 4 / batch 1 (median of {BENCH_ROUNDS} paired rounds)"),
            )
            .expect("ratio row");
        assert!(ratio > 0.0 && ratio.is_finite(), "{ratio}");
        assert!(
            report
                .get(
                    "primary",
                    &format!("decode batch 1 / batch 1 (median of {BENCH_ROUNDS} paired rounds)")
                )
                .is_none(),
            "no ratio of batch 1 to itself"
        );
        assert!(report.get("primary", "TTFT 8-token prompt").is_some());
    }
}
