//! The KV cache manager: per-sequence block tables over a [`BlockPool`] (paged) or a
//! [`ContiguousPool`] (baseline), prefix caching, and the fragmentation figures.
//!
//! Lifecycle of a sequence, as the scheduler drives it:
//!
//! ```text
//! add_sequence(prompt)      prefix hits are taken (full blocks only); returns cached tokens
//! allocate_slots(n)         room for the next n tokens (a prefill chunk or one decode token)
//!   ... model forward writes K/V for those tokens through block_table() ...
//! mark_computed(n)          newly full blocks are hashed into the prefix cache
//! append_tokens([t])        a sampled token joins the sequence (its K/V comes next step)
//! free()                    blocks go back, tail first, so prefixes are evicted last
//! ```

use std::collections::HashMap;

use brownout_protocol::KvStats;

use super::block::{BlockHash, BlockId, SeqId};
use super::contiguous::ContiguousPool;
use super::pool::{BlockPool, OutOfBlocks};

/// How KV blocks are handed out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AllocMode {
    /// Blocks on demand, anywhere (PagedAttention).
    #[default]
    Paged,
    /// One region of `prompt + max_tokens` reserved up front, first fit (baseline).
    Contiguous,
}

impl AllocMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AllocMode::Paged => "paged",
            AllocMode::Contiguous => "contiguous",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvConfig {
    pub num_blocks: usize,
    pub block_size: usize,
    pub mode: AllocMode,
    pub enable_prefix_caching: bool,
}

