//! The capacity lever in the pure controller, on a logical clock (docs/DEGRADATION.md "T3 sheds
//! the excess", "Exits read the demand"): T2 is held while its route carries the demand, T3 only
//! when the demand exceeds what T2 serves and then admits up to that capacity, and a tier steps
//! down only once the demand it faces — not the queue it empties by itself — has fallen.

use brownout::degrade::controller::{Controller, Decision, Inputs};
use brownout::degrade::policy::Policy;
use brownout_protocol::{AgentSnapshot, EngineStats, Tier};
use proptest::prelude::*;

/// Two engines whose counters a test advances second by second.
#[derive(Default)]
struct Fleet {
    first: [u64; 2],
    completed: [u64; 2],
}

impl Fleet {
    /// One second: `offered` first attempts and `served` completions (requests/s over both
    /// engines), `waiting` requests queued over both.
    fn second(&mut self, now_ms: u64, offered: u64, served: u64, waiting: u64) -> Inputs {
        let mut snaps = Vec::new();
        for i in 0..2 {
            self.first[i] += offered / 2;
            self.completed[i] += served / 2;
            snaps.push(AgentSnapshot {
                host: format!("gpu-{i}"),
                ts_ms: now_ms,
                probe_up: true,
                engines: vec![EngineStats {
                    id: "engine-0".into(),
                    up: true,
                    requests_first_arrived_total: Some(self.first[i]),
                    requests_arrived_total: Some(self.first[i]),
                    requests_answered_total: self.first[i],
                    requests_completed_total: self.completed[i],
                    num_requests_waiting: waiting / 2,
                    num_requests_running: 8,
                    ..EngineStats::default()
                }],
                ..AgentSnapshot::default()
            });
        }
        Inputs {
            now_ms,
            snapshots: snaps,
            ..Inputs::default()
        }
    }
}

/// T1 on the primary's demand, T2 above 1.3x of it, T3 above 1.1x of the T2 route's capacity
/// (and on a queue of more than 40), each held `hold` s; `top` adds top-level lines.
fn policy(top: &str, hold: u64, excess: bool) -> Policy {
    let admit = if excess {
        ", admit_capacity_ratio: 0.9"
    } else {
        ""
    };
    Policy::from_yaml(&format!(
        r#"
evaluate_interval_ms: 1000
features: []
{top}
tiers:
  t1:
    hold_down_secs: {hold}
    enter: [{{ demand_ratio: {{ above: 1.2, exit_below: 0.9, for_secs: 1 }} }}]
  t2:
    hold_down_secs: {hold}
    enter: [{{ demand_ratio: {{ above: 1.3, exit_below: 0.9, for_secs: 1 }} }}]
    params: {{ model_route: fallback, max_tokens_cap: 16, max_num_seqs: 16 }}
  t3:
    hold_down_secs: {hold}
    enter:
      - {{ fallback_demand_ratio: {{ above: 1.1, exit_below: 0.9, for_secs: 1 }} }}
      - {{ queue_depth: {{ above: 40, exit_below: 10 }} }}
    params: {{ admit_min_criticality: critical, retry_after_base_secs: 5, jitter_ratio: 0.5, recovery_eta_max_secs: 60{admit} }}
"#
    ))
    .unwrap()
}

const DECLARED: &str = "capacity_rps: 20\nfallback_capacity_rps: 40\nexit_demand_ratio: 0.9";

fn run(
    c: &mut Controller,
    fleet: &mut Fleet,
    t: &mut u64,
    secs: u64,
    load: (u64, u64, u64),
) -> Vec<Decision> {
    (0..secs)
        .map(|_| {
            *t += 1000;
            c.step(&fleet.second(*t, load.0, load.1, load.2))
        })
        .collect()
}

