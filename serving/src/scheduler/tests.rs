//! Scheduler tests: priority, preemption by recompute, chunked prefill, admission, limits.

use brownout_protocol::Criticality;

use super::*;
use crate::kvcache::{AllocMode, KvCacheManager, KvConfig, SeqId};
use crate::model::Route;

fn sched(num_blocks: usize, block_size: usize, max_num_seqs: usize, budget: usize) -> Scheduler {
    let kv = KvCacheManager::new(KvConfig {
        num_blocks,
        block_size,
        mode: AllocMode::Paged,
        enable_prefix_caching: false,
    });
    Scheduler::new(
        SchedulerConfig {
            max_num_seqs,
            max_num_batched_tokens: budget,
            max_model_len: 1024,
            ..SchedulerConfig::default()
        },
        kv,
    )
}

fn req(id: u64, prompt_len: usize, max_tokens: usize, c: Criticality) -> NewSeq {
    NewSeq {
        id,
        prompt: (0..prompt_len as u32)
            .map(|i| i + id as u32 * 100)
            .collect(),
        params: SamplingParams {
            max_tokens,
            ..SamplingParams::default()
        },
        criticality: c,
        route: Route::Primary,
        eos_token_ids: vec![],
    }
}

/// Runs one step with a fake forward: every sampled chunk appends token 7. Returns the plan and
/// the ids that finished.
fn step(s: &mut Scheduler) -> (StepPlan, Vec<u64>) {
    let plan = s.schedule();
    let mut done = Vec::new();
    for c in &plan.chunks {
        s.chunk_done(c);
        if c.samples && s.append_token(c.seq, 7).is_some() {
            s.remove(c.seq);
            done.push(c.seq.0);
        }
    }
    s.kv().check_invariants().unwrap();
    (plan, done)
}

fn ids(v: &[SeqId]) -> Vec<u64> {
    v.iter().map(|s| s.0).collect()
}

#[test]
fn priority_is_criticality_then_arrival() {
    use Criticality::*;
    let mut s = sched(64, 4, 1, 100);
    for (id, c) in [
        (1, Sheddable),
        (2, Default),
        (3, Critical),
        (4, Critical),
        (5, Default),
    ] {
        s.add(req(id, 3, 2, c)).unwrap();
    }
    assert_eq!(ids(&s.waiting_ids()), [3, 4, 2, 5, 1]);
    let (plan, _) = step(&mut s);
    assert_eq!(plan.chunks.iter().map(|c| c.seq.0).collect::<Vec<_>>(), [3]);
    // Run to completion one at a time: finishing order is the priority order.
    let mut order = Vec::new();
    while s.has_work() {
        order.extend(step(&mut s).1);
    }
    assert_eq!(order, [3, 4, 2, 5, 1]);
}

#[test]
fn blocks_running_out_preempts_the_lowest_priority_and_loses_nothing() {
    // 4 blocks of 4 tokens. Two sequences of 6 prompt tokens take 2 blocks each.
    let mut s = sched(4, 4, 8, 100);
    s.add(req(1, 6, 6, Criticality::Default)).unwrap();
    s.add(req(2, 6, 6, Criticality::Default)).unwrap();
    step(&mut s); // prefill both, first token sampled
    assert_eq!(s.num_running(), 2);
    step(&mut s); // token 7 of each computed (position 6 still in block 1)
    step(&mut s); // position 7
    // Position 8 needs a third block for each: seq 2 (later arrival) is preempted.
    let (plan, _) = step(&mut s);
    assert_eq!(ids(&plan.preempted), [2]);
    assert_eq!(plan.chunks.iter().map(|c| c.seq.0).collect::<Vec<_>>(), [1]);
    let s2 = s.seq(SeqId(2)).unwrap();
    assert_eq!(
        (s2.num_computed, s2.num_preemptions, s2.output().len()),
        (0, 1, 3)
    );
    assert_eq!(
        s.kv().block_table(SeqId(2)),
        None,
        "preempted blocks are freed"
    );
    assert_eq!(s.num_preemptions_total, 1);
    // Run on: seq 1 finishes, seq 2 recomputes its prompt + 3 outputs in one chunk and finishes.
    let mut finished = Vec::new();
    let mut recompute = None;
    while s.has_work() {
        let (plan, done) = step(&mut s);
        if let Some(c) = plan
            .chunks
            .iter()
            .find(|c| c.seq == SeqId(2) && c.start_pos == 0)
        {
            recompute = Some(c.num_tokens);
        }
        finished.extend(done);
    }
    assert_eq!(finished, [1, 2]);
    assert_eq!(
        recompute,
        Some(9),
        "prompt 6 + 3 generated tokens recomputed"
    );
}

