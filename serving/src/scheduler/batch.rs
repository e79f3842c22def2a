//! Iteration-level continuous batching (vLLM v1's scheduler, simplified).
//!
//! Every step:
//! 1. running sequences, highest priority first, get their next tokens (a prefill chunk or one
//!    decode token) within `max_num_batched_tokens`; when blocks run out the lowest-priority
//!    running sequence is preempted (its blocks freed, back to waiting: recompute later, nothing
//!    lost — its tokens, RNG and output stay with it);
//! 2. waiting sequences, highest priority first, are admitted while `max_num_seqs` and the token
//!    budget allow, taking cached prefixes first; a waiting sequence of strictly higher priority
//!    than the lowest running one may preempt it to get in.
//!
//! Priority ([`SchedulingPolicy::Priority`]): criticality (critical > default > sheddable), then
//! arrival order. [`SchedulingPolicy::Fcfs`] orders by arrival alone (what a plain vLLM does).
//!
//! **Critical reserve** (priority policy only): `round(max_num_seqs × ratio)` sequence slots and
//! `round(num_blocks × ratio)` KV blocks are for critical requests alone. Non-critical sequences
//! are admitted while fewer than `max_num_seqs − reserved slots` of them run, and together hold
//! at most `num_blocks − reserved blocks` (a non-critical sequence that would grow past that is
//! treated as out of blocks: the lowest-priority one is preempted). Each reserve leaves at least
//! one slot and one block to non-critical traffic. A critical request arriving while
//! non-critical traffic fills its share is admitted at once from the reserve, with no preemption.
//!
//! **Critical step guard** (priority policy only, `critical_step_tokens` > 0): while a critical
//! sequence is running or waiting, a step takes non-critical tokens only while it holds fewer
//! than `critical_step_tokens` tokens in all (critical chunks are planned first and never
//! limited). On an engine whose step time grows with the tokens in the step — a CPU, where a
//! step of 16 decodes takes several times a step of one — the batch stays small while critical
//! requests are being served, so they decode at the pace of a small batch; the non-critical
//! sequences left out keep their blocks and continue when the critical ones are done (or in
//! the room the guard leaves). On a GPU the step time barely grows with the batch: leave it 0.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};

use brownout_protocol::Criticality;

use super::sampling::{Sampler, SamplingParams};
use crate::kvcache::{BlockId, KvCacheManager, KvError, SeqId};
use crate::model::Route;

/// How waiting and running sequences are ordered (vLLM's `--scheduling-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SchedulingPolicy {
    /// First come, first served: arrival order only, no criticality anywhere (no priority
    /// admission, no displacement, no critical reserve). The benchmark's plain-vLLM baseline.
    Fcfs,
    /// Criticality first, then arrival; higher criticality may displace lower; critical reserve.
    #[default]
    Priority,
}

impl SchedulingPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            SchedulingPolicy::Fcfs => "fcfs",
            SchedulingPolicy::Priority => "priority",
        }
    }
}

impl std::str::FromStr for SchedulingPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fcfs" => Ok(SchedulingPolicy::Fcfs),
            "priority" => Ok(SchedulingPolicy::Priority),
            other => Err(format!(
                "scheduling policy must be fcfs or priority (got {other:?})"
            )),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SchedulerConfig {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_model_len: usize,
    pub policy: SchedulingPolicy,
    /// Share of sequence slots and KV blocks only critical requests may take, in [0, 1)
    /// (ignored under [`SchedulingPolicy::Fcfs`]).
    pub critical_reserve_ratio: f64,
    /// The critical step guard (module docs): while a critical sequence runs or waits, a step
    /// takes non-critical tokens only up to this many tokens in all. 0: off (ignored under
    /// [`SchedulingPolicy::Fcfs`]).
    pub critical_step_tokens: usize,
}

impl Default for SchedulerConfig {
    fn default() -> SchedulerConfig {
        SchedulerConfig {
            max_num_seqs: 64,
            max_num_batched_tokens: 512,
            max_model_len: 2048,
            policy: SchedulingPolicy::Priority,
            critical_reserve_ratio: 0.0,
            critical_step_tokens: 0,
        }
    }
}

/// Defined in `metrics.rs` (which reads it into gauges and must not import the scheduler).
pub use crate::metrics::ReserveStats;

