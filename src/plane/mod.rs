//! The composition root: the one place that builds the control plane and wires its
//! components, each given only the handles it uses.
//!
//! ```text
//!  Config ──> App (store, ingest: spool + pipeline + receivers, host registry, query API, /metrics)
//!               │ IngestState ── failures ──> pattern engine (the ingest tagger assigns ids)
//!               │                               └─> PatternFeed (clusters every 5 s) ── watch ──┬─> web UI
//!               │            └── failures, spans ──> feed_slo ──> SLO evaluator ── report ─┐   │
//!               └─ HostRegistry ── snapshots ───────────────────> feed_controller <────────┴───┘
//!                                                                   └──> degradation controller ──> bus
//!  IngestState ── spans ──> AgentGuards (loop kills, tool breakers) ── command part ──┘ (merged)
//!       ^───────── agent_loop failures ──┘
//!  routers: api(ApiDeps) · ingest(IngestState) · patterns(engine) · slo(handle) · reports(store)
//!           · degrade(handle) · web(LiveDataSource over store, hosts, slo, degrade, patterns)
//! ```
//!
//! - [`app`]: the core (store + ingest + query API on three listeners), [`App`];
//! - [`feeders`]: the tasks between components;
//! - [`miner_state`]: the template miner's state in the store.
//!
//! With `control.share_patterns` the ingest tagger does not mine: it tags each failure by a
//! read-only lookup and queues it; [`crate::patterns::share`] appends every replica's failures
//! to one Redis stream and mines all of them, in one order, into the engine (and saves the
//! shared checkpoint instead of [`miner_state`]).
//!
//! `brownout serve` runs [`Plane::from_config`]; `brownout-demo` builds an [`App`] and
//! [`PlaneOptions`] of its own (simulated origin, in-process bus) and calls [`Plane::start`].
//! [`Plane::stop`] signals every task, waits for them up to `server.shutdown_grace_ms` (so the
//! controller releases its leader lease), saves the miner state, and drains the servers.

pub mod app;
pub mod feeders;
pub mod key_reload;
pub mod miner_state;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use brownout_protocol::FailureEvent;

use crate::auth::Tokens;
use crate::config::Config;
use crate::degrade::{self, DegradeConfig, DegradeHandle, Policy, Transport};
use crate::ingest::FailureTagger;
use crate::patterns::api::SharedEngine;
use crate::patterns::engine::PatternId;
use crate::patterns::feed::{PatternFeed, PatternsRx};
use crate::slo::eval::Evaluator;
use crate::slo::spec::SloSpec;
use crate::slo::task::{SloHandle, SloMetrics};

pub use app::{App, AppState, Listeners, Running};

/// What the composed plane needs besides the core's config.
pub struct PlaneOptions {
    pub slos: Vec<SloSpec>,
    pub policy: Policy,
    pub cluster: String,
    /// What commands are signed with ([`plane_keys`]); a bare byte string given to
    /// [`PlaneOptions::defaults`] is the HMAC compatibility key.
    pub keys: brownout_protocol::PlaneKeys,
    pub transport: Transport,
    /// Serve the web UI over the live components, labelled with this origin (`None`: no UI).
    pub ui: Option<crate::web::model::DataOrigin>,
    /// Extra routes merged as they are (they bring their own auth).
    pub extra: Option<Router>,
    pub slo_interval: Duration,
    /// How often the pattern feed re-ranks the patterns.
    pub patterns_interval: Duration,
    /// This replica's name in the leader lease; `None`: `<hostname>-<pid>`.
    pub replica_id: Option<String>,
    /// Share SLO counters with the cluster's other replicas through this Redis
    /// (`control.share_slo_counters`, [`crate::slo::share`]); `None`: count locally only.
    pub share_slo_counters: Option<String>,
    /// Mine every replica's failures, in one order, through this Redis
    /// (`control.share_patterns`, [`crate::patterns::share`]); `None`: mine this replica's.
    pub share_patterns: Option<String>,
    /// The external trace viewer's link template (`web.trace_url`), shown beside the built-in
    /// waterfall.
    pub trace_url: Option<String>,
}

