//! `brownout-demo bench overload`: the proof that the loop protects users.
//!
//! The same 3× overload burst hits the bundled serving tier twice: once with the control loop on
//! (the controller publishes its decisions) and once with it off (the controller decides in dry
//! run and publishes nothing). Both runs start from a fresh deployment and use the same seeded
//! arrival plan. The offered base rate is calibrated against the engine's measured capacity first,
//! so the burst is a real overload on whatever machine runs it.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use brownout_protocol::{Criticality, Tier};
use serde::Serialize;

use super::world::{World, WorldOptions};
use brownout::loadgen::{LoadConfig, LoadReport, LoadShape};

/// Arguments of `brownout-demo bench overload`.
#[derive(Debug, Clone, clap::Args)]
pub struct OverloadArgs {
    /// `smollm2`, `tiny-random` or a GGUF path (default: SmolLM2 when cached).
    #[arg(long)]
    pub model: Option<String>,
    /// Length of each run, seconds (the burst is in the middle).
    #[arg(long, default_value_t = 120)]
    pub duration_secs: u64,
    /// Height of the burst over the base rate.
    #[arg(long, default_value_t = 3.0)]
    pub burst_factor: f64,
    /// Base load as a share of the measured capacity.
    #[arg(long, default_value_t = 0.6)]
    pub base_load_ratio: f64,
    /// max_tokens per call.
    #[arg(long, default_value_t = 24)]
    pub max_tokens: u32,
    #[arg(long, default_value_t = 11)]
    pub seed: u64,
}

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct RunFigures {
    pub critical_success_rate: f64,
    pub critical_ttft_p99_s: f64,
    pub default_success_rate: f64,
    pub sheddable_success_rate: f64,
    pub goodput_rps: f64,
    pub shed_share: ShedShare,
    /// Seconds from the start of the load to the first applied tier > 0 (None: never).
    pub time_to_first_degradation_s: Option<f64>,
    /// Tier changes applied by the serving tier.
    pub tier_changes: usize,
    /// Tier changes the controller decided (in dry run: would have made).
    pub decided_tier_changes: usize,
    pub max_tier: u8,
    pub model: String,
    /// The engine's measured capacity and the base rate derived from it.
    pub capacity_calls_per_s: f64,
    pub base_flows_per_s: f64,
    pub load: LoadReport,
}

/// Share of calls answered 429, per criticality.
#[derive(Debug, Clone, Serialize)]
pub struct ShedShare {
    pub critical: f64,
    pub default: f64,
    pub sheddable: f64,
}

