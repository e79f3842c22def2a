//! A whole brownout deployment in one process: the control plane, serving engines and
//! gpu-agents, talking over loopback HTTP/gRPC (and Redis when given). Used by
//! `brownout-demo demo`, `brownout-demo bench overload` and the end-to-end tests.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use brownout_gpu_agent::{Agent, AgentConfig, EngineTarget};
use brownout_serving::api::{self as serving_api, ModelChoice, ServeOptions};
use brownout_serving::control::{self, ControlHandle, FeatureCatalog, SubscriberConfig};
use brownout_serving::telemetry::{Telemetry, TelemetryConfig};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use brownout::auth::Tokens;
use brownout::config::{Config, Secret};
use brownout::degrade::{InProcBus, Policy, Transport};
use brownout::plane::{App, Listeners, Plane, PlaneOptions};

/// The one policy (`examples/policy.yaml`): the control plane's built-in default, which the
/// demo and the benchmark run too, changed only by [`PolicyKnobs`].
pub const POLICY: &str = include_str!("../../examples/policy.yaml");

/// The knobs in which the demo's and the benchmark's policy differ from the built-in default
/// (docs/DEGRADATION.md "One policy"): nothing else of the policy is touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyKnobs {
    /// `tiers.t1/t2/t3.hold_down_secs`: a demo evening and the benchmark's overload last
    /// minutes, so the tiers step down within seconds of the demand falling, not a minute.
    pub hold_down_secs: [u64; 3],
    /// `tiers.t2.params.max_tokens_cap`: their calls ask for 24 tokens, so the default 256
    /// would cap nothing.
    pub t2_max_tokens_cap: u32,
    /// `tiers.t2.params.max_num_seqs`: their engines have 16 sequence slots.
    pub t2_max_num_seqs: u32,
}

impl PolicyKnobs {
    /// The demo's and the benchmark's knobs (both run engines of 16 slots on this CPU).
    pub const SMALL_ENGINES: PolicyKnobs = PolicyKnobs {
        hold_down_secs: [10, 5, 5],
        t2_max_tokens_cap: 16,
        t2_max_num_seqs: 16,
    };

    /// `policy` (YAML) with these knobs set.
    ///
    /// # Errors
    /// YAML that does not parse or lacks the tiers.
    pub fn apply(&self, policy: &str) -> anyhow::Result<String> {
        let mut v: serde_yaml::Value = serde_yaml::from_str(policy).context("the policy YAML")?;
        let tiers = v
            .get_mut("tiers")
            .and_then(|t| t.as_mapping_mut())
            .context("the policy has no tiers")?;
        for (name, secs) in ["t1", "t2", "t3"].iter().zip(self.hold_down_secs) {
            let t = tiers
                .get_mut(*name)
                .and_then(|t| t.as_mapping_mut())
                .with_context(|| format!("the policy has no tiers.{name}"))?;
            t.insert("hold_down_secs".into(), secs.into());
        }
        if let Some(p) = tiers
            .get_mut("t2")
            .and_then(|t| t.get_mut("params"))
            .and_then(|p| p.as_mapping_mut())
        {
            p.insert("max_tokens_cap".into(), self.t2_max_tokens_cap.into());
            p.insert("max_num_seqs".into(), self.t2_max_num_seqs.into());
        }
        Ok(serde_yaml::to_string(&v)?)
    }
}

/// The demo's and the benchmark's policy: [`POLICY`] with [`PolicyKnobs::SMALL_ENGINES`].
pub fn small_engines_policy() -> String {
    PolicyKnobs::SMALL_ENGINES
        .apply(POLICY)
        .expect("examples/policy.yaml has the tiers (checked by tests)")
}

/// True when SmolLM2 is in the local model cache.
pub fn smollm2_cached() -> bool {
    let dir = std::env::var_os("BROWNOUT_MODEL_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/brownout/models"))
        });
    dir.is_some_and(|d| d.join("SmolLM2-135M-Instruct.Q4_1.gguf").is_file())
}

