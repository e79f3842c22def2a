//! The online template miner: a Drain-like fixed-depth parse tree with three changes.
//!
//! ```text
//!  masked line ──> exact-match cache (hash of the masked line) ── hit ──> template id
//!        │ miss
//!        v
//!  leaf = (token count, first `prefix_depth` tokens, `<*>` for masked ones)
//!        │  best template by similarity ≥ sim_threshold ── merge (differing positions -> <*>)
//!        │ none
//!        v
//!  same token count, other leaves: one differing non-prefix-verb token ≥ cross_threshold
//!        │ none                                          (a variable word in the prefix)
//!        v
//!  new template, id = stable hash of its first masked line
//! ```
//!
//! 1. Masking is done first and aggressively ([`super::mask`]): any identifier run holding a
//!    digit is a variable, so most lines of a template are byte-equal after masking and the
//!    exact-match cache answers them without touching the tree (that is where the speed is).
//! 2. Similarity counts constant tokens only: `equal constants / max(constants in line,
//!    constants in template)`, so many masked positions don't make unrelated lines look alike.
//! 3. A variable *word* (a tool name, a user name) in the prefix would split a template across
//!    leaves; on a miss the other leaves of the same length are searched with a stricter rule.
//!
//! Ids are a hash of the template's first masked line (salted on a collision), so the same
//! input gives the same ids in any process; [`MinerState`] carries them across restarts.
//! Memory is bounded by `max_templates`: when full, the coldest sixteenth is evicted (counted).

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

use serde::{Deserialize, Serialize};

use super::mask::{WILDCARD, mask_line};

/// A template's id: stable across restarts and processes fed the same input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TemplateId(pub u64);

impl fmt::Display for TemplateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl std::str::FromStr for TemplateId {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        u64::from_str_radix(s, 16).map(TemplateId)
    }
}

impl Serialize for TemplateId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for TemplateId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(|_| {
            serde::de::Error::custom(format!("template id {s:?} is not 16 hex digits"))
        })
    }
}

/// The one default configuration; it is not tuned per log source.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MinerConfig {
    /// Tokens after the token count that pick a leaf.
    pub prefix_depth: usize,
    /// Minimum similarity to join a template in the same leaf.
    pub sim_threshold: f32,
    /// Minimum similarity to join a template in another leaf of the same length.
    pub cross_threshold: f32,
    /// Templates kept; beyond it the coldest are evicted.
    pub max_templates: usize,
}

impl Default for MinerConfig {
    fn default() -> Self {
        MinerConfig {
            prefix_depth: 2,
            sim_threshold: 0.55,
            cross_threshold: 0.75,
            max_templates: 50_000,
        }
    }
}

/// Why a saved miner state was refused.
#[derive(Debug, thiserror::Error)]
pub enum MinerError {
    #[error("miner state version {0} is not supported (expected 1)")]
    Version(u32),
    #[error("miner state holds template {0} twice")]
    DuplicateId(TemplateId),
    #[error("miner state: {0}")]
    Json(#[from] serde_json::Error),
}

#[derive(Debug, Clone)]
struct Template {
    tokens: Vec<Box<str>>,
    num_const: usize,
    count: u64,
    last_seen: u64,
    leaves: Vec<u64>,
}

/// A template as shown to callers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemplateInfo {
    pub id: TemplateId,
    pub template: String,
    pub count: u64,
}

/// The miner's state as saved to the store (JSON). Ids survive a save/load round trip.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MinerState {
    pub version: u32,
    pub config: MinerConfig,
    pub tick: u64,
    pub num_evictions: u64,
    pub templates: Vec<TemplateState>,
}

/// One saved template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemplateState {
    pub id: TemplateId,
    pub template: String,
    pub count: u64,
    pub last_seen: u64,
    pub leaves: Vec<u64>,
}

/// Where miner state is kept between restarts (the store implements it; a JSON file does too).
pub trait MinerStateStore {
    type Error: std::error::Error + Send + Sync + 'static;
    /// The saved state, or `None` when nothing was saved yet.
    fn load(&self) -> Result<Option<MinerState>, Self::Error>;
    fn save(&self, state: &MinerState) -> Result<(), Self::Error>;
}

