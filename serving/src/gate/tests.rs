//! The gate on its own: every check, their order, and the bounds, on a logical clock.

use std::time::{Duration, Instant};

use brownout_protocol::{
    AbortEntry, AbortKind, Command, Criticality, FeatureState, InstanceEntry, Shed, Tier,
};

use super::*;

const NOW_MS: u64 = 1_764_460_800_000;

fn gate(instance: &str, cfg: GateConfig) -> (Gate, ControlHandle) {
    let h = ControlHandle::with_instance("c", instance);
    (Gate::new(h.clone(), cfg), h)
}

/// Applies `f(command)` as the next version.
fn command(h: &ControlHandle, f: impl FnOnce(&mut Command)) {
    let v = h.current().command.version + 1;
    let mut c = Command::normal("c", 1, v, NOW_MS, 60_000);
    f(&mut c);
    assert!(h.apply(c, NOW_MS).unwrap());
}

/// A command whose only instance entry gives `instance` the admission rate `rps`.
fn admit_rps(h: &ControlHandle, instance: &str, rps: f64) {
    command(h, |c| {
        c.instances.insert(
            instance.into(),
            InstanceEntry {
                admit_rps: Some(rps),
                ..InstanceEntry::default()
            },
        );
    });
}

fn meta(c: Criticality) -> RequestMeta {
    RequestMeta {
        criticality: c,
        ..RequestMeta::default()
    }
}

fn agent(user: &str) -> RequestMeta {
    RequestMeta {
        user: Some(user.into()),
        conversation: Some(format!("conv-{user}")),
        ..RequestMeta::default()
    }
}

fn outcome(r: Result<Admitted, Refusal>) -> Result<Admitted, Outcome> {
    r.map_err(|e| e.outcome)
}

#[test]
fn with_no_command_everything_passes() {
    let (g, _) = gate("i", GateConfig::default());
    let t = Instant::now();
    for c in [
        Criticality::Sheddable,
        Criticality::Default,
        Criticality::Critical,
    ] {
        let a = g.admit_at(&meta(c), t, NOW_MS).unwrap();
        assert_eq!(a.route, RouteChoice::Primary);
        assert!(a.permit.is_none());
    }
}

#[test]
fn drain_refuses_non_critical_on_the_addressed_instance_only() {
    let (g1, h1) = gate("gpu-3/engine-0", GateConfig::default());
    let (g2, h2) = gate("gpu-4/engine-0", GateConfig::default());
    let f = |c: &mut Command| {
        c.instances.insert(
            "gpu-3/engine-0".into(),
            InstanceEntry {
                drain: Some(true),
                reason: "xid 79".into(),
                ..InstanceEntry::default()
            },
        );
    };
    command(&h1, f);
    command(&h2, f);
    let t = Instant::now();
    let r = g1
        .admit_at(&meta(Criticality::Default), t, NOW_MS)
        .unwrap_err();
    assert_eq!(r.outcome, Outcome::Drained);
    assert_eq!(
        (r.outcome.status(), r.outcome.code()),
        (503, "instance_draining")
    );
    assert_eq!(r.retry_after_s, Some(2));
    assert!(r.message.contains("xid 79"), "{}", r.message);
    assert!(g1.admit_at(&meta(Criticality::Critical), t, NOW_MS).is_ok());
    assert!(g1.draining().is_some());
    assert!(g2.admit_at(&meta(Criticality::Default), t, NOW_MS).is_ok());
    assert!(g2.draining().is_none());
    assert_eq!(g1.refused(Outcome::Drained), 1);
}

