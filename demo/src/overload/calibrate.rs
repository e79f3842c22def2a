//! The calibration: the flows per second a fresh engine completes within their deadlines, and
//! the capacity it declares in the policy.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use brownout::loadgen::{LoadConfig, LoadShape};
use brownout_protocol::Tier;
use serde::Serialize;

use crate::world::{World, WorldOptions};

use super::cli::*;
use super::measure::*;

pub(super) fn load_config(
    args: &OverloadArgs,
    targets: Vec<String>,
    shape: LoadShape,
    label: &str,
) -> anyhow::Result<LoadConfig> {
    let mut c = LoadConfig::new(targets, shape);
    c.speed = args.speed;
    args.clients.apply(&mut c)?;
    c.max_tokens = args.max_tokens;
    c.seed = args.seed;
    c.label = label.to_string();
    Ok(c)
}

/// Flows per second a fresh engine completes within their deadlines, closed loop without think
/// time: the best of `max_num_seqs/2`, `max_num_seqs` and `2×max_num_seqs` concurrent users.
pub(super) async fn calibrate(
    args: &OverloadArgs,
    model: &str,
    policy: &str,
    step_ms: u64,
    guard: usize,
) -> anyhow::Result<Capacity> {
    let opts = WorldOptions {
        agents: false,
        ..Setup::LOOP_OFF.world_options(model, policy, step_ms, guard)?
    };
    let cfg = load_config(args, Vec::new(), LoadShape::default(), "calibrate")?;
    calibrate_capacity(
        opts,
        &cfg,
        Duration::from_secs(args.calibrate_secs),
        "bench overload",
    )
    .await
}

/// What a calibration measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Capacity {
    /// Flows finished within their deadlines per second, at the best concurrency.
    pub flows_per_s: f64,
    /// Requests the engines completed per second at that concurrency (all engines, aborted
    /// ones left out, as the controller's measured service rate counts them): the capacity in
    /// the unit the controller's `demand_ratio` and `expected_wait` divide by. `None` when an engine's
    /// counters could not be read.
    pub requests_per_s: Option<f64>,
    /// Requests/s the engines finished at the same concurrency with the policy's T2 in force
    /// (the fallback route, `max_tokens` capped): the capacity T2 adds, declared to the
    /// controller as `fallback_capacity_rps`. `None` when not measured.
    pub fallback_requests_per_s: Option<f64>,
}

