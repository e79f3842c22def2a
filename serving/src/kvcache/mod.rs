//! The KV cache's bookkeeping (pure: no tokio, no IO), in vLLM v1's parts:
//!
//! - [`block`]: `BlockId`, `SeqId`, the chained `BlockHash` of a full block;
//! - [`free_queue`]: the LRU free-block queue (intrusive doubly linked list);
//! - [`pool`]: ref counts, the free queue and the prefix-cache hash map ([`BlockPool`]);
//! - [`contiguous`]: the first-fit, reserve-everything baseline ([`ContiguousPool`]);
//! - [`manager`]: per-sequence block tables and the fragmentation figures ([`KvCacheManager`]).
//!
//! The model owns the K/V *memory*; this module only decides which block holds what.

pub mod block;
pub mod contiguous;
pub mod free_queue;
pub mod manager;
pub mod pool;
pub mod sim;

pub use block::{BlockHash, BlockId, SeqId};
pub use contiguous::ContiguousPool;
pub use manager::{AllocMode, KvCacheManager, KvConfig, KvError, SeqKvInfo};
pub use pool::{BlockPool, OutOfBlocks};

#[cfg(test)]
mod tests;