#[test]
fn t2_carries_what_its_route_serves_and_t3_sheds_only_the_excess_over_it() {
    let mut c = Controller::new(policy(DECLARED, 5, true));
    let (mut f, mut t) = (Fleet::default(), 0);
    // 0.6x of the primary (12 of 20 req/s): nothing.
    let d = run(&mut c, &mut f, &mut t, 10, (12, 12, 0));
    assert!(d.iter().all(|d| d.tier == Tier::T0));
    // 1.5x of the primary (20 req/s completed, a queue) is 0.75x of the T2 route (40
    // req/s): T2, which then serves it all, held and never T3.
    let d = run(&mut c, &mut f, &mut t, 5, (30, 20, 4));
    let t2_at = d.iter().position(|d| d.tier == Tier::T2).expect("T2");
    assert!(t2_at <= 4, "T2 within 4 s: {t2_at}");
    let d = run(&mut c, &mut f, &mut t, 40, (30, 30, 0));
    assert!(d.iter().all(|d| d.tier == Tier::T2), "T2 held");
    assert!(d.iter().all(|d| d.shed.is_none()), "never T3");
    // 3x of the primary is 1.5x of the T2 route: T3, which admits 0.9 x 40 / 2 engines each.
    let d = run(&mut c, &mut f, &mut t, 20, (60, 40, 0));
    let t3 = d.iter().find(|d| d.tier == Tier::T3).expect("T3");
    let shed = t3.shed.as_ref().expect("shed at T3");
    assert_eq!(shed.admit_rps, Some(18.0));
    assert!(
        t3.reasons
            .iter()
            .any(|r| r.trigger == "fallback_demand_ratio"),
        "{:?}",
        t3.reasons
    );
    // Without the ratio T3 sheds the whole class (the first release's T3).
    let mut c = Controller::new(policy(DECLARED, 5, false));
    let (mut f, mut t) = (Fleet::default(), 0);
    run(&mut c, &mut f, &mut t, 10, (12, 12, 0));
    let d = run(&mut c, &mut f, &mut t, 20, (60, 20, 10));
    let t3 = d.iter().find(|d| d.tier == Tier::T3).expect("T3");
    assert_eq!(t3.shed.as_ref().unwrap().admit_rps, None);
}

#[test]
fn the_t2_routes_capacity_is_measured_while_t2_runs_saturated() {
    // Only the primary's capacity is declared, and T3 comes from the queue alone here (with
    // the primary's 20 req/s as the T2 route's floor, T3's demand trigger would fire with
    // T2's). T2 is seen to complete 36 req/s with work waiting; T3 then admits 0.9 x 36 / 2.
    let mut p = policy("capacity_rps: 20\nexit_demand_ratio: 0.9", 5, true);
    p.tiers[2].enter.remove(0);
    let mut c = Controller::new(p);
    let (mut f, mut t) = (Fleet::default(), 0);
    run(&mut c, &mut f, &mut t, 10, (12, 12, 0));
    run(&mut c, &mut f, &mut t, 5, (30, 20, 4));
    assert_eq!(c.tier(), Tier::T2);
    let d = run(&mut c, &mut f, &mut t, 8, (30, 36, 6));
    assert!(d.iter().all(|d| d.tier == Tier::T2));
    let d = run(&mut c, &mut f, &mut t, 3, (60, 36, 60));
    let t3 = d.iter().find(|d| d.tier == Tier::T3).expect("T3");
    assert_eq!(t3.shed.as_ref().unwrap().admit_rps, Some(16.2));
    // Unsaturated T2 measures nothing: the same without work waiting admits the primary's.
    let mut p = policy("capacity_rps: 20\nexit_demand_ratio: 0.9", 5, true);
    p.tiers[2].enter.remove(0);
    let mut c = Controller::new(p);
    let (mut f, mut t) = (Fleet::default(), 0);
    run(&mut c, &mut f, &mut t, 10, (12, 12, 0));
    run(&mut c, &mut f, &mut t, 5, (30, 20, 0));
    assert_eq!(c.tier(), Tier::T2);
    run(&mut c, &mut f, &mut t, 8, (30, 30, 0));
    let d = run(&mut c, &mut f, &mut t, 3, (60, 30, 60));
    let t3 = d.iter().find(|d| d.tier == Tier::T3).expect("T3");
    assert_eq!(t3.shed.as_ref().unwrap().admit_rps, Some(9.0));
}

/// One overload raised by the queue, which T3 empties at once; the demand stays at `factor` x
/// the primary for `secs`, then falls to half of it. Returns the tier of every second and
/// when the overload ended.
fn queue_raised_overload(top: &str, hold: u64, factor: u64, secs: u64) -> (Vec<Tier>, usize) {
    let mut p = policy(top, hold, true);
    if !top.contains("fallback_capacity_rps") {
        // No T2 capacity: T3 comes from the queue alone (the demo's first policy).
        p.tiers[2].enter.remove(0);
    }
    let mut c = Controller::new(p);
    let (mut f, mut t) = (Fleet::default(), 0);
    let mut tiers: Vec<Tier> = run(&mut c, &mut f, &mut t, 10, (10, 10, 0))
        .iter()
        .map(|d| d.tier)
        .collect();
    // The queue raises T3 (one second of 60 waiting), then the shedding keeps it empty while
    // the demand stays high.
    for i in 0..secs {
        t += 1000;
        let waiting = if i < 2 { 60 } else { 0 };
        tiers.push(c.step(&f.second(t, 20 * factor, 36, waiting)).tier);
    }
    let end = tiers.len();
    for _ in 0..(4 * hold + 20) {
        t += 1000;
        tiers.push(c.step(&f.second(t, 10, 10, 0)).tier);
    }
    (tiers, end)
}

