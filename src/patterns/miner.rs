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

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

use serde::{Deserialize, Serialize};

use super::mask::{WILDCARD, is_http_method, mask_line};
use super::trace::exception_types_differ;

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

/// The version of [`MinerState`] this build writes and reads.
pub const STATE_VERSION: u32 = 2;

/// Why a saved miner state was refused.
#[derive(Debug, thiserror::Error)]
pub enum MinerError {
    #[error("miner state version {0} is not supported (expected {STATE_VERSION})")]
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

/// The miner's state as saved to the store (JSON). Ids survive a save/load round trip.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MinerState {
    pub version: u32,
    pub config: MinerConfig,
    pub tick: u64,
    pub num_evictions: u64,
    pub templates: Vec<TemplateState>,
    /// Templates merged into another one: `[from, into]`.
    #[serde(default)]
    pub aliases: Vec<[TemplateId; 2]>,
    /// Word slots still counting their words.
    #[serde(default)]
    pub slots: Vec<SlotState>,
}

/// One saved template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TemplateState {
    pub id: TemplateId,
    pub template: String,
    pub count: u64,
    pub last_seen: u64,
}

/// One saved word slot: the templates that differ only in it and the words seen there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlotState {
    pub key: u64,
    pub members: Vec<TemplateId>,
    pub words: Vec<u64>,
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

/// A fast hash of bytes for the exact-match cache and the collapsed index (not an id: ids use
/// [`stable_hash`]). Deterministic, 8 bytes at a time.
fn fast_hash(b: &[u8]) -> u64 {
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
    /// Ids by [`bucket`], oldest first.
    by_len: IdMap<u64, Vec<TemplateId>>,
    /// Ids by [`bucket`] of their collapsed tokens (see [`collapse`]), oldest first.
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

/// Templates compared per search bucket (see [`bucket`]), newest first: a line that matches
/// nothing costs at most six buckets of this many comparisons.
const MAX_SCAN: usize = 256;

/// Words after which a plain word is a name: `user root`, `host web`.
const NAMING_WORDS: &[&str] = &[
    "user", "username", "account", "host", "hostname", "named", "name",
];

/// Words after which a plain word may be a value (`the weather API`, `from DraftWriter`, `tool
/// maps`) or may be the event (`to spawn`, `client SPP`): such a slot becomes a variable only
/// once it has shown [`MinerConfig::word_slot_values`] different words.
const SLOT_WORDS: &[&str] = &[
    "the",
    "a",
    "an",
    "for",
    "from",
    "to",
    "by",
    "of",
    "in",
    "on",
    "at",
    "with",
    "via",
    "as",
    "into",
    "tool",
    "client",
    "service",
    "process",
    "feature",
    "model",
    "agent",
    "session",
    "app",
    "application",
    "package",
    "file",
    "table",
    "queue",
    "topic",
    "pod",
    "container",
    "database",
    "db",
    "bucket",
    "key",
    "id",
    "worker",
    "plugin",
    "module",
    "handler",
    "provider",
    "backend",
    "job",
    "task",
    "stage",
    "group",
    "channel",
];

fn trim_punct(t: &str) -> &str {
    t.trim_start_matches(['(', '[', '{', '"', '\''])
        .trim_end_matches([')', ']', '}', '"', '\'', ',', ';', ':', '.', '!', '?'])
}

fn word_in(t: &str, list: &[&str]) -> bool {
    let t = trim_punct(t);
    list.iter().any(|w| w.eq_ignore_ascii_case(t))
}

/// A plain word: letters, with `-` or `'` inside (`can't`, `re-sync`).
fn is_word(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphabetic()
        && b.iter()
            .all(|x| x.is_ascii_alphabetic() || matches!(x, b'-' | b'\''))
}

/// An enumeration constant: `RUNNING`, `FAIL_TASK_CLEANUP`, `GET`.
fn is_enum(t: &str) -> bool {
    t.len() >= 2
        && t.bytes()
            .all(|x| x.is_ascii_uppercase() || x.is_ascii_digit() || x == b'_')
        && t.as_bytes()[0].is_ascii_uppercase()
}

/// A word shaped like a value: a file or class name (`chrome.exe`, `Session.relayout`), a path
/// (`a/b`), an address (`a@b`), a backslash path, or a `snake_case` identifier.
fn is_value_shaped(t: &str) -> bool {
    let c = trim_punct(t);
    let b = c.as_bytes();
    if b.is_empty() || is_enum(c) {
        return false;
    }
    b.windows(3).any(|w| {
        w[0].is_ascii_alphanumeric()
            && matches!(w[1], b'.' | b'/' | b'@' | b'\\' | b'_')
            && w[2].is_ascii_alphanumeric()
    })
}

/// `tty2`/`tty3`: the same letters with a different number.
fn same_stem_numbered(a: &str, b: &str) -> bool {
    fn stem(t: &str) -> Option<&str> {
        let s = t.trim_end_matches(|c: char| c.is_ascii_digit());
        (s.len() < t.len() && !s.is_empty() && s.bytes().all(|x| x.is_ascii_alphabetic()))
            .then_some(s)
    }
    matches!((stem(trim_punct(a)), stem(trim_punct(b))), (Some(x), Some(y)) if x == y)
}

/// How strongly a differing token reads as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Evidence {
    /// A value: the lines are one template.
    Value,
    /// Maybe a value: counted in a word slot.
    Slot,
    /// A different event.
    Event,
}

