//! Names both sides of a wire spell the same: the span attributes the serving tier emits and the
//! control plane reads ([`attr`]), the HTTP headers a client (the load generator, the drills)
//! sends and the serving tier reads or answers with ([`header`]), and the Prometheus metric
//! names the serving tier exports and the gpu-agent, the SLO rules and the demo read
//! ([`metric`]). One spelling here, so a rename on one side cannot leave the other reading a
//! name nobody writes any more.
//!
//! Fallback spellings that only the reader knows (`ttft_s` without the prefix, the GenAI
//! semantic-convention names) stay with their readers.

/// Span attributes (`brownout.*`) of the serving tier's `llm.request` span, read at ingest and
/// by the SLO evaluator, the agent guards and the trace pages (docs/SLO.md "Span attributes
/// read").
pub mod attr {
    pub const REQUEST_ID: &str = "brownout.request_id";
    /// `primary` or `fallback`.
    pub const ROUTE: &str = "brownout.route";
    pub const CRITICALITY: &str = "brownout.criticality";
    pub const FEATURE: &str = "brownout.feature";
    /// The degradation tier in force (0–3).
    pub const TIER: &str = "brownout.tier";
    /// Seconds waiting before the first scheduled step.
    pub const QUEUE_TIME_S: &str = "brownout.queue_time_s";
    /// Time to first token, seconds (what the serving tier exports).
    pub const TTFT_S: &str = "brownout.ttft_s";
    /// Time to first token, milliseconds (other producers; read when [`TTFT_S`] is absent).
    pub const TTFT_MS: &str = "brownout.ttft_ms";
    pub const NUM_PREEMPTIONS: &str = "brownout.num_preemptions";
    /// The finish reason, or why the request was refused.
    pub const OUTCOME: &str = "brownout.outcome";
    /// `true` on a request refused on purpose (not an SLO error, not a failure pattern).
    pub const DELIBERATE: &str = "brownout.deliberate";
    pub const COMMAND_EPOCH: &str = "brownout.command_epoch";
    pub const COMMAND_VERSION: &str = "brownout.command_version";
    /// The agent conversation a request belongs to (`x-brownout-conversation`).
    pub const CONVERSATION: &str = "brownout.conversation";
    /// `request` or `agent_task` (other producers; the serving tier's spans are requests).
    pub const KIND: &str = "brownout.kind";

    /// Every name above (the docs test checks each is documented).
    pub const ALL: &[&str] = &[
        REQUEST_ID,
        ROUTE,
        CRITICALITY,
        FEATURE,
        TIER,
        QUEUE_TIME_S,
        TTFT_S,
        TTFT_MS,
        NUM_PREEMPTIONS,
        OUTCOME,
        DELIBERATE,
        COMMAND_EPOCH,
        COMMAND_VERSION,
        CONVERSATION,
        KIND,
    ];
}

/// HTTP headers between clients and the serving tier.
pub mod header {
    /// Request: the call's criticality (`critical`, `default`, `sheddable`).
    pub const CRITICALITY: &str = "x-brownout-criticality";
    /// Request: the product feature the call serves.
    pub const FEATURE: &str = "x-brownout-feature";
    /// Request: the end user (per-user in-flight cap).
    pub const USER: &str = "x-brownout-user";
    /// Request: the agent conversation (loop guard, per-user cap).
    pub const CONVERSATION: &str = "x-brownout-conversation";
    /// Request: 1 for a first try, above 1 for a retry (counted apart on arrival).
    pub const ATTEMPT: &str = "x-brownout-attempt";
    /// Response: why a request was refused (the `outcome` of the error body).
    pub const OUTCOME: &str = "x-brownout-outcome";
    /// Response: the route (`primary` or `fallback`) that answered.
    pub const ROUTE: &str = "x-brownout-route";
    /// Response (`--upstream`): the model name the upstream was asked for.
    pub const UPSTREAM_MODEL: &str = "x-brownout-upstream-model";

    /// Every name above (the docs test checks each is documented).
    pub const ALL: &[&str] = &[
        CRITICALITY,
        FEATURE,
        USER,
        CONVERSATION,
        ATTEMPT,
        OUTCOME,
        ROUTE,
        UPSTREAM_MODEL,
    ];
}

