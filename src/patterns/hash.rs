//! The hashes of the pattern modules: [`stable_hash`] (template, pattern and fingerprint ids:
//! the same in every process and version) and the miner's fast in-memory ones.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// FNV-1a over bytes, 64 bit: stable across processes, platforms and Rust versions.
pub fn stable_hash(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Hasher for keys that already are good 64-bit hashes.
#[derive(Default)]
pub(super) struct IdHasher(u64);
impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) ^ u64::from(b) ^ (self.0 >> 56);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}
pub(super) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// A fast hash of bytes for the exact-match cache and the collapsed index (not an id: ids use
/// [`stable_hash`]). Deterministic, 8 bytes at a time.
pub(super) fn fast_hash(b: &[u8]) -> u64 {
    const K: u64 = 0x2127_599b_f432_5c37;
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15 ^ (b.len() as u64).wrapping_mul(K);
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(K).rotate_left(31);
    }
    let r = chunks.remainder();
    let mut w = [0u8; 8];
    w[..r.len()].copy_from_slice(r);
    h = (h ^ u64::from_le_bytes(w)).wrapping_mul(K);
    h ^ (h >> 29)
}