/// The capacity of a fresh deployment built from `opts` (start it without agents and in dry
/// run, so nothing degrades while it is measured), in flows per second that finish within
/// their deadlines: users in a closed loop without think time on `template`'s flows (its
/// targets are replaced by the deployment's engines), the best of `max_num_seqs/2`,
/// `max_num_seqs` and `2×max_num_seqs` users per engine, `total` shared between the three;
/// and the request rate the engines finished at that concurrency. Used by `brownout-demo
/// bench overload` and by `brownout-demo demo` (which scales its evening peak to it).
/// Progress lines on stderr start with `label`.
///
/// # Errors
/// When the deployment cannot start or the load cannot run.
pub async fn calibrate_capacity(
    opts: WorldOptions,
    template: &LoadConfig,
    total: Duration,
    label: &str,
) -> anyhow::Result<Capacity> {
    let seqs = opts.engine.max_num_seqs.max(1);
    let t2 = brownout::degrade::Policy::from_yaml(&opts.policy_yaml)
        .ok()
        .map(|p| p.t2);
    let t2 = t2.as_ref();
    let world = World::start(opts).await?;
    let engines = world.engine_urls();
    let n = engines.len().max(1);
    let http = brownout::loadgen::http_client()?;
    let completed = async || -> Option<f64> {
        let mut sum = 0.0;
        for u in &engines {
            sum += engine_counters(&http, u).await?.completed;
        }
        Some(sum)
    };
    let mut cfg = template.clone();
    cfg.targets = engines.clone();
    cfg.label = "calibrate".into();
    cfg.progress = false;
    // No think time: a closed-loop user is then always on the engine, so the figure is what the
    // engine can serve (think time costs the engine nothing in the open-loop runs either).
    cfg.speed = 1e9;
    let each = Duration::from_secs_f64((total.as_secs_f64() / 3.0).max(2.0));
    let mut best = Capacity {
        flows_per_s: 0.0,
        requests_per_s: None,
        fallback_requests_per_s: None,
    };
    // Flows/s within deadline and requests/s finished by `users` in a closed loop.
    let measure = async |users: usize| -> anyhow::Result<(f64, Option<f64>)> {
        let before = completed().await;
        let started = Instant::now();
        let r = brownout::loadgen::closed_loop_flows_per_s(&cfg, users, each).await?;
        let secs = started.elapsed().as_secs_f64();
        let rps = match (before, completed().await) {
            (Some(b), Some(a)) if secs > 0.0 => Some((a - b).max(0.0) / secs),
            _ => None,
        };
        Ok((r, rps))
    };
    let mut best_users = 0;
    for c in [(seqs / 2).max(1), seqs, seqs * 2] {
        let users = c * n;
        let (r, rps) = measure(users).await?;
        eprintln!(
            "{label}: calibration: {users} users in a closed loop → {r:.2} flows/s within deadline, {} requests/s finished",
            rps.map_or_else(|| "?".to_string(), |v| format!("{v:.2}"))
        );
        if r > best.flows_per_s {
            best = Capacity {
                flows_per_s: r,
                requests_per_s: rps,
                fallback_requests_per_s: None,
            };
            best_users = users;
        }
    }
    // The T2 route at the best concurrency: each engine is told T2 directly (the controller
    // is in dry run), for as long as one concurrency took.
    if best_users > 0
        && let Some(t2) = t2
    {
        for (i, h) in world.engine_controls().iter().enumerate() {
            let cur = h.current().command.order_key();
            let mut cmd = brownout_protocol::Command::normal(
                h.cluster(),
                cur.0.max(1),
                cur.1 + 1,
                brownout_protocol::now_ms(),
                3_600_000,
            );
            cmd.tier = Tier::T2;
            cmd.reason.trigger = "operator".into();
            cmd.reason.detail = "calibration of the T2 route".into();
            cmd.model_route
                .insert("default".into(), t2.model_route.clone());
            cmd.limits.max_tokens_cap = Some(t2.max_tokens_cap);
            cmd.limits.max_num_seqs = Some(t2.max_num_seqs);
            h.apply(cmd, brownout_protocol::now_ms())
                .with_context(|| format!("pinning T2 on engine {i} for the calibration"))?;
        }
        let (r, rps) = measure(best_users).await?;
        eprintln!(
            "{label}: calibration: {best_users} users in a closed loop with T2 in force (route {}, max_tokens {}) → {r:.2} flows/s within deadline, {} requests/s finished",
            t2.model_route,
            t2.max_tokens_cap,
            rps.map_or_else(|| "?".to_string(), |v| format!("{v:.2}"))
        );
        best.fallback_requests_per_s = rps;
    }
    world.stop().await?;
    Ok(best)
}

/// `policy` with `capacity_rps` and `fallback_capacity_rps` (the calibrated capacities of the
/// primary and the T2 route, declared to the controller as a load test would tell an
/// operator), each unless the policy declares it already or it is unknown.
///
/// # Errors
/// YAML that does not parse.
pub fn declare_capacity(policy: &str, c: &Capacity) -> anyhow::Result<String> {
    let mut v: serde_yaml::Value = serde_yaml::from_str(policy).context("the policy YAML")?;
    let Some(m) = v.as_mapping_mut() else {
        anyhow::bail!("the policy YAML is not a mapping");
    };
    let mut changed = false;
    for (key, rps) in [
        ("capacity_rps", c.requests_per_s),
        ("fallback_capacity_rps", c.fallback_requests_per_s),
    ] {
        if let Some(rps) = rps.filter(|r| r.is_finite() && *r > 0.0)
            && !m.contains_key(key)
        {
            m.insert(key.into(), ((rps * 100.0).round() / 100.0).into());
            changed = true;
        }
    }
    if !changed {
        return Ok(policy.to_string());
    }
    Ok(serde_yaml::to_string(&v)?)
}
