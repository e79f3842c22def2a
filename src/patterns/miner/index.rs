//! The miner's search indexes: the bucket a template is filed under (token count and first
//! literal word), the collapsed form (runs of `<*>` as one), and the key of a word slot.

use super::compare::{NAMING_WORDS, SLOT_WORDS, is_key_token, word_in};
use super::{TemplateId, TemplateMiner, is_wild};
use crate::patterns::hash::{fast_hash, stable_hash};
use crate::patterns::mask::WILDCARD;

/// The tokens with every quoted span of several tokens made one `"<*>"` (`tag="View Lock",` ->
/// `tag="<*>",`) and every run of `<*>` collapsed to one.
pub(super) fn collapse<S: AsRef<str>>(tokens: &[S]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(tokens.len());
    let mut i = 0;
    while i < tokens.len() {
        let t = tokens[i].as_ref();
        let odd = |x: &str| x.bytes().filter(|&b| b == b'"').count() % 2 == 1;
        if odd(t)
            && let Some(end) = (i + 1..tokens.len().min(i + 16)).find(|&k| odd(tokens[k].as_ref()))
        {
            let last = tokens[end].as_ref();
            let open = t.find('"').unwrap_or(0);
            let close = last.rfind('"').unwrap_or(0);
            out.push(format!(
                "{}\"{WILDCARD}\"{}",
                &t[..open],
                &last[close + 1..]
            ));
            i = end + 1;
            continue;
        }
        if !(is_wild(t) && out.last().is_some_and(|l| is_wild(l))) {
            out.push(t.to_string());
        }
        i += 1;
    }
    out
}

pub(super) fn collapsed_hash<S: AsRef<str>>(tokens: &[S]) -> u64 {
    let mut h = 0x51_7cc1_b727_220a_u64;
    for t in collapse(tokens) {
        h = (h ^ fast_hash(t.as_bytes()))
            .wrapping_mul(0x2127_599b_f432_5c37)
            .rotate_left(23);
    }
    h
}

/// A word only an equal word matches at the start of a line: letters, with `-` or `'` inside,
/// and at most one trailing `,` `.` `;`. Templates are filed under such a word.
fn literal_word(t: &str) -> bool {
    let b = t.as_bytes();
    let core = match b.last() {
        Some(b',' | b'.' | b';') => &b[..b.len() - 1],
        _ => b,
    };
    !core.is_empty()
        && core[0].is_ascii_alphabetic()
        && core[core.len() - 1].is_ascii_alphabetic()
        && core
            .iter()
            .all(|x| x.is_ascii_alphabetic() || matches!(x, b'-' | b'\''))
}

/// The search bucket of a template: its token count and its first literal word among the first
/// two positions (a line can only match a template whose literal word it has in that place), or
/// the token count alone.
pub(super) fn bucket<S: AsRef<str>>(tokens: &[S]) -> u64 {
    let len = (tokens.len() as u64).to_le_bytes();
    for (p, t) in tokens.iter().take(2).enumerate() {
        let t = t.as_ref();
        if literal_word(t) {
            return stable_hash(&[&len, &[p as u8], t.as_bytes()]);
        }
        // The second word is literal only when the first gives it no context (`START: ftp`,
        // `user root` make it a value).
        if word_in(t, NAMING_WORDS) || word_in(t, SLOT_WORDS) || is_key_token(t) {
            break;
        }
    }
    stable_hash(&[&len])
}

/// The buckets a line with these tokens searches (see [`bucket`]).
pub(super) fn line_buckets<S: AsRef<str>>(tokens: &[S]) -> [Option<u64>; 3] {
    let len = (tokens.len() as u64).to_le_bytes();
    let at = |p: usize| {
        tokens
            .get(p)
            .map(AsRef::as_ref)
            .filter(|t| literal_word(t))
            .map(|t| stable_hash(&[&len, &[p as u8], t.as_bytes()]))
    };
    // A template filed under its second word has no literal or context word first.
    let second = tokens
        .first()
        .map(AsRef::as_ref)
        .filter(|t| !(word_in(t, NAMING_WORDS) || word_in(t, SLOT_WORDS) || is_key_token(t)))
        .and_then(|_| at(1));
    [at(0), second, Some(stable_hash(&[&len]))]
}

/// The key of the word slot at `pos` of a template with these tokens.
pub(super) fn slot_key(tokens: &[Box<str>], pos: usize) -> u64 {
    let mut parts: Vec<&[u8]> = Vec::with_capacity(tokens.len() + 1);
    let p = (pos as u64).to_le_bytes();
    parts.push(&p);
    for (i, tok) in tokens.iter().enumerate() {
        parts.push(if i == pos { b"" } else { tok.as_bytes() });
    }
    stable_hash(&parts)
}

impl TemplateMiner {
    /// Puts template `id` (with `tokens`) into the search indexes.
    pub(super) fn index(&mut self, id: TemplateId, tokens: &[Box<str>]) {
        self.by_len.entry(bucket(tokens)).or_default().push(id);
        self.by_clen
            .entry(bucket(&collapse(tokens)))
            .or_default()
            .push(id);
        self.collapsed.entry(collapsed_hash(tokens)).or_insert(id);
    }

    /// Takes template `id` (with `tokens`) out of the search indexes.
    pub(super) fn unindex(&mut self, id: TemplateId, tokens: &[Box<str>]) {
        let ckey = bucket(&collapse(tokens));
        for (map, len) in [
            (&mut self.by_len, bucket(tokens)),
            (&mut self.by_clen, ckey),
        ] {
            if let Some(v) = map.get_mut(&len) {
                v.retain(|x| *x != id);
                if v.is_empty() {
                    map.remove(&len);
                }
            }
        }
        let ck = collapsed_hash(tokens);
        if self.collapsed.get(&ck) == Some(&id) {
            self.collapsed.remove(&ck);
        }
    }
}