impl Default for KvConfig {
    fn default() -> KvConfig {
        KvConfig {
            num_blocks: 1024,
            block_size: 16,
            mode: AllocMode::Paged,
            enable_prefix_caching: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    #[error(transparent)]
    OutOfBlocks(#[from] OutOfBlocks),
    #[error("sequence {0} already has KV blocks")]
    DuplicateSequence(SeqId),
    #[error("sequence {0} has no KV blocks")]
    UnknownSequence(SeqId),
    #[error("{tokens} tokens need {needed} blocks but the pool has {total}")]
    NeverFits {
        tokens: usize,
        needed: usize,
        total: usize,
    },
    #[error("slots requested for {requested} tokens but the sequence holds {held}")]
    SlotsBeyondTokens { requested: usize, held: usize },
    #[error("fork is not supported in contiguous mode")]
    ForkUnsupported,
}

#[derive(Debug, Clone)]
struct SeqBlocks {
    blocks: Vec<BlockId>,
    tokens: Vec<u32>,
    /// Tokens whose K/V is written.
    num_computed: usize,
    /// Tokens with a slot (`num_computed` plus those scheduled this step).
    num_slotted: usize,
    /// Leading blocks already offered to the prefix cache.
    num_hashed_blocks: usize,
    last_hash: Option<BlockHash>,
    salt: u64,
}

/// One sequence's view for `/debug/kv`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SeqKvInfo {
    pub seq_id: u64,
    pub blocks: Vec<u32>,
    pub num_tokens: usize,
    pub num_computed_tokens: usize,
    /// Empty slots in the last token-holding block.
    pub slack_tokens: usize,
    /// Whole blocks held beyond the last token (contiguous reservations).
    pub reserved_unused_blocks: usize,
}

#[derive(Debug, Clone)]
enum Backend {
    Paged(BlockPool),
    Contiguous(ContiguousPool),
}

#[derive(Debug, Clone)]
pub struct KvCacheManager {
    cfg: KvConfig,
    backend: Backend,
    seqs: HashMap<SeqId, SeqBlocks>,
    /// Prompt tokens looked up in the prefix cache (vLLM's `prefix_cache_queries`).
    pub prefix_queries_tokens: u64,
    /// Of those, tokens found (vLLM's `prefix_cache_hits`).
    pub prefix_hits_tokens: u64,
}

impl KvCacheManager {
    /// # Panics
    /// If `block_size` is 0.
    pub fn new(cfg: KvConfig) -> KvCacheManager {
        let backend = match cfg.mode {
            AllocMode::Paged => Backend::Paged(BlockPool::new(cfg.num_blocks, cfg.block_size)),
            AllocMode::Contiguous => {
                assert!(cfg.block_size > 0, "block_size must be positive");
                Backend::Contiguous(ContiguousPool::new(cfg.num_blocks))
            }
        };
        KvCacheManager {
            cfg,
            backend,
            seqs: HashMap::new(),
            prefix_queries_tokens: 0,
            prefix_hits_tokens: 0,
        }
    }

    pub fn config(&self) -> KvConfig {
        self.cfg
    }
    pub fn block_size(&self) -> usize {
        self.cfg.block_size
    }
    pub fn num_blocks(&self) -> usize {
        self.cfg.num_blocks
    }
    pub fn num_free_blocks(&self) -> usize {
        match &self.backend {
            Backend::Paged(p) => p.num_free(),
            Backend::Contiguous(c) => c.num_free(),
        }
    }
    pub fn num_used_blocks(&self) -> usize {
        self.num_blocks() - self.num_free_blocks()
    }
    pub fn num_sequences(&self) -> usize {
        self.seqs.len()
    }
    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.cfg.block_size)
    }
    pub fn pool(&self) -> Option<&BlockPool> {
        match &self.backend {
            Backend::Paged(p) => Some(p),
            Backend::Contiguous(_) => None,
        }
    }
    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// Registers `seq` with its prompt. Paged: takes the longest cached prefix of full blocks
    /// (never the whole prompt: the last token is always computed, for its logits). Contiguous:
    /// reserves `min(max_total_tokens)` worth of consecutive blocks now. Returns the number of
    /// prompt tokens whose K/V is already cached.
    ///
    /// # Errors
    /// `DuplicateSequence`; `NeverFits` when the sequence could not fit in an empty pool;
    /// `OutOfBlocks` (contiguous) when no free run is long enough — nothing is changed.
    pub fn add_sequence(
        &mut self,
        seq: SeqId,
        prompt: &[u32],
        max_total_tokens: usize,
        salt: u64,
    ) -> Result<usize, KvError> {
        if self.seqs.contains_key(&seq) {
            return Err(KvError::DuplicateSequence(seq));
        }
        let bs = self.cfg.block_size;
        let total = max_total_tokens.max(prompt.len());
        let needed = self.blocks_for(total);
        if needed > self.cfg.num_blocks {
            return Err(KvError::NeverFits {
                tokens: total,
                needed,
                total: self.cfg.num_blocks,
            });
        }
        let mut st = SeqBlocks {
            blocks: Vec::new(),
            tokens: prompt.to_vec(),
            num_computed: 0,
            num_slotted: 0,
            num_hashed_blocks: 0,
            last_hash: None,
            salt,
        };
        match &mut self.backend {
            Backend::Paged(pool) => {
                if self.cfg.enable_prefix_caching {
                    self.prefix_queries_tokens += prompt.len() as u64;
                    let max_hit_blocks = prompt.len().saturating_sub(1) / bs;
                    for chunk in prompt.chunks_exact(bs).take(max_hit_blocks) {
                        let h = BlockHash::chain(st.last_hash, chunk, salt);
                        let Some(b) = pool.lookup(h) else { break };
                        pool.touch(b);
                        st.blocks.push(b);
                        st.last_hash = Some(h);
                    }
                    st.num_hashed_blocks = st.blocks.len();
                    st.num_computed = st.blocks.len() * bs;
                    st.num_slotted = st.num_computed;
                    self.prefix_hits_tokens += st.num_computed as u64;
                }
            }
            Backend::Contiguous(c) => {
                let start = c.allocate(needed)?;
                st.blocks
                    .extend(ContiguousPool::region_blocks(start, needed));
            }
        }
        let cached = st.num_computed;
        self.seqs.insert(seq, st);
        Ok(cached)
    }

    /// Makes room for the next `num_new_tokens` of `seq` (which must already hold them).
    /// All or nothing.
    ///
    /// # Errors
    /// `OutOfBlocks` when the pool cannot give the blocks (the caller preempts or waits);
    /// `UnknownSequence`; `SlotsBeyondTokens`.
    pub fn allocate_slots(&mut self, seq: SeqId, num_new_tokens: usize) -> Result<(), KvError> {
        let bs = self.cfg.block_size;
        let st = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        let target = st.num_computed + num_new_tokens;
        if target > st.tokens.len() {
            return Err(KvError::SlotsBeyondTokens {
                requested: target,
                held: st.tokens.len(),
            });
        }
        let needed = target.div_ceil(bs).saturating_sub(st.blocks.len());
        if needed > 0 {
            match &mut self.backend {
                Backend::Paged(pool) => pool.allocate_into(needed, &mut st.blocks)?,
                Backend::Contiguous(c) => {
                    return Err(OutOfBlocks {
                        needed,
                        free: c.num_free(),
                    }
                    .into());
                }
            }
        }
        st.num_slotted = st.num_slotted.max(target);
        Ok(())
    }

