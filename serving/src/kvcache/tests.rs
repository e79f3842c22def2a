//! Manager tests: exact block ids, prefix hits, eviction order, stats, and the proptest model check.

use proptest::prelude::*;

use super::*;

fn mgr(num_blocks: usize, block_size: usize) -> KvCacheManager {
    KvCacheManager::new(KvConfig {
        num_blocks,
        block_size,
        mode: AllocMode::Paged,
        enable_prefix_caching: true,
    })
}

fn ids(v: &[BlockId]) -> Vec<u32> {
    v.iter().map(|b| b.0).collect()
}

/// Prefill all of a prompt in one step.
fn prefill(m: &mut KvCacheManager, seq: SeqId, prompt: &[u32]) -> Result<usize, KvError> {
    let cached = m.add_sequence(seq, prompt, prompt.len(), 0)?;
    let n = prompt.len() - cached;
    m.allocate_slots(seq, n)?;
    m.mark_computed(seq, n)?;
    Ok(cached)
}

#[test]
fn prefix_hit_shares_full_blocks_only_and_never_the_last_token() {
    let mut m = mgr(8, 4);
    let p: Vec<u32> = (0..10).collect(); // 2 full blocks + 2 tokens
    assert_eq!(prefill(&mut m, SeqId(1), &p).unwrap(), 0);
    assert_eq!(ids(m.block_table(SeqId(1)).unwrap()), [0, 1, 2]);
    // Same prompt again: both full blocks hit, the tail is new.
    assert_eq!(prefill(&mut m, SeqId(2), &p).unwrap(), 8);
    assert_eq!(ids(m.block_table(SeqId(2)).unwrap()), [0, 1, 3]);
    assert_eq!(m.pool().unwrap().ref_count(BlockId(0)), 2);
    // A prompt of exactly 2 full blocks reuses only the first: its last token must be computed.
    assert_eq!(prefill(&mut m, SeqId(3), &p[..8]).unwrap(), 4);
    assert_eq!(ids(m.block_table(SeqId(3)).unwrap()), [0, 4]);
    // A different first block misses everything after it (chained hashes).
    let mut q = p.clone();
    q[0] = 99;
    assert_eq!(prefill(&mut m, SeqId(4), &q).unwrap(), 0);
    assert_eq!(m.prefix_queries_tokens, 38);
    assert_eq!(m.prefix_hits_tokens, 12);
    m.check_invariants().unwrap();
}

#[test]
fn freed_sequence_blocks_are_evicted_tail_first_in_lru_order() {
    let mut m = mgr(6, 2);
    prefill(&mut m, SeqId(1), &[1, 2, 3, 4, 5, 6]).unwrap(); // blocks 0 1 2
    prefill(&mut m, SeqId(2), &[7, 8, 9, 10, 11]).unwrap(); // blocks 3 4 5 (5 partial)
    m.free(SeqId(2)).unwrap();
    m.free(SeqId(1)).unwrap();
    // Each sequence frees last block first; seq 2 was freed earlier so it goes first.
    let order: Vec<u32> = m.pool().unwrap().free_queue().map(|b| b.0).collect();
    assert_eq!(order, [5, 4, 3, 2, 1, 0]);
    // A new 4-token sequence takes the 2 oldest: 5 (uncached) and 4 (cached [9,10]: evicted).
    prefill(&mut m, SeqId(3), &[50, 51, 52, 53]).unwrap();
    assert_eq!(ids(m.block_table(SeqId(3)).unwrap()), [5, 4]);
    // Seq 1's prefix is still cached: a hit takes blocks 0 and 1 back out of the queue.
    assert_eq!(
        prefill(&mut m, SeqId(4), &[1, 2, 3, 4, 5, 6, 0]).unwrap(),
        6
    );
    assert_eq!(ids(m.block_table(SeqId(4)).unwrap()), [0, 1, 2, 3]);
    // [7,8] (block 3) was evicted by that last allocation.
    assert_eq!(
        prefill(&mut m, SeqId(5), &[7, 8, 9]).unwrap_err(),
        KvError::OutOfBlocks(OutOfBlocks { needed: 2, free: 0 })
    );
    m.check_invariants().unwrap();
}

