//! Telemetry out: every request's record and every failure, exported without ever blocking
//! serving. Failures go as NDJSON [`FailureEvent`]s to `$BROWNOUT_CONTROL_PLANE/v1/failures`
//! (bearer `$BROWNOUT_INGEST_TOKEN`) through a bounded queue; when the queue is full the event is
//! dropped and counted. Every request becomes an OTLP span (gRPC, batch processor with a bounded
//! queue that drops when full) when `OTEL_EXPORTER_OTLP_ENDPOINT` is set; the span's trace id is
//! the failure event's `trace_id`, so the two join in the control plane.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use opentelemetry::KeyValue;
use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _, TracerProvider as _};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

use brownout_protocol::wire::attr;
use brownout_protocol::{Category, Criticality, FailureEvent};
use tokio::sync::mpsc;

/// What one finished (or failed) request looked like.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRecord {
    pub request_id: String,
    pub model: String,
    pub route: &'static str,
    pub criticality: Criticality,
    pub feature: String,
    pub tier: u8,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub queue_s: f64,
    pub ttft_s: f64,
    pub num_preemptions: u32,
    pub latency_s: f64,
    /// `stop`, `length`, `abort` for a success.
    pub finish_reason: Option<String>,
    /// The category and message of a failure.
    pub failure: Option<(Category, String)>,
    /// The request's outcome: a finish reason, `error`, or a deliberate refusal's name
    /// (`shed`, `feature_disabled`, `tool_disabled`, `drained`, `user_cap`, `loop_abort`,
    /// `throttled`; docs/SERVING.md "Outcomes").
    pub outcome: String,
    /// True when the serving tier refused the request on purpose (deliberate degradation): never
    /// an SLO error nor a failure pattern.
    pub deliberate: bool,
    /// `(epoch, version)` of the command in force when it was decided.
    pub command: (u64, u64),
    /// The request's user (`x-brownout-user` or the body's `user`), if any.
    pub user: Option<String>,
    /// `x-brownout-conversation`, if any.
    pub conversation: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct TelemetryConfig {
    /// `service` of failure events and spans.
    pub service: String,
    pub host: String,
    /// Base URL of the control plane (`BROWNOUT_CONTROL_PLANE`); failures are not exported when unset.
    pub control_plane: Option<String>,
    /// `BROWNOUT_INGEST_TOKEN`.
    pub ingest_token: Option<String>,
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub otlp_endpoint: Option<String>,
    /// Capacity of the failure queue.
    pub queue_capacity: usize,
    /// Events per POST.
    pub batch_max: usize,
    /// Export deliberate refusals (shed, feature disabled, …) as plain errors, not marked
    /// deliberate: how they counted before refusal-aware SLIs (docs/SLO.md). Only the overload
    /// benchmark's `no-refusal-aware-slis` ablation sets it.
    pub deliberate_as_errors: bool,
}

impl TelemetryConfig {
    pub fn from_env(service: &str) -> TelemetryConfig {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        TelemetryConfig {
            service: service.to_string(),
            host: env("HOSTNAME").unwrap_or_else(|| "localhost".into()),
            control_plane: env("BROWNOUT_CONTROL_PLANE"),
            ingest_token: env("BROWNOUT_INGEST_TOKEN"),
            otlp_endpoint: env("OTEL_EXPORTER_OTLP_ENDPOINT"),
            queue_capacity: 4096,
            batch_max: 256,
            deliberate_as_errors: false,
        }
    }
}

#[derive(Default)]
struct Counters {
    failures_queued: AtomicU64,
    failures_dropped: AtomicU64,
    failures_sent: AtomicU64,
    failures_send_errors: AtomicU64,
}

/// Cheap to clone; `request` never blocks.
#[derive(Clone)]
pub struct Telemetry {
    cfg: Arc<TelemetryConfig>,
    failures: Option<mpsc::Sender<FailureEvent>>,
    counters: Arc<Counters>,
    spans: Option<(SdkTracerProvider, SdkTracer)>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("failures", &self.failures.is_some())
            .finish_non_exhaustive()
    }
}

impl Telemetry {
    /// Exports nothing (counts nothing either).
    pub fn disabled() -> Telemetry {
        Telemetry {
            cfg: Arc::new(TelemetryConfig::default()),
            failures: None,
            counters: Arc::default(),
            spans: None,
        }
    }

