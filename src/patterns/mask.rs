//! Turning one log line into masked tokens: strip a raw line's header (timestamp, level, pid,
//! host, `tag:`), mask the variables in it, split on whitespace. No regex: one pass over the
//! bytes, no allocation beyond the output.
//!
//! A token is cut into *compounds*: maximal runs of identifier characters (letters, digits and
//! `_ . : / - + @ # ~ \ $ %`); everything else (`( ) [ ] { } = , ; " ' < > | ! ? * &` …) is
//! punctuation and is kept as it is. A compound is a variable when
//!
//! - it holds a digit (numbers, hex, ids, IPs with ports, versions, `8000ms`, `blk_-160…`), except
//!   a word with a one- or two-digit suffix (`eth0`, `tty2`, `ssh2`, `PSR0`), which names a thing;
//! - it is a URL, or a path (`/var/log/x`, `/default-rack`, `a/b/c`, `C:\Windows\…`);
//! - it is a dotted name of three or more parts (`com.android.systemui`, `host.example.org`);
//! - it is `true`, `false` or `null` (any case).
//!
//! A variable compound becomes `<*>`, keeping what reads as syntax around the value: a leading
//! `#`/`@`/`:`/`.` (`#<*>`, `@<*>`), a trailing `.`/`:`/`/`, a `key:` prefix (`vCores:<*>`) and a
//! word joined to a number (`core.<*>`, `node-<*>`, `CPU#<*>`, `instruction......<*>`). So
//! `sshd[24200]:` becomes `sshd[<*>]:`, `(uid=0)` becomes `(uid=<*>)`.
//!
//! Two multi-token values become one `<*>` each: a date-time written in words and numbers
//! (`Tue Jul 26 05:47:42 2005`, `2017-05-16 00:00:00`) and an approximate quantity with its unit
//! (`<1 sec`).

use super::trace::is_exception_type;

/// The wildcard that stands for a variable.
pub const WILDCARD: &str = "<*>";

/// Masks `line` into `out` (cleared first): header stripped, variables replaced by [`WILDCARD`],
/// tokens separated by single spaces. Returns the number of tokens.
///
/// The output is a pure function of the input, so equal masked lines can be looked up in a
/// hash map before any template is compared.
pub fn mask_line(line: &str, out: &mut String) -> usize {
    out.clear();
    let body = strip_header(line);
    let bytes = body.as_bytes();
    let mut n = 0;
    let mut pos = 0;
    loop {
        while pos < bytes.len() && bytes[pos].is_ascii_whitespace() {
            pos += 1;
        }
        if pos >= bytes.len() {
            break;
        }
        // One pass finds the token's end and whether it can hold a variable (see `is_plain`).
        let start = pos;
        let (mut plain, mut letters) = (true, 0u32);
        while pos < bytes.len() {
            let b = bytes[pos];
            if b.is_ascii_whitespace() {
                break;
            }
            match CLASS[b as usize] {
                1 => letters += 1,
                2 => plain = false,
                _ => {
                    plain &= letters != 4 && letters != 5;
                    letters = 0;
                }
            }
            pos += 1;
        }
        plain &= letters != 4 && letters != 5;
        let tok = &body[start..pos];
        if n > 0 {
            out.push(' ');
        }
        n += 1;
        let b0 = bytes[start];
        if plain
            && CLASS[b0 as usize] == 1
            && !(b0.is_ascii_uppercase()
                && (is_month(tok) || is_weekday(tok) || http_method(tok).is_some()))
        {
            out.push_str(tok);
            continue;
        }
        let mut toks = body[pos..].split_ascii_whitespace();
        let skip = |k: usize, pos: &mut usize, toks: &mut std::str::SplitAsciiWhitespace<'_>| {
            for _ in 0..k {
                if let Some(t) = toks.next() {
                    *pos = t.as_ptr() as usize - body.as_ptr() as usize + t.len();
                }
            }
        };
        let run = if could_be_time(tok) {
            datetime_run(tok, toks.clone())
        } else {
            0
        };
        if run > 1 {
            let last = toks.clone().nth(run - 2).unwrap_or(tok);
            push_collapsed(tok, last, out);
            skip(run - 1, &mut pos, &mut toks);
            continue;
        }
        // `"GET /v2/x HTTP/1.1"`: the request target and protocol are one value.
        if tok.len() <= 8
            && let Some(method) = http_method(tok)
            && let Some(target) = toks.clone().next()
            && (target.starts_with('/') || target.contains("://") || target == "*")
            && let Some(proto) = toks.clone().nth(1)
            && proto.starts_with("HTTP/")
        {
            out.push_str(method);
            out.push(' ');
            let end = proto.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
            out.push_str(WILDCARD);
            out.push_str(&proto[end.len()..]);
            skip(2, &mut pos, &mut toks);
            n += 1;
            continue;
        }
        if is_approx_quantity(tok)
            && let Some(unit) = toks.clone().next()
            && UNIT_WORDS.contains(&unit.trim_end_matches([',', '.', ';', ')']))
        {
            push_collapsed(tok, unit, out);
            skip(1, &mut pos, &mut toks);
            continue;
        }
        mask_token(tok, out);
    }
    n
}

/// Whether a token may start a date-time: a digit, or the capital that starts a month or a
/// weekday (after an opening bracket).
#[inline]
fn could_be_time(t: &str) -> bool {
    let b = t.as_bytes();
    let c = match b.first() {
        Some(b'[' | b'(') => b.get(1).copied().unwrap_or(0),
        Some(&c) => c,
        None => 0,
    };
    c.is_ascii_digit()
        || matches!(
            c,
            b'J' | b'F' | b'M' | b'A' | b'S' | b'O' | b'N' | b'D' | b'T' | b'W'
        )
}

