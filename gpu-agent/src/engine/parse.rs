//! Pure parsing of an engine's `/metrics` (Prometheus text format) and the bundled tier's
//! `/debug/kv` JSON into [`EngineMetrics`].
//!
//! The text is parsed with the `prometheus-parse` crate. Its name pattern is `\w+`, which has no
//! `:` — and every vLLM name has one (`vllm:kv_cache_usage_perc`). [`parse_metrics`] therefore
//! swaps `:` in metric names for [`COLON`] before parsing and back afterwards; label values are
//! left untouched.

use std::collections::HashMap;

use brownout_protocol::wire::metric;
use prometheus_parse::{Scrape, Value};
use serde::Deserialize;

use super::histogram::Histogram;

/// What stands in for `:` in metric names while `prometheus-parse` reads them.
const COLON: &str = "__colon__";

/// Why a `/metrics` body gave nothing usable.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ParseError {
    #[error("no vLLM (vllm:*) or brownout (brownout_kv_*, brownout_serving_*) metrics in the body")]
    NoEngineMetrics,
    #[error("the body is not valid Prometheus text: {0}")]
    Text(String),
}

/// The figures the agent takes from one engine's `/metrics`. Absent metrics stay `None` so the
/// caller can tell "zero" from "not exported".
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EngineMetrics {
    /// `model_name` label of the vLLM series.
    pub model: Option<String>,
    /// `vllm:kv_cache_usage_perc`, else the deprecated `vllm:gpu_cache_usage_perc` (0–1).
    pub kv_usage_ratio: Option<f64>,
    /// From `vllm:cache_config_info{block_size=..}`.
    pub block_size: Option<u32>,
    /// `brownout_kv_blocks_usable` (older engines: `brownout_kv_blocks_total`), else `vllm:cache_config_info{num_gpu_blocks=..}`.
    pub num_blocks_total: Option<u64>,
    /// `brownout_kv_blocks_used`.
    pub num_blocks_used: Option<u64>,
    pub internal_fragmentation_ratio: Option<f64>,
    pub reserved_unused_ratio: Option<f64>,
    pub token_occupancy_ratio: Option<f64>,
    pub external_fragmentation_ratio: Option<f64>,
    /// Sums over label sets (data-parallel engines behind one server).
    pub num_requests_running: Option<f64>,
    pub num_requests_waiting: Option<f64>,
    pub num_preemptions_total: Option<f64>,
    /// `brownout_serving_tier` (bundled tier only).
    pub tier: Option<u8>,
    /// `vllm:time_to_first_token_seconds`, cumulative, label sets merged.
    pub ttft: Option<Histogram>,
    /// `vllm:request_queue_time_seconds`, cumulative, label sets merged (vLLM exports it; the
    /// bundled tier does not).
    pub queue_time: Option<Histogram>,
    /// Observations of `vllm:e2e_request_latency_seconds`: requests completed.
    pub completed_total: Option<f64>,
    /// `brownout_serving_requests_total` summed over label sets: requests answered, refusals
    /// included (the bundled tier).
    pub answered_total: Option<f64>,
    /// `brownout_serving_arrivals_total` summed over label sets: requests counted on arrival at
    /// the admission gate (the bundled tier).
    pub arrived_total: Option<f64>,
    /// The same, `attempt="first"` only: arrivals that are no client's retry.
    pub first_arrived_total: Option<f64>,
    /// True when any `brownout_*` series was present: the bundled serving tier, which also
    /// serves `/debug/kv`.
    pub bundled: bool,
}

/// Averages a gauge over label sets; sums are kept separately.
#[derive(Default)]
struct Acc {
    sum: f64,
    n: u32,
}

impl Acc {
    fn add(&mut self, v: f64) {
        if v.is_finite() {
            self.sum += v;
            self.n += 1;
        }
    }
    fn mean(&self) -> Option<f64> {
        (self.n > 0).then(|| self.sum / f64::from(self.n))
    }
    fn total(&self) -> Option<f64> {
        (self.n > 0).then_some(self.sum)
    }
}

