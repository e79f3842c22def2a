//! The engine's benchmarks over the real model: [`capacity`] (the real engine — scheduler,
//! continuous batching, chunked prefill, prefix caching — driven in a closed loop over a
//! [`ModelRunner`]) and [`bench_spec`] (`brownout-serve bench model` and the `bench_model`
//! example: the model's decode/TTFT benchmark of [`crate::model::bench_model_with_progress`],
//! then the capacity). Here, above the model, because they run the engine.

use std::time::Instant;

use super::batch::SchedulerConfig;
use super::engine::{EngineConfig, EngineRequest, ModelBackend, SeqEvent, spawn_engine};
use super::sampling::SamplingParams;
use crate::metrics::Metrics;
use crate::model::{
    BENCH_BLOCK, BenchReport, BenchRow, ChatMessage, Device, LoadedModel, ModelError, ModelRunner,
    Route, SeqChunk, bench_blocks, bench_model_with_progress, median,
};

/// What [`bench_spec`] measures.
#[derive(Debug, Clone)]
pub struct BenchSpec {
    /// `smollm2`, `tiny-random` or a `.gguf` path.
    pub model: String,
    pub device: Device,
    pub routes: Vec<Route>,
    pub batches: Vec<usize>,
    pub decode_steps: usize,
    pub ttft_prompt_len: usize,
    /// Seconds of the closed-loop capacity measurement ([`capacity`]), split between the routes
    /// in alternating slices; 0 skips it.
    pub capacity_secs: f64,
}

/// Loads the model, places it on the device with as many KV blocks as the run needs, runs the
/// start-up health check there, then [`bench_model_with_progress`]. For `brownout-serve bench
/// model` and the `bench_model` example.
///
/// # Errors
/// Loading, placing, the health check, or the benchmark.
pub fn bench_spec(
    spec: &BenchSpec,
    progress: &mut dyn FnMut(&str),
) -> Result<BenchReport, ModelError> {
    if spec.batches.is_empty() || spec.batches.contains(&0) || spec.routes.is_empty() {
        return Err(ModelError::InvalidInput(
            "the benchmark needs at least one route and batch sizes of at least 1".into(),
        ));
    }
    let t0 = Instant::now();
    let model = std::sync::Arc::new(LoadedModel::load(&spec.model, spec.device)?);
    progress(&format!(
        "loaded {} in {:.2} s",
        model.source(),
        t0.elapsed().as_secs_f64()
    ));
    let blocks = bench_blocks(
        spec.routes.len(),
        &spec.batches,
        spec.decode_steps,
        spec.ttft_prompt_len,
    );
    let mut runner = ModelRunner::with_device(model.clone(), blocks, BENCH_BLOCK, spec.device)?;
    progress(&format!("device: {}", runner.device_name()));
    for h in runner.health_check()? {
        progress(&format!(
            "health check {}: {:?} ({:.0} ms)",
            h.route.as_str(),
            h.generated,
            h.elapsed_ms
        ));
    }
    let mut report = bench_model_with_progress(
        &mut runner,
        &spec.routes,
        &spec.batches,
        spec.decode_steps,
        spec.ttft_prompt_len,
        progress,
    )?;
    drop(runner);
    if spec.capacity_secs > 0.0 {
        let cap = capacity(
            model,
            spec.device,
            &spec.routes,
            &CapacitySpec {
                secs: spec.capacity_secs,
                ..CapacitySpec::default()
            },
            progress,
        )?;
        report.rows.extend(cap);
    }
    Ok(report)
}

/// Calls per flow of `brownout bench overload`'s load mix (`FlowKind::MIX` in the root
/// crate's `src/loadgen/plan.rs`: Login 10 % × 1 call, BasicQa 20 % × 2, Chat 25 % × 2,
/// TripPlanner 10 % × 4, PdfAnalysis 15 % × 3, ImageGeneration 10 % × 1, MultilingualEmail
/// 10 % × 2); this crate cannot see that table, so the two are kept in step by hand.
pub const OVERLOAD_CALLS_PER_FLOW: f64 = 2.15;

/// How [`capacity`] loads the engine: `brownout bench overload`'s calibration
/// (`measure_capacity` in the root crate's `src/demo/overload.rs`) with its engine settings
/// (the demo world's `ServeOptions`).
#[derive(Debug, Clone)]
pub struct CapacitySpec {
    /// Seconds in all, split into alternating slices per route.
    pub secs: f64,
    /// Slices per route.
    pub slices: usize,
    /// Calls in flight (closed loop): the engine's `max_num_seqs`.
    pub concurrency: usize,
    pub max_tokens: usize,
    pub num_blocks: usize,
    pub max_num_batched_tokens: usize,
    /// The user message of every call.
    pub prompt: &'static str,
}

impl Default for CapacitySpec {
    fn default() -> CapacitySpec {
        CapacitySpec {
            secs: 30.0,
            slices: 3,
            concurrency: 16,
            max_tokens: 24,
            num_blocks: 256,
            max_num_batched_tokens: 256,
            prompt: "Help me write a short note to a colleague.",
        }
    }
}

/// The real engine (scheduler, continuous batching, chunked prefill, prefix caching) over a
/// [`ModelRunner`].
struct RunnerBackend(ModelRunner);