    /// Starts the exporters the config asks for. Must run inside a tokio runtime.
    pub fn start(cfg: TelemetryConfig) -> Telemetry {
        let counters = Arc::new(Counters::default());
        let failures = cfg.control_plane.clone().map(|base| {
            let (tx, rx) = mpsc::channel(cfg.queue_capacity.max(1));
            tokio::spawn(post_failures(
                base,
                cfg.ingest_token.clone(),
                cfg.batch_max.max(1),
                rx,
                counters.clone(),
            ));
            tx
        });
        let spans = cfg.otlp_endpoint.as_deref().and_then(|ep| {
            match span_exporter(ep, &cfg.service, cfg.ingest_token.as_deref()) {
                Ok(p) => {
                    let tracer = p.tracer("brownout-serving");
                    Some((p, tracer))
                }
                Err(e) => {
                    tracing::warn!(endpoint = ep, error = %e, "OTLP span export disabled");
                    None
                }
            }
        });
        Telemetry {
            cfg: Arc::new(cfg),
            failures,
            counters,
            spans,
        }
    }

    /// Exports buffered spans now (tests; shutdown).
    pub fn flush(&self) {
        if let Some((p, _)) = &self.spans {
            let _ = p.force_flush();
        }
    }

    /// Flushes and stops the span exporter.
    pub fn shutdown(&self) {
        if let Some((p, _)) = &self.spans {
            let _ = p.shutdown();
        }
    }

    /// Records the request as one span; returns its trace id (hex) when spans are on.
    fn span(&self, r: &RequestRecord) -> String {
        let Some((_, tracer)) = &self.spans else {
            return String::new();
        };
        let end = SystemTime::now();
        let start = end
            .checked_sub(Duration::from_secs_f64(r.latency_s.max(0.0)))
            .unwrap_or(end);
        let mut attrs = vec![
            KeyValue::new("gen_ai.request.model", r.model.clone()),
            KeyValue::new(attr::REQUEST_ID, r.request_id.clone()),
            KeyValue::new(attr::ROUTE, r.route),
            KeyValue::new(attr::CRITICALITY, r.criticality.as_str()),
            KeyValue::new(attr::FEATURE, r.feature.clone()),
            KeyValue::new(attr::TIER, i64::from(r.tier)),
            KeyValue::new("gen_ai.usage.input_tokens", r.prompt_tokens as i64),
            KeyValue::new("gen_ai.usage.output_tokens", r.completion_tokens as i64),
            KeyValue::new(attr::QUEUE_TIME_S, r.queue_s),
            KeyValue::new(attr::TTFT_S, r.ttft_s),
            KeyValue::new(attr::NUM_PREEMPTIONS, i64::from(r.num_preemptions)),
        ];
        if let Some(f) = &r.finish_reason {
            attrs.push(KeyValue::new("gen_ai.response.finish_reasons", f.clone()));
        }
        attrs.push(KeyValue::new(attr::OUTCOME, r.outcome.clone()));
        attrs.push(KeyValue::new(attr::DELIBERATE, r.deliberate));
        attrs.push(KeyValue::new(attr::COMMAND_EPOCH, r.command.0 as i64));
        attrs.push(KeyValue::new(attr::COMMAND_VERSION, r.command.1 as i64));
        if let Some(c) = &r.conversation {
            attrs.push(KeyValue::new(attr::CONVERSATION, c.clone()));
        }
        if let Some((c, _)) = &r.failure {
            attrs.push(KeyValue::new("error.type", c.as_str()));
        }
        let mut span = tracer
            .span_builder("llm.request")
            .with_kind(SpanKind::Server)
            .with_start_time(start)
            .with_attributes(attrs)
            .start(tracer);
        // A deliberate refusal is the service working as designed: not an error span.
        if let Some((_, m)) = &r.failure
            && !r.deliberate
        {
            span.set_status(Status::error(m.clone()));
        }
        let trace_id = span.span_context().trace_id().to_string();
        span.end_with_timestamp(end);
        trace_id
    }

    /// Records a request: a failure event when it failed.
    pub fn request(&self, r: RequestRecord) {
        let mut r = r;
        if self.cfg.deliberate_as_errors {
            r.deliberate = false;
        }
        let trace_id = self.span(&r);
        if let Some((category, message)) = &r.failure {
            let mut attributes = BTreeMap::new();
            attributes.insert("model".into(), r.model.clone());
            attributes.insert("route".into(), r.route.to_string());
            attributes.insert("tier".into(), r.tier.to_string());
            attributes.insert("prompt_tokens".into(), r.prompt_tokens.to_string());
            attributes.insert("num_preemptions".into(), r.num_preemptions.to_string());
            attributes.insert("outcome".into(), r.outcome.clone());
            attributes.insert("command".into(), format!("{}:{}", r.command.0, r.command.1));
            if r.deliberate {
                attributes.insert("deliberate".into(), "true".into());
            }
            if let Some(c) = &r.conversation {
                attributes.insert("conversation_id".into(), c.clone());
            }
            let error_type = crate::gate::Outcome::parse(&r.outcome)
                .filter(|_| r.deliberate)
                .map_or(error_type(*category), crate::gate::Outcome::error_type);
            self.failure(FailureEvent {
                ts_ms: brownout_protocol::now_ms(),
                service: self.cfg.service.clone(),
                host: self.cfg.host.clone(),
                request_id: r.request_id.clone(),
                trace_id,
                user_id: r.user.clone().unwrap_or_default(),
                feature: r.feature.clone(),
                criticality: r.criticality,
                category: *category,
                error_type: error_type.to_string(),
                message: message.clone(),
                latency_ms: r.latency_s * 1000.0,
                attributes,
            });
        }
    }

