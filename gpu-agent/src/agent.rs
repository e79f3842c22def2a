//! The agent: one cycle per interval (scrape engines → sample GPUs → snapshot), the exporter,
//! and the pusher, wired together by [`Agent::run`].
//!
//! ```text
//!  interval tick ──> scrape engines (concurrently) ──> probe.sample(engines) ──> CycleReport
//!                                                                                  │
//!        ┌───────────────────────── watch (latest) <──────────────────────────────┤
//!        v                                                                         v
//!  exporter GET /metrics renders it                          SnapshotQueue (latest N) ──> pusher
//!  AgentHandle::latest() reads it in-process                                   (backoff + jitter)
//! ```
//!
//! The cycle never awaits the push; the pusher never holds the queue's lock across an await.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use brownout_protocol::{AgentSnapshot, now_ms};
use bytes::Bytes;
use reqwest::Client;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::{AgentConfig, ConfigError};
use crate::engine::{EngineReport, EngineScraper};
use crate::exporter;
use crate::probe::nvml::NvmlProbe;
use crate::probe::simulated::SimulatedProbe;
use crate::probe::{GpuProbe, GpuSample, ProbeKind};
use crate::push::{self, PushCounts, PushTarget, SnapshotQueue};

pub use crate::cycle::{CycleReport, Shared};

/// A cheap, cloneable view of a running (or not yet running) agent, for in-process callers such
/// as `brownout-demo`.
#[derive(Debug, Clone)]
pub struct AgentHandle {
    shared: Arc<Shared>,
}

impl AgentHandle {
    /// The latest snapshot, `None` before the first cycle.
    pub fn latest_snapshot(&self) -> Option<AgentSnapshot> {
        self.shared.latest().map(|r| r.snapshot.clone())
    }

    /// The latest full cycle report.
    pub fn latest(&self) -> Option<Arc<CycleReport>> {
        self.shared.latest()
    }

    /// Wakes on every new cycle.
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<CycleReport>>> {
        self.shared.latest.subscribe()
    }

    /// What `GET /metrics` would answer now.
    pub fn render_metrics(&self) -> String {
        self.shared.render_metrics()
    }

    /// Push counters; `None` when no control plane is configured.
    pub fn push_counts(&self) -> Option<PushCounts> {
        self.shared.queue.as_ref().map(|q| q.counts())
    }
}

/// Why the agent could not start or stopped early.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot build the HTTP client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("exporter server failed: {0}")]
    Serve(std::io::Error),
}

enum ProbeSlot {
    Ready(Box<dyn GpuProbe>),
    /// NVML did not start; retried at `next_try` without logging again.
    NvmlDown {
        next_try: Instant,
    },
}

/// Installs rustls' ring provider once per process (reqwest is built without one).
pub fn ensure_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Err means another part of the process installed one first: fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// One agent. Build with [`Agent::new`], keep an [`AgentHandle`], then [`Agent::run`] it (or
/// drive [`Agent::cycle`] yourself).
pub struct Agent {
    config: AgentConfig,
    shared: Arc<Shared>,
    scrapers: Vec<EngineScraper>,
    probe: ProbeSlot,
    scrape_client: Client,
    cycles_total: u64,
    probe_errors_total: u64,
    probe_error_logged: bool,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("config", &self.config)
            .field("cycles_total", &self.cycles_total)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// Validates `config` and picks the probe: the simulated one when configured, else NVML —
    /// and when NVML cannot start, logs why once and runs on with `brownout_gpu_probe_up 0`.
    ///
    /// # Errors
    /// [`AgentError::Config`] for a bad config, [`AgentError::Client`] when the HTTP client
    /// cannot be built.
    pub fn new(config: AgentConfig) -> Result<Self, AgentError> {
        let probe = match &config.simulate {
            Some(spec) => ProbeSlot::Ready(Box::new(SimulatedProbe::new(spec.clone()))),
            None => match NvmlProbe::new() {
                Ok(p) => ProbeSlot::Ready(Box::new(p)),
                Err(e) => {
                    tracing::warn!(error = %e, retry_every_s = config.nvml_retry.as_secs(), "NVML unavailable: exporting brownout_gpu_probe_up 0 and engine metrics only");
                    ProbeSlot::NvmlDown {
                        next_try: Instant::now() + config.nvml_retry,
                    }
                }
            },
        };
        Self::with_probe_slot(config, probe)
    }

