//! GPT-2 byte-level BPE, read from a GGUF file's `tokenizer.ggml.*` metadata.
//!
//! Encoding: split out special tokens (token type 3 "control" / 4 "user defined"), then
//! pre-tokenize like Hugging Face's `Sequence[Digits(individual_digits=True), ByteLevel]`
//! (SmolLM2's `tokenizer.json`; llama.cpp's `smollm` pre-tokenizer), map each piece's bytes to
//! GPT-2's printable byte alphabet and merge pairs by rank.
//!
//! Decoding maps the byte alphabet back to bytes; [`StreamDecoder`] holds back the bytes of a
//! UTF-8 character split across tokens until it is complete.

use std::collections::HashMap;

use regex::Regex;

use super::gguf::{Gguf, MetaValue};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TokenizerError {
    #[error("GGUF metadata {0:?} missing or of the wrong type")]
    Missing(&'static str),
    #[error("unsupported tokenizer model {0:?} (only \"gpt2\" byte-level BPE)")]
    UnsupportedModel(String),
    #[error("merge #{index} {merge:?}: {reason}")]
    BadMerge {
        index: usize,
        merge: String,
        reason: &'static str,
    },
    #[error("not a byte-level vocabulary: byte token {0:#04x} (and most others) missing")]
    MissingByte(u8),
}

/// GPT-2's split pattern without its `\s+(?!\S)` look-ahead (done by hand, see
/// [`Tokenizer::encode_plain`]).
static PRETOKENIZE: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| {
    Regex::new(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+")
        .expect("static regex")
});

/// Byte-level BPE tokenizer.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    tokens: Vec<String>,
    token_to_id: HashMap<String, u32>,
    /// (left, right) → (rank, merged id).
    merges: HashMap<(u32, u32), (u32, u32)>,
    /// `None` for bytes the vocabulary lacks (SmolLM2 lacks 21, e.g. 0x04): like Hugging Face's
    /// BPE without an unknown token, they are dropped.
    byte_to_id: [Option<u32>; 256],
    char_to_byte: HashMap<char, u8>,
    /// Special tokens, longest first (matched greedily in text).
    specials: Vec<(String, u32)>,
    is_special: Vec<bool>,
    pre: Regex,
}

/// GPT-2's map from bytes to printable characters.
pub fn bytes_to_unicode() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = (b'!'..=b'~').contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
        map[b as usize] = if printable {
            char::from(b)
        } else {
            let c = char::from_u32(256 + n).expect("valid char");
            n += 1;
            c
        };
    }
    map
}

