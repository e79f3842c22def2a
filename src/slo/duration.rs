//! Prometheus-style durations (`5m`, `2m30s`, `28d`, `1w`), parsed into and printed from seconds.
//!
//! Windows and periods are whole seconds everywhere in the SLO code: PromQL range selectors
//! take that form, and no window we use is shorter than ten seconds.

/// Why a duration text was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a duration like 5m, 2m30s, 6h, 28d or 1w: {reason}")]
pub struct DurationError {
    pub text: String,
    pub reason: &'static str,
}

/// Parses `<n><unit>` groups (units `s`, `m`, `h`, `d`, `w`, largest first) into seconds.
///
/// # Errors
/// Empty text, an unknown unit, units out of order, a zero total or an overflow.
pub fn parse_secs(text: &str) -> Result<u64, DurationError> {
    let err = |reason| DurationError {
        text: text.to_string(),
        reason,
    };
    let t = text.trim();
    if t.is_empty() {
        return Err(err("empty"));
    }
    let mut total: u64 = 0;
    let mut last_unit = u64::MAX;
    let mut digits = String::new();
    for ch in t.chars() {
        if ch.is_ascii_digit() {
            digits.push(ch);
            continue;
        }
        let unit = match ch {
            's' => 1,
            'm' => 60,
            'h' => 3_600,
            'd' => 86_400,
            'w' => 7 * 86_400,
            _ => return Err(err("unknown unit (use s, m, h, d or w)")),
        };
        if digits.is_empty() {
            return Err(err("a unit without a number"));
        }
        if unit >= last_unit {
            return Err(err("units must go from largest to smallest, each once"));
        }
        last_unit = unit;
        let n: u64 = digits.parse().map_err(|_| err("number too large"))?;
        digits.clear();
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| err("too large"))?;
    }
    if !digits.is_empty() {
        return Err(err("a number without a unit"));
    }
    if total == 0 {
        return Err(err("must be longer than zero"));
    }
    Ok(total)
}

/// Prints seconds the way Prometheus and our rule names expect: largest units first, no zero
/// groups, days as the largest unit (`300` → `5m`, `150` → `2m30s`, `2419200` → `28d`).
pub fn format_secs(mut secs: u64) -> String {
    if secs == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, suffix) in [(86_400, 'd'), (3_600, 'h'), (60, 'm'), (1, 's')] {
        if secs >= unit {
            out.push_str(&(secs / unit).to_string());
            out.push(suffix);
            secs %= unit;
        }
    }
    out
}

/// Same as [`format_secs`]; named for periods (`28d`).
pub fn format_period_secs(secs: u64) -> String {
    format_secs(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_round_trip() {
        let cases = [
            ("5m", 300),
            ("2m30s", 150),
            ("1h", 3_600),
            ("6h", 21_600),
            ("1d", 86_400),
            ("3d", 259_200),
            ("28d", 2_419_200),
            ("30d", 2_592_000),
            ("1w", 604_800),
            ("10s", 10),
        ];
        for (text, secs) in cases {
            assert_eq!(parse_secs(text), Ok(secs), "{text}");
        }
        assert_eq!(format_secs(150), "2m30s");
        assert_eq!(format_secs(300), "5m");
        assert_eq!(format_secs(86_400), "1d");
        assert_eq!(format_period_secs(2_419_200), "28d");
        assert_eq!(format_secs(2_419_200), "28d");
        assert_eq!(format_secs(90_061), "1d1h1m1s");
    }

    proptest::proptest! {
        /// Printing then parsing gives the same seconds back, for any duration.
        #[test]
        fn format_then_parse_round_trips(secs in 1u64..10_000_000_000) {
            proptest::prop_assert_eq!(parse_secs(&format_secs(secs)), Ok(secs));
        }

        /// Arbitrary text never panics the parser.
        #[test]
        fn parser_never_panics(text in "\\PC{0,12}") {
            let _ = parse_secs(&text);
        }
    }

    #[test]
    fn refuses_malformed_text() {
        for bad in [
            "",
            "5",
            "m",
            "5x",
            "30s1m",
            "1m1m",
            "0s",
            "-5m",
            "5 m",
            "99999999999999999999d",
        ] {
            assert!(parse_secs(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