/// `GET`, `POST`: an HTTP method.
pub(super) fn is_http_method(t: &str) -> bool {
    http_method(t).is_some_and(|m| m == t)
}

/// `GET`, `"POST`: an HTTP method opening a request line (returned as written).
fn http_method(tok: &str) -> Option<&str> {
    const METHODS: &[&str] = &[
        "GET", "POST", "PUT", "DELETE", "HEAD", "PATCH", "OPTIONS", "CONNECT", "TRACE",
    ];
    METHODS
        .contains(&tok.trim_start_matches(['"', '\'', '[', '(']))
        .then_some(tok)
}

/// One `<*>` for the tokens `first..=last`, with the opening punctuation of `first` and the
/// closing punctuation of `last` kept (`[Sun Dec 04 04:47:44 2005]` -> `[<*>]`).
fn push_collapsed(first: &str, last: &str, out: &mut String) {
    let lead = first.len() - first.trim_start_matches(['(', '[', '{', '"', '\'']).len();
    out.push_str(&first[..lead]);
    out.push_str(WILDCARD);
    let core = last.trim_end_matches([')', ']', '}', '"', '\'', ',', ';', '.']);
    out.push_str(&last[core.len()..]);
}

/// `<1`, `>10`, `~5`: a comparison or approximation sign before a number.
fn is_approx_quantity(tok: &str) -> bool {
    let b = tok.as_bytes();
    b.len() >= 2
        && matches!(b[0], b'<' | b'>' | b'~')
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b','))
        && b[1].is_ascii_digit()
}

/// Byte classes: 1 = part of a compound, 2 = a compound character that may make it a variable
/// (a digit or `. : / \ - + # ~ $ %`), 0 = punctuation.
const CLASS: [u8; 256] = {
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
fn mask_token(token: &str, out: &mut String) {
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
                let keep = cb.len()
                    - cb.iter()
                        .rev()
                        .take_while(|&&x| matches!(x, b'.' | b'/'))
                        .count();
                out.push_str(WILDCARD);
                out.push_str(&c[keep..]);
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
        let keep = b.len()
            - b.iter()
                .rev()
                .take_while(|&&x| matches!(x, b'.' | b'/'))
                .count();
        out.push_str(WILDCARD);
        out.push_str(&c[keep..]);
        return;
    }
    // A relative path.
    if c.starts_with("./") || c.starts_with("../") || c.starts_with("~/") {
        let core = c.trim_end_matches(['.', ':']);
        out.push_str(WILDCARD);
        out.push_str(&c[core.len()..]);
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
        let keep = b.len()
            - b.iter()
                .rev()
                .take_while(|&&x| matches!(x, b'.' | b':'))
                .count();
        out.push_str(WILDCARD);
        out.push_str(&c[keep..]);
        return;
    }
    // Trailing punctuation (`10.0.0.1:`, `done.`, `1/`).
    let keep = b.len()
        - b.iter()
            .rev()
            .take_while(|&&x| matches!(x, b'.' | b':' | b'/'))
            .count();
    let (core, tail) = c.split_at(keep);
    if core.is_empty() {
        out.push_str(c);
        return;
    }
    mask_core(core, out);
    out.push_str(tail);
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
        && k > 0
        && k + 1 < b.len()
        && b[0].is_ascii_alphabetic()
        && b[..k]
            .iter()
            .all(|x| x.is_ascii_alphabetic() || matches!(x, b'_' | b'-'))
        && !is_hex_letters(&b[..k])
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
        && k > 0
        && k + 1 < b.len()
        && b[0].is_ascii_alphabetic()
        && b[..k]
            .iter()
            .all(|x| x.is_ascii_alphabetic() || matches!(x, b'_' | b'-' | b'.'))
        && !is_hex_letters(&b[..k])
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

/// Unit words that may follow a number.
const UNIT_WORDS: &[&str] = &[
    "B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB", "kB", "b", "ms", "s", "us", "ns",
    "sec", "secs", "second", "seconds", "min", "mins", "minute", "minutes", "h", "hour", "hours",
    "bytes", "%",
];
const MONTHS: &[&str] = &[
    "Jan",
    "Feb",
    "Mar",
    "Apr",
    "May",
    "Jun",
    "Jul",
    "Aug",
    "Sep",
    "Oct",
    "Nov",
    "Dec",
    "January",
    "February",
    "March",
    "April",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: &[&str] = &[
    "Mon",
    "Tue",
    "Wed",
    "Thu",
    "Fri",
    "Sat",
    "Sun",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];
const ZONES: &[&str] = &[
    "UTC", "GMT", "Z", "EST", "EDT", "CST", "CDT", "MST", "MDT", "PST", "PDT", "CET", "CEST",
    "BST", "IST", "JST", "KST", "HKT", "AEST",
];

fn strip_punct(t: &str) -> &str {
    let b = t.as_bytes();
    let start = b
        .iter()
        .take_while(|x| matches!(x, b'[' | b'(' | b'{' | b'"' | b'\''))
        .count();
    let end = b.len()
        - b[start..]
            .iter()
            .rev()
            .take_while(|x| matches!(x, b']' | b')' | b'}' | b'"' | b'\'' | b',' | b';' | b'|'))
            .count();
    // Only ASCII was cut off, so both ends are char boundaries.
    &t[start..end]
}

/// `Jul`, `[Sun`, `December,`: a calendar word (`MONTHS` or `WEEKDAYS`) with brackets and
/// trailing punctuation set aside.
fn calendar_word<'a>(t: &'a str, list: &[&str]) -> bool {
    let b = t.as_bytes();
    let first = if b.first() == Some(&b'[') {
        b.get(1)
    } else {
        b.first()
    };
    if !first.is_some_and(u8::is_ascii_uppercase) || b.len() > 12 || b.len() < 3 {
        return false;
    }
    let w: &'a str = strip_punct(t);
    let w = w.strip_suffix('.').unwrap_or(w);
    let wb = w.as_bytes();
    // All entries are a capital and lower-case letters.
    wb.len() >= 3 && wb[1].is_ascii_lowercase() && list.contains(&w)
}

fn is_month(t: &str) -> bool {
    calendar_word(t, MONTHS)
}

fn is_weekday(t: &str) -> bool {
    calendar_word(t, WEEKDAYS)
}

/// The first char after an opening bracket or quote is a digit.
#[inline]
fn starts_with_digit(t: &str) -> bool {
    t.bytes()
        .find(|b| !matches!(b, b'[' | b'(' | b'{' | b'"' | b'\''))
        .is_some_and(|b| b.is_ascii_digit())
}

fn all_digits(t: &str) -> bool {
    !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit())
}