/// The control plane's command keys (docs/SECURITY.md "Command signatures"), from the
/// environment and the data directory:
/// - `BROWNOUT_COMMAND_SIGNATURE=hmac` (compatibility mode): the shared `BROWNOUT_COMMAND_KEY`
///   signs commands, seals acks and the override, as in earlier releases;
/// - otherwise Ed25519: the private key from `BROWNOUT_COMMAND_SIGNING_KEY_FILE`, else
///   `<data dir>/command-signing.key`, generated on first start (mode 0600) with its public half
///   in `<data dir>/command-signing.pub` for engines on the same host; the ack master from
///   `BROWNOUT_ACK_MASTER_KEY_FILE`, else `<data dir>/ack-master.key` (generated likewise);
///   `BROWNOUT_COMMAND_PUBKEY` / `_FILE` add public keys this replica also accepts on stored
///   commands (during a rotation).
///
/// # Errors
/// HMAC mode without a key, an unknown scheme, or a key file that cannot be read or parsed.
pub fn plane_keys(config: &Config) -> anyhow::Result<brownout_protocol::PlaneKeys> {
    use brownout_protocol::command_keys as ck;
    let var = |n: &str| std::env::var(n).ok().filter(|v| !v.trim().is_empty());
    match var(ck::SIGNATURE_ENV).as_deref().map(str::trim) {
        Some("hmac") => {
            let k = config.command_key.clone().ok_or_else(|| {
                anyhow::anyhow!(
                    "BROWNOUT_COMMAND_SIGNATURE=hmac needs the shared key: set BROWNOUT_COMMAND_KEY (or BROWNOUT_COMMAND_KEY_FILE, or [auth] command_key)"
                )
            })?;
            tracing::warn!(
                "commands are signed in the HMAC compatibility mode: every serving host holding the key can sign them (docs/SECURITY.md)"
            );
            return Ok(brownout_protocol::PlaneKeys::hmac(k.expose().as_bytes()));
        }
        None | Some("ed25519") => {}
        Some(other) => anyhow::bail!(
            "{} must be `ed25519` or `hmac`, not {other:?}",
            ck::SIGNATURE_ENV
        ),
    }
    let (signing, ack_master) = match var(ck::SIGNING_KEY_FILE_ENV) {
        Some(p) => {
            let signing = ck::CommandSigningKey::load(std::path::Path::new(&p))?;
            let ack_master = match var(ck::ACK_MASTER_FILE_ENV) {
                Some(a) => ck::read_secret_file(std::path::Path::new(&a))?,
                None => ck::load_or_create_in(&config.data_dir)?.ack_master,
            };
            (signing, ack_master)
        }
        None => {
            let k = ck::load_or_create_in(&config.data_dir)?;
            if k.created {
                tracing::info!(
                    dir = %config.data_dir.display(),
                    "generated the command signing key pair and the ack master in the data directory"
                );
            }
            let ack_master = match var(ck::ACK_MASTER_FILE_ENV) {
                Some(a) => ck::read_secret_file(std::path::Path::new(&a))?,
                None => k.ack_master,
            };
            (k.signing, ack_master)
        }
    };
    let mut also = Vec::new();
    if let Some(v) = var(ck::PUBKEY_ENV) {
        also.extend(ck::parse_public_keys(&v)?);
    }
    if let Some(p) = var(ck::PUBKEY_FILE_ENV) {
        also.extend(ck::parse_public_keys(
            &std::fs::read_to_string(&p).map_err(|e| anyhow::anyhow!("{p}: {e}"))?,
        )?);
    }
    if config.command_key.is_some() {
        tracing::warn!(
            "BROWNOUT_COMMAND_KEY is set but unused: commands are Ed25519-signed (set BROWNOUT_COMMAND_SIGNATURE=hmac for the compatibility mode)"
        );
    }
    tracing::info!(key_id = signing.id(), public_key = %signing.public(), "commands are signed with Ed25519");
    Ok(brownout_protocol::PlaneKeys::ed25519(
        signing,
        also,
        &ack_master,
    ))
}