/// Prometheus metric names the serving tier exports (vLLM's names where vLLM has one) and
/// other processes read back from its `/metrics`.
pub mod metric {
    /// Gauge, 0–1.
    pub const KV_CACHE_USAGE_PERC: &str = "vllm:kv_cache_usage_perc";
    pub const NUM_REQUESTS_RUNNING: &str = "vllm:num_requests_running";
    pub const NUM_REQUESTS_WAITING: &str = "vllm:num_requests_waiting";
    pub const NUM_PREEMPTIONS_TOTAL: &str = "vllm:num_preemptions_total";
    /// Histogram, seconds.
    pub const TIME_TO_FIRST_TOKEN_SECONDS: &str = "vllm:time_to_first_token_seconds";
    /// Histogram, seconds.
    pub const E2E_REQUEST_LATENCY_SECONDS: &str = "vllm:e2e_request_latency_seconds";
    /// Histogram, seconds.
    pub const REQUEST_QUEUE_TIME_SECONDS: &str = "vllm:request_queue_time_seconds";
    /// Counter, label `finished_reason`.
    pub const REQUEST_SUCCESS_TOTAL: &str = "vllm:request_success_total";
    pub const GENERATION_TOKENS_TOTAL: &str = "vllm:generation_tokens_total";
    /// Usable KV blocks in the pool.
    pub const KV_BLOCKS_USABLE: &str = "brownout_kv_blocks_usable";
    pub const KV_BLOCKS_USED: &str = "brownout_kv_blocks_used";
    pub const KV_INTERNAL_FRAGMENTATION_RATIO: &str = "brownout_kv_internal_fragmentation_ratio";
    pub const KV_RESERVED_UNUSED_RATIO: &str = "brownout_kv_reserved_unused_ratio";
    pub const KV_TOKEN_OCCUPANCY_RATIO: &str = "brownout_kv_token_occupancy_ratio";
    pub const KV_EXTERNAL_FRAGMENTATION_RATIO: &str = "brownout_kv_external_fragmentation_ratio";
    /// Gauge: the degradation tier in force.
    pub const SERVING_TIER: &str = "brownout_serving_tier";
    /// Counter of answered requests, labels `outcome`, `feature`, `criticality`.
    pub const SERVING_REQUESTS_TOTAL: &str = "brownout_serving_requests_total";
    /// Counter of requests on arrival, label `attempt` (`first`, `retry`).
    pub const SERVING_ARRIVALS_TOTAL: &str = "brownout_serving_arrivals_total";
    pub const SERVING_ABANDONED_REQUESTS_TOTAL: &str = "brownout_serving_abandoned_requests_total";
    pub const SERVING_ABANDONED_TOKENS_TOTAL: &str = "brownout_serving_abandoned_tokens_total";

    /// Every name above (the docs test checks each is documented).
    pub const ALL: &[&str] = &[
        KV_CACHE_USAGE_PERC,
        NUM_REQUESTS_RUNNING,
        NUM_REQUESTS_WAITING,
        NUM_PREEMPTIONS_TOTAL,
        TIME_TO_FIRST_TOKEN_SECONDS,
        E2E_REQUEST_LATENCY_SECONDS,
        REQUEST_QUEUE_TIME_SECONDS,
        REQUEST_SUCCESS_TOTAL,
        GENERATION_TOKENS_TOTAL,
        KV_BLOCKS_USABLE,
        KV_BLOCKS_USED,
        KV_INTERNAL_FRAGMENTATION_RATIO,
        KV_RESERVED_UNUSED_RATIO,
        KV_TOKEN_OCCUPANCY_RATIO,
        KV_EXTERNAL_FRAGMENTATION_RATIO,
        SERVING_TIER,
        SERVING_REQUESTS_TOTAL,
        SERVING_ARRIVALS_TOTAL,
        SERVING_ABANDONED_REQUESTS_TOTAL,
        SERVING_ABANDONED_TOKENS_TOTAL,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_keep_their_namespaces() {
        for a in attr::ALL {
            assert!(a.starts_with("brownout."), "{a}");
        }
        for h in header::ALL {
            // Lower case: `HeaderName::from_static` panics on anything else.
            assert!(
                h.starts_with("x-brownout-") && *h == h.to_ascii_lowercase(),
                "{h}"
            );
        }
        for m in metric::ALL {
            assert!(m.starts_with("vllm:") || m.starts_with("brownout_"), "{m}");
        }
    }

    /// `ALL` of each module lists every constant of it (read from this file).
    #[test]
    fn every_name_is_in_its_modules_all() {
        let src = include_str!("wire.rs");
        for (module, all) in [
            ("attr", attr::ALL),
            ("header", header::ALL),
            ("metric", metric::ALL),
        ] {
            let start = src.find(&format!("pub mod {module} {{")).expect("module");
            let body = &src[start..start + src[start..].find("\n}").expect("end")];
            let consts = body.matches("pub const ").count() - 1; // minus ALL itself
            assert_eq!(consts, all.len(), "{module}::ALL misses a constant");
        }
    }
}