/// [`MinerStateStore`] over one JSON file (the CLI's `--state FILE`).
#[derive(Debug, Clone)]
pub struct JsonFileStateStore(pub std::path::PathBuf);

/// Why the JSON state file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JsonFileStateError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Json {
        path: String,
        source: serde_json::Error,
    },
}

impl MinerStateStore for JsonFileStateStore {
    type Error = JsonFileStateError;
    fn load(&self) -> Result<Option<MinerState>, Self::Error> {
        let path = self.0.display().to_string();
        match std::fs::read(&self.0) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| JsonFileStateError::Json { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(JsonFileStateError::Io { path, source }),
        }
    }
    fn save(&self, state: &MinerState) -> Result<(), Self::Error> {
        let path = self.0.display().to_string();
        let bytes = serde_json::to_vec(state).map_err(|source| JsonFileStateError::Json {
            path: path.clone(),
            source,
        })?;
        let tmp = self.0.with_extension("tmp");
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, &self.0))
            .map_err(|source| JsonFileStateError::Io { path, source })
    }
}

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
struct IdHasher(u64);
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
type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

impl std::hash::Hash for LeafKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0);
    }
}
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LeafKey(u64);

/// The online template miner. Pure: no IO, no clock (its "time" is a line counter).
pub struct TemplateMiner {
    config: MinerConfig,
    templates: IdMap<u64, Template>,
    leaves: IdMap<LeafKey, Vec<TemplateId>>,
    by_len: IdMap<u64, Vec<TemplateId>>,
    exact: IdMap<u64, TemplateId>,
    tick: u64,
    num_evictions: u64,
    /// Evicted ids not yet taken by [`TemplateMiner::drain_evicted`] (bounded).
    evicted: Vec<TemplateId>,
    scratch: String,
}

impl Default for TemplateMiner {
    fn default() -> Self {
        TemplateMiner::new(MinerConfig::default())
    }
}

impl fmt::Debug for TemplateMiner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TemplateMiner")
            .field("num_templates", &self.templates.len())
            .field("num_evictions", &self.num_evictions)
            .finish_non_exhaustive()
    }
}

fn is_wild(t: &str) -> bool {
    t == WILDCARD
}

/// Templates compared per search (a leaf, or one token count across leaves), newest first.
const MAX_SCAN: usize = 1024;

/// Words after which a plain word is usually a value (`for user root`, `the hotel API`).
const KEY_WORDS: &[&str] = &[
    "user",
    "for",
    "from",
    "to",
    "by",
    "client",
    "service",
    "the",
    "of",
    "at",
    "process",
    "tool",
    "named",
    "name",
    "host",
    "in",
    "on",
    "as",
    "with",
    "is",
    "via",
    "feature",
    "model",
    "agent",
    "session",
    "account",
    "app",
    "package",
    "file",
    "table",
    "queue",
    "topic",
    "node",
    "pod",
    "container",
    "database",
    "db",
    "bucket",
    "key",
    "id",
    "Process",
    "User",
    "Service",
    "Tool",
    "Invalid",
    "invalid",
    "unknown",
];
const UNIT_WORDS: &[&str] = &[
    "B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "ms", "s", "us", "ns", "sec", "secs", "min",
    "bytes", "%",
];
const CALENDAR_WORDS: &[&str] = &[
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec", "Mon",
    "Tue", "Wed", "Thu", "Fri", "Sat", "Sun",
];

/// Whether a constant token that differs between two lines reads as a value: its shape (dotted,
/// underscored, bracketed, quoted, key=value, camelCase, a unit or calendar word) or what comes
/// before it (a key word, or a token ending in `=` or `:`).
fn is_variable_like(prev: Option<&str>, tok: &str) -> bool {
    let core = tok.trim_end_matches([',', ';', '.', ')', ']', '}']);
    let shaped = core.bytes().any(|b| {
        matches!(
            b,
            b'_' | b'.'
                | b'-'
                | b'@'
                | b'/'
                | b':'
                | b'='
                | b'('
                | b'['
                | b'{'
                | b'\''
                | b'"'
                | b'*'
        )
    }) || core.bytes().skip(1).any(|b| b.is_ascii_uppercase())
        && core.bytes().any(|b| b.is_ascii_lowercase())
        || UNIT_WORDS.contains(&core)
        || CALENDAR_WORDS.contains(&core);
    shaped
        || prev.is_some_and(|p| {
            KEY_WORDS.contains(&p)
                || p.ends_with('=')
                || p.ends_with('(')
                || (p.ends_with(':') && p.bytes().all(|b| b.is_ascii_alphabetic() || b == b':'))
                || CALENDAR_WORDS.contains(&p)
        })
}

