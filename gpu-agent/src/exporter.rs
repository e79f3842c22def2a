//! The Prometheus exporter (`:9400/metrics`): DCGM exporter's names, units and labels for what
//! the probe reads, `brownout_gpu_*`, per-engine `brownout_kv_*` / `brownout_engine_*` with an
//! `engine` label, and the agent's own `brownout_gpu_agent_*` counters.
//!
//! [`render`] is pure (a report and counters in, text out) so that it is golden-tested and
//! checked with `promtool check metrics`; [`router`] serves it.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use brownout_protocol::ErrorBody;

use crate::cycle::{CycleReport, Shared};
use crate::engine::ScrapeErrorKind;
use crate::probe::ProbeKind;
use crate::push::PushCounts;

const MIB: f64 = 1024.0 * 1024.0;

/// What [`render`] needs besides the latest cycle.
#[derive(Debug, Clone)]
pub struct RenderContext<'a> {
    pub host: &'a str,
    /// The configured probe (so a probe that never came up is still labelled right).
    pub probe_kind: ProbeKind,
    pub vram_watermark_ratio: f64,
    /// `None` when the agent pushes nowhere (no push series then).
    pub push: Option<PushCounts>,
}

/// Text-format writer: one `# HELP`/`# TYPE` per family, then its samples.
struct Out {
    buf: String,
}

fn escape(v: &str, out: &mut String) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.buf, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.buf.push_str(name);
        if !labels.is_empty() {
            self.buf.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.buf.push(',');
                }
                self.buf.push_str(k);
                self.buf.push_str("=\"");
                escape(v, &mut self.buf);
                self.buf.push('"');
            }
            self.buf.push('}');
        }
        self.buf.push(' ');
        if value.is_nan() {
            self.buf.push_str("NaN");
        } else if value.is_infinite() {
            self.buf.push_str(if value > 0.0 { "+Inf" } else { "-Inf" });
        } else if value.fract() == 0.0 && value.abs() < 1e15 {
            let _ = write!(self.buf, "{}", value as i64);
        } else {
            let _ = write!(self.buf, "{value}");
        }
        self.buf.push('\n');
    }
}

