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
//! Priority: criticality (critical > default > sheddable), then arrival order.

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};

use brownout_protocol::Criticality;

use super::sampling::{Sampler, SamplingParams};
use crate::kvcache::{KvCacheManager, KvError, SeqId};
use crate::model::Route;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_model_len: usize,
}

impl Default for SchedulerConfig {
    fn default() -> SchedulerConfig {
        SchedulerConfig {
            max_num_seqs: 64,
            max_num_batched_tokens: 512,
            max_model_len: 2048,
        }
    }
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
}

impl Sequence {
    pub fn output(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }
    fn key(&self) -> (Reverse<Criticality>, u64) {
        (Reverse(self.criticality), self.arrival)
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
        };
        self.waiting.insert((Reverse(seq.criticality), arrival, id));
        self.seqs.insert(id, seq);
        Ok(())
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

        // 1. Running sequences, best first.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let (computed, total) = {
                let s = &self.seqs[&id];
                (s.num_computed, s.tokens.len())
            };
            let n = (total - computed).min(budget);
            loop {
                match self.kv.allocate_slots(id, n) {
                    Ok(()) => {
                        plan.chunks.push(ScheduledChunk {
                            seq: id,
                            start_pos: computed,
                            num_tokens: n,
                            samples: computed + n == total,
                        });
                        budget -= n;
                        i += 1;
                        break;
                    }
                    Err(KvError::OutOfBlocks(_)) => {
                        let victim = *self.running.last().expect("running is not empty here");
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
                continue;
            }
            let (prompt_tokens, max_total, route) = {
                let s = &self.seqs[&id];
                (
                    s.tokens.clone(),
                    s.prompt_len + s.params.max_tokens,
                    s.route,
                )
            };
            let cached =
                match self
                    .kv
                    .add_sequence(id, &prompt_tokens, max_total, Self::salt(route))
                {
                    Ok(c) => c,
                    Err(KvError::OutOfBlocks(_)) => {
                        if self.preempt_lower_than(key, &mut plan, &mut budget) {
                            continue;
                        }
                        break;
                    }
                    Err(e) => panic!(
                        "scheduler invariant: add_sequence({id}) failed after admission: {e}"
                    ),
                };
            let total = prompt_tokens.len();
            let n = (total - cached).min(budget);
            if let Err(e) = self.kv.allocate_slots(id, n) {
                let _ = self.kv.free(id);
                if matches!(e, KvError::OutOfBlocks(_))
                    && self.preempt_lower_than(key, &mut plan, &mut budget)
                {
                    continue;
                }
                break;
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
            plan.chunks.push(ScheduledChunk {
                seq: id,
                start_pos: cached,
                num_tokens: n,
                samples: cached + n == total,
            });
            budget -= n;
        }
        plan
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
        self.waiting
            .remove(&(Reverse(s.criticality), s.arrival, id));
        self.running.retain(|r| *r != id);
        let _ = self.kv.free(id);
        Some(s)
    }

    /// Waiting ids in priority order.
    pub fn waiting_ids(&self) -> Vec<SeqId> {
        self.waiting.iter().map(|k| k.2).collect()
    }
}
