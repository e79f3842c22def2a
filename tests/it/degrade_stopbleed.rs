//! Stop-bleed in the pure controller, on a logical clock (every `now_ms` is given, nothing
//! sleeps): per-instance KV actions with the seed figures, the fast triggers of the default
//! policy, the admission ramp after T3 and retry-wave detection.

use std::collections::BTreeSet;

use brownout::degrade::controller::{Controller, Decision, Inputs, InstanceOverride, Transition};
use brownout::degrade::policy::{Policy, PolicyError, Signal};
use brownout::degrade::stopbleed::{autocorrelation, detect_retry_waves};
use brownout_protocol::{AgentSnapshot, EngineStats, KvStats, Tier};
use proptest::prelude::*;

/// One engine's figures at one instant.
#[derive(Clone, Copy, Default)]
struct Eng {
    kv: f64,
    ttft: f64,
    queue: f64,
    answered: u64,
    completed: u64,
    waiting: u64,
    running: u64,
    /// First-attempt arrivals (`None`: the engine does not export them).
    first: Option<u64>,
}

fn engine(id: &str, e: Eng) -> EngineStats {
    EngineStats {
        id: id.into(),
        up: true,
        kv: KvStats {
            usage_ratio: e.kv,
            ..KvStats::default()
        },
        ttft_p99_s: e.ttft,
        queue_wait_p99_s: e.queue,
        requests_answered_total: e.answered,
        requests_completed_total: e.completed,
        num_requests_waiting: e.waiting,
        num_requests_running: e.running,
        requests_first_arrived_total: e.first,
        requests_arrived_total: e.first.map(|_| e.answered),
        configured_max_num_seqs: Some(256),
        ..EngineStats::default()
    }
}

/// Two hosts with one engine each: instance keys `gpu-1/engine-0` and `gpu-2/engine-0`.
fn two(now: u64, a: Eng, b: Eng) -> Inputs {
    let snap = |host: &str, e: Eng| AgentSnapshot {
        host: host.into(),
        ts_ms: now,
        probe_up: true,
        engines: vec![engine("engine-0", e)],
        ..AgentSnapshot::default()
    };
    Inputs {
        now_ms: now,
        snapshots: vec![snap("gpu-1", a), snap("gpu-2", b)],
        ..Inputs::default()
    }
}

fn kv(v: f64) -> Eng {
    Eng {
        kv: v,
        ..Eng::default()
    }
}

fn actions(d: &Decision) -> BTreeSet<(String, String)> {
    d.instance_actions
        .iter()
        .map(|a| (a.instance.clone(), a.action.clone()))
        .collect()
}

const A: &str = "gpu-1/engine-0";
const B: &str = "gpu-2/engine-0";

/// One evaluation a second later.
fn at(c: &mut Controller, t: &mut u64, a: f64, b: f64) -> Decision {
    *t += 1000;
    c.step(&two(*t, kv(a), kv(b)))
}

#[test]
fn seed_figures_watch_then_halve_then_drain_one_instance_and_restore_it() {
    let mut c = Controller::new(Policy::seed_default());
    let mut t = 0;
    // 0.88 on A: a watch 120 s after the first sample, no entry; the peer at 0.5 has nothing.
    for _ in 0..120 {
        let d = at(&mut c, &mut t, 0.88, 0.5);
        assert!(d.instances.is_empty(), "no action below 92% at {t}");
        assert!(
            d.instance_actions.is_empty(),
            "no watch before 120 s at {t}"
        );
    }
    let d = at(&mut c, &mut t, 0.88, 0.5);
    assert_eq!(
        actions(&d),
        BTreeSet::from([(A.to_string(), "watch".to_string())]),
        "P2 watch after 120 s above 85%"
    );
    assert!(d.instances.is_empty(), "a watch is a reason only");
    // Above 92 %: halved once it has lasted a minute.
    let start = t;
    let (halved_at, d) = loop {
        let d = at(&mut c, &mut t, 0.95, 0.5);
        if !d.instances.is_empty() {
            break (t, d);
        }
        assert!(t - start < 70_000, "never halved");
    };
    assert_eq!(
        halved_at - start,
        61_000,
        "halved 60 s after the first sample above 92%"
    );
    let e = &d.instances[A];
    assert_eq!(e.max_num_seqs, Some(128), "256 -> 128");
    assert_eq!(e.drain, None);
    assert!(!d.instances.contains_key(B), "the peer is unaffected");
    assert!(e.reason.contains("92%"), "{}", e.reason);
    // Still above a minute later: drained.
    let drained_at = loop {
        let d = at(&mut c, &mut t, 0.95, 0.5);
        if d.instances[A].drain == Some(true) {
            break t;
        }
        assert!(t - halved_at < 70_000, "never drained");
    };
    assert_eq!(drained_at - halved_at, 60_000);
    let d = at(&mut c, &mut t, 0.95, 0.5);
    assert_eq!(
        actions(&d),
        BTreeSet::from([(A.to_string(), "drain".to_string())])
    );
    // (The cluster-wide `kv_usage > 0.90` condition raised T1 meanwhile: its own business.)
    assert_eq!(d.tier, Tier::T1);
    let cmd = d.to_command("c", 1, 1, t, 30_000);
    assert!(cmd.instance_entry(A).unwrap().draining());
    assert!(
        cmd.instance_entry(B).is_none(),
        "nothing addresses the peer"
    );
    // Between the exit level and 92 %: nothing restored.
    for _ in 0..300 {
        let d = at(&mut c, &mut t, 0.85, 0.5);
        assert_eq!(
            d.instances[A].drain,
            Some(true),
            "restored above the exit level"
        );
    }
    // Below 0.80: the drain ends after the 2 min hold-down, then the halving after another.
    let below = t;
    let undrained = loop {
        let d = at(&mut c, &mut t, 0.6, 0.5);
        if d.instances.get(A).and_then(|e| e.drain).is_none() {
            assert_eq!(d.instances[A].max_num_seqs, Some(128), "still halved");
            break t;
        }
    };
    assert_eq!(undrained - below, 121_000);
    let restored = loop {
        let d = at(&mut c, &mut t, 0.6, 0.5);
        if d.instances.is_empty() {
            assert!(d.instance_actions.is_empty());
            break t;
        }
    };
    assert_eq!(restored - undrained, 120_000);
}