/// Renders the exposition text. `report` is `None` before the first cycle.
pub fn render(report: Option<&CycleReport>, ctx: &RenderContext<'_>) -> String {
    let mut o = Out {
        buf: String::with_capacity(16 * 1024),
    };
    let simulated = ctx.probe_kind == ProbeKind::Simulated;
    let sim: &[(&str, &str)] = if simulated {
        &[("simulated", "true")]
    } else {
        &[]
    };

    let probe_up = report.is_some_and(|r| r.probe_up);
    o.family("brownout_gpu_probe_up", "gauge", "1 when the GPU probe (NVML, or the simulated probe) answered in the last cycle, 0 otherwise.");
    o.sample(
        "brownout_gpu_probe_up",
        sim,
        if probe_up { 1.0 } else { 0.0 },
    );

    let gpus = report.map_or(&[][..], |r| &r.gpus[..]);
    o.family(
        "brownout_gpu_devices",
        "gauge",
        "GPUs the probe sees on this host.",
    );
    o.sample("brownout_gpu_devices", sim, gpus.len() as f64);

    // Per-GPU labels, DCGM exporter's names; owned strings built once per GPU.
    let idx: Vec<String> = gpus.iter().map(|g| g.stats.index.to_string()).collect();
    let dev: Vec<String> = gpus
        .iter()
        .map(|g| format!("nvidia{}", g.stats.index))
        .collect();
    // DCGM_ series carry dcgm-exporter's labels: `Hostname`, which its shipped Grafana dashboard
    // (grafana/dcgm-exporter-dashboard.json) selects and groups on, and `hostname`, the name its
    // exporter uses since the rename on main (so queries written for either version work).
    let labels: Vec<Vec<(&str, &str)>> = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let mut l = vec![
                ("gpu", idx[i].as_str()),
                ("UUID", g.stats.uuid.as_str()),
                ("device", dev[i].as_str()),
                ("modelName", g.stats.name.as_str()),
                ("Hostname", ctx.host),
                ("hostname", ctx.host),
            ];
            l.extend_from_slice(sim);
            l
        })
        .collect();
    // brownout_gpu_* series follow Prometheus' snake_case label convention.
    let own_labels: Vec<Vec<(&str, &str)>> = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let mut l = vec![
                ("gpu", idx[i].as_str()),
                ("uuid", g.stats.uuid.as_str()),
                ("device", dev[i].as_str()),
                ("gpu_model", g.stats.name.as_str()),
                ("host", ctx.host),
            ];
            l.extend_from_slice(sim);
            l
        })
        .collect();

    type Get = fn(&crate::probe::GpuSample) -> Option<f64>;
    let gpu_families: &[(&str, &str, &str, Get)] = &[
        (
            "DCGM_FI_DEV_FB_FREE",
            "gauge",
            "Framebuffer memory free (in MiB).",
            |g| Some(g.memory_free_bytes as f64 / MIB),
        ),
        (
            "DCGM_FI_DEV_FB_USED",
            "gauge",
            "Framebuffer memory used (in MiB).",
            |g| Some(g.stats.memory_used_bytes as f64 / MIB),
        ),
        (
            "DCGM_FI_DEV_FB_RESERVED",
            "gauge",
            "Framebuffer memory reserved (in MiB).",
            |g| Some(g.stats.memory_reserved_bytes as f64 / MIB),
        ),
        (
            "DCGM_FI_DEV_GPU_UTIL",
            "gauge",
            "GPU utilization (in %).",
            |g| Some((g.stats.gpu_util_ratio * 100.0).round()),
        ),
        (
            "DCGM_FI_DEV_MEM_COPY_UTIL",
            "gauge",
            "Memory utilization (in %).",
            |g| Some((g.stats.mem_util_ratio * 100.0).round()),
        ),
        (
            "DCGM_FI_DEV_GPU_TEMP",
            "gauge",
            "GPU temperature (in C).",
            |g| Some(g.stats.temperature_c),
        ),
        (
            "DCGM_FI_DEV_POWER_USAGE",
            "gauge",
            "Power draw (in W).",
            |g| Some(g.stats.power_w),
        ),
        (
            "DCGM_FI_DEV_SM_CLOCK",
            "gauge",
            "SM clock frequency (in MHz).",
            |g| g.sm_clock_mhz,
        ),
        (
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "gauge",
            "Ratio of time the graphics engine is active.",
            |g| g.gr_engine_active_ratio,
        ),
        (
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "gauge",
            "Ratio of cycles the tensor (HMMA) pipe is active.",
            |g| g.tensor_active_ratio,
        ),
        (
            "DCGM_FI_DEV_XID_ERRORS",
            "gauge",
            "Value of the last XID error encountered.",
            |g| g.last_xid.map(|x| x as f64),
        ),
        (
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            "gauge",
            "Total number of single-bit volatile ECC errors (a gauge: volatile counts reset when the driver reloads).",
            |g| g.ecc_sbe_volatile.map(|x| x as f64),
        ),
        (
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "gauge",
            "Total number of double-bit volatile ECC errors (a gauge: volatile counts reset when the driver reloads).",
            |g| g.ecc_dbe_volatile.map(|x| x as f64),
        ),
        (
            "brownout_gpu_memory_total_bytes",
            "gauge",
            "GPU memory installed, bytes.",
            |g| Some(g.stats.memory_total_bytes as f64),
        ),
        (
            "brownout_gpu_memory_used_bytes",
            "gauge",
            "GPU memory used, bytes.",
            |g| Some(g.stats.memory_used_bytes as f64),
        ),
        (
            "brownout_gpu_memory_reserved_bytes",
            "gauge",
            "GPU memory reserved by the driver and firmware, bytes.",
            |g| Some(g.stats.memory_reserved_bytes as f64),
        ),
        (
            "brownout_gpu_vram_used_ratio",
            "gauge",
            "GPU memory used over total (0-1); alerts fire above the 0.75 watermark.",
            |g| Some(g.stats.vram_used_ratio()),
        ),
        (
            "brownout_gpu_utilization_ratio",
            "gauge",
            "Share of time a kernel ran (0-1).",
            |g| Some(g.stats.gpu_util_ratio),
        ),
        (
            "brownout_gpu_memory_copy_utilization_ratio",
            "gauge",
            "Share of time device memory was read or written (0-1).",
            |g| Some(g.stats.mem_util_ratio),
        ),
    ];
    for (name, kind, help, get) in gpu_families {
        let values: Vec<(usize, f64)> = gpus
            .iter()
            .enumerate()
            .filter_map(|(i, g)| get(g).map(|v| (i, v)))
            .collect();
        if values.is_empty() {
            continue;
        }
        o.family(name, kind, help);
        let l = if name.starts_with("DCGM_") {
            &labels
        } else {
            &own_labels
        };
        for (i, v) in values {
            o.sample(name, &l[i], v);
        }
    }
    if !gpus.is_empty() {
        o.family("brownout_gpu_vram_watermark_exceeded", "gauge", "1 when GPU memory used over total is above the watermark (brownout_gpu_vram_watermark_ratio).");
        for (i, g) in gpus.iter().enumerate() {
            o.sample(
                "brownout_gpu_vram_watermark_exceeded",
                &own_labels[i],
                if g.stats.vram_used_ratio() > ctx.vram_watermark_ratio {
                    1.0
                } else {
                    0.0
                },
            );
        }
    }
    o.family(
        "brownout_gpu_vram_watermark_ratio",
        "gauge",
        "The VRAM watermark in force (0.75, docs/REQUIREMENTS.md R2.2).",
    );
    o.sample(
        "brownout_gpu_vram_watermark_ratio",
        sim,
        ctx.vram_watermark_ratio,
    );

    if gpus.iter().any(|g| !g.processes.is_empty()) {
        o.family(
            "brownout_gpu_process_memory_used_bytes",
            "gauge",
            "GPU memory used by one process, bytes (NVML running compute processes).",
        );
        for (i, g) in gpus.iter().enumerate() {
            for p in &g.processes {
                let pid = p.pid.to_string();
                let mut l = vec![
                    ("gpu", idx[i].as_str()),
                    ("uuid", g.stats.uuid.as_str()),
                    ("host", ctx.host),
                    ("pid", pid.as_str()),
                    ("process", p.name.as_str()),
                ];
                l.extend_from_slice(sim);
                o.sample(
                    "brownout_gpu_process_memory_used_bytes",
                    &l,
                    p.used_bytes as f64,
                );
            }
        }
    }
    if let Some(r) = report {
        o.family(
            "brownout_gpu_probe_errors_total",
            "counter",
            "GPU probe samples that failed.",
        );
        o.sample(
            "brownout_gpu_probe_errors_total",
            sim,
            r.probe_errors_total as f64,
        );
    }

    render_engines(&mut o, report);
    render_agent(&mut o, report, ctx);
    o.buf
}