fn changes(tiers: &[Tier]) -> usize {
    tiers.windows(2).filter(|w| w[0] != w[1]).count()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A sustained overload of 2-5x holds T3 from the first seconds to its end without a
    /// single step down, and once it ends T3 is left within one hold-down (plus the 3 s the
    /// offered rate is averaged over), then T2 and T1 one hold-down each: exactly one rise and
    /// three steps down.
    #[test]
    fn a_sustained_overload_holds_its_tier_and_the_tier_steps_down_when_the_demand_falls(
        factor in 2u64..=5,
        hold in 3u64..=20,
        secs in 30u64..=120,
    ) {
        let (tiers, end) = queue_raised_overload(DECLARED, hold, factor, secs);
        let first_t3 = tiers.iter().position(|t| *t == Tier::T3).expect("T3");
        prop_assert!(first_t3 <= 12, "T3 at {first_t3}: {tiers:?}");
        prop_assert!(tiers[first_t3..end].iter().all(|t| *t == Tier::T3), "held: {tiers:?}");
        let left = tiers[end..].iter().position(|t| *t < Tier::T3).expect("left T3");
        prop_assert!(left as u64 <= hold + 4, "left T3 {left} s after the end, hold {hold}: {tiers:?}");
        prop_assert_eq!(*tiers.last().unwrap(), Tier::T0);
        prop_assert_eq!(changes(&tiers), 4, "{:?}", tiers);
    }
}

#[test]
fn without_the_demand_exit_the_tier_that_emptied_its_queue_leaves_during_the_overload() {
    // The control: the same overload, exits by the hold-down alone. T3 steps down while the
    // demand is still 3x (the queue it emptied is what it read), so the tier moves during the
    // overload — the flapping the demand exit removes.
    let (tiers, end) = queue_raised_overload("capacity_rps: 20", 5, 3, 60);
    let first_t3 = tiers.iter().position(|t| *t == Tier::T3).expect("T3");
    assert!(
        tiers[first_t3..end].iter().any(|t| *t < Tier::T3),
        "T3 held without the demand exit? {tiers:?}"
    );
    // With it: held (as in the proptest above, here with T3 from the queue alone too).
    let (tiers, end) = queue_raised_overload("capacity_rps: 20\nexit_demand_ratio: 0.9", 5, 3, 60);
    let first_t3 = tiers.iter().position(|t| *t == Tier::T3).expect("T3");
    assert!(
        tiers[first_t3..end].iter().all(|t| *t == Tier::T3),
        "{tiers:?}"
    );
}

#[test]
fn a_tier_its_conditions_left_is_held_by_the_demand_and_says_so() {
    let mut c = Controller::new(policy(DECLARED, 5, true));
    let (mut f, mut t) = (Fleet::default(), 0);
    run(&mut c, &mut f, &mut t, 10, (12, 12, 0));
    // The queue raises T3 while the demand is the T2 route's capacity (40 req/s: 1.0x, under
    // T3's own 1.1x); the queue clears at once.
    run(&mut c, &mut f, &mut t, 2, (40, 36, 60));
    assert_eq!(c.tier(), Tier::T3);
    let d = run(&mut c, &mut f, &mut t, 20, (40, 36, 0));
    assert!(d.iter().all(|d| d.tier == Tier::T3), "held by the demand");
    let last = d.last().unwrap();
    let hold = last
        .reasons
        .iter()
        .find(|r| r.trigger == "demand_hold")
        .expect("the reason says why");
    assert_eq!(hold.tier, Tier::T3);
    assert!(
        hold.value.is_some_and(|v| (0.95..1.05).contains(&v)),
        "{hold:?}"
    );
    assert_eq!(last.reason.trigger, "demand_hold");
    assert!(last.step_down_at_ms.is_none(), "no step down is scheduled");
    // 0.75x of the T2 route: T3 goes after its hold-down (5 s, plus the 3 s mean).
    let d = run(&mut c, &mut f, &mut t, 12, (30, 30, 0));
    let left = d.iter().position(|d| d.tier < Tier::T3).expect("left");
    assert!((5..=9).contains(&left), "{left}");
}
