//! The control plane's core: store, ingest (spool + pipeline, receivers), host registry, the
//! query API and `/metrics`, on three listeners. [`super::Plane`] composes the other components
//! around it; ingest-only tests and benchmarks run it alone.
//!
//! ```text
//! let app = App::build(config, tokens).await?;     // store, spool+pipeline, hosts, metrics
//! let running = app.spawn(Listeners::loopback().await?, extra_routes);
//! ```
//!
//! - `:8080` serves the query API, the ingest routes, `/metrics` and `/healthz`, merged with the
//!   extra router;
//! - `:4318` serves the ingest routes (OTLP/HTTP, NDJSON, snapshots);
//! - `:4317` serves OTLP/gRPC.
//!
//! On shutdown the listeners stop accepting, in-flight requests finish, the ingest writer
//! flushes to the store or the spool, all within `server.shutdown_grace_ms`.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, watch};

use crate::api::ApiDeps;
use crate::auth::Tokens;
use crate::config::Config;
use crate::ingest::hosts::HostRegistry;
use crate::ingest::listen::{OverCap, capped, serve_https};
use crate::ingest::pipeline::PipelineTask;
use crate::ingest::{FailureTagger, IngestState, Pipeline, WriterStatus};
use crate::metrics::Metrics;
use crate::store::Store;

/// The core's shared handles. Components get the parts they use, never the whole (see
/// [`super::Plane::start`]); tests read `store` and `hosts` from here. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub store: Arc<dyn Store>,
    pub metrics: Metrics,
    pub hosts: HostRegistry,
    pub tokens: Arc<Tokens>,
    pub writer_status: watch::Receiver<WriterStatus>,
    /// What ingest's receivers get.
    pub ingest: IngestState,
}

impl AppState {
    /// The query API's dependencies.
    pub fn api_deps(&self) -> ApiDeps {
        ApiDeps {
            store: self.store.clone(),
            hosts: self.hosts.clone(),
            writer_status: self.writer_status.clone(),
        }
    }
}

/// The 8080 router: query API + ingest routes + `/metrics` + `/healthz`.
fn main_router(state: &AppState) -> Router {
    let metrics = state.metrics.clone();
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = metrics.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                        m.render(),
                    )
                        .into_response()
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .merge(crate::api::router(state.api_deps(), state.tokens.clone()))
        .merge(crate::ingest::http::router(state.ingest.clone()))
}

/// The three listeners. Bind them first (port 0 in tests) to learn the addresses.
pub struct Listeners {
    pub http: TcpListener,
    pub otlp_http: TcpListener,
    pub otlp_grpc: TcpListener,
}

impl Listeners {
    /// Binds the configured addresses.
    ///
    /// # Errors
    /// When a port is taken, naming it.
    pub async fn bind(config: &Config) -> anyhow::Result<Listeners> {
        let b = |a: SocketAddr, what: &'static str| async move {
            TcpListener::bind(a)
                .await
                .with_context(|| format!("cannot listen on {a} ({what})"))
        };
        Ok(Listeners {
            http: b(config.http_addr, "server.http_addr").await?,
            otlp_http: b(config.otlp_http_addr, "server.otlp_http_addr").await?,
            otlp_grpc: b(config.otlp_grpc_addr, "server.otlp_grpc_addr").await?,
        })
    }

    /// Three ephemeral ports on loopback (tests, demo).
    ///
    /// # Errors
    /// When binding fails.
    pub async fn loopback() -> anyhow::Result<Listeners> {
        let l = || TcpListener::bind("127.0.0.1:0");
        Ok(Listeners {
            http: l().await?,
            otlp_http: l().await?,
            otlp_grpc: l().await?,
        })
    }

    /// `(http, otlp_http, otlp_grpc)` addresses.
    pub fn addrs(&self) -> (SocketAddr, SocketAddr, SocketAddr) {
        let a = |l: &TcpListener| l.local_addr().expect("bound listener has an address");
        (a(&self.http), a(&self.otlp_http), a(&self.otlp_grpc))
    }
}

/// A built control plane, not yet serving.
pub struct App {
    state: AppState,
    pipeline_task: PipelineTask,
    writer_shutdown: watch::Sender<bool>,
}

