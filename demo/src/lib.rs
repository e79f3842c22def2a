//! `brownout-demo`: the whole loop in one process on embedded defaults (`brownout-demo demo`),
//! and the overload benchmark over the same deployment (`brownout-demo bench overload`).
//!
//! This crate is the only one that links the control plane (`brownout`), the bundled serving
//! tier (`brownout-serving`, the Llama runner) and the gpu-agent together: `brownout serve`
//! does not link the model.
//!
//! ```text
//!  loadgen (evening peak, agent flows) ──> engine-1, engine-2 (brownout-serve, CPU, real model)
//!                                            │ OTLP spans + failure NDJSON      ▲ signed commands
//!  gpu-agent ×2 (simulated GPUs, scrape) ──> control plane (SQLite, patterns, SLOs, controller)
//!                                            └── in-process bus, or Redis when REDIS_URL is set
//! ```
//!
//! Everything talks over real loopback HTTP/gRPC exactly as separate processes would; only the
//! command bus is in-process unless `REDIS_URL` is set. The GPUs are simulated and say so.

pub mod chart;
pub mod faults;
pub mod overload;
pub mod world;

use std::time::Duration;

use anyhow::Context as _;

use brownout::loadgen::{LoadConfig, LoadShape};

pub use world::{World, WorldOptions};

/// Command-line arguments of `brownout-demo demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Stop after this many seconds (0: run until Ctrl-C).
    #[arg(long, default_value_t = 0)]
    pub duration: u64,
    /// Time compression of the simulated day: one evening peak every 600/speed seconds.
    #[arg(long, default_value_t = 1.0)]
    pub speed: f64,
    /// Port of the web UI and API.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// `smollm2`, `tiny-random` or a GGUF path (default: SmolLM2 when it is in the model cache,
    /// the tiny random model otherwise).
    #[arg(long)]
    pub model: Option<String>,
    /// Cluster name (Redis hash tag).
    #[arg(long, default_value = "demo")]
    pub cluster: String,
    /// Start everything but generate no load.
    #[arg(long)]
    pub no_load: bool,
    /// Skip the calibration and scale the load to this capacity (flows/s, both engines).
    #[arg(long)]
    pub capacity_flows_per_s: Option<f64>,
    /// Length of the capacity calibration before the demo starts, seconds.
    #[arg(long, default_value_t = 9)]
    pub calibrate_secs: u64,
}

/// The load outside the evening peak, as a multiple of the measured capacity.
pub const BASE_LOAD_RATIO: f64 = 0.4;
/// The top of the evening peak, as a multiple of the measured capacity (as `bench overload`'s
/// 3× overload).
pub const PEAK_LOAD_RATIO: f64 = 3.0;

/// The demo's load, scaled to what the engines can serve: quiet at [`BASE_LOAD_RATIO`] of the
/// capacity, a peak to [`PEAK_LOAD_RATIO`] of it, so whichever model runs (SmolLM2 or the tiny
/// random model, which answers in milliseconds) the peak overloads it and the tiers move.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DemoLoadPlan {
    /// Flows per second both engines finish within their deadlines (calibrated or given).
    pub capacity_flows_per_s: f64,
    /// True when it was measured (not passed with `--capacity-flows-per-s`).
    pub calibrated: bool,
    /// Flows per second outside the peak.
    pub base_rate: f64,
    /// The peak's height relative to `base_rate`.
    pub peak_factor: f64,
    /// What the calibration measured in requests/s (the primary route and the T2 route),
    /// declared to the controller as the policy's `capacity_rps` and `fallback_capacity_rps`;
    /// `None` with `--capacity-flows-per-s`.
    pub measured: Option<overload::Capacity>,
}

impl DemoLoadPlan {
    /// The plan for a capacity.
    pub fn for_capacity(capacity_flows_per_s: f64, calibrated: bool) -> DemoLoadPlan {
        DemoLoadPlan {
            capacity_flows_per_s,
            calibrated,
            base_rate: capacity_flows_per_s * BASE_LOAD_RATIO,
            peak_factor: PEAK_LOAD_RATIO / BASE_LOAD_RATIO,
            measured: None,
        }
    }

    /// Flows per second at the top of the peak.
    pub fn peak_rate(&self) -> f64 {
        self.base_rate * self.peak_factor
    }
}

