//! Model benchmark: `cargo run --release -p brownout-serving --example bench_model -- [spec]
//! [steps] [batches] [ttft-prompt-len]` (spec: smollm2 (default), tiny-random or a .gguf path).
//! Prints a Markdown table; progress goes to stderr. `BENCH_DEVICE=cpu|cuda|auto` (default
//! auto: CUDA where a usable device exists) places the model like `brownout-serve --device`;
//! `BENCH_ROUTES=primary` (or `fallback`) measures one route; `BENCH_MATMUL=1` adds the
//! kernel-only matmul figures; `BENCH_CAPACITY_SECS=30` adds the capacity per route (calls/s,
//! flows/s). The same as `brownout-serve bench model`.

use brownout_serving::model::{Device, Route, bench_matmul};
use brownout_serving::scheduler::{BenchSpec, bench_spec};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let device: Device = std::env::var("BENCH_DEVICE")
        .unwrap_or_else(|_| "auto".into())
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))?;
    let spec = BenchSpec {
        model: args.get(1).cloned().unwrap_or_else(|| "smollm2".into()),
        device,
        routes: match std::env::var("BENCH_ROUTES").as_deref() {
            Ok("primary") => vec![Route::Primary],
            Ok("fallback") => vec![Route::Fallback],
            _ => vec![Route::Primary, Route::Fallback],
        },
        batches: match args.get(3) {
            Some(s) => s.split(',').map(str::parse).collect::<Result<_, _>>()?,
            None => vec![1, 8, 32],
        },
        decode_steps: args.get(2).map_or(Ok(16), |s| s.parse())?,
        ttft_prompt_len: args.get(4).map_or(Ok(512), |s| s.parse())?,
        capacity_secs: std::env::var("BENCH_CAPACITY_SECS").map_or(Ok(0.0), |s| s.parse())?,
    };
    let mut report = bench_spec(&spec, &mut |line| eprintln!("{line}"))?;
    if std::env::var_os("BENCH_MATMUL").is_some() {
        // SmolLM2's gate+up matrix: 3072 × 576.
        report.rows.extend(bench_matmul(3072, 576, &[1, 32], 20));
    }
    println!("{}", report.to_markdown());
    Ok(())
}