/// Two different constants `a` (template) and `b` (line) at one position, after `prev`.
fn value_pair(a: &str, b: &str, prev: Option<&str>) -> Evidence {
    // What differs once the text they share at both ends is set aside: `name=Foo,` and
    // `name=Bar,` differ in `Foo`/`Bar` after the key `name=`.
    let p = common_prefix(a, b);
    let s = common_suffix(a, b, p);
    let (ca, cb) = (&a[p..a.len() - s], &b[p..b.len() - s]);
    let key = a[..p].trim_end_matches(['"', '\'', '(', '[', '{', '<']);
    let named = key.bytes().any(|x| x.is_ascii_alphabetic());
    if named && (key.ends_with('=') || key.ends_with(':') || key.len() < p) {
        // The value of a `key=`, `key:` or `call(…)` (`tag="x"`, `state:LOOKING`, `chdir(x)`)
        // unless the two are enumeration constants (`action=ACTION_UP`) or a word against a
        // value of another shape (`tty=NODEVssh` against `tty=:0`).
        let keyed = key.ends_with('=') || key.ends_with(':');
        let var_vs_word = |x: &str, y: &str| is_wild(x) && !y.contains(WILDCARD);
        let shaped_var = |x: &str| x.contains(WILDCARD) && !is_wild(x);
        // HTTP methods are a request's values (`method=GET` / `method=POST`), not events.
        let http = |x: &str| is_http_method(trim_punct(x));
        let enums = is_enum(ca) && is_enum(cb) && !(http(&a[p..]) && http(&b[p..]));
        let word_vs_shaped = (is_word(ca) && shaped_var(cb)) || (is_word(cb) && shaped_var(ca));
        let ok = if keyed {
            !enums && !word_vs_shaped
        } else {
            var_vs_word(ca, cb) || var_vs_word(cb, ca)
        };
        if ok {
            return Evidence::Value;
        }
    }
    if (is_value_shaped(a) && is_value_shaped(b)) || same_stem_numbered(a, b) {
        return Evidence::Value;
    }
    // A quoted value (`'x'`, `"x"`), or a variable against a value-shaped word (`<*>}` against
    // `com.whatsapp}`).
    let quoted = |x: &[u8]| x.ends_with(b"\"") || x.ends_with(b"'");
    if p > 0
        && quoted(&a.as_bytes()[..p])
        && s > 0
        && matches!(a.as_bytes()[a.len() - s], b'"' | b'\'')
    {
        return Evidence::Value;
    }
    if (is_wild(ca) && is_value_shaped(cb)) || (is_wild(cb) && is_value_shaped(ca)) {
        return Evidence::Value;
    }
    word_evidence(a, b, prev)
}

/// A differing plain word: a name after `user`, maybe a value after `the`, else an event.
fn word_evidence(a: &str, b: &str, prev: Option<&str>) -> Evidence {
    let (ca, cb) = (trim_punct(a), trim_punct(b));
    // A word, a name with a number (`test9`), or a variable.
    let wordish = |c: &str| {
        is_word(c)
            || is_wild(c)
            || c.contains(WILDCARD)
            || (c.as_bytes().first().is_some_and(u8::is_ascii_alphabetic)
                && c.bytes().all(|x| x.is_ascii_alphanumeric() || x == b'_'))
    };
    if !wordish(ca) || !wordish(cb) {
        return Evidence::Event;
    }
    let Some(prev) = prev else {
        return Evidence::Event;
    };
    // `START: ftp`: the value of a key token.
    let key_token = is_key_token(prev);
    // `Killed process <*> (java)`: a bracketed word after a variable.
    let bracketed = |t: &str| {
        (t.starts_with('(') && t.trim_end_matches(['.', ',', ';']).ends_with(')'))
            || (t.starts_with('[') && t.trim_end_matches(['.', ',', ';']).ends_with(']'))
    };
    let slotted = word_in(prev, SLOT_WORDS)
        || key_token
        || (is_wild(prev) && bracketed(a) && bracketed(b))
        || (is_wild(prev) && (is_wild(ca) || is_wild(cb)) && (bracketed(a) || bracketed(b)));
    if word_in(prev, NAMING_WORDS) || (slotted && (is_wild(ca) || is_wild(cb))) {
        // A name after `user`, or a word where the same slot holds a variable elsewhere.
        Evidence::Value
    } else if (word_in(prev, SLOT_WORDS)
        || key_token
        || (is_wild(prev) && bracketed(a) && bracketed(b)))
        && !is_enum(ca)
        && !is_enum(cb)
    {
        Evidence::Slot
    } else {
        Evidence::Event
    }
}

