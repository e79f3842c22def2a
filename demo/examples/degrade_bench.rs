//! Degradation benchmarks (docs/BENCHMARKS.md "## Degradation").
//!
//! 1. Decision → applied latency with N serving subscribers on loopback Redis: the fenced
//!    publisher publishes a command, each subscriber applies it; latency from the acks
//!    (`applied_at_ms − issued_at_ms`, ms resolution) and from in-process watch receivers
//!    (µs resolution, publish call start → handle updated).
//! 2. Convergence after Redis comes back: a redis-server of its own on a spare port is killed,
//!    the decision changes during the outage, Redis restarts empty; time from restart until every
//!    subscriber has the new tier.
//!
//! ```text
//! cargo run --example degrade_bench -- [subscribers=10] [commands=500] [restarts=5]
//! ```
//! Uses REDIS_URL (default redis://127.0.0.1:6379; `redis+sentinel://…` too, e.g. under
//! `bench/with-sentinel.sh`) for part 1; needs `redis-server` on PATH.

use std::time::{Duration, Instant};

use brownout::degrade::redis::{PublishOutcome, RedisBus};
use brownout::degrade::{
    DegradeConfig, DegradeHandle, Override, Policy, Transport, run_controller,
};
use brownout_protocol::{Ack, Command, FeatureState, Tier, now_ms};
use brownout_serving::control::{ControlHandle, SubscriberConfig, spawn_subscriber};
use redis::AsyncCommands;

const KEY: &[u8] = b"bench-key";

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i]
}

fn sub_cfg(url: &str, cluster: &str, i: usize) -> SubscriberConfig {
    let mut c = SubscriberConfig::new(url, cluster, KEY, &format!("bench-{i}"));
    c.lease_check = Duration::from_millis(100);
    c
}