/// A capitalised plain word (`Opening`, `Closing`): when two lines differ only in such a word in
/// the prefix they are different events, not a variable.
fn is_verb_like(t: &str) -> bool {
    let mut chars = t.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase()) && chars.all(|c| c.is_ascii_lowercase())
}

impl TemplateMiner {
    pub fn new(config: MinerConfig) -> Self {
        TemplateMiner {
            config,
            templates: IdMap::default(),
            leaves: IdMap::default(),
            by_len: IdMap::default(),
            exact: IdMap::default(),
            tick: 0,
            num_evictions: 0,
            evicted: Vec::new(),
            scratch: String::with_capacity(256),
        }
    }

    pub fn config(&self) -> &MinerConfig {
        &self.config
    }

    pub fn num_templates(&self) -> usize {
        self.templates.len()
    }

    /// Templates evicted so far to stay under `max_templates`.
    pub fn num_evictions(&self) -> u64 {
        self.num_evictions
    }

    /// Mines one line (raw with a header, or message only) and returns its template's id.
    pub fn add(&mut self, line: &str) -> TemplateId {
        self.tick += 1;
        let mut masked = std::mem::take(&mut self.scratch);
        mask_line(line, &mut masked);
        let id = self.add_masked(&masked);
        self.scratch = masked;
        id
    }

    fn add_masked(&mut self, masked: &str) -> TemplateId {
        let h = stable_hash(&[masked.as_bytes()]);
        if let Some(&id) = self.exact.get(&h)
            && let Some(t) = self.templates.get_mut(&id.0)
        {
            t.count += 1;
            t.last_seen = self.tick;
            return id;
        }
        let tokens: Vec<&str> = if masked.is_empty() {
            Vec::new()
        } else {
            masked.split(' ').collect()
        };
        let num_const = tokens.iter().filter(|t| !is_wild(t)).count();
        let leaf = self.leaf_key(&tokens);
        let id = match self.best_in_leaf(leaf, &tokens, num_const) {
            Some(id) => id,
            None => match self.best_across_leaves(&tokens, num_const) {
                Some(id) => {
                    self.leaves.entry(leaf).or_default().push(id);
                    if let Some(t) = self.templates.get_mut(&id.0) {
                        t.leaves.push(leaf.0);
                    }
                    id
                }
                None => self.create(h, leaf, &tokens, num_const),
            },
        };
        let t = self
            .templates
            .get_mut(&id.0)
            .expect("invariant: a found or created id is in `templates`");
        if t.count > 0 {
            for (slot, tok) in t.tokens.iter_mut().zip(&tokens) {
                if **slot != **tok && !is_wild(slot) {
                    *slot = WILDCARD.into();
                    t.num_const -= 1;
                }
            }
        }
        t.count += 1;
        t.last_seen = self.tick;
        if self.exact.len() >= self.config.max_templates.saturating_mul(4).max(1024) {
            self.exact.clear();
        }
        self.exact.insert(h, id);
        id
    }

    fn leaf_key(&self, tokens: &[&str]) -> LeafKey {
        let len = (tokens.len() as u64).to_le_bytes();
        let mut parts: [&[u8]; 5] = [&len, b"", b"", b"", b""];
        for (i, t) in tokens
            .iter()
            .take(self.config.prefix_depth.min(4))
            .enumerate()
        {
            parts[i + 1] = if t.contains(WILDCARD) {
                WILDCARD.as_bytes()
            } else {
                t.as_bytes()
            };
        }
        LeafKey(stable_hash(&parts))
    }