fn render_engines(o: &mut Out, report: Option<&CycleReport>) {
    let Some(r) = report else { return };
    if r.engines.is_empty() {
        return;
    }
    let ids: Vec<[(&str, &str); 1]> = r
        .engines
        .iter()
        .map(|e| [("engine", e.stats.id.as_str())])
        .collect();
    o.family(
        "brownout_engine_up",
        "gauge",
        "1 when the last scrape of the engine's /metrics succeeded.",
    );
    for (i, e) in r.engines.iter().enumerate() {
        o.sample(
            "brownout_engine_up",
            &ids[i],
            if e.stats.up { 1.0 } else { 0.0 },
        );
    }
    o.family(
        "brownout_gpu_agent_engine_scrape_errors_total",
        "counter",
        "Failed engine scrapes by kind (connect, http_status, parse).",
    );
    for e in &r.engines {
        for kind in ScrapeErrorKind::ALL {
            o.sample(
                "brownout_gpu_agent_engine_scrape_errors_total",
                &[("engine", e.stats.id.as_str()), ("kind", kind.as_str())],
                e.scrape_errors[kind as usize] as f64,
            );
        }
    }
    o.family(
        "brownout_gpu_agent_engine_scrape_duration_seconds",
        "gauge",
        "How long the last scrape of the engine took.",
    );
    for (i, e) in r.engines.iter().enumerate() {
        o.sample(
            "brownout_gpu_agent_engine_scrape_duration_seconds",
            &ids[i],
            e.scrape_duration.as_secs_f64(),
        );
    }
    // A down engine has no current figures to show.
    if !r.engines.iter().any(|e| e.stats.up) {
        return;
    }
    o.family(
        "brownout_engine_info",
        "gauge",
        "The model an engine serves and whether it is the bundled tier (always 1).",
    );
    for e in r.engines.iter().filter(|e| e.stats.up) {
        let kind = if e.bundled { "brownout" } else { "vllm" };
        o.sample(
            "brownout_engine_info",
            &[
                ("engine", e.stats.id.as_str()),
                ("model_name", e.stats.model.as_str()),
                ("kind", kind),
            ],
            1.0,
        );
    }
    type Get = fn(&crate::engine::EngineReport) -> f64;
    let families: &[(&str, &str, &str, Get)] = &[
        (
            "brownout_kv_usage_ratio",
            "gauge",
            "KV-cache blocks in use over usable blocks (vLLM's kv_cache_usage_perc, 0-1).",
            |e| e.stats.kv.usage_ratio,
        ),
        (
            "brownout_kv_blocks_usable",
            "gauge",
            "Usable KV-cache blocks.",
            |e| e.stats.kv.num_blocks_total as f64,
        ),
        (
            "brownout_kv_blocks_used",
            "gauge",
            "KV-cache blocks in use.",
            |e| e.stats.kv.num_blocks_used as f64,
        ),
        (
            "brownout_kv_block_size_tokens",
            "gauge",
            "Tokens per KV-cache block (0 when the engine does not say).",
            |e| f64::from(e.stats.kv.block_size),
        ),
        (
            "brownout_kv_internal_fragmentation_ratio",
            "gauge",
            "Slack in each sequence's last block over blocks in use times block size.",
            |e| e.stats.kv.internal_fragmentation_ratio,
        ),
        (
            "brownout_kv_reserved_unused_ratio",
            "gauge",
            "Whole blocks allocated ahead of tokens over blocks in use times block size.",
            |e| e.stats.kv.reserved_unused_ratio,
        ),
        (
            "brownout_kv_token_occupancy_ratio",
            "gauge",
            "Share of in-use block slots that hold tokens.",
            |e| e.stats.kv.token_occupancy_ratio,
        ),
        (
            "brownout_kv_external_fragmentation_ratio",
            "gauge",
            "1 - largest free run over free blocks (0 for paging).",
            |e| e.stats.kv.external_fragmentation_ratio,
        ),
        (
            "brownout_engine_requests_running",
            "gauge",
            "Requests in the engine's running batch.",
            |e| e.stats.num_requests_running as f64,
        ),
        (
            "brownout_engine_requests_waiting",
            "gauge",
            "Requests waiting to be scheduled.",
            |e| e.stats.num_requests_waiting as f64,
        ),
        (
            "brownout_engine_preemptions_total",
            "counter",
            "Preemptions the engine reported (vllm:num_preemptions_total).",
            |e| e.stats.num_preemptions_total as f64,
        ),
        (
            "brownout_engine_tier",
            "gauge",
            "Degradation tier the engine has applied (0-3; 0 for engines that do not report one).",
            |e| f64::from(e.stats.tier),
        ),
    ];
    for (name, kind, help, get) in families {
        // Fragmentation ratios exist only where the engine computes them (the bundled tier).
        let needs_frag = name.ends_with("fragmentation_ratio")
            || name.ends_with("reserved_unused_ratio")
            || name.ends_with("token_occupancy_ratio");
        if needs_frag
            && !r
                .engines
                .iter()
                .any(|e| e.stats.up && e.fragmentation_known)
        {
            continue;
        }
        o.family(name, kind, help);
        for (i, e) in r
            .engines
            .iter()
            .enumerate()
            .filter(|(_, e)| e.stats.up && (!needs_frag || e.fragmentation_known))
        {
            o.sample(name, &ids[i], get(e));
        }
    }
    if r.engines.iter().any(|e| e.ttft_known) {
        // Two gauges rather than a `quantile` label: promtool reserves that label for summaries.
        for (name, help, get) in [
            (
                "brownout_engine_ttft_p50_seconds",
                "Median time to first token over the recent scrape window (vllm:time_to_first_token_seconds buckets).",
                0,
            ),
            (
                "brownout_engine_ttft_p99_seconds",
                "99th percentile time to first token over the recent scrape window (vllm:time_to_first_token_seconds buckets).",
                1,
            ),
        ] {
            o.family(name, "gauge", help);
            for e in r.engines.iter().filter(|e| e.stats.up && e.ttft_known) {
                let v = if get == 0 {
                    e.stats.ttft_p50_s
                } else {
                    e.stats.ttft_p99_s
                };
                o.sample(name, &[("engine", e.stats.id.as_str())], v);
            }
        }
    }
}