/// Rewrites `:` in the metric name of one exposition line (sample, `# HELP`, `# TYPE`).
fn escape_name(line: &str) -> String {
    let line = line.trim_start();
    if let Some(rest) = line.strip_prefix('#') {
        // "# HELP name doc" / "# TYPE name type": only the third token is a name.
        let rest_trim = rest.trim_start();
        for kw in ["HELP", "TYPE"] {
            if let Some(after) = rest_trim.strip_prefix(kw) {
                let after = after.trim_start();
                let end = after.find(char::is_whitespace).unwrap_or(after.len());
                return format!(
                    "# {kw} {}{}",
                    after[..end].replace(':', COLON),
                    &after[end..]
                );
            }
        }
        return line.to_string();
    }
    let end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(line.len());
    if line[..end].contains(':') {
        format!("{}{}", line[..end].replace(':', COLON), &line[end..])
    } else {
        line.to_string()
    }
}

fn value_of(v: &Value) -> Option<f64> {
    match v {
        Value::Counter(x) | Value::Gauge(x) | Value::Untyped(x) => Some(*x),
        Value::Histogram(_) | Value::Summary(_) => None,
    }
}

/// Parses one `/metrics` body.
///
/// # Errors
/// [`ParseError::NoEngineMetrics`] when the body holds no `vllm:*` and no `brownout_kv_*` /
/// `brownout_serving_*` series (e.g. the URL points at something that is not an engine).
pub fn parse_metrics(body: &str) -> Result<EngineMetrics, ParseError> {
    let lines = body.lines().map(|l| Ok(escape_name(l)));
    let scrape = Scrape::parse(lines).map_err(|e| ParseError::Text(e.to_string()))?;

    let mut out = EngineMetrics::default();
    let mut kv_new = Acc::default();
    let mut kv_old = Acc::default();
    let (mut running, mut waiting, mut preempt) = (Acc::default(), Acc::default(), Acc::default());
    let (mut blocks_total, mut blocks_used) = (Acc::default(), Acc::default());
    let (mut internal, mut reserved, mut occupancy, mut external, mut tier) = (
        Acc::default(),
        Acc::default(),
        Acc::default(),
        Acc::default(),
        Acc::default(),
    );
    let mut config_blocks = Acc::default();
    let mut ttft_pairs: Vec<(f64, f64)> = Vec::new();
    let mut queue_pairs: Vec<(f64, f64)> = Vec::new();
    let mut e2e_pairs: Vec<(f64, f64)> = Vec::new();
    let mut answered = Acc::default();
    let mut arrived = Acc::default();
    let mut first_arrived = Acc::default();
    let mut seen_engine_series = false;

    for sample in &scrape.samples {
        let name = sample.metric.replace(COLON, ":");
        let is_vllm = name.starts_with("vllm:");
        if is_vllm {
            seen_engine_series = true;
            if out.model.is_none() {
                out.model = sample.labels.get("model_name").map(str::to_string);
            }
        }
        if name.starts_with("brownout_kv_") || name.starts_with("brownout_serving_") {
            seen_engine_series = true;
            out.bundled = true;
        }
        if name == metric::TIME_TO_FIRST_TOKEN_SECONDS {
            if let Value::Histogram(buckets) = &sample.value {
                ttft_pairs.extend(buckets.iter().map(|b| (b.less_than, b.count)));
            }
            continue;
        }
        if name == metric::REQUEST_QUEUE_TIME_SECONDS || name == metric::E2E_REQUEST_LATENCY_SECONDS
        {
            if let Value::Histogram(buckets) = &sample.value {
                let dst = if name == metric::REQUEST_QUEUE_TIME_SECONDS {
                    &mut queue_pairs
                } else {
                    &mut e2e_pairs
                };
                dst.extend(buckets.iter().map(|b| (b.less_than, b.count)));
            }
            continue;
        }
        if name == metric::SERVING_ARRIVALS_TOTAL {
            if let Some(v) = value_of(&sample.value) {
                arrived.add(v);
                if sample.labels.get("attempt").is_none_or(|a| a == "first") {
                    first_arrived.add(v);
                } else {
                    // A retry series: present, so the first-attempt total is known (maybe 0).
                    first_arrived.add(0.0);
                }
            }
            continue;
        }
        if name == metric::SERVING_REQUESTS_TOTAL {
            if let Some(v) = value_of(&sample.value) {
                answered.add(v);
            }
            continue;
        }
        if name == "vllm:cache_config_info" {
            if let Some(bs) = sample
                .labels
                .get("block_size")
                .and_then(|v| v.parse::<u32>().ok())
            {
                out.block_size = Some(bs);
            }
            if let Some(n) = sample
                .labels
                .get("num_gpu_blocks")
                .and_then(|v| v.parse::<f64>().ok())
            {
                config_blocks.add(n);
            }
            continue;
        }
        let Some(v) = value_of(&sample.value) else {
            continue;
        };
        let acc = match name.as_str() {
            metric::KV_CACHE_USAGE_PERC => &mut kv_new,
            "vllm:gpu_cache_usage_perc" => &mut kv_old,
            metric::NUM_REQUESTS_RUNNING => &mut running,
            metric::NUM_REQUESTS_WAITING => &mut waiting,
            metric::NUM_PREEMPTIONS_TOTAL => &mut preempt,
            // `_usable` since brownout-serve stopped naming a gauge like a counter; the old
            // name is still read from older engines.
            metric::KV_BLOCKS_USABLE | "brownout_kv_blocks_total" => &mut blocks_total,
            metric::KV_BLOCKS_USED => &mut blocks_used,
            metric::KV_INTERNAL_FRAGMENTATION_RATIO => &mut internal,
            metric::KV_RESERVED_UNUSED_RATIO => &mut reserved,
            metric::KV_TOKEN_OCCUPANCY_RATIO => &mut occupancy,
            metric::KV_EXTERNAL_FRAGMENTATION_RATIO => &mut external,
            metric::SERVING_TIER => &mut tier,
            _ => continue,
        };
        acc.add(v);
    }
    if !seen_engine_series {
        return Err(ParseError::NoEngineMetrics);
    }

    // Usage is a per-engine ratio: several data-parallel engines are averaged.
    out.kv_usage_ratio = kv_new.mean().or_else(|| kv_old.mean());
    out.num_requests_running = running.total();
    out.num_requests_waiting = waiting.total();
    out.num_preemptions_total = preempt.total();
    out.num_blocks_total = blocks_total
        .total()
        .or_else(|| config_blocks.total())
        .map(|v| v.max(0.0) as u64);
    out.num_blocks_used = blocks_used.total().map(|v| v.max(0.0) as u64);
    out.internal_fragmentation_ratio = internal.mean();
    out.reserved_unused_ratio = reserved.mean();
    out.token_occupancy_ratio = occupancy.mean();
    out.external_fragmentation_ratio = external.mean();
    out.tier = tier.total().map(|t| t.clamp(0.0, 3.0) as u8);
    if !ttft_pairs.is_empty() {
        out.ttft = Some(Histogram::from_pairs(ttft_pairs));
    }
    if !queue_pairs.is_empty() {
        out.queue_time = Some(Histogram::from_pairs(queue_pairs));
    }
    if !e2e_pairs.is_empty() {
        out.completed_total = Some(Histogram::from_pairs(e2e_pairs).total());
    }
    out.answered_total = answered.total();
    out.arrived_total = arrived.total();
    out.first_arrived_total = first_arrived.total();
    Ok(out)
}