async fn latency(url: &str, n_subs: usize, n_cmds: u64) -> anyhow::Result<()> {
    let cl = format!("bench-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let mut bus = RedisBus::connect(url, &cl, "bench-cp", Duration::from_secs(1), KEY).await?;
    let handles: Vec<ControlHandle> = (0..n_subs).map(|_| ControlHandle::new(&cl)).collect();
    let mut tasks = Vec::new();
    for (i, h) in handles.iter().enumerate() {
        tasks.push(spawn_subscriber(h.clone(), sub_cfg(url, &cl, i)).await);
    }
    // Per-instance watch: when did each handle see each version?
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, u64, Instant)>();
    for (i, h) in handles.iter().enumerate() {
        let mut w = h.subscribe();
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            while w.changed().await.is_ok() {
                let v = w.borrow_and_update().command.version;
                let _ = tx.send((i, v, Instant::now()));
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await; // all subscribed
    let epoch = bus
        .try_acquire(60_000, 0)
        .await?
        .ok_or_else(|| anyhow::anyhow!("lease held"))?;
    // The node to read acks from (for redis+sentinel://, the master Sentinel names now).
    let mut conn = brownout_protocol::RedisTarget::parse(url)?
        .client(Duration::from_secs(1))
        .await?
        .get_multiplexed_async_connection()
        .await?;
    let keys = brownout_protocol::RedisKeys::new(&cl)?;

    let mut watch_us = Vec::new();
    let mut ack_ms = Vec::new();
    let mut publish_us = Vec::new();
    for k in 0..n_cmds {
        let tier = if k % 2 == 0 { Tier::T1 } else { Tier::T2 };
        let start = Instant::now();
        let issued = now_ms();
        let out = bus
            .publish(epoch, k + 1, KEY, |v| {
                let mut c = Command::normal(&cl, epoch, v, issued, 30_000);
                c.tier = tier;
                c.reason.trigger = "bench".into();
                c.features
                    .insert("pdf_analysis".into(), FeatureState::Disabled);
                c
            })
            .await?;
        publish_us.push(start.elapsed().as_secs_f64() * 1e6);
        let PublishOutcome::Published { command, .. } = out else {
            anyhow::bail!("publish refused: {out:?}")
        };
        let mut seen = vec![false; n_subs];
        let deadline = Instant::now() + Duration::from_secs(5);
        while seen.iter().any(|s| !s) {
            let (i, v, at) = tokio::time::timeout_at(deadline.into(), rx.recv())
                .await
                .map_err(|_| {
                    anyhow::anyhow!("version {} not applied everywhere in 5 s", command.version)
                })?
                .ok_or_else(|| anyhow::anyhow!("watch closed"))?;
            if v == command.version && !seen[i] {
                seen[i] = true;
                watch_us.push(at.duration_since(start).as_secs_f64() * 1e6);
            }
        }
        // Acks (written right after apply): give them a moment, then read all.
        tokio::time::sleep(Duration::from_millis(2)).await;
        let acks: std::collections::BTreeMap<String, String> = conn.hgetall(keys.acks()).await?;
        for (inst, a) in &acks {
            if let Ok(Ack::Applied {
                version,
                applied_at_ms,
                ..
            }) = Ack::parse_signed(a, KEY, inst)
                && version == command.version
            {
                ack_ms.push(applied_at_ms.saturating_sub(command.issued_at_ms) as f64);
            }
        }
    }
    println!("## decision -> applied, {n_subs} subscribers, {n_cmds} commands, loopback Redis");
    println!(
        "publish call (Lua script, 1 round trip): p50 {:.0} us  p99 {:.0} us",
        pct(&mut publish_us, 0.5),
        pct(&mut publish_us, 0.99)
    );
    println!(
        "applied (watch, us resolution, {} samples): p50 {:.0} us  p99 {:.0} us  max {:.0} us",
        watch_us.len(),
        pct(&mut watch_us, 0.5),
        pct(&mut watch_us, 0.99),
        pct(&mut watch_us, 1.0)
    );
    println!(
        "applied (acks, ms resolution, {} samples): p50 {} ms  p99 {} ms  max {} ms",
        ack_ms.len(),
        pct(&mut ack_ms, 0.5),
        pct(&mut ack_ms, 0.99),
        pct(&mut ack_ms, 1.0)
    );
    let _ = bus.release(epoch).await;
    for t in tasks {
        t.abort();
    }
    Ok(())
}

const POLICY: &str = r#"
evaluate_interval_ms: 100
command_lease_ms: 30000
features:
  - { name: pdf_analysis, criticality: sheddable, disable_at_tier: 1 }
tiers:
  t1: { hold_down_secs: 1 }
  t2:
    hold_down_secs: 1
    params: { model_route: fallback, max_tokens_cap: 128, max_num_seqs: 8 }
  t3:
    hold_down_secs: 1
    params: { admit_min_criticality: critical, retry_after_base_secs: 20, jitter_ratio: 0.5, recovery_eta_max_secs: 600 }
"#;

async fn convergence(n_subs: usize, rounds: usize) -> anyhow::Result<()> {
    let mut own = brownout_test_support::OwnRedis::start();
    let url = own.url();
    let cl = "bench-restart";
    let mut cfg = DegradeConfig::new(cl, KEY, Policy::from_yaml(POLICY)?);
    cfg.leader_lease_ms = 3000;
    cfg.redis_timeout = Duration::from_millis(200);
    let h = DegradeHandle::new(cfg, &prometheus::Registry::new())?;
    let ctl = tokio::spawn(run_controller(
        h.clone(),
        Transport::Redis { url: url.clone() },
        std::future::pending(),
    ));
    let handles: Vec<ControlHandle> = (0..n_subs).map(|_| ControlHandle::new(cl)).collect();
    let mut tasks = Vec::new();
    for (i, s) in handles.iter().enumerate() {
        tasks.push(spawn_subscriber(s.clone(), sub_cfg(&url, cl, i)).await);
    }
    let pin = |tier| Override {
        tier,
        until_ms: now_ms() + 3_600_000,
        reason: "bench".into(),
    };
    let mut tier = Tier::T1;
    h.set_override(pin(tier));
    let wait_all = |t: Tier, hs: &[ControlHandle]| hs.iter().all(|s| s.tier() == t);
    let start = Instant::now();
    while !wait_all(tier, &handles) {
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(10),
            "initial tier never applied"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut times = Vec::new();
    for _ in 0..rounds {
        own.kill();
        tier = if tier == Tier::T1 { Tier::T2 } else { Tier::T1 };
        h.set_override(pin(tier));
        tokio::time::sleep(Duration::from_secs(1)).await;
        own.spawn();
        let back = Instant::now();
        while !wait_all(tier, &handles) {
            anyhow::ensure!(back.elapsed() < Duration::from_secs(20), "never converged");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        times.push(back.elapsed().as_secs_f64() * 1000.0);
    }
    println!(
        "## convergence after Redis restarts empty (1 s outage, decision changed during it, {n_subs} subscribers, controller interval 100 ms)"
    );
    let each: Vec<String> = times.iter().map(|t| format!("{t:.0}")).collect();
    println!(
        "rounds (ms): {}  median {:.0} ms  max {:.0} ms",
        each.join(", "),
        pct(&mut times.clone(), 0.5),
        pct(&mut times, 1.0)
    );
    ctl.abort();
    for t in tasks {
        t.abort();
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n_subs: usize = args.first().map_or(Ok(10), |s| s.parse())?;
    let n_cmds: u64 = args.get(1).map_or(Ok(500), |s| s.parse())?;
    let rounds: usize = args.get(2).map_or(Ok(5), |s| s.parse())?;
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    latency(&url, n_subs, n_cmds).await?;
    convergence(n_subs, rounds).await?;
    Ok(())
}
