//! [`SampleDataSource`]: an in-memory [`UiDataSource`] over fixed, realistic sample data (an
//! evening peak on a five-host GPU cluster, with the thresholds of docs/REQUIREMENTS.md R2), for
//! the web tests and the screenshots (`scripts/screenshots.sh`). Every page it feeds says
//! "sample data". Dev-only: the control plane never serves it.
//!
//! All names come from a [`Vocabulary`], so tests can replace every user-controlled string with
//! hostile input (the XSS test does) and keep the same shape of data.

use std::collections::BTreeMap;

use brownout_protocol::{
    AgentSnapshot, Category, Criticality, EngineStats, GpuStats, KvStats, Reason, Tier,
};
use futures::future::{BoxFuture, FutureExt};

use brownout::store::{LogHit, LogPage, LogQuery, LogRow, SpanRow};
use brownout::web::model::*;

/// Every string the sample data shows that would be user- or operator-controlled in production.
/// Lists are used round-robin; names must be unique within a list.
#[derive(Debug, Clone, PartialEq)]
pub struct Vocabulary {
    /// Three clusters.
    pub clusters: Vec<String>,
    /// Five hosts (three fresh, one stale, one down).
    pub hosts: Vec<String>,
    /// Four services.
    pub services: Vec<String>,
    /// Model names served by the engines.
    pub models: Vec<String>,
    /// Three SLOs.
    pub slos: Vec<String>,
    /// Failure pattern templates.
    pub templates: Vec<String>,
    /// Raw log messages.
    pub messages: Vec<String>,
    /// Details of degradation reasons.
    pub details: Vec<String>,
    /// Features named in log lines.
    pub features: Vec<String>,
    /// Prefix of trace links (`{prefix}{trace_id}`); may be anything, only http(s) is linked.
    pub trace_url_prefix: String,
}

impl Default for Vocabulary {
    fn default() -> Self {
        let v = |xs: &[&str]| xs.iter().map(|s| (*s).to_string()).collect::<Vec<_>>();
        Vocabulary {
            clusters: v(&["prod-cn-east", "prod-us-west", "staging"]),
            hosts: v(&[
                "gpu-a100-01",
                "gpu-a100-02",
                "gpu-h100-03",
                "gpu-h100-04",
                "gpu-l40s-05",
            ]),
            services: v(&[
                "chat-gateway",
                "agent-orchestrator",
                "pdf-analysis",
                "image-generation",
            ]),
            models: v(&[
                "llama-3-70b-instruct",
                "phi-3-mini-4k",
                "smollm2-135m-instruct",
            ]),
            slos: v(&["chat-availability", "chat-ttft-p99", "agent-success"]),
            templates: v(&[
                "AgentExecutionFailed: resource_quota_exhausted (queue wait <*> ms)",
                "Tool Execution Timeout: tool=<*> after <*> s",
                "KV cache exhausted: cannot allocate <*> blocks for request <*>",
                "LLM Gateway 503 Rate Limit Exceeded for model <*>",
                "ServiceDegradedError: fallback_to_basic_mode after <*> ms",
                "protobuf encode error: payload <*> MB exceeds limit",
            ]),
            messages: v(&[
                "AgentExecutionFailed: resource_quota_exhausted (queue wait 2310 ms)",
                "Tool Execution Timeout: tool=web_search after 8 s",
                "KV cache exhausted: cannot allocate 12 blocks for request req-8f3a21",
                "LLM Gateway 503 Rate Limit Exceeded for model llama-3-70b-instruct",
                "ServiceDegradedError: fallback_to_basic_mode after 4500 ms",
                "protobuf encode error: payload 4.7 MB exceeds limit",
            ]),
            details: v(&[
                "fast burn pair above 14.4x",
                "KV usage 93% > 92% for 1m on gpu-a100-01/engine-0",
                "GPU util 99.6% > 99.5% for 30s",
                "burn rates back under exit thresholds for 10m",
            ]),
            features: v(&[
                "basic_qa",
                "pdf_analysis",
                "image_generation",
                "multilingual_email",
            ]),
            trace_url_prefix: "http://jaeger.internal:16686/trace/".into(),
        }
    }
}

/// In-memory [`UiDataSource`] over sample data generated once at construction.
#[derive(Debug, Clone)]
pub struct SampleDataSource {
    now_ms: u64,
    vocab: Vocabulary,
    hosts: Vec<HostSummary>,
    services: Vec<ServiceSummary>,
    /// service name → its instances.
    service_to_instances: BTreeMap<String, Vec<InstanceSummary>>,
    patterns: Vec<PatternDetail>,
    slos: Vec<SloDetail>,
    clusters: Vec<ClusterDegradation>,
}

const MIN: u64 = 60_000;
const GIB: u64 = 1 << 30;