/// Distinct KV blocks held by non-critical sequences (a prefix block shared by several counts
/// once), rebuilt at every step.
struct NcBlocks {
    refs: Vec<u32>,
    distinct: usize,
}

impl NcBlocks {
    fn new(num_blocks: usize) -> NcBlocks {
        NcBlocks {
            refs: vec![0; num_blocks],
            distinct: 0,
        }
    }
    fn add(&mut self, blocks: &[BlockId]) {
        for b in blocks {
            let r = &mut self.refs[b.index()];
            if *r == 0 {
                self.distinct += 1;
            }
            *r += 1;
        }
    }
    fn remove(&mut self, blocks: &[BlockId]) {
        for b in blocks {
            let r = &mut self.refs[b.index()];
            if *r == 1 {
                self.distinct -= 1;
            }
            *r = r.saturating_sub(1);
        }
    }
    /// How many of `blocks` are not counted yet.
    fn new_among(&self, blocks: &[BlockId]) -> usize {
        blocks.iter().filter(|b| self.refs[b.index()] == 0).count()
    }
}

/// `round(n × ratio)`, leaving at least one to the rest (0 when `n` < 2).
fn reserve_of(n: usize, ratio: f64) -> usize {
    if ratio.is_nan() || ratio <= 0.0 {
        return 0;
    }
    let r = (n as f64 * ratio.min(1.0)).round() as usize;
    r.min(n.saturating_sub(1))
}

/// Why a request is refused before it is queued (→ HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    #[error("prompt is empty")]
    EmptyPrompt,
    #[error(
        "prompt ({prompt} tokens) + max_tokens ({max_tokens}) exceeds max_model_len ({max_model_len})"
    )]
    TooLong {
        prompt: usize,
        max_tokens: usize,
        max_model_len: usize,
    },
    #[error(
        "prompt + max_tokens needs {needed} KV blocks but at most {quota} may be held by one request"
    )]
    OverKvQuota { needed: usize, quota: usize },
    #[error("request id {0} already queued")]
    Duplicate(u64),
}

/// Why a sequence stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS or a stop string.
    Stop,
    /// `max_tokens` or `max_model_len` reached.
    Length,
    /// The client went away or the engine aborted it.
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// A request as the scheduler sees it.
#[derive(Debug, Clone)]
pub struct NewSeq {
    pub id: u64,
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    pub criticality: Criticality,
    pub route: Route,
    pub eos_token_ids: Vec<u32>,
}

#[derive(Debug, Clone)]
pub struct Sequence {
    pub id: SeqId,
    pub prompt_len: usize,
    /// Prompt then output.
    pub tokens: Vec<u32>,
    pub params: SamplingParams,
    pub criticality: Criticality,
    pub route: Route,
    pub eos_token_ids: Vec<u32>,
    pub arrival: u64,
    /// Tokens whose K/V is in the cache (0 after a preemption).
    pub num_computed: usize,
    /// Prompt tokens found in the prefix cache at the last admission.
    pub num_cached_prompt_tokens: usize,
    pub num_preemptions: u32,
    pub sampler: Sampler,
    pub running: bool,
    /// The criticality the scheduler orders by: the request's under `priority`, the same for
    /// everyone under `fcfs`.
    rank: Criticality,
}

impl Sequence {
    pub fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }
    fn key(&self) -> (Reverse<Criticality>, u64) {
        (Reverse(self.rank), self.arrival)
    }
    fn is_critical(&self) -> bool {
        self.criticality == Criticality::Critical
    }
}

/// One sequence's work this step: `tokens[start_pos .. start_pos + num_tokens]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledChunk {
    pub seq: SeqId,
    pub start_pos: usize,
    pub num_tokens: usize,
    /// True when this chunk reaches the end of the sequence: its logits are sampled.
    pub samples: bool,
}