/// `05:47:42`, `16:13:38.811`, `18:01:47,978`, `10:30`, optionally `Z`-suffixed.
fn is_clock(t: &str) -> bool {
    if !starts_with_digit(t) {
        return false;
    }
    let t = strip_punct(t)
        .trim_end_matches(['.', ':'])
        .trim_end_matches('Z');
    let (hms, frac) = match t.find(['.', ',']) {
        Some(k) => (&t[..k], Some(&t[k + 1..])),
        None => (t, None),
    };
    if frac.is_some_and(|f| !all_digits(f)) {
        return false;
    }
    let mut parts = 0;
    for p in hms.split(':') {
        if !all_digits(p) || p.len() > 2 {
            return false;
        }
        parts += 1;
    }
    (2..=3).contains(&parts)
}

/// `2005-06-03`, `2005.06.03`, `17/06/09`, `2016/9/27`, `03-17` (month-day, only before a clock):
/// numbers joined by one kind of separator, one of them of four digits or all of two.
fn is_date(t: &str, short_ok: bool) -> bool {
    if !starts_with_digit(t) {
        return false;
    }
    let t = strip_punct(t).as_bytes();
    let Some(&sep) = t.iter().find(|b| !b.is_ascii_digit()) else {
        return false;
    };
    if !matches!(sep, b'-' | b'/' | b'.') || t.len() > 10 {
        return false;
    }
    let (mut n, mut len, mut long, mut all_two) = (1, 0, false, true);
    for &b in t {
        if b == sep {
            if len == 0 || len > 4 {
                return false;
            }
            long |= len == 4;
            all_two &= len == 2;
            n += 1;
            len = 0;
        } else if b.is_ascii_digit() {
            len += 1;
        } else {
            return false;
        }
    }
    if len == 0 || len > 4 {
        return false;
    }
    long |= len == 4;
    all_two &= len == 2;
    (n == 3 && (long || all_two)) || (n == 2 && short_ok && all_two)
}

/// A date with its clock glued on: `2015-10-18T18:01:47.978Z`, `20171223-22:15:29:606`.
fn is_datetime_token(t: &str) -> bool {
    if !starts_with_digit(t) || t.len() < 12 {
        return false;
    }
    let t = strip_punct(t);
    t.bytes().enumerate().any(|(k, sep)| {
        if !matches!(sep, b'T' | b'-' | b'_') {
            return false;
        }
        let (d, c) = (&t[..k], &t[k + 1..]);
        // ISO 8601 basic format: `20261127T201500Z`, `20261127T201500.123`.
        let basic_clock = || {
            let c = c.trim_end_matches('Z');
            let hms = c.split(['.', ',']).next().unwrap_or("");
            hms.len() == 6 && all_digits(hms)
        };
        if sep == b'T' && all_digits(d) && d.len() == 8 && basic_clock() {
            return true;
        }
        (is_date(d, false) || (all_digits(d) && d.len() == 8))
            && c.bytes().filter(|&b| b == b':' || b == b'.').count() >= 2
            && c.as_bytes().first().is_some_and(u8::is_ascii_digit)
            && c.bytes()
                .all(|b| b.is_ascii_digit() || matches!(b, b':' | b'.' | b',' | b'Z' | b'+' | b'-'))
    })
}

fn is_zone(t: &str) -> bool {
    let t = strip_punct(t);
    ZONES.contains(&t)
        || (t.len() == 5 && matches!(t.as_bytes()[0], b'+' | b'-') && all_digits(&t[1..]))
}

