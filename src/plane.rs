//! The control plane, composed: ingest + store ([`crate::serve::App`]) with the pattern engine,
//! the SLO evaluator, the degradation controller and the web UI, and the feeders between them.
//!
//! ```text
//!  ingest ──failures──> pattern engine (tagger: ids at ingest)      ──new patterns──┐
//!     │  └──failures──> SLO evaluator <──spans── ingest               ──alerts──────┤
//!     └──snapshots──> host registry ─────────────────────────────────────────────────┴─> controller ─> bus
//! ```
//!
//! `brownout serve` and `brownout demo` both build a [`Plane`]; the demo adds engines, agents and
//! load around it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use brownout_protocol::{FailureEvent, now_ms};

use crate::auth::{Role, Tokens};
use crate::degrade::{
    self, DegradeConfig, DegradeHandle, PatternRate, Policy, SloAlert, Transport,
};
use crate::ingest::FailureTagger;
use crate::patterns::api::SharedEngine;
use crate::patterns::engine::{EngineConfig, PatternEngine, PatternId};
use crate::serve::{App, AppState, Listeners, Running};
use crate::slo::eval::{Evaluator, Observation};
use crate::slo::spec::SloSpec;
use crate::slo::task::{SloHandle, SloMetrics};

/// The SLO specs and the policy shipped in `examples/`, used when the config names none.
pub const DEFAULT_SLOS: &[(&str, &str)] = &[
    (
        "examples/slo/chat.yaml",
        include_str!("../examples/slo/chat.yaml"),
    ),
    (
        "examples/slo/agent.yaml",
        include_str!("../examples/slo/agent.yaml"),
    ),
];
/// The default degradation policy (`examples/policy.yaml`).
pub const DEFAULT_POLICY: &str = include_str!("../examples/policy.yaml");

/// What the composed plane needs besides the ingest config.
pub struct PlaneOptions {
    pub slos: Vec<SloSpec>,
    pub policy: Policy,
    pub cluster: String,
    pub command_key: Vec<u8>,
    pub transport: Transport,
    /// Serve the web UI over the live components, labelled with this origin (`None`: no UI).
    pub ui: Option<crate::web::model::DataOrigin>,
    /// Extra routes merged as they are (they bring their own auth).
    pub extra: Option<Router>,
    pub slo_interval: Duration,
    /// This replica's name in the leader lease; `None`: `<hostname>-<pid>`.
    pub replica_id: Option<String>,
}

impl PlaneOptions {
    /// The embedded example SLOs and policy.
    ///
    /// # Errors
    /// When an embedded example does not parse (a bug caught by the tests).
    pub fn defaults(
        cluster: &str,
        command_key: &[u8],
        transport: Transport,
    ) -> anyhow::Result<PlaneOptions> {
        let mut slos = Vec::new();
        for (file, text) in DEFAULT_SLOS {
            slos.extend(crate::slo::spec::parse_str(text, file)?);
        }
        let policy = Policy::from_yaml(DEFAULT_POLICY).context("examples/policy.yaml")?;
        Ok(PlaneOptions {
            slos,
            policy,
            cluster: cluster.to_string(),
            command_key: command_key.to_vec(),
            transport,
            ui: Some(crate::web::model::DataOrigin::Live),
            extra: None,
            slo_interval: Duration::from_secs(2),
            replica_id: None,
        })
    }
}

/// Tags failures with their pattern id at ingest, observing them into the engine.
struct PatternTagger(SharedEngine);

impl FailureTagger for PatternTagger {
    fn tag(&self, event: &FailureEvent) -> String {
        let mut e = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        PatternId::from_template(e.observe(event)).0
    }
}