impl ModelBackend for RunnerBackend {
    fn forward(&mut self, route: Route, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, String> {
        self.0.forward(route, chunks).map_err(|e| e.to_string())
    }
}

/// Capacity per route as `brownout bench overload` calibrates it: `concurrency` clients in a
/// closed loop, each sending the chat-templated `prompt` with `max_tokens` (temperature 1, the
/// client's index as seed) and sending the next call when one finishes; calls completed per
/// second; flows per second = calls per second / [`OVERLOAD_CALLS_PER_FLOW`]. Unlike that
/// benchmark it drives the engine directly, not through HTTP, and pins the route of every
/// call. The routes take turns in `slices` slices each (the clients finish their calls
/// between slices), so both see the same machine; the ratio is the median of the per-pair
/// ratios.
///
/// # Errors
/// Placing the model, starting the engine, or a call that fails.
pub fn capacity(
    model: std::sync::Arc<LoadedModel>,
    device: Device,
    routes: &[Route],
    spec: &CapacitySpec,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<BenchRow>, ModelError> {
    let runner = ModelRunner::with_device(model.clone(), spec.num_blocks, BENCH_BLOCK, device)?;
    let c = model.config();
    let cfg = EngineConfig {
        model_name: c.name.clone(),
        sched: SchedulerConfig {
            max_num_seqs: spec.concurrency.max(1),
            max_num_batched_tokens: spec.max_num_batched_tokens,
            max_model_len: c.max_model_len,
            ..Default::default()
        },
        kv: crate::kvcache::KvConfig {
            num_blocks: spec.num_blocks,
            block_size: BENCH_BLOCK,
            mode: crate::kvcache::AllocMode::Paged,
            enable_prefix_caching: true,
        },
        eos_token_ids: c.eos_token_ids.clone(),
        ..EngineConfig::default()
    };
    let metrics = std::sync::Arc::new(Metrics::new(&c.name));
    let (engine, join) = spawn_engine(cfg, RunnerBackend(runner), metrics, None)
        .map_err(|e| ModelError::InvalidInput(format!("starting the engine thread: {e}")))?;
    let prompt = model.encode_chat(&[ChatMessage::new("user", spec.prompt)]);
    let slice = std::time::Duration::from_secs_f64(
        spec.secs / (spec.slices.max(1) * routes.len().max(1)) as f64,
    );
    // (route, calls, seconds) per slice, in order.
    let mut done: Vec<(Route, usize, f64)> = Vec::new();
    for k in 0..spec.slices.max(1) * routes.len() {
        let route = routes[k % routes.len()];
        let t0 = Instant::now();
        let deadline = t0 + slice;
        let calls = std::thread::scope(|sc| -> Result<usize, ModelError> {
            let clients: Vec<_> = (0..spec.concurrency.max(1))
                .map(|i| {
                    let (engine, prompt) = (&engine, &prompt);
                    sc.spawn(move || -> Result<usize, String> {
                        let mut n = 0;
                        while Instant::now() < deadline {
                            let req = EngineRequest {
                                prompt: prompt.clone(),
                                params: SamplingParams {
                                    temperature: 1.0,
                                    seed: Some(i as u64),
                                    max_tokens: spec.max_tokens,
                                    ..Default::default()
                                },
                                criticality: brownout_protocol::Criticality::Default,
                                route,
                            };
                            let (_, mut rx) = engine.submit(req).map_err(|e| e.to_string())?;
                            loop {
                                match rx.blocking_recv() {
                                    Some(SeqEvent::Token(_)) => {}
                                    Some(SeqEvent::Finished { .. }) => break,
                                    Some(SeqEvent::Failed { message, .. }) => return Err(message),
                                    None => return Err("the engine stopped".into()),
                                }
                            }
                            n += 1;
                        }
                        Ok(n)
                    })
                })
                .collect();
            let mut total = 0;
            for c in clients {
                total += c
                    .join()
                    .map_err(|_| ModelError::InvalidInput("a client thread panicked".into()))?
                    .map_err(|m| ModelError::InvalidInput(format!("capacity call failed: {m}")))?;
            }
            Ok(total)
        })?;
        let secs = t0.elapsed().as_secs_f64();
        progress(&format!(
            "capacity slice {}/{} {}: {calls} calls in {secs:.1} s ({:.2} calls/s)",
            k + 1,
            spec.slices.max(1) * routes.len(),
            route.as_str(),
            calls as f64 / secs
        ));
        done.push((route, calls, secs));
    }
    drop(engine);
    let _ = join.join();
    let mut rows = Vec::new();
    let rate = |r: Route| {
        let (n, s) = done
            .iter()
            .filter(|d| d.0 == r)
            .fold((0usize, 0f64), |a, d| (a.0 + d.1, a.1 + d.2));
        n as f64 / s.max(1e-9)
    };
    for &route in routes {
        let calls = rate(route);
        rows.push(BenchRow {
            route: route.as_str(),
            what: format!(
                "capacity, {} calls in flight, max_tokens {} (calls/s)",
                spec.concurrency, spec.max_tokens
            ),
            value: calls,
            unit: "calls/s",
        });
        rows.push(BenchRow {
            route: route.as_str(),
            what: format!("capacity, flows/s ({OVERLOAD_CALLS_PER_FLOW} calls per flow)"),
            value: calls / OVERLOAD_CALLS_PER_FLOW,
            unit: "flows/s",
        });
    }
    if routes.contains(&Route::Primary) && routes.contains(&Route::Fallback) {
        let per = |r: Route| -> Vec<f64> {
            done.iter()
                .filter(|d| d.0 == r)
                .map(|d| d.1 as f64 / d.2)
                .collect()
        };
        let ratios: Vec<f64> = per(Route::Fallback)
            .iter()
            .zip(per(Route::Primary))
            .map(|(f, p)| f / p.max(1e-9))
            .collect();
        rows.push(BenchRow {
            route: "fallback",
            what: format!(
                "capacity / primary capacity (median of {} paired slices)",
                ratios.len()
            ),
            value: median(&ratios),
            unit: "×",
        });
    }
    Ok(rows)
}
