//! Model benchmark: `cargo run --release -p brownout-serving --example bench_model -- [spec]
//! [steps] [batches] [ttft-prompt-len]` (spec: smollm2 (default), tiny-random or a .gguf path).
//! Prints a Markdown table. `BENCH_DEVICE=cpu|cuda|auto` (default auto: CUDA where a usable
//! device exists) places the model like `brownout-serve --device`; `BENCH_ROUTES=primary` (or
//! `fallback`) measures one route; `BENCH_MATMUL=1` adds the kernel-only matmul figures.

use std::sync::Arc;

use brownout_serving::model::{
    BENCH_BLOCK, Device, LoadedModel, ModelRunner, Route, bench_blocks, bench_matmul, bench_model,
};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let spec = args.get(1).map_or("smollm2", String::as_str);
    let steps: usize = args.get(2).map_or(Ok(16), |s| s.parse())?;
    let batches: Vec<usize> = match args.get(3) {
        Some(s) => s.split(',').map(str::parse).collect::<Result<_, _>>()?,
        None => vec![1, 8, 32],
    };
    let ttft: usize = args.get(4).map_or(Ok(512), |s| s.parse())?;
    let device: Device = std::env::var("BENCH_DEVICE")
        .unwrap_or_else(|_| "auto".into())
        .parse()
        .map_err(|e: String| anyhow::anyhow!(e))?;
    let t0 = std::time::Instant::now();
    let model = Arc::new(LoadedModel::load(spec, device)?);
    eprintln!("loaded {} in {:.2?}", model.source(), t0.elapsed());
    let routes: Vec<Route> = match std::env::var("BENCH_ROUTES").as_deref() {
        Ok("primary") => vec![Route::Primary],
        Ok("fallback") => vec![Route::Fallback],
        _ => vec![Route::Primary, Route::Fallback],
    };
    let blocks = bench_blocks(routes.len(), &batches, steps, ttft);
    let mut runner = ModelRunner::with_device(model, blocks, BENCH_BLOCK, device)?;
    eprintln!("device: {}", runner.device_name());
    for h in runner.health_check()? {
        eprintln!(
            "health {:?}: {:?} ({:.0} ms)",
            h.route, h.generated, h.elapsed_ms
        );
    }
    let mut report = bench_model(&mut runner, &routes, &batches, steps, ttft)?;
    if std::env::var_os("BENCH_MATMUL").is_some() {
        // SmolLM2's gate+up matrix: 3072 × 576.
        report.rows.extend(bench_matmul(3072, 576, &[1, 32], 20));
    }
    println!("{}", report.to_markdown());
    Ok(())
}