impl App {
    /// Opens the store, the spool and the ingest writer, and seeds host states.
    ///
    /// # Errors
    /// When the store or the spool cannot be opened.
    pub async fn build(config: Config, tokens: Tokens) -> anyhow::Result<App> {
        let store =
            crate::store::open(&config)
                .await
                .with_context(|| match &config.clickhouse {
                    Some(ch) => format!("cannot open the ClickHouse store at {}", ch.url),
                    None => format!(
                        "cannot open the SQLite store at {}",
                        config.sqlite_path().display()
                    ),
                })?;
        App::build_with_store(config, tokens, store).await
    }

    /// Like [`App::build`] with a store already open (tests, demo).
    ///
    /// # Errors
    /// When the spool cannot be opened.
    pub async fn build_with_store(
        config: Config,
        tokens: Tokens,
        store: Arc<dyn Store>,
    ) -> anyhow::Result<App> {
        let metrics = Metrics::new();
        let (writer_shutdown, shutdown_rx) = watch::channel(false);
        let (pipeline, pipeline_task, writer_status) = Pipeline::start(
            Arc::clone(&store),
            &config.spool_dir(),
            &config.ingest,
            &config.spool,
            config.store_write_timeout,
            metrics.clone(),
            shutdown_rx,
        )
        .with_context(|| format!("cannot open the spool in {}", config.spool_dir().display()))?;
        let hosts = HostRegistry::new(config.hosts);
        let since = brownout_protocol::now_ms().saturating_sub(86_400_000);
        match store.latest_snapshots(since).await {
            Ok(s) => hosts.seed(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot read stored snapshots; host states start empty")
            }
        }
        let (failures_tx, _) = broadcast::channel(4096);
        let (spans_tx, _) = broadcast::channel(1024);
        let tenants = Arc::new(crate::ingest::limits::TenantLimiter::new(
            config.ingest.tenant_items_per_sec,
            config.ingest.tenant_burst_items,
        ));
        let tokens = Arc::new(tokens);
        let ingest = IngestState {
            config: Arc::new(config.ingest.clone()),
            metrics: metrics.clone(),
            hosts: hosts.clone(),
            tokens: tokens.clone(),
            tenants,
            pipeline,
            tagger: None,
            span_observer: None,
            sli_counter: None,
            failures_tx,
            spans_tx,
        };
        let state = AppState {
            config: Arc::new(config),
            store,
            metrics,
            hosts,
            tokens,
            writer_status,
            ingest,
        };
        Ok(App {
            state,
            pipeline_task,
            writer_shutdown,
        })
    }

    /// The shared handles.
    pub fn state(&self) -> AppState {
        self.state.clone()
    }

    /// Installs a failure tagger (before [`App::run`]).
    pub fn set_tagger(&mut self, tagger: Arc<dyn FailureTagger>) {
        self.state.ingest.tagger = Some(tagger);
    }

    /// Installs the SLI counter (stored SLI buckets; before [`App::run`]).
    pub fn set_sli_counter(&mut self, counter: Arc<dyn crate::ingest::SliCounter>) {
        self.state.ingest.sli_counter = Some(counter);
    }

    /// Installs the span observer (the agent guards; before [`App::run`]).
    pub fn set_span_observer(&mut self, observer: Arc<dyn crate::ingest::SpanObserver>) {
        self.state.ingest.span_observer = Some(observer);
    }

