//! Log search: the OTLP log records of the `logs` table, filtered and paged newest first
//! (docs/API.md `GET /api/v1/logs`, the UI's `/logs` and the instance page).
//!
//! Order and paging: newest first by `(ts_us, id)`, where the id is unique per record (SQLite:
//! the rowid; ClickHouse: the `(batch_id, seq)` every row is written with). A page asks for one
//! row more than it returns; the cursor is the position of its last row, and the next page
//! continues strictly after it, so records with equal timestamps are neither repeated nor
//! skipped.
//!
//! The text filter is a case-sensitive substring of the body, at most [`LOG_TEXT_MAX`] bytes.
//! ClickHouse 18.16 (the version this store targets) has no data-skipping indices (`INDEX … TYPE
//! tokenbf_v1` is a syntax error there; they came in 19.x), so the search narrows by day
//! partition and the table's primary key `(service, ts)` and scans the rest with `position()`;
//! measured in docs/BENCHMARKS.md "Log search".

use serde::Serialize;

use super::LogRow;

/// Largest page of [`LogQuery::limit`].
pub const LOG_PAGE_MAX: usize = 1000;
/// Longest text filter, bytes.
pub const LOG_TEXT_MAX: usize = 256;

/// Filters for [`super::Store::logs`]. Newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogQuery {
    /// Inclusive, unix ms.
    pub since_ms: u64,
    /// Exclusive, unix ms.
    pub until_ms: u64,
    pub service: Option<String>,
    pub host: Option<String>,
    /// Records with at least this OTLP severity number (0: any).
    pub min_severity: u8,
    /// A substring the body must contain (case-sensitive, at most [`LOG_TEXT_MAX`] bytes).
    pub text: Option<String>,
    /// Page size (1..=[`LOG_PAGE_MAX`]).
    pub limit: usize,
    /// Continue after this position (from a previous page).
    pub cursor: Option<LogCursor>,
}

impl LogQuery {
    /// The page size, clamped to 1..=[`LOG_PAGE_MAX`].
    pub fn page_size(&self) -> usize {
        self.limit.clamp(1, LOG_PAGE_MAX)
    }

    /// Refuses a text filter over [`LOG_TEXT_MAX`] bytes.
    pub(crate) fn check(&self) -> Result<(), super::StoreError> {
        if self.text.as_ref().is_some_and(|t| t.len() > LOG_TEXT_MAX) {
            return Err(super::StoreError::BadQuery(format!(
                "the text filter is longer than {LOG_TEXT_MAX} bytes"
            )));
        }
        Ok(())
    }
}

/// Position in the newest-first order of log records: `(ts_us, id, seq)` of the last row
/// returned (SQLite: `id` is the rowid and `seq` 0; ClickHouse: batch id and row index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogCursor {
    pub ts_us: u64,
    pub id: u64,
    pub seq: u32,
}

impl LogCursor {
    /// Opaque text form: `<ts_us>.<id>.<seq>`.
    pub fn encode(&self) -> String {
        format!("{}.{}.{}", self.ts_us, self.id, self.seq)
    }
    pub fn decode(s: &str) -> Option<LogCursor> {
        let mut it = s.split('.');
        let c = LogCursor {
            ts_us: it.next()?.parse().ok()?,
            id: it.next()?.parse().ok()?,
            seq: it.next()?.parse().ok()?,
        };
        it.next().is_none().then_some(c)
    }
}

/// One log record found, with its unique position.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogHit {
    /// The record's unique id in the store (`<id>.<seq>`; opaque).
    pub id: String,
    #[serde(flatten)]
    pub row: LogRow,
    #[serde(skip)]
    pub pos: LogCursor,
}

impl LogHit {
    pub fn new(row: LogRow, id: u64, seq: u32) -> LogHit {
        LogHit {
            id: format!("{id}.{seq}"),
            pos: LogCursor {
                ts_us: row.ts_us,
                id,
                seq,
            },
            row,
        }
    }
}

/// One page of log records.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogPage {
    pub items: Vec<LogHit>,
    /// Present when more rows may follow.
    pub next_cursor: Option<String>,
}

/// Trims a `limit + 1` result to `limit` and sets the cursor when more follow.
pub(crate) fn log_page(mut items: Vec<LogHit>, limit: usize) -> LogPage {
    let more = items.len() > limit;
    items.truncate(limit);
    let next_cursor = if more {
        items.last().map(|h| h.pos.encode())
    } else {
        None
    };
    LogPage { items, next_cursor }
}

/// The OTLP severity number a name stands for (the lowest of its range): `trace` 1, `debug` 5,
/// `info` 9, `warn` 13, `error` 17, `fatal` 21; or a number 1–24.
pub fn severity_floor(s: &str) -> Option<u8> {
    match s.to_ascii_lowercase().as_str() {
        "trace" => Some(1),
        "debug" => Some(5),
        "info" => Some(9),
        "warn" | "warning" => Some(13),
        "error" => Some(17),
        "fatal" => Some(21),
        n => n.parse::<u8>().ok().filter(|n| (1..=24).contains(n)),
    }
}

/// The short name of an OTLP severity number (`-` for 0, unset).
pub fn severity_name(n: u8) -> &'static str {
    match n {
        0 => "-",
        1..=4 => "trace",
        5..=8 => "debug",
        9..=12 => "info",
        13..=16 => "warn",
        17..=20 => "error",
        _ => "fatal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_refuse_junk() {
        let c = LogCursor {
            ts_us: 17,
            id: u64::MAX,
            seq: 3,
        };
        assert_eq!(LogCursor::decode(&c.encode()), Some(c));
        for bad in [
            "",
            "1",
            "1.2",
            "1.2.3.4",
            "a.2.3",
            "1.2.-3",
            "1.2.99999999999",
        ] {
            assert_eq!(LogCursor::decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn severities() {
        assert_eq!(severity_floor("ERROR"), Some(17));
        assert_eq!(severity_floor("warn"), Some(13));
        assert_eq!(severity_floor("24"), Some(24));
        assert_eq!(severity_floor("25"), None);
        assert_eq!(severity_floor("loud"), None);
        assert_eq!(severity_name(17), "error");
        assert_eq!(severity_name(9), "info");
    }
}