    /// (equal constants, similarity) of a template and a line of the same length.
    fn similarity(t: &Template, tokens: &[&str], num_const: usize) -> (usize, f32) {
        let equal = t
            .tokens
            .iter()
            .zip(tokens)
            .filter(|&(a, b)| !is_wild(b) && **a == **b)
            .count();
        let denom = num_const.max(t.num_const);
        let sim = if denom == 0 {
            1.0
        } else {
            equal as f32 / denom as f32
        };
        (equal, sim)
    }

    fn best_in_leaf(&self, leaf: LeafKey, tokens: &[&str], num_const: usize) -> Option<TemplateId> {
        let ids = self.leaves.get(&leaf)?;
        let mut best: Option<(f32, u64, TemplateId)> = None;
        // Newest first, bounded: unbounded novel input must not make every miss O(templates).
        for &id in ids.iter().rev().take(MAX_SCAN) {
            let Some(t) = self.templates.get(&id.0) else {
                continue;
            };
            if t.tokens.len() != tokens.len() {
                continue;
            }
            let (_, sim) = Self::similarity(t, tokens, num_const);
            if sim >= self.config.sim_threshold
                && Self::differences_are_variables(t, tokens)
                && best.is_none_or(|(s, c, _)| (sim, t.count) > (s, c))
            {
                best = Some((sim, t.count, id));
            }
        }
        best.map(|(_, _, id)| id)
    }

    /// Whether every constant where `t` and the line differ reads as a variable rather than a
    /// different event: `cupsd startup/shutdown succeeded`, `Changing view/modify acls`,
    /// `Failed/Accepted password`, `… terminating/Interrupted.` are different events;
    /// `Invalid user root/admin`, `the weather/hotel API`, `name=com.a.b` are variables.
    fn differences_are_variables(t: &Template, tokens: &[&str]) -> bool {
        t.tokens.iter().zip(tokens).enumerate().all(|(i, (a, b))| {
            if **a == **b || is_wild(a) || is_wild(b) {
                return true;
            }
            if i == 0 {
                // The first word (only reachable across leaves): a value unless a verb swap.
                return !(is_verb_like(a) && is_verb_like(b));
            }
            let prev = Some(tokens[i - 1]);
            is_variable_like(prev, a) || is_variable_like(prev, b)
        })
    }

    fn best_across_leaves(&self, tokens: &[&str], num_const: usize) -> Option<TemplateId> {
        let ids = self.by_len.get(&(tokens.len() as u64))?;
        let mut best: Option<(f32, u64, TemplateId)> = None;
        // Newest first, bounded: unbounded novel input must not make every miss O(templates).
        for &id in ids.iter().rev().take(MAX_SCAN) {
            let Some(t) = self.templates.get(&id.0) else {
                continue;
            };
            let (equal, sim) = Self::similarity(t, tokens, num_const);
            // Exactly one differing constant, and not a verb swap ("Opening" vs "Closing").
            if sim < self.config.cross_threshold || num_const.max(t.num_const) != equal + 1 {
                continue;
            }
            let verb_swap = t.tokens.iter().zip(tokens).any(|(a, b)| {
                **a != **b && !is_wild(a) && !is_wild(b) && is_verb_like(a) && is_verb_like(b)
            });
            if !verb_swap
                && Self::differences_are_variables(t, tokens)
                && best.is_none_or(|(s, c, _)| (sim, t.count) > (s, c))
            {
                best = Some((sim, t.count, id));
            }
        }
        best.map(|(_, _, id)| id)
    }

    fn create(&mut self, h: u64, leaf: LeafKey, tokens: &[&str], num_const: usize) -> TemplateId {
        if self.templates.len() >= self.config.max_templates.max(1) {
            self.evict();
        }
        let mut raw = h;
        while self.templates.contains_key(&raw) {
            raw = stable_hash(&[&raw.to_le_bytes(), b"salt"]);
        }
        let id = TemplateId(raw);
        self.templates.insert(
            raw,
            Template {
                tokens: tokens.iter().map(|t| Box::<str>::from(*t)).collect(),
                num_const,
                count: 0,
                last_seen: self.tick,
                leaves: vec![leaf.0],
            },
        );
        self.leaves.entry(leaf).or_default().push(id);
        self.by_len.entry(tokens.len() as u64).or_default().push(id);
        id
    }

