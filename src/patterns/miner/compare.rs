//! Whether two tokens at one position are one template or two: a value (`chrome.exe` /
//! `Dropbox.exe`, the value of a `key=`, a name after `user`), maybe a value (a word slot
//! after an article, a preposition or a naming noun), or a different event. Pure.

use super::{KEY_MARK, is_wild};
use crate::patterns::mask::{WILDCARD, is_http_method};
use crate::patterns::trace::exception_types_differ;

/// Words after which a plain word is a name: `user root`, `host web`.
pub(super) const NAMING_WORDS: &[&str] = &[
    "user", "username", "account", "host", "hostname", "named", "name",
];

/// Words after which a plain word may be a value (`the weather API`, `from DraftWriter`, `tool
/// maps`) or may be the event (`to spawn`, `client SPP`): such a slot becomes a variable only
/// once it has shown [`super::MinerConfig::word_slot_values`] different words.
pub(super) const SLOT_WORDS: &[&str] = &[
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

pub(super) fn word_in(t: &str, list: &[&str]) -> bool {
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
pub(super) fn generalise(a: &str, b: &str) -> Option<String> {
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
pub(super) enum Cmp {
    Join { eq: usize, diff: usize },
    Slot { eq: usize, diff: usize, pos: usize },
    Apart,
}

pub(super) fn compare(t: &[Box<str>], line: &[&str]) -> Cmp {
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

/// `START:`: a key word and a colon, which makes the next word its value.
pub(super) fn is_key_token(t: &str) -> bool {
    t.len() >= 3 && t.ends_with(':') && t[..t.len() - 1].bytes().all(|x| x.is_ascii_alphabetic())
}

#[cfg(test)]
mod tests {
    use crate::patterns::miner::TemplateMiner;

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
}