/// The bundled serving tier's `/debug/kv` body. Every field is optional and unknown fields are
/// ignored, so the agent keeps working while that endpoint grows; the KV figures may sit at the
/// top level, under `"kv"`, or under `"pool"` (the bundled tier).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct DebugKv {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub block_size: Option<u32>,
    #[serde(default)]
    pub num_blocks_total: Option<u64>,
    #[serde(default)]
    pub num_blocks_used: Option<u64>,
    #[serde(default)]
    pub usage_ratio: Option<f64>,
    #[serde(default)]
    pub internal_fragmentation_ratio: Option<f64>,
    #[serde(default)]
    pub reserved_unused_ratio: Option<f64>,
    #[serde(default)]
    pub token_occupancy_ratio: Option<f64>,
    #[serde(default)]
    pub external_fragmentation_ratio: Option<f64>,
    /// Bytes of K and V one block holds over all layers (the simulated probe uses it).
    #[serde(default)]
    pub bytes_per_block: Option<u64>,
    /// Resident model weights, all routes.
    #[serde(default)]
    pub model_weights_bytes: Option<u64>,
    /// The scheduler's batch limit (the simulated probe's saturation point).
    #[serde(default)]
    pub max_num_seqs: Option<u32>,
    /// The configured `--max-num-seqs` (before any command lowers it).
    #[serde(default)]
    pub configured_max_num_seqs: Option<u32>,
    /// The serving tier's `--instance-id`.
    #[serde(default)]
    pub instance_id: Option<String>,
}