fn pick(xs: &[String], i: usize) -> String {
    xs.get(i % xs.len().max(1)).cloned().unwrap_or_default()
}

/// A smooth deterministic wiggle in [-1, 1] (no RNG: screenshots and tests are reproducible).
fn wiggle(seed: usize, i: usize) -> f64 {
    let x = i as f64 * 0.37 + seed as f64 * 1.7;
    (x.sin() * 0.6 + (x * 2.3).cos() * 0.4).clamp(-1.0, 1.0)
}

/// `n` points ending at `now_ms`, `step_ms` apart, from `f(i)`.
fn series(now_ms: u64, n: usize, step_ms: u64, f: impl Fn(usize) -> f64) -> Vec<Point> {
    (0..n)
        .map(|i| Point {
            ts_ms: now_ms - (n - 1 - i) as u64 * step_ms,
            value: f(i),
        })
        .collect()
}

impl SampleDataSource {
    /// Sample data with realistic names, as of `now_ms`.
    pub fn new(now_ms: u64) -> SampleDataSource {
        SampleDataSource::with_vocabulary(now_ms, Vocabulary::default())
    }

    /// Sample data using `vocab` for every displayed name and message.
    pub fn with_vocabulary(now_ms: u64, vocab: Vocabulary) -> SampleDataSource {
        // Floor: the longest series reaches 30 days back, and timestamps are unsigned.
        let now = now_ms.max(60 * 24 * 60 * MIN);
        let hosts = build_hosts(now, &vocab);
        let (services, service_to_instances) = build_services(now, &vocab, &hosts);
        let patterns = build_patterns(now, &vocab);
        let slos = build_slos(now, &vocab);
        let clusters = build_clusters(now, &vocab, &service_to_instances);
        SampleDataSource {
            now_ms: now,
            vocab,
            hosts,
            services,
            service_to_instances,
            patterns,
            slos,
            clusters,
        }
    }

    /// The hosts, for tests that want to build URLs.
    pub fn host_names(&self) -> Vec<String> {
        self.hosts.iter().map(|h| h.host.clone()).collect()
    }

    /// `(service, instance)` pairs, for tests that want to build URLs.
    pub fn instance_names(&self) -> Vec<(String, String)> {
        self.service_to_instances
            .iter()
            .flat_map(|(s, is)| is.iter().map(move |i| (s.clone(), i.instance.clone())))
            .collect()
    }

    fn overview_now(&self) -> OverviewView {
        OverviewView {
            origin: DataOrigin::Sample,
            generated_at_ms: self.now_ms,
            clusters: self.clusters.iter().map(|c| c.current.clone()).collect(),
            slos: self.slos.iter().map(|s| s.summary.clone()).collect(),
            hosts: self.hosts.clone(),
            services: self.services.clone(),
            top_patterns: self
                .patterns
                .iter()
                .take(5)
                .map(|p| p.summary.clone())
                .collect(),
        }
    }

    fn host_detail(&self, name: &str) -> Result<HostDetailView, UiError> {
        let (idx, host) = self
            .hosts
            .iter()
            .enumerate()
            .find(|(_, h)| h.host == name)
            .ok_or_else(|| UiError::not_found("host", name))?;
        let now = self.now_ms;
        let base_vram = host.snapshot.max_vram_ratio();
        let kv_series = host
            .snapshot
            .engines
            .iter()
            .enumerate()
            .map(|(e, eng)| Series {
                name: eng.id.clone(),
                points: series(now, 60, MIN, |i| {
                    (eng.kv.usage_ratio - 0.25 * (59 - i) as f64 / 59.0
                        + 0.04 * wiggle(idx * 7 + e, i))
                    .clamp(0.0, 1.0)
                }),
            })
            .collect();
        let instances = self
            .service_to_instances
            .iter()
            .flat_map(|(s, is)| {
                is.iter()
                    .filter(|i| i.host == host.host)
                    .map(move |i| InstanceRef {
                        service: s.clone(),
                        instance: i.instance.clone(),
                    })
            })
            .collect();
        Ok(HostDetailView {
            origin: DataOrigin::Sample,
            generated_at_ms: now,
            host: host.clone(),
            vram_series: series(now, 60, MIN, |i| {
                (base_vram - 0.12 * (59 - i) as f64 / 59.0 + 0.02 * wiggle(idx, i)).clamp(0.0, 1.0)
            }),
            kv_series,
            queue_series: series(now, 60, MIN, |i| {
                (host.snapshot.queue_depth() as f64 * (0.4 + 0.6 * i as f64 / 59.0)
                    + 3.0 * wiggle(idx + 3, i))
                .max(0.0)
                .round()
            }),
            instances,
        })
    }

