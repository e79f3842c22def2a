//! One whitespace-free token: cut into compounds (runs of identifier characters) and
//! punctuation; a compound that holds a digit, is a URL, a path, a dotted name of three parts
//! or more, or `true`/`false`/`null` becomes `<*>`, keeping what reads as syntax around it.

use super::WILDCARD;
use crate::patterns::trace::is_exception_type;

/// Byte classes: 1 = part of a compound, 2 = a compound character that may make it a variable
/// (a digit or `. : / \ - + # ~ $ %`), 0 = punctuation.
pub(super) const CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        t[i] = if b.is_ascii_alphabetic() || b == b'_' {
            1
        } else if b.is_ascii_digit()
            || matches!(
                b,
                b'.' | b':' | b'/' | b'-' | b'+' | b'#' | b'~' | b'\\' | b'$' | b'%'
            )
        {
            2
        } else {
            0
        };
        i += 1;
    }
    t
};

/// Characters that make up a compound (a candidate variable).
#[inline]
fn is_run_byte(b: u8) -> bool {
    CLASS[b as usize] != 0
}

/// A token that cannot hold a variable: letters and plain punctuation only, and no letter run
/// of 4 or 5 (which could be `true`, `false` or `null`).
#[inline]
fn is_plain(token: &[u8]) -> bool {
    let mut letters = 0;
    for &b in token {
        match CLASS[b as usize] {
            2 => return false,
            1 => letters += 1,
            _ => {
                if letters == 4 || letters == 5 {
                    return false;
                }
                letters = 0;
            }
        }
    }
    letters != 4 && letters != 5
}

/// Appends the masked form of one whitespace-free token to `out`.
pub(super) fn mask_token(token: &str, out: &mut String) {
    let bytes = token.as_bytes();
    if is_plain(bytes) {
        out.push_str(token);
        return;
    }
    // `<1`, `>10`, `~5`, `*64`: a sign before a number is part of the value.
    let mut i = usize::from(
        bytes.len() > 1
            && matches!(bytes[0], b'<' | b'>' | b'~' | b'*')
            && bytes[1].is_ascii_digit(),
    );
    while i < bytes.len() {
        if is_run_byte(bytes[i]) {
            let start = i;
            let mut word = true;
            let mut colon_or_backslash = false;
            while i < bytes.len() {
                let b = bytes[i];
                match CLASS[b as usize] {
                    0 => break,
                    1 => {}
                    _ => {
                        word = false;
                        colon_or_backslash |= b == b':' || b == b'\\';
                    }
                }
                i += 1;
            }
            let c = &token[start..i];
            let cb = c.as_bytes();
            if word {
                // Letters and `_` only: a word, unless `true`, `false` or `null`.
                if (cb.len() == 4 || cb.len() == 5) && is_bool_or_null(c) {
                    out.push_str(WILDCARD);
                } else {
                    out.push_str(c);
                }
            } else if cb[0].is_ascii_digit() && !colon_or_backslash {
                // A number, an address, a date, an id.
                wildcard_then_tail(c, out, |x| matches!(x, b'.' | b'/'));
            } else {
                mask_compound(c, out);
            }
        } else {
            // Punctuation is copied; a multi-byte char is copied whole.
            let start = i;
            i += 1;
            while i < bytes.len() && !is_run_byte(bytes[i]) && bytes[i] < 0x80 {
                i += 1;
            }
            if bytes[start] >= 0x80 {
                i = (start + utf8_len(bytes[start])).min(bytes.len());
            }
            out.push_str(&token[start..i]);
        }
    }
}

fn utf8_len(b: u8) -> usize {
    match b {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        _ => 4,
    }
}

fn is_bool_or_null(c: &str) -> bool {
    c.eq_ignore_ascii_case("true")
        || c.eq_ignore_ascii_case("false")
        || c.eq_ignore_ascii_case("null")
}