impl PlaneOptions {
    /// The embedded example SLOs and policy ([`crate::defaults`]).
    ///
    /// # Errors
    /// When an embedded example does not parse (a bug caught by the tests).
    pub fn defaults(
        cluster: &str,
        keys: impl Into<brownout_protocol::PlaneKeys>,
        transport: Transport,
    ) -> anyhow::Result<PlaneOptions> {
        Ok(PlaneOptions {
            slos: crate::defaults::slos()?,
            policy: crate::defaults::policy()?,
            cluster: cluster.to_string(),
            keys: keys.into(),
            transport,
            ui: Some(crate::web::model::DataOrigin::Live),
            extra: None,
            slo_interval: Duration::from_secs(2),
            patterns_interval: crate::patterns::feed::DEFAULT_EVERY,
            replica_id: None,
            share_slo_counters: None,
            share_patterns: None,
            trace_url: None,
        })
    }

    /// What `brownout serve` runs: the config's SLO file and policy file (else the embedded
    /// examples), Redis when `REDIS_URL` is set (else decisions are recorded in dry run).
    ///
    /// # Errors
    /// No command key, or an SLO or policy file that cannot be read or parsed.
    pub fn from_config(config: &Config) -> anyhow::Result<PlaneOptions> {
        let keys = plane_keys(config)?;
        let mut opts = PlaneOptions::defaults(
            &config.cluster,
            keys,
            Transport::InProc(crate::degrade::InProcBus::new()),
        )?;
        opts.slos = crate::defaults::slos_or(config.slo_file.as_deref())?;
        opts.policy = crate::defaults::policy_or(config.policy_file.as_deref())?;
        if config.share_slo_counters {
            opts.share_slo_counters = config.redis_url.clone();
        }
        if config.share_patterns {
            opts.share_patterns = config.redis_url.clone();
        }
        opts.trace_url = config.trace_url.clone();
        match &config.redis_url {
            Some(url) => opts.transport = Transport::Redis { url: url.clone() },
            None => {
                tracing::warn!(
                    "REDIS_URL is not set: degradation decisions are recorded (dry run) but cannot reach serving tiers"
                );
                opts.policy.dry_run = true;
            }
        }
        Ok(opts)
    }
}

/// The report pages' CSP: self-contained documents (their style is inline so that a saved or
/// mailed report looks the same), no script at all, never framed; plus `nosniff` and the UI's
/// referrer policy.
const REPORT_CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; \
                          base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

async fn report_security_headers(res: axum::response::Response) -> axum::response::Response {
    use axum::http::{HeaderValue, header};
    let mut res = crate::web::with_security_headers(res, REPORT_CSP);
    res.headers_mut()
        .insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    res
}

/// Tags failures with their pattern id at ingest, observing them into the engine. A deliberate
/// refusal (docs/SLO.md "Deliberate refusals") is not a failure pattern: it is stored untagged
/// and never reaches the miner, so the feed, the UI and the controller's new-pattern trigger
/// rank only real failures.
///
/// With a shared miner (`outbox`: `control.share_patterns`) it does not mine: it tags with the
/// id the shared miner gives the failure now (read-only) and queues the failure for the stream,
/// from which every replica mines all of them (`patterns::share`).
struct PatternTagger {
    engine: SharedEngine,
    outbox: Option<Arc<crate::patterns::share::FailureOutbox>>,
}

impl FailureTagger for PatternTagger {
    fn tag(&self, event: &FailureEvent) -> String {
        match &self.outbox {
            None => {
                if event.is_deliberate() {
                    return String::new();
                }
                let mut e = self
                    .engine
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                tag_failure(&mut e, event)
            }
            Some(outbox) => tag_shared_failure(&self.engine, outbox, event),
        }
    }
}