#[test]
fn a_dip_resets_the_timers_and_a_missing_snapshot_neither_escalates_nor_restores() {
    let mut c = Controller::new(Policy::seed_default());
    // 50 s above, one sample below 92 %, 50 s above: never a full minute, never halved.
    let mut t = 0;
    for i in 0..101u64 {
        t = i * 1000;
        let v = if i == 50 { 0.9 } else { 0.95 };
        let d = c.step(&two(t, kv(v), kv(0.2)));
        assert!(
            d.instances.is_empty(),
            "halved at {t} without a continuous minute"
        );
    }
    // Now a full minute: halved.
    let mut halved = false;
    for _ in 0..15 {
        t += 1000;
        halved |= !c.step(&two(t, kv(0.95), kv(0.2))).instances.is_empty();
    }
    assert!(halved);
    // A's agent goes silent for 5 minutes (its snapshot is stale): the halving holds.
    let silent = Inputs {
        now_ms: t,
        snapshots: two(t, kv(0.95), kv(0.2)).snapshots[1..].to_vec(),
        ..Inputs::default()
    };
    for _ in 0..300 {
        t += 1000;
        let mut i = silent.clone();
        i.now_ms = t;
        i.snapshots[0].ts_ms = t;
        let d = c.step(&i);
        assert_eq!(d.instances[A].max_num_seqs, Some(128));
        assert_eq!(d.instances[A].drain, None, "no escalation without a signal");
    }
}

#[test]
fn operator_fields_win_over_the_automatic_ones_until_they_end() {
    let yaml = include_str!("../../examples/policy.yaml");
    let mut c = Controller::new(Policy::from_yaml(yaml).unwrap());
    let mut t = 0;
    for _ in 0..62 {
        t += 1000;
        c.step(&two(t, kv(0.95), kv(0.2)));
    }
    // The operator pins B drained and A at 32.
    let mut i = two(t + 1000, kv(0.95), kv(0.2));
    i.instance_overrides.insert(
        B.into(),
        InstanceOverride {
            max_num_seqs: None,
            drain: Some(true),
            until_ms: t + 60_000,
            reason: "maintenance".into(),
            set_at_ms: t,
        },
    );
    i.instance_overrides.insert(
        A.into(),
        InstanceOverride {
            max_num_seqs: Some(32),
            drain: None,
            until_ms: t + 60_000,
            reason: "by hand".into(),
            set_at_ms: t,
        },
    );
    let d = c.step(&i);
    assert_eq!(
        d.instances[A].max_num_seqs,
        Some(32),
        "operator's value wins"
    );
    assert_eq!(d.instances[B].drain, Some(true));
    assert_eq!(d.instances[B].max_num_seqs, None);
    assert!(d.instances[B].reason.contains("maintenance"));
    let cmd = d.to_command("c", 1, 1, t, 30_000);
    assert!(cmd.instance_entry(B).unwrap().draining());
    // Expired: back to the automatic halving only.
    let mut later = i.clone();
    later.now_ms = t + 61_000;
    for s in &mut later.snapshots {
        s.ts_ms = later.now_ms;
    }
    let d = c.step(&later);
    assert!(!d.instances.contains_key(B));
    assert_eq!(d.instances[A].max_num_seqs, Some(128));
}

/// A load script: p99 TTFT 0.3 s until `onset`, then the agent's p99 climbs as an overload's
/// queue builds (doubling each second up to 8 s); queue wait follows.
fn overload(onset: u64, t: u64) -> Eng {
    let (ttft, queue) = if t < onset {
        (0.3, 0.01)
    } else {
        let k = ((t - onset) / 1000) as i32;
        (
            (0.3 * 2f64.powi(k + 1)).min(8.0),
            (0.05 * 2f64.powi(k + 1)).min(6.0),
        )
    };
    Eng {
        kv: 0.5,
        ttft,
        queue,
        ..Eng::default()
    }
}