#[test]
fn the_admission_bucket_throttles_non_critical_and_never_critical() {
    let (g, h) = gate("i", GateConfig::default());
    admit_rps(&h, "*", 2.0);
    let t0 = Instant::now();
    assert!(g.admit_at(&meta(Criticality::Default), t0, NOW_MS).is_ok());
    assert!(
        g.admit_at(&meta(Criticality::Sheddable), t0, NOW_MS)
            .is_ok()
    );
    let r = g
        .admit_at(&meta(Criticality::Default), t0, NOW_MS)
        .unwrap_err();
    assert_eq!((r.outcome, r.outcome.status()), (Outcome::Throttled, 429));
    assert_eq!(r.retry_after_s, Some(1));
    for _ in 0..10 {
        assert!(g.admit_at(&meta(Criticality::Critical), t0, NOW_MS).is_ok());
    }
    // Half a second on the logical clock refills one token.
    let t1 = t0 + Duration::from_millis(500);
    assert!(g.admit_at(&meta(Criticality::Default), t1, NOW_MS).is_ok());
    assert!(g.admit_at(&meta(Criticality::Default), t1, NOW_MS).is_err());
    // A lease refresh with the same rate keeps the bucket's state (no fresh burst).
    admit_rps(&h, "*", 2.0);
    assert!(g.admit_at(&meta(Criticality::Default), t1, NOW_MS).is_err());
    // Lifting the entry lifts the limit.
    command(&h, |_| {});
    assert!(g.admit_at(&meta(Criticality::Default), t1, NOW_MS).is_ok());
}

#[test]
fn the_user_cap_counts_agent_requests_per_user_and_frees_slots_on_drop() {
    let (g, h) = gate("i", GateConfig::default());
    let t = Instant::now();
    let held: Vec<Admitted> = (0..3)
        .map(|_| g.admit_at(&agent("alice"), t, NOW_MS).unwrap())
        .collect();
    assert!(held.iter().all(|a| a.permit.is_some()));
    let r = g.admit_at(&agent("alice"), t, NOW_MS).unwrap_err();
    assert_eq!(
        (r.outcome, r.outcome.code(), r.retry_after_s),
        (Outcome::UserCap, "user_concurrency_limit", Some(1))
    );
    assert!(r.message.contains("at most 3"), "{}", r.message);
    // Another user passes; non-agent traffic of alice is not capped; critical is not capped.
    assert!(g.admit_at(&agent("bob"), t, NOW_MS).is_ok());
    let mut plain = agent("alice");
    plain.conversation = None;
    assert!(g.admit_at(&plain, t, NOW_MS).is_ok());
    let mut crit = agent("alice");
    crit.criticality = Criticality::Critical;
    assert!(g.admit_at(&crit, t, NOW_MS).is_ok());
    // A finished request gives its slot back.
    drop(held);
    assert!(g.admit_at(&agent("alice"), t, NOW_MS).is_ok());
    // The control plane can only lower the cap.
    command(&h, |c| c.limits.user_concurrency = Some(1));
    let a = g.admit_at(&agent("carol"), t, NOW_MS).unwrap();
    assert_eq!(
        outcome(g.admit_at(&agent("carol"), t, NOW_MS)).unwrap_err(),
        Outcome::UserCap
    );
    drop(a);
    command(&h, |c| c.limits.user_concurrency = Some(50));
    let kept: Vec<_> = (0..3)
        .map(|_| g.admit_at(&agent("dave"), t, NOW_MS).unwrap())
        .collect();
    assert_eq!(
        outcome(g.admit_at(&agent("dave"), t, NOW_MS)).unwrap_err(),
        Outcome::UserCap,
        "50 from the command does not raise the flag's 3"
    );
    drop(kept);
    let d = g.debug();
    assert_eq!(d["user_concurrency"]["cap"], 3);
    assert_eq!(d["user_concurrency"]["top_offenders"][0]["user"], "alice");
}

#[test]
fn a_refusal_after_the_user_cap_gives_the_slot_back() {
    let (g, h) = gate(
        "i",
        GateConfig {
            user_concurrency: 1,
            ..GateConfig::default()
        },
    );
    admit_rps(&h, "i", 0.0);
    let t = Instant::now();
    // Rate 0: the bucket refuses; the slot the cap took must not leak.
    for _ in 0..3 {
        assert_eq!(
            outcome(g.admit_at(&agent("erin"), t, NOW_MS)).unwrap_err(),
            Outcome::Throttled
        );
    }
    assert_eq!(g.inner.users().in_flight("erin"), 0);
}