    /// Records that the model wrote K/V for the next `n` slotted tokens; full blocks join the
    /// prefix cache.
    ///
    /// # Panics
    /// If `n` exceeds the slotted tokens (a broken invariant in the caller).
    pub fn mark_computed(&mut self, seq: SeqId, n: usize) -> Result<(), KvError> {
        let bs = self.cfg.block_size;
        let st = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        assert!(
            st.num_computed + n <= st.num_slotted,
            "{seq}: computed past its slots"
        );
        st.num_computed += n;
        if let (Backend::Paged(pool), true) = (&mut self.backend, self.cfg.enable_prefix_caching) {
            let full = st.num_computed / bs;
            while st.num_hashed_blocks < full {
                let i = st.num_hashed_blocks;
                let h = BlockHash::chain(st.last_hash, &st.tokens[i * bs..(i + 1) * bs], st.salt);
                pool.cache_full_block(st.blocks[i], h);
                st.last_hash = Some(h);
                st.num_hashed_blocks += 1;
            }
        }
        Ok(())
    }

    /// Adds sampled tokens to `seq` (no slots yet).
    pub fn append_tokens(&mut self, seq: SeqId, tokens: &[u32]) -> Result<(), KvError> {
        let st = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        st.tokens.extend_from_slice(tokens);
        Ok(())
    }

    /// `child` shares `parent`'s full blocks; a partly filled last block is copied into a fresh
    /// block. Returns `(src, dst)` for that copy, which the model must perform.
    ///
    /// # Errors
    /// `OutOfBlocks` when the copy block cannot be had (nothing changed), `ForkUnsupported`
    /// in contiguous mode, `UnknownSequence`, `DuplicateSequence`.
    pub fn fork(
        &mut self,
        parent: SeqId,
        child: SeqId,
    ) -> Result<Option<(BlockId, BlockId)>, KvError> {
        if self.seqs.contains_key(&child) {
            return Err(KvError::DuplicateSequence(child));
        }
        let bs = self.cfg.block_size;
        let Backend::Paged(pool) = &mut self.backend else {
            return Err(KvError::ForkUnsupported);
        };
        let p = self
            .seqs
            .get(&parent)
            .ok_or(KvError::UnknownSequence(parent))?;
        let full = p.num_slotted / bs;
        let mut st = p.clone();
        st.blocks.truncate(full);
        let mut copy = None;
        if p.blocks.len() > full {
            let mut fresh = Vec::with_capacity(1);
            pool.allocate_into(1, &mut fresh)?;
            copy = Some((p.blocks[full], fresh[0]));
            st.blocks.push(fresh[0]);
            // Blocks past the partial one (none in paged mode) are not shared.
        }
        for &b in &st.blocks[..full] {
            pool.touch(b);
        }
        self.seqs.insert(child, st);
        Ok(copy)
    }

    /// Releases `seq`'s blocks, last block first (so a shared prefix is evicted last).
    pub fn free(&mut self, seq: SeqId) -> Result<(), KvError> {
        let st = self
            .seqs
            .remove(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        match &mut self.backend {
            Backend::Paged(pool) => pool.free(st.blocks.iter().rev().copied()),
            Backend::Contiguous(c) => {
                if let Some(first) = st.blocks.first() {
                    c.free(first.0);
                }
            }
        }
        Ok(())
    }

    pub fn block_table(&self, seq: SeqId) -> Option<&[BlockId]> {
        self.seqs.get(&seq).map(|s| s.blocks.as_slice())
    }
    pub fn num_computed(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq).map(|s| s.num_computed)
    }
    pub fn num_tokens(&self, seq: SeqId) -> Option<usize> {
        self.seqs.get(&seq).map(|s| s.tokens.len())
    }

    /// Drops up to `max` cached-but-free prefix blocks (paged); returns how many.
    pub fn evict_cached(&mut self, max: usize) -> usize {
        match &mut self.backend {
            Backend::Paged(pool) => pool.evict_cached(max),
            Backend::Contiguous(_) => 0,
        }
    }

    /// Per-physical-block fill: the most tokens any holder keeps in it.
    fn block_fill(&self) -> Vec<u32> {
        let bs = self.cfg.block_size;
        let mut fill = vec![0u32; self.cfg.num_blocks];
        for st in self.seqs.values() {
            for (i, b) in st.blocks.iter().enumerate() {
                let f = st.num_slotted.saturating_sub(i * bs).min(bs) as u32;
                let slot = &mut fill[b.index()];
                *slot = (*slot).max(f);
            }
        }
        fill
    }