/// How to build a [`World`].
#[derive(Debug, Clone)]
pub struct WorldOptions {
    /// Port of the control plane's HTTP (UI/API); `None`: an ephemeral port.
    pub http_port: Option<u16>,
    pub model: String,
    pub cluster: String,
    /// Use Redis for commands (else the in-process bus).
    pub redis_url: Option<String>,
    pub policy_yaml: String,
    /// The controller decides and records but does not publish (the "loop off" baseline).
    pub dry_run: bool,
    pub num_engines: usize,
    pub engine: ServeOptions,
    /// Simulated GPUs per agent.
    pub gpus_per_agent: u32,
    /// Start the gpu-agents (and so feed the controller).
    pub agents: bool,
    /// Engines export deliberate refusals as plain errors (the overload benchmark's
    /// `no-refusal-aware-slis` ablation; docs/SLO.md "Deliberate refusals").
    pub refusals_as_errors: bool,
    /// The agents' latency window (TTFT / queue-wait p99s), in scrapes (`None`: the agent's
    /// default, 30 s); the overload benchmark uses a few seconds.
    pub agent_window_scrapes: Option<usize>,
}

impl Default for WorldOptions {
    fn default() -> WorldOptions {
        WorldOptions {
            http_port: None,
            model: "tiny-random".into(),
            cluster: "demo".into(),
            redis_url: None,
            policy_yaml: small_engines_policy(),
            dry_run: false,
            num_engines: 2,
            engine: ServeOptions {
                num_blocks: 256,
                max_num_seqs: 16,
                max_num_batched_tokens: 256,
                max_queue_wait: Duration::from_secs(20),
                ..ServeOptions::default()
            },
            gpus_per_agent: 2,
            agents: true,
            refusals_as_errors: false,
            agent_window_scrapes: None,
        }
    }
}

struct EngineRun {
    url: String,
    control: ControlHandle,
    stop: tokio::sync::oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
    subscriber: JoinHandle<()>,
    telemetry: Telemetry,
}

struct AgentRun {
    url: String,
    stop: tokio::sync::oneshot::Sender<()>,
    task: JoinHandle<anyhow::Result<()>>,
}

/// A running deployment.
pub struct World {
    plane: Plane,
    engines: Vec<EngineRun>,
    agents: Vec<AgentRun>,
    tokens: (String, String, String),
    redis: bool,
    data_dir: PathBuf,
    /// Keeps the in-process bus alive.
    _bus: Option<InProcBus>,
}

fn random_hex(n: usize) -> String {
    use rand::Rng as _;
    let mut rng = rand::rng();
    (0..n)
        .map(|_| format!("{:02x}", rng.random::<u8>()))
        .collect()
}

impl World {
    /// Starts the control plane, then the engines (model loaded and warmed), then the agents.
    ///
    /// # Errors
    /// A taken port, a model that cannot be loaded, a bad policy.
    pub async fn start(opts: WorldOptions) -> anyhow::Result<World> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (ingest, read, admin) = (
            format!("bo_i_{}", random_hex(16)),
            format!("bo_r_{}", random_hex(16)),
            format!("bo_a_{}", random_hex(16)),
        );
        let tokens = Tokens::new(
            Some(Secret::new(ingest.clone())),
            Some(Secret::new(read.clone())),
            Some(Secret::new(admin.clone())),
        );
        // The demo's control plane signs with a fresh Ed25519 key; each engine holds its public
        // half and its own ack key only (docs/SECURITY.md "Command signatures").
        let signing = brownout_protocol::CommandSigningKey::generate();
        let ack_master = random_hex(32).into_bytes();
        let plane_keys =
            brownout_protocol::PlaneKeys::ed25519(signing.clone(), Vec::new(), &ack_master);
        let engine_keys = |id: &str| brownout_protocol::EngineKeys {
            verifier: brownout_protocol::CommandVerifier::ed25519([signing.public()]),
            ack_key: brownout_protocol::command_keys::derive_ack_key(&ack_master, id),
            ack_key_file: None,
        };

