//! A small deterministic model and byte tokenizer, for testing the engine and API without
//! model weights. It is paged for real: every forward writes each token into its slot through
//! the block table and reads the whole context back the same way, failing on a slot that was
//! never written — so wrong block tables, bad prefix hits or lost K/V change its output or
//! error, just as they would corrupt a real model's attention.

use super::engine::ModelBackend;
use crate::model::{Route, SeqChunk};

/// Byte-level vocabulary plus EOS.
pub const TOY_VOCAB: usize = 257;
pub const TOY_EOS: u32 = 256;

#[derive(Debug, Clone)]
pub struct ToyModel {
    block_size: usize,
    /// `token + 1` per slot; 0 means never written.
    slots: Vec<u32>,
    /// Incremented per forward call (tests use it to count steps).
    pub num_forwards: u64,
}

impl ToyModel {
    pub fn new(num_blocks: usize, block_size: usize) -> ToyModel {
        ToyModel {
            block_size,
            slots: vec![0; num_blocks * block_size],
            num_forwards: 0,
        }
    }

    /// The token the toy predicts after `context` (what greedy decoding yields): a printable
    /// ASCII letter that depends on the whole context and the route.
    pub fn next_token(context: &[u32], route: Route) -> u32 {
        let mut h: u64 = match route {
            Route::Primary => 17,
            Route::Fallback => 29,
        };
        for (p, &t) in context.iter().enumerate() {
            h = h
                .wrapping_mul(31)
                .wrapping_add(u64::from(t) * (p as u64 + 1));
        }
        u32::from(b'a') + (h % 26) as u32
    }
}

impl ModelBackend for ToyModel {
    fn forward(&mut self, route: Route, chunks: &[SeqChunk<'_>]) -> Result<Vec<Vec<f32>>, String> {
        self.num_forwards += 1;
        let bs = self.block_size;
        let mut out = Vec::with_capacity(chunks.len());
        for c in chunks {
            for (i, &t) in c.tokens.iter().enumerate() {
                let p = c.start_pos + i;
                let b = *c
                    .block_table
                    .get(p / bs)
                    .ok_or_else(|| format!("position {p} beyond block table"))?
                    as usize;
                let slot = self
                    .slots
                    .get_mut(b * bs + p % bs)
                    .ok_or_else(|| format!("block {b} out of range"))?;
                *slot = t + 1;
            }
            let end = c.start_pos + c.tokens.len();
            let mut context = Vec::with_capacity(end);
            for p in 0..end {
                let b = c.block_table[p / bs] as usize;
                match self.slots[b * bs + p % bs] {
                    0 => return Err(format!("read of unwritten KV slot at position {p}")),
                    v => context.push(v - 1),
                }
            }
            let next = Self::next_token(&context, route);
            // A peaked distribution: greedy picks `next`; temperature spreads over neighbours.
            let logits = (0..TOY_VOCAB as u32)
                .map(|j| {
                    if j == TOY_EOS {
                        -20.0
                    } else {
                        -((j as f32 - next as f32).abs()) * 0.7
                    }
                })
                .collect();
            out.push(logits);
        }
        Ok(out)
    }
}

/// Byte tokenizer: one token per UTF-8 byte.
pub fn toy_encode(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

pub fn toy_decode(ids: &[u32]) -> String {
    let bytes: Vec<u8> = ids.iter().filter(|&&t| t < 256).map(|&t| t as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