    /// Uses `probe` instead of NVML or the simulated probe (tests, custom sources).
    ///
    /// # Errors
    /// As [`Agent::new`].
    pub fn with_probe(config: AgentConfig, probe: Box<dyn GpuProbe>) -> Result<Self, AgentError> {
        Self::with_probe_slot(config, ProbeSlot::Ready(probe))
    }

    fn with_probe_slot(config: AgentConfig, probe: ProbeSlot) -> Result<Self, AgentError> {
        config.validate()?;
        ensure_crypto_provider();
        let scrape_client = Client::builder()
            .timeout(config.scrape_timeout)
            .no_proxy()
            .pool_max_idle_per_host(2)
            .build()?;
        let probe_kind = match &probe {
            ProbeSlot::Ready(p) => p.kind(),
            ProbeSlot::NvmlDown { .. } => ProbeKind::Nvml,
        };
        let queue = config
            .control_plane
            .as_ref()
            .map(|_| Arc::new(SnapshotQueue::new(config.queue_capacity)));
        let shared = Arc::new(Shared {
            host: config.host.clone(),
            probe_kind,
            vram_watermark_ratio: config.vram_watermark_ratio,
            latest: watch::channel(None).0,
            queue,
        });
        let scrapers = config
            .engines
            .iter()
            .map(|t| EngineScraper::new(t.clone(), config.ttft_window_scrapes))
            .collect();
        Ok(Self {
            config,
            shared,
            scrapers,
            probe,
            scrape_client,
            cycles_total: 0,
            probe_errors_total: 0,
            probe_error_logged: false,
        })
    }

    pub fn handle(&self) -> AgentHandle {
        AgentHandle {
            shared: self.shared.clone(),
        }
    }

    fn sample_probe(&mut self, engines: &[EngineReport]) -> (Vec<GpuSample>, bool) {
        if let ProbeSlot::NvmlDown { next_try } = &mut self.probe {
            if Instant::now() < *next_try {
                return (Vec::new(), false);
            }
            match NvmlProbe::new() {
                Ok(p) => {
                    tracing::info!("NVML came up; exporting GPU metrics");
                    self.probe = ProbeSlot::Ready(Box::new(p));
                }
                Err(_) => {
                    *next_try = Instant::now() + self.config.nvml_retry;
                    return (Vec::new(), false);
                }
            }
        }
        let ProbeSlot::Ready(probe) = &mut self.probe else {
            return (Vec::new(), false);
        };
        match probe.sample(engines) {
            Ok(gpus) => {
                if std::mem::take(&mut self.probe_error_logged) {
                    tracing::info!("GPU probe recovered");
                }
                (gpus, true)
            }
            Err(e) => {
                self.probe_errors_total += 1;
                if !self.probe_error_logged {
                    tracing::warn!(error = %e, "GPU probe failed; brownout_gpu_probe_up 0 until it answers");
                    self.probe_error_logged = true;
                }
                (Vec::new(), false)
            }
        }
    }