/// The composed plane, serving in the background.
pub struct Plane {
    pub running: Running,
    pub slo: SloHandle,
    pub degrade: DegradeHandle,
    pub patterns: SharedEngine,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Plane {
    /// Builds every component around `app` and starts serving on `listeners`.
    ///
    /// # Errors
    /// When metrics cannot be registered or the cluster name is invalid.
    pub async fn start(
        mut app: App,
        listeners: Listeners,
        opts: PlaneOptions,
    ) -> anyhow::Result<Plane> {
        let state = app.state();
        let patterns: SharedEngine = Arc::new(Mutex::new(load_pattern_engine(&state).await));
        app.set_tagger(Arc::new(PatternTagger(patterns.clone())));
        let registry = state.metrics.registry();

        let report_slos = Arc::new(opts.slos.clone());
        let slo = SloHandle::new(Evaluator::new(opts.slos));
        let slo_metrics = SloMetrics::register(registry).context("registering SLO metrics")?;
        let mut dcfg = DegradeConfig::new(&opts.cluster, &opts.command_key, opts.policy);
        dcfg.replica_id = opts
            .replica_id
            .clone()
            .unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id()));
        let degrade =
            DegradeHandle::new(dcfg, registry).context("registering degradation metrics")?;
        {
            let store = state.store.clone();
            degrade.on_decision(move |d| {
                if let Ok(json) = serde_json::to_value(d) {
                    let store = store.clone();
                    let key = format!("{:020}", d.at_ms);
                    tokio::spawn(async move {
                        if let Err(e) = store.put_doc("decision", &key, &json).await {
                            tracing::warn!(error = %e, "cannot store a degradation decision");
                        }
                    });
                }
            });
        }

        let tokens = state.tokens.clone();
        let read_api = crate::patterns::api::router(patterns.clone())
            .merge(crate::slo::http::router(slo.clone()))
            .merge(crate::report::store::router(
                state.store.clone(),
                report_slos.clone(),
                opts.cluster.clone(),
            ))
            // Reports are read in browsers too: the UI's login cookie works here as well.
            .route_layer(axum::middleware::from_fn_with_state(
                tokens.clone(),
                require_ui,
            ));
        let degrade_api = degrade::router(degrade.clone()).route_layer(
            axum::middleware::from_fn_with_state(tokens.clone(), require_degrade_role),
        );
        let mut extra = read_api.merge(degrade_api);
        let mut sampler = None;
        if let Some(origin) = opts.ui {
            let live = crate::web::live::LiveDataSource::new(crate::web::live::LiveParts {
                state: state.clone(),
                slo: slo.clone(),
                degrade: degrade.clone(),
                patterns: patterns.clone(),
                origin,
            });
            sampler = Some(live.spawn_sampler());
            extra = extra.merge(protect_ui(
                crate::web::router(Arc::new(live)),
                tokens.clone(),
            ));
        }
        if let Some(more) = opts.extra {
            extra = extra.merge(more);
        }
        let running = app.spawn(listeners, extra);

        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = move || {
            let mut rx = stop_rx.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };
        let mut tasks: Vec<tokio::task::JoinHandle<()>> = sampler.into_iter().collect();
        tasks.push(tokio::spawn(crate::slo::task::run(
            slo.clone(),
            opts.slo_interval,
            Some(slo_metrics),
            stopped(),
        )));
        tasks.push(tokio::spawn(feed_slo(
            state.clone(),
            slo.clone(),
            stopped(),
        )));
        tasks.push(tokio::spawn(save_miner_state_periodically(
            state.clone(),
            patterns.clone(),
        )));
        tasks.push(tokio::spawn(crate::report::store::run_weekly(
            state.store.clone(),
            report_slos,
            opts.cluster.clone(),
            stopped(),
        )));
        tasks.push(tokio::spawn(feed_controller(
            state.clone(),
            slo.clone(),
            patterns.clone(),
            degrade.clone(),
            stopped(),
        )));
        {
            let (d, t, s) = (degrade.clone(), opts.transport, stopped());
            tasks.push(tokio::spawn(async move {
                if let Err(e) = degrade::run_controller(d, t, s).await {
                    tracing::error!(error = %e, "degradation controller stopped");
                }
            }));
        }
        Ok(Plane {
            running,
            slo,
            degrade,
            patterns,
            tasks,
            stop,
        })
    }

    /// The shared ingest/store state.
    pub fn state(&self) -> &AppState {
        &self.running.state
    }

    /// Stops the background tasks and the servers (ingest flushed).
    ///
    /// # Errors
    /// What the servers returned.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(true);
        save_miner_state(&self.running.state, &self.patterns).await;
        for t in self.tasks {
            t.abort();
        }
        self.running.stop().await
    }
}