#[test]
fn aborted_conversations_and_traces_get_409_until_their_deadline() {
    let (g, h) = gate("i", GateConfig::default());
    command(&h, |c| {
        c.abort = vec![
            AbortEntry {
                id: "conv-loop".into(),
                kind: AbortKind::Conversation,
                until_ms: NOW_MS + 1000,
                reason: "same tool call 40 times".into(),
            },
            AbortEntry {
                id: "4BF92F3577B34DA6A3CE929D0E0E4736".into(),
                kind: AbortKind::Trace,
                until_ms: NOW_MS + 1000,
                reason: String::new(),
            },
            AbortEntry {
                id: "u1".into(),
                kind: AbortKind::Unknown("user".into()),
                until_ms: NOW_MS + 1000,
                reason: String::new(),
            },
        ];
    });
    let t = Instant::now();
    let mut m = meta(Criticality::Critical);
    m.conversation = Some("conv-loop".into());
    let r = g.admit_at(&m, t, NOW_MS).unwrap_err();
    assert_eq!(
        (r.outcome, r.outcome.status(), r.outcome.code()),
        (Outcome::LoopAbort, 409, "agent_loop_detected")
    );
    assert!(r.message.contains("same tool call 40 times"));
    assert_eq!(r.extra["kind"], "conversation");
    let mut other = meta(Criticality::Default);
    other.conversation = Some("conv-ok".into());
    assert!(g.admit_at(&other, t, NOW_MS).is_ok());
    let mut tr = meta(Criticality::Default);
    tr.trace_id = Some("4bf92f3577b34da6a3ce929d0e0e4736".into());
    assert_eq!(
        outcome(g.admit_at(&tr, t, NOW_MS)).unwrap_err(),
        Outcome::LoopAbort
    );
    // Past the deadline the entry is inert.
    assert!(g.admit_at(&m, t, NOW_MS + 1001).is_ok());
    let d = g.debug();
    assert_eq!(d["abort"]["ignored"], 1, "the unknown kind");
    assert_eq!(d["abort"]["conversations"], 1);
}

#[test]
fn the_abort_list_is_bounded_and_long_ids_are_ignored() {
    let (g, h) = gate("i", GateConfig::default());
    command(&h, |c| {
        c.abort = (0..MAX_ABORT_ENTRIES + 10)
            .map(|i| AbortEntry {
                id: if i == 0 {
                    "x".repeat(MAX_ABORT_ID_BYTES + 1)
                } else {
                    format!("c{i}")
                },
                kind: AbortKind::Conversation,
                until_ms: NOW_MS + 1000,
                reason: String::new(),
            })
            .collect();
    });
    let t = Instant::now();
    let mut last = meta(Criticality::Default);
    last.conversation = Some(format!("c{}", MAX_ABORT_ENTRIES + 5));
    assert!(
        g.admit_at(&last, t, NOW_MS).is_ok(),
        "past the bound: ignored"
    );
    let mut first = meta(Criticality::Default);
    first.conversation = Some("c1".into());
    assert!(g.admit_at(&first, t, NOW_MS).is_err());
    let d = g.debug();
    assert_eq!(d["abort"]["ignored"], 11);
    assert_eq!(d["abort"]["conversations"], MAX_ABORT_ENTRIES - 1);
}

