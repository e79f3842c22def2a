//! Block ids, block hashes and the chained prefix hash.

use std::fmt;
use std::hash::{Hash, Hasher};

/// A physical KV block: an index into the model's K/V tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub struct BlockId(pub u32);

impl BlockId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Hash of a FULL block's tokens chained with its parent block's hash (and a salt that keeps
/// caches of different weights apart: the K/V of the primary and fallback routes differ).
///
/// Equal hashes mean "same token prefix up to and including this block" with probability
/// 1 − 2⁻⁶⁴ per pair; a collision would reuse wrong K/V, which vLLM also accepts by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockHash(pub u64);

impl BlockHash {
    /// The hash of the block holding `tokens` (exactly one full block) after `parent`.
    pub fn chain(parent: Option<BlockHash>, tokens: &[u32], salt: u64) -> BlockHash {
        // SipHash with fixed zero keys: deterministic across runs and processes.
        let mut h = std::hash::DefaultHasher::new();
        salt.hash(&mut h);
        parent.map(|p| p.0).hash(&mut h);
        tokens.hash(&mut h);
        BlockHash(h.finish())
    }
}

/// Sequence id, chosen by the caller (the scheduler's request id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeqId(pub u64);

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seq{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chained_hash_depends_on_parent_tokens_and_salt() {
        let a = BlockHash::chain(None, &[1, 2, 3, 4], 0);
        assert_eq!(a, BlockHash::chain(None, &[1, 2, 3, 4], 0));
        assert_ne!(a, BlockHash::chain(None, &[1, 2, 3, 5], 0));
        assert_ne!(a, BlockHash::chain(None, &[1, 2, 3, 4], 1));
        let b = BlockHash::chain(Some(a), &[5, 6, 7, 8], 0);
        assert_ne!(b, BlockHash::chain(None, &[5, 6, 7, 8], 0));
    }
}