    /// Evicts the coldest sixteenth of the templates (least recently seen).
    fn evict(&mut self) {
        let k = (self.templates.len() / 16).max(1);
        let mut ages: Vec<(u64, u64)> = self
            .templates
            .iter()
            .map(|(id, t)| (t.last_seen, *id))
            .collect();
        ages.select_nth_unstable(k - 1);
        let gone: std::collections::HashSet<u64> = ages[..k].iter().map(|(_, id)| *id).collect();
        for id in &gone {
            self.templates.remove(id);
            if self.evicted.len() < self.config.max_templates.max(1024) {
                self.evicted.push(TemplateId(*id));
            }
        }
        self.leaves.retain(|_, v| {
            v.retain(|id| !gone.contains(&id.0));
            !v.is_empty()
        });
        self.by_len.retain(|_, v| {
            v.retain(|id| !gone.contains(&id.0));
            !v.is_empty()
        });
        self.exact.retain(|_, id| !gone.contains(&id.0));
        self.num_evictions += gone.len() as u64;
    }

    /// Ids evicted since the last call, so callers can drop what they keep per template.
    pub fn drain_evicted(&mut self) -> Vec<TemplateId> {
        std::mem::take(&mut self.evicted)
    }

    /// The template text of `id` (tokens joined by single spaces), if it is still kept.
    pub fn template(&self, id: TemplateId) -> Option<String> {
        self.templates.get(&id.0).map(|t| t.tokens.join(" "))
    }