/// Parses `/debug/kv`.
///
/// # Errors
/// The JSON error when the body is not a JSON object.
pub fn parse_debug_kv(body: &[u8]) -> Result<DebugKv, serde_json::Error> {
    let v: serde_json::Value = serde_json::from_slice(body)?;
    let mut top: DebugKv = serde_json::from_value(v.clone())?;
    // The bundled tier nests its pool figures under "pool" (brownout-serve's `DebugKv`); other
    // engines may use "kv".
    let nested = v
        .get("kv")
        .filter(|k| k.is_object())
        .or_else(|| v.get("pool").filter(|k| k.is_object()));
    if let Some(kv) = nested {
        let inner: DebugKv = serde_json::from_value(kv.clone())?;
        top = DebugKv {
            model: top.model.or(inner.model),
            block_size: inner.block_size.or(top.block_size),
            num_blocks_total: inner.num_blocks_total.or(top.num_blocks_total),
            num_blocks_used: inner.num_blocks_used.or(top.num_blocks_used),
            usage_ratio: inner.usage_ratio.or(top.usage_ratio),
            internal_fragmentation_ratio: inner
                .internal_fragmentation_ratio
                .or(top.internal_fragmentation_ratio),
            reserved_unused_ratio: inner.reserved_unused_ratio.or(top.reserved_unused_ratio),
            token_occupancy_ratio: inner.token_occupancy_ratio.or(top.token_occupancy_ratio),
            external_fragmentation_ratio: inner
                .external_fragmentation_ratio
                .or(top.external_fragmentation_ratio),
            bytes_per_block: inner.bytes_per_block.or(top.bytes_per_block),
            model_weights_bytes: inner.model_weights_bytes.or(top.model_weights_bytes),
            max_num_seqs: inner.max_num_seqs.or(top.max_num_seqs),
            configured_max_num_seqs: inner
                .configured_max_num_seqs
                .or(top.configured_max_num_seqs),
            instance_id: top.instance_id.or(inner.instance_id),
        };
    }
    Ok(top)
}

