//! Degradation policy parsing/validation and the pure controller state machine.

use std::collections::BTreeSet;

use brownout::degrade::controller::{
    Controller, Inputs, Override, PatternRate, SloAlert, Transition,
};
use brownout::degrade::policy::{Condition, Policy, PolicyError, Signal};
use brownout_protocol::{
    AgentSnapshot, Criticality, EngineStats, FeatureState, GpuStats, KvStats, Tier,
};
use proptest::prelude::*;

const EXAMPLE: &str = include_str!("../../examples/policy.yaml");

/// A small policy with short windows for table tests.
const SMALL: &str = r#"
evaluate_interval_ms: 1000
command_lease_ms: 30000
features:
  - { name: pdf_analysis, criticality: sheddable, disable_at_tier: 1 }
  - { name: web_search, criticality: default, disable_at_tier: 2 }
  - { name: basic_qa, criticality: critical }
tiers:
  t1:
    hold_down_secs: 10
    enter:
      - gpu_util: { above_ratio: 0.95, exit_below_ratio: 0.90, for_secs: 3 }
      - alertmanager: { alertname: Hot }
  t2:
    hold_down_secs: 10
    enter:
      - gpu_util: { above_ratio: 0.98, exit_below_ratio: 0.94, for_secs: 3 }
      - slo_alert: { slo: chat, severity: page }
    params: { model_route: fallback, max_tokens_cap: 128, max_num_seqs: 8 }
  t3:
    hold_down_secs: 10
    enter:
      - gpu_util: { above_ratio: 0.995, exit_below_ratio: 0.97, for_secs: 3 }
      - new_pattern: { above_per_min: 100, exit_below_per_min: 20 }
    params: { admit_min_criticality: critical, retry_after_base_secs: 20, jitter_ratio: 0.5, recovery_eta_max_secs: 600 }
"#;

fn small() -> Policy {
    Policy::from_yaml(SMALL).unwrap()
}

