//! The serving tier's Prometheus metrics: vLLM's names (label `model_name`) so vLLM dashboards
//! work unchanged, plus `brownout_kv_*` (fragmentation) and `brownout_serving_*` (tiers,
//! shedding, features). One [`Metrics`] per engine, registered in its own [`Registry`].

use brownout_protocol::KvStats;
use brownout_protocol::wire::metric;
use prometheus::{
    CounterVec, Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// The engine's critical reserve now: its size and how much of it critical requests hold
/// (`Scheduler::reserve_stats`, also `crate::scheduler::ReserveStats`; gauges in
/// [`Metrics::set_engine_limits`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReserveStats {
    pub seqs: usize,
    pub seqs_used: usize,
    pub blocks: usize,
    pub blocks_used: usize,
}

// Buckets are vLLM's (`vllm/v1/metrics/loggers.py`, `PrometheusStatLogger`), so that
// `histogram_quantile` over a fleet mixing vLLM and brownout-serve adds like buckets.

/// vLLM's TTFT buckets (seconds), plus 2.0 so the 2 s TTFT SLO has an exact bucket edge.
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's inter-token latency buckets (seconds).
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's request latency buckets (seconds): e2e, queue, prefill and decode time.
const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// vLLM's `build_1_2_5_buckets(max_model_len)`: 1, 2, 5, 10, 20, 50, … up to `max`.
pub fn buckets_1_2_5(max: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale: u64 = 1;
    loop {
        for m in [1u64, 2, 5] {
            let v = m * scale;
            if v > max as u64 {
                return out;
            }
            out.push(v as f64);
        }
        scale *= 10;
    }
}

/// vLLM's `finished_reason` values that brownout-serve produces (vLLM's `FinishReason`:
/// stop, length, abort, error); every one exists from the start.
pub const FINISHED_REASONS: [&str; 4] = ["stop", "length", "abort", "error"];

/// The context length [`Metrics::new`] assumes for the token histograms' buckets.
pub const DEFAULT_MAX_MODEL_LEN: usize = 2048;

/// What [`Metrics::observe_finished`] records of one request (seconds and tokens).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FinishedRequest {
    pub queue_s: f64,
    pub prefill_s: f64,
    pub decode_s: f64,
    pub prompt_tokens: usize,
    pub generation_tokens: usize,
}

#[derive(Clone)]
pub struct Metrics {
    pub registry: Registry,
    model_name: String,
    pub kv_cache_usage_perc: GaugeVec,
    pub num_requests_running: GaugeVec,
    pub num_requests_waiting: GaugeVec,
    pub num_preemptions: CounterVec,
    pub ttft: HistogramVec,
    pub itl: HistogramVec,
    pub e2e: HistogramVec,
    /// `vllm:request_queue_time_seconds`: arrival to first scheduled (the upstream proxy: time
    /// in its own concurrency queue).
    pub queue_time: HistogramVec,
    /// `vllm:request_prefill_time_seconds`: first scheduled to first token.
    pub prefill_time: HistogramVec,
    /// `vllm:request_decode_time_seconds`: first token to last token.
    pub decode_time: HistogramVec,
    /// `vllm:request_prompt_tokens`: prompt length per finished request.
    pub request_prompt_tokens: HistogramVec,
    /// `vllm:request_generation_tokens`: generated tokens per finished request.
    pub request_generation_tokens: HistogramVec,
    /// `vllm:request_max_num_generation_tokens`: the request's `max_tokens`.
    pub request_max_num_generation_tokens: HistogramVec,
    /// `vllm:request_success_total{finished_reason}`.
    pub request_success: IntCounterVec,
    pub prompt_tokens: CounterVec,
    pub generation_tokens: CounterVec,
    pub prefix_cache_queries: CounterVec,
    pub prefix_cache_hits: CounterVec,
    pub kv_blocks_total: IntGaugeVec,
    pub kv_blocks_used: IntGaugeVec,
    pub kv_internal_fragmentation: GaugeVec,
    pub kv_reserved_unused: GaugeVec,
    pub kv_token_occupancy: GaugeVec,
    pub kv_external_fragmentation: GaugeVec,
    pub serving_tier: GaugeVec,
    pub shed_total: IntCounterVec,
    pub feature_disabled_total: IntCounterVec,
    pub requests_total: IntCounterVec,
    pub refusals_total: IntCounterVec,
    pub draining: IntGaugeVec,
    pub max_num_seqs: IntGaugeVec,
    pub critical_reserve_seqs: IntGaugeVec,
    pub critical_reserve_seqs_used: IntGaugeVec,
    pub critical_reserve_blocks: IntGaugeVec,
    pub critical_reserve_blocks_used: IntGaugeVec,
    pub admit_rps: GaugeVec,
    pub admit_tokens: GaugeVec,
    pub user_concurrency_cap: IntGaugeVec,
    pub users_tracked: IntGaugeVec,
    pub users_untracked: IntCounterVec,
    pub abort_entries: IntGaugeVec,
    pub command_epoch: IntGaugeVec,
    pub command_version: IntGaugeVec,
    pub abandoned_requests: IntCounterVec,
    pub abandoned_tokens: IntCounterVec,
    pub arrivals_total: IntCounterVec,
    /// Feature names seen as label values of `requests_total` (client-chosen: capped).
    features_seen: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

/// Distinct `feature` label values `brownout_serving_requests_total` takes before the rest are
/// counted as `other` (the header is client-chosen; this bounds the series).
pub const MAX_FEATURE_LABELS: usize = 64;

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("model_name", &self.model_name)
            .finish_non_exhaustive()
    }
}

fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> T {
    r.register(Box::new(c.clone()))
        .expect("metric names are unique and valid");
    c
}

impl Metrics {
    /// [`Metrics::with_max_model_len`] for a [`DEFAULT_MAX_MODEL_LEN`] context.
    pub fn new(model_name: &str) -> Metrics {
        Metrics::with_max_model_len(model_name, DEFAULT_MAX_MODEL_LEN)
    }

    /// The metrics of one engine serving `model_name` with contexts up to `max_model_len`
    /// tokens (the token histograms' top bucket, as vLLM).
    pub fn with_max_model_len(model_name: &str, max_model_len: usize) -> Metrics {
        let r = Registry::new();
        let token_buckets = buckets_1_2_5(max_model_len.max(1));
        let m = &["model_name"];
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            reg(
                &r,
                GaugeVec::new(Opts::new(name, help), labels).expect("valid"),
            )
        };
        let counter = |name: &str, help: &str| {
            reg(
                &r,
                CounterVec::new(Opts::new(name, help), m).expect("valid"),
            )
        };
        let igauge = |name: &str, help: &str| {
            reg(
                &r,
                IntGaugeVec::new(Opts::new(name, help), m).expect("valid"),
            )
        };
        let hist = |name: &str, help: &str, b: &[f64]| {
            reg(
                &r,
                HistogramVec::new(HistogramOpts::new(name, help).buckets(b.to_vec()), m)
                    .expect("valid"),
            )
        };
        let metrics = Metrics {
            model_name: model_name.to_string(),
            kv_cache_usage_perc: gauge(
                metric::KV_CACHE_USAGE_PERC,
                "KV-cache usage. 1 means 100 percent usage.",
                m,
            ),
            num_requests_running: gauge(
                metric::NUM_REQUESTS_RUNNING,
                "Number of requests in model execution batches.",
                m,
            ),
            num_requests_waiting: gauge(
                metric::NUM_REQUESTS_WAITING,
                "Number of requests waiting to be processed.",
                m,
            ),
            num_preemptions: counter(
                metric::NUM_PREEMPTIONS_TOTAL,
                "Cumulative number of preemption from the engine.",
            ),
            ttft: hist(
                metric::TIME_TO_FIRST_TOKEN_SECONDS,
                "Histogram of time to first token in seconds.",
                TTFT_BUCKETS,
            ),
            itl: hist(
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                ITL_BUCKETS,
            ),
            e2e: hist(
                metric::E2E_REQUEST_LATENCY_SECONDS,
                "Histogram of e2e request latency in seconds.",
                REQUEST_LATENCY_BUCKETS,
            ),
            queue_time: hist(
                metric::REQUEST_QUEUE_TIME_SECONDS,
                "Histogram of time spent in WAITING phase for request.",
                REQUEST_LATENCY_BUCKETS,
            ),
            prefill_time: hist(
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                REQUEST_LATENCY_BUCKETS,
            ),
            decode_time: hist(
                "vllm:request_decode_time_seconds",
                "Histogram of time spent in DECODE phase for request.",
                REQUEST_LATENCY_BUCKETS,
            ),
            request_prompt_tokens: hist(
                "vllm:request_prompt_tokens",
                "Number of prefill tokens processed.",
                token_buckets.as_slice(),
            ),
            request_generation_tokens: hist(
                "vllm:request_generation_tokens",
                "Number of generation tokens processed.",
                token_buckets.as_slice(),
            ),
            request_max_num_generation_tokens: hist(
                "vllm:request_max_num_generation_tokens",
                "Histogram of maximum number of requested generation tokens.",
                token_buckets.as_slice(),
            ),
            request_success: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        metric::REQUEST_SUCCESS_TOTAL,
                        "Count of successfully processed requests.",
                    ),
                    &["model_name", "finished_reason"],
                )
                .expect("valid"),
            ),
            prompt_tokens: counter(
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed.",
            ),
            generation_tokens: counter(
                metric::GENERATION_TOKENS_TOTAL,
                "Number of generation tokens processed.",
            ),
            prefix_cache_queries: counter(
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
            ),
            prefix_cache_hits: counter(
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
            ),
            kv_blocks_total: reg(
                &r,
                IntGaugeVec::new(
                    Opts::new(
                        metric::KV_BLOCKS_USABLE,
                        "Usable KV blocks in the pool.",
                    ),
                    m,
                )
                .expect("valid"),
            ),
            kv_blocks_used: reg(
                &r,
                IntGaugeVec::new(
                    Opts::new(metric::KV_BLOCKS_USED, "KV blocks held by sequences."),
                    m,
                )
                .expect("valid"),
            ),
            kv_internal_fragmentation: gauge(
                metric::KV_INTERNAL_FRAGMENTATION_RATIO,
                "Empty slots in each sequence's last KV block over used block capacity.",
                m,
            ),
            kv_reserved_unused: gauge(
                metric::KV_RESERVED_UNUSED_RATIO,
                "Whole KV blocks allocated ahead of tokens over used block capacity.",
                m,
            ),
            kv_token_occupancy: gauge(
                metric::KV_TOKEN_OCCUPANCY_RATIO,
                "Token slots holding tokens over used block capacity.",
                m,
            ),
            kv_external_fragmentation: gauge(
                metric::KV_EXTERNAL_FRAGMENTATION_RATIO,
                "1 - largest free run of KV blocks / free blocks (0 for paging).",
                m,
            ),
            serving_tier: gauge(
                metric::SERVING_TIER,
                "Degradation tier in force (0-3).",
                m,
            ),
            shed_total: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "brownout_serving_shed_total",
                        "Requests refused with 429 by load shedding.",
                    ),
                    &["model_name", "criticality"],
                )
                .expect("valid"),
            ),
            feature_disabled_total: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "brownout_serving_feature_disabled_total",
                        "Requests refused with 503 because their feature is disabled.",
                    ),
                    &["model_name", "feature"],
                )
                .expect("valid"),
            ),
            requests_total: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        metric::SERVING_REQUESTS_TOTAL,
                        "Answered requests by outcome (a finish reason, error, or a deliberate \
                         refusal: shed, feature_disabled, tool_disabled, drained, user_cap, \
                         loop_abort, throttled), feature (x-brownout-feature, `other` past 64 \
                         distinct values) and criticality.",
                    ),
                    &["model_name", "outcome", "feature", "criticality"],
                )
                .expect("valid"),
            ),
            refusals_total: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "brownout_serving_refusals_total",
                        "Requests the serving tier refused on purpose (deliberate degradation), \
                         by outcome and criticality.",
                    ),
                    &["model_name", "outcome", "criticality"],
                )
                .expect("valid"),
            ),
            draining: igauge(
                "brownout_serving_draining",
                "1 while this instance's command entry says drain (only critical admitted).",
            ),
            max_num_seqs: igauge(
                "brownout_serving_max_num_seqs",
                "max_num_seqs in force (configured, lowered by the command or the instance entry).",
            ),
            critical_reserve_seqs: igauge(
                "brownout_serving_critical_reserve_seqs",
                "Sequence slots only critical requests may take.",
            ),
            critical_reserve_seqs_used: igauge(
                "brownout_serving_critical_reserve_seqs_used",
                "Reserved sequence slots held by critical requests now.",
            ),
            critical_reserve_blocks: igauge(
                "brownout_serving_critical_reserve_blocks",
                "KV blocks only critical requests may take.",
            ),
            critical_reserve_blocks_used: igauge(
                "brownout_serving_critical_reserve_blocks_used",
                "Reserved KV blocks held by critical requests now.",
            ),
            admit_rps: gauge(
                "brownout_serving_admit_rps",
                "Admission rate for non-critical requests (+Inf: not limited).",
                m,
            ),
            admit_tokens: gauge(
                "brownout_serving_admit_tokens",
                "Tokens in the admission bucket (+Inf: not limited).",
                m,
            ),
            user_concurrency_cap: igauge(
                "brownout_serving_user_concurrency_cap",
                "Most agent requests in flight per user (0: no cap).",
            ),
            users_tracked: igauge(
                "brownout_serving_users_tracked",
                "Users in the bounded per-user table.",
            ),
            users_untracked: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        "brownout_serving_users_untracked_total",
                        "Agent requests admitted uncounted because the per-user table was full of \
                         active users.",
                    ),
                    m,
                )
                .expect("valid"),
            ),
            abort_entries: igauge(
                "brownout_serving_abort_entries",
                "Loop-kill (abort) entries in force.",
            ),
            command_epoch: igauge(
                "brownout_serving_command_epoch",
                "Epoch of the degradation command in force.",
            ),
            command_version: igauge(
                "brownout_serving_command_version",
                "Version of the degradation command in force.",
            ),
            arrivals_total: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        metric::SERVING_ARRIVALS_TOTAL,
                        "Requests that reached the admission gate, counted on arrival (admitted \
                         or refused), by attempt: `first`, or `retry` when the client's \
                         x-brownout-attempt header is above 1.",
                    ),
                    &["model_name", "attempt"],
                )
                .expect("valid"),
            ),
            abandoned_requests: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        metric::SERVING_ABANDONED_REQUESTS_TOTAL,
                        "Requests whose client went away before they finished (cancelled in the engine).",
                    ),
                    m,
                )
                .expect("valid"),
            ),
            abandoned_tokens: reg(
                &r,
                IntCounterVec::new(
                    Opts::new(
                        metric::SERVING_ABANDONED_TOKENS_TOTAL,
                        "Tokens generated for requests whose client went away (wasted work).",
                    ),
                    m,
                )
                .expect("valid"),
            ),
            features_seen: Default::default(),
            registry: r,
        };
        // Make every labelled series exist from the start (dashboards see zeros, not gaps).
        let n = [model_name];
        for c in [
            &metrics.num_preemptions,
            &metrics.prompt_tokens,
            &metrics.generation_tokens,
            &metrics.prefix_cache_queries,
            &metrics.prefix_cache_hits,
        ] {
            c.with_label_values(&n);
        }
        for h in [
            &metrics.ttft,
            &metrics.itl,
            &metrics.e2e,
            &metrics.queue_time,
            &metrics.prefill_time,
            &metrics.decode_time,
            &metrics.request_prompt_tokens,
            &metrics.request_generation_tokens,
            &metrics.request_max_num_generation_tokens,
        ] {
            h.with_label_values(&n);
        }
        for reason in FINISHED_REASONS {
            metrics
                .request_success
                .with_label_values(&[model_name, reason]);
        }
        for c in ["critical", "default", "sheddable"] {
            metrics.shed_total.with_label_values(&[model_name, c]);
            for o in crate::gate::Outcome::ALL {
                metrics
                    .refusals_total
                    .with_label_values(&[model_name, o.as_str(), c]);
            }
        }
        metrics.serving_tier.with_label_values(&n).set(0.0);
        metrics.abandoned_requests.with_label_values(&n);
        metrics.abandoned_tokens.with_label_values(&n);
        metrics.users_untracked.with_label_values(&n);
        for g in [&metrics.admit_rps, &metrics.admit_tokens] {
            g.with_label_values(&n).set(f64::INFINITY);
        }
        for g in [
            &metrics.draining,
            &metrics.critical_reserve_seqs,
            &metrics.critical_reserve_seqs_used,
            &metrics.critical_reserve_blocks,
            &metrics.critical_reserve_blocks_used,
            &metrics.abort_entries,
            &metrics.users_tracked,
            &metrics.user_concurrency_cap,
            &metrics.command_epoch,
            &metrics.command_version,
            &metrics.max_num_seqs,
        ] {
            g.with_label_values(&n).set(0);
        }
        metrics
    }

    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    fn l(&self) -> [&str; 1] {
        [self.model_name.as_str()]
    }

    /// Sets the model's series of `g` to `v`.
    fn set(&self, g: &GaugeVec, v: f64) {
        g.with_label_values(&self.l()).set(v);
    }

    pub fn set_kv(&self, s: &KvStats) {
        let l = self.l();
        self.set(&self.kv_cache_usage_perc, s.usage_ratio);
        self.kv_blocks_total
            .with_label_values(&l)
            .set(s.num_blocks_total as i64);
        self.kv_blocks_used
            .with_label_values(&l)
            .set(s.num_blocks_used as i64);
        self.set(
            &self.kv_internal_fragmentation,
            s.internal_fragmentation_ratio,
        );
        self.set(&self.kv_reserved_unused, s.reserved_unused_ratio);
        self.set(&self.kv_token_occupancy, s.token_occupancy_ratio);
        self.set(
            &self.kv_external_fragmentation,
            s.external_fragmentation_ratio,
        );
    }

    pub fn set_queue(&self, running: usize, waiting: usize) {
        self.set(&self.num_requests_running, running as f64);
        self.set(&self.num_requests_waiting, waiting as f64);
    }

    pub fn inc(&self, c: &CounterVec, by: f64) {
        if by > 0.0 {
            c.with_label_values(&self.l()).inc_by(by);
        }
    }

    pub fn observe(&self, h: &HistogramVec, v: f64) {
        h.with_label_values(&self.l()).observe(v);
    }

    /// One finished request, as vLLM's `PrometheusStatLogger` records `finished_requests`:
    /// its finish reason, phase times and token counts.
    pub fn observe_finished(&self, finished_reason: &str, f: &FinishedRequest) {
        self.request_success
            .with_label_values(&[self.model_name.as_str(), finished_reason])
            .inc();
        self.observe(&self.queue_time, f.queue_s);
        self.observe(&self.prefill_time, f.prefill_s);
        self.observe(&self.decode_time, f.decode_s);
        self.observe(&self.request_prompt_tokens, f.prompt_tokens as f64);
        self.observe(&self.request_generation_tokens, f.generation_tokens as f64);
    }

    pub fn set_tier(&self, tier: u8) {
        self.set(&self.serving_tier, f64::from(tier));
    }
    pub fn inc_shed(&self, criticality: &str) {
        self.shed_total
            .with_label_values(&[self.model_name.as_str(), criticality])
            .inc();
    }
    /// Makes `brownout_serving_feature_disabled_total{feature}` exist at 0 for features known
    /// in advance (the feature catalog), so dashboards and rate() see them before the first
    /// command that disables one.
    pub fn init_features<'a>(&self, features: impl IntoIterator<Item = &'a str>) {
        for f in features {
            self.feature_disabled_total
                .with_label_values(&[self.model_name.as_str(), f]);
        }
    }

    pub fn inc_feature_disabled(&self, feature: &str) {
        self.feature_disabled_total
            .with_label_values(&[self.model_name.as_str(), feature])
            .inc();
    }
    /// Counts one deliberate refusal (also in `brownout_serving_requests_total`).
    pub fn inc_refusal(&self, outcome: crate::gate::Outcome, feature: &str, criticality: &str) {
        self.refusals_total
            .with_label_values(&[self.model_name.as_str(), outcome.as_str(), criticality])
            .inc();
        self.inc_request(outcome.as_str(), feature, criticality);
    }

    /// One request at the admission gate (before it is admitted or refused).
    pub fn inc_arrival(&self, retry: bool) {
        let attempt = if retry { "retry" } else { "first" };
        self.arrivals_total
            .with_label_values(&[self.model_name.as_str(), attempt])
            .inc();
    }

    /// A request abandoned by its client after `tokens` were generated for it.
    pub fn inc_abandoned(&self, tokens: u64) {
        let l = self.l();
        // Tokens first: a scrape between the two never shows a request abandoned without its
        // tokens (a reader waiting on the request count then reads both).
        self.abandoned_tokens.with_label_values(&l).inc_by(tokens);
        self.abandoned_requests.with_label_values(&l).inc();
    }

    /// The engine's `max_num_seqs` in force and its critical reserve.
    pub fn set_engine_limits(&self, max_num_seqs: usize, r: &ReserveStats) {
        let l = self.l();
        let set = |g: &IntGaugeVec, v: usize| g.with_label_values(&l).set(v as i64);
        set(&self.max_num_seqs, max_num_seqs);
        set(&self.critical_reserve_seqs, r.seqs);
        set(&self.critical_reserve_seqs_used, r.seqs_used);
        set(&self.critical_reserve_blocks, r.blocks);
        set(&self.critical_reserve_blocks_used, r.blocks_used);
    }

    /// The gate's gauges.
    pub fn set_gate(&self, g: &crate::gate::GateFigures) {
        let l = self.l();
        self.draining
            .with_label_values(&l)
            .set(i64::from(g.draining));
        self.admit_rps
            .with_label_values(&l)
            .set(g.admit_rps.unwrap_or(f64::INFINITY));
        self.admit_tokens
            .with_label_values(&l)
            .set(g.admit_tokens.unwrap_or(f64::INFINITY));
        let set = |m: &IntGaugeVec, v: i64| m.with_label_values(&l).set(v);
        set(&self.user_concurrency_cap, i64::from(g.user_cap));
        set(&self.users_tracked, g.users_tracked as i64);
        let c = self.users_untracked.with_label_values(&l);
        if g.users_untracked_total > c.get() {
            c.inc_by(g.users_untracked_total - c.get());
        }
        set(&self.abort_entries, g.abort_entries as i64);
        set(&self.command_epoch, g.command.0 as i64);
        set(&self.command_version, g.command.1 as i64);
    }

    /// Counts one finished request (`outcome`: a finish reason or `error`).
    pub fn inc_request(&self, outcome: &str, feature: &str, criticality: &str) {
        let feature = {
            let mut seen = self
                .features_seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if seen.contains(feature) {
                feature
            } else if seen.len() < MAX_FEATURE_LABELS {
                seen.insert(feature.to_string());
                feature
            } else {
                "other"
            }
        };
        self.requests_total
            .with_label_values(&[self.model_name.as_str(), outcome, feature, criticality])
            .inc();
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding into a Vec cannot fail");
        String::from_utf8(buf).expect("prometheus text is UTF-8")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feature_label_values_are_capped() {
        let m = Metrics::new("m");
        for i in 0..MAX_FEATURE_LABELS + 10 {
            m.inc_request("stop", &format!("f{i}"), "default");
        }
        // A feature seen before the cap keeps its own series.
        m.inc_request("stop", "f0", "critical");
        let text = m.render();
        let series = text
            .lines()
            .filter(|l| l.starts_with("brownout_serving_requests_total{"))
            .count();
        assert_eq!(series, MAX_FEATURE_LABELS + 2, "{text}");
        assert!(text.contains(
            "brownout_serving_requests_total{criticality=\"default\",feature=\"other\",model_name=\"m\",outcome=\"stop\"} 10"
        ));
        assert!(text.contains(
            "brownout_serving_requests_total{criticality=\"critical\",feature=\"f0\",model_name=\"m\",outcome=\"stop\"} 1"
        ));
    }
}
