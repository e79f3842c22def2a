//! The row types of the ClickHouse tables and the conversions between them and the store's
//! rows: what each INSERT writes (with its batch id and index) and each query reads back.

use std::collections::HashSet;

use brownout_protocol::{AgentSnapshot, Category, Criticality, FailureEvent};
use clickhouse::Row;
use serde::{Deserialize, Serialize};

use crate::store::{Batch, Doc, FailureRow, LogRow, SliRow, SpanRow, StoreError, WriteMode};

#[derive(Debug, Row, Serialize, Deserialize)]
pub(super) struct ChSpan {
    pub(super) ts: u32,
    pub(super) start_us: u64,
    pub(super) duration_us: u64,
    pub(super) trace_id: String,
    pub(super) span_id: String,
    pub(super) parent_span_id: String,
    pub(super) service: String,
    pub(super) name: String,
    pub(super) kind: u8,
    pub(super) status: u8,
    pub(super) status_message: String,
    pub(super) feature: String,
    pub(super) criticality: String,
    pub(super) host: String,
    pub(super) is_request: u8,
    pub(super) attr_keys: Vec<String>,
    pub(super) attr_values: Vec<String>,
    pub(super) batch_id: u64,
    pub(super) seq: u32,
}

#[derive(Debug, Row, Serialize, Deserialize)]
pub(super) struct ChLog {
    pub(super) ts: u32,
    pub(super) ts_us: u64,
    pub(super) trace_id: String,
    pub(super) span_id: String,
    pub(super) service: String,
    pub(super) host: String,
    pub(super) severity_number: u8,
    pub(super) severity_text: String,
    pub(super) body: String,
    pub(super) attr_keys: Vec<String>,
    pub(super) attr_values: Vec<String>,
    pub(super) batch_id: u64,
    pub(super) seq: u32,
}

#[derive(Debug, Row, Serialize, Deserialize)]
pub(super) struct ChFailure {
    pub(super) ts: u32,
    pub(super) ts_ms: u64,
    pub(super) id: String,
    pub(super) service: String,
    pub(super) host: String,
    pub(super) request_id: String,
    pub(super) trace_id: String,
    pub(super) user_id: String,
    pub(super) feature: String,
    pub(super) criticality: String,
    pub(super) category: String,
    pub(super) error_type: String,
    pub(super) message: String,
    pub(super) latency_ms: f64,
    pub(super) pattern: String,
    pub(super) attr_keys: Vec<String>,
    pub(super) attr_values: Vec<String>,
    pub(super) batch_id: u64,
    pub(super) seq: u32,
}

#[derive(Debug, Row, Serialize, Deserialize)]
pub(super) struct ChSnapshot {
    pub(super) ts: u32,
    pub(super) ts_ms: u64,
    pub(super) host: String,
    pub(super) json: String,
    pub(super) batch_id: u64,
    pub(super) seq: u32,
}

#[derive(Debug, Row, Serialize, Deserialize)]
pub(super) struct ChDoc {
    pub(super) kind: String,
    pub(super) key: String,
    pub(super) version_us: u64,
    pub(super) json: String,
}

pub(super) fn secs_from_us(us: u64) -> u32 {
    u32::try_from(us / 1_000_000).unwrap_or(u32::MAX)
}

pub(super) fn secs_from_ms(ms: u64) -> u32 {
    u32::try_from(ms / 1000).unwrap_or(u32::MAX)
}

pub(super) fn unzip(attrs: &[(String, String)]) -> (Vec<String>, Vec<String>) {
    attrs.iter().cloned().unzip()
}

/// The ids of the batches in replay mode that have rows in a table (`rows`: the batch's rows of
/// that table).
pub(super) fn replay_ids<S>(items: &[(&Batch, WriteMode)], rows: fn(&Batch) -> &[S]) -> Vec<u64> {
    items
        .iter()
        .filter(|(b, m)| *m == WriteMode::Replay && !rows(b).is_empty())
        .map(|(b, _)| b.id)
        .collect()
}

/// The rows of one table in `items` (`rows`: a batch's rows of it) not in `present`, each
/// converted by `row` with its batch id and index.
pub(super) fn missing_rows<'a, S: Sync + 'a, T: 'a>(
    items: &'a [(&'a Batch, WriteMode)],
    present: &'a HashSet<(u64, u32)>,
    rows: fn(&Batch) -> &[S],
    row: fn(&S, u64, u32) -> T,
) -> impl Iterator<Item = T> + Send + 'a {
    items.iter().flat_map(move |&(b, _)| {
        rows(b)
            .iter()
            .enumerate()
            .filter(move |(i, _)| !present.contains(&(b.id, *i as u32)))
            .map(move |(i, r)| row(r, b.id, i as u32))
    })
}

#[derive(Debug, Row, Serialize, Deserialize)]
pub(super) struct ChSliRow {
    pub(super) ts: u32,
    pub(super) minute_ms: u64,
    pub(super) slo: String,
    pub(super) good: u64,
    pub(super) total: u64,
    pub(super) refused: u64,
    pub(super) batch_id: u64,
    pub(super) seq: u32,
}

/// An SLI row as stored, with its batch id and index.
pub(super) fn ch_sli(r: &SliRow, batch_id: u64, seq: u32) -> ChSliRow {
    ChSliRow {
        ts: secs_from_ms(r.minute_ms),
        minute_ms: r.minute_ms,
        slo: r.slo.clone(),
        good: r.counts.good,
        total: r.counts.total,
        refused: r.counts.refused,
        batch_id,
        seq,
    }
}