fn snap(host: &str, ts_ms: u64, gpu: f64) -> AgentSnapshot {
    AgentSnapshot {
        host: host.into(),
        ts_ms,
        probe_up: true,
        gpus: vec![GpuStats {
            index: 0,
            memory_total_bytes: 100,
            memory_used_bytes: 10,
            gpu_util_ratio: gpu,
            ..Default::default()
        }],
        engines: vec![EngineStats {
            id: "e0".into(),
            up: true,
            kv: KvStats::default(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn gpu_inputs(now_ms: u64, gpu: f64) -> Inputs {
    Inputs {
        now_ms,
        snapshots: vec![snap("h1", now_ms, gpu)],
        ..Inputs::default()
    }
}

#[test]
fn example_policy_parses_and_follows_the_seeds() {
    let p = Policy::from_yaml(EXAMPLE).unwrap();
    assert_eq!(p.evaluate_interval.as_millis(), 500);
    let gpu_enter: Vec<(f64, u64)> = p
        .tiers
        .iter()
        .map(|t| {
            t.enter
                .iter()
                .find_map(|c| match c {
                    Condition::Threshold {
                        signal: Signal::GpuUtil,
                        above,
                        for_ms,
                        ..
                    } => Some((*above, *for_ms)),
                    _ => None,
                })
                .unwrap()
        })
        .collect();
    assert_eq!(
        gpu_enter,
        vec![(0.95, 30_000), (0.98, 30_000), (0.995, 30_000)],
        "docs/REQUIREMENTS.md R2.1"
    );
    assert!(p.tiers[0].enter.iter().any(|c| matches!(c, Condition::Threshold { signal: Signal::Vram, above, .. } if *above == 0.75)), "docs/REQUIREMENTS.md R2.2");
    let f = |n: &str| p.features.iter().find(|f| f.name == n).unwrap().clone();
    for n in ["pdf_analysis", "image_generation", "multilingual_email"] {
        assert_eq!(f(n).disable_at, Some(Tier::T1), "{n}");
        assert_eq!(f(n).criticality, Criticality::Sheddable);
    }
    for n in ["basic_qa", "login"] {
        assert_eq!(f(n).disable_at, None, "{n} is never disabled");
        assert_eq!(f(n).criticality, Criticality::Critical);
    }
    assert_eq!(p.t2.max_tokens_cap, 256);
    assert_eq!(p.t3.admit_min_criticality, Criticality::Critical);
    assert_eq!(Policy::seed_default(), p);
}

#[test]
fn bad_policies_are_refused_with_the_field_and_reason() {
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "unknown top-level field",
            SMALL.replace(
                "evaluate_interval_ms: 1000",
                "evaluate_interval_ms: 1000\nbogus: 1",
            ),
            "unknown field `bogus`",
        ),
        (
            "unknown condition",
            SMALL.replace(
                "- alertmanager: { alertname: Hot }",
                "- cpu_util: { above_ratio: 0.5 }",
            ),
            "unknown field `cpu_util`",
        ),
        (
            "unknown field in condition",
            SMALL.replace("{ alertname: Hot }", "{ alertname: Hot, severity: x }"),
            "unknown field `severity`",
        ),
        (
            "exit above enter",
            SMALL.replace(
                "above_ratio: 0.95, exit_below_ratio: 0.90",
                "above_ratio: 0.95, exit_below_ratio: 0.96",
            ),
            "tiers.t1.enter[0].gpu_util.exit_below_ratio",
        ),
        (
            "ratio above one",
            SMALL.replace("above_ratio: 0.95,", "above_ratio: 1.5,"),
            "tiers.t1.enter[0].gpu_util.above_ratio",
        ),
        (
            "critical feature disabled",
            SMALL.replace(
                "{ name: basic_qa, criticality: critical }",
                "{ name: basic_qa, criticality: critical, disable_at_tier: 3 }",
            ),
            "is critical (P0) and is never disabled",
        ),
        (
            "duplicate feature",
            SMALL.replace("{ name: web_search,", "{ name: pdf_analysis,"),
            "duplicate feature",
        ),
        (
            "bad criticality",
            SMALL.replace("criticality: default", "criticality: urgent"),
            "features[1].criticality",
        ),
        (
            "tier 0 disable",
            SMALL.replace("disable_at_tier: 2", "disable_at_tier: 0"),
            "features[1].disable_at_tier",
        ),
        (
            "tier out of range",
            SMALL.replace("disable_at_tier: 2", "disable_at_tier: 4"),
            "tier must be 0, 1, 2 or 3",
        ),
        (
            "missing t2 params",
            SMALL.replace(
                "    params: { model_route: fallback, max_tokens_cap: 128, max_num_seqs: 8 }\n",
                "",
            ),
            "tiers.t2.params",
        ),
        (
            "bad route",
            SMALL.replace("model_route: fallback", "model_route: tiny"),
            "tiers.t2.params.model_route",
        ),
        (
            "zero cap",
            SMALL.replace("max_tokens_cap: 128", "max_tokens_cap: 0"),
            "max_tokens_cap",
        ),
        (
            "shed sheddable",
            SMALL.replace(
                "admit_min_criticality: critical",
                "admit_min_criticality: sheddable",
            ),
            "admit_min_criticality",
        ),
        (
            "jitter above one",
            SMALL.replace("jitter_ratio: 0.5", "jitter_ratio: 2"),
            "jitter_ratio",
        ),
        (
            "lease too short",
            SMALL.replace("command_lease_ms: 30000", "command_lease_ms: 2000"),
            "command_lease_ms",
        ),
        (
            "queue hysteresis",
            SMALL.replace(
                "- alertmanager: { alertname: Hot }",
                "- queue_depth: { above: 5, exit_below: 5 }",
            ),
            "queue_depth.exit_below",
        ),
        (
            "pattern hysteresis",
            SMALL.replace("exit_below_per_min: 20", "exit_below_per_min: 200"),
            "new_pattern",
        ),
        (
            "bad feature name",
            SMALL.replace("{ name: pdf_analysis,", "{ name: \"pdf <b>\","),
            "features[0].name",
        ),
        (
            "t1 params",
            SMALL.replace(
                "      - alertmanager: { alertname: Hot }\n",
                "      - alertmanager: { alertname: Hot }\n    params: { x: 1 }\n",
            ),
            "tiers.t1.params",
        ),
    ];
    for (what, yaml, want) in cases {
        let err = Policy::from_yaml(&yaml).expect_err(what).to_string();
        assert!(
            err.contains(want),
            "{what}: {err:?} should mention {want:?}"
        );
    }
    assert!(matches!(
        Policy::load(std::path::Path::new("/nonexistent/policy.yaml")),
        Err(PolicyError::Io { .. })
    ));
}

#[test]
fn gpu_utilisation_must_be_sustained_to_enter() {
    let mut c = Controller::new(small());
    // 0.96 for 2 s: not yet (for_secs 3).
    for t in 0..3 {
        assert_eq!(c.step(&gpu_inputs(t * 1000, 0.96)).tier, Tier::T0, "t={t}");
    }
    let d = c.step(&gpu_inputs(3000, 0.96));
    assert_eq!(d.tier, Tier::T1);
    assert_eq!(d.transition, Transition::Enter);
    assert_eq!(d.reason.trigger, "gpu_util");
    assert_eq!(d.reasons.len(), 1);
    assert_eq!(d.reasons[0].threshold, Some(0.95));
    assert_eq!(d.features["pdf_analysis"], FeatureState::Disabled);
    assert_eq!(d.features["web_search"], FeatureState::Enabled);
    assert_eq!(d.features["basic_qa"], FeatureState::Enabled);
    assert!(d.model_route.is_empty() && d.shed.is_none());
}

#[test]
fn enters_fast_jumping_several_tiers_and_leaves_one_tier_per_hold_down() {
    let mut c = Controller::new(small());
    let mut tiers = Vec::new();
    for t in 0..=3 {
        tiers.push(c.step(&gpu_inputs(t * 1000, 0.999)).tier);
    }
    assert_eq!(
        tiers,
        vec![Tier::T0, Tier::T0, Tier::T0, Tier::T3],
        "straight from T0 to T3"
    );
    let d = c.step(&gpu_inputs(4000, 0.999));
    let shed = d.shed.clone().unwrap();
    assert_eq!(shed.admit_min_criticality, Criticality::Critical);
    assert_eq!(d.limits.max_tokens_cap, Some(128));
    assert_eq!(d.model_route["default"], "fallback");
    assert_eq!(d.features["web_search"], FeatureState::Disabled);
    // Load drops to 0.5: one tier per 10 s hold-down.
    let mut changes = Vec::new();
    for t in 5..60 {
        let d = c.step(&gpu_inputs(t * 1000, 0.5));
        if d.transition != Transition::Hold {
            changes.push((t, d.tier, d.transition));
        }
    }
    assert_eq!(
        changes,
        vec![
            (15, Tier::T2, Transition::StepDown),
            (25, Tier::T1, Transition::StepDown),
            (35, Tier::T0, Transition::StepDown)
        ]
    );
}

#[test]
fn between_exit_and_enter_thresholds_the_tier_holds() {
    let mut c = Controller::new(small());
    for t in 0..=3 {
        c.step(&gpu_inputs(t * 1000, 0.96));
    }
    assert_eq!(c.tier(), Tier::T1);
    // 0.92 is below enter (0.95) but above exit (0.90): stays latched for a long time.
    for t in 4..100 {
        assert_eq!(c.step(&gpu_inputs(t * 1000, 0.92)).tier, Tier::T1, "t={t}");
    }
    // Below exit: clear, hold-down 10 s, then T0.
    let mut first_t0 = None;
    for t in 100..120 {
        if c.step(&gpu_inputs(t * 1000, 0.85)).tier == Tier::T0 && first_t0.is_none() {
            first_t0 = Some(t);
        }
    }
    assert_eq!(first_t0, Some(110));
}

#[test]
fn a_relapse_during_hold_down_restarts_it() {
    let mut c = Controller::new(small());
    let am = |now: u64, firing: bool| Inputs {
        now_ms: now,
        alertmanager_firing: if firing {
            BTreeSet::from(["Hot".to_string()])
        } else {
            BTreeSet::new()
        },
        ..Inputs::default()
    };
    assert_eq!(c.step(&am(0, true)).tier, Tier::T1, "alerts latch at once");
    assert_eq!(c.step(&am(1000, false)).step_down_at_ms, Some(11_000));
    assert_eq!(c.step(&am(9000, true)).tier, Tier::T1);
    assert_eq!(c.step(&am(10_000, false)).tier, Tier::T1);
    assert_eq!(
        c.step(&am(19_000, false)).tier,
        Tier::T1,
        "hold-down restarted at 10 s"
    );
    assert_eq!(c.step(&am(20_000, false)).tier, Tier::T0);
}

#[test]
fn slo_alert_pair_and_new_patterns_raise_tiers_with_reasons() {
    let mut c = Controller::new(small());
    let slo = SloAlert {
        slo: "chat".into(),
        severity: "page".into(),
        firing: true,
        burn_rate: 16.2,
        threshold: 14.4,
        window: "5m/1h".into(),
    };
    let d = c.step(&Inputs {
        now_ms: 1,
        slo_alerts: vec![slo.clone()],
        ..Inputs::default()
    });
    assert_eq!(d.tier, Tier::T2);
    assert_eq!(d.reason.trigger, "slo_burn");
    assert_eq!(d.reason.slo.as_deref(), Some("chat"));
    assert_eq!(d.reason.window.as_deref(), Some("5m/1h"));
    assert_eq!(d.reason.burn_rate, Some(16.2));
    // A ticket-severity alert on the same SLO is not the page pair.
    let mut c2 = Controller::new(small());
    let ticket = SloAlert {
        severity: "ticket".into(),
        ..slo.clone()
    };
    assert_eq!(
        c2.step(&Inputs {
            now_ms: 1,
            slo_alerts: vec![ticket],
            ..Inputs::default()
        })
        .tier,
        Tier::T0
    );

    let d = c.step(&Inputs {
        now_ms: 2,
        slo_alerts: vec![slo],
        new_patterns: vec![PatternRate {
            pattern_id: "p1".into(),
            per_min: 150.0,
        }],
        ..Inputs::default()
    });
    assert_eq!(d.tier, Tier::T3);
    assert_eq!(d.reason.trigger, "new_pattern");
    let triggers: Vec<&str> = d.reasons.iter().map(|r| r.trigger.as_str()).collect();
    assert_eq!(
        triggers,
        vec!["new_pattern", "slo_burn"],
        "highest tier first"
    );
}

#[test]
fn stale_snapshots_are_ignored() {
    let mut c = Controller::new(small());
    for t in 0..10u64 {
        let now = 100_000 + t * 1000;
        let inputs = Inputs {
            now_ms: now,
            snapshots: vec![snap("old", 1000, 1.0)],
            ..Inputs::default()
        };
        assert_eq!(c.step(&inputs).tier, Tier::T0);
    }
}

#[test]
fn operator_override_pins_then_hands_back_with_hold_down() {
    let mut c = Controller::new(small());
    let o = Override {
        tier: Tier::T2,
        until_ms: 5000,
        reason: "game day".into(),
    };
    let d = c.step(&Inputs {
        now_ms: 0,
        operator_override: Some(o.clone()),
        ..Inputs::default()
    });
    assert_eq!((d.tier, d.transition), (Tier::T2, Transition::Override));
    assert_eq!(d.reason.trigger, "operator");
    assert_eq!(d.reason.detail, "game day");
    // Pinned even though the GPU is screaming.
    let d = c.step(&Inputs {
        operator_override: Some(o.clone()),
        ..gpu_inputs(1000, 1.0)
    });
    assert_eq!(d.tier, Tier::T2);
    // Override over; nothing latched: hold-down from the end of the override.
    assert_eq!(
        c.step(&Inputs {
            now_ms: 6000,
            ..Inputs::default()
        })
        .tier,
        Tier::T2
    );
    assert_eq!(
        c.step(&Inputs {
            now_ms: 15_999,
            ..Inputs::default()
        })
        .tier,
        Tier::T2
    );
    assert_eq!(
        c.step(&Inputs {
            now_ms: 16_000,
            ..Inputs::default()
        })
        .tier,
        Tier::T1
    );
    // An override can also force T0.
    let z = Override {
        tier: Tier::T0,
        until_ms: 50_000,
        reason: "false alarm".into(),
    };
    assert_eq!(
        c.step(&Inputs {
            now_ms: 17_000,
            operator_override: Some(z),
            ..Inputs::default()
        })
        .tier,
        Tier::T0
    );
}

#[test]
fn t3_recovery_estimate_follows_the_trend_and_the_hold_down() {
    // Falling queue: ETA ≈ time to cross the exit threshold + hold-down.
    let yaml = SMALL.replace(
        "- new_pattern: { above_per_min: 100, exit_below_per_min: 20 }",
        "- queue_depth: { above: 500, exit_below: 100, for_secs: 0 }",
    );
    let p = Policy::from_yaml(&yaml).unwrap();
    let q = |now: u64, depth: u64| {
        let mut s = snap("h", now, 0.1);
        s.engines[0].num_requests_waiting = depth;
        Inputs {
            now_ms: now,
            snapshots: vec![s],
            ..Inputs::default()
        }
    };
    let mut falling = Controller::new(p.clone());
    let mut last = None;
    for (i, depth) in [1000u64, 950, 900, 850, 800].into_iter().enumerate() {
        last = Some(falling.step(&q(i as u64 * 1000, depth)));
    }
    let d = last.unwrap();
    assert_eq!(d.tier, Tier::T3);
    // 800 → 100 at 50/s = 14 s, plus the 10 s hold-down, from t = 4 s.
    let eta = d.shed.unwrap().recovery_eta_ms;
    assert!(
        (4000 + 14_000 + 10_000..=4000 + 14_000 + 10_000 + 1000).contains(&eta),
        "eta {eta}"
    );

    // Rising queue: no recovery in sight → the cap (600 s) plus hold-down.
    let mut rising = Controller::new(p);
    let mut last = None;
    for (i, depth) in [800u64, 850, 900, 950, 1000].into_iter().enumerate() {
        last = Some(rising.step(&q(i as u64 * 1000, depth)));
    }
    let eta = last.unwrap().shed.unwrap().recovery_eta_ms;
    assert_eq!(eta, 4000 + 600_000 + 10_000);
}

#[test]
fn decision_builds_a_command_with_contract_fields() {
    let mut c = Controller::new(small());
    for t in 0..=3 {
        c.step(&gpu_inputs(t * 1000, 0.985));
    }
    let d = c.step(&gpu_inputs(4000, 0.985));
    assert_eq!(d.tier, Tier::T2);
    let cmd = d.to_command("prod", 3, 1042, 10_000, 30_000);
    assert_eq!(
        (cmd.epoch, cmd.version, cmd.issued_at_ms, cmd.expires_at_ms),
        (3, 1042, 10_000, 40_000)
    );
    assert_eq!(cmd.route_for("default"), "fallback");
    assert_eq!(cmd.limits.max_num_seqs, Some(8));
    assert_eq!(cmd.reason.trigger, "gpu_util");
    let v: serde_json::Value = serde_json::from_str(&cmd.to_json()).unwrap();
    for k in [
        "cluster",
        "epoch",
        "version",
        "tier",
        "issued_at_ms",
        "expires_at_ms",
        "reason",
        "features",
        "model_route",
        "limits",
        "shed",
    ] {
        assert!(v.get(k).is_some(), "{k}");
    }
}

/// A signal drawn anywhere in [0, 1] for each second.
fn signal() -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(0.0f64..1.0, 1..300)
}

proptest! {
    /// Model check of the hysteresis contract for any GPU signal:
    /// - leaving steps down exactly one tier, never more;
    /// - two step-downs are at least the hold-down apart;
    /// - a raise only happens when the value is above some enter threshold.
    #[test]
    fn tiers_move_by_the_rules_for_any_signal(values in signal()) {
        let mut c = Controller::new(small());
        let mut last_down: Option<u64> = None;
        let mut prev = Tier::T0;
        for (i, v) in values.iter().enumerate() {
            let now = i as u64 * 1000;
            let d = c.step(&gpu_inputs(now, *v));
            match d.transition {
                Transition::StepDown => {
                    prop_assert_eq!(d.tier, prev.step_down());
                    prop_assert!(prev != Tier::T0);
                    if let Some(l) = last_down { prop_assert!(now - l >= 10_000, "step-downs {l} and {now}"); }
                    last_down = Some(now);
                }
                Transition::Enter => {
                    prop_assert!(d.tier > prev);
                    prop_assert!(*v > 0.95, "entered at {v}");
                }
                Transition::Hold => prop_assert_eq!(d.tier, prev),
                Transition::Override => prop_assert!(false, "no override given"),
            }
            prev = d.tier;
        }
    }

    /// A signal oscillating around a threshold (any amplitude inside the hysteresis bands, any
    /// period shorter than the hold-down) never makes the tier go back up once it starts coming
    /// down: after a saturation spike, tiers only fall, at most three times. No flapping.
    #[test]
    fn oscillation_around_a_threshold_does_not_flap(
        center in prop::sample::select(vec![0.95f64, 0.98, 0.995, 0.90, 0.94, 0.97, 0.5]),
        amp in 0.0f64..0.02,
        period in 1u64..6,
        n in 60usize..400,
    ) {
        let mut c = Controller::new(small());
        for t in 0..4 {
            c.step(&gpu_inputs(t * 1000, 0.999));
        }
        prop_assert_eq!(c.tier(), Tier::T3);
        let mut changes = 0;
        let mut prev = Tier::T3;
        for i in 0..n {
            let phase = (i as u64 / period).is_multiple_of(2);
            let v = if phase { center + amp } else { center - amp };
            let d = c.step(&gpu_inputs(4000 + i as u64 * 1000, v.clamp(0.0, 1.0)));
            prop_assert!(d.tier <= prev, "went back up to {} at step {i} (center {center} amp {amp})", d.tier);
            if d.tier != prev { changes += 1; }
            prev = d.tier;
        }
        prop_assert!(changes <= 3);
    }
}