#[test]
fn default_policy_raises_a_tier_within_5s_of_an_overload_onset() {
    for onset in [30_000u64, 95_500, 200_250] {
        let mut c = Controller::new(Policy::seed_default());
        let mut raised = None;
        // The agent snapshots once a second; the controller decides once a second.
        let mut t = 0;
        while t < onset + 10_000 {
            t += 1000;
            // The snapshot taken at the last whole second (the agent's scrape).
            let snap_t = t - 1000;
            let mut i = two(t, overload(onset, snap_t), overload(u64::MAX, snap_t));
            for s in &mut i.snapshots {
                s.ts_ms = snap_t;
            }
            let d = c.step(&i);
            if t < onset {
                assert_eq!(d.tier, Tier::T0, "raised before the onset at {t}");
            }
            if d.tier > Tier::T0 && raised.is_none() {
                raised = Some((t, d));
            }
        }
        let (at, d) = raised.expect("a tier was raised");
        assert!(
            at - onset <= 5_000,
            "raised {} ms after the onset at {onset}",
            at - onset
        );
        assert_eq!(d.transition, Transition::Enter);
        let triggers: Vec<&str> = d.reasons.iter().map(|r| r.trigger.as_str()).collect();
        assert!(
            triggers.contains(&"p99_jump") || triggers.contains(&"ttft_p99"),
            "{triggers:?}"
        );
    }
}

/// After T3, for the recovery-storm watch, a threshold condition needs
/// `min_for_secs_after_t3` to latch: one evaluation of a recovery burst raises nothing, a queue
/// that stays does; without the rule the same burst raises T1 again.
#[test]
fn after_t3_a_one_scrape_burst_does_not_raise_a_tier_again() {
    let policy = |rule: &str| {
        policy_with(
            &format!(
                "recovery_storm: {{ periods_secs: [8, 16], window_secs: 64, watch_after_t3_secs: 60{rule} }}"
            ),
            &["{ queue_depth: { above: 4, exit_below: 1, for_secs: 0 } }"],
            &["{ alertmanager: { alertname: Overload } }"],
        )
    };
    // 10 s of T3 (the alert), 30 s to come down, then one evaluation with 6 waiting, 5 calm
    // ones, then 6 waiting for 3 s in a row. Returns the tier after each of the last 9 steps.
    let run = |p: Policy| {
        let mut c = Controller::new(p);
        let mut t = 0;
        let mut step = |waiting: u64, firing: bool| {
            t += 1000;
            let mut i = two(
                t,
                Eng {
                    waiting,
                    ..Eng::default()
                },
                Eng::default(),
            );
            if firing {
                i.alertmanager_firing.insert("Overload".into());
            }
            c.step(&i).tier
        };
        for _ in 0..10 {
            step(0, true);
        }
        for _ in 0..30 {
            step(0, false);
        }
        assert_eq!(step(0, false), Tier::T0, "came down from T3");
        [6, 0, 0, 0, 0, 0, 6, 6, 6].map(|w| step(w, false))
    };
    let with = run(policy(", min_for_secs_after_t3: 2"));
    assert_eq!(
        &with[..6],
        &[Tier::T0; 6],
        "the burst raised nothing: {with:?}"
    );
    assert_eq!(
        with[6..],
        [Tier::T0, Tier::T0, Tier::T1],
        "a lasting queue: {with:?}"
    );
    let without = run(policy(""));
    assert_eq!(
        without[0],
        Tier::T1,
        "without the rule the burst raises T1: {without:?}"
    );
}

/// A p99 jump's value is a ratio (now over the lowest in the window), and its reason says so:
/// "now 30.5" once read as a TTFT p99 of 30 s.
#[test]
fn a_p99_jump_reports_its_ratio_as_a_ratio() {
    let policy = policy_with(
        "",
        &["{ p99_jump: { signal: ttft_p99, factor: 2.0, window_secs: 10, min_secs: 1.0 } }"],
        &[],
    );
    let mut c = Controller::new(policy);
    let mut t = 0;
    let e = |ttft| Eng {
        ttft,
        ..Eng::default()
    };
    for _ in 0..5 {
        t += 1000;
        assert_eq!(c.step(&two(t, e(0.1), e(0.1))).tier, Tier::T0);
    }
    t += 1000;
    let d = c.step(&two(t, e(3.05), e(0.1)));
    assert_eq!(d.tier, Tier::T1);
    let r = d
        .reasons
        .iter()
        .find(|r| r.trigger == "p99_jump")
        .expect("p99_jump latched");
    assert!((r.value.unwrap() - 30.5).abs() < 1e-9, "{r:?}");
    assert!(r.condition.contains("ratio"), "{}", r.condition);
    assert_eq!(d.reason.trigger, "p99_jump");
    assert!(
        d.reason.detail.contains("(now x30.5)"),
        "{}",
        d.reason.detail
    );
}

/// Completions at `rps` per engine each second, T3 through an Alertmanager alert.
fn ramp_policy() -> Policy {
    Policy::from_yaml(
        r#"
features: []
tiers:
  t1: { hold_down_secs: 5 }
  t2:
    hold_down_secs: 5
    params: { model_route: fallback, max_tokens_cap: 128, max_num_seqs: 8 }
  t3:
    hold_down_secs: 5
    enter:
      - alertmanager: { alertname: Overload }
    params: { admit_min_criticality: critical, retry_after_base_secs: 8, jitter_ratio: 0.5, recovery_eta_max_secs: 60 }
admission_ramp: { start_ratio: 0.7, step_ratio: 0.1, step_interval_secs: 10 }
recovery_storm: { periods_secs: [8, 16], window_secs: 64, min_autocorrelation: 0.5, min_rate_rps: 1.0 }
"#,
    )
    .unwrap()
}

