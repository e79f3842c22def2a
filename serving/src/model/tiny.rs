//! `tiny-random`: a tiny Llama with seeded random weights, written as a GGUF file in memory and
//! loaded through the same reader as the real model.
//!
//! It mirrors SmolLM2's file: Q4_1 matrices, a Q8_0 token embedding tied to the output head,
//! F32 norms, GQA (4 query / 2 KV heads), a GPT-2 byte-level BPE vocabulary (3 special tokens,
//! the 256 byte tokens and a few dozen merges) so the tokenizer and chat template work.

use super::gguf::{GgmlType, GgufWriter, MetaValue};
use super::quant;
use super::tokenizer::bytes_to_unicode;

pub const HIDDEN: usize = 64;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const FFN: usize = 128;
pub const LAYERS: usize = 2;
pub const CONTEXT: usize = 1024;
pub const SEED: u64 = 0x5eed_b0b0;

/// Merges in GPT-2 byte-alphabet spelling (`Ġ` = space, `Ċ` = newline), by rank.
const MERGES: &[&str] = &[
    "Ġ t",
    "h e",
    "Ġ a",
    "i n",
    "Ġt he",
    "e r",
    "o n",
    "r e",
    "H e",
    "l l",
    "He ll",
    "Hell o",
    "Ġ w",
    "o r",
    "Ġw or",
    "Ġwor l",
    "Ġworl d",
    "a t",
    "e n",
    "Ġ s",
    "i s",
    "Ġ i",
    "Ġi s",
    "Ġ Ġ",
    "ĠĠ ĠĠ",
    "Ċ Ċ",
    "Ġ h",
    "Ġh e",
    "Ġhe l",
    "Ġhel p",
    "u s",
    "e s",
    "i m",
    "Ġ c",
    "o u",
    "s y",
    "sy s",
    "t em",
    "e m",
    "sys tem",
    "a s",
    "as s",
    "ass is",
    "t a",
    "n t",
];

/// Special tokens (token type 3), ids 0, 1, 2.
pub const SPECIALS: &[&str] = &["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
}

/// Vocabulary (index = id), token types, merges of the tiny model.
pub fn vocab() -> (Vec<String>, Vec<u64>, Vec<String>) {
    let mut tokens: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
    let mut types = vec![3u64; SPECIALS.len()];
    for c in bytes_to_unicode() {
        tokens.push(c.to_string());
        types.push(1);
    }
    let mut merges = Vec::new();
    for m in MERGES {
        let (l, r) = m.split_once(' ').expect("merge has a space");
        let merged = format!("{l}{r}");
        if !tokens.contains(&merged) {
            tokens.push(merged);
            types.push(1);
        }
        merges.push((*m).to_string());
    }
    (tokens, types, merges)
}

/// The tiny model as GGUF bytes (deterministic for a given seed).
pub fn gguf_bytes(seed: u64) -> Vec<u8> {
    let (tokens, types, merges) = vocab();
    let vocab_size = tokens.len();
    let head_dim = HIDDEN / HEADS;
    let kv_dim = KV_HEADS * head_dim;
    let mut rng = Rng(seed);
    let mut w = GgufWriter::new();
    let s = |v: &str| MetaValue::Str(v.to_string());
    let u = |v: usize| MetaValue::U32(v as u32);
    w.meta("general.architecture", s("llama"))
        .meta("general.name", s("tiny-random"))
        .meta("general.alignment", u(32))
        .meta("llama.block_count", u(LAYERS))
        .meta("llama.context_length", u(CONTEXT))
        .meta("llama.embedding_length", u(HIDDEN))
        .meta("llama.feed_forward_length", u(FFN))
        .meta("llama.attention.head_count", u(HEADS))
        .meta("llama.attention.head_count_kv", u(KV_HEADS))
        .meta("llama.rope.freq_base", MetaValue::F32(10000.0))
        .meta("llama.rope.dimension_count", u(head_dim))
        .meta(
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(1e-5),
        )
        .meta("llama.vocab_size", u(vocab_size))
        .meta("tokenizer.ggml.model", s("gpt2"))
        .meta("tokenizer.ggml.pre", s("smollm"))
        .meta(
            "tokenizer.ggml.tokens",
            MetaValue::Array(tokens.iter().map(|t| s(t)).collect()),
        )
        .meta(
            "tokenizer.ggml.token_type",
            MetaValue::Array(types.iter().map(|&t| MetaValue::I32(t as i32)).collect()),
        )
        .meta(
            "tokenizer.ggml.merges",
            MetaValue::Array(merges.iter().map(|m| s(m)).collect()),
        )
        .meta("tokenizer.ggml.bos_token_id", u(1))
        .meta("tokenizer.ggml.eos_token_id", u(2))
        .meta("tokenizer.ggml.add_bos_token", MetaValue::Bool(false));
    let q41 = GgmlType::Q4_1;
    let mut mat = |w: &mut GgufWriter, name: &str, rows: usize, cols: usize, ty: GgmlType| {
        let scale = 1.0 / (cols as f32).sqrt() * 1.7;
        let data = quant::quantize(ty, &rng.vec(rows * cols, scale));
        w.tensor(name, &[cols as u64, rows as u64], ty, data);
    };
    // The embedding is not scaled down: its rows are the residual stream's input.
    {
        let mut r2 = Rng(seed ^ 0xe1b);
        let data = quant::quantize(GgmlType::Q8_0, &r2.vec(vocab_size * HIDDEN, 1.0));
        w.tensor(
            "token_embd.weight",
            &[HIDDEN as u64, vocab_size as u64],
            GgmlType::Q8_0,
            data,
        );
    }
    let mut norm_rng = Rng(seed ^ 0x0a0a);
    let mut norm = |w: &mut GgufWriter, name: &str| {
        let v: Vec<f32> = (0..HIDDEN)
            .map(|_| 1.0 + 0.2 * norm_rng.uniform())
            .collect();
        w.tensor(
            name,
            &[HIDDEN as u64],
            GgmlType::F32,
            quant::quantize(GgmlType::F32, &v),
        );
    };
    for i in 0..LAYERS {
        let p = |s: &str| format!("blk.{i}.{s}.weight");
        norm(&mut w, &p("attn_norm"));
        mat(&mut w, &p("attn_q"), HIDDEN, HIDDEN, q41);
        mat(&mut w, &p("attn_k"), kv_dim, HIDDEN, q41);
        mat(&mut w, &p("attn_v"), kv_dim, HIDDEN, q41);
        mat(&mut w, &p("attn_output"), HIDDEN, HIDDEN, q41);
        norm(&mut w, &p("ffn_norm"));
        mat(&mut w, &p("ffn_gate"), FFN, HIDDEN, q41);
        mat(&mut w, &p("ffn_up"), FFN, HIDDEN, q41);
        mat(&mut w, &p("ffn_down"), HIDDEN, FFN, q41);
    }
    norm(&mut w, "output_norm.weight");
    w.to_bytes()
}
