//! Dates and clocks: `2005-06-03`, `05:47:42.811`, `2015-10-18T18:01:47.978Z`, month and
//! weekday names, zones, and a date-time written across tokens (`Tue Jul 26 05:47:42 2005`),
//! which the masker makes one `<*>` and the header stripper takes as a timestamp.

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

pub(super) fn strip_punct(t: &str) -> &str {
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

pub(super) fn is_month(t: &str) -> bool {
    calendar_word(t, MONTHS)
}

pub(super) fn is_weekday(t: &str) -> bool {
    calendar_word(t, WEEKDAYS)
}

/// The first char after an opening bracket or quote is a digit.
#[inline]
fn starts_with_digit(t: &str) -> bool {
    t.bytes()
        .find(|b| !matches!(b, b'[' | b'(' | b'{' | b'"' | b'\''))
        .is_some_and(|b| b.is_ascii_digit())
}

pub(super) fn all_digits(t: &str) -> bool {
    !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit())
}

/// `05:47:42`, `16:13:38.811`, `18:01:47,978`, `10:30`, optionally `Z`-suffixed.
pub(super) fn is_clock(t: &str) -> bool {
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
pub(super) fn is_date(t: &str, short_ok: bool) -> bool {
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
pub(super) fn is_datetime_token(t: &str) -> bool {
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
pub(super) fn datetime_run<'a>(
    first: &'a str,
    rest: impl Iterator<Item = &'a str> + Clone,
) -> usize {
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