fn render_agent(o: &mut Out, report: Option<&CycleReport>, ctx: &RenderContext<'_>) {
    o.family(
        "brownout_gpu_agent_cycles_total",
        "counter",
        "Scrape-probe-snapshot cycles completed.",
    );
    o.sample(
        "brownout_gpu_agent_cycles_total",
        &[],
        report.map_or(0.0, |r| r.cycles_total as f64),
    );
    if let Some(r) = report {
        o.family(
            "brownout_gpu_agent_cycle_duration_seconds",
            "gauge",
            "How long the last cycle took.",
        );
        o.sample(
            "brownout_gpu_agent_cycle_duration_seconds",
            &[],
            r.cycle_duration.as_secs_f64(),
        );
    }
    if let Some(p) = ctx.push {
        let counters: [(&str, &str, u64); 4] = [
            (
                "brownout_gpu_agent_snapshots_pushed_total",
                "Snapshots the control plane accepted.",
                p.pushed,
            ),
            (
                "brownout_gpu_agent_snapshot_push_failures_total",
                "Snapshot push attempts that failed and were retried.",
                p.failed_attempts,
            ),
            (
                "brownout_gpu_agent_snapshots_dropped_total",
                "Snapshots dropped because the queue was full (oldest first).",
                p.dropped,
            ),
            (
                "brownout_gpu_agent_snapshots_rejected_total",
                "Snapshots the control plane refused with a 4xx (not retried).",
                p.rejected,
            ),
        ];
        for (name, help, v) in counters {
            o.family(name, "counter", help);
            o.sample(name, &[], v as f64);
        }
        o.family(
            "brownout_gpu_agent_snapshot_queue_length",
            "gauge",
            "Snapshots waiting to be pushed.",
        );
        o.sample(
            "brownout_gpu_agent_snapshot_queue_length",
            &[],
            p.queued as f64,
        );
        o.family(
            "brownout_gpu_agent_snapshot_queue_capacity",
            "gauge",
            "Snapshots kept while the control plane is unreachable.",
        );
        o.sample(
            "brownout_gpu_agent_snapshot_queue_capacity",
            &[],
            p.capacity as f64,
        );
    }
}