    /// Runs one cycle: scrapes every engine concurrently, samples the GPUs, publishes the report
    /// to handles and the exporter, and enqueues the snapshot for the pusher.
    pub async fn cycle(&mut self) -> Arc<CycleReport> {
        let started = std::time::Instant::now();
        let client = &self.scrape_client;
        let engines: Vec<EngineReport> =
            futures::future::join_all(self.scrapers.iter_mut().map(|s| s.scrape(client))).await;
        let (gpus, probe_up) = self.sample_probe(&engines);
        self.cycles_total += 1;
        let snapshot = AgentSnapshot {
            host: self.config.host.clone(),
            ts_ms: now_ms(),
            simulated: self.shared.probe_kind == ProbeKind::Simulated,
            probe_up,
            gpus: gpus.iter().map(|g| g.stats.clone()).collect(),
            engines: engines.iter().map(|e| e.stats.clone()).collect(),
        };
        if let Some(q) = &self.shared.queue {
            match serde_json::to_vec(&snapshot) {
                Ok(body) => q.push(Bytes::from(body)),
                Err(e) => tracing::error!(error = %e, "cannot serialise a snapshot"),
            }
        }
        let report = Arc::new(CycleReport {
            snapshot,
            gpus,
            engines,
            probe_up,
            probe_errors_total: self.probe_errors_total,
            cycles_total: self.cycles_total,
            cycle_duration: started.elapsed(),
        });
        self.shared.latest.send_replace(Some(report.clone()));
        report
    }

    /// Runs until `shutdown` completes: the exporter on `listener` (or on `config.listen` when
    /// `listener` is `None`; no exporter when both are `None`), a cycle every interval, and the
    /// pusher when a control plane is configured. On shutdown the pusher gets one second to
    /// flush what is queued.
    ///
    /// # Errors
    /// [`AgentError::Bind`] when `config.listen` cannot be bound, [`AgentError::Serve`] when the
    /// exporter's server fails.
    pub async fn run(
        mut self,
        listener: Option<TcpListener>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), AgentError> {
        let listener = match (listener, self.config.listen) {
            (Some(l), _) => Some(l),
            (None, Some(addr)) => Some(
                TcpListener::bind(addr)
                    .await
                    .map_err(|source| AgentError::Bind { addr, source })?,
            ),
            (None, None) => None,
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        // The exporter stops last, after the pusher has flushed: a scrape during the shutdown
        // still gets the last snapshot.
        let (stop_exporter_tx, stop_exporter_rx) = watch::channel(false);

        let server = listener.map(|l| {
            if let Ok(addr) = l.local_addr() {
                tracing::info!(%addr, "exporter listening");
            }
            let mut rx = stop_exporter_rx.clone();
            let app = exporter::router(self.shared.clone());
            tokio::spawn(async move {
                axum::serve(l, app)
                    .with_graceful_shutdown(async move {
                        let _ = rx.wait_for(|s| *s).await;
                    })
                    .await
            })
        });

        let pusher = match (&self.config.control_plane, &self.shared.queue) {
            (Some(base), Some(queue)) => {
                if self.config.ingest_token.is_none() {
                    tracing::warn!(
                        "BROWNOUT_INGEST_TOKEN is not set: snapshots are pushed without a bearer token"
                    );
                }
                let client = Client::builder()
                    .timeout(self.config.push_timeout)
                    .build()?;
                let target = PushTarget {
                    url: PushTarget::endpoint(base),
                    token: self.config.ingest_token.clone(),
                    backoff_min: self.config.backoff_min,
                    backoff_max: self.config.backoff_max,
                };
                tracing::info!(url = %target.url, capacity = queue.capacity(), "pushing snapshots");
                let queue = queue.clone();
                let rx = stop_rx.clone();
                Some(tokio::spawn(async move {
                    push::run_pusher(&queue, client, target, rx, Duration::from_secs(1)).await
                }))
            }
            _ => None,
        };

        let mut ticker = tokio::time::interval(self.config.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                _ = ticker.tick() => {}
            }
            tokio::select! {
                () = &mut shutdown => break,
                _ = self.cycle() => {}
            }
        }
        let _ = stop_tx.send(true);
        if let Some(p) = pusher {
            let _ = p.await;
        }
        let _ = stop_exporter_tx.send(true);
        if let Some(s) = server
            && let Ok(Err(e)) = s.await
        {
            return Err(AgentError::Serve(e));
        }
        Ok(())
    }
}