/// Where the template miner's state lives in the store, so template ids survive restarts.
const MINER_DOC: (&str, &str) = ("patterns", "miner_state");

async fn load_pattern_engine(state: &AppState) -> PatternEngine {
    let fresh = || PatternEngine::new(EngineConfig::default());
    match state.store.get_doc(MINER_DOC.0, MINER_DOC.1).await {
        Ok(Some(doc)) => match serde_json::from_value::<crate::patterns::MinerState>(doc.value)
            .map_err(|e| e.to_string())
            .and_then(|st| {
                PatternEngine::with_miner_state(EngineConfig::default(), st)
                    .map_err(|e| e.to_string())
            }) {
            Ok(e) => {
                tracing::info!(
                    templates = e.miner().templates().len(),
                    "template miner state restored"
                );
                e
            }
            Err(e) => {
                tracing::warn!(error = %e, "stored template miner state is unusable; starting fresh");
                fresh()
            }
        },
        Ok(None) => fresh(),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the template miner state; starting fresh");
            fresh()
        }
    }
}

async fn save_miner_state(state: &AppState, patterns: &SharedEngine) {
    let st = patterns
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .miner_state();
    match serde_json::to_value(&st) {
        Ok(v) => {
            if let Err(e) = state.store.put_doc(MINER_DOC.0, MINER_DOC.1, &v).await {
                tracing::warn!(error = %e, "cannot save the template miner state");
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot serialise the template miner state"),
    }
}

async fn save_miner_state_periodically(state: AppState, patterns: SharedEngine) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    tick.tick().await;
    loop {
        tick.tick().await;
        save_miner_state(&state, &patterns).await;
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "brownout".into())
}

/// Every accepted failure and request span becomes an SLO observation.
async fn feed_slo(
    state: AppState,
    slo: SloHandle,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut failures = state.subscribe_failures();
    let mut spans = state.subscribe_spans();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            f = failures.recv() => match f {
                // A failure with a trace id is also a span (the serving tier's, or the error span
                // it came from): count it once, through the span. Failures without one (plain log
                // lines) are the only record of that bad event.
                Ok(row) if row.event.trace_id.is_empty() => { slo.record_failure(&row.event); }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => tracing::warn!(missed = n, "SLO feeder fell behind on failures"),
                Err(_) => break,
            },
            s = spans.recv() => match s {
                Ok(batch) => {
                    for span in batch.iter().filter(|s| s.is_request) {
                        let end_ms = (span.start_us + span.duration_us) / 1000;
                        let attr = |k: &str| span.attributes.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
                        slo.record(&Observation::from_span(
                            &span.service,
                            end_ms,
                            span.duration_us as f64 / 1000.0,
                            span.status == crate::store::STATUS_ERROR,
                            attr,
                        ));
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => tracing::warn!(missed = n, "SLO feeder fell behind on spans"),
                Err(_) => break,
            },
        }
    }
}

/// Once a second: host snapshots, SLO alerts and new patterns into the controller's inputs.
async fn feed_controller(
    state: AppState,
    slo: SloHandle,
    patterns: SharedEngine,
    degrade: DegradeHandle,
    shutdown: impl std::future::Future<Output = ()>,
) {
    // 1 while a host's agent reports (fresh or stale), 0 once it is down.
    let host_up = prometheus::IntGaugeVec::new(
        prometheus::Opts::new(
            "brownout_host_up",
            "Whether the host's gpu-agent is reporting (0 once it is down).",
        ),
        &["host"],
    )
    .expect("valid metric");
    if let Err(e) = state.metrics.registry().register(Box::new(host_up.clone())) {
        tracing::warn!(error = %e, "brownout_host_up not registered");
    }
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    let mut ticks: u64 = 0;
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = tick.tick() => {}
        }
        let now = now_ms();
        for h in state.hosts.list(now) {
            let up = h.state != crate::ingest::hosts::HostState::Down;
            host_up
                .with_label_values(&[h.host.as_str()])
                .set(i64::from(up));
            if up {
                degrade.push_snapshot(h.snapshot);
            }
        }
        let report = slo.latest();
        let alerts = report
            .slos
            .iter()
            .flat_map(|s| {
                s.alerts.iter().map(move |a| SloAlert {
                    slo: s.name.clone(),
                    severity: a.severity.as_str().to_string(),
                    firing: a.state.is_firing(),
                    burn_rate: a.long_burn_rate,
                    threshold: a.factor,
                    window: a.window.clone(),
                })
            })
            .collect();
        degrade.set_slo_alerts(alerts);
        // Clustering holds the engine's lock (which ingest's tagger also takes): new patterns
        // are recomputed every 10 s, not every tick.
        ticks += 1;
        if ticks % 10 != 1 {
            continue;
        }
        let fresh: Vec<PatternRate> = {
            let e = patterns
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let since = now.saturating_sub(5 * 60_000);
            e.patterns(since, now)
                .into_iter()
                .filter(|p| p.is_new)
                .map(|p| PatternRate {
                    pattern_id: p.id.0.clone(),
                    per_min: p.count as f64 / 5.0,
                })
                .collect()
        };
        degrade.set_new_patterns(fresh);
    }
}