/// Measures the capacity of the demo's deployment (two engines of `model`, agents off,
/// controller in dry run, so nothing degrades while it is measured) with the demo's own flows,
/// by the calibration of `bench overload` ([`overload::calibrate_capacity`]).
///
/// # Errors
/// When the deployment cannot start, or no flow finished within its deadline.
pub async fn calibrate_demo(model: &str, secs: u64) -> anyhow::Result<DemoLoadPlan> {
    let opts = WorldOptions {
        model: model.to_string(),
        agents: false,
        dry_run: true,
        ..WorldOptions::default()
    };
    let template = demo_load(Vec::new(), 1.0, 1, &DemoLoadPlan::for_capacity(1.0, false));
    let m = overload::calibrate_capacity(
        opts,
        &template,
        Duration::from_secs(secs.max(3)),
        "brownout-demo",
    )
    .await?;
    let c = m.flows_per_s;
    anyhow::ensure!(
        c > 0.0,
        "no flow finished within its deadline while calibrating: model {model} is too slow for the demo's deadlines"
    );
    Ok(DemoLoadPlan {
        measured: Some(m),
        ..DemoLoadPlan::for_capacity(c, true)
    })
}

/// `brownout-demo bench …`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub what: BenchWhat,
}

/// The benchmarks.
#[derive(Debug, clap::Subcommand)]
pub enum BenchWhat {
    /// The same 3× overload burst with the control loop on and off.
    Overload(overload::OverloadArgs),
}

/// Runs `brownout-demo bench`.
///
/// # Errors
/// When the benchmark cannot start its deployment.
pub async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    match args.what {
        BenchWhat::Overload(a) => overload::run(a).await,
    }
}

/// The model the demo runs when none is named: SmolLM2 when cached, else the tiny model.
pub fn default_model() -> String {
    if world::smollm2_cached() {
        "smollm2".into()
    } else {
        "tiny-random".into()
    }
}

/// Runs `brownout-demo demo`.
///
/// # Errors
/// When a port is taken, the model cannot be loaded, or a component fails to start.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.speed > 0.0 && args.speed.is_finite(),
        "--speed must be a positive number"
    );
    let model = args.model.clone().unwrap_or_else(default_model);
    let plan = match args.capacity_flows_per_s {
        _ if args.no_load => None,
        Some(c) => {
            anyhow::ensure!(
                c > 0.0 && c.is_finite(),
                "--capacity-flows-per-s must be a positive number"
            );
            Some(DemoLoadPlan::for_capacity(c, false))
        }
        None => {
            eprintln!(
                "brownout-demo: measuring what two engines of model {model} serve ({} s), to scale the load to it…",
                args.calibrate_secs.max(3)
            );
            Some(
                calibrate_demo(&model, args.calibrate_secs)
                    .await
                    .context("calibrating the demo's load")?,
            )
        }
    };
    let opts = WorldOptions {
        http_port: Some(args.port),
        model: model.clone(),
        cluster: args.cluster.clone(),
        redis_url: std::env::var("REDIS_URL")
            .ok()
            .filter(|u| !u.trim().is_empty()),
        // The one policy with the small engines' knobs and the capacities just measured.
        policy_yaml: match plan.as_ref().and_then(|p| p.measured.as_ref()) {
            Some(m) => overload::declare_capacity(&world::small_engines_policy(), m)?,
            None => world::small_engines_policy(),
        },
        ..WorldOptions::default()
    };
    eprintln!("brownout-demo: starting (model {model}; loading and warming up two engines)…");
    let world = World::start(opts).await?;
    print_banner(&world, &model, plan.as_ref(), args.speed);

    let load = plan.map(|plan| {
        let targets = world.engine_urls();
        let speed = args.speed;
        let faults = (
            format!("http://{}", world.http_addr()),
            world.tokens().0.to_string(),
        );
        tokio::spawn(async move {
            // One simulated evening per cycle, repeated until the demo stops; the agent
            // application's own failures follow the same curve.
            let mut seed = 1;
            loop {
                let cfg = demo_load(targets.clone(), speed, seed, &plan);
                let app = tokio::spawn(faults::run(demo_faults(
                    &faults.0,
                    &faults.1,
                    cfg.shape.clone(),
                    seed,
                )));
                match brownout::loadgen::run_load(cfg).await {
                    Ok(r) => eprintln!("{}", r.human()),
                    Err(e) => eprintln!("loadgen: {e:#}"),
                }
                app.abort();
                seed += 1;
            }
        })
    });

    let stop = async {
        if args.duration > 0 {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_secs(args.duration)) => {}
                () = brownout::serve::shutdown_signal() => {}
            }
        } else {
            // SIGTERM or SIGINT: the world stops gracefully (world.stop below).
            brownout::serve::shutdown_signal().await;
        }
    };
    stop.await;
    eprintln!("brownout-demo: stopping");
    if let Some(l) = load {
        l.abort();
    }
    world.stop().await
}

