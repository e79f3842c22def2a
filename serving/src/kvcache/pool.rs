//! The block pool: ref counts, the free-block queue and the prefix-cache hash map.
//!
//! Invariants (checked by [`BlockPool::check_invariants`] in tests):
//! - a block is in the free queue iff its ref count is 0;
//! - `hash_to_block[h] == b` implies `block_hash[b] == Some(h)` (only full blocks get a hash);
//! - a free block may keep its hash ("cached"): a prefix hit takes it back out of the queue;
//!   allocation pops the queue head and evicts its hash (least recently freed first).

use std::collections::HashMap;

use super::block::{BlockHash, BlockId};
use super::free_queue::FreeQueue;

/// Not enough free blocks for the request; nothing was changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("out of KV blocks: needed {needed}, {free} free")]
pub struct OutOfBlocks {
    pub needed: usize,
    pub free: usize,
}

#[derive(Debug, Clone)]
pub struct BlockPool {
    block_size: usize,
    ref_cnt: Vec<u32>,
    block_hash: Vec<Option<BlockHash>>,
    free: FreeQueue,
    hash_to_block: HashMap<BlockHash, BlockId>,
    /// Cached blocks whose hash was dropped to make room (vLLM's eviction count).
    num_evictions: u64,
}

impl BlockPool {
    /// # Panics
    /// If `block_size` is 0.
    pub fn new(num_blocks: usize, block_size: usize) -> BlockPool {
        assert!(block_size > 0, "block_size must be positive");
        BlockPool {
            block_size,
            ref_cnt: vec![0; num_blocks],
            block_hash: vec![None; num_blocks],
            free: FreeQueue::full(num_blocks),
            hash_to_block: HashMap::new(),
            num_evictions: 0,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }
    pub fn num_blocks(&self) -> usize {
        self.ref_cnt.len()
    }
    pub fn num_free(&self) -> usize {
        self.free.len()
    }
    pub fn num_used(&self) -> usize {
        self.num_blocks() - self.free.len()
    }
    pub fn num_cached(&self) -> usize {
        self.hash_to_block.len()
    }
    pub fn num_evictions(&self) -> u64 {
        self.num_evictions
    }
    pub fn ref_count(&self, b: BlockId) -> u32 {
        self.ref_cnt[b.index()]
    }
    pub fn hash_of(&self, b: BlockId) -> Option<BlockHash> {
        self.block_hash[b.index()]
    }
    /// Free blocks in eviction order (head first).
    pub fn free_queue(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.free.iter()
    }

    /// Takes `n` blocks from the head of the free queue (ref count 1 each), appending them to
    /// `out`. All or nothing.
    ///
    /// # Errors
    /// [`OutOfBlocks`] when fewer than `n` blocks are free.
    pub fn allocate_into(&mut self, n: usize, out: &mut Vec<BlockId>) -> Result<(), OutOfBlocks> {
        if n > self.free.len() {
            return Err(OutOfBlocks {
                needed: n,
                free: self.free.len(),
            });
        }
        out.reserve(n);
        for _ in 0..n {
            let b = self
                .free
                .pop_front()
                .expect("free queue length checked above");
            self.evict_hash(b);
            self.ref_cnt[b.index()] = 1;
            out.push(b);
        }
        Ok(())
    }

    /// # Errors
    /// [`OutOfBlocks`] when fewer than `n` blocks are free.
    pub fn allocate(&mut self, n: usize) -> Result<Vec<BlockId>, OutOfBlocks> {
        let mut v = Vec::with_capacity(n);
        self.allocate_into(n, &mut v)?;
        Ok(v)
    }

    fn evict_hash(&mut self, b: BlockId) {
        if let Some(h) = self.block_hash[b.index()].take() {
            if self.hash_to_block.get(&h) == Some(&b) {
                self.hash_to_block.remove(&h);
            }
            self.num_evictions += 1;
        }
    }

    /// One more reference to `b` (a prefix hit or a fork); a free cached block leaves the queue.
    pub fn touch(&mut self, b: BlockId) {
        if self.ref_cnt[b.index()] == 0 {
            self.free.remove(b);
        }
        self.ref_cnt[b.index()] += 1;
    }

    /// Drops one reference to each block, in the order given; blocks reaching 0 go to the tail
    /// of the free queue, keeping their hash (still hit-able until evicted).
    ///
    /// # Panics
    /// If a block's ref count is already 0 (freed twice).
    pub fn free<I: IntoIterator<Item = BlockId>>(&mut self, blocks: I) {
        for b in blocks {
            let rc = &mut self.ref_cnt[b.index()];
            assert!(*rc > 0, "block {b} freed with ref count 0");
            *rc -= 1;
            if *rc == 0 {
                self.free.push_back(b);
            }
        }
    }

    /// The cached block for `h`, if any (used or free).
    pub fn lookup(&self, h: BlockHash) -> Option<BlockId> {
        self.hash_to_block.get(&h).copied()
    }

    /// Records that `b` (in use, full) holds the block hashing to `h`. If another block already
    /// holds `h`, the map keeps it (no dedupe), and `b` stays unhashed.
    pub fn cache_full_block(&mut self, b: BlockId, h: BlockHash) {
        debug_assert!(self.ref_cnt[b.index()] > 0, "caching a free block {b}");
        if self.block_hash[b.index()].is_some() {
            return;
        }
        if let std::collections::hash_map::Entry::Vacant(e) = self.hash_to_block.entry(h) {
            e.insert(b);
            self.block_hash[b.index()] = Some(h);
        }
    }

    /// Drops the hashes of up to `max` free cached blocks, in eviction order. Returns how many.
    pub fn evict_cached(&mut self, max: usize) -> usize {
        let victims: Vec<BlockId> = self
            .free
            .iter()
            .filter(|b| self.block_hash[b.index()].is_some())
            .take(max)
            .collect();
        for &b in &victims {
            self.evict_hash(b);
        }
        victims.len()
    }

    /// Checks the pool's own invariants; returns the first broken one.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.num_free() + self.num_used() != self.num_blocks() {
            return Err("free + used != total".into());
        }
        let queued: usize = self.free.iter().count();
        if queued != self.free.len() {
            return Err(format!(
                "free queue length {} but {queued} linked",
                self.free.len()
            ));
        }
        for (i, &rc) in self.ref_cnt.iter().enumerate() {
            let b = BlockId(i as u32);
            if (rc == 0) != self.free.contains(b) {
                return Err(format!(
                    "block {b} ref {rc} but queued={}",
                    self.free.contains(b)
                ));
            }
        }
        for (h, b) in &self.hash_to_block {
            if self.block_hash[b.index()] != Some(*h) {
                return Err(format!(
                    "hash map points at {b} whose hash is {:?}",
                    self.block_hash[b.index()]
                ));
            }
        }
        for (i, h) in self.block_hash.iter().enumerate() {
            if let Some(h) = h
                && self.hash_to_block.get(h) != Some(&BlockId(i as u32))
            {
                return Err(format!(
                    "block #{i} has a hash the map does not point back from"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[BlockId]) -> Vec<u32> {
        v.iter().map(|b| b.0).collect()
    }

    #[test]
    fn allocation_is_all_or_nothing() {
        let mut p = BlockPool::new(4, 16);
        let a = p.allocate(3).unwrap();
        assert_eq!(ids(&a), [0, 1, 2]);
        assert_eq!(p.allocate(2), Err(OutOfBlocks { needed: 2, free: 1 }));
        assert_eq!(p.num_free(), 1);
        p.free(a);
        assert_eq!(p.num_free(), 4);
        p.check_invariants().unwrap();
    }

    #[test]
    fn lru_evicts_least_recently_freed_cached_block_first() {
        let mut p = BlockPool::new(4, 2);
        let a = p.allocate(4).unwrap();
        for (i, &b) in a.iter().enumerate() {
            p.cache_full_block(b, BlockHash(100 + i as u64));
        }
        // Free in the order 2, 0, 3, 1: the queue is exactly that order.
        p.free([a[2], a[0], a[3], a[1]]);
        assert_eq!(
            p.free_queue().map(|b| b.0).collect::<Vec<_>>(),
            [2, 0, 3, 1]
        );
        // A prefix hit on block 0 takes it out of the middle of the queue.
        assert_eq!(p.lookup(BlockHash(100)), Some(BlockId(0)));
        p.touch(BlockId(0));
        assert_eq!(p.free_queue().map(|b| b.0).collect::<Vec<_>>(), [2, 3, 1]);
        // Allocating two evicts 2 then 3, exactly.
        assert_eq!(ids(&p.allocate(2).unwrap()), [2, 3]);
        assert_eq!(p.lookup(BlockHash(102)), None);
        assert_eq!(p.lookup(BlockHash(103)), None);
        assert_eq!(p.lookup(BlockHash(101)), Some(BlockId(1)));
        assert_eq!(p.num_evictions(), 2);
        // Freeing the hit block puts it behind 1.
        p.free([BlockId(0)]);
        assert_eq!(p.free_queue().map(|b| b.0).collect::<Vec<_>>(), [1, 0]);
        p.check_invariants().unwrap();
    }

    #[test]
    fn duplicate_hash_keeps_first_holder() {
        let mut p = BlockPool::new(2, 2);
        let a = p.allocate(2).unwrap();
        p.cache_full_block(a[0], BlockHash(7));
        p.cache_full_block(a[1], BlockHash(7));
        assert_eq!(p.lookup(BlockHash(7)), Some(a[0]));
        assert_eq!(p.hash_of(a[1]), None);
        p.check_invariants().unwrap();
    }

    #[test]
    fn evict_cached_drops_hashes_in_queue_order() {
        let mut p = BlockPool::new(3, 1);
        let a = p.allocate(3).unwrap();
        for (i, &b) in a.iter().enumerate() {
            p.cache_full_block(b, BlockHash(i as u64));
        }
        p.free([a[1], a[2], a[0]]);
        assert_eq!(p.evict_cached(2), 2);
        assert_eq!(p.lookup(BlockHash(1)), None);
        assert_eq!(p.lookup(BlockHash(2)), None);
        assert_eq!(p.lookup(BlockHash(0)), Some(a[0]));
        p.check_invariants().unwrap();
    }
}
