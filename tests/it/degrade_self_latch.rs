//! No self-latching (docs/SLO.md "Deliberate refusals"; docs/REQUIREMENTS.md R3): a tier brownout
//! raised is never held up by the refusals it causes itself.
//!
//! A closed loop on a logical clock, built from the components the control plane wires together:
//! the pure controller, the SLO evaluator fed exactly as the ingest feeder feeds it
//! (`plane::feeders::span_observation`, failures without a trace id through `record_failure`),
//! the pattern engine fed through the ingest tagger's rule (`plane::tag_failure`) and ranked as
//! the pattern feed ranks it, and the controller inputs made as the controller feeder makes them
//! (`plane::feeders::slo_alerts`, `PatternsSnapshot::new_pattern_rates`). The "serving tier" in
//! the loop obeys the decisions as brownout-serve does: a feature the command disables answers a
//! refusal recorded as the serving tier records it (a span with `brownout.deliberate = true` and
//! no ERROR status, a failure event with `deliberate = "true"`), and a gateway also reports each
//! refusal as a failure event without a trace id.
//!
//! An operator pins T2 under steady load far below capacity; when the pin ends the tier must
//! step down one tier per hold-down, to T0. The same loop with the refusals counted as errors
//! (what the control plane did before) stays latched at T2 by `slo_burn` — the control that
//! shows this test can fail.

use std::collections::BTreeMap;

use brownout::degrade::{Controller, Inputs, Override, Policy, Transition};
use brownout::patterns::PatternEngine;
use brownout::patterns::feed::PatternsSnapshot;
use brownout::plane::feeders::{slo_alerts, span_observation};
use brownout::plane::tag_failure;
use brownout::slo::eval::{Evaluator, Observation};
use brownout::store::SpanRow;
use brownout_protocol::{Category, Criticality, FailureEvent, FeatureState, Tier};

const SEC: u64 = 1_000;
/// 2026-01-05 00:00 UTC.
const T0: u64 = 1_767_571_200_000;
const PIN_AT: u64 = T0 + 30 * SEC;
const PIN_FOR: u64 = 60 * SEC;
/// Requests per second, well below what the engines serve (no host signal moves).
const RPS: u64 = 21;

/// The demo policy's features with their criticalities, in the order the load cycles through.
const FEATURES: [(&str, Criticality); 7] = [
    ("pdf_analysis", Criticality::Sheddable),
    ("image_generation", Criticality::Sheddable),
    ("multilingual_email", Criticality::Sheddable),
    ("web_search", Criticality::Default),
    ("simple_tasks", Criticality::Default),
    ("basic_qa", Criticality::Critical),
    ("login", Criticality::Critical),
];

fn span(ts_ms: u64, i: u64, feature: &str, crit: Criticality, refused: Option<u8>) -> SpanRow {
    let mut attributes = vec![
        ("brownout.feature".to_string(), feature.to_string()),
        (
            "brownout.criticality".to_string(),
            crit.as_str().to_string(),
        ),
        ("brownout.ttft_s".to_string(), "0.15".to_string()),
    ];
    match refused {
        Some(tier) => {
            attributes.push(("brownout.outcome".into(), "feature_disabled".into()));
            attributes.push(("brownout.deliberate".into(), "true".into()));
            attributes.push(("brownout.tier".into(), tier.to_string()));
        }
        None => {
            attributes.push(("brownout.outcome".into(), "stop".into()));
            attributes.push(("brownout.deliberate".into(), "false".into()));
        }
    }
    SpanRow {
        trace_id: format!("{:032x}", ts_ms * 100 + i),
        span_id: format!("{:016x}", i),
        parent_span_id: String::new(),
        service: "chat".into(),
        name: "llm.request".into(),
        kind: 2,
        start_us: ts_ms * 1000,
        duration_us: if refused.is_some() { 300 } else { 400_000 },
        status: 0,
        status_message: String::new(),
        feature: feature.into(),
        criticality: crit.as_str().into(),
        host: "gpu-node-1".into(),
        is_request: true,
        attributes,
    }
}