    fn service_view(&self, name: &str) -> Result<ServiceView, UiError> {
        let service = self
            .services
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| UiError::not_found("service", name))?;
        Ok(ServiceView {
            origin: DataOrigin::Sample,
            generated_at_ms: self.now_ms,
            service: service.clone(),
            instances: self
                .service_to_instances
                .get(name)
                .cloned()
                .unwrap_or_default(),
        })
    }

    fn instance_view(&self, service: &str, instance: &str) -> Result<InstanceView, UiError> {
        let insts = self
            .service_to_instances
            .get(service)
            .ok_or_else(|| UiError::not_found("service", service))?;
        let (idx, inst) = insts
            .iter()
            .enumerate()
            .find(|(_, i)| i.instance == instance)
            .ok_or_else(|| UiError::not_found("instance", instance))?;
        let engine = self
            .hosts
            .iter()
            .find(|h| h.host == inst.host)
            .and_then(|h| {
                h.snapshot
                    .engines
                    .get(idx % h.snapshot.engines.len().max(1))
                    .cloned()
            });
        let v = &self.vocab;
        let cats = [
            Category::TimeoutResource,
            Category::ToolUnavailable,
            Category::KvCacheExhausted,
            Category::RateLimited,
            Category::Degraded,
            Category::SerializationError,
        ];
        let logs = (0..14)
            .map(|i| {
                let k = (i * 5 + idx) % 6;
                LogLine {
                    ts_ms: self.now_ms - (i as u64) * 47_000 - 3_000,
                    level: if k == 4 {
                        "warn".into()
                    } else {
                        "error".into()
                    },
                    category: cats[k],
                    error_type: [
                        "AgentExecutionFailed",
                        "ToolTimeout",
                        "KvCacheExhausted",
                        "RateLimited",
                        "ServiceDegradedError",
                        "SerializationError",
                    ][k]
                        .into(),
                    message: pick(&v.messages, k),
                    request_id: format!("req-{:06x}", 0x8f3a21 + i * 977 + idx),
                    trace_id: format!(
                        "{:032x}",
                        0x4bf92f3577b34da6a3ce929d0e0e4736u128 + (i as u128) * 7919
                    ),
                    feature: pick(&v.features, k),
                    criticality: [
                        Criticality::Default,
                        Criticality::Sheddable,
                        Criticality::Critical,
                    ][k % 3],
                }
            })
            .collect();
        Ok(InstanceView {
            origin: DataOrigin::Sample,
            generated_at_ms: self.now_ms,
            service: service.to_string(),
            instance: inst.clone(),
            engine,
            logs,
        })
    }

    fn resource_view(&self) -> ResourceView {
        let engines = self
            .hosts
            .iter()
            .enumerate()
            .flat_map(|(h, host)| {
                host.snapshot
                    .engines
                    .iter()
                    .enumerate()
                    .map(move |(e, eng)| EngineResource {
                        host: host.host.clone(),
                        engine: eng.clone(),
                        model_load_s: if eng.model.contains("70b") {
                            38.0 + h as f64 * 4.1
                        } else {
                            6.2 + e as f64 * 1.3
                        },
                        warmup_s: 2.1 + h as f64 * 0.7 + e as f64 * 0.4,
                        queue_series: series(self.now_ms, 30, MIN, |i| {
                            (eng.num_requests_waiting as f64 * (0.3 + 0.7 * i as f64 / 29.0)
                                + 2.0 * wiggle(h * 3 + e, i))
                            .max(0.0)
                            .round()
                        }),
                    })
            })
            .collect();
        ResourceView {
            origin: DataOrigin::Sample,
            generated_at_ms: self.now_ms,
            engines,
        }
    }
}

fn engine(
    id: &str,
    model: String,
    usage: f64,
    waiting: u64,
    tier: Tier,
    seed: usize,
) -> EngineStats {
    let total = 8_192;
    let used = (total as f64 * usage) as u64;
    let internal = 0.035 + 0.01 * wiggle(seed, 1).abs();
    let reserved = 0.06 + 0.03 * wiggle(seed, 2).abs();
    EngineStats {
        id: id.into(),
        url: format!("http://127.0.0.1:{}/metrics", 8000 + seed),
        model,
        up: true,
        kv: KvStats {
            block_size: 16,
            num_blocks_total: total,
            num_blocks_used: used,
            usage_ratio: usage,
            internal_fragmentation_ratio: internal,
            reserved_unused_ratio: reserved,
            token_occupancy_ratio: 1.0 - internal - reserved,
            external_fragmentation_ratio: 0.0,
        },
        num_requests_running: 96 + (seed as u64 * 37) % 160,
        num_requests_waiting: waiting,
        num_preemptions_total: 12 + seed as u64 * 41,
        tier: tier.as_u8(),
        ttft_p50_s: 0.28 + 0.05 * seed as f64,
        ttft_p99_s: 1.1 + 0.45 * seed as f64,
        ..Default::default()
    }
}