    /// Serves until `shutdown` resolves, then drains.
    ///
    /// # Errors
    /// When a server fails.
    pub async fn run(
        self,
        listeners: Listeners,
        extra: Router,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let App {
            state,
            pipeline_task,
            writer_shutdown,
        } = self;
        let (http_addr, otlp_http_addr, grpc_addr) = listeners.addrs();
        tracing::info!(%http_addr, %otlp_http_addr, %grpc_addr, backend = state.store.backend(), "brownout serving");
        let (stop_tx, stop_rx) = watch::channel(false);
        let stopped = move || {
            let mut rx = stop_rx.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };
        let grace = state.config.shutdown_grace;

        // One error contract (crate::error): 405 in its shape everywhere; the UI router brings
        // the path-aware 404 fallback when it is mounted.
        let main = main_router(&state)
            .merge(extra)
            .method_not_allowed_fallback(crate::error::method_not_allowed);
        let otlp_http = crate::ingest::http::router(state.ingest.clone())
            .fallback(crate::error::no_route)
            .method_not_allowed_fallback(crate::error::method_not_allowed);
        let cap = |l: TcpListener, name: &str, over: OverCap| {
            capped(l, &state.config, &state.metrics, name, over)
        };
        let tls = state.config.tls.clone();
        let http_srv = serve_https(
            cap(listeners.http, "http", OverCap::Http503),
            tls.as_ref().map(|t| t.web.clone()),
            main,
            stopped(),
        );
        let otlp_srv = serve_https(
            cap(listeners.otlp_http, "otlp_http", OverCap::Http503),
            tls.as_ref().map(|t| t.ingest.clone()),
            otlp_http,
            stopped(),
        );
        let grpc_srv = crate::ingest::grpc::serve(
            state.ingest.clone(),
            cap(listeners.otlp_grpc, "otlp_grpc", OverCap::Close),
            tls.as_ref().map(|t| t.ingest.clone()),
            stopped(),
        );
        let mut retention = tokio::spawn(retention_loop(
            state.store.clone(),
            state.config.retention_days,
            stopped(),
        ));

        let servers = async {
            let (a, b, c) = tokio::join!(
                async { http_srv.await.context("HTTP server") },
                async { otlp_srv.await.context("OTLP/HTTP server") },
                async { grpc_srv.await.context("OTLP/gRPC server") },
            );
            a.and(b).and(c)
        };
        tokio::pin!(servers);
        let result = tokio::select! {
            r = &mut servers => r,
            () = shutdown => {
                tracing::info!("shutting down");
                let _ = stop_tx.send(true);
                match tokio::time::timeout(grace, &mut servers).await {
                    Ok(r) => r,
                    Err(_) => { tracing::warn!("requests still in flight after the grace period"); Ok(()) }
                }
            }
        };
        let _ = stop_tx.send(true);
        // It stops at the signal; a deletion in progress gets the grace period.
        if tokio::time::timeout(grace, &mut retention).await.is_err() {
            tracing::warn!("retention did not stop within the grace period; aborted");
            retention.abort();
        }
        // Drop our handles on the pipeline so the writer sees the end, then let it flush.
        drop(state);
        let _ = writer_shutdown.send(true);
        if tokio::time::timeout(grace, pipeline_task.finish())
            .await
            .is_err()
        {
            tracing::error!(
                "ingest writer did not finish within the grace period; unwritten batches are lost"
            );
        }
        result
    }
}

/// A control plane running in the background (tests, `demo`).
pub struct Running {
    pub http_addr: SocketAddr,
    pub otlp_http_addr: SocketAddr,
    pub otlp_grpc_addr: SocketAddr,
    pub state: AppState,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Running {
    /// Shuts down gracefully (ingest flushed to the store or spool) and waits.
    ///
    /// # Errors
    /// What the servers returned.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let Running { task, state, .. } = self;
        drop(state);
        task.await.context("server task panicked")?
    }
}

impl App {
    /// Starts serving in a background task.
    pub fn spawn(self, listeners: Listeners, extra: Router) -> Running {
        let (http_addr, otlp_http_addr, otlp_grpc_addr) = listeners.addrs();
        let state = self.state();
        let (stop, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(self.run(listeners, extra, async move {
            let _ = rx.await;
        }));
        Running {
            http_addr,
            otlp_http_addr,
            otlp_grpc_addr,
            state,
            stop: Some(stop),
            task,
        }
    }
}

/// Drops data past `storage.retention_days`, hourly.
async fn retention_loop(
    store: Arc<dyn Store>,
    retention_days: u32,
    stopped: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(stopped);
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(3600));
    loop {
        tokio::select! {
            () = &mut stopped => return,
            _ = tick.tick() => {
                let cutoff = brownout_protocol::now_ms().saturating_sub(u64::from(retention_days) * 86_400_000);
                match store.drop_before(cutoff).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(dropped = n, "retention: old data dropped"),
                    Err(e) => tracing::warn!(error = %e, "retention failed; will retry"),
                }
            }
        }
    }
}
