//! `brownout-serve --upstream URL`: the serving tier's OpenAI API and admission gate in front of
//! any OpenAI-compatible engine (vLLM, SGLang, TGI, llama.cpp's server, another brownout-serve).
//! The same gate ([`crate::gate`]) and command subscriber ([`crate::control`]) as the bundled
//! engine decide; the request is then forwarded (docs/UPSTREAM.md).
//!
//! ```text
//!  client ─▶ api shapes + RequestMeta ─▶ gate (T1 features, T3 shed, drain, user cap, tool
//!            breakers, abort list, admit_rps)
//!                 │ route (T2: primary | fallback) → upstream URL + upstream model name,
//!                 │ max_tokens cap (non-critical)
//!                 v
//!            limiter (bounded concurrency; critical reserve; limits.max_num_seqs) ─▶ upstream
//!                 │ SSE bytes passed through as they arrive; a client that goes away closes
//!                 │ the upstream connection (the upstream cancels the request)
//!                 v
//!            vLLM-named metrics measured here (TTFT, ITL, e2e, queue time)
//! ```
//!
//! Nothing here touches the engine: without `--upstream` brownout-serve runs the bundled engine
//! exactly as before.

pub mod bench;
pub mod limiter;
pub mod proxy;
pub mod sse;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use prometheus::{IntCounterVec, IntGaugeVec, Opts};
use serde_json::{Value, json};

use crate::control::ControlHandle;
use crate::gate::{Gate, GateConfig, RouteChoice};
use crate::metrics::Metrics;
use crate::telemetry::Telemetry;
pub use limiter::{Limiter, LimiterFigures};

/// A route's name as the command and the flags spell it.
pub fn route_name(r: RouteChoice) -> &'static str {
    match r {
        RouteChoice::Primary => "primary",
        RouteChoice::Fallback => "fallback",
    }
}

fn parse_route(s: &str) -> Result<RouteChoice, String> {
    match s {
        "primary" => Ok(RouteChoice::Primary),
        "fallback" => Ok(RouteChoice::Fallback),
        other => Err(format!(
            "the route must be primary or fallback (got {:?})",
            other.chars().take(40).collect::<String>()
        )),
    }
}

/// Checks and normalises an upstream base URL: `http(s)://host[:port][/prefix]`, without a
/// trailing `/` or `/v1` (both are accepted and dropped).
///
/// # Errors
/// A message naming what is wrong.
pub fn normalize_url(url: &str) -> Result<String, String> {
    let u = url.trim();
    let rest = u
        .strip_prefix("http://")
        .or_else(|| u.strip_prefix("https://"))
        .ok_or_else(|| {
            format!("the upstream URL must start with http:// or https:// (got {u:?})")
        })?;
    if rest.is_empty() || rest.starts_with('/') {
        return Err(format!("the upstream URL has no host (got {u:?})"));
    }
    if u.chars().any(|c| c.is_whitespace() || c.is_control()) || u.contains(['?', '#']) {
        return Err(format!(
            "the upstream URL must be a base URL without spaces, query or fragment (got {u:?})"
        ));
    }
    let mut u = u.trim_end_matches('/').to_string();
    if let Some(s) = u.strip_suffix("/v1") {
        u = s.to_string();
    }
    Ok(u)
}

/// `--upstream [ROUTE=]URL` (a bare URL is the primary route).
///
/// # Errors
/// A bad route or URL.
pub fn parse_upstream_arg(s: &str) -> Result<(RouteChoice, String), String> {
    match s.split_once('=') {
        Some((r, url)) if !r.contains("://") => Ok((parse_route(r.trim())?, normalize_url(url)?)),
        _ => Ok((RouteChoice::Primary, normalize_url(s)?)),
    }
}