fn gpu(
    index: u32,
    host_idx: usize,
    name: &str,
    total_gib: u64,
    used_ratio: f64,
    util: f64,
) -> GpuStats {
    let total = total_gib * GIB;
    GpuStats {
        index,
        uuid: format!(
            "GPU-{:08x}-7d1c-4e2f-9b3a-{:012x}",
            0x5e3a_0000 + host_idx as u32 * 16 + index,
            host_idx * 1000 + index as usize
        ),
        name: name.into(),
        memory_total_bytes: total,
        memory_used_bytes: (total as f64 * used_ratio) as u64,
        memory_reserved_bytes: 512 << 20,
        gpu_util_ratio: util,
        mem_util_ratio: util * 0.7,
        temperature_c: 58.0 + util * 20.0,
        power_w: 180.0 + util * 220.0,
    }
}

fn build_hosts(now: u64, v: &Vocabulary) -> Vec<HostSummary> {
    /// One sample host: two GPUs and two engines.
    struct HostSpec {
        gpu_name: &'static str,
        gib: u64,
        vram: [f64; 2],
        util: [f64; 2],
        kv: [f64; 2],
        waiting: [u64; 2],
        state: HostState,
        last_seen_ago_ms: u64,
    }
    let spec = |gpu_name, gib, vram, util, kv, waiting, state, last_seen_ago_ms| HostSpec {
        gpu_name,
        gib,
        vram,
        util,
        kv,
        waiting,
        state,
        last_seen_ago_ms,
    };
    let a100 = "NVIDIA A100-SXM4-80GB";
    let h100 = "NVIDIA H100 80GB HBM3";
    let specs = [
        spec(
            a100,
            80,
            [0.91, 0.78],
            [0.996, 0.97],
            [0.934, 0.881],
            [41, 23],
            HostState::Fresh,
            800,
        ),
        spec(
            a100,
            80,
            [0.72, 0.69],
            [0.88, 0.84],
            [0.768, 0.702],
            [9, 6],
            HostState::Fresh,
            1_200,
        ),
        spec(
            h100,
            80,
            [0.64, 0.58],
            [0.74, 0.71],
            [0.612, 0.545],
            [3, 2],
            HostState::Fresh,
            600,
        ),
        spec(
            h100,
            80,
            [0.55, 0.52],
            [0.63, 0.6],
            [0.48, 0.41],
            [1, 0],
            HostState::Stale,
            14_000,
        ),
        spec(
            "NVIDIA L40S",
            48,
            [0.0; 2],
            [0.0; 2],
            [0.0; 2],
            [0, 0],
            HostState::Down,
            190_000,
        ),
    ];
    specs
        .iter()
        .enumerate()
        .map(|(h, sp)| {
            let HostSpec {
                gpu_name: gname,
                gib,
                vram,
                util,
                kv,
                waiting,
                state,
                last_seen_ago_ms: ago,
            } = sp;
            let down = *state == HostState::Down;
            let tier = if h < 3 { Tier::T2 } else { Tier::T0 };
            let engines = (0..2)
                .map(|e| {
                    let mut eng = engine(
                        &format!("engine-{e}"),
                        pick(&v.models, h + e),
                        kv[e],
                        waiting[e],
                        tier,
                        h * 2 + e,
                    );
                    eng.up = !down;
                    eng
                })
                .collect();
            HostSummary::new(
                *state,
                now - ago,
                AgentSnapshot {
                    host: pick(&v.hosts, h),
                    ts_ms: now - ago,
                    simulated: false,
                    probe_up: !down,
                    gpus: if down {
                        Vec::new()
                    } else {
                        (0..2)
                            .map(|g| gpu(g as u32, h, gname, *gib, vram[g], util[g]))
                            .collect()
                    },
                    engines,
                },
            )
        })
        .collect()
}