fn refusal_event(
    ts_ms: u64,
    trace_id: &str,
    feature: &str,
    crit: Criticality,
    tier: u8,
) -> FailureEvent {
    let mut attributes = BTreeMap::new();
    attributes.insert("outcome".to_string(), "feature_disabled".to_string());
    attributes.insert("deliberate".to_string(), "true".to_string());
    attributes.insert("command".to_string(), "7:12".to_string());
    attributes.insert("tier".to_string(), tier.to_string());
    FailureEvent {
        ts_ms,
        service: "chat".into(),
        host: "gpu-node-1".into(),
        request_id: String::new(),
        trace_id: trace_id.into(),
        user_id: format!("u{}", ts_ms % 97),
        feature: feature.into(),
        criticality: crit,
        category: Category::Degraded,
        error_type: "FeatureDisabled".into(),
        message: format!("feature {feature} disabled at tier {tier}"),
        latency_ms: 0.3,
        attributes,
    }
}

/// How the loop treats brownout's own refusals.
#[derive(Clone, Copy, PartialEq)]
enum Refusals {
    /// As the control plane does now: its own outcome, in no SLI and no pattern.
    Deliberate,
    /// As it did before: an error span and a mined failure.
    CountedAsErrors,
}

type Change = (u64, Tier, Transition, String);

/// Every tier change `(at_ms, tier, transition, trigger)`, and the last decision's tier and
/// trigger.
fn run_loop(policy: Policy, mode: Refusals, until_ms: u64) -> (Vec<Change>, Tier, String) {
    let slos = brownout::defaults::slos().expect("the example SLOs");
    let mut slo = Evaluator::new(slos);
    let mut engine = PatternEngine::default();
    let mut ctl = Controller::new(policy);
    let mut alerts = Vec::new();
    let mut new_patterns = Vec::new();
    let mut changes = Vec::new();
    let mut tier = Tier::T0;
    let mut trigger = String::new();
    let mut now = T0;
    let mut n = 0u64;
    while now <= until_ms {
        // The controller, once a second.
        let inputs = Inputs {
            now_ms: now,
            snapshots: Vec::new(),
            slo_alerts: alerts.clone(),
            alertmanager_firing: Default::default(),
            new_patterns: new_patterns.clone(),
            operator_override: (now >= PIN_AT).then(|| Override {
                tier: Tier::T2,
                until_ms: PIN_AT + PIN_FOR,
                reason: "drill".into(),
            }),
            ..Inputs::default()
        };
        let d = ctl.step(&inputs);
        if d.tier != tier || d.transition != Transition::Hold {
            changes.push((now, d.tier, d.transition, d.reason.trigger.clone()));
        }
        tier = d.tier;
        trigger = d.reason.trigger.clone();
        let features: &BTreeMap<String, FeatureState> = &d.features;

        // One second of steady load against a serving tier that obeys the decision.
        for k in 0..RPS {
            n += 1;
            let ts = now + k * (SEC / RPS);
            let (feature, crit) = FEATURES[(n % FEATURES.len() as u64) as usize];
            let disabled = features.get(feature) == Some(&FeatureState::Disabled);
            let refused = disabled.then_some(tier.as_u8());
            let mut s = span(ts, n, feature, crit, refused);
            if mode == Refusals::CountedAsErrors && disabled {
                s.status = brownout::store::STATUS_ERROR;
                s.attributes.retain(|(k, _)| k != "brownout.deliberate");
            }
            slo.record(&span_observation(&s));
            if disabled {
                let with_trace = refusal_event(ts, &s.trace_id, feature, crit, tier.as_u8());
                let from_gateway = refusal_event(ts, "", feature, crit, tier.as_u8());
                for ev in [&with_trace, &from_gateway] {
                    match mode {
                        Refusals::Deliberate => {
                            tag_failure(&mut engine, ev);
                        }
                        Refusals::CountedAsErrors => {
                            engine.observe(ev);
                        }
                    }
                }
                // The feeder counts a failure once: through its span when it has a trace id.
                let gw = if mode == Refusals::CountedAsErrors {
                    let mut g = from_gateway.clone();
                    g.attributes.remove("deliberate");
                    g
                } else {
                    from_gateway
                };
                slo.record(&Observation::from_failure(&gw));
            }
        }
        // The SLO task and the pattern feed, every 5 s.
        if (now - T0).is_multiple_of(5 * SEC) {
            let report = brownout::slo::task::SloReport {
                evaluated_at_ms: now,
                slos: slo.evaluate(now),
            };
            alerts = slo_alerts(&report);
            let snap = PatternsSnapshot {
                computed_at_ms: now,
                since_ms: now.saturating_sub(24 * 3_600 * SEC),
                until_ms: now + 1,
                patterns: engine.patterns(now.saturating_sub(24 * 3_600 * SEC), now + 1),
            };
            new_patterns = snap
                .new_pattern_rates(5 * 60 * SEC)
                .into_iter()
                .map(|(pattern_id, per_min)| brownout::degrade::PatternRate {
                    pattern_id,
                    per_min,
                })
                .collect();
        }
        now += SEC;
    }
    (changes, tier, trigger)
}