#[test]
fn waiting_higher_priority_preempts_lower_running_but_not_equal_priority() {
    // 4 blocks of 4; prompts of 7 tokens: 2 blocks each, and the first decode still fits.
    let mut s = sched(4, 4, 8, 100);
    s.add(req(1, 7, 8, Criticality::Sheddable)).unwrap();
    s.add(req(2, 7, 8, Criticality::Default)).unwrap();
    step(&mut s);
    assert_eq!(s.kv().num_free_blocks(), 0);
    // Another default cannot push the running default out, but does push the sheddable one.
    s.add(req(3, 7, 8, Criticality::Default)).unwrap();
    let (plan, _) = step(&mut s);
    assert_eq!(ids(&plan.preempted), [1]);
    assert!(
        plan.chunks
            .iter()
            .any(|c| c.seq == SeqId(3) && c.start_pos == 0)
    );
    assert!(
        !plan.chunks.iter().any(|c| c.seq == SeqId(1)),
        "the victim's chunk is withdrawn"
    );
    assert_eq!(ids(s.running_ids()), [2, 3]);
    // A critical arrives while seq 2 needs a third block: seq 3 (lowest running) yields to
    // seq 2's growth, then seq 2 (default) yields to the critical one.
    s.add(req(4, 7, 8, Criticality::Critical)).unwrap();
    let (plan, _) = step(&mut s);
    assert_eq!(ids(&plan.preempted), [3, 2]);
    assert_eq!(ids(s.running_ids()), [4]);
    assert_eq!(ids(&s.waiting_ids()), [2, 3, 1]);
    // Everything still finishes.
    let mut finished = Vec::new();
    while s.has_work() {
        finished.extend(step(&mut s).1);
    }
    finished.sort();
    assert_eq!(finished, [1, 2, 3, 4]);
}

#[test]
fn long_prompts_are_prefilled_in_chunks_within_the_token_budget() {
    let mut s = sched(64, 4, 8, 4);
    s.add(req(1, 10, 1, Criticality::Default)).unwrap();
    let chunks: Vec<(usize, usize, bool)> = (0..3)
        .map(|_| {
            let c = step(&mut s).0.chunks[0];
            (c.start_pos, c.num_tokens, c.samples)
        })
        .collect();
    assert_eq!(chunks, [(0, 4, false), (4, 4, false), (8, 2, true)]);
    assert!(!s.has_work());
}