/// A span as stored, with its batch id and index.
pub(super) fn ch_span(s: &SpanRow, batch_id: u64, seq: u32) -> ChSpan {
    let (attr_keys, attr_values) = unzip(&s.attributes);
    ChSpan {
        ts: secs_from_us(s.start_us),
        start_us: s.start_us,
        duration_us: s.duration_us,
        trace_id: s.trace_id.clone(),
        span_id: s.span_id.clone(),
        parent_span_id: s.parent_span_id.clone(),
        service: s.service.clone(),
        name: s.name.clone(),
        kind: s.kind,
        status: s.status,
        status_message: s.status_message.clone(),
        feature: s.feature.clone(),
        criticality: s.criticality.clone(),
        host: s.host.clone(),
        is_request: u8::from(s.is_request),
        attr_keys,
        attr_values,
        batch_id,
        seq,
    }
}

/// A log record as stored, with its batch id and index.
pub(super) fn ch_log(l: &LogRow, batch_id: u64, seq: u32) -> ChLog {
    let (attr_keys, attr_values) = unzip(&l.attributes);
    ChLog {
        ts: secs_from_us(l.ts_us),
        ts_us: l.ts_us,
        trace_id: l.trace_id.clone(),
        span_id: l.span_id.clone(),
        service: l.service.clone(),
        host: l.host.clone(),
        severity_number: l.severity_number,
        severity_text: l.severity_text.clone(),
        body: l.body.clone(),
        attr_keys,
        attr_values,
        batch_id,
        seq,
    }
}

/// A failure as stored, with its batch id and index.
pub(super) fn ch_failure(f: &FailureRow, batch_id: u64, seq: u32) -> ChFailure {
    let e = &f.event;
    let (attr_keys, attr_values) = crate::store::map_to_pairs(&e.attributes);
    ChFailure {
        ts: secs_from_ms(e.ts_ms),
        ts_ms: e.ts_ms,
        id: f.id.clone(),
        service: e.service.clone(),
        host: e.host.clone(),
        request_id: e.request_id.clone(),
        trace_id: e.trace_id.clone(),
        user_id: e.user_id.clone(),
        feature: e.feature.clone(),
        criticality: e.criticality.as_str().to_string(),
        category: e.category.as_str().to_string(),
        error_type: e.error_type.clone(),
        message: e.message.clone(),
        latency_ms: e.latency_ms,
        pattern: f.pattern.clone(),
        attr_keys,
        attr_values,
        batch_id,
        seq,
    }
}

/// An agent snapshot as stored (its JSON), with its batch id and index.
pub(super) fn ch_snapshot(
    s: &AgentSnapshot,
    batch_id: u64,
    seq: u32,
) -> Result<ChSnapshot, StoreError> {
    Ok(ChSnapshot {
        ts: secs_from_ms(s.ts_ms),
        ts_ms: s.ts_ms,
        host: s.host.clone(),
        json: serde_json::to_string(s).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        batch_id,
        seq,
    })
}

pub(super) fn span_from_ch(s: ChSpan) -> SpanRow {
    SpanRow {
        trace_id: s.trace_id,
        span_id: s.span_id,
        parent_span_id: s.parent_span_id,
        service: s.service,
        name: s.name,
        kind: s.kind,
        start_us: s.start_us,
        duration_us: s.duration_us,
        status: s.status,
        status_message: s.status_message,
        feature: s.feature,
        criticality: s.criticality,
        host: s.host,
        is_request: s.is_request != 0,
        attributes: s.attr_keys.into_iter().zip(s.attr_values).collect(),
    }
}

pub(super) fn failure_from_ch(f: ChFailure) -> FailureRow {
    FailureRow {
        id: f.id,
        pattern: f.pattern,
        event: FailureEvent {
            ts_ms: f.ts_ms,
            service: f.service,
            host: f.host,
            request_id: f.request_id,
            trace_id: f.trace_id,
            user_id: f.user_id,
            feature: f.feature,
            criticality: Criticality::parse(&f.criticality).unwrap_or_default(),
            category: Category::parse(&f.category).unwrap_or(Category::Other),
            error_type: f.error_type,
            message: f.message,
            latency_ms: f.latency_ms,
            attributes: f.attr_keys.into_iter().zip(f.attr_values).collect(),
        },
    }
}

pub(super) const SPAN_COLS: &str = "ts, start_us, duration_us, trace_id, span_id, parent_span_id, service, name, kind, status, \
     status_message, feature, criticality, host, is_request, attr_keys, attr_values, batch_id, seq";
pub(super) const FAILURE_COLS: &str = "ts, ts_ms, id, service, host, request_id, trace_id, user_id, feature, criticality, category, \
     error_type, message, latency_ms, pattern, attr_keys, attr_values, batch_id, seq";

/// The `YYYYMMDD` partition id of the day holding `ms`.
pub(super) fn yyyymmdd(ms: u64) -> u32 {
    chrono::DateTime::from_timestamp_millis(i64::try_from(ms).unwrap_or(i64::MAX))
        .map(|t| t.format("%Y%m%d").to_string().parse().unwrap_or(0))
        .unwrap_or(0)
}

/// A document as [`Store::get_doc`](crate::store::Store::get_doc) returns it.
pub(super) fn doc_from_ch(d: ChDoc) -> Result<Doc, StoreError> {
    crate::store::doc_from_json(d.kind, d.key, d.version_us, &d.json)
}

// ---- log search (docs/API.md `GET /api/v1/logs`) ---------------------------------------------

pub(super) const LOG_COLS: &str = "ts, ts_us, trace_id, span_id, service, host, severity_number, severity_text, \
     body, attr_keys, attr_values, batch_id, seq";