struct Load {
    answered: [u64; 2],
    completed: [u64; 2],
}

impl Load {
    fn inputs(&mut self, now: u64, completed_rps: u64, arrivals_rps: u64, firing: bool) -> Inputs {
        for k in 0..2 {
            self.completed[k] += completed_rps;
            self.answered[k] += arrivals_rps;
        }
        let e = |k: usize| Eng {
            kv: 0.5,
            answered: self.answered[k],
            completed: self.completed[k],
            ..Eng::default()
        };
        let mut i = two(now, e(0), e(1));
        if firing {
            i.alertmanager_firing.insert("Overload".into());
        }
        i
    }
}

#[test]
fn admission_ramp_holds_70_percent_of_measured_capacity_after_t3_and_opens_in_steps() {
    let mut c = Controller::new(ramp_policy());
    let mut load = Load {
        answered: [0; 2],
        completed: [0; 2],
    };
    let mut t = 0;
    // 60 s at 50 completions/s per engine (capacity 100/s), then T3 for 30 s at 20/s.
    for i in 0..90u64 {
        t += 1000;
        let rps = if i < 60 { 50 } else { 20 };
        let d = c.step(&load.inputs(t, rps, rps, i >= 60));
        assert!(!d.instances.contains_key("*"), "no ramp before T3 ends");
    }
    assert_eq!(c.tier(), Tier::T3);
    assert!(
        (c.capacity_rps() - 100.0).abs() < 1e-9,
        "{}",
        c.capacity_rps()
    );
    // The alert resolves; T3 is left after its 5 s hold-down.
    let mut shares = Vec::new();
    let mut left_at = None;
    for _ in 0..120 {
        t += 1000;
        let d = c.step(&load.inputs(t, 20, 20, false));
        if d.previous == Tier::T3 && d.tier == Tier::T2 {
            left_at = Some(t);
        }
        let rps = d.instances.get("*").and_then(|e| e.admit_rps);
        if let Some(r) = rps {
            let a = d
                .instance_actions
                .iter()
                .find(|a| a.action == "ramp")
                .expect("ramp reason");
            assert!(a.detail.contains("of 100.0 req/s"), "{}", a.detail);
            if shares.last().map(|(_, v)| *v) != Some(r) {
                shares.push((t - left_at.unwrap(), r));
            }
        }
    }
    // 70 % of 100 req/s over 2 instances = 35 each, +10 % (5 each) every 10 s, open at 100 %.
    assert_eq!(
        shares,
        vec![(0, 35.0), (10_000, 40.0), (20_000, 45.0)],
        "70 %, 80 %, 90 % then open"
    );
    let d = c.step(&load.inputs(t + 1000, 20, 20, false));
    assert!(d.instances.is_empty(), "fully open: {:?}", d.instances);
    assert_eq!(d.tier, Tier::T0);
}

#[test]
fn demand_ratio_holds_t3_while_the_offered_load_exceeds_the_measured_capacity() {
    let policy = Policy::from_yaml(
        r#"
features: []
tiers:
  t1: { hold_down_secs: 5 }
  t2:
    hold_down_secs: 5
    params: { model_route: fallback, max_tokens_cap: 128, max_num_seqs: 8 }
  t3:
    hold_down_secs: 5
    enter:
      - demand_ratio: { above: 1.4, exit_below: 1.1, for_secs: 2 }
    params: { admit_min_criticality: critical, retry_after_base_secs: 8, jitter_ratio: 0.5, recovery_eta_max_secs: 60 }
"#,
    )
    .unwrap();
    let mut c = Controller::new(policy);
    let mut load = Load {
        answered: [0; 2],
        completed: [0; 2],
    };
    let mut t = 0;
    // 30 s served as offered (50/s per engine): demand 1, nothing happens.
    for _ in 0..30 {
        t += 1000;
        let d = c.step(&load.inputs(t, 50, 50, false));
        assert_eq!(d.tier, Tier::T0);
    }
    // Offered 150/s, completed 50/s (shedding keeps the queue empty): T3 after 2 s above 1.4,
    // held for as long as it lasts, with demand_ratio as the reason.
    let mut entered = None;
    for i in 0..60u64 {
        t += 1000;
        let d = c.step(&load.inputs(t, 50, 150, false));
        if d.tier == Tier::T3 && entered.is_none() {
            entered = Some(i);
            assert!(
                d.reasons.iter().any(|r| r.trigger == "demand_ratio"),
                "{:?}",
                d.reasons
            );
        }
        if entered.is_some() {
            assert_eq!(d.tier, Tier::T3, "held at {i} s");
        }
    }
    assert!(entered.is_some_and(|i| i <= 4), "{entered:?}");
    // Back to the capacity: the ratio drops below 1.1, T3 is left after its hold-down.
    let mut left = None;
    for i in 0..20u64 {
        t += 1000;
        let d = c.step(&load.inputs(t, 50, 50, false));
        if d.tier < Tier::T3 && left.is_none() {
            left = Some(i);
        }
    }
    assert!(left.is_some_and(|i| (5..=9).contains(&i)), "{left:?}");
}

