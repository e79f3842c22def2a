//! `brownout-demo bench overload`: the proof that the loop protects users, judged by flows.
//!
//! ```text
//!  calibrate: closed-loop flows (no think time) on a fresh engine → capacity_flows_per_s
//!             (flows that finish within their deadline, per second; best of three concurrencies)
//!  then, for each configuration, a fresh deployment and the same seeded arrival plan:
//!     0.6× capacity (warm-up) ─ ramp ─ 3× held ≥ 60 s ─ 0.6× (recovery, the retry storm)
//!  baseline  FCFS scheduling, no critical reserve, controller in dry run (a plain vLLM)
//!  loop_off  criticality-first scheduling + reserve, controller in dry run
//!  loop_on   the same, controller publishing
//! ```
//!
//! A flow succeeds only when every call finishes before the flow's deadline (8 s agent flows,
//! 3 s login, 4 s basic Q&A); at the deadline the client hangs up and the engine cancels the
//! request. Clients are a mix of well-behaved, naive (1/2/4/8 s backoff) and impatient ones, and
//! users retry failed flows. Goodput = flows finished within their deadline per second.
//!
//! Output: progress and a table on stderr; `overload.json` (everything, timelines included),
//! `goodput.svg` (goodput over time, the three configurations) and `overload.md` (the table)
//! in `--out`; the last stdout line is `{"baseline": {...}, "loop_off": {...}, "loop_on": {...}}`.
//!
//! Files by job: `cli` (arguments, setups, ablations, the policy), `calibrate` (capacity),
//! `runs` (one configuration's run), `measure` (phases, changes, counters, figures), `output`
//! (table, summary); this file runs them in order.

mod calibrate;
mod cli;
mod measure;
mod output;
mod runs;

pub use calibrate::*;
pub use cli::*;
pub use measure::*;
pub use output::*;
pub use runs::*;

use std::collections::BTreeMap;

use anyhow::Context as _;