fn build_services(
    now: u64,
    v: &Vocabulary,
    hosts: &[HostSummary],
) -> (Vec<ServiceSummary>, BTreeMap<String, Vec<InstanceSummary>>) {
    let specs = [
        (412.0, 0.031, 2.7),
        (138.0, 0.118, 3.9),
        (22.0, 0.064, 5.2),
        (9.0, 0.012, 1.4),
    ];
    let mut map = BTreeMap::new();
    let mut out = Vec::new();
    for (s, (rps, err, p99)) in specs.iter().enumerate() {
        let name = pick(&v.services, s);
        let n = 4 - s.min(2);
        let insts: Vec<InstanceSummary> = (0..n)
            .map(|i| {
                let host = &hosts[(s + i) % hosts.len()];
                let hot = host.snapshot.max_kv_usage();
                InstanceSummary {
                    instance: format!("{name}-{:04x}-{i}", 0x7f9c + s * 0x111),
                    host: host.host.clone(),
                    state: host.state,
                    requests_per_s: rps / n as f64 * (0.8 + 0.1 * i as f64),
                    error_ratio: err * (0.5 + hot),
                    ttft_p99_s: p99 * (0.6 + hot * 0.5),
                    kv_usage_ratio: hot,
                    tier: Tier::try_from(host.snapshot.engines.first().map_or(0, |e| e.tier))
                        .unwrap_or_default(),
                }
            })
            .collect();
        out.push(ServiceSummary {
            name: name.clone(),
            requests_per_s: *rps,
            error_ratio: *err,
            ttft_p99_s: *p99,
            num_instances: n as u32,
            error_trend: series(now, 60, MIN, |i| {
                (err * (0.3 + 0.7 * i as f64 / 59.0) * (1.0 + 0.25 * wiggle(s, i))).max(0.0)
            }),
        });
        map.insert(name, insts);
    }
    (out, map)
}

fn build_patterns(now: u64, v: &Vocabulary) -> Vec<PatternDetail> {
    let cats = [
        Category::TimeoutResource,
        Category::ToolUnavailable,
        Category::KvCacheExhausted,
        Category::RateLimited,
        Category::Degraded,
        Category::SerializationError,
    ];
    let counts = [4_812u64, 2_240, 1_377, 966, 512, 203];
    (0..6)
        .map(|p| {
            let count = counts[p];
            PatternDetail {
                summary: PatternSummary {
                    id: format!(
                        "p{:012x}",
                        0x1a2b3c4d5e6fu64.wrapping_mul(p as u64 + 1) & 0xffff_ffff_ffff
                    ),
                    template: pick(&v.templates, p),
                    category: cats[p],
                    count_1h: count,
                    impact: [0.38, 0.21, 0.17, 0.09, 0.05, 0.02][p],
                    services: vec![pick(&v.services, p), pick(&v.services, p + 1)],
                    is_new: p == 2,
                },
                trend: series(now, 48, 5 * MIN, |i| {
                    let ramp = if p == 2 && i < 36 {
                        0.05
                    } else {
                        0.4 + 0.6 * i as f64 / 47.0
                    };
                    (count as f64 / 12.0 * ramp * (1.0 + 0.3 * wiggle(p, i)))
                        .max(0.0)
                        .round()
                }),
                examples: (0..3)
                    .map(|e| {
                        let trace_id = format!(
                            "{:032x}",
                            0x0af7651916cd43dd8448eb211c80319cu128 + (p * 3 + e) as u128
                        );
                        PatternExample {
                            ts_ms: now - (e as u64 * 2 + 1) * 61_000,
                            service: pick(&v.services, p + e),
                            message: pick(&v.messages, p),
                            trace_url: Some(format!("{}{trace_id}", v.trace_url_prefix)),
                            trace_id,
                            frames: Vec::new(),
                        }
                    })
                    .collect(),
            }
        })
        .collect()
}

fn burns(fast: f64, slow: f64) -> Vec<BurnRate> {
    vec![
        BurnRate {
            window: "5m".into(),
            rate: fast * 1.1,
            threshold: 14.4,
        },
        BurnRate {
            window: "1h".into(),
            rate: fast,
            threshold: 14.4,
        },
        BurnRate {
            window: "6h".into(),
            rate: slow,
            threshold: 6.0,
        },
        BurnRate {
            window: "3d".into(),
            rate: slow * 0.4,
            threshold: 1.0,
        },
    ]
}