/// One simulated evening for the demo: quiet, a peak to 3× the capacity in the middle, quiet
/// again.
pub fn demo_load(targets: Vec<String>, speed: f64, seed: u64, plan: &DemoLoadPlan) -> LoadConfig {
    let mut c = LoadConfig::new(
        targets,
        LoadShape {
            duration: Duration::from_secs_f64(600.0 / speed),
            base_rate: plan.base_rate,
            peak_factor: plan.peak_factor,
            peak_center_ratio: 0.5,
            peak_width_ratio: 0.12,
            ..LoadShape::default()
        },
    );
    c.max_tokens = 32;
    c.seed = seed;
    c.max_in_flight = 2048;
    c.progress = false;
    c
}

/// The agent application's failures for one simulated evening ([`faults`]): about one every two
/// seconds outside the peak, the peak's factor more at its top, with 19 successful steps
/// reported per failure (5 % of its steps fail: `agent-app-availability` burns at 5×).
pub fn demo_faults(
    control_plane: &str,
    ingest_token: &str,
    shape: LoadShape,
    seed: u64,
) -> faults::FaultConfig {
    faults::FaultConfig {
        control_plane: control_plane.to_string(),
        ingest_token: ingest_token.to_string(),
        shape,
        base_per_s: 0.5,
        ok_steps_per_fault: 19,
        seed,
    }
}

/// The banner's line on the load: what was calibrated and what the peak does.
pub fn load_line(plan: Option<&DemoLoadPlan>, speed: f64) -> String {
    match plan {
        None => "none (--no-load)".into(),
        Some(p) => format!(
            "an evening every {:.0} s: {:.2} flows/s, peak {:.2} flows/s at {:.0} s ({:.1}× / {:.1}× the {} capacity of {:.2} flows/s)",
            600.0 / speed,
            p.base_rate,
            p.peak_rate(),
            300.0 / speed,
            BASE_LOAD_RATIO,
            PEAK_LOAD_RATIO,
            if p.calibrated { "measured" } else { "given" },
            p.capacity_flows_per_s,
        ),
    }
}

fn print_banner(w: &World, model: &str, plan: Option<&DemoLoadPlan>, speed: f64) {
    let ui = format!("http://{}", w.http_addr());
    let t = w.tokens();
    let bus = if w.uses_redis() {
        "Redis (REDIS_URL)"
    } else {
        "in-process bus (set REDIS_URL for Redis)"
    };
    println!(
        "\nbrownout-demo is running.\n\
         \n  web UI        {ui}/login?token={read}\n  JSON API      {ui}/api/v1/... (Authorization: Bearer <read token>)\n  metrics       {ui}/metrics\n  weekly report {ui}/reports/current\n  OTLP          grpc://{grpc}  http://{otlp}\n\
         \n  engines       {engines}   (model: {model}{model_note})\n  load          {load}\n  gpu-agents    {agents}   (GPUs SIMULATED)\n  command bus   {bus}\n  app faults    GPU queue and tool timeouts, KV pressure from service agent-app (SIMULATED)\n\
         \n  ingest token  {ingest}\n  read token    {read}\n  admin token   {admin}\n\
         \n  Pin a tier:   curl -X POST -H 'Authorization: Bearer {admin}' -H 'content-type: application/json' \\\n                 -d '{{\"tier\":2,\"duration_secs\":60,\"reason\":\"drill\"}}' {ui}/api/v1/degrade/override\n\
         \nCtrl-C stops.\n",
        grpc = w.otlp_grpc_addr(),
        otlp = w.otlp_http_addr(),
        engines = w.engine_urls().join(" "),
        model_note = if model == "tiny-random" {
            ", a tiny random model: scripts/fetch-model.sh fetches SmolLM2"
        } else {
            ""
        },
        load = load_line(plan, speed),
        agents = w.agent_urls().join(" "),
        ingest = t.0,
        read = t.1,
        admin = t.2,
    );
}