#[test]
fn out_of_blocks_changes_nothing_and_never_fits_is_reported() {
    let mut m = mgr(4, 4);
    m.add_sequence(SeqId(1), &[0; 12], 12, 0).unwrap();
    m.allocate_slots(SeqId(1), 12).unwrap();
    m.add_sequence(SeqId(2), &[1; 8], 8, 0).unwrap();
    assert_eq!(
        m.allocate_slots(SeqId(2), 8),
        Err(KvError::OutOfBlocks(OutOfBlocks { needed: 2, free: 1 }))
    );
    assert_eq!(m.block_table(SeqId(2)).unwrap().len(), 0);
    assert_eq!(m.num_free_blocks(), 1);
    assert_eq!(
        m.add_sequence(SeqId(3), &[1; 8], 17, 0),
        Err(KvError::NeverFits {
            tokens: 17,
            needed: 5,
            total: 4
        })
    );
    m.check_invariants().unwrap();
}

#[test]
fn stats_measure_slack_and_reservation() {
    // Paged: 10 tokens in blocks of 4 → 3 blocks, 2 slots of slack.
    let mut m = mgr(8, 4);
    prefill(&mut m, SeqId(1), &(0..10).collect::<Vec<_>>()).unwrap();
    let s = m.stats();
    assert_eq!((s.num_blocks_total, s.num_blocks_used), (8, 3));
    assert!((s.usage_ratio - 3.0 / 8.0).abs() < 1e-12);
    assert!((s.internal_fragmentation_ratio - 2.0 / 12.0).abs() < 1e-12);
    assert_eq!(s.reserved_unused_ratio, 0.0);
    assert!((s.token_occupancy_ratio - 10.0 / 12.0).abs() < 1e-12);
    assert_eq!(s.external_fragmentation_ratio, 0.0);

    // Contiguous: 10 tokens of a 30-token reservation → 8 blocks; 3 used, 1 partial.
    let mut c = KvCacheManager::new(KvConfig {
        num_blocks: 12,
        block_size: 4,
        mode: AllocMode::Contiguous,
        enable_prefix_caching: true,
    });
    assert_eq!(
        c.add_sequence(SeqId(1), &(0..10).collect::<Vec<_>>(), 30, 0)
            .unwrap(),
        0
    );
    c.allocate_slots(SeqId(1), 10).unwrap();
    c.add_sequence(SeqId(2), &[1; 4], 4, 0).unwrap();
    c.allocate_slots(SeqId(2), 4).unwrap();
    c.free(SeqId(1)).unwrap();
    c.add_sequence(SeqId(3), &[1; 4], 8, 0).unwrap(); // first fit: blocks 0,1
    c.allocate_slots(SeqId(3), 4).unwrap();
    assert_eq!(ids(c.block_table(SeqId(3)).unwrap()), [0, 1]);
    let s = c.stats();
    assert_eq!(s.num_blocks_used, 3);
    assert!((s.reserved_unused_ratio - 4.0 / 12.0).abs() < 1e-12);
    assert!((s.token_occupancy_ratio - 8.0 / 12.0).abs() < 1e-12);
    // Free runs: blocks 2..8 (6) and 9..12 (3): 1 - 6/9.
    assert!((s.external_fragmentation_ratio - (1.0 - 6.0 / 9.0)).abs() < 1e-12);
    assert_eq!(
        c.allocate_slots(SeqId(3), 5).unwrap_err(),
        KvError::SlotsBeyondTokens {
            requested: 5,
            held: 4
        }
    );
    c.check_invariants().unwrap();
}

#[test]
fn fork_shares_full_blocks_and_copies_the_partial_one() {
    let mut m = mgr(8, 4);
    prefill(&mut m, SeqId(1), &(0..6).collect::<Vec<_>>()).unwrap(); // blocks 0, 1 (partial)
    assert_eq!(
        m.fork(SeqId(1), SeqId(2)).unwrap(),
        Some((BlockId(1), BlockId(2)))
    );
    assert_eq!(ids(m.block_table(SeqId(2)).unwrap()), [0, 2]);
    assert_eq!(m.pool().unwrap().ref_count(BlockId(0)), 2);
    m.free(SeqId(1)).unwrap();
    assert_eq!(m.pool().unwrap().ref_count(BlockId(0)), 1);
    m.check_invariants().unwrap();
}