#[test]
fn admission_refuses_what_can_never_fit_and_limits_change_at_run_time() {
    let mut s = sched(8, 4, 4, 100);
    let cases: &[(usize, usize, Option<AdmissionError>)] = &[
        (10, 22, None),
        (0, 5, Some(AdmissionError::EmptyPrompt)),
        (
            10,
            23,
            Some(AdmissionError::OverKvQuota {
                needed: 9,
                quota: 8,
            }),
        ),
        (
            1000,
            25,
            Some(AdmissionError::TooLong {
                prompt: 1000,
                max_tokens: 25,
                max_model_len: 1024,
            }),
        ),
    ];
    for (p, m, want) in cases {
        assert_eq!(
            s.check_admission(*p, *m).err(),
            *want,
            "prompt {p} max_tokens {m}"
        );
    }
    s.set_kv_quota_blocks(2);
    assert_eq!(
        s.check_admission(4, 5),
        Err(AdmissionError::OverKvQuota {
            needed: 3,
            quota: 2
        })
    );
    s.set_kv_quota_blocks(100);
    assert_eq!(s.kv_quota_blocks(), 8, "the quota never exceeds the pool");

    let mut s = sched(64, 4, 4, 100);
    for id in 1..=4 {
        s.add(req(id, 2, 50, Criticality::Default)).unwrap();
    }
    step(&mut s);
    assert_eq!(s.num_running(), 4);
    s.set_max_num_seqs(2);
    s.add(req(9, 2, 50, Criticality::Critical)).unwrap();
    step(&mut s);
    assert_eq!(s.num_running(), 4, "lowering max_num_seqs preempts nobody");
    assert_eq!(ids(&s.waiting_ids()), [9]);
}

fn sched_with(
    num_blocks: usize,
    block_size: usize,
    max_num_seqs: usize,
    policy: SchedulingPolicy,
    ratio: f64,
) -> Scheduler {
    let kv = KvCacheManager::new(KvConfig {
        num_blocks,
        block_size,
        mode: AllocMode::Paged,
        enable_prefix_caching: true,
    });
    Scheduler::new(
        SchedulerConfig {
            max_num_seqs,
            max_num_batched_tokens: 100,
            max_model_len: 1024,
            policy,
            critical_reserve_ratio: ratio,
            critical_step_tokens: 0,
        },
        kv,
    )
}

/// The same arrivals under both policies, one slot: `priority` serves the critical request
/// first (and it displaces the running sheddable one); `fcfs` serves strictly by arrival and
/// never preempts for criticality.
#[test]
fn fcfs_serves_by_arrival_and_priority_by_criticality() {
    use Criticality::*;
    let run = |policy| {
        let mut s = sched_with(64, 4, 1, policy, 0.2);
        s.add(req(1, 3, 3, Sheddable)).unwrap();
        step(&mut s); // 1 is running
        for (id, c) in [(2, Default), (3, Sheddable), (4, Critical)] {
            s.add(req(id, 3, 3, c)).unwrap();
        }
        let mut order = Vec::new();
        let mut preempted = Vec::new();
        while s.has_work() {
            let (plan, done) = step(&mut s);
            preempted.extend(ids(&plan.preempted));
            order.extend(done);
        }
        (order, preempted, s.reserve_seqs(), s.reserve_blocks())
    };
    let (order, preempted, rs, rb) = run(SchedulingPolicy::Fcfs);
    assert_eq!(order, [1, 2, 3, 4]);
    assert!(preempted.is_empty());
    assert_eq!((rs, rb), (0, 0), "fcfs has no critical reserve");
    let (order, preempted, _, rb) = run(SchedulingPolicy::Priority);
    assert_eq!(order, [4, 2, 1, 3]);
    assert_eq!(
        preempted,
        [1],
        "the critical request displaced the sheddable one"
    );
    assert_eq!(rb, 13, "round(64 × 0.2)");
}