#[test]
fn a_disabled_tool_is_refused_and_a_probe_lets_exactly_its_share_through() {
    let (g, h) = gate("i", GateConfig::default());
    command(&h, |c| {
        c.features
            .insert("tool:web_search".into(), FeatureState::Disabled);
        c.features
            .insert("tool:code_exec".into(), FeatureState::Probe);
        c.limits.probe_ratio = Some(0.25);
    });
    let t = Instant::now();
    let tools = |names: &[&str]| RequestMeta {
        tools: names.iter().map(|s| s.to_string()).collect(),
        criticality: Criticality::Critical,
        ..RequestMeta::default()
    };
    let r = g
        .admit_at(&tools(&["calc", "web_search"]), t, NOW_MS)
        .unwrap_err();
    assert_eq!(
        (r.outcome, r.outcome.status(), r.outcome.code()),
        (Outcome::ToolDisabled, 503, "tool_disabled")
    );
    assert_eq!(r.extra["tool"], "web_search");
    assert_eq!(r.extra["state"], "disabled");
    assert!(
        r.extra["hint"]
            .as_str()
            .unwrap()
            .contains("tool:web_search")
    );
    assert!(g.admit_at(&tools(&["calc"]), t, NOW_MS).is_ok());
    // 1 in 4 passes: calls 1, 5, 9, 13, … (exactly ceil(n/4) of n).
    let passed: Vec<bool> = (0..16)
        .map(|_| g.admit_at(&tools(&["code_exec"]), t, NOW_MS).is_ok())
        .collect();
    assert_eq!(passed.iter().filter(|p| **p).count(), 4);
    assert!(passed[0] && passed[4] && !passed[1]);
    // The counters survive a lease refresh of the same breaker state.
    command(&h, |c| {
        c.features
            .insert("tool:code_exec".into(), FeatureState::Probe);
        c.limits.probe_ratio = Some(0.25);
    });
    assert!(
        g.admit_at(&tools(&["code_exec"]), t, NOW_MS).is_ok(),
        "call 17"
    );
    assert!(g.admit_at(&tools(&["code_exec"]), t, NOW_MS).is_err());
    assert_eq!(
        g.debug()["probes"]["features"]["tool:code_exec"]["passed"],
        5
    );
    // Closed again: every call passes and the counter is dropped.
    command(&h, |_| {});
    assert!(g.admit_at(&tools(&["code_exec"]), t, NOW_MS).is_ok());
    assert!(
        g.debug()["probes"]["features"]
            .as_object()
            .unwrap()
            .is_empty()
    );
}

#[test]
fn an_unknown_feature_state_lets_calls_through() {
    let (g, h) = gate("i", GateConfig::default());
    command(&h, |c| {
        c.features.insert(
            "tool:x".into(),
            FeatureState::Unknown(serde_json::json!("half_open")),
        );
    });
    let m = RequestMeta {
        tools: vec!["x".into()],
        ..RequestMeta::default()
    };
    assert!(g.admit_at(&m, Instant::now(), NOW_MS).is_ok());
}

#[test]
fn checks_run_in_the_documented_order() {
    let (g, h) = gate("i", GateConfig::default());
    command(&h, |c| {
        c.tier = Tier::T3;
        c.features.insert("pdf".into(), FeatureState::Disabled);
        c.features.insert("tool:t".into(), FeatureState::Disabled);
        c.shed = Some(Shed {
            admit_min_criticality: Criticality::Critical,
            retry_after_s: 5,
            jitter_ratio: 0.0,
            recovery_eta_ms: NOW_MS,
            admit_rps: None,
        });
        c.instances.insert(
            "i".into(),
            InstanceEntry {
                drain: Some(true),
                admit_rps: Some(0.0),
                ..InstanceEntry::default()
            },
        );
        c.abort = vec![AbortEntry {
            id: "loop".into(),
            kind: AbortKind::Conversation,
            until_ms: NOW_MS + 1,
            reason: String::new(),
        }];
    });
    let t = Instant::now();
    let mut m = RequestMeta {
        criticality: Criticality::Default,
        feature: "pdf".into(),
        user: Some("u".into()),
        conversation: Some("loop".into()),
        trace_id: None,
        tools: vec!["t".into()],
        retry: false,
    };
    let mut order = Vec::new();
    loop {
        match g.admit_at(&m, t, NOW_MS) {
            Ok(_) => break,
            Err(r) => order.push(r.outcome),
        }
        match order.last().unwrap() {
            Outcome::LoopAbort => m.conversation = Some("fine".into()),
            Outcome::FeatureDisabled => m.feature.clear(),
            Outcome::ToolDisabled => m.tools.clear(),
            Outcome::Shed => {
                // Lift shedding for the rest of the walk (same entries otherwise).
                let mut c = h.current().command.clone();
                c.version += 1;
                c.shed = None;
                h.apply(c, NOW_MS).unwrap();
            }
            Outcome::Drained => {
                let mut c = h.current().command.clone();
                c.version += 1;
                c.instances.get_mut("i").unwrap().drain = None;
                c.limits.user_concurrency = Some(1);
                h.apply(c, NOW_MS).unwrap();
                // The user already has one agent request in flight.
                assert!(matches!(
                    g.inner.users().acquire("u", 1),
                    Acquire::Counted(_)
                ));
            }
            Outcome::UserCap => m.user = None,
            Outcome::Throttled => m.criticality = Criticality::Critical,
        }
    }
    assert_eq!(order, Outcome::ALL);
}