fn hold(policy: &Policy, t: Tier) -> u64 {
    policy.tier(t).expect("a tier above T0").hold_down_ms
}

fn steps_down_per_hold_down(policy_yaml: &str) {
    let policy = Policy::from_yaml(policy_yaml).expect("policy");
    let (h2, h1) = (hold(&policy, Tier::T2), hold(&policy, Tier::T1));
    let pin_end = PIN_AT + PIN_FOR;
    let until = pin_end + h2 + h1 + 30 * SEC;
    let (changes, last, _) = run_loop(policy.clone(), Refusals::Deliberate, until);

    // Pinned at T2 by the operator.
    assert!(
        changes
            .iter()
            .any(|c| c.0 == PIN_AT && c.1 == Tier::T2 && c.2 == Transition::Override),
        "{changes:?}"
    );
    // Nothing raised the tier on its own: the only tiers above T0 are the pin and its steps down.
    assert!(
        changes.iter().all(|c| c.2 != Transition::Enter),
        "the refusals raised a tier: {changes:?}"
    );
    let downs: Vec<&Change> = changes
        .iter()
        .filter(|c| c.2 == Transition::StepDown)
        .collect();
    assert_eq!(downs.len(), 2, "T2 → T1 → T0: {changes:?}");
    // T2 → T1 one hold-down of T2 after the pin ended (to the evaluation second).
    assert_eq!(downs[0].1, Tier::T1);
    assert!(
        (pin_end + h2..=pin_end + h2 + SEC).contains(&downs[0].0),
        "T1 at {} ms after the pin, want {h2}: {changes:?}",
        downs[0].0 - pin_end
    );
    // T1 → T0 one hold-down of T1 later.
    assert_eq!(downs[1].1, Tier::T0);
    assert!(
        (downs[0].0 + h1..=downs[0].0 + h1 + SEC).contains(&downs[1].0),
        "T0 {} ms after T1, want {h1}: {changes:?}",
        downs[1].0 - downs[0].0
    );
    assert_eq!(last, Tier::T0);

    // The control: the same loop counting its own refusals as errors holds itself at T2.
    let (bad, bad_last, bad_trigger) = run_loop(policy, Refusals::CountedAsErrors, until);
    assert_eq!(bad_last, Tier::T2, "{bad:?}");
    assert_eq!(bad_trigger, "slo_burn", "held by its own burn: {bad:?}");
}

#[test]
fn a_pinned_t2_steps_down_per_hold_down_under_the_demo_hold_downs() {
    // The demo and the benchmark run the same policy with shorter hold-downs (the knob of
    // docs/DEGRADATION.md "One policy").
    let p = include_str!("../../examples/policy.yaml")
        .replace("hold_down_secs: 60", "hold_down_secs: 20")
        .replace("hold_down_secs: 30", "hold_down_secs: 5");
    steps_down_per_hold_down(&p);
}

#[test]
fn a_pinned_t2_steps_down_per_hold_down_under_the_production_policy() {
    // examples/policy.yaml also has the new-pattern trigger, which brownout's own
    // "feature <*> disabled at tier <*>" would feed were refusals mined.
    steps_down_per_hold_down(include_str!("../../examples/policy.yaml"));
}