/// 5 slots, 20 % reserve = 1 slot: non-critical traffic fills 4, a critical request arriving
/// then runs at once from the reserve without preempting anyone.
#[test]
fn a_critical_request_is_served_from_the_reserved_slot() {
    let mut s = sched_with(256, 4, 5, SchedulingPolicy::Priority, 0.2);
    for id in 1..=8 {
        s.add(req(id, 4, 40, Criticality::Default)).unwrap();
    }
    step(&mut s);
    assert_eq!(s.num_running(), 4, "one of 5 slots is kept for critical");
    assert_eq!(s.num_waiting(), 4);
    assert_eq!(s.reserve_stats().seqs_used, 0);
    step(&mut s);
    assert_eq!(s.num_running(), 4, "still 4 after another step");
    s.add(req(9, 4, 3, Criticality::Critical)).unwrap();
    let (plan, _) = step(&mut s);
    assert!(plan.preempted.is_empty());
    assert!(plan.chunks.iter().any(|c| c.seq == SeqId(9)));
    assert_eq!(s.num_running(), 5);
    let r = s.reserve_stats();
    assert_eq!((r.seqs, r.seqs_used), (1, 1));
    let mut finished = Vec::new();
    while s.has_work() {
        finished.extend(step(&mut s).1);
    }
    assert_eq!(finished[0], 9, "the critical one finished first");
}

/// 10 blocks of 4, 20 % = 2 blocks reserved: non-critical sequences together hold at most 8
/// (growing past that preempts the latest of them), while a critical one takes the last 2.
#[test]
fn non_critical_sequences_never_hold_the_reserved_blocks() {
    let mut s = sched_with(10, 4, 8, SchedulingPolicy::Priority, 0.2);
    assert_eq!(s.noncritical_block_cap(), 8);
    for id in 1..=4 {
        // 8 prompt tokens = 2 blocks each at first, growing to 8 blocks.
        s.add(req(id, 8, 24, Criticality::Default)).unwrap();
    }
    let mut max_used = 0;
    let mut preempted = 0;
    for _ in 0..6 {
        let (plan, _) = step(&mut s);
        preempted += plan.preempted.len();
        max_used = max_used.max(s.kv().num_used_blocks());
        assert!(
            s.kv().num_used_blocks() <= 8,
            "non-critical took a reserved block"
        );
    }
    assert_eq!(max_used, 8);
    assert!(preempted > 0, "growth past the share preempted");
    assert_eq!(s.kv().num_free_blocks(), 2);
    // A critical request needing 2 blocks gets them with no preemption.
    s.add(req(9, 7, 4, Criticality::Critical)).unwrap();
    let (plan, _) = step(&mut s);
    assert!(plan.preempted.is_empty(), "{:?}", plan.preempted);
    assert!(
        plan.chunks
            .iter()
            .any(|c| c.seq == SeqId(9) && c.start_pos == 0)
    );
    assert_eq!(s.reserve_stats().blocks_used, 2);
    // A non-critical request that could only fit by using the reserve is refused up front.
    assert_eq!(
        s.add(req(20, 30, 10, Criticality::Default)),
        Err(AdmissionError::OverKvQuota {
            needed: 10,
            quota: 8
        })
    );
    assert!(s.add(req(21, 30, 10, Criticality::Critical)).is_ok());
    while s.has_work() {
        step(&mut s);
    }
}

/// Sequences sharing a cached prefix count its blocks once against the non-critical share.
#[test]
fn shared_prefix_blocks_count_once_against_the_share() {
    let mut s = sched_with(10, 4, 8, SchedulingPolicy::Priority, 0.2);
    let shared: Vec<u32> = (0..12).collect();
    let mk = |id: u64| NewSeq {
        id,
        prompt: shared.iter().copied().chain([100 + id as u32]).collect(),
        params: SamplingParams {
            max_tokens: 3,
            ..SamplingParams::default()
        },
        criticality: Criticality::Default,
        route: Route::Primary,
        eos_token_ids: vec![],
    };
    s.add(mk(1)).unwrap();
    step(&mut s); // 1 computes and caches the 3 shared blocks
    for id in 2..=4 {
        s.add(mk(id)).unwrap();
    }
    let (plan, _) = step(&mut s);
    // 3 shared + 1 own block each: 3 + 4 = 7 distinct, within the share of 8 (16 if counted per
    // holder, which would have kept two of them waiting).
    assert!(plan.preempted.is_empty());
    assert_eq!(s.num_running(), 4);
    assert!(s.kv().num_used_blocks() <= 8);
}