/// Calls per second one engine completes with `max_tokens`, measured closed-loop.
async fn measure_capacity(
    url: &str,
    concurrency: usize,
    max_tokens: u32,
    secs: u64,
) -> anyhow::Result<f64> {
    let client = brownout::loadgen::http_client()?;
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..concurrency {
        let (client, url) = (client.clone(), url.to_string());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < deadline {
                let body = serde_json::json!({"model": "default", "max_tokens": max_tokens, "seed": i,
                    "messages": [{"role": "user", "content": "Help me write a short note to a colleague."}]});
                let r = client.post(format!("{url}/v1/chat/completions")).json(&body).send().await;
                if r.is_ok_and(|r| r.status().is_success()) {
                    n += 1;
                }
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap_or(0);
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// Average calls per flow in the load mix.
fn calls_per_flow() -> f64 {
    let total: u32 = brownout::loadgen::FlowKind::MIX
        .iter()
        .map(|(_, w)| w)
        .sum();
    brownout::loadgen::FlowKind::MIX
        .iter()
        .map(|(k, w)| k.calls().len() as f64 * f64::from(*w))
        .sum::<f64>()
        / f64::from(total)
}

fn world_options(model: &str, loop_on: bool) -> WorldOptions {
    WorldOptions {
        model: model.to_string(),
        dry_run: !loop_on,
        num_engines: 1,
        ..WorldOptions::default()
    }
}

async fn one_run(
    args: &OverloadArgs,
    model: &str,
    base_rate: f64,
    loop_on: bool,
) -> anyhow::Result<RunFigures> {
    let world = World::start(world_options(model, loop_on)).await?;
    let start_ms = brownout_protocol::now_ms();
    let cfg = LoadConfig {
        targets: world.engine_urls(),
        shape: LoadShape {
            duration: Duration::from_secs(args.duration_secs),
            base_rate,
            peak_factor: args.burst_factor,
            peak_center_ratio: 0.5,
            peak_width_ratio: 0.15,
            burst_prob_per_s: 0.0,
            ..LoadShape::default()
        },
        speed: 4.0,
        misbehaving_ratio: 0.1,
        model: "default".into(),
        max_tokens: args.max_tokens,
        seed: args.seed,
        ttft_slo: Duration::from_secs(2),
        max_in_flight: 4096,
        call_timeout: Duration::from_secs(30),
        max_retries: 2,
        progress: true,
    };
    let load = brownout::loadgen::run_load(cfg).await?;
    let decisions = world.plane().degrade.decisions();
    let changes: Vec<_> = decisions
        .iter()
        .filter(|d| d.tier != d.previous && d.at_ms >= start_ms)
        .collect();
    let applied: Vec<_> = changes.iter().filter(|d| !d.dry_run).collect();
    let first = applied
        .iter()
        .find(|d| d.tier > Tier::T0)
        .map(|d| (d.at_ms - start_ms) as f64 / 1000.0);
    let max_tier = applied.iter().map(|d| d.tier.as_u8()).max().unwrap_or(0);
    world.stop().await?;
    let class = |c: Criticality| load.class(c).cloned();
    let success = |c| class(c).map_or(1.0, |x| x.success_rate);
    let shed = |c| class(c).map_or(0.0, |x| x.shed_share);
    Ok(RunFigures {
        critical_success_rate: success(Criticality::Critical),
        critical_ttft_p99_s: class(Criticality::Critical).map_or(0.0, |x| x.ttft_p99_s),
        default_success_rate: success(Criticality::Default),
        sheddable_success_rate: success(Criticality::Sheddable),
        goodput_rps: load.goodput_rps,
        shed_share: ShedShare {
            critical: shed(Criticality::Critical),
            default: shed(Criticality::Default),
            sheddable: shed(Criticality::Sheddable),
        },
        time_to_first_degradation_s: first,
        tier_changes: applied.len(),
        decided_tier_changes: changes.len(),
        max_tier,
        model: model.to_string(),
        capacity_calls_per_s: 0.0,
        base_flows_per_s: base_rate,
        load,
    })
}

/// Runs the benchmark; the last stdout line is `{"loop_on": {...}, "loop_off": {...}}`.
///
/// # Errors
/// When a deployment cannot start.
pub async fn run(args: OverloadArgs) -> anyhow::Result<()> {
    let model = args.model.clone().unwrap_or_else(super::default_model);
    eprintln!("bench overload: model {model}; measuring one engine's capacity…");
    let cap = {
        let world = World::start(WorldOptions {
            agents: false,
            ..world_options(&model, false)
        })
        .await?;
        let url = world.engine_urls().remove(0);
        let c = measure_capacity(
            &url,
            world_options(&model, false).engine.max_num_seqs,
            args.max_tokens,
            10,
        )
        .await?;
        world.stop().await?;
        c
    };
    anyhow::ensure!(
        cap > 0.0,
        "the engine completed no request while measuring capacity"
    );
    let base_rate = args.base_load_ratio * cap / calls_per_flow();
    eprintln!(
        "bench overload: capacity {cap:.2} calls/s; base {base_rate:.2} flows/s ({:.0}% of capacity), burst ×{}",
        args.base_load_ratio * 100.0,
        args.burst_factor
    );
    eprintln!("bench overload: run 1/2, loop ON");
    let mut on = one_run(&args, &model, base_rate, true)
        .await
        .context("loop-on run")?;
    on.capacity_calls_per_s = cap;
    eprintln!("{}", on.load.human());
    eprintln!("bench overload: run 2/2, loop OFF (controller in dry run)");
    let mut off = one_run(&args, &model, base_rate, false)
        .await
        .context("loop-off run")?;
    off.capacity_calls_per_s = cap;
    eprintln!("{}", off.load.human());
    let row = |name: &str, f: &RunFigures| {
        format!(
            "{name:<9} critical {:>7.3}%  ttft_p99 {:>6.2}s  default {:>7.3}%  sheddable {:>7.3}%  goodput {:>5.2}/s  shed(s) {:>5.1}%  first_degradation {}  tier_changes {} (max T{})",
            f.critical_success_rate * 100.0,
            f.critical_ttft_p99_s,
            f.default_success_rate * 100.0,
            f.sheddable_success_rate * 100.0,
            f.goodput_rps,
            f.shed_share.sheddable * 100.0,
            f.time_to_first_degradation_s
                .map_or("never".into(), |s| format!("{s:.0}s")),
            f.tier_changes,
            f.max_tier
        )
    };
    eprintln!("{}\n{}", row("loop on", &on), row("loop off", &off));
    println!("{}", serde_json::json!({"loop_on": on, "loop_off": off}));
    Ok(())
}