/// How many tokens, from `first`, form one date-time written across tokens (0 or 1: none).
/// `Tue Jul 26 05:47:42 2005`, `Jul 26 05:47:42`, `Jun 18 2005`, `2017-05-16 00:00:00.008`,
/// `[Sun Dec 04 04:47:44 2005]`, `10.30 16:49:06`, `081109 203615`.
fn datetime_run<'a>(first: &'a str, rest: impl Iterator<Item = &'a str> + Clone) -> usize {
    let fb = first.as_bytes();
    let lead = usize::from(matches!(fb.first(), Some(b'[' | b'(')));
    if fb.get(lead).is_some_and(u8::is_ascii_digit) {
        // A date or clock has a separator within its first five characters (`2005-`, `17/`,
        // `05:`), or is `yymmdd`.
        let sep = fb[lead..].iter().take(5).position(|b| !b.is_ascii_digit());
        let shaped = match sep {
            Some(k) => k >= 1 && matches!(fb[lead + k], b'-' | b'/' | b'.' | b':'),
            None => fb.len() == 6,
        };
        if !shaped {
            return 0;
        }
    }
    let mut it = rest;
    let mut n = 1;
    let mut next = it.next();
    let closed = |t: &str| t.ends_with([']', ')', ',', ';']);
    if is_weekday(first) {
        if closed(first) {
            return 0;
        }
        if !next.is_some_and(|t| is_month(t) && !closed(t)) {
            return 0;
        }
        n += 1;
        next = it.next();
        let tail = month_tail(next, it);
        return if tail == 0 { 0 } else { n + tail };
    }
    if is_month(first) && !closed(first) {
        let tail = month_tail(next, it);
        return if tail == 0 { 0 } else { 1 + tail };
    }
    if is_date(first, next.is_some_and(is_clock)) || is_datetime_token(first) {
        if closed(first) {
            return 1;
        }
        let mut k = 1;
        if let Some(t) = next
            && is_clock(t)
        {
            k += 1;
            if !closed(t) {
                next = it.next();
                if next.is_some_and(is_zone) {
                    k += 1;
                }
            }
        }
        return k;
    }
    // `081109 203615`, `120412 14:25:46`: yymmdd, then hhmmss or a clock (MySQL's error log).
    if first.len() == 6
        && all_digits(first)
        && next.is_some_and(|t| (t.len() == 6 && all_digits(t)) || is_clock(t))
    {
        return 2;
    }
    0
}

/// After a month name (`Jul`): the day, clock, year and zone that follow it; 0 when no day.
fn month_tail<'a>(mut next: Option<&'a str>, mut it: impl Iterator<Item = &'a str>) -> usize {
    let is_day =
        |t: &str| all_digits(strip_punct(t)) && strip_punct(t).len() <= 2 && strip_punct(t) != "0";
    let is_year = |t: &str| all_digits(strip_punct(t)) && strip_punct(t).len() == 4;
    let mut n = 0;
    match next {
        Some(t) if is_day(t) => {}
        _ => return 0,
    }
    let mut clock = false;
    let mut year = false;
    while let Some(t) = next {
        let ok = if n == 0 {
            true
        } else if !clock && is_clock(t) {
            clock = true;
            true
        } else if !year && is_year(t) {
            year = true;
            true
        } else {
            clock && is_zone(t)
        };
        if !ok {
            break;
        }
        n += 1;
        if t.ends_with([']', ')', ',', ';']) {
            break;
        }
        next = it.next();
    }
    // A month and a bare day alone ("May 8") is not enough to call it a date.
    if clock || year { n } else { 0 }
}

const LEVELS: &[&str] = &[
    "TRACE", "DEBUG", "INFO", "NOTICE", "WARN", "WARNING", "ERROR", "ERR", "FATAL", "CRITICAL",
    "CRIT", "SEVERE", "ALERT", "EMERG", "Trace", "Debug", "Info", "Notice", "Warn", "Warning",
    "Error", "Fatal", "Critical", "trace", "debug", "info", "notice", "warn", "warning", "error",
    "fatal", "crit", "alert", "emerg", "V", "D", "I", "W", "E", "F",
];

fn is_level(t: &str) -> bool {
    LEVELS.contains(
        &strip_punct(t)
            .trim_matches(['<', '>'])
            .trim_end_matches(':'),
    )
}

/// `sshd[24200]:`, `kernel:`, `dfs.DataNode$PacketResponder:`, `crond(pam_unix)[2915]:`: the
/// name of what logged the line, ending in a colon.
fn is_tag(t: &str) -> bool {
    let Some(name) = t.strip_suffix(':') else {
        return false;
    };
    !name.is_empty()
        && !name.ends_with(':')
        && name.as_bytes()[0].is_ascii_alphabetic()
        && name.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'_' | b'.' | b'$' | b'-' | b'[' | b']' | b'(' | b')' | b'/' | b'@'
                )
        })
}

/// `1117838570`: unix seconds (2001-2033) or milliseconds.
fn is_epoch(t: &str) -> bool {
    let t = strip_punct(t);
    all_digits(t) && (t.len() == 10 || t.len() == 13) && t.starts_with('1')
}

/// `unix.hw`, `state_change.unavailable`: a field of a header before its timestamp.
fn is_field(t: &str) -> bool {
    !t.ends_with(':')
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && t.bytes().any(|b| matches!(b, b'.' | b'_'))
}

/// `nova.compute.manager`, `org.apache.Foo`: a logger name (dotted, no colon).
fn is_logger(t: &str) -> bool {
    let parts = t.split('.').count();
    parts >= 2
        && t.split('.').all(|p| {
            p.as_bytes().first().is_some_and(u8::is_ascii_alphabetic)
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'$' | b'-'))
        })
}

/// `dn228`, `R02-M1-N0-C:J12-U11`, `calvisitor-10-105-160-95`: a host or node id in a header.
fn is_host_field(t: &str) -> bool {
    t.bytes().any(|b| b.is_ascii_digit())
        && !t.ends_with(':')
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'/' | b':' | b'_'))
}

/// `RAS`, `KERNEL`, `UNKNOWN_LOCATION`: an upper-case field name.
fn is_upper_field(t: &str) -> bool {
    t.len() >= 2
        && t.bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        && t.as_bytes()[0].is_ascii_uppercase()
}

/// `[main]`, `[pool-1-thread-3]`: one bracketed token.
fn is_bracketed(t: &str) -> bool {
    t.len() > 2 && t.starts_with('[') && t.ends_with(']')
}