#[test]
fn t2_routes_and_caps_non_critical_only() {
    let (g, h) = gate("i", GateConfig::default());
    command(&h, |c| {
        c.tier = Tier::T2;
        c.model_route.insert("default".into(), "fallback".into());
        c.limits.max_tokens_cap = Some(8);
    });
    let t = Instant::now();
    let a = g
        .admit_at(&meta(Criticality::Sheddable), t, NOW_MS)
        .unwrap();
    assert_eq!(
        (a.route, a.max_tokens_cap),
        (RouteChoice::Fallback, Some(8))
    );
    let c = g.admit_at(&meta(Criticality::Critical), t, NOW_MS).unwrap();
    assert_eq!((c.route, c.max_tokens_cap), (RouteChoice::Primary, None));
    assert_eq!(c.tier, Tier::T2);
}

#[test]
fn millions_of_users_through_the_gate_keep_the_table_bounded() {
    let (g, _) = gate(
        "i",
        GateConfig {
            max_tracked_users: 512,
            ..GateConfig::default()
        },
    );
    let t = Instant::now();
    for i in 0..50_000u32 {
        // Odd Unicode, long ids: each a distinct user.
        let m = agent(&format!("ü\u{301}ser-{i}-{}", "𝕏".repeat(i as usize % 40)));
        assert!(g.admit_at(&m, t, NOW_MS).is_ok());
    }
    let d = g.debug();
    assert_eq!(d["user_concurrency"]["tracked_users"], 512);
    assert_eq!(d["user_concurrency"]["active_users"], 0);
    assert_eq!(d["user_concurrency"]["evicted_total"], 50_000 - 512);
}

fn t3_excess(h: &ControlHandle, rate: Option<f64>, eta_ms: u64) {
    command(h, |c| {
        c.tier = Tier::T3;
        c.shed = Some(Shed {
            admit_min_criticality: Criticality::Critical,
            retry_after_s: 2,
            jitter_ratio: 0.5,
            recovery_eta_ms: eta_ms,
            admit_rps: rate,
        });
    });
}

#[test]
fn t3_with_admit_rps_sheds_only_the_excess_default_before_sheddable_critical_never() {
    let (g, h) = gate("i", GateConfig::default());
    t3_excess(&h, Some(4.0), NOW_MS + 30_000);
    let t0 = Instant::now();
    // Sheddable leaves the last half of the burst (2 of 4 tokens) to default.
    assert!(
        g.admit_at(&meta(Criticality::Sheddable), t0, NOW_MS)
            .is_ok()
    );
    assert!(
        g.admit_at(&meta(Criticality::Sheddable), t0, NOW_MS)
            .is_ok()
    );
    let r = g
        .admit_at(&meta(Criticality::Sheddable), t0, NOW_MS)
        .unwrap_err();
    assert_eq!((r.outcome, r.outcome.status()), (Outcome::Shed, 429));
    assert_eq!(r.extra["admit_rps"], serde_json::json!(4.0));
    assert!(g.admit_at(&meta(Criticality::Default), t0, NOW_MS).is_ok());
    assert!(g.admit_at(&meta(Criticality::Default), t0, NOW_MS).is_ok());
    let r = g
        .admit_at(&meta(Criticality::Default), t0, NOW_MS)
        .unwrap_err();
    assert_eq!(r.outcome, Outcome::Shed);
    // Retry-After spread from the base (2 s) up to the recovery estimate (30 s away).
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..400 {
        let r = g
            .admit_at(&meta(Criticality::Default), t0, NOW_MS)
            .unwrap_err();
        let s = r.retry_after_s.unwrap();
        assert!((2..=30).contains(&s), "{s}");
        seen.insert(s);
    }
    assert!(seen.len() > 15, "spread over the drain time: {seen:?}");
    assert!(
        seen.iter().any(|s| *s > 3),
        "beyond the base jitter: {seen:?}"
    );
    // Critical is never refused, but its work is paid for: four critical calls put the bucket
    // one burst into debt, so after one second nothing non-critical passes yet.
    for _ in 0..20 {
        assert!(g.admit_at(&meta(Criticality::Critical), t0, NOW_MS).is_ok());
    }
    let t1 = t0 + Duration::from_secs(1);
    assert!(g.admit_at(&meta(Criticality::Default), t1, NOW_MS).is_err());
    // Another 0.25 s: one token, to default only.
    let t2 = t0 + Duration::from_millis(1250);
    assert!(
        g.admit_at(&meta(Criticality::Sheddable), t2, NOW_MS)
            .is_err()
    );
    assert!(g.admit_at(&meta(Criticality::Default), t2, NOW_MS).is_ok());
    // Over ten seconds the admitted non-critical rate is the bucket's.
    let mut admitted = 0;
    for i in 0..1000u64 {
        let t = t2 + Duration::from_millis(10 * i);
        if g.admit_at(&meta(Criticality::Default), t, NOW_MS).is_ok() {
            admitted += 1;
        }
    }
    assert!((39..=41).contains(&admitted), "{admitted} in 10 s at 4/s");
}