/// What the ingest tagger does with one failure when the miner is shared
/// (`control.share_patterns`): a real failure is tagged with the id the shared miner gives it
/// now (read-only, [`crate::patterns::PatternEngine::lookup`]) and queued for the stream, from
/// which every replica mines it; a deliberate refusal is neither (empty tag).
pub fn tag_shared_failure(
    engine: &SharedEngine,
    outbox: &crate::patterns::share::FailureOutbox,
    event: &FailureEvent,
) -> String {
    if event.is_deliberate() {
        return String::new();
    }
    let id = engine
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .lookup(event);
    outbox.push(crate::patterns::share::SharedFailure::from_event(event));
    PatternId::from_template(id).0
}

/// What the ingest tagger does with one failure: a real failure is observed into the pattern
/// engine and tagged with its pattern id; a deliberate refusal is neither (empty tag).
pub fn tag_failure(engine: &mut crate::patterns::PatternEngine, event: &FailureEvent) -> String {
    if event.is_deliberate() {
        return String::new();
    }
    PatternId::from_template(engine.observe(event)).0
}

/// The composed plane, serving in the background.
pub struct Plane {
    pub running: Running,
    pub slo: SloHandle,
    pub degrade: DegradeHandle,
    /// Loop kills and tool breakers (docs/AGENTS.md).
    pub agents: Arc<crate::agents::AgentGuards>,
    pub patterns: SharedEngine,
    /// The pattern feed's latest ranking (the one clustering, shared by the UI and the
    /// controller).
    pub ranked_patterns: PatternsRx,
    /// Every background task, by name; each ends when `stop` is signalled.
    tasks: Vec<(&'static str, tokio::task::JoinHandle<()>)>,
    /// The miner is shared (its checkpoint is saved by the sharing task, not at stop).
    shared_miner: bool,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Plane {
    /// `brownout serve`: refuses to start without the tokens and the command key, binds the
    /// configured listeners, opens the store and starts every component.
    ///
    /// # Errors
    /// Missing tokens or key, bad SLO/policy files, taken ports, an unavailable store.
    pub async fn from_config(config: Config) -> anyhow::Result<Plane> {
        config.require_tokens()?;
        let opts = PlaneOptions::from_config(&config)?;
        let tokens = Tokens::from_config(&config);
        let listeners = Listeners::bind(&config).await?;
        let app = App::build(config, tokens).await?;
        Plane::start(app, listeners, opts).await
    }

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
        let (engine, share_cursor) = if opts.share_patterns.is_some() {
            match crate::patterns::share::load_checkpoint(
                state.store.as_ref(),
                crate::patterns::EngineConfig::default(),
            )
            .await
            {
                Some((e, c)) => (e, Some(c)),
                None => (
                    crate::patterns::PatternEngine::new(crate::patterns::EngineConfig::default()),
                    Some(crate::patterns::share::ShareCursor::default()),
                ),
            }
        } else {
            (
                miner_state::load_pattern_engine(state.store.as_ref()).await,
                None,
            )
        };
        let patterns: SharedEngine = Arc::new(Mutex::new(engine));
        let outbox = share_cursor
            .as_ref()
            .map(|_| Arc::new(crate::patterns::share::FailureOutbox::default()));
        app.set_tagger(Arc::new(PatternTagger {
            engine: patterns.clone(),
            outbox: outbox.clone(),
        }));
        let registry = state.metrics.registry();

        // Loop kills and tool breakers: fed by ingest, merged into every command.
        let agents = crate::agents::AgentGuards::new(opts.policy.agents.clone(), Some(registry))
            .context("registering agent guard metrics")?;
        app.set_span_observer(agents.clone());

        let report_slos = Arc::new(opts.slos.clone());
        let slo = SloHandle::new(Evaluator::new(opts.slos));
        // The store is the SLIs' truth (docs/SLO.md "Stored SLI buckets"): counted at ingest,
        // read back here. Replicas with a SQLite file each that share counters through Redis
        // do not share a store: their windows stay in memory (seeded from their own file).
        let store_attached =
            !(opts.share_slo_counters.is_some() && state.store.backend() == "sqlite");
        app.set_sli_counter(Arc::new(crate::slo::persist::SliCounter::new(&report_slos)));
        match crate::slo::persist::load(
            &slo,
            state.store.as_ref(),
            &report_slos,
            store_attached,
            brownout_protocol::now_ms(),
        )
        .await
        {
            Ok(l) => tracing::info!(
                buckets = l.buckets,
                alert_states = l.alert_states,
                "SLO counters seeded from the store"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the stored SLI buckets; SLO budgets start from memory")
            }
        }
        let slo_metrics = SloMetrics::register(registry).context("registering SLO metrics")?;
        let mut dcfg = DegradeConfig::new(&opts.cluster, opts.keys.clone(), opts.policy);
        dcfg.replica_id = opts
            .replica_id
            .clone()
            .unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id()));
        let degrade =
            DegradeHandle::new(dcfg, registry).context("registering degradation metrics")?;
        degrade.set_agent_guards(agents.clone());
        {
            // One writer, in order: a decision is stored when made and again when its command
            // is published and acked (same key), and the later copy must win.
            let store = state.store.clone();
            let (tx, mut rx) =
                tokio::sync::mpsc::unbounded_channel::<(String, serde_json::Value)>();
            tokio::spawn(async move {
                while let Some((key, json)) = rx.recv().await {
                    if let Err(e) = store.put_doc("decision", &key, &json).await {
                        tracing::warn!(error = %e, "cannot store a degradation decision");
                    }
                }
            });
            degrade.on_decision(move |d| {
                if let Ok(json) = serde_json::to_value(d) {
                    let _ = tx.send((format!("{:020}", d.at_ms), json));
                }
            });
        }

        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = move || {
            let mut rx = stop_rx.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };
        let mut tasks: Vec<(&'static str, tokio::task::JoinHandle<()>)> = Vec::new();
        let (feed, ranked_patterns) = PatternFeed::new(patterns.clone());
        let feed = feed.with_slo_bad(crate::patterns::feed::SloBadSource {
            store: state.store.clone(),
            slos: report_slos.clone(),
        });
        tasks.push((
            "pattern feed",
            tokio::spawn(feed.run(opts.patterns_interval, stopped())),
        ));

        let tokens = state.tokens.clone();
        let read_api = crate::patterns::api::router_with_slo_bad(
            patterns.clone(),
            crate::patterns::feed::SloBadSource {
                store: state.store.clone(),
                slos: report_slos.clone(),
            },
        )
        .merge(crate::slo::http::router(slo.clone()))
        .merge(
            crate::report::store::router(
                state.store.clone(),
                report_slos.clone(),
                opts.cluster.clone(),
            )
            .layer(axum::middleware::map_response(report_security_headers)),
        )
        // Reports are read in browsers too: the UI's login cookie works here as well.
        .route_layer(axum::middleware::from_fn_with_state(
            tokens.clone(),
            crate::auth::require_ui,
        ));
        let degrade_api = degrade::router(degrade.clone()).route_layer(
            axum::middleware::from_fn_with_state(tokens.clone(), crate::auth::require_degrade_role),
        );
        let mut extra = read_api.merge(degrade_api);
        if let Some(origin) = opts.ui {
            let live = crate::web::live::LiveDataSource::new(crate::web::live::LiveParts {
                store: state.store.clone(),
                hosts: state.hosts.clone(),
                slo: slo.clone(),
                degrade: degrade.clone(),
                patterns: ranked_patterns.clone(),
                origin,
            })
            .with_agents(agents.clone())
            .with_trace_url(opts.trace_url.clone());
            tasks.push((
                "ui sampler",
                tokio::spawn(live.clone().run_sampler(stopped())),
            ));
            extra = extra.merge(crate::auth::protect_ui(
                crate::web::router(Arc::new(live)),
                tokens.clone(),
            ));
        }
        if let Some(more) = opts.extra {
            extra = extra.merge(more);
        }
        let running = app.spawn(listeners, extra);

        tasks.push((
            "slo evaluator",
            tokio::spawn(crate::slo::persist::run(
                slo.clone(),
                state.store.clone(),
                report_slos.clone(),
                store_attached,
                opts.slo_interval,
                Some(slo_metrics),
                stopped(),
            )),
        ));
        if let Some(url) = opts.share_slo_counters.clone() {
            // Before the feeder starts: every count from the first one is shared.
            slo.enable_sharing();
            tasks.push((
                "slo counter sharing",
                tokio::spawn(crate::slo::share::run(
                    slo.clone(),
                    url,
                    opts.cluster.clone(),
                    degrade.config().replica_id.clone(),
                    Duration::from_secs(1),
                    stopped(),
                )),
            ));
        }
        tasks.push((
            "slo feeder",
            tokio::spawn(feeders::feed_slo(
                state.ingest.clone(),
                slo.clone(),
                stopped(),
            )),
        ));
        match (opts.share_patterns.clone(), outbox, share_cursor) {
            (Some(url), Some(outbox), Some(cursor)) => tasks.push((
                "failure sharing",
                tokio::spawn(crate::patterns::share::run(
                    crate::patterns::share::ShareTask {
                        engine: patterns.clone(),
                        outbox,
                        store: state.store.clone(),
                        url,
                        cluster: opts.cluster.clone(),
                        replica: degrade.config().replica_id.clone(),
                        cursor,
                        interval: Duration::from_secs(1),
                    },
                    stopped(),
                )),
            )),
            _ => tasks.push((
                "miner state saver",
                tokio::spawn(miner_state::save_periodically(
                    state.store.clone(),
                    patterns.clone(),
                    stopped(),
                )),
            )),
        }
        tasks.push((
            "weekly report",
            tokio::spawn(crate::report::store::run_weekly(
                state.store.clone(),
                report_slos,
                opts.cluster.clone(),
                stopped(),
            )),
        ));
        tasks.push((
            "controller feeder",
            tokio::spawn(feeders::feed_controller(
                feeders::ControllerFeed {
                    hosts: state.hosts.clone(),
                    host_up: state.metrics.host_up.clone(),
                    slo: slo.clone(),
                    patterns: ranked_patterns.clone(),
                    degrade: degrade.clone(),
                },
                stopped(),
            )),
        ));
        {
            let (d, t, s) = (degrade.clone(), opts.transport, stopped());
            tasks.push((
                "degradation controller",
                tokio::spawn(async move {
                    if let Err(e) = degrade::run_controller(d, t, s).await {
                        tracing::error!(error = %e, "degradation controller stopped");
                    }
                }),
            ));
        }
        Ok(Plane {
            running,
            slo,
            degrade,
            agents,
            patterns,
            ranked_patterns,
            tasks,
            shared_miner: opts.share_patterns.is_some(),
            stop,
        })
    }

    /// The core's shared handles.
    pub fn state(&self) -> &AppState {
        &self.running.state
    }

    /// Signals every background task and waits for each up to `server.shutdown_grace_ms` in
    /// all (the controller releases its leader lease on the way out; a task still running at
    /// the deadline is aborted, and said so), saves the miner state, then stops the servers
    /// (ingest flushed).
    ///
    /// # Errors
    /// What the servers returned.
    pub async fn stop(self) -> anyhow::Result<()> {
        let Plane {
            running,
            patterns,
            tasks,
            shared_miner,
            stop,
            ..
        } = self;
        let _ = stop.send(true);
        let deadline = tokio::time::Instant::now() + running.state.config.shutdown_grace;
        for (name, mut task) in tasks {
            match tokio::time::timeout_at(deadline, &mut task).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(task = name, error = %e, "task failed"),
                Err(_) => {
                    tracing::warn!(
                        task = name,
                        "did not stop within the shutdown grace period; aborted"
                    );
                    task.abort();
                }
            }
        }
        if !shared_miner {
            // A shared miner's checkpoint was saved by its task on the way out.
            miner_state::save_miner_state(running.state.store.as_ref(), &patterns).await;
        }
        running.stop().await
    }
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "brownout".into())
}