/// `INFO`, `WARNING`, `[ERROR]`: a level written in capitals (four letters or more).
fn is_upper_level(t: &str) -> bool {
    let c = strip_punct(t);
    c.len() >= 4 && c.bytes().all(|b| b.is_ascii_uppercase()) && LEVELS.contains(&c)
}

/// `<13>1`, `<3>`: a syslog priority (and RFC 5424 version) opening a line.
fn is_syslog_pri(t: &str) -> bool {
    let Some(r) = t.strip_prefix('<') else {
        return false;
    };
    let Some((pri, ver)) = r.split_once('>') else {
        return false;
    };
    all_digits(pri) && pri.len() <= 3 && (ver.is_empty() || (all_digits(ver) && ver.len() <= 2))
}

/// `metrics.py:345]`: a file name with an extension, a colon, a line number and `]`.
fn is_source_location(t: &str) -> bool {
    let Some(loc) = t.strip_suffix(']') else {
        return false;
    };
    let Some((file, line)) = loc.rsplit_once(':') else {
        return false;
    };
    all_digits(line)
        && file.contains('.')
        && file
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b'/'))
}

/// `ERROR:root:msg` -> `msg`, `WARNING:  msg` -> `msg`, `SEVERE: msg` -> `msg`: an upper-case
/// level glued to a colon at the very start of a line, with the logger name and its colon
/// that Python's default format puts after it.
fn level_prefix(rest: &str) -> Option<&str> {
    let colon = rest.as_bytes().iter().take(9).position(|&b| b == b':')?;
    let level = &rest[..colon];
    if !(LEVELS.contains(&level)
        && level.len() >= 3
        && level.bytes().all(|b| b.is_ascii_uppercase()))
    {
        return None;
    }
    let after = &rest[colon + 1..];
    if after.starts_with([' ', '\t']) {
        return Some(after.trim_start());
    }
    // `root:`, `vllm.engine.async_llm_engine:`: a logger name and a colon.
    let name = after
        .bytes()
        .take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        .count();
    (name > 0 && after.as_bytes().get(name) == Some(&b':')).then(|| after[name + 1..].trim_start())
}