#[test]
fn t3_without_admit_rps_sheds_the_whole_class_with_the_base_jitter() {
    let (g, h) = gate("i", GateConfig::default());
    t3_excess(&h, None, NOW_MS + 30_000);
    let t0 = Instant::now();
    for _ in 0..200 {
        let r = g
            .admit_at(&meta(Criticality::Default), t0, NOW_MS)
            .unwrap_err();
        assert_eq!(r.outcome, Outcome::Shed);
        assert!(!r.extra.contains_key("admit_rps"));
        // ceil(2 × U[1, 1.5]) ∈ {2, 3}.
        assert!((2..=3).contains(&r.retry_after_s.unwrap()));
    }
    assert!(g.admit_at(&meta(Criticality::Critical), t0, NOW_MS).is_ok());
}

#[test]
fn t3_keeps_admitting_a_session_it_admitted_and_refuses_whole_new_ones() {
    let (g, h) = gate("i", GateConfig::default());
    t3_excess(&h, Some(2.0), NOW_MS + 30_000);
    let t0 = Instant::now();
    let user = |u: &str| RequestMeta {
        criticality: Criticality::Default,
        user: Some(u.into()),
        ..RequestMeta::default()
    };
    // Two tokens: users a and b start their flows; c is refused.
    assert!(g.admit_at(&user("a"), t0, NOW_MS).is_ok());
    assert!(g.admit_at(&user("b"), t0, NOW_MS).is_ok());
    assert_eq!(
        outcome(g.admit_at(&user("c"), t0, NOW_MS)).unwrap_err(),
        Outcome::Shed
    );
    // a's and b's later calls go on although the bucket is empty (they draw into debt) ...
    let t1 = t0 + Duration::from_secs(2);
    for _ in 0..3 {
        assert!(g.admit_at(&user("a"), t1, NOW_MS).is_ok());
        assert!(g.admit_at(&user("b"), t1, NOW_MS).is_ok());
    }
    // ... which leaves nothing for a new session now.
    assert!(g.admit_at(&user("c"), t1, NOW_MS).is_err());
    // After the session window a needs a token again: c and d take the two there are.
    let t2 = t0 + Duration::from_secs(EXCESS_SESSION_SECS);
    assert!(g.admit_at(&user("c"), t2, NOW_MS).is_ok());
    assert!(g.admit_at(&user("d"), t2, NOW_MS).is_ok());
    assert_eq!(
        outcome(g.admit_at(&user("a"), t2, NOW_MS)).unwrap_err(),
        Outcome::Shed,
        "a is a new session after the window"
    );
    // Leaving T3 forgets the sessions.
    command(&h, |_| {});
    assert!(g.admit_at(&user("z"), t2, NOW_MS).is_ok());
    assert_eq!(g.debug()["admission"]["t3_excess"]["sessions"], 0);
}