    /// Queues a failure event, or drops and counts it when the queue is full.
    pub fn failure(&self, ev: FailureEvent) {
        let Some(tx) = &self.failures else { return };
        match tx.try_send(ev) {
            Ok(()) => self
                .counters
                .failures_queued
                .fetch_add(1, Ordering::Relaxed),
            Err(_) => self
                .counters
                .failures_dropped
                .fetch_add(1, Ordering::Relaxed),
        };
    }

    pub fn failures_dropped(&self) -> u64 {
        self.counters.failures_dropped.load(Ordering::Relaxed)
    }
    pub fn failures_sent(&self) -> u64 {
        self.counters.failures_sent.load(Ordering::Relaxed)
    }

    /// This module's own counters, in Prometheus text format.
    pub fn render_metrics(&self) -> String {
        let c = &self.counters;
        let mut s = String::new();
        for (name, help, v) in [
            (
                "brownout_serving_failure_events_queued_total",
                "Failure events queued for export.",
                &c.failures_queued,
            ),
            (
                "brownout_serving_failure_events_dropped_total",
                "Failure events dropped because the export queue was full.",
                &c.failures_dropped,
            ),
            (
                "brownout_serving_failure_events_sent_total",
                "Failure events accepted by the control plane.",
                &c.failures_sent,
            ),
            (
                "brownout_serving_failure_export_errors_total",
                "Failed POSTs of failure events.",
                &c.failures_send_errors,
            ),
        ] {
            s.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
                v.load(Ordering::Relaxed)
            ));
        }
        s
    }
}

/// The OTLP/gRPC span exporter. brownout's own receiver wants the ingest token as a bearer
/// header; other collectors ignore it.
fn span_exporter(
    endpoint: &str,
    service: &str,
    token: Option<&str>,
) -> Result<SdkTracerProvider, String> {
    use opentelemetry_otlp::{WithExportConfig, WithTonicConfig};
    let mut metadata = tonic::metadata::MetadataMap::new();
    if let Some(t) = token {
        let v = format!("Bearer {t}")
            .parse()
            .map_err(|_| "the ingest token is not a valid header value".to_string())?;
        metadata.insert("authorization", v);
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_metadata(metadata)
        .with_endpoint(endpoint)
        .with_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| e.to_string())?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service.to_string())
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

fn error_type(c: Category) -> &'static str {
    match c {
        Category::TimeoutResource => "QueueTimeout",
        Category::KvCacheExhausted => "KvCacheExhausted",
        Category::ModelError => "ModelError",
        Category::RateLimited => "LoadShed",
        Category::Degraded => "FeatureDisabled",
        _ => "ServingError",
    }
}

async fn post_failures(
    base: String,
    token: Option<String>,
    batch_max: usize,
    mut rx: mpsc::Receiver<FailureEvent>,
    c: Arc<Counters>,
) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = match reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "failure export disabled: no HTTP client");
            return;
        }
    };
    let url = format!("{}/v1/failures", base.trim_end_matches('/'));
    let mut batch = Vec::with_capacity(batch_max);
    while rx.recv_many(&mut batch, batch_max).await > 0 {
        let mut body = String::new();
        for ev in batch.drain(..) {
            if let Ok(line) = serde_json::to_string(&ev) {
                body.push_str(&line);
                body.push('\n');
            }
        }
        let n = body.lines().count() as u64;
        let mut req = client
            .post(&url)
            .header("content-type", "application/x-ndjson")
            .body(body);
        if let Some(t) = &token {
            req = req.bearer_auth(t);
        }
        match req.send().await {
            Ok(r) if r.status().is_success() => {
                c.failures_sent.fetch_add(n, Ordering::Relaxed);
            }
            Ok(r) => {
                c.failures_send_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(status = %r.status(), "failure export refused");
            }
            Err(e) => {
                c.failures_send_errors.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(error = %e, "failure export failed");
            }
        }
    }
}