/// Strips a raw line's header: a timestamp in one of the common shapes (possibly after a few
/// fields: `- 1117838570 2005.06.03 …`, `134681 node-246 unix.hw … 1077804742`), then what
/// follows it in headers: more dates and clocks, numbers (pids, thread ids), digit-bearing ids
/// (hosts such as `dn228`), fields before an upper-case level (`RAS KERNEL INFO`, `[main] INFO`), `-`, a level
/// (`INFO`, `[error]`, `D`), a `[thread name]` after the level, and the logger (`tag:`, or a
/// dotted name and one `[context]` after it; after a host word when there is no level:
/// `combo sshd[19939]:`).
///
/// Nothing is stripped unless a timestamp starts the header, so message text is kept (a line
/// that starts `121 floating point …` or `Info about …` stays whole). `a|b|c|message` headers
/// whose first field is a timestamp lose their fields.
pub fn strip_header(line: &str) -> &str {
    let rest = line.trim_start();
    // `20171223-22:15:29:606|Step_LSC|30002312|message`
    if let Some(first) = rest.split_ascii_whitespace().next()
        && let Some(bar) = first.find('|')
        && (is_datetime_token(&first[..bar]) || is_clock(&first[..bar]))
    {
        let mut s = rest;
        while let Some(k) = s.find('|') {
            if s[..k].bytes().any(|b| b.is_ascii_whitespace()) {
                break;
            }
            s = &s[k + 1..];
        }
        return s.trim_start();
    }
    // `ERROR:root:message` (Python `logging`'s default format), `INFO:     127.0.0.1:…`
    // (uvicorn), `SEVERE: message` (java.util.logging): an upper-case level and a colon, then
    // a logger name and a colon.
    if let Some(body) = level_prefix(rest) {
        return body;
    }
    // Most messages start with a word: no header.
    let first = rest.split_ascii_whitespace().next().unwrap_or("");
    if !(first == "-"
        || first.bytes().any(|b| b.is_ascii_digit())
        || is_month(first)
        || is_weekday(first)
        || is_field(first)
        || is_level(first))
    {
        return rest;
    }
    let base = rest.as_ptr() as usize;
    let mut buf: [(usize, &str); 20] = [(0, ""); 20];
    let mut count = 0;
    for t in rest.split_ascii_whitespace().take(20) {
        buf[count] = (t.as_ptr() as usize - base, t);
        count += 1;
    }
    let toks = &buf[..count];
    let tok = |i: usize| toks.get(i).map(|x| x.1);
    let run_at = |i: usize| match tok(i) {
        Some(t) => datetime_run(t, toks[i + 1..].iter().map(|x| x.1)),
        None => 0,
    };
    // Phase 1: a timestamp within the first few fields, those before it bearing digits or
    // shaped like fields; or unix seconds after a line number and a few words (`2286759 full
    // partition status 1061219795 -1 running`).
    let mut i = 0;
    let mut found = false;
    let mut fields = true;
    while i < toks.len().min(7) {
        let t = toks[i].1;
        let ts = run_at(i);
        let stamp = ts > 1 || is_clock(t) || is_datetime_token(t) || is_date(t, false);
        if (stamp && fields) || (i >= 1 && is_epoch(t) && (fields || all_digits(toks[0].1))) {
            i += ts.max(1);
            found = true;
            break;
        }
        // A level may come first (`INFO 11-27 20:15:00 …`: glog's family, vLLM).
        fields &= t == "-" || t.bytes().any(|b| b.is_ascii_digit()) || is_field(t) || is_level(t);
        if !fields && !all_digits(toks[0].1) {
            break;
        }
        i += 1;
    }
    if !found {
        return rest;
    }
    // RFC 5424 syslog: `<PRI>VERSION TIMESTAMP HOSTNAME APP-NAME PROCID MSGID SD MSG`, `-`
    // for a field left out.
    if is_syslog_pri(toks[0].1) && i == 2 && toks.len() > i + 4 {
        let mut k = i + 4;
        if toks[k].1 == "-" {
            k += 1;
        } else if toks[k].1.starts_with('[') {
            k = (k..toks.len().min(k + 16))
                .find(|&j| toks[j].1.ends_with(']'))
                .map_or(k, |j| j + 1);
        }
        return rest[toks.get(k).map_or(rest.len(), |&(at, _)| at)..].trim_start();
    }
    // Skips a `[…]` group that may span tokens (`[RMCommunicator Allocator]`).
    let bracket = |i: usize| -> usize {
        match tok(i) {
            Some(t) if t.starts_with('[') => (i..toks.len().min(i + 8))
                .find(|&k| toks[k].1.ends_with(']'))
                .map_or(i, |k| k + 1),
            _ => i,
        }
    };
    // Phase 2: what follows a timestamp in headers.
    let mut level = false;
    while i < toks.len() {
        let t = toks[i].1;
        let ts = run_at(i);
        if ts > 1 {
            i += ts;
            continue;
        }
        if is_level(t) && i + 1 < toks.len() {
            i = bracket(i + 1);
            if tok(i) == Some("-") {
                i += 1;
            }
            level = true;
            match tok(i) {
                Some(n) if is_exception_type(n) => {}
                Some(n) if is_tag(n) => i += 1,
                Some(n) if is_logger(n) => {
                    i = bracket(i + 1);
                    // `%c - %m` (Log4j), `%(name)s - %(message)s` (Python).
                    if tok(i) == Some("-") && i + 1 < toks.len() {
                        i += 1;
                    }
                }
                _ => {}
            }
            break;
        }
        // `metrics.py:345]`, `pod_workers.go:1298]`: the source location that closes a glog,
        // klog or vLLM header.
        if is_source_location(t) {
            i += 1;
            break;
        }
        if t == "-"
            || t == "|"
            || is_clock(t)
            || is_datetime_token(t)
            || is_date(t, true)
            || all_digits(strip_punct(t))
            || is_host_field(t)
        {
            i += 1;
            continue;
        }
        // Fields between the timestamp and an upper-case level are header fields: a
        // component or facility (`RAS KERNEL INFO`), a thread (`[main] INFO`, Log4j's
        // `%d [%t] %-5p %c - %m`).
        if (is_upper_field(t) || is_bracketed(t))
            && (i + 1..toks.len().min(i + 6))
                .take_while(|&k| {
                    let n = toks[k].1;
                    is_upper_field(n)
                        || is_bracketed(n)
                        || n.bytes().any(|b| b.is_ascii_digit())
                        || is_upper_level(n)
                })
                .any(|k| is_upper_level(toks[k].1))
        {
            i += 1;
            continue;
        }
        let tag = |t: &str| is_tag(t) && !is_exception_type(t);
        if tag(t) {
            i += 1;
        } else if tok(i + 1).is_some_and(tag) && !is_exception_type(t) {
            i += 2;
        }
        break;
    }
    let _ = level;
    rest[toks.get(i).map_or(rest.len(), |&(at, _)| at)..].trim_start()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(line: &str) -> String {
        let mut s = String::new();
        mask_line(line, &mut s);
        s
    }

    #[test]
    fn masks_variables_and_keeps_punctuation() {
        let table = [
            (
                "PacketResponder 1 for block blk_-1608999687919862906 terminating",
                "PacketResponder <*> for block <*> terminating",
            ),
            (
                "Received block blk_1 of size 67108864 from /10.250.19.102",
                "Received block <*> of size <*> from <*>",
            ),
            (
                "sshd[24200]: Failed password for root from 183.62.140.253 port 51442 ssh2",
                "sshd[<*>]: Failed password for root from <*> port <*> ssh2",
            ),
            (
                "tool call to the weather API timed out after 8000 ms",
                "tool call to the weather API timed out after <*> ms",
            ),
            (
                "request req-9f2c1a failed, size=123 port:8080",
                "request req-<*> failed, size=<*> port:<*>",
            ),
            (
                "trace 550e8400-e29b-41d4-a716-446655440000 done.",
                "trace <*> done.",
            ),
            (
                "fetch https://api.example.com/v1/x failed",
                "fetch <*> failed",
            ),
            ("open /var/log/syslog denied", "open <*> denied"),
            (
                "forbidden by rule: /var/www/html/",
                "forbidden by rule: <*>",
            ),
            (
                "processHandleBroadcastAction action:android.intent.action.SCREEN_ON",
                "processHandleBroadcastAction action:<*>",
            ),
            (
                "state.clipTopAmount:0, i:3",
                "state.clipTopAmount:<*>, i:<*>",
            ),
            (
                "Resolved host-1 to /default-rack",
                "Resolved host-<*> to <*>",
            ),
            ("Loaded C:\\Windows\\winsxs\\x.dll", "Loaded <*>"),
            (
                "Connection closed by 10.0.0.1 [preauth]",
                "Connection closed by <*> [preauth]",
            ),
            ("took 1.5s (attempt 3/5)", "took <*> (attempt <*>)"),
            ("generating core.2275", "generating core.<*>"),
            (
                "Link error on tree Interconnect-0T00",
                "Link error on tree Interconnect-<*>",
            ),
            ("via interface ee0 on eth1", "via interface ee0 on eth1"),
            (
                "session opened for user test by (uid=509)",
                "session opened for user test by (uid=<*>)",
            ),
            (
                "setLightsOn(true) ret:false tag = null",
                "setLightsOn(<*>) ret:<*> tag = <*>",
            ),
            (
                "Starting Socket Reader #1 for port 62270",
                "Starting Socket Reader #<*> for port <*>",
            ),
            ("illegal instruction......0", "illegal instruction......<*>"),
            ("pkg =com.tencent.mobileqq,id =12", "pkg =<*>,id =<*>"),
            ("token: android.os.BinderProxy@2bd79ce", "token: <*>@<*>"),
            ("Event@7317849d handle @0x214", "Event@<*> handle @<*>"),
            (
                "headroom=<memory:8192, vCores:-27>",
                "headroom=<memory:<*>, vCores:<*>>",
            ),
            ("from MININT-FNANLI5/127.0.0.1 to x", "from <*> to x"),
            ("model llama-3-70b-instruct failed", "model <*> failed"),
            (
                "open through proxy proxy.cse.cuhk.edu.hk:5070 HTTPS",
                "open through proxy <*> HTTPS",
            ),
            (
                "chrome.exe - close, lifetime <1 sec",
                "chrome.exe - close, lifetime <*>",
            ),
            ("chrome.exe *64 - x", "chrome.exe <*> - x"),
            (
                "jk2_init() Found child 6725 in slot 10",
                "jk2_init() Found child <*> in slot <*>",
            ),
            ("Found block rdd_2_0 locally", "Found block <*> locally"),
            ("lifetime 00:01", "lifetime <*>"),
            (
                "connection from 1.2.3.4 () at Tue Jul 26 05:47:42 2005",
                "connection from <*> () at <*>",
            ),
            (
                "connection from 1.2.3.4 (a-1.b.net) at Fri Jul  1 07:57:30 2005",
                "connection from <*> (<*>) at <*>",
            ),
            (
                "audit from 2017-05-16 00:00:00 to 2017-05-16 01:00:00.",
                "audit from <*> to <*>.",
            ),
            ("May the force be with you", "May the force be with you"),
            ("Sat May 8 happened", "Sat May <*> happened"),
            (
                "vllm.engine.async_llm_engine.AsyncEngineDeadError: Background loop has errored already.",
                "vllm.engine.async_llm_engine.AsyncEngineDeadError: Background loop has errored already.",
            ),
            (
                "grpc._channel._InactiveRpcError: status = StatusCode.UNAVAILABLE",
                "grpc._channel._InactiveRpcError: status = StatusCode.UNAVAILABLE",
            ),
            (
                "<class 'requests.exceptions.ConnectTimeout'> after 30 s",
                "<class 'requests.exceptions.ConnectTimeout'> after <*> s",
            ),
            (
                "Caused by: java.net.SocketTimeoutException: Read timed out",
                "Caused by: java.net.SocketTimeoutException: Read timed out",
            ),
            (
                "10.11.10.1 \"GET /v2/54fadb/servers/detail HTTP/1.1\" status: 200",
                "<*> \"GET <*>\" status: <*>",
            ),
        ];
        let bad: Vec<String> = table
            .iter()
            .filter(|(input, want)| m(input) != *want)
            .map(|(input, want)| format!("{input:?}\n  got  {:?}\n  want {want:?}", m(input)))
            .collect();
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    #[test]
    fn strips_common_headers() {
        let table = [
            (
                "081109 203615 148 INFO dfs.DataNode$PacketResponder: PacketResponder 1 terminating",
                "PacketResponder 1 terminating",
            ),
            (
                "17/06/09 20:10:40 INFO executor.CoarseGrainedExecutorBackend: Registered",
                "Registered",
            ),
            (
                "Dec 10 06:55:46 LabSZ sshd[24200]: Invalid user webmaster",
                "Invalid user webmaster",
            ),
            (
                "03-17 16:13:38.811  1702  2395 D WindowManager: freeze",
                "freeze",
            ),
            (
                "2016-09-28 04:30:30, Info                  CBS    Loaded",
                "CBS    Loaded",
            ),
            ("2026-11-27T20:15:00.123Z ERROR muse-agent: boom", "boom"),
            (
                "[Sun Dec 04 04:47:44 2005] [error] mod_jk child",
                "mod_jk child",
            ),
            (
                "2015-10-18 18:01:47,978 INFO [main] org.apache.hadoop.MRAppMaster: Created x",
                "Created x",
            ),
            (
                "2015-07-29 17:41:44,747 - INFO  [QuorumPeer[myid=1]/0:0:0:0:0:0:0:0:2181:FastLeaderElection@774] - Have smaller server",
                "Have smaller server",
            ),
            (
                "- 1131566461 2005.11.09 dn228 Nov 9 12:01:01 dn228/dn228 crond(pam_unix)[2915]: session closed",
                "session closed",
            ),
            (
                "Jul  1 09:00:55 calvisitor-10-105-160-95 kernel[0]: ARPT: 620651.021206: wl0: x",
                "ARPT: 620651.021206: wl0: x",
            ),
            (
                "20171223-22:15:29:606|Step_LSC|30002312|onStandStepChanged 3579",
                "onStandStepChanged 3579",
            ),
            (
                "[10.30 16:49:06] chrome.exe - proxy.cse.cuhk.edu.hk:5070 open",
                "chrome.exe - proxy.cse.cuhk.edu.hk:5070 open",
            ),
            ("Info about the message", "Info about the message"),
            // Exception types are never taken for a logger or a tag.
            (
                "2026-11-27 20:15:00,123 ERROR torch.OutOfMemoryError: CUDA out of memory.",
                "torch.OutOfMemoryError: CUDA out of memory.",
            ),
            (
                "2026-11-27T20:15:00.123Z ERROR RuntimeError: CUDA error",
                "RuntimeError: CUDA error",
            ),
            (
                "2026-11-27 20:15:00,123 ERROR agent.worker: openai.RateLimitError: Error code: 429",
                "openai.RateLimitError: Error code: 429",
            ),
            (
                "Nov 27 20:15:00 gpu-node-3 python3[2211]: KeyError: 'choices'",
                "KeyError: 'choices'",
            ),
            // A level glued to a colon: Python logging's default format, uvicorn,
            // java.util.logging.
            ("ERROR:root:RuntimeError: boom", "RuntimeError: boom"),
            ("WARNING:agent.memory:context full", "context full"),
            (
                "INFO:     127.0.0.1:5000 - \"GET / HTTP/1.1\" 200 OK",
                "127.0.0.1:5000 - \"GET / HTTP/1.1\" 200 OK",
            ),
            ("SEVERE: Servlet failed", "Servlet failed"),
            ("ERRORS: none", "ERRORS: none"),
            // RFC 5424 syslog, gunicorn's error log, vLLM's own lines.
            (
                "<3>1 2026-11-27T20:15:00.123Z gpu-node-3 kernel - - - Out of memory: Killed process 4242",
                "Out of memory: Killed process 4242",
            ),
            (
                "[2026-11-27 20:15:00 +0000] [7] [CRITICAL] WORKER TIMEOUT (pid:4242)",
                "WORKER TIMEOUT (pid:4242)",
            ),
            (
                "INFO 11-27 20:15:00 metrics.py:345] Avg prompt throughput: 12.5 tokens/s",
                "Avg prompt throughput: 12.5 tokens/s",
            ),
            (
                "E1127 20:15:00.123456    2211 pod_workers.go:1298] \"Error syncing pod, skipping\"",
                "\"Error syncing pod, skipping\"",
            ),
            (
                "<11>1 2026-11-27T20:15:00.1Z app-3 agent 4242 ID47 [ex@32473 iut=\"3\" a=\"b\"] tool failed",
                "tool failed",
            ),
            ("May the force be with you", "May the force be with you"),
            (
                "121 floating point alignment exceptions",
                "121 floating point alignment exceptions",
            ),
            (
                "00000008 CSI Store 4991456 initialized",
                "00000008 CSI Store 4991456 initialized",
            ),
            (
                "10.11.10.1 \"GET /v2/x HTTP/1.1\" status: 200",
                "10.11.10.1 \"GET /v2/x HTTP/1.1\" status: 200",
            ),
            ("ERROR something broke", "ERROR something broke"),
            (
                "2015-10-18 18:43:57,463 INFO [RMCommunicator Allocator] org.apache.hadoop.X: Recalculating schedule",
                "Recalculating schedule",
            ),
            (
                "nova-api.log.1.2017-05-16_13:53:08 2017-05-16 00:00:00.008 25746 INFO nova.osapi_compute.wsgi.server [req-3 1 5 - - -] 10.11.10.1 \"GET /v2\"",
                "10.11.10.1 \"GET /v2\"",
            ),
            (
                "nova-compute.log.1 2017-05-16 00:00:04.500 2931 INFO nova.compute.manager [-] [instance: b9] VM Started",
                "[instance: b9] VM Started",
            ),
            (
                "134681 node-246 unix.hw state_change.unavailable 1077804742 1 Component State Change: x",
                "Component State Change: x",
            ),
            (
                "- 1117838570 2005.06.03 R02-M1-N0-C:J12-U11 2005-06-03-15.42.50.675872 R02-M1-N0-C:J12-U11 RAS KERNEL INFO instruction cache parity error corrected",
                "instruction cache parity error corrected",
            ),
            (
                "- 1117869872 2005.06.04 UNKNOWN_LOCATION 2005-06-04-00.24.32.432192 UNKNOWN_LOCATION NULL DISCOVERY WARNING Node card is not fully functional",
                "Node card is not fully functional",
            ),
            (
                "2026-11-27 20:15:00,123 [main] INFO com.example.App - Started",
                "Started",
            ),
            (
                "2026-11-27 20:15:00,123 [main] Error connecting",
                "[main] Error connecting",
            ),
            ("Took 19.05 seconds to spawn", "Took 19.05 seconds to spawn"),
            (
                "1365301360 double-hummer alignment exceptions",
                "1365301360 double-hummer alignment exceptions",
            ),
            (
                "2286759 full partition status 1061219795 -1 running",
                "running",
            ),
            (
                "462 node-130 unix.hw temp 1074119817 1 ambient=30",
                "ambient=30",
            ),
            ("462 node-130 unix.hw temp 1074119817 1 warning", "warning"),
            (
                "attempt_1445_0020_m_0 TaskAttempt Transitioned",
                "attempt_1445_0020_m_0 TaskAttempt Transitioned",
            ),
        ];
        let bad: Vec<String> = table
            .iter()
            .filter(|(input, want)| strip_header(input) != *want)
            .map(|(input, want)| {
                format!(
                    "{input:?}\n  got  {:?}\n  want {want:?}",
                    strip_header(input)
                )
            })
            .collect();
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }

    proptest::proptest! {
        #[test]
        fn masking_never_panics_and_is_idempotent(line in "\\PC{0,80}") {
            let once = m(&line);
            let twice = m(&once);
            proptest::prop_assert_eq!(m(&twice), twice.clone());
        }
    }
}