/// Masks one compound (a run of [`is_run_byte`] characters).
fn mask_compound(c: &str, out: &mut String) {
    let b = c.as_bytes();
    // An exception type is a constant (`torch.OutOfMemoryError:`, `StatusCode.UNAVAILABLE`).
    if b[0].is_ascii_alphabetic() && is_exception_type(c) {
        out.push_str(c);
        return;
    }
    // Letters and `_` only: a word, unless `true`, `false` or `null`.
    if b.iter().all(|&x| CLASS[x as usize] == 1) {
        if (b.len() == 4 || b.len() == 5)
            && (c.eq_ignore_ascii_case("true")
                || c.eq_ignore_ascii_case("false")
                || c.eq_ignore_ascii_case("null"))
        {
            out.push_str(WILDCARD);
        } else {
            out.push_str(c);
        }
        return;
    }
    // A number, an address, a date, an id: a value, unless glued to a word by a colon
    // (`10.250.10.6:50010:Got`).
    if b[0].is_ascii_digit() && !b.contains(&b':') && !b.contains(&b'\\') {
        wildcard_then_tail(c, out, |x| matches!(x, b'.' | b'/'));
        return;
    }
    // A relative path.
    if c.starts_with("./") || c.starts_with("../") || c.starts_with("~/") {
        wildcard_then_tail(c, out, |x| matches!(x, b'.' | b':'));
        return;
    }
    // Leading punctuation that reads as syntax (`#5`, `:0`, `......0`), but not a sign or the
    // slash that opens a path.
    let lead = b
        .iter()
        .take_while(|&&x| matches!(x, b'#' | b':' | b'.' | b'$' | b'~' | b'%'))
        .count();
    if lead > 0 {
        out.push_str(&c[..lead]);
        if lead < b.len() {
            mask_compound(&c[lead..], out);
        }
        return;
    }
    // A path, with its trailing slash (`/var/www/html/`).
    if b[0] == b'/' && b.len() > 1 {
        wildcard_then_tail(c, out, |x| matches!(x, b'.' | b':'));
        return;
    }
    // Trailing punctuation (`10.0.0.1:`, `done.`, `1/`).
    let (core, tail) = split_tail(c, |x| matches!(x, b'.' | b':' | b'/'));
    if core.is_empty() {
        out.push_str(c);
        return;
    }
    mask_core(core, out);
    out.push_str(tail);
}

/// `c` split before its trailing run of bytes that `tail` accepts (ASCII punctuation: the
/// split falls on a char boundary).
fn split_tail(c: &str, tail: impl Fn(u8) -> bool) -> (&str, &str) {
    let n = c.bytes().rev().take_while(|&x| tail(x)).count();
    c.split_at(c.len() - n)
}

/// The wildcard for `c`, then the trailing punctuation that `tail` accepts, kept as written.
fn wildcard_then_tail(c: &str, out: &mut String, tail: impl Fn(u8) -> bool) {
    out.push_str(WILDCARD);
    out.push_str(split_tail(c, tail).1);
}

/// Whether `b[..k]` reads as a key before the colon at `k` with a value after it: it starts with
/// a letter, holds letters and what `also` accepts, and is not hex letters (`FF:F2`).
fn is_key_before(b: &[u8], k: usize, also: impl Fn(u8) -> bool) -> bool {
    k > 0
        && k + 1 < b.len()
        && b[0].is_ascii_alphabetic()
        && b[..k].iter().all(|&x| x.is_ascii_alphabetic() || also(x))
        && !is_hex_letters(&b[..k])
}

fn mask_core(c: &str, out: &mut String) {
    let b = c.as_bytes();
    let (mut digit, mut colon, mut slashes, mut dots, mut backslash) = (false, None, 0, 0, false);
    for (i, &x) in b.iter().enumerate() {
        match x {
            b'0'..=b'9' => digit = true,
            b':' => {
                colon.get_or_insert(i);
            }
            b'/' => slashes += 1,
            b'.' => dots += 1,
            b'\\' => backslash = true,
            _ => {}
        }
    }
    // `action:android.intent.action.MAIN`: a one-word key before a value of any shape.
    if let Some(k) = colon
        && is_key_before(b, k, |x| matches!(x, b'_' | b'-'))
        && b[k + 1] != b'/'
    {
        out.push_str(&c[..=k]);
        mask_compound(&c[k + 1..], out);
        return;
    }
    // Whole values: URLs, paths, dotted names.
    if (colon.is_some() && c.contains("://"))
        || (b[0] == b'/' && b.len() > 1)
        || backslash
        || slashes >= 2
        || (dots >= 2 && is_dotted_name(c))
    {
        out.push_str(WILDCARD);
        return;
    }
    // `key:value` (`vCores:8`, `isOverlap:false`, `domains:node-D0`): the key stays. Not hex
    // pairs (`FF:F2:9F`).
    if let Some(k) = colon
        && is_key_before(b, k, |x| matches!(x, b'_' | b'-' | b'.'))
        && !is_dotted_name(&c[..k])
    {
        out.push_str(&c[..=k]);
        mask_compound(&c[k + 1..], out);
        return;
    }
    // `10.250.10.6:50010:Got`: a value glued to a word by a colon.
    if digit
        && colon.is_some()
        && let Some(k) = c.rfind(':')
        && k > 0
        && b.len() - k > 3
        && b[k + 1..].iter().all(u8::is_ascii_alphabetic)
        && !is_hex_letters(&b[k + 1..])
    {
        mask_compound(&c[..k], out);
        out.push_str(&c[k..]);
        return;
    }
    if digit && !is_numbered_name(c) {
        if let Some(keep) = word_before_number(c) {
            out.push_str(&c[..keep]);
        }
        out.push_str(WILDCARD);
        return;
    }
    if c.eq_ignore_ascii_case("true")
        || c.eq_ignore_ascii_case("false")
        || c.eq_ignore_ascii_case("null")
    {
        out.push_str(WILDCARD);
        return;
    }
    out.push_str(c);
}