impl ScheduledChunk {
    /// `num_tokens` tokens of `seq` from `start_pos`, of a sequence of `total`: sampled when they
    /// reach its end.
    pub fn new(seq: SeqId, start_pos: usize, num_tokens: usize, total: usize) -> ScheduledChunk {
        ScheduledChunk {
            seq,
            start_pos,
            num_tokens,
            samples: start_pos + num_tokens == total,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepPlan {
    pub chunks: Vec<ScheduledChunk>,
    pub preempted: Vec<SeqId>,
}

type Key = (Reverse<Criticality>, u64, SeqId);

pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: KvCacheManager,
    seqs: HashMap<SeqId, Sequence>,
    waiting: BTreeSet<Key>,
    /// Kept sorted by priority (best first).
    running: Vec<SeqId>,
    next_arrival: u64,
    /// Most blocks one request may hold (the KV quota).
    kv_quota_blocks: usize,
    pub num_preemptions_total: u64,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, kv: KvCacheManager) -> Scheduler {
        let quota = kv.num_blocks();
        Scheduler {
            cfg,
            kv,
            seqs: HashMap::new(),
            waiting: BTreeSet::new(),
            running: Vec::new(),
            next_arrival: 0,
            kv_quota_blocks: quota,
            num_preemptions_total: 0,
        }
    }

    pub fn config(&self) -> SchedulerConfig {
        self.cfg
    }
    pub fn kv(&self) -> &KvCacheManager {
        &self.kv
    }
    pub fn num_running(&self) -> usize {
        self.running.len()
    }
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }
    pub fn seq(&self, id: SeqId) -> Option<&Sequence> {
        self.seqs.get(&id)
    }
    pub fn seq_mut(&mut self, id: SeqId) -> Option<&mut Sequence> {
        self.seqs.get_mut(&id)
    }
    pub fn running_ids(&self) -> &[SeqId] {
        &self.running
    }

    /// Changes `max_num_seqs` now. Lowering it preempts nobody: running sequences finish and
    /// fewer are admitted until the count is under the new limit.
    pub fn set_max_num_seqs(&mut self, n: usize) {
        self.cfg.max_num_seqs = n.max(1);
    }

    /// Changes the per-request KV quota (in blocks, at most the pool).
    pub fn set_kv_quota_blocks(&mut self, n: usize) {
        self.kv_quota_blocks = n.clamp(1, self.kv.num_blocks());
    }
    pub fn kv_quota_blocks(&self) -> usize {
        self.kv_quota_blocks
    }

    /// Whether a request of this shape can ever run.
    ///
    /// # Errors
    /// [`AdmissionError`] saying why not.
    pub fn check_admission(
        &self,
        prompt_len: usize,
        max_tokens: usize,
    ) -> Result<(), AdmissionError> {
        if prompt_len == 0 {
            return Err(AdmissionError::EmptyPrompt);
        }
        if prompt_len + max_tokens > self.cfg.max_model_len {
            return Err(AdmissionError::TooLong {
                prompt: prompt_len,
                max_tokens,
                max_model_len: self.cfg.max_model_len,
            });
        }
        let needed = self.kv.blocks_for(prompt_len + max_tokens);
        if needed > self.kv_quota_blocks {
            return Err(AdmissionError::OverKvQuota {
                needed,
                quota: self.kv_quota_blocks,
            });
        }
        Ok(())
    }

    /// Queues a request.
    ///
    /// # Errors
    /// [`AdmissionError`] when it can never run or the id is taken.
    pub fn add(&mut self, r: NewSeq) -> Result<(), AdmissionError> {
        self.check_admission(r.prompt.len(), r.params.max_tokens)?;
        if r.criticality != Criticality::Critical {
            let needed = self.kv.blocks_for(r.prompt.len() + r.params.max_tokens);
            let cap = self.noncritical_block_cap().min(self.kv_quota_blocks);
            if needed > cap {
                return Err(AdmissionError::OverKvQuota { needed, quota: cap });
            }
        }
        let id = SeqId(r.id);
        if self.seqs.contains_key(&id) {
            return Err(AdmissionError::Duplicate(r.id));
        }
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        let seq = Sequence {
            id,
            prompt_len: r.prompt.len(),
            tokens: r.prompt,
            sampler: Sampler::new(r.params.seed),
            params: r.params,
            criticality: r.criticality,
            route: r.route,
            eos_token_ids: r.eos_token_ids,
            arrival,
            num_computed: 0,
            num_cached_prompt_tokens: 0,
            num_preemptions: 0,
            running: false,
            rank: match self.cfg.policy {
                SchedulingPolicy::Priority => r.criticality,
                SchedulingPolicy::Fcfs => Criticality::Default,
            },
        };
        self.waiting.insert((Reverse(seq.rank), arrival, id));
        self.seqs.insert(id, seq);
        Ok(())
    }