impl Shared {
    /// The latest cycle as Prometheus text (what `GET /metrics` answers).
    pub fn render_metrics(&self) -> String {
        let latest = self.latest();
        render(
            latest.as_deref(),
            &RenderContext {
                host: &self.host,
                probe_kind: self.probe_kind,
                vram_watermark_ratio: self.vram_watermark_ratio,
                push: self.queue.as_ref().map(|q| q.counts()),
            },
        )
    }
}

/// `GET /metrics`, `GET /healthz`, `GET /v1/snapshot` (the latest snapshot as JSON). Errors
/// answer the control plane's JSON error body ([`ErrorBody`]): 404 `not_found` on an unknown
/// path, 405 `method_not_allowed` on a known path with another method.
pub fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/v1/snapshot", get(snapshot))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "not_found", "no such route") })
        .method_not_allowed_fallback(|| async {
            error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method",
            )
        })
        .with_state(shared)
}

/// An error answer: `status` with `{"error": {"code", "message"}}`.
fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (status, axum::Json(ErrorBody::new(code, message))).into_response()
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    let body = shared.render_metrics();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn snapshot(State(shared): State<Arc<Shared>>) -> Response {
    match shared.latest() {
        Some(r) => axum::Json(r.snapshot.clone()).into_response(),
        None => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_snapshot_yet",
            "the first cycle has not finished",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serves `router` on a free port; the base URL.
    async fn serve(shared: Arc<Shared>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router(shared)).await });
        url
    }

    #[tokio::test]
    async fn errors_answer_the_control_planes_json_error_body() {
        let shared = Arc::new(Shared {
            host: "h".into(),
            probe_kind: ProbeKind::Simulated,
            vram_watermark_ratio: 0.9,
            latest: tokio::sync::watch::channel(None).0,
            queue: None,
        });
        let url = serve(shared).await;
        crate::ensure_crypto_provider();
        let client = reqwest::Client::new();
        let cases = [
            (client.get(format!("{url}/nope")), 404, "not_found"),
            (
                client.post(format!("{url}/metrics")),
                405,
                "method_not_allowed",
            ),
            (
                client.get(format!("{url}/v1/snapshot")),
                503,
                "no_snapshot_yet",
            ),
        ];
        for (req, status, code) in cases {
            let r = req.send().await.unwrap();
            assert_eq!(r.status().as_u16(), status, "{code}");
            assert!(
                r.headers()["content-type"]
                    .to_str()
                    .unwrap()
                    .starts_with("application/json"),
                "{code}"
            );
            let text = r.text().await.unwrap();
            let body: ErrorBody = serde_json::from_str(&text).unwrap();
            assert_eq!(body.error.code, code);
            // Byte for byte the protocol's body (the control plane's, tests/it/error_body.rs).
            assert_eq!(text, ErrorBody::new(code, &body.error.message).to_json());
        }
    }
}
