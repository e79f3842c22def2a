//! The contiguous-reservation baseline: each sequence reserves `prompt + max_tokens` (capped at
//! `max_model_len`) up front, as one run of consecutive blocks, placed first fit. This is how
//! pre-PagedAttention servers allocated KV memory, and what paging is measured against.

use std::collections::BTreeMap;

use super::block::BlockId;
use super::pool::OutOfBlocks;

#[derive(Debug, Clone)]
pub struct ContiguousPool {
    num_blocks: usize,
    /// start → length of every reserved region.
    start_to_len: BTreeMap<u32, u32>,
    num_used: usize,
}

impl ContiguousPool {
    pub fn new(num_blocks: usize) -> ContiguousPool {
        ContiguousPool {
            num_blocks,
            start_to_len: BTreeMap::new(),
            num_used: 0,
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }
    pub fn num_used(&self) -> usize {
        self.num_used
    }
    pub fn num_free(&self) -> usize {
        self.num_blocks - self.num_used
    }

    /// Free runs `(start, len)` in address order.
    pub fn free_runs(&self) -> Vec<(u32, u32)> {
        let mut runs = Vec::new();
        let mut cursor = 0u32;
        for (&s, &l) in &self.start_to_len {
            if s > cursor {
                runs.push((cursor, s - cursor));
            }
            cursor = s + l;
        }
        if (cursor as usize) < self.num_blocks {
            runs.push((cursor, self.num_blocks as u32 - cursor));
        }
        runs
    }

    pub fn largest_free_run(&self) -> usize {
        self.free_runs()
            .iter()
            .map(|r| r.1 as usize)
            .max()
            .unwrap_or(0)
    }

    /// Reserves `n` consecutive blocks at the lowest address where they fit.
    ///
    /// # Errors
    /// [`OutOfBlocks`] when no free run is long enough (even if enough blocks are free in total:
    /// that is external fragmentation).
    pub fn allocate(&mut self, n: usize) -> Result<u32, OutOfBlocks> {
        let n32 = n as u32;
        let mut cursor = 0u32;
        let mut found = None;
        for (&s, &l) in &self.start_to_len {
            if s - cursor >= n32 {
                found = Some(cursor);
                break;
            }
            cursor = s + l;
        }
        if found.is_none() && self.num_blocks as u32 - cursor >= n32 {
            found = Some(cursor);
        }
        let start = found.ok_or(OutOfBlocks {
            needed: n,
            free: self.num_free(),
        })?;
        if n > 0 {
            self.start_to_len.insert(start, n32);
            self.num_used += n;
        }
        Ok(start)
    }

    /// # Panics
    /// If no region starts at `start` (a broken invariant).
    pub fn free(&mut self, start: u32) {
        let len = self
            .start_to_len
            .remove(&start)
            .unwrap_or_else(|| panic!("no region at block {start}"));
        self.num_used -= len as usize;
    }

    pub fn region_blocks(start: u32, len: usize) -> impl Iterator<Item = BlockId> {
        (start..start + len as u32).map(BlockId)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_reuses_the_lowest_hole_and_fragments() {
        let mut p = ContiguousPool::new(10);
        assert_eq!(p.allocate(3).unwrap(), 0);
        assert_eq!(p.allocate(3).unwrap(), 3);
        assert_eq!(p.allocate(2).unwrap(), 6);
        p.free(0);
        p.free(6);
        assert_eq!(p.free_runs(), [(0, 3), (6, 4)]);
        // 5 blocks free in two runs of 3 and 4: a request for 5 fails (external fragmentation).
        assert_eq!(p.num_free(), 7);
        assert_eq!(p.allocate(5), Err(OutOfBlocks { needed: 5, free: 7 }));
        assert_eq!(p.allocate(2).unwrap(), 0, "first fit takes the lowest hole");
        assert_eq!(p.allocate(4).unwrap(), 6);
        assert_eq!(p.largest_free_run(), 1);
    }
}