fn build_slos(now: u64, v: &Vocabulary) -> Vec<SloDetail> {
    let specs = [
        (
            0.995,
            0.42,
            16.2,
            7.1,
            AlertState::Page,
            "99.5% of chat requests succeed (non-5xx, not shed)",
        ),
        (
            0.99,
            0.71,
            3.2,
            6.4,
            AlertState::Ticket,
            "99% of requests have TTFT under 2 s (docs/REQUIREMENTS.md R2.4: basic Q&A < 2 s is P0)",
        ),
        (
            0.98,
            0.88,
            0.9,
            0.7,
            AlertState::Ok,
            "98% of agent runs finish without AgentExecutionFailed",
        ),
    ];
    specs
        .iter()
        .enumerate()
        .map(|(i, (obj, left, fast, slow, state, desc))| {
            // 30 days of daily points; the budget drops faster over the last week.
            let budget_series = series(now, 31, 24 * 60 * MIN, |d| {
                let base = 1.0 - (1.0 - left) * (d as f64 / 30.0).powf(2.2);
                (base + 0.01 * wiggle(i, d)).min(1.0)
            });
            let mut history = vec![AlertEvent {
                ts_ms: now - 42 * MIN,
                state: *state,
                window: "5m/1h".into(),
                burn_rate: *fast,
            }];
            if *state != AlertState::Ok {
                history.push(AlertEvent {
                    ts_ms: now - 3 * 60 * MIN,
                    state: AlertState::Ticket,
                    window: "30m/6h".into(),
                    burn_rate: slow * 0.9,
                });
                history.push(AlertEvent {
                    ts_ms: now - 26 * 60 * MIN,
                    state: AlertState::Ok,
                    window: "5m/1h".into(),
                    burn_rate: 0.8,
                });
            }
            SloDetail {
                summary: SloSummary {
                    name: pick(&v.slos, i),
                    objective_ratio: *obj,
                    budget_remaining_ratio: *left,
                    budget_note: String::new(),
                    refused_1h: 0,
                    user_budget_remaining_ratio: Some(*left),
                    refused_period: 0,
                    burn_rates: burns(*fast, *slow),
                    alert_state: *state,
                },
                description: (*desc).into(),
                period: "30d".into(),
                budget_series,
                alert_history: history,
            }
        })
        .collect()
}

fn reason(trigger: &str, detail: String, slo: Option<String>, burn: Option<f64>) -> Reason {
    Reason {
        trigger: trigger.into(),
        slo,
        window: burn.map(|_| "5m/1h".into()),
        burn_rate: burn,
        detail,
    }
}

fn build_clusters(
    now: u64,
    v: &Vocabulary,
    service_to_instances: &BTreeMap<String, Vec<InstanceSummary>>,
) -> Vec<ClusterDegradation> {
    let window_start = now - 6 * 60 * MIN;
    let d = |i| pick(&v.details, i);
    let slo0 = Some(pick(&v.slos, 0));
    // Cluster 0: the evening peak. Cluster 1: one short T1. Cluster 2: calm.
    let timelines: [Vec<(u64, Tier, Reason)>; 3] = [
        vec![
            (
                window_start - 30 * MIN,
                Tier::T0,
                reason("recovered", d(3), None, None),
            ),
            (
                now - 205 * MIN,
                Tier::T1,
                reason("kv_usage", d(1), None, None),
            ),
            (
                now - 188 * MIN,
                Tier::T2,
                reason("slo_burn", d(0), slo0.clone(), Some(16.2)),
            ),
            (
                now - 150 * MIN,
                Tier::T3,
                reason("gpu_util", d(2), None, None),
            ),
            (
                now - 112 * MIN,
                Tier::T2,
                reason("recovered", d(3), None, None),
            ),
            (
                now - 70 * MIN,
                Tier::T1,
                reason("recovered", d(3), None, None),
            ),
            (
                now - 42 * MIN,
                Tier::T2,
                reason("slo_burn", d(0), slo0, Some(16.2)),
            ),
        ],
        vec![
            (
                window_start - 90 * MIN,
                Tier::T0,
                reason("recovered", d(3), None, None),
            ),
            (
                now - 160 * MIN,
                Tier::T1,
                reason("kv_usage", d(1), None, None),
            ),
            (
                now - 128 * MIN,
                Tier::T0,
                reason("recovered", d(3), None, None),
            ),
        ],
        vec![(
            window_start - 600 * MIN,
            Tier::T0,
            reason("recovered", d(3), None, None),
        )],
    ];
    let all_instances: Vec<&InstanceSummary> = service_to_instances.values().flatten().collect();
    timelines
        .into_iter()
        .enumerate()
        .map(|(c, tl)| {
            let timeline: Vec<TierChange> = tl
                .into_iter()
                .enumerate()
                .map(|(k, (ts, tier, reason))| TierChange {
                    ts_ms: ts,
                    tier,
                    reason,
                    version: 1_030 + k as u64,
                })
                .collect();
            let last = timeline
                .last()
                .cloned()
                .expect("every sample timeline has a change");
            let acks = all_instances
                .iter()
                .skip(c * 3)
                .take(5)
                .enumerate()
                .map(|(k, inst)| {
                    let lagging = c == 0 && k == 3;
                    let nack =
                        (c == 0 && k == 4).then(|| "bad signature (key id mismatch)".to_string());
                    InstanceAck {
                        instance: inst.instance.clone(),
                        epoch: 3,
                        version: if lagging || nack.is_some() {
                            last.version - 1
                        } else {
                            last.version
                        },
                        applied_at_ms: last.ts_ms + 40 + k as u64 * 35,
                        lag_ms: if lagging {
                            6_400
                        } else {
                            38 + k as u64 * 29 + c as u64 * 11
                        },
                        nack_reason: nack,
                        lagging,
                    }
                })
                .collect();
            ClusterDegradation {
                current: ClusterTier {
                    name: pick(&v.clusters, c),
                    tier: last.tier,
                    reason: last.reason.clone(),
                    since_ms: last.ts_ms,
                    leader: Some(format!("brownout-{}", c % 2)),
                    warning: None,
                },
                epoch: 3,
                version: last.version,
                timeline,
                window_start_ms: window_start,
                window_end_ms: now,
                acks,
                instance_actions: if c == 0 {
                    vec![InstanceActionRow {
                        ts_ms: last.ts_ms,
                        instance: format!("{}/engine-0", pick(&v.hosts, 0)),
                        action: "halve".into(),
                        detail: format!(
                            "kv_usage > 92% for 60s: max_num_seqs 256 -> 128 ({})",
                            pick(&v.details, 0)
                        ),
                        entry: "max_num_seqs 128".into(),
                        ack: "applied".into(),
                    }]
                } else {
                    Vec::new()
                },
                action_log: Vec::new(),
            }
        })
        .collect()
}