/// The critical step guard, 4 tokens: 8 default sequences decode together while no critical
/// request is around; once one arrives, every step holds its chunk first and non-critical
/// tokens only up to 4 in all (the others keep their blocks and wait, nobody is preempted), the
/// critical one decodes every step and finishes first; afterwards the batch is whole again.
/// Under `fcfs` the guard does nothing.
#[test]
fn the_critical_step_guard_keeps_the_batch_small_while_critical_requests_are_served() {
    use Criticality::*;
    let mut s = sched_with(512, 4, 16, SchedulingPolicy::Priority, 0.0);
    s.set_critical_step_tokens(4);
    for id in 1..=8 {
        s.add(req(id, 4, 30, Default)).unwrap();
    }
    step(&mut s); // the 8 prompts (32 tokens: no critical request, no guard)
    let (plan, _) = step(&mut s);
    assert_eq!(
        plan.chunks.len(),
        8,
        "all 8 decode together without a critical request"
    );
    // A critical request arrives: the running ones are planned first, 4 tokens of them (the
    // oldest), then its 6-token prefill.
    s.add(req(9, 6, 5, Critical)).unwrap();
    let (plan, _) = step(&mut s);
    assert_eq!(
        plan.chunks.iter().map(|c| c.seq.0).collect::<Vec<_>>(),
        [1, 2, 3, 4, 9],
        "4 non-critical decodes, then the critical prefill"
    );
    assert!(plan.preempted.is_empty());
    assert_eq!(s.num_running(), 9, "the others keep their slots and blocks");
    // While it decodes: its token first, then 3 non-critical ones (oldest first): 4 in all.
    let mut critical_steps = 0;
    loop {
        let (plan, done) = step(&mut s);
        assert!(plan.preempted.is_empty());
        critical_steps += 1;
        let ids: Vec<u64> = plan.chunks.iter().map(|c| c.seq.0).collect();
        assert_eq!(ids, [9, 1, 2, 3], "step {critical_steps}");
        let tokens: usize = plan.chunks.iter().map(|c| c.num_tokens).sum();
        assert_eq!(tokens, 4);
        if done.contains(&9) {
            break;
        }
    }
    assert_eq!(
        critical_steps, 4,
        "5 tokens: 1 sampled at prefill, 4 decode steps"
    );
    // The critical request is done: the whole batch again.
    let (plan, _) = step(&mut s);
    assert_eq!(plan.chunks.len(), 8);
    // A waiting critical request also turns the guard on, for the running ones too; a
    // non-critical prefill is cut to the room left.
    s.add(req(10, 2, 3, Critical)).unwrap();
    s.add(req(11, 8, 3, Sheddable)).unwrap();
    let (plan, _) = step(&mut s);
    let ids: Vec<u64> = plan.chunks.iter().map(|c| c.seq.0).collect();
    assert_eq!(
        ids,
        [1, 2, 3, 4, 10],
        "4 non-critical decodes, then the critical prefill"
    );
    let (plan, _) = step(&mut s);
    let chunks: Vec<(u64, usize)> = plan
        .chunks
        .iter()
        .map(|c| (c.seq.0, c.num_tokens))
        .collect();
    assert_eq!(
        chunks,
        [(10, 1), (1, 1), (2, 1), (3, 1)],
        "11 waits: no room"
    );
    // Under fcfs the same setting does nothing.
    let mut f = sched_with(512, 4, 16, SchedulingPolicy::Fcfs, 0.0);
    f.set_critical_step_tokens(4);
    for id in 1..=8 {
        f.add(req(id, 4, 30, Default)).unwrap();
    }
    f.add(req(9, 6, 5, Critical)).unwrap();
    step(&mut f);
    let (plan, _) = step(&mut f);
    assert_eq!(plan.chunks.len(), 9, "fcfs: no guard");
}