#[test]
fn expected_wait_raises_at_once_on_work_waiting_now_against_the_measured_service_rate() {
    let policy = Policy::from_yaml(
        r#"
features: []
tiers:
  t1:
    hold_down_secs: 5
    enter:
      - expected_wait: { above_secs: 1.5, exit_below_secs: 0.5 }
  t2:
    hold_down_secs: 5
    params: { model_route: fallback, max_tokens_cap: 128, max_num_seqs: 8 }
  t3:
    hold_down_secs: 5
    params: { admit_min_criticality: critical, retry_after_base_secs: 8, jitter_ratio: 0.5, recovery_eta_max_secs: 60 }
"#,
    )
    .unwrap();
    let mut c = Controller::new(policy);
    let (mut answered, mut completed) = (0u64, 0u64);
    // One evaluation a second later: each engine completes 50/s (capacity 100/s over both) and
    // holds `waiting` + `running` requests.
    let mut step = |c: &mut Controller, t: u64, waiting: u64, running: u64| {
        answered += 50;
        completed += 50;
        let e = Eng {
            answered,
            completed,
            waiting,
            running,
            ..Eng::default()
        };
        c.step(&two(t, e, e))
    };
    let mut t = 0;
    // Before the service rate is measured (the first 10 s of completions) a full engine reads
    // nothing: 300 requests held, no rate to divide by.
    for _ in 0..5 {
        t += 1000;
        let d = step(&mut c, t, 100, 50);
        assert_eq!(d.tier, Tier::T0, "no service rate measured yet");
    }
    // Served as offered: 40 requests held at 100/s = 0.4 s.
    for _ in 0..15 {
        t += 1000;
        let d = step(&mut c, t, 0, 20);
        assert_eq!(d.tier, Tier::T0);
    }
    assert!(
        (c.signal_value(
            Signal::ExpectedWait,
            &two(
                t,
                Eng {
                    running: 20,
                    ..Eng::default()
                },
                Eng {
                    running: 20,
                    ..Eng::default()
                }
            )
        ) - 0.4)
            .abs()
            < 1e-9
    );
    // The queue grows: 2 × (60 waiting + 20 running) = 160 at 100/s = 1.6 s > 1.5 s: T1 in the
    // same evaluation (no `for`), with expected_wait as the reason.
    t += 1000;
    let d = step(&mut c, t, 60, 20);
    assert_eq!((d.tier, d.transition), (Tier::T1, Transition::Enter));
    let r = d
        .reasons
        .iter()
        .find(|r| r.trigger == "expected_wait")
        .expect("expected_wait latched");
    assert!((r.value.unwrap() - 1.6).abs() < 1e-9, "{r:?}");
    // Between the exit (0.5 s) and the enter level it stays latched; below the exit it clears
    // and T1 is left after its 5 s hold-down.
    for _ in 0..10 {
        t += 1000;
        assert_eq!(
            step(&mut c, t, 20, 20).tier,
            Tier::T1,
            "0.8 s: still latched"
        );
    }
    let mut left = None;
    for i in 0..10u64 {
        t += 1000;
        if step(&mut c, t, 0, 20).tier == Tier::T0 && left.is_none() {
            left = Some(i);
        }
    }
    assert_eq!(left, Some(5), "left after the hold-down");
}

/// With first-attempt arrivals exported, `demand_ratio` reads them and leaves the retries out: a
/// retry storm on top of a load the engines serve raises nothing; more first attempts do.
#[test]
fn demand_ratio_counts_first_attempts_only_when_the_engines_export_them() {
    let policy = Policy::from_yaml(
        r#"
features: []
tiers:
  t1: { hold_down_secs: 5 }
  t2:
    hold_down_secs: 5
    params: { model_route: fallback, max_tokens_cap: 128, max_num_seqs: 8 }
  t3:
    hold_down_secs: 5
    enter:
      - demand_ratio: { above: 1.4, exit_below: 1.1, for_secs: 2 }
    params: { admit_min_criticality: critical, retry_after_base_secs: 8, jitter_ratio: 0.5, recovery_eta_max_secs: 60 }
"#,
    )
    .unwrap();
    // Per engine and second: completed 50, answered `answered`, first attempts `first`.
    let run = |with_first: bool| {
        let mut c = Controller::new(policy.clone());
        let (mut ans, mut comp, mut first) = (0u64, 0u64, 0u64);
        let mut t = 0;
        let mut tiers = Vec::new();
        for i in 0..90u64 {
            t += 1000;
            let (a, f) = match i {
                0..30 => (50, 50),
                // A retry storm: three times the answers, the same first attempts.
                30..60 => (150, 50),
                // Three times the first attempts.
                _ => (150, 150),
            };
            ans += a;
            comp += 50;
            first += f;
            let e = Eng {
                answered: ans,
                completed: comp,
                first: with_first.then_some(first),
                ..Eng::default()
            };
            tiers.push(c.step(&two(t, e, e)).tier);
        }
        tiers
    };
    let tiers = run(true);
    assert!(
        tiers[..60].iter().all(|t| *t == Tier::T0),
        "retries are no demand: {tiers:?}"
    );
    let at = tiers.iter().position(|t| *t == Tier::T3);
    assert!(at.is_some_and(|i| (60..=64).contains(&i)), "{at:?}");
    // Without the export, every answer counts: the storm itself raises T3.
    let tiers = run(false);
    let at = tiers.iter().position(|t| *t == Tier::T3);
    assert!(at.is_some_and(|i| (30..=34).contains(&i)), "{at:?}");
}