fn is_hex_letters(b: &[u8]) -> bool {
    b.iter()
        .all(|x| matches!(x.to_ascii_lowercase(), b'a'..=b'f'))
}

/// A name that holds a digit or two: `eth0`, `tty2`, `ssh2`, `PSR0`, `x86` (letters then one or
/// two digits), or a longer identifier with at most two digits and a letter beyond `f`
/// (`HttpServer2`, `Log4j`), which no hex id is. These name a device, a protocol, a register or
/// a class, like a word.
fn is_numbered_name(c: &str) -> bool {
    let b = c.as_bytes();
    if !b[0].is_ascii_alphabetic() {
        return false;
    }
    if b.contains(&b'_') {
        // `jk2_init` is a name; `rdd_2_0`, `attempt_14_0020`, `blk_-16` are ids.
        let mut digits = 0;
        for seg in c.split('_') {
            let sb = seg.as_bytes();
            if sb.iter().any(u8::is_ascii_digit) {
                if !sb[0].is_ascii_alphabetic() || !sb.iter().all(u8::is_ascii_alphanumeric) {
                    return false;
                }
                digits += sb.iter().filter(|x| x.is_ascii_digit()).count();
            }
        }
        return digits <= 2;
    }
    let letters = b.iter().take_while(|x| x.is_ascii_alphabetic()).count();
    let digits = b.iter().filter(|x| x.is_ascii_digit()).count();
    if letters + digits == b.len() && digits <= 2 && b[letters..].iter().all(u8::is_ascii_digit) {
        return true;
    }
    digits <= 2
        && b.len() >= 6
        && b.iter().all(|x| x.is_ascii_alphanumeric() || *x == b'$')
        && b.iter()
            .any(|x| x.is_ascii_alphabetic() && !matches!(x.to_ascii_lowercase(), b'a'..=b'f'))
        && b.iter().any(u8::is_ascii_lowercase)
}

/// `com.android.systemui`, `proxy.example.org:80`: three or more dot-separated parts that start
/// with a letter (a package, class or host name). Two parts (`chrome.exe`, `mice.c`,
/// `PowerManagerService.WakeLocks`) stay words.
fn is_dotted_name(c: &str) -> bool {
    let mut parts = 0;
    for p in c.split('.') {
        if !p
            .as_bytes()
            .first()
            .is_some_and(|x| x.is_ascii_alphabetic() || *x == b'_' || *x == b'$')
        {
            return false;
        }
        parts += 1;
    }
    parts >= 3
}

/// A word joined by one kind of separator to a part that holds a digit keeps the word
/// (`core.2275` -> `core.`, `node-D0` -> `node-`, `CPU#0` -> `CPU#`, `PS/2` -> `PS/`,
/// `instruction......0` -> `instruction......`); returns the length to keep. Not a word with an
/// underscore (`blk_-1`, `rdd_2_0` are one identifier).
fn word_before_number(c: &str) -> Option<usize> {
    let b = c.as_bytes();
    let word = b.iter().take_while(|x| x.is_ascii_alphabetic()).count();
    if word == 0 || word == b.len() {
        return None;
    }
    let sep = b[word];
    if !matches!(sep, b'.' | b'-' | b'#' | b'/') {
        return None;
    }
    let seps = b[word..].iter().take_while(|&&x| x == sep).count();
    let rest = &b[word + seps..];
    // One part only: `llama-3-70b` and `MININT-X5.corp.com` are values as a whole.
    (!rest.is_empty()
        && rest.iter().all(|x| x.is_ascii_alphanumeric() || *x == b'_')
        && rest.iter().any(u8::is_ascii_digit))
    .then_some(word + seps)
}