        let data_dir = std::env::var_os("BROWNOUT_DATA_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                std::env::temp_dir().join(format!(
                    "brownout-demo-{}-{}-{}",
                    std::process::id(),
                    brownout_protocol::now_ms(),
                    // Worlds started in one process within the same millisecond (parallel
                    // tests) must not share a store.
                    random_hex(4)
                ))
            });
        std::fs::create_dir_all(&data_dir)
            .with_context(|| format!("creating {}", data_dir.display()))?;
        let mut config = Config::defaults();
        config.data_dir = data_dir.clone();

        let http = match opts.http_port {
            Some(p) => TcpListener::bind(("127.0.0.1", p))
                .await
                .with_context(|| format!("port {p} is taken: pass --port with a free one"))?,
            None => TcpListener::bind("127.0.0.1:0").await?,
        };
        let listeners = Listeners {
            http,
            otlp_http: TcpListener::bind("127.0.0.1:0").await?,
            otlp_grpc: TcpListener::bind("127.0.0.1:0").await?,
        };
        let (http_addr, _, grpc_addr) = listeners.addrs();
        let app = App::build(config, tokens).await?;

        let bus = opts.redis_url.is_none().then(InProcBus::new);
        let transport = match (&opts.redis_url, &bus) {
            (Some(url), _) => Transport::Redis { url: url.clone() },
            (None, Some(b)) => Transport::InProc(b.clone()),
            (None, None) => unreachable!("a bus exists when there is no Redis URL"),
        };
        let mut policy = Policy::from_yaml(&opts.policy_yaml).context("the demo policy")?;
        policy.dry_run = opts.dry_run;
        let mut plane_opts = PlaneOptions::defaults(&opts.cluster, plane_keys, transport)?;
        plane_opts.policy = policy;
        plane_opts.ui = Some(brownout::web::model::DataOrigin::Simulated);
        let plane = Plane::start(app, listeners, plane_opts).await?;
        let cp_url = format!("http://{http_addr}");

        let mut engines = Vec::new();
        for i in 0..opts.num_engines {
            let id = format!("engine-{}", i + 1);
            let control = ControlHandle::new(&opts.cluster);
            let subscriber = match (&opts.redis_url, &bus) {
                (Some(url), _) => {
                    control::spawn_subscriber(
                        control.clone(),
                        SubscriberConfig::new(url, &opts.cluster, engine_keys(&id), &id),
                    )
                    .await
                }
                (None, Some(b)) => control::inproc::spawn_inproc_subscriber(
                    control.clone(),
                    id.clone(),
                    engine_keys(&id),
                    b.commands(),
                    b.ack_sender(),
                    Duration::from_millis(250),
                ),
                (None, None) => unreachable!("a bus exists when there is no Redis URL"),
            };
            let telemetry = Telemetry::start(TelemetryConfig {
                // The app these engines serve: the example SLOs (examples/slo/chat.yaml) watch it.
                service: "chat".into(),
                host: format!("gpu-node-{}", i + 1),
                control_plane: Some(cp_url.clone()),
                ingest_token: Some(ingest.clone()),
                otlp_endpoint: Some(format!("http://{grpc_addr}")),
                deliberate_as_errors: opts.refusals_as_errors,
                ..TelemetryConfig::from_env("brownout-serve")
            });
            let mut eopts = opts.engine.clone();
            eopts.model = opts
                .model
                .parse::<ModelChoice>()
                .map_err(|e| anyhow::anyhow!(e))?;
            eopts
                .served_model_name
                .get_or_insert_with(|| "default".into());
            let state = serving_api::build_state(&eopts, control.clone(), telemetry.clone())
                .await
                .with_context(|| format!("starting {id} with model {}", opts.model))?;
            // The command counters (applied, refused, lease step-downs) on the engine's /metrics.
            control
                .metrics()
                .register(&state.metrics().registry)
                .context("registering command metrics")?;
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            let url = format!("http://{}", listener.local_addr()?);
            let (stop, rx) = tokio::sync::oneshot::channel::<()>();
            let catalog = FeatureCatalog::seed_default();
            state
                .metrics()
                .init_features(catalog.features().iter().map(|(f, _)| f.as_str()));
            let extra = control::http::router(control.clone(), catalog);
            let task = tokio::spawn(serving_api::run_server(
                state,
                Some(extra),
                listener,
                async move {
                    let _ = rx.await;
                },
            ));
            engines.push(EngineRun {
                url,
                control,
                stop,
                task,
                subscriber,
                telemetry,
            });
        }

        let mut agents = Vec::new();
        if opts.agents {
            for (i, e) in engines.iter().enumerate() {
                let host = format!("gpu-node-{}", i + 1);
                let mut cfg = AgentConfig::new(&host).with_simulated_gpus(opts.gpus_per_agent);
                if let Some(n) = opts.agent_window_scrapes {
                    cfg.ttft_window_scrapes = n.max(1);
                }
                cfg.engines = vec![EngineTarget {
                    id: format!("engine-{}", i + 1),
                    url: e.url.parse()?,
                }];
                cfg.control_plane = Some(cp_url.parse()?);
                cfg.ingest_token = Some(ingest.clone());
                let listener = TcpListener::bind("127.0.0.1:0").await?;
                let url = format!("http://{}", listener.local_addr()?);
                let agent = Agent::new(cfg)?;
                let (stop, rx) = tokio::sync::oneshot::channel::<()>();
                let task = tokio::spawn(async move {
                    agent
                        .run(Some(listener), async move {
                            let _ = rx.await;
                        })
                        .await
                        .map_err(anyhow::Error::from)
                });
                agents.push(AgentRun { url, stop, task });
            }
        }

        Ok(World {
            plane,
            engines,
            agents,
            tokens: (ingest, read, admin),
            redis: opts.redis_url.is_some(),
            data_dir,
            _bus: bus,
        })
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.plane.running.http_addr
    }
    pub fn otlp_grpc_addr(&self) -> SocketAddr {
        self.plane.running.otlp_grpc_addr
    }
    pub fn otlp_http_addr(&self) -> SocketAddr {
        self.plane.running.otlp_http_addr
    }
    /// `(ingest, read, admin)` tokens.
    pub fn tokens(&self) -> (&str, &str, &str) {
        (&self.tokens.0, &self.tokens.1, &self.tokens.2)
    }
    pub fn uses_redis(&self) -> bool {
        self.redis
    }
    pub fn engine_urls(&self) -> Vec<String> {
        self.engines.iter().map(|e| e.url.clone()).collect()
    }
    pub fn agent_urls(&self) -> Vec<String> {
        self.agents.iter().map(|a| a.url.clone()).collect()
    }
    /// The engines' degradation state handles.
    pub fn engine_controls(&self) -> Vec<ControlHandle> {
        self.engines.iter().map(|e| e.control.clone()).collect()
    }
    pub fn plane(&self) -> &Plane {
        &self.plane
    }

    /// Stops agents, engines, then the control plane; removes a temporary data dir.
    ///
    /// # Errors
    /// What the control plane's servers returned.
    pub async fn stop(self) -> anyhow::Result<()> {
        for a in self.agents {
            let _ = a.stop.send(());
            let _ = tokio::time::timeout(Duration::from_secs(5), a.task).await;
        }
        for e in self.engines {
            let _ = e.stop.send(());
            let _ = tokio::time::timeout(Duration::from_secs(12), e.task).await;
            e.subscriber.abort();
            e.telemetry.shutdown();
        }
        let r = self.plane.stop().await;
        if std::env::var_os("BROWNOUT_DATA_DIR").is_none() {
            let _ = std::fs::remove_dir_all(&self.data_dir);
        }
        r
    }
}
