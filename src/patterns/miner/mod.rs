//! The online template miner: one pass, stable ids, bounded memory.
//!
//! ```text
//!  line ──> line cache (hash of the line) ── hit ──> template id
//!    │ miss: mask (super::mask)
//!    v
//!  masked line ──> exact-match cache (hash of the masked line) ── hit ──> template id
//!        │ miss
//!        v
//!  templates in the line's buckets (token count + first literal word): every position equal,
//!  a variable on either side, the same punctuation around a variable (`()` ~ `(<*>)`), or two
//!  values (see below); at least half the compared constants equal ── best ──> join
//!  (differing positions become <*>)
//!        │ none
//!        v
//!  same tokens once runs of <*> are collapsed (`delete <*> <*> <*>` ~ `delete <*>`) ──> join
//!        │ none
//!        v
//!  new template, id = stable hash of its first masked line
//! ```
//!
//! 1. Masking is done first ([`super::mask`]), so most lines of a template are byte-equal after
//!    masking and the exact-match cache answers them without comparing anything.
//! 2. Two lines that differ in a *word* are one template only when the words read as values:
//!    both shaped like values (`chrome.exe`/`Dropbox.exe`, `a/b`, `tty2`/`tty3`), the value of a
//!    `key=` or `key:`, or a word after a word that names one (`user root`/`user news`). A plain
//!    word after an article, a preposition or a noun such as `tool` or `client` (`the weather
//!    API`, `to spawn the instance`) is a value only once that slot has shown
//!    [`MinerConfig::word_slot_values`] different words: until then each word has its own
//!    template; then they are merged into the oldest (the others become aliases of it). Any
//!    other differing word (`creating`/`removing`, `NEW`/`RUNNING`, `startup`/`shutdown`) makes
//!    a different template.
//! 3. A variable that spans a varying number of tokens (a list of block ids) is matched by
//!    collapsing runs of `<*>`.
//!
//! Ids are a hash of the template's first masked line (salted on a collision), so the same
//! input — the same *sequence* of lines: [`super::share`] gives several replicas one — gives the
//! same ids in any process; [`MinerState`] carries templates, aliases and word
//! slots across restarts. Memory is bounded by `max_templates`: when full, the coldest
//! sixteenth is evicted (counted); the two caches, aliases and slots are capped too, and a
//! search compares at most `MAX_SCAN` templates per bucket.
//!
//! The files: this one holds the types and the read side (templates by id, the drains);
//! `mine`: mining a line (search, join, create, word slots, eviction) and `lookup`;
//! `compare`: whether two tokens read as one value or two events; `index`: the search
//! buckets and collapsed forms; `state`: saving and restoring the miner.

mod compare;
mod index;
mod mine;
mod state;

use std::fmt;

use serde::{Deserialize, Serialize};

pub use super::hash::stable_hash;
use super::hash::{IdMap, fast_hash};
use super::mask::WILDCARD;
pub use state::{
    JsonFileStateError, JsonFileStateStore, MinerError, MinerState, MinerStateStore, STATE_VERSION,
    SlotState, TemplateState,
};

/// Starts the key token a keyed line ([`TemplateMiner::add_keyed`]) is mined with: the token
/// is the template's first and is never shown ([`TemplateMiner::template`] leaves it out).
pub const KEY_MARK: char = '\u{1e}';

/// A template's tokens as shown: without its key token.
fn shown(tokens: &[Box<str>]) -> &[Box<str>] {
    match tokens.first() {
        Some(t) if t.starts_with(KEY_MARK) => &tokens[1..],
        _ => tokens,
    }
}

/// `masked` with the key token of `key` in front (nothing for an empty key). Whitespace in the
/// key becomes `_` (a token has none).
fn keyed(key: &str, masked: &mut String) {
    if key.is_empty() {
        return;
    }
    let mut k = String::with_capacity(key.len() + 2);
    k.push(KEY_MARK);
    k.extend(key.chars().map(|c| if c.is_whitespace() { '_' } else { c }));
    if !masked.is_empty() {
        k.push(' ');
    }
    masked.insert_str(0, &k);
}

/// The line cache's hash of a keyed line.
fn line_hash(key: &str, line: &str) -> u64 {
    let h = fast_hash(line.as_bytes());
    if key.is_empty() {
        h
    } else {
        h ^ fast_hash(key.as_bytes()).rotate_left(17)
    }
}

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
    /// Minimum share of equal tokens among the constants two lines are compared on.
    pub sim_threshold: f32,
    /// Different words a slot after an article, preposition or naming noun must show before the
    /// slot is a variable.
    pub word_slot_values: usize,
    /// Templates kept; beyond it the coldest are evicted.
    pub max_templates: usize,
}

impl Default for MinerConfig {
    fn default() -> Self {
        MinerConfig {
            sim_threshold: 0.5,
            word_slot_values: 3,
            max_templates: 50_000,
        }
    }
}