/// Label sets seen per metric name; used by tests to check the parser kept every series.
pub fn series_count(body: &str) -> HashMap<String, usize> {
    let lines = body.lines().map(|l| Ok(escape_name(l)));
    let mut out = HashMap::new();
    if let Ok(scrape) = Scrape::parse(lines) {
        for s in scrape.samples {
            *out.entry(s.metric.replace(COLON, ":")).or_insert(0) += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_colons_are_escaped_only_in_the_name() {
        let cases = [
            ("vllm:x{a=\"b:c\"} 1", "vllm__colon__x{a=\"b:c\"} 1"),
            ("# HELP vllm:x Some: doc", "# HELP vllm__colon__x Some: doc"),
            ("# TYPE vllm:x gauge", "# TYPE vllm__colon__x gauge"),
            ("plain 1", "plain 1"),
            ("# comment: here", "# comment: here"),
        ];
        for (input, want) in cases {
            assert_eq!(escape_name(input), want, "{input}");
        }
    }

    #[test]
    fn new_usage_name_wins_over_the_deprecated_one() {
        let body = "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\n\
                    # TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name=\"m\"} 0.9\n";
        assert_eq!(parse_metrics(body).unwrap().kv_usage_ratio, Some(0.5));
    }

    #[test]
    fn data_parallel_engines_are_summed_or_averaged() {
        let body = "# TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n\
            vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 4.0\n\
            # TYPE vllm:kv_cache_usage_perc gauge\n\
            vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.2\n\
            vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.4\n";
        let m = parse_metrics(body).unwrap();
        assert_eq!(m.num_requests_running, Some(7.0));
        assert!((m.kv_usage_ratio.unwrap() - 0.3).abs() < 1e-12);
    }

    #[test]
    fn queue_time_completions_and_answered_requests_are_read() {
        let body = "# TYPE vllm:request_queue_time_seconds histogram\n\
            vllm:request_queue_time_seconds_bucket{model_name=\"m\",le=\"0.1\"} 8\n\
            vllm:request_queue_time_seconds_bucket{model_name=\"m\",le=\"1\"} 9\n\
            vllm:request_queue_time_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 10\n\
            vllm:request_queue_time_seconds_sum{model_name=\"m\"} 3\n\
            vllm:request_queue_time_seconds_count{model_name=\"m\"} 10\n\
            # TYPE vllm:e2e_request_latency_seconds histogram\n\
            vllm:e2e_request_latency_seconds_bucket{model_name=\"m\",le=\"1\"} 5\n\
            vllm:e2e_request_latency_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 7\n\
            vllm:e2e_request_latency_seconds_sum{model_name=\"m\"} 9\n\
            vllm:e2e_request_latency_seconds_count{model_name=\"m\"} 7\n\
            # TYPE brownout_serving_requests_total counter\n\
            brownout_serving_requests_total{outcome=\"stop\"} 7\n\
            brownout_serving_requests_total{outcome=\"shed\"} 30\n\
            # TYPE brownout_serving_arrivals_total counter\n\
            brownout_serving_arrivals_total{model_name=\"m\",attempt=\"first\"} 21\n\
            brownout_serving_arrivals_total{model_name=\"m\",attempt=\"retry\"} 16\n";
        let m = parse_metrics(body).unwrap();
        assert_eq!(m.completed_total, Some(7.0));
        assert_eq!(m.answered_total, Some(37.0), "refusals count as answered");
        assert_eq!(m.arrived_total, Some(37.0));
        assert_eq!(m.first_arrived_total, Some(21.0), "retries left out");
        let q = m.queue_time.unwrap();
        assert_eq!(q.total(), 10.0);
        assert!(q.quantile(0.5).unwrap() <= 0.1, "half waited under 100 ms");
        assert_eq!(
            q.quantile(0.99),
            Some(1.0),
            "p99 in +Inf: the highest finite bound"
        );
        let none =
            parse_metrics("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n")
                .unwrap();
        assert_eq!((none.completed_total, none.answered_total), (None, None));
        assert_eq!((none.arrived_total, none.first_arrived_total), (None, None));
        assert!(none.queue_time.is_none());
    }

    #[test]
    fn a_body_without_engine_metrics_is_an_error() {
        for body in ["", "# TYPE up gauge\nup 1\n", "not prometheus at all"] {
            assert_eq!(
                parse_metrics(body),
                Err(ParseError::NoEngineMetrics),
                "{body:?}"
            );
        }
    }

    #[test]
    fn debug_kv_reads_the_instance_id_and_configured_limit() {
        let body = br#"{"instance_id":"gpu-3/engine-0","configured_max_num_seqs":256,"max_num_seqs":128,"pool":{"block_size":16}}"#;
        let d = parse_debug_kv(body).unwrap();
        assert_eq!(d.instance_id.as_deref(), Some("gpu-3/engine-0"));
        assert_eq!(d.configured_max_num_seqs, Some(256));
        assert_eq!(d.max_num_seqs, Some(128));
    }

    #[test]
    fn debug_kv_reads_top_level_and_nested_shapes() {
        let flat = br#"{"block_size":16,"num_blocks_total":100,"num_blocks_used":40,"bytes_per_block":737280,"extra":[1]}"#;
        let nested = br#"{"model":"smollm2","kv":{"block_size":16,"num_blocks_total":100,"num_blocks_used":40,"bytes_per_block":737280}}"#;
        for body in [&flat[..], &nested[..]] {
            let d = parse_debug_kv(body).unwrap();
            assert_eq!(
                (
                    d.block_size,
                    d.num_blocks_total,
                    d.num_blocks_used,
                    d.bytes_per_block
                ),
                (Some(16), Some(100), Some(40), Some(737_280))
            );
        }
        assert!(parse_debug_kv(b"[1,2]").is_err());
        assert!(parse_debug_kv(b"{").is_err());
    }

    /// The bundled tier's `/debug/kv` (brownout-serve `DebugKv`): pool figures under "pool",
    /// serialised from the same `KvStats` type.
    #[test]
    fn debug_kv_reads_the_bundled_tiers_pool_object() {
        let pool = brownout_protocol::KvStats {
            block_size: 16,
            num_blocks_total: 2048,
            num_blocks_used: 512,
            usage_ratio: 0.25,
            internal_fragmentation_ratio: 0.125,
            reserved_unused_ratio: 0.0,
            token_occupancy_ratio: 0.875,
            external_fragmentation_ratio: 0.0,
        };
        let body = serde_json::json!({
            "mode": "paged", "pool": pool, "num_free_blocks": 1536, "num_cached_blocks": 0,
            "kv_quota_blocks": 2048, "max_num_seqs": 32, "running": [1], "waiting": [],
            "sequences": [],
        });
        let d = parse_debug_kv(body.to_string().as_bytes()).unwrap();
        assert_eq!(d.block_size, Some(16));
        assert_eq!(d.num_blocks_total, Some(2048));
        assert_eq!(d.num_blocks_used, Some(512));
        assert_eq!(d.usage_ratio, Some(0.25));
        assert_eq!(d.internal_fragmentation_ratio, Some(0.125));
        assert_eq!(d.token_occupancy_ratio, Some(0.875));
        assert_eq!(d.max_num_seqs, Some(32));
    }
}
