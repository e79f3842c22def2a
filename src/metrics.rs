//! The control plane's own metrics (`brownout_*`), in one Prometheus registry that every
//! component registers into and `/metrics` renders.
//!
//! Ingest's signals are fields of [`IngestMetrics`], the host registry's is
//! [`Metrics::host_up`]; other components call [`Metrics::registry`] and register their own
//! collectors.

use prometheus::{
    Encoder, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// Reasons a request or row was refused; the `reason` label's whole value set.
pub const REJECT_REASONS: [&str; 14] = [
    "unauthorized",
    "bad_tenant",
    "tenant_rate_limited",
    "too_many_items",
    "timeout",
    "body_too_large",
    "bad_encoding",
    "malformed",
    "invalid_line",
    "line_too_long",
    "overloaded",
    "spool_full",
    "unsupported_media_type",
    "decoded_too_large",
];

/// Ingest's counters and gauges.
#[derive(Clone)]
pub struct IngestMetrics {
    pub spans_total: IntCounter,
    pub logs_total: IntCounter,
    pub failures_total: IntCounter,
    pub snapshots_total: IntCounter,
    pub rejected_total: IntCounterVec,
    pub spool_bytes: IntGauge,
    pub spool_replayed_batches_total: IntCounter,
    pub spool_corrupt_records_total: IntCounter,
    pub store_write_seconds: Histogram,
    pub store_write_errors_total: IntCounter,
    pub inflight_bytes: IntGauge,
    /// Connections turned away at a listener's cap, by listener.
    pub connections_refused_total: IntCounterVec,
    /// Connections closed to make room, by listener: the oldest that had not sent a whole
    /// request head when the listener was full (net/src/evict.rs).
    pub connections_evicted_total: IntCounterVec,
    /// Items cut to the per-item limits (src/ingest/limits.rs), by what was cut.
    pub truncated_total: IntCounterVec,
}

/// The registry plus ingest's metrics.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pub ingest: IngestMetrics,
    /// `brownout_host_up{host}`: 1 while the host's gpu-agent reports (fresh or stale), 0 once
    /// it is down. Set once a second by the composition root's controller feeder.
    pub host_up: IntGaugeVec,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh registry with ingest's metrics registered.
    ///
    /// # Panics
    /// Only if two metrics here share a name (a programming error).
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid metric");
            registry
                .register(Box::new(g.clone()))
                .expect("unique metric");
            g
        };
        let rejected_total = IntCounterVec::new(
            Opts::new(
                "brownout_ingest_rejected_total",
                "Requests or rows refused by ingest, by reason.",
            ),
            &["reason"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(rejected_total.clone()))
            .expect("unique metric");
        for r in REJECT_REASONS {
            rejected_total.with_label_values(&[r]);
        }
        let store_write_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "brownout_store_write_seconds",
                "Time to write one batch to the store.",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
        )
        .expect("valid metric");
        registry
            .register(Box::new(store_write_seconds.clone()))
            .expect("unique metric");
        let connections_refused_total = IntCounterVec::new(
            Opts::new(
                "brownout_connections_refused_total",
                "Connections turned away because the listener was at server.max_connections or the client address at server.max_connections_per_ip.",
            ),
            &["listener"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(connections_refused_total.clone()))
            .expect("unique metric");
        let connections_evicted_total = IntCounterVec::new(
            Opts::new(
                "brownout_connections_evicted_total",
                "Connections closed to admit a new one with the listener at server.max_connections: the oldest that had not yet sent a whole request head.",
            ),
            &["listener"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(connections_evicted_total.clone()))
            .expect("unique metric");
        for l in ["http", "otlp_http", "otlp_grpc"] {
            connections_refused_total.with_label_values(&[l]);
            connections_evicted_total.with_label_values(&[l]);
        }
        let truncated_total = IntCounterVec::new(
            Opts::new(
                "brownout_ingest_truncated_total",
                "Attributes dropped, strings shortened or events skipped by the per-item ingest limits, by what.",
            ),
            &["what"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(truncated_total.clone()))
            .expect("unique metric");
        for w in [
            "attributes",
            "keys",
            "values",
            "names",
            "messages",
            "events",
        ] {
            truncated_total.with_label_values(&[w]);
        }
        let ingest = IngestMetrics {
            spans_total: counter("brownout_ingest_spans_total", "Spans accepted by ingest."),
            logs_total: counter(
                "brownout_ingest_logs_total",
                "OTLP log records accepted by ingest.",
            ),
            failures_total: counter(
                "brownout_ingest_failures_total",
                "Failure events accepted (NDJSON, error logs and error spans).",
            ),
            snapshots_total: counter(
                "brownout_ingest_snapshots_total",
                "Agent snapshots accepted.",
            ),
            rejected_total,
            spool_bytes: gauge(
                "brownout_spool_bytes",
                "Bytes waiting in the on-disk spool.",
            ),
            spool_replayed_batches_total: counter(
                "brownout_spool_replayed_batches_total",
                "Batches written to the store from the spool.",
            ),
            spool_corrupt_records_total: counter(
                "brownout_spool_corrupt_records_total",
                "Spool records skipped because their checksum did not match.",
            ),
            store_write_seconds,
            store_write_errors_total: counter(
                "brownout_store_write_errors_total",
                "Batch writes the store refused or timed out.",
            ),
            inflight_bytes: gauge(
                "brownout_ingest_inflight_bytes",
                "Accepted bytes held in memory, not yet written or spooled.",
            ),
            connections_refused_total,
            connections_evicted_total,
            truncated_total,
        };
        let host_up = IntGaugeVec::new(
            Opts::new(
                "brownout_host_up",
                "Whether the host's gpu-agent is reporting (0 once it is down).",
            ),
            &["host"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(host_up.clone()))
            .expect("unique metric");
        Metrics {
            registry,
            ingest,
            host_up,
        }
    }

    /// Register other components' collectors here.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Counts one refusal.
    pub fn reject(&self, reason: &'static str) {
        self.reject_n(reason, 1);
    }

    /// Counts `n` rejected items for `reason` (nothing when `n` is 0).
    pub fn reject_n(&self, reason: &'static str, n: u64) {
        if n > 0 {
            self.ingest
                .rejected_total
                .with_label_values(&[reason])
                .inc_by(n);
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let enc = TextEncoder::new();
        if let Err(e) = enc.encode(&self.registry.gather(), &mut buf) {
            tracing::warn!(error = %e, "cannot encode metrics");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_has_the_documented_names() {
        let m = Metrics::new();
        m.ingest.spans_total.inc_by(3);
        m.reject("malformed");
        let text = m.render();
        for name in [
            "brownout_ingest_spans_total 3",
            "brownout_ingest_logs_total",
            "brownout_ingest_failures_total",
            "brownout_ingest_rejected_total{reason=\"malformed\"} 1",
            "brownout_spool_bytes",
            "brownout_store_write_seconds_bucket",
        ] {
            assert!(text.contains(name), "missing {name} in\n{text}");
        }
    }
}