/// `--upstream-model ROUTE=NAME`: the model name sent upstream on that route.
///
/// # Errors
/// A bad route or an empty / over-long name.
pub fn parse_model_arg(s: &str) -> Result<(RouteChoice, String), String> {
    let (r, m) = s
        .split_once('=')
        .ok_or_else(|| format!("--upstream-model takes ROUTE=NAME (got {s:?})"))?;
    let m = m.trim();
    if m.is_empty() || m.len() > 256 || m.chars().any(char::is_control) {
        return Err(format!(
            "the upstream model name must be 1-256 characters without control characters (got {m:?})"
        ));
    }
    Ok((parse_route(r.trim())?, m.to_string()))
}

/// Everything the proxy needs (the flags of `brownout-serve --upstream`).
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    /// Route → base URL; `primary` is required.
    pub upstreams: Vec<(RouteChoice, String)>,
    /// Route → the model name sent upstream (else the first model its `/v1/models` lists).
    pub models: Vec<(RouteChoice, String)>,
    /// The model name clients send and `/v1/models` shows (else the primary route's model).
    pub served_model_name: Option<String>,
    /// Requests in flight to the upstreams at most (`--upstream-max-concurrency`).
    pub max_concurrency: usize,
    /// Share of those slots only critical requests may take.
    pub critical_reserve_ratio: f64,
    /// How long a request may wait for a slot.
    pub max_queue_wait: Duration,
    /// Requests that may wait for a slot at most.
    pub max_waiting: usize,
    pub connect_timeout: Duration,
    /// Longest silence while reading an answer (each read of the body, streams included).
    pub read_timeout: Duration,
    /// Between health probes (`GET /v1/models`) of each upstream.
    pub health_interval: Duration,
    pub max_body_bytes: usize,
    /// Sent as `Authorization: Bearer` upstream (else the client's `Authorization` is passed on).
    pub api_key: Option<String>,
    /// `Retry-After` of `upstream_unavailable` (seconds).
    pub unavailable_retry_after_s: u64,
    pub gate: GateConfig,
}

impl Default for ProxyOptions {
    fn default() -> ProxyOptions {
        ProxyOptions {
            upstreams: Vec::new(),
            models: Vec::new(),
            served_model_name: None,
            max_concurrency: 64,
            critical_reserve_ratio: 0.2,
            max_queue_wait: Duration::from_secs(60),
            max_waiting: 4096,
            connect_timeout: Duration::from_secs(2),
            read_timeout: Duration::from_secs(60),
            health_interval: Duration::from_secs(1),
            max_body_bytes: 1 << 20,
            api_key: None,
            unavailable_retry_after_s: 5,
            gate: GateConfig::default(),
        }
    }
}

/// One upstream server (several routes may share it).
#[derive(Debug)]
pub struct Upstream {
    pub base: String,
    up: AtomicBool,
    /// Probed at least once.
    probed: AtomicBool,
    last_error: Mutex<String>,
    /// The first model of its `/v1/models`.
    discovered_model: RwLock<Option<String>>,
    /// Its `max_model_len` when `/v1/models` gives one (0: unknown).
    max_model_len: AtomicUsize,
    /// Unix ms of the last change of `up`.
    since_ms: AtomicU64,
    /// Unix ms of the last sign of life from a request (an answer, a stream chunk): the prober
    /// leaves an upstream alone while requests show it is up.
    alive_ms: AtomicU64,
}