    /// Sequence slots reserved for critical requests at the current `max_num_seqs`.
    pub fn reserve_seqs(&self) -> usize {
        match self.cfg.policy {
            SchedulingPolicy::Fcfs => 0,
            SchedulingPolicy::Priority => {
                reserve_of(self.cfg.max_num_seqs, self.cfg.critical_reserve_ratio)
            }
        }
    }

    /// KV blocks reserved for critical requests.
    pub fn reserve_blocks(&self) -> usize {
        match self.cfg.policy {
            SchedulingPolicy::Fcfs => 0,
            SchedulingPolicy::Priority => {
                reserve_of(self.kv.num_blocks(), self.cfg.critical_reserve_ratio)
            }
        }
    }

    /// Most KV blocks non-critical sequences may hold together (also the most one non-critical
    /// request may ever need).
    pub fn noncritical_block_cap(&self) -> usize {
        self.kv.num_blocks() - self.reserve_blocks()
    }

    fn blocks_held(&self, id: SeqId) -> usize {
        self.kv.block_table(id).map_or(0, <[_]>::len)
    }

    /// Blocks `allocate_slots(id, n)` would add.
    fn new_blocks_for(&self, id: SeqId, computed: usize, n: usize) -> usize {
        (computed + n)
            .div_ceil(self.kv.block_size())
            .saturating_sub(self.blocks_held(id))
    }

    /// Running non-critical sequences and the distinct blocks they hold.
    fn noncritical_usage(&self) -> (usize, NcBlocks) {
        let mut b = NcBlocks::new(self.kv.num_blocks());
        let mut n = 0;
        for id in &self.running {
            if !self.seqs[id].is_critical() {
                n += 1;
                b.add(self.kv.block_table(*id).unwrap_or(&[]));
            }
        }
        (n, b)
    }

    /// The reserve's size and use: slots and blocks held beyond the non-critical share (only
    /// critical requests can be there).
    pub fn reserve_stats(&self) -> ReserveStats {
        let (seqs, blocks) = (self.reserve_seqs(), self.reserve_blocks());
        let used_blocks = self.kv.num_used_blocks();
        ReserveStats {
            seqs,
            seqs_used: (self.running.len() + seqs)
                .saturating_sub(self.cfg.max_num_seqs)
                .min(seqs),
            blocks,
            blocks_used: (used_blocks + blocks)
                .saturating_sub(self.kv.num_blocks())
                .min(blocks),
        }
    }

    fn salt(route: Route) -> u64 {
        match route {
            Route::Primary => 0,
            Route::Fallback => 1,
        }
    }

    fn key_of(&self, id: SeqId) -> Key {
        let s = &self.seqs[&id];
        let (c, a) = s.key();
        (c, a, id)
    }

    /// Frees `id`'s blocks and puts it back in the waiting queue.
    fn preempt(&mut self, id: SeqId) {
        let _ = self.kv.free(id);
        let key = self.key_of(id);
        let s = self.seqs.get_mut(&id).expect("running sequence exists");
        s.num_computed = 0;
        s.num_preemptions += 1;
        s.running = false;
        self.running.retain(|r| *r != id);
        self.waiting.insert(key);
        self.num_preemptions_total += 1;
    }

    fn insert_running(&mut self, id: SeqId) {
        let key = self.key_of(id);
        let pos = self.running.partition_point(|r| self.key_of(*r) < key);
        self.running.insert(pos, id);
        self.seqs.get_mut(&id).expect("exists").running = true;
    }