    /// Appends the template text of `id` to `out`; returns false when it is not kept.
    pub fn write_template(&self, id: TemplateId, out: &mut String) -> bool {
        let Some(t) = self.templates.get(&id.0) else {
            return false;
        };
        for (i, tok) in t.tokens.iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(tok);
        }
        true
    }

    /// All kept templates, most frequent first (ties by id).
    pub fn templates(&self) -> Vec<TemplateInfo> {
        let mut v: Vec<TemplateInfo> = self
            .templates
            .iter()
            .map(|(id, t)| TemplateInfo {
                id: TemplateId(*id),
                template: t.tokens.join(" "),
                count: t.count,
            })
            .collect();
        v.sort_by(|a, b| b.count.cmp(&a.count).then(a.id.cmp(&b.id)));
        v
    }

    /// The state to persist; [`TemplateMiner::from_state`] restores it with the same ids.
    pub fn state(&self) -> MinerState {
        let mut templates: Vec<TemplateState> = self
            .templates
            .iter()
            .map(|(id, t)| TemplateState {
                id: TemplateId(*id),
                template: t.tokens.join(" "),
                count: t.count,
                last_seen: t.last_seen,
                leaves: t.leaves.clone(),
            })
            .collect();
        templates.sort_by_key(|t| t.id);
        MinerState {
            version: 1,
            config: self.config.clone(),
            tick: self.tick,
            num_evictions: self.num_evictions,
            templates,
        }
    }

    /// Restores a miner from saved state.
    ///
    /// # Errors
    /// An unknown state version or a duplicated template id.
    pub fn from_state(state: MinerState) -> Result<Self, MinerError> {
        if state.version != 1 {
            return Err(MinerError::Version(state.version));
        }
        let mut m = TemplateMiner::new(state.config);
        m.tick = state.tick;
        m.num_evictions = state.num_evictions;
        for t in state.templates {
            if m.templates.contains_key(&t.id.0) {
                return Err(MinerError::DuplicateId(t.id));
            }
            let tokens: Vec<Box<str>> = if t.template.is_empty() {
                Vec::new()
            } else {
                t.template.split(' ').map(Box::from).collect()
            };
            let num_const = tokens.iter().filter(|x| !is_wild(x)).count();
            for &leaf in &t.leaves {
                m.leaves.entry(LeafKey(leaf)).or_default().push(t.id);
            }
            m.by_len.entry(tokens.len() as u64).or_default().push(t.id);
            m.templates.insert(
                t.id.0,
                Template {
                    tokens,
                    num_const,
                    count: t.count,
                    last_seen: t.last_seen,
                    leaves: t.leaves,
                },
            );
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variable_words_and_numbers_join_one_template() {
        let mut m = TemplateMiner::default();
        let a = m.add("tool call to the weather API timed out after 8000 ms");
        let b = m.add("tool call to the hotel API timed out after 5000 ms");
        let c = m.add("KV cache exhausted: no free blocks for seq 12");
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(
            m.template(a).unwrap(),
            "tool call to the <*> API timed out after <*> ms"
        );
    }

    #[test]
    fn a_variable_word_in_the_prefix_does_not_split_a_template() {
        let mut m = TemplateMiner::default();
        let a = m.add("weather API timed out after 8000 ms");
        let b = m.add("hotel API timed out after 5000 ms");
        assert_eq!(a, b);
        let c = m.add("Opening connection to the database server at 10.0.0.1");
        let d = m.add("Closing connection to the database server at 10.0.0.1");
        assert_ne!(c, d, "a verb swap is a different event");
    }

    #[test]
    fn short_lines_that_differ_in_half_their_words_stay_apart() {
        let mut m = TemplateMiner::default();
        let a = m.add("Connection closed by 10.0.0.1");
        let b = m.add("Connection reset by 10.0.0.2");
        assert_ne!(a, b);
    }

    #[test]
    fn ids_are_stable_across_processes_and_restarts() {
        let lines = [
            "a b 1",
            "user alice logged in from 10.0.0.1",
            "user bob logged in from 10.0.0.2",
            "disk full on /dev/sda1",
        ];
        let mut m1 = TemplateMiner::default();
        let ids1: Vec<_> = lines.iter().map(|l| m1.add(l)).collect();
        let mut m2 = TemplateMiner::default();
        let ids2: Vec<_> = lines.iter().map(|l| m2.add(l)).collect();
        assert_eq!(ids1, ids2);
        let json = serde_json::to_string(&m1.state()).unwrap();
        let mut restored = TemplateMiner::from_state(serde_json::from_str(&json).unwrap()).unwrap();
        assert_eq!(restored.add("user carol logged in from 10.0.0.3"), ids1[1]);
        assert_eq!(restored.add("disk full on /dev/sdb2"), ids1[3]);
        assert_eq!(restored.state().templates.len(), m1.state().templates.len());
    }

    #[test]
    fn bad_state_is_refused() {
        let mut s = TemplateMiner::default().state();
        s.version = 9;
        assert!(matches!(
            TemplateMiner::from_state(s),
            Err(MinerError::Version(9))
        ));
        let mut m = TemplateMiner::default();
        m.add("x y");
        let mut s = m.state();
        s.templates.push(s.templates[0].clone());
        assert!(matches!(
            TemplateMiner::from_state(s),
            Err(MinerError::DuplicateId(_))
        ));
    }

    #[test]
    fn memory_is_bounded_and_evictions_are_counted() {
        let mut m = TemplateMiner::new(MinerConfig {
            max_templates: 64,
            ..MinerConfig::default()
        });
        let word = |mut n: usize| {
            let mut s = String::new();
            loop {
                s.push(char::from(b'a' + (n % 26) as u8));
                n /= 26;
                if n == 0 {
                    break s;
                }
            }
        };
        for i in 0..2000usize {
            m.add(&format!("{} {} {}", word(i), word(i + 7919), word(i * 31)));
            assert!(m.num_templates() <= 64);
        }
        assert!(m.num_evictions() > 0);
        // The hot template survives eviction.
        let hot = m.add("steady state line");
        for i in 0..500usize {
            m.add("steady state line");
            m.add(&format!(
                "{} {} {}",
                word(i + 5000),
                word(i + 9000),
                word(i * 17)
            ));
        }
        assert_eq!(m.add("steady state line"), hot);
    }

    proptest::proptest! {
        #[test]
        fn same_line_twice_gets_the_same_id(lines in proptest::collection::vec("[a-z0-9 ]{0,30}", 1..40)) {
            let mut m = TemplateMiner::new(MinerConfig { max_templates: 1000, ..MinerConfig::default() });
            for l in &lines {
                let a = m.add(l);
                let b = m.add(l);
                proptest::prop_assert_eq!(a, b);
                let t = m.template(a).unwrap();
                let mut masked = String::new();
                mask_line(l, &mut masked);
                proptest::prop_assert_eq!(t.split(' ').count(), masked.split(' ').count());
            }
        }
    }
}