impl Upstream {
    fn new(base: String) -> Upstream {
        Upstream {
            base,
            up: AtomicBool::new(false),
            probed: AtomicBool::new(false),
            last_error: Mutex::new("not probed yet".into()),
            discovered_model: RwLock::new(None),
            max_model_len: AtomicUsize::new(0),
            since_ms: AtomicU64::new(brownout_protocol::now_ms()),
            alive_ms: AtomicU64::new(0),
        }
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// A request saw the upstream answer.
    pub(crate) fn touch(&self) {
        self.alive_ms
            .store(brownout_protocol::now_ms(), Ordering::Relaxed);
    }

    /// Whether a request saw it answer within `within`.
    fn recently_alive(&self, within: Duration) -> bool {
        let t = self.alive_ms.load(Ordering::Relaxed);
        self.is_up() && brownout_protocol::now_ms().saturating_sub(t) < within.as_millis() as u64
    }

    pub(crate) fn mark_up(&self) {
        self.touch();
        self.probed.store(true, Ordering::Relaxed);
        if !self.up.swap(true, Ordering::Relaxed) {
            self.since_ms
                .store(brownout_protocol::now_ms(), Ordering::Relaxed);
            tracing::info!(upstream = %self.base, "upstream is up");
        }
    }

    pub(crate) fn mark_down(&self, why: String) {
        self.probed.store(true, Ordering::Relaxed);
        let was_up = self.up.swap(false, Ordering::Relaxed);
        if was_up {
            self.since_ms
                .store(brownout_protocol::now_ms(), Ordering::Relaxed);
            tracing::warn!(upstream = %self.base, error = %why, "upstream is down");
        }
        *self
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = why;
    }

    pub fn last_error(&self) -> String {
        self.last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn discovered_model(&self) -> Option<String> {
        self.discovered_model
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn max_model_len(&self) -> Option<usize> {
        match self.max_model_len.load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }

    /// `GET /v1/models` (with `key`, `--upstream-api-key`, as a bearer token): up when it
    /// answers 2xx; learns the first model's id and length. Without a key of its own, an
    /// upstream that asks for one (401, 403) is up too: the clients' keys are passed on.
    async fn probe(&self, client: &reqwest::Client, timeout: Duration, key: Option<&str>) {
        let mut rb = client
            .get(format!("{}/v1/models", self.base))
            .timeout(timeout);
        if let Some(k) = key {
            rb = rb.bearer_auth(k);
        }
        let r = rb.send().await;
        match r {
            Ok(r) if key.is_none() && matches!(r.status().as_u16(), 401 | 403) => self.mark_up(),
            Ok(r) if key.is_some() && matches!(r.status().as_u16(), 401 | 403) => {
                self.mark_down(format!(
                    "GET /v1/models answered {}: the upstream refuses --upstream-api-key",
                    r.status()
                ))
            }
            Ok(r) if r.status().is_success() => {
                self.mark_up();
                if let Ok(v) = r.json::<Value>().await {
                    let first = &v["data"][0];
                    if let Some(id) = first["id"].as_str() {
                        *self
                            .discovered_model
                            .write()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) =
                            Some(id.chars().take(256).collect());
                    }
                    if let Some(n) = first["max_model_len"].as_u64() {
                        self.max_model_len
                            .store(usize::try_from(n).unwrap_or(0), Ordering::Relaxed);
                    }
                }
            }
            Ok(r) => self.mark_down(format!("GET /v1/models answered {}", r.status())),
            Err(e) => self.mark_down(describe(&e)),
        }
    }

    fn view(&self) -> Value {
        json!({
            "url": self.base,
            "up": self.is_up(),
            "since": chrono::DateTime::from_timestamp_millis(self.since_ms.load(Ordering::Relaxed) as i64)
                .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
            "error": (!self.is_up()).then(|| self.last_error()),
            "model": self.discovered_model(),
            "max_model_len": self.max_model_len(),
        })
    }
}

/// A reqwest error with its causes ("error sending request…: connection refused").
pub fn describe(e: &reqwest::Error) -> String {
    let mut s = if e.is_timeout() {
        "timed out".to_string()
    } else if e.is_connect() {
        "cannot connect".to_string()
    } else {
        e.to_string()
    };
    let mut src = std::error::Error::source(e);
    let mut last = String::new();
    while let Some(c) = src {
        let t = c.to_string();
        if t != last && !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        last = t;
        src = std::error::Error::source(c);
    }
    s.chars().take(300).collect()
}

/// One route: where it goes and which model it asks for.
#[derive(Debug, Clone)]
pub struct Route {
    pub choice: RouteChoice,
    pub upstream: Arc<Upstream>,
    /// `--upstream-model ROUTE=NAME`.
    pub model: Option<String>,
}

impl Route {
    /// The model name sent upstream: the flag's, else the upstream's first model.
    pub fn model(&self) -> Option<String> {
        self.model
            .clone()
            .or_else(|| self.upstream.discovered_model())
    }
    pub fn name(&self) -> &'static str {
        route_name(self.choice)
    }
}

/// The proxy's own series (registered next to the vLLM-named ones).
#[derive(Clone)]
pub(crate) struct ProxyMetrics {
    pub up: IntGaugeVec,
    pub requests: IntCounterVec,
}

impl ProxyMetrics {
    fn new(m: &Metrics) -> anyhow::Result<ProxyMetrics> {
        let up = IntGaugeVec::new(
            Opts::new(
                "brownout_upstream_up",
                "1 while the route's upstream answers (health probe or the last request).",
            ),
            &["model_name", "route", "url"],
        )?;
        let requests = IntCounterVec::new(
            Opts::new(
                "brownout_upstream_requests_total",
                "Requests forwarded upstream by route and result (2xx, 4xx, 5xx, \
                 connect_error, timeout, error).",
            ),
            &["model_name", "route", "result"],
        )?;
        m.registry.register(Box::new(up.clone()))?;
        m.registry.register(Box::new(requests.clone()))?;
        Ok(ProxyMetrics { up, requests })
    }
}

/// Everything a proxy handler needs; cheap to clone.
#[derive(Clone)]
pub struct ProxyState {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub client: reqwest::Client,
    pub primary: Route,
    pub fallback: Route,
    pub upstreams: Vec<Arc<Upstream>>,
    pub control: ControlHandle,
    pub gate: Gate,
    pub limiter: Limiter,
    pub metrics: Arc<Metrics>,
    pub proxy_metrics: ProxyMetrics,
    pub telemetry: Telemetry,
    pub served_model: String,
    pub opts: ProxyOptions,
    pub created_s: u64,
}

impl ProxyState {
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }
    pub fn model_name(&self) -> &str {
        &self.inner.served_model
    }
    pub fn gate(&self) -> &Gate {
        &self.inner.gate
    }
    pub fn limiter(&self) -> &Limiter {
        &self.inner.limiter
    }
    pub(crate) fn route(&self, r: RouteChoice) -> &Route {
        match r {
            RouteChoice::Primary => &self.inner.primary,
            RouteChoice::Fallback => &self.inner.fallback,
        }
    }
    pub(crate) fn route_by_name(&self, name: &str) -> &Route {
        if name == "fallback" {
            &self.inner.fallback
        } else {
            &self.inner.primary
        }
    }
    /// Each route with its upstream's state.
    pub fn routes_view(&self) -> Value {
        let mut m = serde_json::Map::new();
        for r in [&self.inner.primary, &self.inner.fallback] {
            let mut v = r.upstream.view();
            v["model"] = json!(r.model());
            m.insert(r.name().into(), v);
        }
        Value::Object(m)
    }
}