#[derive(Debug, Clone)]
enum Op {
    Add { seq: u8, base: u8, len: u8 },
    Step { seq: u8, n: u8 },
    Append { seq: u8, tok: u8 },
    Fork { parent: u8, child: u8 },
    Free { seq: u8 },
    Evict { n: u8 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..6, 0u8..3, 1u8..40).prop_map(|(seq, base, len)| Op::Add { seq, base, len }),
        (0u8..6, 1u8..12).prop_map(|(seq, n)| Op::Step { seq, n }),
        (0u8..6, 0u8..3).prop_map(|(seq, tok)| Op::Append { seq, tok }),
        (0u8..6, 0u8..6).prop_map(|(parent, child)| Op::Fork { parent, child }),
        (0u8..6).prop_map(|seq| Op::Free { seq }),
        (0u8..4).prop_map(|n| Op::Evict { n }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random allocate/append/fork/free/evict against the pool; invariants after every step:
    /// free + used = total, no block both free and referenced, ref counts match block tables,
    /// the hash map points only at full blocks.
    #[test]
    fn block_pool_model_check(ops in proptest::collection::vec(op(), 1..80), bs in 1usize..5, nb in 1usize..24) {
        let mut m = mgr(nb, bs);
        for op in ops {
            match op {
                Op::Add { seq, base, len } => {
                    // Prompts from 3 bases with shared prefixes, so prefix hits happen.
                    let prompt: Vec<u32> = (0..len as u32).map(|i| if i < 8 { i } else { i * (base as u32 + 1) }).collect();
                    let free_before = m.num_free_blocks();
                    match m.add_sequence(SeqId(seq as u64), &prompt, prompt.len(), 0) {
                        Ok(cached) => {
                            prop_assert!(cached < prompt.len());
                            prop_assert_eq!(cached % bs, 0);
                        }
                        Err(KvError::DuplicateSequence(_)) => prop_assert!(m.contains(SeqId(seq as u64))),
                        Err(KvError::NeverFits { .. }) => {
                            prop_assert!(prompt.len().div_ceil(bs) > nb);
                            prop_assert_eq!(m.num_free_blocks(), free_before);
                        }
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    }
                }
                Op::Step { seq, n } => {
                    let s = SeqId(seq as u64);
                    if let (Some(c), Some(t)) = (m.num_computed(s), m.num_tokens(s)) {
                        let n = (n as usize).min(t - c);
                        let free_before = m.num_free_blocks();
                        let held = m.block_table(s).unwrap().len();
                        match m.allocate_slots(s, n) {
                            Ok(()) => m.mark_computed(s, n).unwrap(),
                            Err(KvError::OutOfBlocks(e)) => {
                                prop_assert_eq!(e.needed, (c + n).div_ceil(bs) - held);
                                prop_assert!(e.needed > free_before);
                                prop_assert_eq!(m.num_free_blocks(), free_before);
                            }
                            Err(e) => prop_assert!(false, "unexpected {e}"),
                        }
                    }
                }
                Op::Append { seq, tok } => {
                    let _ = m.append_tokens(SeqId(seq as u64), &[tok as u32]);
                }
                Op::Fork { parent, child } => {
                    let _ = m.fork(SeqId(parent as u64), SeqId(child as u64));
                }
                Op::Free { seq } => {
                    let existed = m.contains(SeqId(seq as u64));
                    prop_assert_eq!(m.free(SeqId(seq as u64)).is_ok(), existed);
                }
                Op::Evict { n } => {
                    m.evict_cached(n as usize);
                }
            }
            if let Err(e) = m.check_invariants() {
                prop_assert!(false, "invariant broken: {e}");
            }
            let s = m.stats();
            prop_assert_eq!(s.num_blocks_used as usize + m.num_free_blocks(), nb);
            prop_assert!(s.token_occupancy_ratio >= 0.0 && s.token_occupancy_ratio <= 1.0);
        }
    }
}