/// A policy with the given T1 and T3 entry conditions (one YAML flow mapping each) and extra
/// top-level lines, 5 s hold-downs, T2 only as a route.
fn policy_with(top: &str, t1_enter: &[&str], t3_enter: &[&str]) -> Policy {
    let list = |c: &[&str]| format!("[{}]", c.join(", "));
    Policy::from_yaml(&format!(
        r#"
features: []
{top}
tiers:
  t1: {{ hold_down_secs: 5, enter: {} }}
  t2:
    hold_down_secs: 5
    params: {{ model_route: fallback, max_tokens_cap: 128, max_num_seqs: 8 }}
  t3:
    hold_down_secs: 5
    enter: {}
    params: {{ admit_min_criticality: critical, retry_after_base_secs: 8, jitter_ratio: 0.5, recovery_eta_max_secs: 60 }}
"#,
        list(t1_enter),
        list(t3_enter)
    ))
    .unwrap()
}

/// A declared capacity (`capacity_rps`, from a load test) lets `demand_ratio` read before the
/// engines have been saturated once: the measured rate is then only the load seen so far (and
/// nothing at all for its first 10 s), so without it an overload that starts early is seen
/// late.
#[test]
fn a_declared_capacity_lets_demand_ratio_react_before_the_first_saturation() {
    let policy = |declared: &str| {
        policy_with(
            declared,
            &["{ demand_ratio: { above: 1.2, exit_below: 0.9, for_secs: 1 } }"],
            &[],
        )
    };
    // Per engine and second: 5 s at 30 first attempts (0.6x of 100/s over both engines), then
    // 75 (1.5x) while the engines still complete 30.
    let run = |policy: Policy| {
        let mut c = Controller::new(policy);
        let (mut comp, mut first) = (0u64, 0u64);
        let mut t = 0;
        let mut tiers = Vec::new();
        for i in 0..15u64 {
            t += 1000;
            comp += 30;
            first += if i < 5 { 30 } else { 75 };
            let e = Eng {
                answered: comp,
                completed: comp,
                first: Some(first),
                ..Eng::default()
            };
            tiers.push(c.step(&two(t, e, e)).tier);
        }
        tiers
    };
    let declared = run(policy("capacity_rps: 100"));
    assert!(
        declared[..5].iter().all(|t| *t == Tier::T0),
        "0.6x of the declared capacity is no overload: {declared:?}"
    );
    let at = declared.iter().position(|t| *t == Tier::T1);
    assert!(
        at.is_some_and(|i| (5..=9).contains(&i)),
        "T1 within 4 s of the rise: {declared:?}"
    );
    // Without it nothing is read during the measured rate's warm-up.
    let measured = run(policy(""));
    assert!(
        measured[..10].iter().all(|t| *t == Tier::T0),
        "{measured:?}"
    );
}

/// The measured service rate replaces a declared capacity that is lower (the engines were
/// seen to complete more than declared).
#[test]
fn a_measured_rate_above_the_declared_capacity_wins() {
    let policy = policy_with("capacity_rps: 50", &[], &[]);
    assert_eq!(policy.declared_capacity_rps, Some(50.0));
    let mut c = Controller::new(policy);
    let mut t = 0;
    let mut n = 0;
    let mut inputs = Inputs::default();
    let mut ratios = Vec::new();
    // 100/s offered and completed over both engines for 20 s.
    for _ in 0..20 {
        t += 1000;
        n += 50;
        let e = Eng {
            answered: n,
            completed: n,
            first: Some(n),
            ..Eng::default()
        };
        inputs = two(t, e, e);
        c.step(&inputs);
        ratios.push(c.signal_value(Signal::DemandRatio, &inputs));
    }
    assert!(
        (ratios[4] - 2.0).abs() < 1e-9,
        "the declared 50/s alone before the warm-up: {ratios:?}"
    );
    let last = c.signal_value(Signal::DemandRatio, &inputs);
    assert!((last - 1.0).abs() < 1e-9, "measured 100/s: {ratios:?}");
}

/// Arrivals per second: `base` plus retry bursts every `period` seconds.
fn waves(n: usize, period: usize, base: f64, burst: f64) -> Vec<f64> {
    (0..n)
        .map(|i| {
            if i.is_multiple_of(period) {
                base + burst
            } else {
                base
            }
        })
        .collect()
}