impl Tokenizer {
    /// Reads the vocabulary, token types and merges from GGUF metadata.
    ///
    /// # Errors
    /// Missing keys, a model other than `gpt2`, merges naming unknown tokens.
    pub fn from_gguf(g: &Gguf<'_>) -> Result<Tokenizer, TokenizerError> {
        let model = g
            .get("tokenizer.ggml.model")
            .and_then(MetaValue::as_str)
            .ok_or(TokenizerError::Missing("tokenizer.ggml.model"))?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(model.to_string()));
        }
        let tokens: Vec<String> = g
            .get("tokenizer.ggml.tokens")
            .and_then(MetaValue::as_array)
            .ok_or(TokenizerError::Missing("tokenizer.ggml.tokens"))?
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or(TokenizerError::Missing("tokenizer.ggml.tokens"))?;
        let types: Vec<u64> = match g.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .as_array()
                .and_then(|a| a.iter().map(MetaValue::as_u64).collect::<Option<Vec<_>>>())
                .ok_or(TokenizerError::Missing("tokenizer.ggml.token_type"))?,
            None => vec![1; tokens.len()],
        };
        let merges: Vec<String> = g
            .get("tokenizer.ggml.merges")
            .and_then(MetaValue::as_array)
            .ok_or(TokenizerError::Missing("tokenizer.ggml.merges"))?
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or(TokenizerError::Missing("tokenizer.ggml.merges"))?;
        Tokenizer::new(tokens, &types, &merges)
    }

    /// Builds a tokenizer from a vocabulary (index = id), token types (3 = control,
    /// 4 = user-defined are special) and merges (`"left right"`, by rank).
    ///
    /// # Errors
    /// A merge that is malformed or names tokens not in the vocabulary; a missing byte token.
    pub fn new(
        tokens: Vec<String>,
        types: &[u64],
        merges: &[String],
    ) -> Result<Tokenizer, TokenizerError> {
        let token_to_id: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let mut merge_map = HashMap::with_capacity(merges.len());
        for (index, m) in merges.iter().enumerate() {
            let bad = |reason| TokenizerError::BadMerge {
                index,
                merge: m.clone(),
                reason,
            };
            let (l, r) = m.split_once(' ').ok_or_else(|| bad("no space"))?;
            let li = *token_to_id
                .get(l)
                .ok_or_else(|| bad("left part not in vocab"))?;
            let ri = *token_to_id
                .get(r)
                .ok_or_else(|| bad("right part not in vocab"))?;
            let mi = *token_to_id
                .get(&format!("{l}{r}"))
                .ok_or_else(|| bad("merged token not in vocab"))?;
            merge_map.entry((li, ri)).or_insert((index as u32, mi));
        }
        let b2u = bytes_to_unicode();
        let mut byte_to_id = [None; 256];
        let mut char_to_byte = HashMap::with_capacity(256);
        for b in 0..256usize {
            byte_to_id[b] = token_to_id.get(&b2u[b].to_string()).copied();
            char_to_byte.insert(b2u[b], b as u8);
        }
        if byte_to_id.iter().filter(|b| b.is_some()).count() < 128 {
            let missing = byte_to_id.iter().position(Option::is_none).unwrap_or(0);
            return Err(TokenizerError::MissingByte(missing as u8));
        }
        let is_special: Vec<bool> = (0..tokens.len())
            .map(|i| matches!(types.get(i), Some(3) | Some(4)))
            .collect();
        let mut specials: Vec<(String, u32)> = tokens
            .iter()
            .enumerate()
            .filter(|(i, t)| is_special[*i] && !t.is_empty())
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let pre = PRETOKENIZE.clone();
        Ok(Tokenizer {
            tokens,
            token_to_id,
            merges: merge_map,
            byte_to_id,
            char_to_byte,
            specials,
            is_special,
            pre,
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    pub fn token_str(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    pub fn token_id(&self, s: &str) -> Option<u32> {
        self.token_to_id.get(s).copied()
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.is_special.get(id as usize).copied().unwrap_or(false)
    }

    /// Encodes text; special tokens written in the text (e.g. `<|im_start|>`) become their ids.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut rest = text;
        'outer: while !rest.is_empty() {
            // Find the earliest special token (longest at that position).
            let mut best: Option<(usize, &str, u32)> = None;
            for (s, id) in &self.specials {
                if let Some(p) = rest.find(s.as_str())
                    && best.is_none_or(|(bp, bs, _)| p < bp || (p == bp && s.len() > bs.len()))
                {
                    best = Some((p, s, *id));
                }
            }
            match best {
                Some((p, s, id)) => {
                    self.encode_plain_into(&rest[..p], &mut out);
                    out.push(id);
                    rest = &rest[p + s.len()..];
                }
                None => {
                    self.encode_plain_into(rest, &mut out);
                    break 'outer;
                }
            }
        }
        out
    }

    /// Encodes text treating special-token strings as ordinary text (for user content).
    pub fn encode_plain(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        self.encode_plain_into(text, &mut out);
        out
    }

    fn encode_plain_into(&self, text: &str, out: &mut Vec<u32>) {
        // Digits(individual_digits): every numeric char is its own piece.
        let mut start = 0;
        for (i, c) in text.char_indices() {
            if c.is_numeric() {
                self.pretokenize_into(&text[start..i], out);
                self.bpe_into(&text[i..i + c.len_utf8()], out);
                start = i + c.len_utf8();
            }
        }
        self.pretokenize_into(&text[start..], out);
    }

    /// GPT-2's split regex; `\s+(?!\S)` done by hand (the regex crate has no look-ahead): a
    /// whitespace run followed by more text gives up its last character to the next piece.
    fn pretokenize_into(&self, text: &str, out: &mut Vec<u32>) {
        let mut pos = 0;
        while pos < text.len() {
            let Some(m) = self.pre.find_at(text, pos) else {
                break;
            };
            let mut end = m.end();
            let piece = m.as_str();
            if end < text.len() && piece.chars().all(char::is_whitespace) {
                let last = piece.chars().next_back().map_or(0, char::len_utf8);
                if piece.len() > last {
                    end -= last;
                }
            }
            self.bpe_into(&text[m.start()..end], out);
            pos = end;
        }
    }

    fn bpe_into(&self, piece: &str, out: &mut Vec<u32>) {
        if piece.is_empty() {
            return;
        }
        let mut ids: Vec<u32> = piece
            .bytes()
            .filter_map(|b| self.byte_to_id[b as usize])
            .collect();
        while ids.len() > 1 {
            let mut best: Option<(u32, usize, u32)> = None;
            for i in 0..ids.len() - 1 {
                if let Some(&(rank, merged)) = self.merges.get(&(ids[i], ids[i + 1]))
                    && best.is_none_or(|(br, _, _)| rank < br)
                {
                    best = Some((rank, i, merged));
                }
            }
            let Some((_, at, merged)) = best else { break };
            // Merge every occurrence of this pair, left to right (same result as HF's one at a
            // time: the merged token differs from both parts, so no new equal pair appears).
            let (l, r) = (ids[at], ids[at + 1]);
            let mut next = Vec::with_capacity(ids.len());
            let mut i = 0;
            while i < ids.len() {
                if i + 1 < ids.len() && ids[i] == l && ids[i + 1] == r {
                    next.push(merged);
                    i += 2;
                } else {
                    next.push(ids[i]);
                    i += 1;
                }
            }
            ids = next;
        }
        out.extend_from_slice(&ids);
    }

    /// The bytes a token stands for (special tokens: their text).
    pub fn token_bytes(&self, id: u32, out: &mut Vec<u8>) {
        let Some(t) = self.tokens.get(id as usize) else {
            return;
        };
        if self.is_special(id) {
            out.extend_from_slice(t.as_bytes());
            return;
        }
        for c in t.chars() {
            match self.char_to_byte.get(&c) {
                Some(&b) => out.push(b),
                None => out.extend_from_slice(c.to_string().as_bytes()),
            }
        }
    }

    /// Decodes ids to text (invalid UTF-8 becomes U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        for &id in ids {
            self.token_bytes(id, &mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder {
            tok: self,
            pending: Vec::new(),
        }
    }
}

/// Incremental decoder for streaming: returns text as soon as it is complete UTF-8.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    pending: Vec<u8>,
}

impl StreamDecoder<'_> {
    /// Adds one token; returns the text that became complete (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        self.tok.token_bytes(id, &mut self.pending);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..good]).expect("valid prefix"));
                    match e.error_len() {
                        // Incomplete character at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                        Some(bad) => {
                            out.push('\u{fffd}');
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
    }

    /// Flushes whatever is held back (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}
