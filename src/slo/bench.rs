//! `brownout slo bench`: what the evaluator costs with many SLOs and a full window of events.
//!
//! Builds `n_slos` SLOs over `n_slos / 10` services (availability, TTFT latency and task
//! success; by feature and criticality; 28-day, 30-day, 7-day and calendar periods; some
//! timeslice-budgeted), records `n_events` synthetic events spread evenly over `span_ms`
//! ending now (each matches the SLOs of its service whose selector and SLI kind fit), then
//! times full evaluations of every SLO.

use std::fmt;
use std::time::Instant;

use brownout_protocol::Criticality;

use super::eval::{Evaluator, EventKind, Observation};
use super::spec::{
    Alerting, Budgeting, Format, LatencyMetric, Period, Selector, Sli, SliKind, SloSpec, SpecSource,
};

/// Figures of one run.
#[derive(Debug)]
pub struct BenchReport {
    pub n_slos: usize,
    pub n_events: u64,
    pub span_ms: u64,
    pub counted: u64,
    pub record_secs: f64,
    pub evaluate_mean_ms: f64,
    pub evaluate_max_ms: f64,
    pub evaluations: usize,
    pub heap_bytes: usize,
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "slos: {}  events: {}  span: {}",
            self.n_slos,
            self.n_events,
            super::duration::format_period_secs(self.span_ms / 1000)
        )?;
        writeln!(
            f,
            "record: {:.2} s for {} events ({:.1} M events/s, {:.0} ns/event; {} SLO counts, {:.2} per event)",
            self.record_secs,
            self.n_events,
            self.n_events as f64 / self.record_secs / 1e6,
            self.record_secs * 1e9 / self.n_events as f64,
            self.counted,
            self.counted as f64 / self.n_events as f64
        )?;
        writeln!(
            f,
            "evaluate all SLOs: mean {:.3} ms, max {:.3} ms over {} evaluations ({:.1} µs per SLO)",
            self.evaluate_mean_ms,
            self.evaluate_max_ms,
            self.evaluations,
            self.evaluate_mean_ms * 1000.0 / self.n_slos as f64
        )?;
        write!(
            f,
            "counter memory: {:.1} MiB ({:.0} KiB per SLO)",
            self.heap_bytes as f64 / 1048576.0,
            self.heap_bytes as f64 / 1024.0 / self.n_slos as f64
        )
    }
}

const FEATURES: [&str; 4] = [
    "basic_qa",
    "pdf_analysis",
    "image_generation",
    "multilingual_email",
];

/// The synthetic SLO set.
pub fn synthetic_specs(n_slos: usize) -> Vec<SloSpec> {
    let n_services = n_slos.div_ceil(10).max(1);
    (0..n_slos)
        .map(|i| {
            let service = format!("svc-{}", i % n_services);
            let variant = i / n_services;
            let kind = match variant % 4 {
                0 | 3 => SliKind::Availability,
                1 => SliKind::Latency {
                    metric: LatencyMetric::Ttft,
                    threshold_ms: 2_000.0,
                },
                _ => SliKind::TaskSuccess,
            };
            let selector = match variant % 3 {
                0 => Selector::default(),
                1 => Selector {
                    feature: Some(FEATURES[variant % FEATURES.len()].to_string()),
                    criticality: vec![],
                },
                _ => Selector {
                    feature: None,
                    criticality: vec![Criticality::Critical, Criticality::Default],
                },
            };
            let period = match i % 4 {
                0 => Period::Rolling { days: 28 },
                1 => Period::Rolling { days: 30 },
                2 => Period::Rolling { days: 7 },
                _ => Period::CalendarMonth,
            };
            let budgeting = if i % 10 == 9 {
                Budgeting::Timeslices {
                    slice_secs: 60,
                    good_slice_ratio: 0.95,
                }
            } else {
                Budgeting::Occurrences
            };
            SloSpec {
                name: format!("slo-{i}"),
                description: String::new(),
                service,
                selector,
                objective_ratio: 0.999,
                period,
                budgeting,
                sli: Sli { kind, promql: None },
                min_events: 30,
                labels: Default::default(),
                alerting: Alerting::default(),
                source: SpecSource {
                    file: "bench".into(),
                    format: Format::Brownout,
                },
            }
        })
        .collect()
}

/// xorshift64*: cheap and deterministic, so runs are comparable.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

pub fn run(n_slos: usize, n_events: u64, span_ms: u64) -> BenchReport {
    let specs = synthetic_specs(n_slos);
    let services: Vec<String> = (0..n_slos.div_ceil(10).max(1))
        .map(|i| format!("svc-{i}"))
        .collect();
    let mut ev = Evaluator::new(specs);
    let now_ms = brownout_protocol::now_ms();
    let start_ms = now_ms - span_ms;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let t0 = Instant::now();
    for i in 0..n_events {
        let r = rng.next();
        let ts_ms = start_ms + i * span_ms / n_events.max(1);
        let obs = Observation {
            ts_ms,
            kind: if r.is_multiple_of(5) {
                EventKind::AgentTask
            } else {
                EventKind::Request
            },
            service: &services[(r >> 8) as usize % services.len()],
            feature: FEATURES[(r >> 16) as usize % FEATURES.len()],
            criticality: [
                Criticality::Critical,
                Criticality::Default,
                Criticality::Sheddable,
            ][(r >> 20) as usize % 3],
            ok: (r >> 24) % 1000 >= 2,
            deliberate: false,
            latency_ms: Some(((r >> 32) % 4000) as f64),
            ttft_ms: Some(((r >> 44) % 2600) as f64),
        };
        ev.record(&obs);
    }
    let record_secs = t0.elapsed().as_secs_f64();
    let evaluations = 20;
    let mut times = Vec::with_capacity(evaluations);
    for k in 0..evaluations {
        let t = Instant::now();
        let st = ev.evaluate(now_ms + k as u64 * 5_000);
        std::hint::black_box(&st);
        times.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    BenchReport {
        n_slos,
        n_events,
        span_ms,
        counted: ev.stats().counted,
        record_secs,
        evaluate_mean_ms: times.iter().sum::<f64>() / evaluations as f64,
        evaluate_max_ms: times.iter().copied().fold(0.0, f64::max),
        evaluations,
        heap_bytes: ev.heap_bytes(),
    }
}