#[test]
fn retry_waves_are_found_at_the_backoff_periods_and_nowhere_else() {
    let w8 = detect_retry_waves(&waves(64, 8, 5.0, 60.0), &[8, 16], 0.5, 1.0).unwrap();
    assert_eq!(w8.period_secs, 8);
    assert!(w8.autocorrelation > 0.9, "{}", w8.autocorrelation);
    let w16 = detect_retry_waves(&waves(64, 16, 5.0, 60.0), &[8, 16], 0.5, 1.0).unwrap();
    assert_eq!(w16.period_secs, 16, "16 s waves are not 8 s waves");
    // Spread bursts (2 s wide) still count.
    let wide: Vec<f64> = (0..64)
        .map(|i| if i % 8 < 2 { 40.0 } else { 4.0 })
        .collect();
    assert_eq!(
        detect_retry_waves(&wide, &[8, 16], 0.5, 1.0).map(|w| w.period_secs),
        Some(8)
    );
    // Steady load, a ramp, random noise, a 5 s period: none.
    assert!(detect_retry_waves(&[20.0; 64], &[8, 16], 0.5, 1.0).is_none());
    let ramp: Vec<f64> = (0..64).map(|i| 10.0 + f64::from(i)).collect();
    assert!(
        detect_retry_waves(&ramp, &[8, 16], 0.5, 1.0).is_none(),
        "a trend is no wave"
    );
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let noise: Vec<f64> = (0..64)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            20.0 + (x % 1000) as f64 / 50.0
        })
        .collect();
    assert!(detect_retry_waves(&noise, &[8, 16], 0.5, 1.0).is_none());
    assert!(detect_retry_waves(&waves(64, 5, 5.0, 60.0), &[8, 16], 0.5, 1.0).is_none());
    // Too little traffic to call it a storm.
    assert!(detect_retry_waves(&waves(64, 8, 0.0, 0.5), &[8, 16], 0.5, 1.0).is_none());
    assert_eq!(autocorrelation(&[1.0, 2.0], 5), 0.0);
}

#[test]
fn a_retry_wave_after_t3_is_a_recovery_storm_and_holds_the_ramp() {
    let mut c = Controller::new(ramp_policy());
    let mut load = Load {
        answered: [0; 2],
        completed: [0; 2],
    };
    let mut t = 0;
    // Clients retry every 8 s once they are shed: bursts of 200 arrivals/s on each instance.
    let wave = |i: u64| if i.is_multiple_of(8) { 200 } else { 10 };
    for _ in 0..30u64 {
        t += 1000;
        let d = c.step(&load.inputs(t, 50, 50, false));
        assert!(d.instance_actions.is_empty(), "steady load is no storm");
    }
    for i in 30..100u64 {
        t += 1000;
        c.step(&load.inputs(t, 20, wave(i), true));
    }
    assert_eq!(c.tier(), Tier::T3);
    let mut storm_seen = None;
    let mut rates = BTreeSet::new();
    for i in 100..220u64 {
        t += 1000;
        let d = c.step(&load.inputs(t, 20, wave(i), false));
        if let Some(a) = d
            .instance_actions
            .iter()
            .find(|a| a.action == "recovery_storm")
        {
            assert_eq!(a.trigger, "recovery_storm");
            assert_eq!(a.instance, "*");
            assert!(a.detail.contains("every 8s"), "{}", a.detail);
            storm_seen.get_or_insert(t);
        }
        if let Some(r) = d.instances.get("*").and_then(|e| e.admit_rps) {
            rates.insert((r * 100.0).round() as u64);
        }
    }
    assert!(storm_seen.is_some(), "the waves were detected");
    // The ramp started at 70 % and the storm held it there (no 80 % step).
    assert_eq!(rates, BTreeSet::from([3500]), "{rates:?}");
    // The waves stop: the ramp moves on.
    for _ in 0..80 {
        t += 1000;
        let d = c.step(&load.inputs(t, 20, 20, false));
        if let Some(r) = d.instances.get("*").and_then(|e| e.admit_rps) {
            rates.insert((r * 100.0).round() as u64);
        }
    }
    assert!(rates.contains(&4000), "{rates:?}");
}