fn ready<'a, T: Send + 'a>(v: T) -> BoxFuture<'a, T> {
    futures::future::ready(v).boxed()
}

impl UiDataSource for SampleDataSource {
    fn overview(&self) -> BoxFuture<'_, Result<OverviewView, UiError>> {
        ready(Ok(self.overview_now()))
    }
    fn hosts(&self) -> BoxFuture<'_, Result<HostsView, UiError>> {
        ready(Ok(HostsView {
            origin: DataOrigin::Sample,
            generated_at_ms: self.now_ms,
            hosts: self.hosts.clone(),
        }))
    }
    fn host<'a>(&'a self, host: &'a str) -> BoxFuture<'a, Result<HostDetailView, UiError>> {
        ready(self.host_detail(host))
    }
    fn service<'a>(&'a self, service: &'a str) -> BoxFuture<'a, Result<ServiceView, UiError>> {
        ready(self.service_view(service))
    }
    fn instance<'a>(
        &'a self,
        service: &'a str,
        instance: &'a str,
    ) -> BoxFuture<'a, Result<InstanceView, UiError>> {
        ready(self.instance_view(service, instance))
    }
    fn patterns(&self) -> BoxFuture<'_, Result<PatternsView, UiError>> {
        ready(Ok(PatternsView {
            origin: DataOrigin::Sample,
            generated_at_ms: self.now_ms,
            patterns: self.patterns.clone(),
        }))
    }
    fn slos(&self) -> BoxFuture<'_, Result<SloView, UiError>> {
        ready(Ok(SloView {
            origin: DataOrigin::Sample,
            generated_at_ms: self.now_ms,
            slos: self.slos.clone(),
        }))
    }
    fn degradation(&self) -> BoxFuture<'_, Result<DegradationView, UiError>> {
        ready(Ok(DegradationView {
            origin: DataOrigin::Sample,
            generated_at_ms: self.now_ms,
            clusters: self.clusters.clone(),
        }))
    }
    fn resource(&self) -> BoxFuture<'_, Result<ResourceView, UiError>> {
        ready(Ok(self.resource_view()))
    }
    fn origin(&self) -> DataOrigin {
        DataOrigin::Sample
    }
    fn now_ms(&self) -> u64 {
        self.now_ms
    }
    fn log_search<'a>(&'a self, q: &'a LogQuery) -> BoxFuture<'a, Result<LogPage, UiError>> {
        ready(Ok(self.search(q)))
    }
    fn trace_spans<'a>(
        &'a self,
        trace_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<SpanRow>, UiError>> {
        ready(Ok(self.sample_trace(trace_id)))
    }
    fn trace_url(&self, trace_id: &str) -> Option<String> {
        Some(format!("{}{trace_id}", self.vocab.trace_url_prefix))
    }
}

/// The sample trace every pattern example and log line links to.
pub const SAMPLE_TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";

impl SampleDataSource {
    /// 120 log records, 20 s apart, newest first: every service, host, severity and message of
    /// the vocabulary, some with a trace id.
    pub fn sample_logs(&self) -> Vec<LogHit> {
        let v = &self.vocab;
        let sev = [
            (9u8, "INFO"),
            (13, "WARN"),
            (17, "ERROR"),
            (21, "FATAL"),
            (5, "DEBUG"),
        ];
        (0..120u64)
            .map(|i| {
                let k = i as usize;
                let (n, t) = sev[k % sev.len()];
                LogHit::new(
                    LogRow {
                        ts_us: (self.now_ms - 2_000 - i * 20_000) * 1000,
                        trace_id: if k.is_multiple_of(3) {
                            SAMPLE_TRACE_ID.to_string()
                        } else {
                            String::new()
                        },
                        span_id: format!("{:016x}", 0xb7ad6b7169203331u64 + i),
                        service: pick(&v.services, k),
                        host: pick(&self.host_names(), k / 2),
                        severity_number: n,
                        severity_text: t.to_string(),
                        body: pick(&v.messages, k),
                        attributes: vec![
                            ("feature".into(), pick(&v.features, k)),
                            ("gen_ai.request.model".into(), pick(&v.models, k)),
                        ],
                    },
                    1000 - i,
                    0,
                )
            })
            .collect()
    }

