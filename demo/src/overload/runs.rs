//! One configuration's run on a fresh deployment, and everything it produced.

use std::time::{Duration, Instant};

use brownout::loadgen::{LoadReport, LoadShape};
use brownout_protocol::Tier;
use serde::Serialize;

use crate::world::World;

use super::calibrate::*;
use super::cli::*;
use super::measure::*;

/// Everything one configuration produced (overload.json).
#[derive(Debug, Clone, Serialize)]
pub struct RunDetail {
    pub figures: Figures,
    pub phases: Phases,
    /// Applied tier changes with their reasons.
    pub changes: Vec<Change>,
    pub decided_changes: Vec<Change>,
    /// Every recorded decision of the run (reasons, latched conditions, per-instance actions).
    pub decisions: Vec<DecisionLine>,
    /// `(seconds, applied tier)` sampled every 500 ms.
    pub tier_samples: Vec<(f64, u8)>,
    /// `(seconds, requests waiting, requests running)` from the control plane's latest agent
    /// snapshots, sampled every 500 ms (what `queue_depth` and `expected_wait` read).
    pub engine_samples: Vec<(f64, u64, u64)>,
    /// `(window start s, flows/s)` in 5 s windows.
    pub goodput_series: Vec<(f64, f64)>,
    pub load: LoadReport,
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn one_run(
    args: &OverloadArgs,
    model: &str,
    policy: &str,
    step_ms: u64,
    guard: usize,
    setup: Setup,
    capacity: f64,
    phases: &Phases,
) -> anyhow::Result<RunDetail> {
    let world = World::start(setup.world_options(model, policy, step_ms, guard)?).await?;
    let url = world.engine_urls().remove(0);
    let http = brownout::loadgen::http_client()?;
    let before = engine_counters(&http, &url).await;
    let shape = LoadShape {
        duration: Duration::from_secs_f64(phases.total_s()),
        base_rate: capacity,
        peak_factor: 1.0,
        burst_prob_per_s: 0.0,
        profile: phases.profile(),
        ..LoadShape::default()
    };
    let cfg = load_config(args, vec![url.clone()], shape, &setup.as_str())?;
    let start_ms = brownout_protocol::now_ms();
    let started = Instant::now();
    let control = world.engine_controls().remove(0);
    let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(f64, u8)>::new()));
    let queue = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(f64, u64, u64)>::new()));
    let sampler = {
        let (control, samples, queue) = (control.clone(), samples.clone(), queue.clone());
        let degrade = world.plane().degrade.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                let t = started.elapsed().as_secs_f64();
                let mut v = samples
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if v.len() < 100_000 {
                    v.push((t, control.tier().as_u8()));
                }
                drop(v);
                // What the control plane's latest snapshots say the engine holds.
                let snaps = degrade.inputs(brownout_protocol::now_ms()).snapshots;
                let (w, r) = snaps
                    .iter()
                    .flat_map(|s| &s.engines)
                    .fold((0, 0), |(w, r), e| {
                        (w + e.num_requests_waiting, r + e.num_requests_running)
                    });
                let mut q = queue
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if q.len() < 100_000 {
                    q.push((t, w, r));
                }
            }
        })
    };
    let load = brownout::loadgen::run_load(cfg).await?;
    // Let the tier come back to T0 (the loop's recovery), bounded.
    let settle_until = Instant::now() + Duration::from_secs(args.settle_secs);
    while setup.base == Base::LoopOn && control.tier() != Tier::T0 && Instant::now() < settle_until
    {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let after = engine_counters(&http, &url).await;
    sampler.abort();
    let tier_samples = samples
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let engine_samples = queue
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let decisions = world.plane().degrade.decisions();
    world.stop().await?;

    let to_change = |d: &brownout::degrade::DecisionRecord| Change {
        at_s: d.at_ms.saturating_sub(start_ms) as f64 / 1000.0,
        from: d.previous.as_u8(),
        to: d.tier.as_u8(),
        trigger: d.trigger.clone(),
        detail: d.detail.clone(),
    };
    let decision_lines: Vec<DecisionLine> = decisions
        .iter()
        .filter(|d| d.at_ms >= start_ms)
        .map(|d| DecisionLine::from_record(d, start_ms))
        .collect();
    let decided: Vec<Change> = decisions
        .iter()
        .filter(|d| d.tier != d.previous && d.at_ms >= start_ms)
        .map(to_change)
        .collect();
    let applied: Vec<Change> = decisions
        .iter()
        .filter(|d| d.tier != d.previous && d.at_ms >= start_ms && !d.dry_run)
        .map(to_change)
        .collect();
    let tf = tier_figures(&applied, phases.onset_s(), phases.end_s());
    let df = tier_figures(&decided, phases.onset_s(), phases.end_s());
    let mut figs = figures(setup, &load, capacity, phases, &tf, &df, before, after);
    figs.simulate_step_ms = step_ms;
    figs.critical_step_tokens = setup
        .world_options(model, policy, step_ms, guard)?
        .engine
        .critical_step_tokens;
    Ok(RunDetail {
        figures: figs,
        phases: *phases,
        changes: applied,
        decided_changes: decided,
        decisions: decision_lines,
        tier_samples,
        engine_samples,
        goodput_series: load.timeline.goodput_series(5),
        load,
    })
}