    /// The KV figures of docs/ARCHITECTURE.md §5, over physical blocks.
    pub fn stats(&self) -> KvStats {
        let bs = self.cfg.block_size;
        let n = self.cfg.num_blocks;
        let used = self.num_used_blocks();
        let mut held = vec![false; n];
        for st in self.seqs.values() {
            for b in &st.blocks {
                held[b.index()] = true;
            }
        }
        let fill = self.block_fill();
        let (mut slack, mut reserved) = (0usize, 0usize);
        for (i, &f) in fill.iter().enumerate() {
            if !held[i] {
                continue;
            }
            match f as usize {
                0 => reserved += bs,
                f if f < bs => slack += bs - f,
                _ => {}
            }
        }
        let cap = (used * bs) as f64;
        let ratio = |x: usize| if cap == 0.0 { 0.0 } else { x as f64 / cap };
        let external = match &self.backend {
            Backend::Paged(_) => 0.0,
            Backend::Contiguous(c) => {
                let free = c.num_free();
                if free == 0 {
                    0.0
                } else {
                    1.0 - c.largest_free_run() as f64 / free as f64
                }
            }
        };
        KvStats {
            block_size: bs as u32,
            num_blocks_total: n as u64,
            num_blocks_used: used as u64,
            usage_ratio: if n == 0 { 0.0 } else { used as f64 / n as f64 },
            internal_fragmentation_ratio: ratio(slack),
            reserved_unused_ratio: ratio(reserved),
            token_occupancy_ratio: if cap == 0.0 {
                1.0
            } else {
                1.0 - ratio(slack) - ratio(reserved)
            },
            external_fragmentation_ratio: external,
        }
    }

    /// Every sequence's blocks and slack (for `/debug/kv`), sorted by id.
    pub fn seq_infos(&self) -> Vec<SeqKvInfo> {
        let bs = self.cfg.block_size;
        let mut v: Vec<SeqKvInfo> = self
            .seqs
            .iter()
            .map(|(id, st)| {
                let used_blocks = st.num_slotted.div_ceil(bs);
                SeqKvInfo {
                    seq_id: id.0,
                    blocks: st.blocks.iter().map(|b| b.0).collect(),
                    num_tokens: st.tokens.len(),
                    num_computed_tokens: st.num_computed,
                    slack_tokens: used_blocks * bs - st.num_slotted,
                    reserved_unused_blocks: st.blocks.len().saturating_sub(used_blocks),
                }
            })
            .collect();
        v.sort_by_key(|s| s.seq_id);
        v
    }

    /// Checks every cross-structure invariant; returns the first broken one.
    pub fn check_invariants(&self) -> Result<(), String> {
        let bs = self.cfg.block_size;
        match &self.backend {
            Backend::Paged(pool) => {
                pool.check_invariants()?;
                let mut refs = vec![0u32; pool.num_blocks()];
                for st in self.seqs.values() {
                    for b in &st.blocks {
                        refs[b.index()] += 1;
                    }
                    if st.blocks.len() != st.num_slotted.div_ceil(bs) {
                        return Err(format!(
                            "{} blocks for {} slotted tokens",
                            st.blocks.len(),
                            st.num_slotted
                        ));
                    }
                    for (i, b) in st.blocks.iter().enumerate() {
                        if pool.hash_of(*b).is_some() && st.num_computed < (i + 1) * bs {
                            return Err(format!("block {b} is hashed but not full for a holder"));
                        }
                    }
                }
                for (i, &r) in refs.iter().enumerate() {
                    let b = BlockId(i as u32);
                    if pool.ref_count(b) != r {
                        return Err(format!(
                            "block {b}: ref count {} but {r} block-table entries",
                            pool.ref_count(b)
                        ));
                    }
                    if r > 0 && pool.free_queue().any(|f| f == b) {
                        return Err(format!("block {b} is both free and referenced"));
                    }
                }
            }
            Backend::Contiguous(c) => {
                let held: usize = self.seqs.values().map(|s| s.blocks.len()).sum();
                if held != c.num_used() {
                    return Err(format!(
                        "{held} blocks in tables but {} reserved",
                        c.num_used()
                    ));
                }
            }
        }
        if self.num_free_blocks() + self.num_used_blocks() != self.num_blocks() {
            return Err("free + used != total".into());
        }
        Ok(())
    }
}