/// Runs the benchmark; the last stdout line is `{"baseline": {...}, "loop_off": {...}, "loop_on": {...}}`.
///
/// # Errors
/// Bad arguments, a deployment that cannot start, an output directory that cannot be written.
pub async fn run(args: OverloadArgs) -> anyhow::Result<()> {
    let setups = Setup::parse_list(&args.configs)?;
    anyhow::ensure!(
        args.overload_factor > 1.0 && args.overload_factor.is_finite(),
        "--overload-factor must be above 1"
    );
    anyhow::ensure!(
        args.base_load_ratio > 0.0 && args.base_load_ratio < 1.0,
        "--base-load-ratio must be in (0, 1)"
    );
    anyhow::ensure!(
        args.speed > 0.0 && args.speed.is_finite(),
        "--speed must be positive"
    );
    args.clients.check()?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let model = args.model.clone().unwrap_or_else(super::default_model);
    let policy = match &args.policy {
        Some(p) => std::fs::read_to_string(p)
            .with_context(|| format!("reading --policy {}", p.display()))?,
        None => overload_policy(),
    };
    for s in &setups {
        let o = s.world_options(&model, &policy, 0, 0)?;
        brownout::degrade::Policy::from_yaml(&o.policy_yaml)
            .with_context(|| format!("the policy of {}", s.as_str()))?;
    }
    let step_ms = args
        .simulate_step_ms
        .unwrap_or(if model == "tiny-random" { 25 } else { 0 });
    let guard = args
        .critical_step_tokens
        .unwrap_or(if step_ms > 0 { 0 } else { 4 });
    let pace = if step_ms > 0 {
        format!("simulated GPU pace {step_ms} ms/step")
    } else {
        "real CPU pace".to_string()
    };
    let phases = Phases {
        warmup_s: args.warmup_secs as f64,
        ramp_s: args.ramp_secs as f64,
        hold_s: args.hold_secs as f64,
        recovery_s: args.recovery_secs as f64,
        base_ratio: args.base_load_ratio,
        overload_factor: args.overload_factor,
    };
    let ablation_phases = Phases {
        hold_s: args.ablation_hold_secs.unwrap_or(args.hold_secs) as f64,
        recovery_s: args.ablation_recovery_secs.unwrap_or(args.recovery_secs) as f64,
        ..phases
    };
    eprintln!(
        "bench overload: model {model} ({pace}, critical step guard {guard} tokens); load average {}; configurations {}",
        load_average().unwrap_or_else(|| "?".into()),
        setups
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let measured = match args.capacity_flows_per_s {
        Some(c) => {
            anyhow::ensure!(
                c > 0.0 && c.is_finite(),
                "--capacity-flows-per-s must be positive"
            );
            if let Some(r) = args.capacity_rps {
                anyhow::ensure!(r > 0.0 && r.is_finite(), "--capacity-rps must be positive");
            }
            Capacity {
                flows_per_s: c,
                requests_per_s: args.capacity_rps,
                fallback_requests_per_s: args.fallback_capacity_rps,
            }
        }
        None => calibrate(&args, &model, &policy, step_ms, guard)
            .await
            .context("calibrating the capacity")?,
    };
    let capacity = measured.flows_per_s;
    anyhow::ensure!(
        capacity > 0.0,
        "no flow finished within its deadline while calibrating: the model is too slow for these deadlines (try --deadline agent=20,login=8,basic_qa=10)"
    );
    // The controller is told the capacity the calibration measured, in requests/s, as a load
    // test would tell an operator (`capacity_rps`, docs/DEGRADATION.md), unless the policy
    // declares its own.
    let policy = declare_capacity(&policy, &measured)?;
    let declared_policy = brownout::degrade::Policy::from_yaml(&policy)
        .context("the policy with the declared capacity")?;
    let declared = declared_policy.declared_capacity_rps;
    let declared_fallback = declared_policy.declared_fallback_capacity_rps;
    eprintln!(
        "bench overload: capacity {capacity:.2} flows/s, declared to the controller: {}; {:.0} s warm-up at {:.1}×, {:.0} s ramp, {:.0} s at {:.1}×, {:.0} s recovery (onset at {:.1} s, end at {:.0} s)",
        match (declared, declared_fallback) {
            (None, None) => "none (pass --capacity-rps with --capacity-flows-per-s)".to_string(),
            (p, f) => format!(
                "capacity_rps {}, fallback_capacity_rps {}",
                p.map_or_else(|| "-".into(), |r| format!("{r:.2}")),
                f.map_or_else(|| "-".into(), |r| format!("{r:.2}"))
            ),
        },
        phases.warmup_s,
        phases.base_ratio,
        phases.ramp_s,
        phases.hold_s,
        phases.overload_factor,
        phases.recovery_s,
        phases.onset_s(),
        phases.end_s()
    );
    let mut details: Vec<(Setup, RunDetail)> = Vec::new();
    let write = |name: &str, body: &str| {
        let p = args.out.join(name);
        std::fs::write(&p, body).with_context(|| format!("writing {}", p.display()))
    };
    for (i, setup) in setups.iter().enumerate() {
        let ph = if setup.ablation.is_some() {
            &ablation_phases
        } else {
            &phases
        };
        eprintln!(
            "bench overload: run {}/{}: {} (onset at {:.1} s, end at {:.0} s)",
            i + 1,
            setups.len(),
            setup.as_str(),
            ph.onset_s(),
            ph.end_s()
        );
        let d = one_run(&args, &model, &policy, step_ms, guard, *setup, capacity, ph)
            .await
            .with_context(|| format!("the {} run", setup.as_str()))?;
        eprintln!("{}", d.load.human());
        if !d.changes.is_empty() {
            eprintln!(
                "bench overload: {} tier timeline:\n{}",
                setup.as_str(),
                timeline_text(&d.changes)
            );
        }
        details.push((*setup, d));
        // Written after every run, so a run cut short keeps what it measured.
        let figs: Vec<(Setup, &Figures)> = details.iter().map(|(s, d)| (*s, &d.figures)).collect();
        let mut md = markdown_table(&figs);
        for (s, d) in &details {
            if !d.changes.is_empty() {
                md.push_str(&format!(
                    "\n{} tier timeline (applied; s from the start, onset {:.1} s, end {:.0} s):\n\n```\n{}\n```\n",
                    s.as_str(),
                    d.phases.onset_s(),
                    d.phases.end_s(),
                    timeline_text(&d.changes)
                ));
            }
        }
        let all = serde_json::json!({
            "model": model,
            "pace": pace,
            "simulate_step_ms": step_ms,
            "critical_step_tokens": guard,
            "load_average_at_start": load_average(),
            "phases": phases,
            "ablation_phases": ablation_phases,
            "capacity_flows_per_s": capacity,
            "capacity_rps": measured.requests_per_s,
            "fallback_capacity_rps": measured.fallback_requests_per_s,
            "declared_capacity_rps": declared,
            "declared_fallback_capacity_rps": declared_fallback,
            "runs": details.iter().map(|(s, d)| (s.as_str(), d)).collect::<BTreeMap<_, _>>(),
        });
        write("overload.json", &serde_json::to_string_pretty(&all)?)?;
        write("overload.md", &md)?;
    }
    let figs: Vec<(Setup, &Figures)> = details.iter().map(|(s, d)| (*s, &d.figures)).collect();
    let table = markdown_table(&figs);
    // The chart: the three configurations without ablations (they share the phases).
    let names: Vec<String> = details
        .iter()
        .filter(|(s, _)| s.ablation.is_none())
        .map(|(s, _)| s.as_str())
        .collect();
    let series: Vec<(&str, Vec<(f64, f64)>)> = details
        .iter()
        .filter(|(s, _)| s.ablation.is_none())
        .zip(&names)
        .map(|((_, d), n)| (n.as_str(), d.goodput_series.clone()))
        .collect();
    let title = format!("{model}, {pace}");
    let svg =
        super::chart::goodput_chart(&series, capacity, phases.onset_s(), phases.end_s(), &title);
    write("goodput.svg", &svg)?;
    eprintln!("{table}");
    eprintln!(
        "bench overload: wrote {0}/overload.json, {0}/goodput.svg, {0}/overload.md",
        args.out.display()
    );
    println!("{}", summary_json(&figs));
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use brownout::loadgen::LoadShape;
    use brownout_serving::scheduler::SchedulingPolicy;

    use super::*;

    fn ch(at_s: f64, from: u8, to: u8) -> Change {
        Change {
            at_s,
            from,
            to,
            trigger: String::new(),
            detail: String::new(),
        }
    }

    #[test]
    fn tier_figures_count_flaps_onset_and_recovery() {
        // Up at 42 s (onset 40), T3, down, up again (a flap), back to T0 at 130 s (end 100).
        let c = [
            ch(42.0, 0, 1),
            ch(45.0, 1, 3),
            ch(90.0, 3, 2),
            ch(95.0, 2, 3),
            ch(110.0, 3, 1),
            ch(130.0, 1, 0),
        ];
        let f = tier_figures(&c, 40.0, 100.0);
        assert_eq!((f.tier_changes, f.flaps, f.max_tier), (6, 1, 3));
        assert_eq!(f.onset_to_first_degradation_s, Some(2.0));
        assert_eq!(f.back_to_t0_s, Some(30.0));
        // Never degraded; degraded and never back.
        let none = tier_figures(&[], 40.0, 100.0);
        assert_eq!(
            (none.onset_to_first_degradation_s, none.back_to_t0_s),
            (None, None)
        );
        let stuck = tier_figures(&c[..2], 40.0, 100.0);
        assert_eq!(stuck.back_to_t0_s, None);
        assert_eq!(stuck.flaps, 0);
        // Back at T0 before the overload ended: 0.
        assert_eq!(
            tier_figures(&[ch(50.0, 0, 1), ch(80.0, 1, 0)], 40.0, 100.0).back_to_t0_s,
            Some(0.0)
        );
    }

    #[test]
    fn phases_place_the_onset_where_the_ramp_crosses_capacity() {
        let p = Phases {
            warmup_s: 30.0,
            ramp_s: 12.0,
            hold_s: 60.0,
            recovery_s: 60.0,
            base_ratio: 0.6,
            overload_factor: 3.0,
        };
        assert!((p.onset_s() - 32.0).abs() < 1e-9);
        assert_eq!(p.end_s(), 102.0);
        assert_eq!(p.total_s(), 162.0);
        let shape = LoadShape {
            duration: Duration::from_secs(162),
            profile: p.profile(),
            ..LoadShape::default()
        };
        assert!((shape.factor(Duration::from_secs_f64(32.0)) - 1.0).abs() < 1e-9);
        assert_eq!(shape.factor(Duration::from_secs(70)), 3.0);
        assert_eq!(shape.factor(Duration::from_secs(120)), 0.6);
    }

    #[test]
    fn counters_are_summed_from_the_exposition() {
        let text = "# HELP x\nvllm:generation_tokens_total{model_name=\"a\"} 120\nvllm:generation_tokens_total{model_name=\"b\"} 5\nbrownout_serving_abandoned_tokens_total{model_name=\"a\"} 7\nbrownout_serving_abandoned_requests_total 2\nother 9\nvllm:e2e_request_latency_seconds_count{model_name=\"a\"} 30\nvllm:e2e_request_latency_seconds_count{model_name=\"b\"} 4\nvllm:request_success_total{model_name=\"a\",finished_reason=\"abort\"} 4\n";
        let c = parse_counters(text);
        assert_eq!(
            (
                c.generated,
                c.abandoned_tokens,
                c.abandoned_requests,
                c.completed
            ),
            (125.0, 7.0, 2.0, 34.0)
        );
    }

    #[test]
    fn configurations_parse_and_deploy_as_documented() {
        assert_eq!(
            Setup::parse_list("loop_on, baseline,loop_on").unwrap(),
            vec![Setup::LOOP_ON, Setup::BASELINE]
        );
        assert!(Setup::parse_list("vllm").is_err());
        assert!(Setup::parse_list("loop_on:no-such-thing").is_err());
        assert!(Setup::parse_list(" ").is_err());
        assert_eq!(
            Setup::parse_list("all").unwrap().len(),
            3 + Ablation::ALL.len()
        );
        let owned = overload_policy();
        let p = owned.as_str();
        let b = Setup::BASELINE
            .world_options("tiny-random", p, 25, 4)
            .unwrap();
        assert_eq!(b.engine.scheduling_policy, SchedulingPolicy::Fcfs);
        assert_eq!(b.engine.critical_reserve_ratio, 0.0);
        assert_eq!(b.engine.simulate_step_ms, 25);
        assert!(b.dry_run);
        let off = Setup::LOOP_OFF
            .world_options("tiny-random", p, 25, 4)
            .unwrap();
        assert_eq!(off.engine.scheduling_policy, SchedulingPolicy::Priority);
        assert!(off.engine.critical_reserve_ratio > 0.0);
        assert_eq!(off.engine.critical_step_tokens, 4);
        assert_eq!(
            b.engine.critical_step_tokens, 0,
            "the baseline has no guard"
        );
        assert!(off.dry_run);
        assert!(
            !Setup::LOOP_ON
                .world_options("tiny-random", p, 25, 4)
                .unwrap()
                .dry_run
        );
        let abl = |a| {
            Setup::parse_list(&format!("loop_on:{}", Ablation::as_str(a))).unwrap()[0]
                .world_options("tiny-random", p, 25, 4)
                .unwrap()
        };
        assert_eq!(
            abl(Ablation::NoCriticalReserve)
                .engine
                .critical_reserve_ratio,
            0.0
        );
        assert!(abl(Ablation::NoRefusalAwareSlis).refusals_as_errors);
        assert_eq!(
            abl(Ablation::NoCriticalStepGuard)
                .engine
                .critical_step_tokens,
            0
        );
        assert_eq!(abl(Ablation::NoFastTriggers).engine.critical_step_tokens, 4);
        assert!(!abl(Ablation::NoFastTriggers).refusals_as_errors);
    }

    #[test]
    fn ablations_remove_exactly_their_mechanism_from_the_policy() {
        use brownout::degrade::policy::{Condition, Signal};
        let owned = overload_policy();
        let op = owned.as_str();
        let full = brownout::degrade::Policy::from_yaml(op).unwrap();
        assert!(full.ramp.is_some() && full.instances.is_some());
        let fast = |p: &brownout::degrade::Policy| {
            p.tiers
                .iter()
                .flat_map(|t| &t.enter)
                .filter(|c| match c {
                    Condition::Jump { .. } => true,
                    Condition::Threshold { signal, .. } => {
                        matches!(signal, Signal::TtftP99 | Signal::QueueWaitP99)
                    }
                    _ => false,
                })
                .count()
        };
        assert!(fast(&full) > 0);
        let get =
            |a| brownout::degrade::Policy::from_yaml(&ablate_policy(op, Some(a)).unwrap()).unwrap();
        let nf = get(Ablation::NoFastTriggers);
        assert_eq!(fast(&nf), 0);
        let total =
            |p: &brownout::degrade::Policy| p.tiers.iter().map(|t| t.enter.len()).sum::<usize>();
        assert_eq!(
            total(&nf) + fast(&full),
            total(&full),
            "only the fast triggers go"
        );
        assert_eq!(nf.ramp, full.ramp);
        // Entry conditions on one signal, over every tier.
        let on = |p: &brownout::degrade::Policy, sig: Signal| {
            p.tiers
                .iter()
                .flat_map(|t| &t.enter)
                .filter(|c| matches!(c, Condition::Threshold { signal, .. } if *signal == sig))
                .count()
        };
        let demand = |p: &brownout::degrade::Policy| on(p, Signal::DemandRatio);
        assert!(demand(&full) > 0);
        assert_eq!(demand(&nf), demand(&full));
        let nd = get(Ablation::NoDemandTrigger);
        assert_eq!((demand(&nd), fast(&nd)), (0, fast(&full)));
        let wait = |p: &brownout::degrade::Policy| on(p, Signal::ExpectedWait);
        assert!(wait(&full) > 0);
        assert_eq!(wait(&nf), wait(&full), "expected_wait is not a latency p99");
        let nw = get(Ablation::NoWaitTrigger);
        assert_eq!(wait(&nw), 0);
        assert_eq!(total(&nw) + wait(&full), total(&full));
        let nr = get(Ablation::NoAdmissionRamp);
        assert!(nr.ramp.is_none());
        assert_eq!(nr.tiers, full.tiers);
        let ni = get(Ablation::NoInstanceActions);
        assert!(ni.instances.is_none());
        assert_eq!(ni.ramp, full.ramp);
        assert_eq!(get(Ablation::NoCriticalReserve), full);
        assert_eq!(ablate_policy(op, None).unwrap(), op);
        // The calibrated capacity is declared, and its ablation takes only that away.
        assert_eq!(full.declared_capacity_rps, None, "the file declares none");
        let cap = |p: Option<f64>, f: Option<f64>| Capacity {
            flows_per_s: 1.0,
            requests_per_s: p,
            fallback_requests_per_s: f,
        };
        let declared = declare_capacity(op, &cap(Some(7.5), Some(15.25))).unwrap();
        let with = brownout::degrade::Policy::from_yaml(&declared).unwrap();
        assert_eq!(with.declared_capacity_rps, Some(7.5));
        assert_eq!(with.declared_fallback_capacity_rps, Some(15.25));
        assert_eq!((&with.tiers, &with.ramp), (&full.tiers, &full.ramp));
        let again = declare_capacity(&declared, &cap(Some(99.0), None)).unwrap();
        assert_eq!(
            brownout::degrade::Policy::from_yaml(&again)
                .unwrap()
                .declared_capacity_rps,
            Some(7.5),
            "a policy's own capacity_rps is kept"
        );
        assert_eq!(declare_capacity(op, &cap(None, None)).unwrap(), op);
        let without = brownout::degrade::Policy::from_yaml(
            &ablate_policy(&declared, Some(Ablation::NoDeclaredCapacity)).unwrap(),
        )
        .unwrap();
        assert_eq!(without.declared_capacity_rps, None);
        assert_eq!(without.declared_fallback_capacity_rps, Some(15.25));
        assert_eq!(without.tiers, full.tiers);
        let nf = brownout::degrade::Policy::from_yaml(
            &ablate_policy(&declared, Some(Ablation::NoFallbackCapacity)).unwrap(),
        )
        .unwrap();
        assert_eq!(
            (nf.declared_capacity_rps, nf.declared_fallback_capacity_rps),
            (Some(7.5), None)
        );
        // The loop's own mechanisms: excess-only T3 and exits that read the demand.
        assert!(full.t3.admit_capacity_ratio.is_some());
        assert!(full.exit_demand_ratio.is_some());
        let ne = get(Ablation::NoExcessAdmission);
        assert_eq!((ne.t3.admit_capacity_ratio, &ne.tiers), (None, &full.tiers));
        let nx = get(Ablation::NoDemandExit);
        assert_eq!((nx.exit_demand_ratio, &nx.tiers), (None, &full.tiers));
    }
}