/// The HTTP client to the upstreams: pooled keep-alive connections, connect and read timeouts.
///
/// # Errors
/// When the TLS backend cannot start.
pub fn http_client(opts: &ProxyOptions) -> anyhow::Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(opts.connect_timeout)
        .read_timeout(opts.read_timeout)
        .pool_max_idle_per_host(opts.max_concurrency.max(1))
        .pool_idle_timeout(Duration::from_secs(60))
        .tcp_nodelay(true)
        .user_agent(concat!("brownout-serve/", env!("CARGO_PKG_VERSION")))
        .build()
        .context("building the upstream HTTP client")
}

/// Builds the proxy: probes each upstream once (learning its model names), then keeps probing
/// every `health_interval` in the background.
///
/// # Errors
/// Bad options, or no served model name (the primary upstream is unreachable and neither
/// `served_model_name` nor the primary route's model is given).
pub async fn build_proxy(
    opts: ProxyOptions,
    control: ControlHandle,
    telemetry: Telemetry,
) -> anyhow::Result<ProxyState> {
    anyhow::ensure!(
        (0.0..1.0).contains(&opts.critical_reserve_ratio),
        "--critical-reserve-ratio must be in [0, 1) (got {})",
        opts.critical_reserve_ratio
    );
    anyhow::ensure!(
        opts.max_concurrency > 0,
        "--upstream-max-concurrency must be positive"
    );
    fn one_per_route(
        v: &[(RouteChoice, String)],
        flag: &str,
    ) -> anyhow::Result<[Option<String>; 2]> {
        let mut out: [Option<String>; 2] = [None, None];
        for (r, x) in v {
            let slot = &mut out[usize::from(*r == RouteChoice::Fallback)];
            anyhow::ensure!(slot.is_none(), "{flag} {} is given twice", route_name(*r));
            *slot = Some(x.clone());
        }
        Ok(out)
    }
    let [primary_url, fallback_url] = one_per_route(&opts.upstreams, "--upstream")?;
    let [primary_model, fallback_model] = one_per_route(&opts.models, "--upstream-model")?;
    let primary_url = primary_url.context(
        "--upstream needs a primary route (a bare URL, or primary=URL) when a fallback is given",
    )?;
    let fallback_url = fallback_url.unwrap_or_else(|| primary_url.clone());
    let primary_up = Arc::new(Upstream::new(primary_url.clone()));
    let fallback_up = if fallback_url == primary_url {
        primary_up.clone()
    } else {
        Arc::new(Upstream::new(fallback_url))
    };
    let mut upstreams = vec![primary_up.clone()];
    if !Arc::ptr_eq(&primary_up, &fallback_up) {
        upstreams.push(fallback_up.clone());
    }
    let client = http_client(&opts)?;
    let probe_timeout = opts.connect_timeout + Duration::from_secs(2);
    let key = opts.api_key.clone();
    futures::future::join_all(
        upstreams
            .iter()
            .map(|u| u.probe(&client, probe_timeout, key.as_deref())),
    )
    .await;
    for u in &upstreams {
        if !u.is_up() {
            tracing::warn!(upstream = %u.base, error = %u.last_error(), "upstream not reachable at start");
        }
    }
    let primary = Route {
        choice: RouteChoice::Primary,
        upstream: primary_up,
        model: primary_model,
    };
    // A fallback route without its own model asks for the primary's model (of its upstream).
    let fallback = Route {
        choice: RouteChoice::Fallback,
        upstream: fallback_up,
        model: fallback_model,
    };
    let served = opts
        .served_model_name
        .clone()
        .or_else(|| primary.model())
        .context(
            "the primary upstream is not reachable, so its model name is unknown: give \
             --served-model-name or --upstream-model primary=NAME",
        )?;
    let metrics = Arc::new(Metrics::new(&served));
    let proxy_metrics = ProxyMetrics::new(&metrics).context("registering proxy metrics")?;
    let limiter = Limiter::new(
        opts.max_concurrency,
        opts.critical_reserve_ratio,
        opts.max_waiting,
        Some(control.clone()),
    );
    let state = ProxyState {
        inner: Arc::new(Inner {
            client,
            primary,
            fallback,
            upstreams,
            gate: Gate::new(control.clone(), opts.gate.clone()),
            control,
            limiter,
            metrics,
            proxy_metrics,
            telemetry,
            served_model: served,
            created_s: brownout_protocol::now_ms() / 1000,
            opts,
        }),
    };
    spawn_prober(Arc::downgrade(&state.inner), probe_timeout);
    Ok(state)
}

