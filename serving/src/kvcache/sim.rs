//! Trace replay for `brownout-serve bench kv`: the same long-tailed request trace through the
//! paged and the contiguous allocator over the same pool, measuring token occupancy and
//! concurrency. Pure (seeded RNG, no IO, no clock): timing is the caller's.
//!
//! Model of serving: all requests queue at t = 0 (saturation); every step admits FIFO while the
//! allocator gives memory, prefills each newly admitted request in one step, and decodes one
//! token for every running request. Paged admission needs the prompt's blocks; a decode that
//! finds no block preempts the newest request (freed, back to the head of the queue,
//! recomputed later). Contiguous admission reserves `prompt + max_tokens` (capped at
//! `max_model_len`) up front, first fit, and never grows.

use std::collections::VecDeque;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{AllocMode, KvCacheManager, KvConfig, KvError, SeqId};

/// One request of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRequest {
    pub prompt_len: usize,
    /// Tokens actually generated.
    pub output_len: usize,
    /// What the client declared (≥ `output_len`): what contiguous allocation must reserve.
    pub max_tokens: usize,
}

/// A long-tailed mixed-length trace: log-uniform prompt and output lengths in `[lo, hi]`
/// (many short, few very long) and `max_tokens` the next power of two above the output (clients
/// pick round caps), at most `hi`.
pub fn long_tailed_trace(n: usize, lo: usize, hi: usize, seed: u64) -> Vec<TraceRequest> {
    let mut rng = StdRng::seed_from_u64(seed);
    let (llo, lhi) = ((lo as f64).ln(), (hi as f64).ln());
    let draw = |rng: &mut StdRng| {
        (rng.random_range(llo..=lhi))
            .exp()
            .round()
            .clamp(lo as f64, hi as f64) as usize
    };
    (0..n)
        .map(|_| {
            let prompt_len = draw(&mut rng);
            let output_len = draw(&mut rng);
            let max_tokens = output_len.next_power_of_two().min(hi).max(output_len);
            TraceRequest {
                prompt_len,
                output_len,
                max_tokens,
            }
        })
        .collect()
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ReplayResult {
    pub mode: &'static str,
    pub steps: u64,
    /// Mean over steps of tokens held / capacity of the blocks in use.
    pub token_occupancy: f64,
    /// Mean over steps of blocks in use / pool.
    pub mean_usage: f64,
    pub max_concurrent: usize,
    pub mean_concurrent: f64,
    pub preemptions: u64,
    pub mean_external_fragmentation: f64,
    pub completed: usize,
    /// Requests that could never fit the pool (skipped).
    pub skipped: usize,
}

struct Running {
    id: u64,
    req: TraceRequest,
    generated: usize,
}

/// Replays `trace` through a pool of `num_blocks` blocks of `block_size`.
pub fn replay(
    trace: &[TraceRequest],
    mode: AllocMode,
    num_blocks: usize,
    block_size: usize,
    max_model_len: usize,
) -> ReplayResult {
    let mut kv = KvCacheManager::new(KvConfig {
        num_blocks,
        block_size,
        mode,
        enable_prefix_caching: false,
    });
    let mut queue: VecDeque<(u64, TraceRequest, usize)> = VecDeque::new(); // (id, req, generated so far)
    let mut skipped = 0;
    for (i, r) in trace.iter().enumerate() {
        let total = (r.prompt_len + r.max_tokens).min(max_model_len);
        if kv.blocks_for(total) > num_blocks || r.prompt_len + r.output_len > max_model_len {
            skipped += 1;
            continue;
        }
        queue.push_back((i as u64, *r, 0));
    }
    let mut running: Vec<Running> = Vec::new();
    let mut res = ReplayResult {
        mode: mode.as_str(),
        skipped,
        ..ReplayResult::default()
    };
    let (mut occ_sum, mut usage_sum, mut conc_sum, mut ext_sum) = (0.0, 0.0, 0.0, 0.0);
    let dummy = vec![0u32; max_model_len + 1];
    while !queue.is_empty() || !running.is_empty() {
        res.steps += 1;
        // Decode: every running request grows by one token.
        let mut i = 0;
        while i < running.len() {
            let id = SeqId(running[i].id);
            kv.append_tokens(id, &dummy[..1])
                .expect("running sequence has blocks");
            let mut self_preempted = false;
            loop {
                match kv.allocate_slots(id, 1) {
                    Ok(()) => break,
                    Err(KvError::OutOfBlocks(_)) => {
                        // Preempt the newest request (possibly this one).
                        let victim = running.pop().expect("non-empty");
                        kv.free(SeqId(victim.id)).expect("running");
                        res.preemptions += 1;
                        queue.push_front((victim.id, victim.req, victim.generated));
                        if victim.id == id.0 {
                            self_preempted = true;
                            break;
                        }
                    }
                    Err(e) => panic!("replay: {e}"),
                }
            }
            if self_preempted {
                break;
            }
            kv.mark_computed(id, 1).expect("slotted");
            running[i].generated += 1;
            if running[i].generated >= running[i].req.output_len {
                kv.free(id).expect("running");
                running.remove(i); // keep admission order: the newest is last
                res.completed += 1;
            } else {
                i += 1;
            }
        }
        // Admit FIFO while memory allows; the prompt (and any recomputed output) is prefilled.
        while let Some(&(id, req, generated)) = queue.front() {
            let held = req.prompt_len + generated;
            let reserve = (req.prompt_len + req.max_tokens).min(max_model_len);
            match kv.add_sequence(SeqId(id), &dummy[..held], reserve, 0) {
                Ok(_) => {}
                Err(KvError::OutOfBlocks(_)) => break,
                Err(e) => panic!("replay: {e}"),
            }
            match kv.allocate_slots(SeqId(id), held) {
                Ok(()) => {
                    kv.mark_computed(SeqId(id), held).expect("slotted");
                    queue.pop_front();
                    running.push(Running { id, req, generated });
                }
                Err(KvError::OutOfBlocks(_)) => {
                    kv.free(SeqId(id)).expect("added");
                    break;
                }
                Err(e) => panic!("replay: {e}"),
            }
        }
        let s = kv.stats();
        occ_sum += if s.num_blocks_used > 0 {
            s.token_occupancy_ratio
        } else {
            1.0
        };
        usage_sum += s.usage_ratio;
        ext_sum += s.external_fragmentation_ratio;
        conc_sum += running.len() as f64;
        res.max_concurrent = res.max_concurrent.max(running.len());
    }
    let steps = res.steps.max(1) as f64;
    res.token_occupancy = occ_sum / steps;
    res.mean_usage = usage_sum / steps;
    res.mean_concurrent = conc_sum / steps;
    res.mean_external_fragmentation = ext_sum / steps;
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_is_long_tailed_within_bounds_and_reproducible() {
        let t = long_tailed_trace(2000, 20, 4000, 7);
        assert_eq!(t, long_tailed_trace(2000, 20, 4000, 7));
        assert!(t.iter().all(|r| (20..=4000).contains(&r.prompt_len)
            && r.max_tokens >= r.output_len
            && r.max_tokens <= 4000));
        let mut p: Vec<usize> = t.iter().map(|r| r.prompt_len).collect();
        p.sort_unstable();
        let (median, p99) = (p[1000], p[1980]);
        assert!(median < 400 && p99 > 3000, "median {median}, p99 {p99}");
    }

    #[test]
    fn both_allocators_complete_the_trace_and_paging_packs_tighter() {
        let t = long_tailed_trace(60, 20, 600, 3);
        let paged = replay(&t, AllocMode::Paged, 256, 16, 2048);
        let contiguous = replay(&t, AllocMode::Contiguous, 256, 16, 2048);
        assert_eq!(paged.completed + paged.skipped, 60);
        assert_eq!(contiguous.completed + contiguous.skipped, 60);
        assert!(
            paged.token_occupancy > contiguous.token_occupancy,
            "{paged:?} vs {contiguous:?}"
        );
        assert!(paged.max_concurrent >= contiguous.max_concurrent);
        assert_eq!(paged.mean_external_fragmentation, 0.0);
    }
}