/// Length of the common prefix, on a char boundary.
fn common_prefix(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while !a.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// Length of the common suffix, on a char boundary, not overlapping `skip` leading bytes.
fn common_suffix(a: &str, b: &str, skip: usize) -> usize {
    let max = a.len().min(b.len()) - skip;
    let mut n = a
        .bytes()
        .rev()
        .zip(b.bytes().rev())
        .take(max)
        .take_while(|(x, y)| x == y)
        .count();
    while !a.is_char_boundary(a.len() - n) {
        n -= 1;
    }
    n
}

/// The punctuation of a token around its variables: `(uid=<*>)` -> `(uid=)`.
fn same_skeleton(a: &str, b: &str) -> bool {
    (a.contains(WILDCARD) || b.contains(WILDCARD))
        && a.split(WILDCARD)
            .flat_map(str::bytes)
            .eq(b.split(WILDCARD).flat_map(str::bytes))
}

/// The token that covers both `a` and `b`: `<*>`, or `<*>` between the punctuation they share
/// (`tag="a",` + `tag="b",` -> `tag="<*>",`; `()` + `(<*>)` -> `(<*>)`).
fn generalise(a: &str, b: &str) -> Option<String> {
    if a == b || is_wild(a) {
        return None;
    }
    if is_wild(b) {
        return Some(WILDCARD.to_string());
    }
    if same_skeleton(a, b) {
        return (!a.contains(WILDCARD)).then(|| b.to_string());
    }
    let mut p = common_prefix(a, b);
    // Keep a prefix only up to its last punctuation (`tag="`, `(`), not into a word.
    while p > 0 && a.as_bytes()[p - 1].is_ascii_alphanumeric() {
        p -= 1;
    }
    let mut s = common_suffix(a, b, p);
    let punct = |x: &u8| !x.is_ascii_alphanumeric() && *x != b'*' && *x != b'<' && *x != b'>';
    while s > 0 && !a.as_bytes()[a.len() - s..].iter().all(punct) {
        s -= 1;
    }
    let g = format!("{}{WILDCARD}{}", &a[..p], &a[a.len() - s..]);
    (g != a).then_some(g)
}

/// Result of comparing a template with a line of the same token count.
#[derive(Debug, Clone, Copy)]
enum Cmp {
    Join { eq: usize, diff: usize },
    Slot { eq: usize, diff: usize, pos: usize },
    Apart,
}

fn compare(t: &[Box<str>], line: &[&str]) -> Cmp {
    let (mut eq, mut diff, mut slot) = (0, 0, None);
    for (i, (a, &b)) in t.iter().zip(line).enumerate() {
        let a: &str = a;
        if a == b {
            eq += usize::from(!is_wild(a));
            continue;
        }
        // A key or an exception type is a constant: never a variable, never joined.
        if a.starts_with(KEY_MARK) || b.starts_with(KEY_MARK) || exception_types_differ(a, b) {
            return Cmp::Apart;
        }
        if is_wild(a) {
            continue;
        }
        let prev = i.checked_sub(1).map(|k| line[k]);
        let ev = if is_wild(b) {
            if a.contains(WILDCARD) || is_value_shaped(a) {
                Evidence::Value
            } else {
                word_evidence(a, b, prev)
            }
        } else if same_skeleton(a, b) {
            eq += 1;
            continue;
        } else {
            value_pair(a, b, prev)
        };
        match ev {
            Evidence::Value => diff += 1,
            Evidence::Slot if slot.is_none() => slot = Some(i),
            _ => return Cmp::Apart,
        }
    }
    match slot {
        Some(pos) => Cmp::Slot { eq, diff, pos },
        None => Cmp::Join { eq, diff },
    }
}

/// The tokens with every quoted span of several tokens made one `"<*>"` (`tag="View Lock",` ->
/// `tag="<*>",`) and every run of `<*>` collapsed to one.
fn collapse<S: AsRef<str>>(tokens: &[S]) -> Vec<String> {
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

fn collapsed_hash<S: AsRef<str>>(tokens: &[S]) -> u64 {
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
fn bucket<S: AsRef<str>>(tokens: &[S]) -> u64 {
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

/// `START:`: a key word and a colon, which makes the next word its value.
fn is_key_token(t: &str) -> bool {
    t.len() >= 3 && t.ends_with(':') && t[..t.len() - 1].bytes().all(|x| x.is_ascii_alphabetic())
}

/// The buckets a line with these tokens searches (see [`bucket`]).
fn line_buckets<S: AsRef<str>>(tokens: &[S]) -> [Option<u64>; 3] {
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

/// What a search for a line's template found.
#[derive(Debug, Clone, Copy)]
enum Found {
    Join(TemplateId),
    /// A template that differs from the line in one word slot at this position.
    Slot(TemplateId, usize),
    Nothing,
}

/// The key of the word slot at `pos` of a template with these tokens.
fn slot_key(tokens: &[Box<str>], pos: usize) -> u64 {
    let mut parts: Vec<&[u8]> = Vec::with_capacity(tokens.len() + 1);
    let p = (pos as u64).to_le_bytes();
    parts.push(&p);
    for (i, tok) in tokens.iter().enumerate() {
        parts.push(if i == pos { b"" } else { tok.as_bytes() });
    }
    stable_hash(&parts)
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

    /// Mines one line (raw with a header, or message only) and returns its template's id.
    pub fn add(&mut self, line: &str) -> TemplateId {
        self.add_keyed("", line)
    }

    /// Mines one line under a key (a failure's exception type and stack fingerprint): lines
    /// of different keys never share a template, and the key is part of the template's id.
    /// The key is not part of the template's text. `add_keyed("", line)` is `add(line)`.
    pub fn add_keyed(&mut self, key: &str, line: &str) -> TemplateId {
        self.tick += 1;
        let line = truncate(line, MAX_LINE_BYTES);
        let lh = line_hash(key, line);
        if let Some(&id) = self.lines.get(&lh) {
            let id = self.resolve(id);
            if let Some(t) = self.templates.get_mut(&id.0) {
                t.count += 1;
                t.last_seen = self.tick;
                return id;
            }
        }
        let mut masked = std::mem::take(&mut self.scratch);
        mask_line(line, &mut masked);
        keyed(key, &mut masked);
        let id = self.add_masked(&masked);
        self.scratch = masked;
        if self.lines.len() >= self.cap().saturating_mul(4).max(1024) {
            self.lines.clear();
        }
        self.lines.insert(lh, id);
        id
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

    fn add_masked(&mut self, masked: &str) -> TemplateId {
        let h = fast_hash(masked.as_bytes());
        if let Some(&id) = self.exact.get(&h) {
            let id = self.resolve(id);
            if let Some(t) = self.templates.get_mut(&id.0) {
                t.count += 1;
                t.last_seen = self.tick;
                return id;
            }
        }
        let tokens: Vec<&str> = if masked.is_empty() {
            Vec::new()
        } else {
            masked.split(' ').collect()
        };
        let id = match self.find(&tokens) {
            Some(id) => self.join(id, &tokens),
            None => self.create(masked, &tokens),
        };
        if self.exact.len() >= self.cap().saturating_mul(4).max(1024) {
            self.exact.clear();
        }
        self.exact.insert(h, id);
        id
    }

    fn find(&mut self, tokens: &[&str]) -> Option<TemplateId> {
        self.pending_slot = None;
        match self.search(tokens) {
            Found::Join(id) => Some(id),
            Found::Slot(id, pos) => self.count_slot_word(id, pos, tokens[pos]),
            Found::Nothing => None,
        }
    }

    /// The template `tokens` join (read-only): a template of the same shape, a word slot, or a
    /// template of the same collapsed form.
    fn search(&self, tokens: &[&str]) -> Found {
        let thr = self.config.sim_threshold;
        let similar = |eq: usize, diff: usize| eq >= 1 && eq as f32 >= thr * (eq + diff) as f32;
        let mut best: Option<(usize, u64, TemplateId)> = None;
        let mut slot: Option<(usize, TemplateId, usize)> = None;
        let buckets = line_buckets(tokens);
        for ids in buckets.iter().flatten().filter_map(|k| self.by_len.get(k)) {
            for &id in ids.iter().rev().take(MAX_SCAN) {
                let Some(t) = self.templates.get(&id.0) else {
                    continue;
                };
                if t.tokens.len() != tokens.len() {
                    continue;
                }
                match compare(&t.tokens, tokens) {
                    Cmp::Join { eq, diff } => {
                        let ok = similar(eq, diff)
                            || (t.num_const == 0 && tokens.iter().all(|x| is_wild(x)));
                        if ok && best.is_none_or(|(e, c, _)| (eq, t.count) > (e, c)) {
                            best = Some((eq, t.count, id));
                        }
                    }
                    Cmp::Slot { eq, diff, pos } => {
                        if similar(eq, diff + 1) && slot.is_none_or(|(e, _, _)| eq > e) {
                            slot = Some((eq, id, pos));
                        }
                    }
                    Cmp::Apart => {}
                }
            }
        }
        if let Some((_, _, id)) = best {
            return Found::Join(id);
        }
        if let Some((_, id, pos)) = slot {
            return Found::Slot(id, pos);
        }
        // A variable spanning a different number of tokens: compare the collapsed forms.
        let cl = collapse(tokens);
        let ck = collapsed_hash(tokens);
        if let Some(&id) = self.collapsed.get(&ck) {
            let id = self.resolve(id);
            if let Some(t) = self.templates.get(&id.0)
                && t.tokens.len() != tokens.len()
                && collapsed_hash(&t.tokens) == ck
            {
                return Found::Join(id);
            }
        }
        let cl_refs: Vec<&str> = cl.iter().map(String::as_str).collect();
        let mut best: Option<(usize, u64, TemplateId)> = None;
        for ids in line_buckets(&cl)
            .iter()
            .flatten()
            .filter_map(|k| self.by_clen.get(k))
        {
            for &id in ids.iter().rev().take(MAX_SCAN) {
                let Some(t) = self.templates.get(&id.0) else {
                    continue;
                };
                if t.tokens.len() == tokens.len()
                    || (t.tokens.len() == cl.len() && cl.len() == tokens.len())
                {
                    continue;
                }
                let tc: Vec<Box<str>> = collapse(&t.tokens).into_iter().map(Box::from).collect();
                if tc.len() != cl.len() {
                    continue;
                }
                if let Cmp::Join { eq, diff } = compare(&tc, &cl_refs)
                    && similar(eq, diff)
                    && best.is_none_or(|(e, c, _)| (eq, t.count) > (e, c))
                {
                    best = Some((eq, t.count, id));
                }
            }
        }
        best.map_or(Found::Nothing, |(_, _, id)| Found::Join(id))
    }

    /// The template id [`TemplateMiner::add`] would give `line` now, without mining it (no
    /// count, no cache, no slot changes): the template it joins, the template a word slot it
    /// completes merges into, or the id a new template from it would take. Used to tag a
    /// failure at ingest while the line itself is mined later (docs/SCALING.md, shared miner).
    pub fn lookup(&self, line: &str) -> TemplateId {
        self.lookup_keyed("", line)
    }

    /// [`TemplateMiner::lookup`] for [`TemplateMiner::add_keyed`].
    pub fn lookup_keyed(&self, key: &str, line: &str) -> TemplateId {
        let line = truncate(line, MAX_LINE_BYTES);
        if let Some(&id) = self.lines.get(&line_hash(key, line)) {
            let id = self.resolve(id);
            if self.templates.contains_key(&id.0) {
                return id;
            }
        }
        let mut masked = String::with_capacity(line.len());
        mask_line(line, &mut masked);
        keyed(key, &mut masked);
        if let Some(&id) = self.exact.get(&fast_hash(masked.as_bytes())) {
            let id = self.resolve(id);
            if self.templates.contains_key(&id.0) {
                return id;
            }
        }
        let tokens: Vec<&str> = if masked.is_empty() {
            Vec::new()
        } else {
            masked.split(' ').collect()
        };
        match self.search(&tokens) {
            Found::Join(id) => return id,
            Found::Slot(id, pos) => {
                if let Some(t) = self.templates.get(&id.0) {
                    let key = slot_key(&t.tokens, pos);
                    let own = stable_hash(&[t.tokens[pos].as_bytes()]);
                    let w = stable_hash(&[tokens[pos].as_bytes()]);
                    let (members, mut words) =
                        self.slots.get(&key).map_or((Vec::new(), Vec::new()), |s| {
                            (s.members.clone(), s.words.clone())
                        });
                    for x in [own, w] {
                        if !words.contains(&x) {
                            words.push(x);
                        }
                    }
                    if words.len() >= self.config.word_slot_values.max(2) {
                        // The slot completes: its templates merge into the oldest member.
                        let head = members
                            .iter()
                            .chain(std::iter::once(&id))
                            .map(|m| self.resolve(*m))
                            .find(|m| self.templates.contains_key(&m.0));
                        if let Some(head) = head {
                            return head;
                        }
                    }
                }
            }
            Found::Nothing => {}
        }
        self.new_id(&masked)
    }

    /// The id a template created now from `masked` takes (salted past every id in use).
    fn new_id(&self, masked: &str) -> TemplateId {
        let mut raw = stable_hash(&[masked.as_bytes()]);
        while self.templates.contains_key(&raw) || self.aliases.contains_key(&raw) {
            raw = stable_hash(&[&raw.to_le_bytes(), b"salt"]);
        }
        TemplateId(raw)
    }

    /// Counts `word` in the slot at `pos` of template `id`; once the slot has shown enough
    /// words, merges its templates into the oldest and returns it.
    fn count_slot_word(&mut self, id: TemplateId, pos: usize, word: &str) -> Option<TemplateId> {
        let t = self.templates.get(&id.0)?;
        let key = slot_key(&t.tokens, pos);
        let own = stable_hash(&[t.tokens[pos].as_bytes()]);
        let w = stable_hash(&[word.as_bytes()]);
        if self.slots.len() >= self.cap() && !self.slots.contains_key(&key) {
            self.slots.clear();
        }
        let s = self.slots.entry(key).or_default();
        if !s.members.contains(&id) {
            s.members.push(id);
        }
        for x in [own, w] {
            if !s.words.contains(&x) {
                s.words.push(x);
            }
        }
        if s.words.len() < self.config.word_slot_values.max(2) {
            self.pending_slot = Some(key);
            return None;
        }
        let s = self.slots.remove(&key).unwrap_or_default();
        let mut members: Vec<TemplateId> = Vec::new();
        for m in s.members {
            let m = self.resolve(m);
            if self.templates.contains_key(&m.0) && !members.contains(&m) {
                members.push(m);
            }
        }
        let head = *members.first()?;
        for &m in &members[1..] {
            self.merge_into(m, head);
        }
        Some(head)
    }

    /// Merges template `from` into `into`: counts add up, `from` becomes an alias.
    fn merge_into(&mut self, from: TemplateId, into: TemplateId) {
        if from == into {
            return;
        }
        let Some(f) = self.templates.remove(&from.0) else {
            return;
        };
        self.unindex(from, &f.tokens);
        let tick = self.tick;
        let mut reindex = None;
        if let Some(t) = self.templates.get_mut(&into.0) {
            t.count += f.count;
            t.last_seen = t.last_seen.max(f.last_seen).max(tick);
            if t.tokens.len() == f.tokens.len() {
                let old = t.tokens.clone();
                for (slot, tok) in t.tokens.iter_mut().zip(&f.tokens) {
                    if let Some(g) = generalise(slot, tok) {
                        *slot = g.into();
                    }
                }
                t.num_const = t.tokens.iter().filter(|x| !is_wild(x)).count();
                if old != t.tokens {
                    reindex = Some((old, t.tokens.clone()));
                }
            }
        }
        if let Some((old, new)) = reindex {
            self.unindex(into, &old);
            self.index(into, &new);
        }
        self.aliases.insert(from.0, into);
        if self.aliases.len() > self.cap() {
            // Bounded: an alias only saves a lookup (and tells old ids apart); drop them all.
            self.aliases.clear();
        }
        if self.merged.len() < self.cap() {
            self.merged.push((from, into));
        }
    }

    /// Puts template `id` (with `tokens`) into the search indexes.
    fn index(&mut self, id: TemplateId, tokens: &[Box<str>]) {
        self.by_len.entry(bucket(tokens)).or_default().push(id);
        self.by_clen
            .entry(bucket(&collapse(tokens)))
            .or_default()
            .push(id);
        self.collapsed.entry(collapsed_hash(tokens)).or_insert(id);
    }

    /// Takes template `id` (with `tokens`) out of the search indexes.
    fn unindex(&mut self, id: TemplateId, tokens: &[Box<str>]) {
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

    /// Generalises template `id` with a line it matched.
    /// Returns the template's id afterwards (another one when the two became the same).
    fn join(&mut self, id: TemplateId, tokens: &[&str]) -> TemplateId {
        let tick = self.tick;
        let Some(t) = self.templates.get_mut(&id.0) else {
            return id;
        };
        t.count += 1;
        t.last_seen = tick;
        let mut next: Option<Vec<Box<str>>> = None;
        if t.tokens.len() == tokens.len() {
            for (i, tok) in tokens.iter().enumerate() {
                if let Some(g) = generalise(&t.tokens[i], tok) {
                    next.get_or_insert_with(|| t.tokens.clone())[i] = g.into();
                }
            }
        } else {
            // Matched in the collapsed form: the template takes it.
            next = Some(collapse(&t.tokens).into_iter().map(Box::from).collect());
        }
        let Some(new) = next else {
            return id;
        };
        let old = std::mem::replace(&mut t.tokens, new);
        t.num_const = t.tokens.iter().filter(|x| !is_wild(x)).count();
        let (new, seq) = (t.tokens.clone(), t.seq);
        self.unindex(id, &old);
        self.index(id, &new);
        // Generalised into another template's collapsed form (`chrome.exe <*> -` became
        // `<*> <*> -`, which collapses like `<*> -`): the two are one template, the older id.
        let ck = collapsed_hash(&new);
        if let Some(&other) = self.collapsed.get(&ck)
            && other != id
            && let Some(o) = self.templates.get(&other.0)
            && collapsed_hash(&o.tokens) == ck
        {
            let (from, into) = if o.seq < seq {
                (id, other)
            } else {
                (other, id)
            };
            let (ft, it) = (
                self.templates[&from.0].tokens.clone(),
                self.templates[&into.0].tokens.clone(),
            );
            self.merge_into(from, into);
            self.collapsed.insert(ck, into);
            if ft.len() != it.len()
                && let Some(t) = self.templates.get_mut(&into.0)
            {
                // Of different lengths: the survivor takes the collapsed form.
                let c: Vec<Box<str>> = collapse(&t.tokens).into_iter().map(Box::from).collect();
                if c != t.tokens {
                    let old = std::mem::replace(&mut t.tokens, c);
                    t.num_const = t.tokens.iter().filter(|x| !is_wild(x)).count();
                    let new = t.tokens.clone();
                    self.unindex(into, &old);
                    self.index(into, &new);
                }
            }
            return into;
        }
        id
    }

    fn create(&mut self, masked: &str, tokens: &[&str]) -> TemplateId {
        let pending = self.pending_slot.take();
        if self.templates.len() >= self.cap() {
            self.evict();
        }
        let id = self.new_id(masked);
        let raw = id.0;
        self.seq += 1;
        let toks: Vec<Box<str>> = tokens.iter().map(|t| Box::<str>::from(*t)).collect();
        self.index(id, &toks);
        self.templates
            .insert(raw, Template::new(toks, 1, self.tick, self.seq));
        if let Some(key) = pending
            && let Some(s) = self.slots.get_mut(&key)
        {
            s.members.push(id);
        }
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
            if let Some(t) = self.templates.remove(id)
                && self.evicted.len() < self.cap().max(1024)
            {
                self.evicted
                    .push((TemplateId(*id), shown(&t.tokens).join(" ")));
            }
        }
        for map in [&mut self.by_len, &mut self.by_clen] {
            map.retain(|_, v| {
                v.retain(|id| !gone.contains(&id.0));
                !v.is_empty()
            });
        }
        self.collapsed.retain(|_, id| !gone.contains(&id.0));
        self.exact.retain(|_, id| !gone.contains(&id.0));
        self.lines.retain(|_, id| !gone.contains(&id.0));
        self.aliases.retain(|_, id| !gone.contains(&id.0));
        self.slots.retain(|_, s| {
            s.members.retain(|id| !gone.contains(&id.0));
            !s.members.is_empty()
        });
        self.num_evictions += gone.len() as u64;
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

    /// The state to persist; [`TemplateMiner::from_state`] restores it with the same ids.
    pub fn state(&self) -> MinerState {
        let mut ts: Vec<(&u64, &Template)> = self.templates.iter().collect();
        ts.sort_by_key(|(_, t)| t.seq);
        let templates = ts
            .into_iter()
            .map(|(id, t)| TemplateState {
                id: TemplateId(*id),
                template: t.tokens.join(" "),
                count: t.count,
                last_seen: t.last_seen,
            })
            .collect();
        let mut aliases: Vec<[TemplateId; 2]> = self
            .aliases
            .iter()
            .map(|(from, to)| [TemplateId(*from), *to])
            .collect();
        aliases.sort();
        let mut slots: Vec<SlotState> = self
            .slots
            .iter()
            .map(|(key, s)| SlotState {
                key: *key,
                members: s.members.clone(),
                words: s.words.clone(),
            })
            .collect();
        slots.sort_by_key(|s| s.key);
        MinerState {
            version: STATE_VERSION,
            config: self.config.clone(),
            tick: self.tick,
            num_evictions: self.num_evictions,
            templates,
            aliases,
            slots,
        }
    }

    /// Restores a miner from saved state (templates in the order they were created).
    ///
    /// # Errors
    /// An unknown state version or a duplicated template id.
    pub fn from_state(state: MinerState) -> Result<Self, MinerError> {
        if state.version != STATE_VERSION {
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
            m.seq += 1;
            m.index(t.id, &tokens);
            m.templates
                .insert(t.id.0, Template::new(tokens, t.count, t.last_seen, m.seq));
        }
        for [from, to] in state.aliases {
            m.aliases.insert(from.0, to);
        }
        for s in state.slots {
            m.slots.insert(
                s.key,
                Slot {
                    members: s.members,
                    words: s.words,
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
    fn exception_types_are_never_merged_and_keys_never_meet() {
        let mut m = TemplateMiner::default();
        let a = m.add("httpx.ConnectTimeout: timed out");
        let b = m.add("httpx.ReadTimeout: timed out");
        assert_ne!(a, b);
        let c =
            m.add("requests.exceptions.ConnectTimeout: HTTPSConnectionPool(host='a', port=443)");
        let d =
            m.add("requests.exceptions.ConnectionError: HTTPSConnectionPool(host='b', port=443)");
        assert_ne!(c, d);
        assert_eq!(
            m.template(b).as_deref(),
            Some("httpx.ReadTimeout: timed out")
        );
        // A template with a variable at a type's position does not take a type there.
        let v = m.add("call failed with 500");
        assert_ne!(m.add("call failed with RuntimeError"), v);
        // Keys: the same text under two keys, two templates; the key is not shown, survives
        // a state round trip, and `lookup_keyed` agrees with `add_keyed`.
        let k1 = m.add_keyed("RuntimeError@00ff", "engine step failed after 3 ms");
        let k2 = m.add_keyed("ValueError", "engine step failed after 4 ms");
        assert_ne!(k1, k2);
        assert_eq!(
            m.lookup_keyed("ValueError", "engine step failed after 9 ms"),
            k2
        );
        assert_eq!(
            m.add_keyed("ValueError", "engine step failed after 9 ms"),
            k2
        );
        assert_eq!(
            m.template(k1).as_deref(),
            Some("engine step failed after <*> ms")
        );
        assert!(m.templates().iter().all(|t| !t.template.contains(KEY_MARK)));
        let back = TemplateMiner::from_state(m.state()).unwrap();
        assert_eq!(
            back.lookup_keyed("RuntimeError@00ff", "engine step failed after 7 ms"),
            k1
        );
        assert_ne!(back.lookup("engine step failed after 7 ms"), k1);
    }

    fn final_ids(m: &TemplateMiner, ids: &[TemplateId]) -> Vec<TemplateId> {
        ids.iter().map(|i| m.resolve(*i)).collect()
    }

    #[test]
    fn numbers_join_and_a_slot_word_joins_once_it_varies() {
        let mut m = TemplateMiner::default();
        let lines = [
            "tool call to the weather API timed out after 8000 ms",
            "tool call to the hotel API timed out after 5000 ms",
            "tool call to the weather API timed out after 100 ms",
            "KV cache exhausted: no free blocks for seq 12",
            "tool call to the maps API timed out after 7 ms",
            "tool call to the flights API timed out after 9 ms",
        ];
        let ids: Vec<_> = lines.iter().map(|l| m.add(l)).collect();
        assert_eq!(ids[0], ids[2], "numbers are variables");
        assert_ne!(ids[0], ids[1], "two words in the slot: not yet a variable");
        let f = final_ids(&m, &ids);
        assert_eq!(f[0], f[1]);
        assert_eq!(f[0], f[4]);
        assert_eq!(f[0], f[5]);
        assert_eq!(f[0], ids[0], "the oldest template keeps its id");
        assert_ne!(f[0], f[3]);
        assert_eq!(
            m.template(ids[1]).unwrap(),
            "tool call to the <*> API timed out after <*> ms"
        );
        assert_eq!(m.drain_merged(), vec![(ids[1], ids[0])]);
    }

    #[test]
    fn lookup_tells_the_id_add_would_give() {
        let mut m = TemplateMiner::default();
        let lines = [
            "tool call to the weather API timed out after 8000 ms",
            "tool call to the hotel API timed out after 5000 ms",
            "tool call to the weather API timed out after 100 ms",
            "KV cache exhausted: no free blocks for seq 12",
            "tool call to the maps API timed out after 7 ms",
            "tool call to the flights API timed out after 9 ms",
            "user alice logged in from 10.0.0.1",
            "user bob logged in from 10.0.0.2",
        ];
        // New, joining, a slot still counting (a new template), a slot completing (merged into
        // the oldest), a name after `user`: lookup (read-only, `&self`) says what add returns.
        for l in lines {
            let looked = m.lookup(l);
            assert_eq!(m.add(l), looked, "{l}");
        }
        // The slot completed on `maps`: its templates merged into the first one.
        assert_eq!(
            m.lookup("tool call to the trains API timed out after 1 ms"),
            m.lookup(lines[0])
        );
        assert_ne!(m.lookup("disk full on /dev/sda1"), m.lookup(lines[3]));
    }

    #[test]
    fn words_that_name_the_event_stay_apart() {
        let pairs = [
            (
                "creating device node '/udev/vcs2'",
                "removing device node '/udev/vcs2'",
            ),
            ("cupsd startup succeeded", "cupsd shutdown succeeded"),
            (
                "Took 1.5 seconds to spawn the instance",
                "Took 2.5 seconds to destroy the instance",
            ),
            (
                "job_1 Transitioned from NEW to INITED",
                "job_2 Transitioned from INITED to SETUP",
            ),
            (
                "Session: 1_2 initialized by client SPP.",
                "Session: 3_4 initialized by client WindowsUpdateAgent.",
            ),
            (
                "getTasks: caller 1 does not hold REAL_GET_TASKS",
                "getRecentTasks: caller 1 does not hold REAL_GET_TASKS",
            ),
            (
                "BIOS-e820: 0000000a - 0000000b (reserved)",
                "BIOS-e820: 0000000a - 0000000b (usable)",
            ),
            (
                "Fan speeds ( 3552 3534 **** 3515 )",
                "Fan speeds ( 3552 3534 4245 3515 )",
            ),
            (
                "available network connection via interface ee0",
                "available network connection via interface alt0",
            ),
            ("Link ok", "Link error"),
        ];
        for (a, b) in pairs {
            let mut m = TemplateMiner::default();
            assert_ne!(m.add(a), m.add(b), "{a} / {b}");
        }
    }

    #[test]
    fn values_join_one_template() {
        let groups: &[&[&str]] = &[
            &[
                "session opened for user root by (uid=0)",
                "session opened for user news by (uid=9)",
            ],
            &[
                "chrome.exe - proxy.example.org:5070 close, 0 bytes sent, lifetime <1 sec",
                "Dropbox.exe - a.b.com:443 close, 12 bytes sent, lifetime 00:01",
            ],
            &[
                "acquire lock=1, tag=\"NlpWakeLock\", name=Foo",
                "acquire lock=2, tag=\"*alarm*\", name=Bar",
            ],
            &["LOGIN ON tty2 by root", "LOGIN ON tty3 by root"],
            &[
                "Invalid user test9 from 1.2.3.4",
                "Invalid user webmaster from 1.2.3.5",
            ],
            &[
                "Deleting block blk_1 file /a/b/c",
                "Deleting block blk_-2 file d/e/f",
            ],
            &["setLightsOn(true)", "setLightsOn(false)"],
        ];
        for g in groups {
            let mut m = TemplateMiner::default();
            let ids: Vec<_> = g.iter().map(|l| m.add(l)).collect();
            assert!(ids.iter().all(|i| *i == ids[0]), "{g:?}");
        }
    }

    #[test]
    fn punctuation_around_a_variable_and_variable_lengths() {
        let mut m = TemplateMiner::default();
        let a = m.add("connection from 1.2.3.4 () at Tue Jul 26 05:47:42 2005");
        let b = m.add("connection from 5.6.7.8 (host-9.example.net) at Fri Jul  1 07:57:30 2005");
        assert_eq!(a, b);
        assert_eq!(m.template(a).unwrap(), "connection from <*> (<*>) at <*>");
        let c = m.add("BLOCK* ask 10.0.0.1:50010 to delete blk_1");
        let d = m.add("BLOCK* ask 10.0.0.2:50010 to delete blk_1 blk_2 blk_-3");
        assert_eq!(c, d);
        assert_eq!(m.template(c).unwrap(), "BLOCK* ask <*> to delete <*>");
        assert_eq!(m.add("BLOCK* ask 10.0.0.3:50010 to delete blk_4 blk_5"), c);
        // Two templates that generalise into the same collapsed form become one (the older).
        let mut m = TemplateMiner::default();
        let short = m.add("a.exe - h.b.com:1 close, lifetime 00:01");
        m.add("b.exe - h.b.com:1 close, lifetime 00:01");
        let long = m.add("a.exe *64 - h.b.com:1 close, lifetime 00:01");
        assert_ne!(long, short);
        let merged = m.add("b.exe *64 - h.b.com:1 close, lifetime 00:01");
        assert_eq!(merged, short);
        assert_eq!(m.resolve(long), short);
        assert_eq!(m.template(long).unwrap(), "<*> - <*> close, lifetime <*>");
    }

    #[test]
    fn ids_are_stable_across_processes_and_restarts() {
        let lines = [
            "a b 1",
            "user alice logged in from 10.0.0.1",
            "user bob logged in from 10.0.0.2",
            "disk full on /dev/sda1",
            "calling the weather service",
            "calling the hotel service",
        ];
        let mut m1 = TemplateMiner::default();
        let ids1: Vec<_> = lines.iter().map(|l| m1.add(l)).collect();
        let mut m2 = TemplateMiner::default();
        let ids2: Vec<_> = lines.iter().map(|l| m2.add(l)).collect();
        assert_eq!(ids1, ids2);
        assert_ne!(ids1[4], ids1[5]);
        let json = serde_json::to_string(&m1.state()).unwrap();
        let mut restored = TemplateMiner::from_state(serde_json::from_str(&json).unwrap()).unwrap();
        assert_eq!(restored.templates(), m1.templates());
        assert_eq!(restored.add("user carol logged in from 10.0.0.3"), ids1[1]);
        assert_eq!(restored.add("disk full on /dev/sdb2"), ids1[3]);
        assert_eq!(restored.add("calling the hotel service"), ids1[5]);
        // The word slot was saved too: a third word merges the slot, into the oldest id.
        let third = restored.add("calling the maps service");
        assert_eq!(third, ids1[4]);
        assert_eq!(restored.resolve(ids1[5]), ids1[4]);
        assert_eq!(m1.add("calling the maps service"), ids1[4]);
        let json2 = serde_json::to_string(&restored.state()).unwrap();
        let again = TemplateMiner::from_state(serde_json::from_str(&json2).unwrap()).unwrap();
        assert_eq!(again.resolve(ids1[5]), ids1[4]);
        assert_eq!(again.template(ids1[5]).unwrap(), "calling the <*> service");
    }

    #[test]
    fn bad_state_is_refused() {
        let mut s = TemplateMiner::default().state();
        s.version = 1;
        assert!(matches!(
            TemplateMiner::from_state(s),
            Err(MinerError::Version(1))
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
            assert!(m.exact.len() <= 1024 && m.lines.len() <= 1024);
            assert!(m.slots.len() <= 64 && m.aliases.len() <= 64);
        }
        assert!(m.num_evictions() > 0);
        assert!(!m.drain_evicted().is_empty());
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

    #[test]
    fn a_huge_line_is_mined_by_its_first_bytes() {
        let mut m = TemplateMiner::default();
        let long = format!("payload {}", "é".repeat(MAX_LINE_BYTES));
        let a = m.add(&long);
        let t = m.template(a).unwrap();
        assert!(t.len() <= MAX_LINE_BYTES, "{}", t.len());
        assert_eq!(m.add(&format!("{long} and more")), a);
    }

    proptest::proptest! {
        #[test]
        fn same_line_twice_gets_the_same_id(lines in proptest::collection::vec("[a-z0-9 ]{0,30}", 1..40)) {
            let mut m = TemplateMiner::new(MinerConfig { max_templates: 1000, ..MinerConfig::default() });
            for l in &lines {
                let a = m.add(l);
                let b = m.add(l);
                proptest::prop_assert_eq!(a, b);
                proptest::prop_assert!(m.template(a).is_some());
            }
        }
    }
}