/// The degradation routes need different roles: the Alertmanager webhook is ingest, reading the
/// state is read, everything else (overrides) is admin.
async fn require_degrade_role(
    axum::extract::State(tokens): axum::extract::State<Arc<Tokens>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let role = if req.uri().path() == "/v1/alertmanager" {
        Role::Ingest
    } else if req.method() == axum::http::Method::GET {
        Role::Read
    } else {
        Role::Admin
    };
    match tokens.check(role, req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

/// The cookie that carries the read token for browsers.
const UI_COOKIE: &str = "brownout_token";

/// Puts the web UI behind the read token. Browsers log in once at `/login?token=…`, which sets
/// an HttpOnly, SameSite=Strict cookie; API clients may send the bearer header instead.
pub fn protect_ui(ui: Router, tokens: Arc<Tokens>) -> Router {
    let login = Router::new()
        .route("/login", axum::routing::get(ui_login))
        .with_state(tokens.clone());
    ui.route_layer(axum::middleware::from_fn_with_state(tokens, require_ui))
        .merge(login)
}

fn cookie_token(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == UI_COOKIE)
        .map(|(_, v)| v.to_string())
}

async fn require_ui(
    axum::extract::State(tokens): axum::extract::State<Arc<Tokens>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let ok = cookie_token(req.headers()).is_some_and(|t| tokens.allows(Role::Read, &t))
        || tokens.check(Role::Read, req.headers()).is_ok();
    if ok {
        return next.run(req).await;
    }
    if req.uri().path().starts_with("/api/") {
        // JSON clients get the JSON 401 that says what was missing.
        if let Err(e) = tokens.check(Role::Read, req.headers()) {
            return e.into_response();
        }
    }
    (
        axum::http::StatusCode::UNAUTHORIZED,
        axum::response::Html(
            "<!doctype html><title>brownout: sign in</title><h1>Sign in</h1>\
             <p>Open <code>/login?token=&lt;read token&gt;</code> once (the token is printed by \
             <code>brownout demo</code>, or set with BROWNOUT_READ_TOKEN).</p>",
        ),
    )
        .into_response()
}

#[derive(serde::Deserialize)]
struct LoginQuery {
    token: String,
}

async fn ui_login(
    axum::extract::State(tokens): axum::extract::State<Arc<Tokens>>,
    q: Result<axum::extract::Query<LoginQuery>, axum::extract::rejection::QueryRejection>,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let Ok(axum::extract::Query(q)) = q else {
        return (
            axum::http::StatusCode::BAD_REQUEST,
            "use /login?token=<read token>",
        )
            .into_response();
    };
    let valid = !q.token.is_empty()
        && q.token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && tokens.allows(Role::Read, &q.token);
    if !valid {
        return (
            axum::http::StatusCode::UNAUTHORIZED,
            "that token is not a read or admin token",
        )
            .into_response();
    }
    (
        axum::http::StatusCode::SEE_OTHER,
        [
            (
                axum::http::header::SET_COOKIE,
                format!("{UI_COOKIE}={}; Path=/; HttpOnly; SameSite=Strict", q.token),
            ),
            (axum::http::header::LOCATION, "/".to_string()),
        ],
    )
        .into_response()
}
