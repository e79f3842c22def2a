//! The free-block queue: an intrusive doubly linked list over block indices.
//!
//! ```text
//!  head (evicted / allocated first)                      tail (freed most recently)
//!   [7] <-> [3] <-> [9] <-> ... <-> [4]
//! ```
//! O(1) `push_back`, `pop_front` and `remove` (a cached block taken back by a prefix hit leaves
//! the middle of the queue). Links live in two `Vec<u32>` indexed by block id, so the queue
//! allocates nothing after construction.

use super::block::BlockId;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
pub struct FreeQueue {
    prev: Vec<u32>,
    next: Vec<u32>,
    /// Whether each block is in the queue (guards against double insertion).
    queued: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl FreeQueue {
    /// A queue holding every block `0..num_blocks` in id order.
    pub fn full(num_blocks: usize) -> FreeQueue {
        assert!(num_blocks < NIL as usize, "too many blocks for u32 ids");
        let n = num_blocks as u32;
        let prev = (0..n).map(|i| if i == 0 { NIL } else { i - 1 }).collect();
        let next = (0..n)
            .map(|i| if i + 1 == n { NIL } else { i + 1 })
            .collect();
        FreeQueue {
            prev,
            next,
            queued: vec![true; num_blocks],
            head: if n == 0 { NIL } else { 0 },
            tail: if n == 0 { NIL } else { n - 1 },
            len: num_blocks,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn contains(&self, b: BlockId) -> bool {
        self.queued[b.index()]
    }

    pub fn front(&self) -> Option<BlockId> {
        (self.head != NIL).then_some(BlockId(self.head))
    }

    pub fn pop_front(&mut self) -> Option<BlockId> {
        let b = self.front()?;
        self.remove(b);
        Some(b)
    }

    /// # Panics
    /// If `b` is already queued (a broken invariant: a block freed twice).
    pub fn push_back(&mut self, b: BlockId) {
        let i = b.index();
        assert!(!self.queued[i], "block {b} pushed to the free queue twice");
        self.queued[i] = true;
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        if self.tail == NIL {
            self.head = b.0;
        } else {
            self.next[self.tail as usize] = b.0;
        }
        self.tail = b.0;
        self.len += 1;
    }

    /// # Panics
    /// If `b` is not queued.
    pub fn remove(&mut self, b: BlockId) {
        let i = b.index();
        assert!(
            self.queued[i],
            "block {b} removed from the free queue but not in it"
        );
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.queued[i] = false;
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.len -= 1;
    }

    /// Blocks from head to tail.
    pub fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        let mut cur = self.head;
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let b = BlockId(cur);
            cur = self.next[cur as usize];
            Some(b)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(q: &FreeQueue) -> Vec<u32> {
        q.iter().map(|b| b.0).collect()
    }

    #[test]
    fn push_pop_remove_keep_order() {
        let mut q = FreeQueue::full(4);
        assert_eq!(ids(&q), [0, 1, 2, 3]);
        assert_eq!(q.pop_front(), Some(BlockId(0)));
        q.remove(BlockId(2));
        assert_eq!(ids(&q), [1, 3]);
        q.push_back(BlockId(0));
        q.push_back(BlockId(2));
        assert_eq!(ids(&q), [1, 3, 0, 2]);
        q.remove(BlockId(2));
        q.remove(BlockId(1));
        assert_eq!(ids(&q), [3, 0]);
        assert_eq!(q.len(), 2);
        assert!(!q.contains(BlockId(1)));
        q.pop_front();
        q.pop_front();
        assert!(q.is_empty());
        assert_eq!(q.pop_front(), None);
        q.push_back(BlockId(1));
        assert_eq!(ids(&q), [1]);
    }

    #[test]
    #[should_panic(expected = "twice")]
    fn double_free_panics() {
        let mut q = FreeQueue::full(2);
        q.push_back(BlockId(1));
    }
}