    /// [`UiDataSource::log_search`] over [`SampleDataSource::sample_logs`]: the same filters,
    /// order and cursor as the stores.
    pub fn search(&self, q: &LogQuery) -> LogPage {
        let limit = q.page_size();
        let hits: Vec<LogHit> = self
            .sample_logs()
            .into_iter()
            .filter(|h| {
                let r = &h.row;
                r.ts_us >= q.since_ms.saturating_mul(1000)
                    && r.ts_us < q.until_ms.saturating_mul(1000)
                    && q.service.as_ref().is_none_or(|s| *s == r.service)
                    && q.host.as_ref().is_none_or(|s| *s == r.host)
                    && r.severity_number >= q.min_severity
                    && q.text.as_ref().is_none_or(|t| r.body.contains(t.as_str()))
                    && q.cursor
                        .is_none_or(|c| (r.ts_us, h.pos.id) < (c.ts_us, c.id))
            })
            .take(limit + 1)
            .collect();
        let more = hits.len() > limit;
        let items: Vec<LogHit> = hits.into_iter().take(limit).collect();
        LogPage {
            next_cursor: if more {
                items.last().map(|h| h.pos.encode())
            } else {
                None
            },
            items,
        }
    }

    /// An agent request's trace (gateway → GPU queue → prefill → a tool call → decode), the
    /// same shape for any trace id; names and attributes from the vocabulary.
    pub fn sample_trace(&self, trace_id: &str) -> Vec<SpanRow> {
        let v = &self.vocab;
        let t0 = (self.now_ms - 65_000) * 1000;
        let span = |id: u64,
                    parent: u64,
                    service: usize,
                    name: String,
                    start_ms: u64,
                    dur_ms: u64,
                    status: u8,
                    attrs: Vec<(&str, String)>| SpanRow {
            trace_id: trace_id.to_string(),
            span_id: format!("{id:016x}"),
            parent_span_id: if parent == 0 {
                String::new()
            } else {
                format!("{parent:016x}")
            },
            service: pick(&v.services, service),
            name,
            kind: 2,
            start_us: t0 + start_ms * 1000,
            duration_us: dur_ms * 1000,
            status,
            status_message: if status == 2 {
                pick(&v.messages, 1)
            } else {
                String::new()
            },
            feature: pick(&v.features, 0),
            criticality: "default".into(),
            host: pick(&self.host_names(), 0),
            is_request: parent == 0,
            attributes: attrs.into_iter().map(|(k, x)| (k.to_string(), x)).collect(),
        };
        vec![
            span(
                0xa1,
                0,
                0,
                "POST /v1/chat/completions".into(),
                0,
                9_400,
                2,
                vec![("gen_ai.request.model", pick(&v.models, 0))],
            ),
            span(0xa2, 0xa1, 1, "agent.run".into(), 12, 9_350, 2, vec![]),
            span(
                0xa3,
                0xa2,
                1,
                "gpu.queue".into(),
                15,
                2_310,
                0,
                vec![("brownout.queue_time_s", "2.31".into())],
            ),
            span(
                0xa4,
                0xa2,
                1,
                "llm.prefill".into(),
                2_330,
                420,
                1,
                vec![
                    ("brownout.ttft_s", "2.75".into()),
                    ("gen_ai.usage.input_tokens", "1834".into()),
                ],
            ),
            span(
                0xa5,
                0xa2,
                1,
                format!("execute_tool {}", pick(&v.features, 1)),
                2_760,
                6_000,
                2,
                vec![
                    ("gen_ai.tool.name", pick(&v.templates, 1)),
                    ("error.type", pick(&v.messages, 1)),
                ],
            ),
            span(0xa6, 0xa5, 2, "http GET".into(), 2_790, 5_950, 2, vec![]),
            span(
                0xa8,
                0xa2,
                2,
                "kv.prefix_lookup".into(),
                2_340,
                60,
                1,
                vec![],
            ),
            span(
                0xa7,
                0xa2,
                1,
                "llm.decode".into(),
                8_770,
                590,
                1,
                vec![("gen_ai.usage.output_tokens", "212".into())],
            ),
        ]
    }
}