/// Probes every upstream each `health_interval` while the proxy exists, except one that a
/// request saw answering within the interval (probes are not free for every server: llama.cpp's
/// Python server, for one, interrupts a running stream when another request arrives, unless it
/// runs with `--interrupt_requests False`).
fn spawn_prober(weak: Weak<Inner>, timeout: Duration) {
    tokio::spawn(async move {
        loop {
            let Some(inner) = weak.upgrade() else { return };
            let every = inner.opts.health_interval;
            let client = inner.client.clone();
            let ups = inner.upstreams.clone();
            let key = inner.opts.api_key.clone();
            drop(inner);
            tokio::time::sleep(every).await;
            futures::future::join_all(
                ups.iter()
                    .filter(|u| !u.recently_alive(every))
                    .map(|u| u.probe(&client, timeout, key.as_deref())),
            )
            .await;
        }
    });
}

/// The proxy's API: the bundled engine's routes plus `/metrics/upstream/{route}` (the
/// upstream's own `/metrics`, passed through). Merge `/v1/features` onto it.
pub fn router(state: ProxyState) -> Router {
    let limit = state.inner.opts.max_body_bytes;
    Router::new()
        .route("/v1/completions", post(proxy::completions))
        .route("/v1/chat/completions", post(proxy::chat_completions))
        .route("/v1/models", get(proxy::models))
        .route("/health", get(proxy::health))
        .route("/metrics", get(proxy::metrics))
        .route("/metrics/upstream/{route}", get(proxy::upstream_metrics))
        .route("/debug/resource", get(proxy::debug_resource))
        .fallback(crate::api::handlers::not_found)
        .method_not_allowed_fallback(crate::api::handlers::method_not_allowed)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_flags_parse_and_refuse_bad_values() {
        assert_eq!(
            parse_upstream_arg("http://vllm:8000/v1/").unwrap(),
            (RouteChoice::Primary, "http://vllm:8000".to_string())
        );
        assert_eq!(
            parse_upstream_arg("fallback=https://small:8001").unwrap(),
            (RouteChoice::Fallback, "https://small:8001".to_string())
        );
        assert!(
            parse_upstream_arg("tertiary=http://x")
                .unwrap_err()
                .contains("primary or fallback")
        );
        assert!(
            parse_upstream_arg("vllm:8000")
                .unwrap_err()
                .contains("http://")
        );
        assert!(
            parse_upstream_arg("http://")
                .unwrap_err()
                .contains("no host")
        );
        assert!(parse_upstream_arg("http://a b").is_err());
        assert!(parse_upstream_arg("http://a/?x=1").is_err());
        assert_eq!(
            parse_model_arg("fallback=llama-8b").unwrap(),
            (RouteChoice::Fallback, "llama-8b".to_string())
        );
        assert!(parse_model_arg("fallback").is_err());
        assert!(parse_model_arg("primary=").is_err());
        assert!(parse_model_arg("primary=a\u{7}b").is_err());
    }

    #[tokio::test]
    async fn no_served_name_without_a_reachable_primary_is_a_clear_error() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let opts = ProxyOptions {
            upstreams: vec![(RouteChoice::Primary, format!("http://127.0.0.1:{port}"))],
            connect_timeout: Duration::from_millis(500),
            ..ProxyOptions::default()
        };
        let e = build_proxy(
            opts.clone(),
            ControlHandle::with_instance("c", "i"),
            Telemetry::disabled(),
        )
        .await
        .err()
        .unwrap();
        assert!(format!("{e:#}").contains("--served-model-name"), "{e:#}");
        let only_fallback = ProxyOptions {
            upstreams: vec![(RouteChoice::Fallback, format!("http://127.0.0.1:{port}"))],
            ..opts
        };
        let e = build_proxy(
            only_fallback,
            ControlHandle::with_instance("c", "i"),
            Telemetry::disabled(),
        )
        .await
        .err()
        .unwrap();
        assert!(format!("{e:#}").contains("primary route"), "{e:#}");
    }
}