#[derive(Debug, Clone)]
struct Template {
    tokens: Vec<Box<str>>,
    num_const: usize,
    count: u64,
    last_seen: u64,
    /// Creation order (kept by [`MinerState`]).
    seq: u64,
}

impl Template {
    fn new(tokens: Vec<Box<str>>, count: u64, last_seen: u64, seq: u64) -> Self {
        Template {
            num_const: tokens.iter().filter(|x| !is_wild(x)).count(),
            tokens,
            count,
            last_seen,
            seq,
        }
    }
}

/// A template as shown to callers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemplateInfo {
    pub id: TemplateId,
    pub template: String,
    pub count: u64,
}

/// A word slot: templates that differ only in one plain word after an article, preposition or
/// naming noun, and the words seen there so far.
#[derive(Debug, Clone, Default)]
struct Slot {
    members: Vec<TemplateId>,
    words: Vec<u64>,
}

/// The online template miner. Pure: no IO, no clock (its "time" is a line counter).
pub struct TemplateMiner {
    config: MinerConfig,
    templates: IdMap<u64, Template>,
    /// Ids by [`index::bucket`], oldest first.
    by_len: IdMap<u64, Vec<TemplateId>>,
    /// Ids by [`index::bucket`] of their collapsed tokens (see [`index::collapse`]), oldest first.
    by_clen: IdMap<u64, Vec<TemplateId>>,
    /// Hash of the tokens with runs of `<*>` collapsed -> the first template with that form.
    collapsed: IdMap<u64, TemplateId>,
    /// Hash of a masked line -> its template.
    exact: IdMap<u64, TemplateId>,
    /// Hash of a line as given -> its template: a line seen before is not masked again.
    lines: IdMap<u64, TemplateId>,
    /// Merged-away id -> the id it was merged into.
    aliases: IdMap<u64, TemplateId>,
    slots: IdMap<u64, Slot>,
    /// The slot a template about to be created belongs to.
    pending_slot: Option<u64>,
    tick: u64,
    seq: u64,
    num_evictions: u64,
    /// Evicted templates not yet taken by [`TemplateMiner::drain_evicted`] (bounded).
    evicted: Vec<(TemplateId, String)>,
    /// Merges not yet taken by [`TemplateMiner::drain_merged`] (bounded).
    merged: Vec<(TemplateId, TemplateId)>,
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

/// Bytes of a line that are mined; the rest of a longer line is ignored (bounds the memory of
/// one template and the time of one line).
pub const MAX_LINE_BYTES: usize = 16 * 1024;

/// `s` cut to at most `max` bytes, on a char boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl TemplateMiner {
    pub fn new(config: MinerConfig) -> Self {
        TemplateMiner {
            config,
            templates: IdMap::default(),
            by_len: IdMap::default(),
            by_clen: IdMap::default(),
            collapsed: IdMap::default(),
            exact: IdMap::default(),
            lines: IdMap::default(),
            aliases: IdMap::default(),
            slots: IdMap::default(),
            pending_slot: None,
            tick: 0,
            seq: 0,
            num_evictions: 0,
            evicted: Vec::new(),
            merged: Vec::new(),
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

    fn cap(&self) -> usize {
        self.config.max_templates.max(1)
    }

    /// The id `id` stands for now: itself, or the template it was merged into.
    pub fn resolve(&self, mut id: TemplateId) -> TemplateId {
        for _ in 0..16 {
            match self.aliases.get(&id.0) {
                Some(&to) => id = to,
                None => break,
            }
        }
        id
    }

    /// Ids evicted since the last call, so callers can drop what they keep per template.
    pub fn drain_evicted(&mut self) -> Vec<TemplateId> {
        self.drain_evicted_templates()
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    }

    /// Templates evicted since the last call, with their last text.
    pub fn drain_evicted_templates(&mut self) -> Vec<(TemplateId, String)> {
        std::mem::take(&mut self.evicted)
    }

    /// Merges since the last call: `(from, into)`; `from` is now an alias of `into`.
    pub fn drain_merged(&mut self) -> Vec<(TemplateId, TemplateId)> {
        std::mem::take(&mut self.merged)
    }

    /// The template text of `id` (tokens joined by single spaces), if it is still kept. An id
    /// merged into another gives the other's text.
    pub fn template(&self, id: TemplateId) -> Option<String> {
        self.templates
            .get(&self.resolve(id).0)
            .map(|t| shown(&t.tokens).join(" "))
    }

    /// Appends the template text of `id` to `out`; returns false when it is not kept.
    pub fn write_template(&self, id: TemplateId, out: &mut String) -> bool {
        let Some(t) = self.templates.get(&self.resolve(id).0) else {
            return false;
        };
        for (i, tok) in shown(&t.tokens).iter().enumerate() {
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
                template: shown(&t.tokens).join(" "),
                count: t.count,
            })
            .collect();
        v.sort_by(|a, b| b.count.cmp(&a.count).then(a.id.cmp(&b.id)));
        v
    }
}