#[test]
fn new_policy_sections_are_validated_with_the_field() {
    let base = r#"
features: []
tiers:
  t1: { hold_down_secs: 5, enter: [ENTER] }
  t2:
    hold_down_secs: 5
    params: { model_route: fallback, max_tokens_cap: 128, max_num_seqs: 8 }
  t3:
    hold_down_secs: 5
    params: { admit_min_criticality: critical, retry_after_base_secs: 8, jitter_ratio: 0.5, recovery_eta_max_secs: 60 }
EXTRA
"#;
    let bad = |enter: &str, extra: &str| match Policy::from_yaml(
        &base.replace("ENTER", enter).replace("EXTRA", extra),
    ) {
        Err(PolicyError::Invalid { field, .. }) => field,
        other => panic!("{enter} / {extra}: {other:?}"),
    };
    let ok_enter = "{ alertmanager: { alertname: X } }";
    assert_eq!(
        bad("{ ttft_p99: { above_secs: 1, exit_below_secs: 2 } }", ""),
        "tiers.t1.enter[0].ttft_p99"
    );
    assert_eq!(
        bad("{ demand_ratio: { above: 1.2, exit_below: 1.5 } }", ""),
        "tiers.t1.enter[0].demand_ratio"
    );
    assert_eq!(
        bad("{ demand_ratio: { above: 0, exit_below: 0 } }", ""),
        "tiers.t1.enter[0].demand_ratio"
    );
    assert_eq!(bad(ok_enter, "capacity_rps: 0"), "capacity_rps");
    assert_eq!(
        bad(
            ok_enter,
            "recovery_storm: { periods_secs: [8], min_for_secs_after_t3: 601 }"
        ),
        "recovery_storm.min_for_secs_after_t3"
    );
    assert_eq!(bad(ok_enter, "capacity_rps: .nan"), "capacity_rps");
    assert_eq!(
        bad(
            "{ p99_jump: { signal: gpu_util, window_secs: 5, min_secs: 1 } }",
            ""
        ),
        "tiers.t1.enter[0].p99_jump.signal"
    );
    assert_eq!(
        bad(
            "{ p99_jump: { signal: ttft_p99, factor: 1.0, window_secs: 5, min_secs: 1 } }",
            ""
        ),
        "tiers.t1.enter[0].p99_jump.factor"
    );
    assert_eq!(
        bad(ok_enter, "admission_ramp: { start_ratio: 1.2 }"),
        "admission_ramp.start_ratio"
    );
    assert_eq!(
        bad(
            ok_enter,
            "recovery_storm: { periods_secs: [40], window_secs: 64 }"
        ),
        "recovery_storm.periods_secs"
    );
    assert_eq!(
        bad(
            ok_enter,
            "instances: { kv_usage: { watch_above_ratio: 0.85, watch_for_secs: 1, halve_above_ratio: 0.80, halve_for_secs: 1, drain_after_secs: 1, exit_below_ratio: 0.7, hold_down_secs: 1 } }"
        ),
        "instances.kv_usage.halve_above_ratio"
    );
    assert_eq!(
        bad(
            ok_enter,
            "instances: { kv_usage: { watch_above_ratio: 0.85, watch_for_secs: 1, halve_above_ratio: 0.92, halve_for_secs: 1, drain_after_secs: 1, exit_below_ratio: 0.9, hold_down_secs: 1 } }"
        ),
        "instances.kv_usage.exit_below_ratio"
    );
    // Absent sections: no per-instance conditions, no ramp, no storm detection.
    let p = Policy::from_yaml(&base.replace("ENTER", ok_enter).replace("EXTRA", "")).unwrap();
    assert!(p.instances.is_none() && p.ramp.is_none() && p.storm.is_none());
    let seed = Policy::seed_default();
    let k = &seed.instances.as_ref().unwrap().kv;
    assert_eq!(
        (
            k.watch_above,
            k.watch_for_ms,
            k.halve_above,
            k.halve_for_ms,
            k.drain_after_ms
        ),
        (0.85, 120_000, 0.92, 60_000, 60_000),
        "the seed figures"
    );
    assert_eq!(seed.ramp.as_ref().unwrap().start_ratio, 0.7);
    assert_eq!(seed.storm.as_ref().unwrap().periods_secs, vec![8, 16]);
}

/// One engine's TTFT p99 per second: any series in [0, 12] s.
fn latency() -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(0.0f64..12.0, 1..300)
}

proptest! {
    /// For any latency signal under the default policy (fast triggers included): a step down
    /// is exactly one tier and two are at least that tier's hold-down apart; a raise happens
    /// only when a level condition's value or a doubling is there.
    #[test]
    fn fast_triggers_move_tiers_by_the_rules(values in latency()) {
        let p = Policy::seed_default();
        let mut c = Controller::new(p.clone());
        let mut prev = Tier::T0;
        let mut last_down: Option<u64> = None;
        let mut history: Vec<f64> = Vec::new();
        for (i, v) in values.iter().enumerate() {
            let now = i as u64 * 1000;
            let e = Eng { kv: 0.5, ttft: *v, ..Eng::default() };
            let d = c.step(&two(now, e, Eng { kv: 0.5, ttft: 0.2, ..Eng::default() }));
            match d.transition {
                Transition::StepDown => {
                    prop_assert_eq!(d.tier, prev.step_down());
                    let hold = p.tier(prev).unwrap().hold_down_ms;
                    if let Some(l) = last_down { prop_assert!(now - l >= hold.min(120_000)); }
                    last_down = Some(now);
                }
                Transition::Enter => {
                    let low = history.iter().rev().take(10).copied().filter(|x| *x > 0.0).fold(f64::INFINITY, f64::min);
                    prop_assert!(*v > 2.0 || (*v >= 0.5 && *v >= 2.0 * low), "entered at {v} (low {low})");
                }
                Transition::Hold => prop_assert_eq!(d.tier, prev),
                Transition::Override => prop_assert!(false),
            }
            prev = d.tier;
            history.push(*v);
        }
    }

    /// TTFT oscillating around a level threshold inside its hysteresis band (and by less than
    /// a doubling) after an overload: the tier only comes down, never flaps back up.
    #[test]
    fn latency_oscillation_does_not_flap(
        center in prop::sample::select(vec![1.5f64, 2.0, 3.5, 5.0]),
        amp in 0.0f64..0.45,
        period in 1u64..6,
        n in 60usize..400,
    ) {
        let mut c = Controller::new(Policy::seed_default());
        for t in 0..6 {
            c.step(&two(t * 1000, Eng { kv: 0.5, ttft: 9.0, ..Eng::default() }, kv(0.5)));
        }
        prop_assert_eq!(c.tier(), Tier::T2);
        let mut prev = Tier::T2;
        let mut changes = 0;
        for i in 0..n {
            let up = (i as u64 / period).is_multiple_of(2);
            let v = if up { center * (1.0 + amp) } else { center * (1.0 - amp / 2.0) };
            let d = c.step(&two(6000 + i as u64 * 1000, Eng { kv: 0.5, ttft: v, ..Eng::default() }, kv(0.5)));
            prop_assert!(d.tier <= prev, "back up to {} at {i} (center {center}, amp {amp})", d.tier);
            if d.tier != prev { changes += 1; }
            prev = d.tier;
        }
        prop_assert!(changes <= 2);
    }
}