    /// Plans one step.
    pub fn schedule(&mut self) -> StepPlan {
        let mut plan = StepPlan::default();
        let mut budget = self.cfg.max_num_batched_tokens;
        let nc_block_cap = self.noncritical_block_cap();
        let nc_seq_cap = self.cfg.max_num_seqs - self.reserve_seqs();
        let (mut nc_running, mut nc) = self.noncritical_usage();
        // The critical step guard: a step's tokens non-critical chunks may fill up to.
        let nc_step_tokens = self.guard_tokens();
        let planned = |plan: &StepPlan| plan.chunks.iter().map(|c| c.num_tokens).sum::<usize>();

        // 1. Running sequences, best first.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let (computed, total, critical) = {
                let s = &self.seqs[&id];
                (s.num_computed, s.tokens.len(), s.is_critical())
            };
            let mut n = (total - computed).min(budget);
            if !critical && let Some(cap) = nc_step_tokens {
                // Left out this step (it keeps its blocks), or a shorter prefill chunk.
                n = n.min(cap.saturating_sub(planned(&plan)));
                if n == 0 {
                    i += 1;
                    continue;
                }
            }
            loop {
                let new_blocks = self.new_blocks_for(id, computed, n);
                // A non-critical sequence may not grow into the critical reserve.
                let r = if !critical && nc.distinct + new_blocks > nc_block_cap {
                    Err(KvError::OutOfBlocks(crate::kvcache::OutOfBlocks {
                        needed: new_blocks,
                        free: nc_block_cap.saturating_sub(nc.distinct),
                    }))
                } else {
                    self.kv.allocate_slots(id, n)
                };
                match r {
                    Ok(()) => {
                        if !critical && new_blocks > 0 {
                            let t = self.kv.block_table(id).unwrap_or(&[]);
                            nc.add(&t[t.len() - new_blocks..]);
                        }
                        plan.chunks
                            .push(ScheduledChunk::new(id, computed, n, total));
                        budget -= n;
                        i += 1;
                        break;
                    }
                    Err(KvError::OutOfBlocks(_)) => {
                        let victim = *self.running.last().expect("running is not empty here");
                        if !self.seqs[&victim].is_critical() {
                            nc.remove(self.kv.block_table(victim).unwrap_or(&[]));
                            nc_running -= 1;
                        }
                        self.preempt(victim);
                        plan.preempted.push(victim);
                        if victim == id {
                            break;
                        }
                    }
                    Err(e) => panic!("scheduler invariant: allocate_slots({id}) failed: {e}"),
                }
            }
        }

        // 2. Waiting sequences, best first.
        while budget > 0 {
            let Some(&key) = self.waiting.first() else {
                break;
            };
            let id = key.2;
            if self.running.len() >= self.cfg.max_num_seqs {
                // At the limit, a higher-priority request may displace one lower-priority
                // sequence; above it (the limit was just lowered) everyone waits for the drain.
                if self.running.len() > self.cfg.max_num_seqs
                    || !self.preempt_lower_than(key, &mut plan, &mut budget)
                {
                    break;
                }
                (nc_running, nc) = self.noncritical_usage();
                continue;
            }
            let (prompt_tokens, max_total, route, critical) = {
                let s = &self.seqs[&id];
                (
                    s.tokens.clone(),
                    s.prompt_len + s.params.max_tokens,
                    s.route,
                    s.is_critical(),
                )
            };
            // Non-critical traffic stays out of the reserved slots. Under `priority` every
            // sequence still waiting ranks at most as high as this one, so none is critical.
            if !critical && nc_running >= nc_seq_cap {
                break;
            }
            let nc_room = match nc_step_tokens {
                Some(cap) if !critical => cap.saturating_sub(planned(&plan)),
                _ => usize::MAX,
            };
            if nc_room == 0 {
                // The critical step guard: non-critical requests wait for room.
                break;
            }
            let cached =
                match self
                    .kv
                    .add_sequence(id, &prompt_tokens, max_total, Self::salt(route))
                {
                    Ok(c) => c,
                    Err(KvError::OutOfBlocks(_)) => {
                        if self.preempt_lower_than(key, &mut plan, &mut budget) {
                            (nc_running, nc) = self.noncritical_usage();
                            continue;
                        }
                        break;
                    }
                    Err(e) => panic!(
                        "scheduler invariant: add_sequence({id}) failed after admission: {e}"
                    ),
                };
            let total = prompt_tokens.len();
            let n = (total - cached).min(budget).min(nc_room);
            if let Err(e) = self.kv.allocate_slots(id, n) {
                let _ = self.kv.free(id);
                if matches!(e, KvError::OutOfBlocks(_))
                    && self.preempt_lower_than(key, &mut plan, &mut budget)
                {
                    (nc_running, nc) = self.noncritical_usage();
                    continue;
                }
                break;
            }
            if !critical {
                let t = self.kv.block_table(id).unwrap_or(&[]);
                if nc.distinct + nc.new_among(t) > nc_block_cap {
                    // Its first chunk would reach into the critical reserve: it waits.
                    let _ = self.kv.free(id);
                    break;
                }
                nc.add(t);
                nc_running += 1;
            }
            self.waiting.remove(&key);
            {
                let s = self.seqs.get_mut(&id).expect("exists");
                s.num_computed = cached;
                if s.num_preemptions == 0 {
                    s.num_cached_prompt_tokens = cached;
                }
            }
            self.insert_running(id);
            plan.chunks.push(ScheduledChunk::new(id, cached, n, total));
            budget -= n;
        }
        plan
    }

    /// The critical step guard's token cap for this step: `Some(critical_step_tokens)` under
    /// `priority` while a critical sequence runs or waits, else `None`.
    fn guard_tokens(&self) -> Option<usize> {
        if self.cfg.policy != SchedulingPolicy::Priority || self.cfg.critical_step_tokens == 0 {
            return None;
        }
        let critical_present = self
            .running
            .first()
            .is_some_and(|id| self.seqs[id].is_critical())
            || self
                .waiting
                .first()
                .is_some_and(|k| self.seqs[&k.2].is_critical());
        critical_present.then_some(self.cfg.critical_step_tokens)
    }

    /// Changes the critical step guard (0: off).
    pub fn set_critical_step_tokens(&mut self, n: usize) {
        self.cfg.critical_step_tokens = n;
    }

    /// Preempts the lowest-priority running sequence if it ranks strictly below `key` (undoing
    /// its chunk this step). Returns whether it did.
    fn preempt_lower_than(&mut self, key: Key, plan: &mut StepPlan, budget: &mut usize) -> bool {
        let Some(&victim) = self.running.last() else {
            return false;
        };
        let vk = self.key_of(victim);
        // Smaller keys rank higher; only a strictly lower criticality yields its place.
        if vk.0 <= key.0 {
            return false;
        }
        if let Some(pos) = plan.chunks.iter().position(|c| c.seq == victim) {
            *budget += plan.chunks[pos].num_tokens;
            plan.chunks.remove(pos);
        }
        self.preempt(victim);
        plan.preempted.push(victim);
        true
    }

    /// Records that the model ran `chunk`.
    pub fn chunk_done(&mut self, chunk: &ScheduledChunk) {
        let s = self
            .seqs
            .get_mut(&chunk.seq)
            .expect("scheduled sequence exists");
        debug_assert_eq!(s.num_computed, chunk.start_pos);
        s.num_computed += chunk.num_tokens;
        self.kv
            .mark_computed(chunk.seq, chunk.num_tokens)
            .expect("scheduled sequence has blocks");
    }

    /// Appends a sampled token; returns the finish reason if the sequence is now done (EOS,
    /// `max_tokens`, `max_model_len`). Stop strings are the caller's (it has the tokenizer).
    pub fn append_token(&mut self, id: SeqId, tok: u32) -> Option<FinishReason> {
        let max_model_len = self.cfg.max_model_len;
        let s = self.seqs.get_mut(&id)?;
        s.tokens.push(tok);
        let _ = self.kv.append_tokens(id, &[tok]);
        if !s.params.ignore_eos && s.eos_token_ids.contains(&tok) {
            return Some(FinishReason::Stop);
        }
        if s.output().len() >= s.params.max_tokens || s.tokens.len() >= max_model_len {
            return Some(FinishReason::Length);
        }
        None
    }

    /// Removes a sequence (finished or aborted), freeing its blocks.
    pub fn remove(&mut self, id: SeqId) -> Option<Sequence> {
        let s = self.seqs.remove(&id)?;
        self.waiting.remove(&(Reverse(s.rank), s.arrival, id));
        self.running.retain(|r| *r != id);
        let _ = self.kv.free(id);
        Some(s)
    }

    /// Waiting ids in priority order.
    pub fn waiting_ids(&self) -> Vec<SeqId> {
        self.waiting.iter().map(|k| k.2).collect()
    }
}
