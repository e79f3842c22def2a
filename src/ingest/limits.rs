//! Ingest limits beyond body size: per-tenant item rates.
//!
//! - **Tenants**: a sender names itself with the `X-Brownout-Tenant` header (gRPC metadata
//!   `x-brownout-tenant`); without one it is `default`. Each tenant gets a GCRA bucket
//!   (`governor`) of `ingest.tenant_items_per_sec` items per second with a burst of
//!   `ingest.tenant_burst_items`. Items are spans, log records, failure events and snapshots,
//!   counted after decoding. Past the rate: `429` with `Retry-After` (gRPC `RESOURCE_EXHAUSTED`);
//!   nothing of the request is kept, so the client retries it whole.
//! - **Per-item limits** ([`ItemLimits`], applied while OTLP is converted and to every failure
//!   event): at most [`MAX_ATTRIBUTES`] attributes per span, log record, resource or event (the
//!   rest dropped, with a `brownout.dropped_attributes` attribute saying how many) and at most
//!   [`MAX_ATTRIBUTE_BYTES`] of attribute text, keys of at most [`MAX_KEY_BYTES`], values of at most [`MAX_VALUE_BYTES`], names (service, host, span
//!   name, feature) of at most [`MAX_NAME_BYTES`], messages and log bodies of at most
//!   [`MAX_MESSAGE_BYTES`]; longer strings are cut at a character boundary and end with the
//!   marker `…[+N bytes]`. At most [`MAX_EVENTS`] events of a span are read (links are not
//!   stored). Each cut is counted in `brownout_ingest_truncated_total{what}`.
//! - **Decoded size before decoding**: [`protobuf_decoded_estimate`] walks an OTLP protobuf
//!   body without allocating and bounds what decoding and converting it will take (every
//!   attribute, and each resource copied into each of its items); the in-flight reservation is
//!   that estimate, and a body whose estimate exceeds `ingest.max_inflight_bytes` is refused
//!   with 413 before it is decoded.
//! - **Connections**: caps and timeouts per listener are in [`super::listen`].

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// The header (and gRPC metadata key) that names the tenant.
pub const TENANT_HEADER: &str = "x-brownout-tenant";
/// The tenant of requests without the header.
pub const DEFAULT_TENANT: &str = "default";
/// Longest tenant name.
pub const MAX_TENANT_LEN: usize = 64;

/// Validates a tenant name from a header value: `None` (absent) is [`DEFAULT_TENANT`]; otherwise
/// 1–64 of `[A-Za-z0-9._-]`.
///
/// # Errors
/// A message saying what is wrong (the caller answers 400 / `INVALID_ARGUMENT`).
pub fn tenant_name(value: Option<&[u8]>) -> Result<String, String> {
    let Some(v) = value else {
        return Ok(DEFAULT_TENANT.to_string());
    };
    let ok = !v.is_empty()
        && v.len() <= MAX_TENANT_LEN
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(String::from_utf8_lossy(v).into_owned())
    } else {
        Err(format!(
            "{TENANT_HEADER} must be 1-{MAX_TENANT_LEN} characters of A-Z a-z 0-9 . _ -"
        ))
    }
}

/// Attributes kept per span, log record, resource, scope or event.
pub const MAX_ATTRIBUTES: usize = 128;
/// Attribute text (keys and values) kept per item; the attributes past it are dropped.
pub const MAX_ATTRIBUTE_BYTES: usize = 32 << 10;
/// Longest attribute key.
pub const MAX_KEY_BYTES: usize = 256;
/// Longest attribute value (as text).
pub const MAX_VALUE_BYTES: usize = 4096;
/// Longest service, host, span or feature name.
pub const MAX_NAME_BYTES: usize = 256;
/// Longest status message, log body or failure message.
pub const MAX_MESSAGE_BYTES: usize = 8192;
/// Events of one span that are read (for `exception` attributes).
pub const MAX_EVENTS: usize = 128;
/// The attribute that says how many attributes were dropped.
pub const DROPPED_ATTRIBUTES: &str = "brownout.dropped_attributes";

/// What the per-item limits cut in one request, by kind (the `what` label).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Truncated {
    pub attributes: u64,
    pub keys: u64,
    pub values: u64,
    pub names: u64,
    pub messages: u64,
    pub events: u64,
}

impl Truncated {
    pub fn total(&self) -> u64 {
        self.attributes + self.keys + self.values + self.names + self.messages + self.events
    }

    /// Adds the counts to `brownout_ingest_truncated_total{what}`.
    pub fn count(&self, m: &crate::metrics::Metrics) {
        for (what, n) in [
            ("attributes", self.attributes),
            ("keys", self.keys),
            ("values", self.values),
            ("names", self.names),
            ("messages", self.messages),
            ("events", self.events),
        ] {
            if n > 0 {
                m.ingest
                    .truncated_total
                    .with_label_values(&[what])
                    .inc_by(n);
            }
        }
    }

    /// A warning for OTLP's `partial_success.error_message`, when something was cut.
    pub fn warning(&self) -> Option<String> {
        (self.total() > 0).then(|| {
            format!(
                "cut to the per-item limits: {} attributes dropped, {} keys, {} values, {} names, {} messages shortened, {} events skipped",
                self.attributes, self.keys, self.values, self.names, self.messages, self.events
            )
        })
    }
}

/// Room left for the marker: a string already cut to `max` plus its marker is not cut again.
const MARKER_SLACK: usize = 32;

/// `s` cut to at most `max` bytes (at a character boundary) plus the marker `…[+N bytes]`;
/// true when it was cut. A string at most [`MARKER_SLACK`] bytes over `max` is left alone (it
/// may carry a marker already).
pub fn cut(s: &mut String, max: usize) -> bool {
    if s.len() <= max + MARKER_SLACK {
        return false;
    }
    // A string cut before (a longer limit) keeps counting the bytes it lost then.
    let mut earlier = 0usize;
    if let Some(pos) = s.rfind("…[+")
        && let Some(n) = s[pos + "…[+".len()..]
            .strip_suffix(" bytes]")
            .and_then(|n| n.parse::<usize>().ok())
    {
        earlier = n;
        s.truncate(pos);
    }
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let dropped = s.len() - end + earlier;
    s.truncate(end);
    s.push_str(&format!("…[+{dropped} bytes]"));
    true
}

/// Applies the limits to attribute pairs: the first [`MAX_ATTRIBUTES`] are kept, keys and
/// values cut; a `brownout.dropped_attributes` pair is added when some were dropped.
pub fn limit_pairs(
    it: impl Iterator<Item = (String, String)>,
    t: &mut Truncated,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut dropped = 0u64;
    let mut bytes = 0usize;
    for (mut k, mut v) in it {
        if k == DROPPED_ATTRIBUTES {
            // Dropped earlier (while converting OTLP): add up.
            dropped += v.parse::<u64>().unwrap_or(0);
            continue;
        }
        if out.len() >= MAX_ATTRIBUTES || bytes >= MAX_ATTRIBUTE_BYTES {
            dropped += 1;
            t.attributes += 1;
            continue;
        }
        t.keys += u64::from(cut(&mut k, MAX_KEY_BYTES));
        t.values += u64::from(cut(&mut v, MAX_VALUE_BYTES));
        bytes += k.len() + v.len();
        out.push((k, v));
    }
    if dropped > 0 {
        out.push((DROPPED_ATTRIBUTES.to_string(), dropped.to_string()));
    }
    out
}

/// Applies the limits to a failure event (NDJSON or converted from OTLP).
pub fn limit_event(e: &mut brownout_protocol::FailureEvent, t: &mut Truncated) {
    for s in [&mut e.service, &mut e.host, &mut e.feature] {
        t.names += u64::from(cut(s, MAX_NAME_BYTES));
    }
    for s in [
        &mut e.request_id,
        &mut e.trace_id,
        &mut e.user_id,
        &mut e.error_type,
    ] {
        t.values += u64::from(cut(s, MAX_NAME_BYTES));
    }
    t.messages += u64::from(cut(&mut e.message, MAX_MESSAGE_BYTES));
    let bytes: usize = e.attributes.iter().map(|(k, v)| k.len() + v.len()).sum();
    if e.attributes.len() > MAX_ATTRIBUTES
        || bytes > MAX_ATTRIBUTE_BYTES + MAX_VALUE_BYTES
        || e.attributes.iter().any(|(k, v)| {
            k.len() > MAX_KEY_BYTES + MARKER_SLACK || v.len() > MAX_VALUE_BYTES + MARKER_SLACK
        })
    {
        let attrs = std::mem::take(&mut e.attributes);
        e.attributes = limit_pairs(attrs.into_iter(), t).into_iter().collect();
    }
}

/// Which OTLP export a protobuf body holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Traces,
    Logs,
}

/// Message types of the OTLP schema the estimate walks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Msg {
    TraceReq,
    ResourceSpans,
    ScopeSpans,
    Span,
    Event,
    Link,
    LogsReq,
    ResourceLogs,
    ScopeLogs,
    LogRecord,
    Resource,
    Scope,
    KeyValue,
    AnyValue,
    ArrayValue,
    KvList,
}

impl Msg {
    /// The submessage type of field `f`, if it is one.
    fn child(self, f: u64) -> Option<Msg> {
        use Msg::*;
        Some(match (self, f) {
            (TraceReq, 1) => ResourceSpans,
            (ResourceSpans, 1) | (ResourceLogs, 1) => Resource,
            (ResourceSpans, 2) => ScopeSpans,
            (ScopeSpans, 1) | (ScopeLogs, 1) => Scope,
            (ScopeSpans, 2) => Span,
            (Span, 9) | (Event, 3) | (Link, 4) | (Resource, 1) | (Scope, 3) | (LogRecord, 6) => {
                KeyValue
            }
            (Span, 11) => Event,
            (Span, 13) => Link,
            (LogsReq, 1) => ResourceLogs,
            (ResourceLogs, 2) => ScopeLogs,
            (ScopeLogs, 2) => LogRecord,
            (LogRecord, 5) | (KeyValue, 2) | (ArrayValue, 1) => AnyValue,
            (AnyValue, 5) => ArrayValue,
            (AnyValue, 6) => KvList,
            (KvList, 1) => KeyValue,
            _ => return None,
        })
    }
}

/// What a subtree holds.
#[derive(Debug, Default, Clone, Copy)]
struct Tree {
    /// Messages, strings and byte fields (each one allocation when decoded).
    nodes: u64,
    /// Attributes directly on this message (for items and resources).
    kvs: u64,
    /// Items (spans, log records) below it not yet charged their resource's copy.
    items: u64,
}

/// Bytes one decoded node takes beside its string bytes (struct, allocation, vector slot),
/// generously: a prost `KeyValue` with its `AnyValue` is ~100 bytes before its strings.
const NODE_BYTES: u64 = 160;
/// What converting one item (span or log record) costs beside its attributes: the row, a
/// failure event, its copy for live subscribers, and the stored form.
const ITEM_BYTES: u64 = 2048;
/// Copies of an item's (and its resource's) attribute text made while converting and storing.
const COPIES: u64 = 4;

fn varint(b: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*i)?;
        *i += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// What the converted copies of a message with `kvs` attributes in `len` bytes take, after
/// the per-item limits.
fn copy_cost(len: u64, kvs: u64) -> u64 {
    let kvs = kvs.min(MAX_ATTRIBUTES as u64 + 1);
    let bytes =
        len.min(kvs * (MAX_KEY_BYTES + MAX_VALUE_BYTES) as u64 + 2 * MAX_MESSAGE_BYTES as u64);
    COPIES * (bytes + kvs * NODE_BYTES)
}

/// Walks one message; `cost` collects the conversion cost of the items below it.
fn walk(b: &[u8], m: Msg, depth: u32, cost: &mut u64) -> Option<Tree> {
    if depth > 32 {
        return None;
    }
    let mut t = Tree {
        nodes: 1,
        ..Tree::default()
    };
    let mut resource = 0u64;
    let mut i = 0;
    while i < b.len() {
        let key = varint(b, &mut i)?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                varint(b, &mut i)?;
            }
            1 => i = i.checked_add(8).filter(|n| *n <= b.len())?,
            5 => i = i.checked_add(4).filter(|n| *n <= b.len())?,
            2 => {
                let len = usize::try_from(varint(b, &mut i)?).ok()?;
                let end = i.checked_add(len).filter(|n| *n <= b.len())?;
                let sub = &b[i..end];
                i = end;
                let Some(c) = m.child(field) else {
                    t.nodes += 1;
                    continue;
                };
                let st = walk(sub, c, depth + 1, cost)?;
                t.nodes += st.nodes;
                t.items += st.items;
                match c {
                    Msg::KeyValue => t.kvs += 1,
                    Msg::Resource => resource += copy_cost(len as u64, st.kvs),
                    Msg::Span | Msg::LogRecord => {
                        t.items += 1;
                        *cost += ITEM_BYTES + copy_cost(len as u64, st.kvs);
                    }
                    _ => {}
                }
            }
            _ => return None,
        }
    }
    if matches!(m, Msg::ResourceSpans | Msg::ResourceLogs) {
        // Every item of this resource carries a copy of its (limited) attributes.
        *cost = cost.saturating_add(t.items.saturating_mul(resource));
        t.items = 0;
    }
    Some(t)
}

/// An upper bound of the memory that decoding an OTLP protobuf `body` and converting it into
/// rows takes, computed without decoding (no allocation per element). `None` when the body
/// is not well-formed protobuf (decoding will say why).
pub fn protobuf_decoded_estimate(body: &[u8], signal: Signal) -> Option<usize> {
    let root = match signal {
        Signal::Traces => Msg::TraceReq,
        Signal::Logs => Msg::LogsReq,
    };
    let mut cost = 0u64;
    let t = walk(body, root, 0, &mut cost)?;
    let decode = body.len() as u64 + t.nodes.saturating_mul(NODE_BYTES);
    usize::try_from(decode.saturating_add(cost)).ok()
}

/// Why a tenant's request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TenantLimitError {
    #[error(
        "tenant {tenant:?} is over its ingest rate of {rate} items/s; retry in {retry_after_secs} s"
    )]
    RateLimited {
        tenant: String,
        rate: u32,
        retry_after_secs: u32,
    },
    #[error(
        "a request of {items} items is more than tenant {tenant:?} may send at once ({burst}); send smaller batches"
    )]
    TooManyItems {
        tenant: String,
        items: u32,
        burst: u32,
    },
}

impl TenantLimitError {
    pub fn retry_after_secs(&self) -> u32 {
        match self {
            TenantLimitError::RateLimited {
                retry_after_secs, ..
            } => *retry_after_secs,
            TenantLimitError::TooManyItems { .. } => 1,
        }
    }
}

/// Per-tenant item rates (GCRA, one bucket per tenant name).
pub struct TenantLimiter {
    limiter: Option<DefaultKeyedRateLimiter<String>>,
    rate: u32,
    burst: NonZeroU32,
    checks: AtomicU64,
}

impl std::fmt::Debug for TenantLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantLimiter")
            .field("rate", &self.rate)
            .field("burst", &self.burst)
            .finish_non_exhaustive()
    }
}

impl TenantLimiter {
    /// `rate` items per second and tenant (`None`: unlimited), bursts of up to `burst`.
    pub fn new(rate: Option<NonZeroU32>, burst: NonZeroU32) -> TenantLimiter {
        TenantLimiter {
            limiter: rate.map(|r| RateLimiter::keyed(Quota::per_second(r).allow_burst(burst))),
            rate: rate.map_or(0, NonZeroU32::get),
            burst,
            checks: AtomicU64::new(0),
        }
    }

    /// Takes `items` from `tenant`'s bucket, or says why not (and takes nothing).
    ///
    /// # Errors
    /// [`TenantLimitError`] when the tenant is over its rate or the request is bigger than the
    /// burst.
    pub fn check(&self, tenant: &str, items: usize) -> Result<(), TenantLimitError> {
        let Some(lim) = &self.limiter else {
            return Ok(());
        };
        let Some(n) = u32::try_from(items).ok().and_then(NonZeroU32::new) else {
            return if items == 0 {
                Ok(())
            } else {
                Err(TenantLimitError::TooManyItems {
                    tenant: tenant.into(),
                    items: u32::MAX,
                    burst: self.burst.get(),
                })
            };
        };
        // Forget idle tenants now and then, so the map holds only the active ones.
        if self.checks.fetch_add(1, Ordering::Relaxed) % 4096 == 4095 {
            lim.retain_recent();
            lim.shrink_to_fit();
        }
        match lim.check_key_n(&tenant.to_string(), n) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(not_until)) => {
                let wait = not_until.wait_time_from(DefaultClock::default().now());
                Err(TenantLimitError::RateLimited {
                    tenant: tenant.into(),
                    rate: self.rate,
                    retry_after_secs: u32::try_from(wait.as_secs() + 1).unwrap_or(u32::MAX),
                })
            }
            Err(_) => Err(TenantLimitError::TooManyItems {
                tenant: tenant.into(),
                items: n.get(),
                burst: self.burst.get(),
            }),
        }
    }

    /// Tenants with state right now (approximate).
    pub fn tracked_tenants(&self) -> usize {
        self.limiter.as_ref().map_or(0, |l| l.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::KeyValue;
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    use prost::Message;

    use crate::ingest::otlp::tests::kv;

    fn request(resource_attrs: Vec<KeyValue>, spans: usize, span_attrs: usize) -> Vec<u8> {
        let span = Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            name: "s".into(),
            attributes: (0..span_attrs).map(|i| kv(&format!("k{i}"), "v")).collect(),
            ..Span::default()
        };
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(Resource {
                    attributes: resource_attrs,
                    ..Resource::default()
                }),
                scope_spans: vec![ScopeSpans {
                    spans: vec![span; spans],
                    ..ScopeSpans::default()
                }],
                ..ResourceSpans::default()
            }],
        }
        .encode_to_vec()
    }

    #[test]
    fn the_estimate_grows_with_attributes_and_with_resource_copies() {
        let small = request(vec![kv("service.name", "a")], 1, 1);
        let e_small = protobuf_decoded_estimate(&small, Signal::Traces).unwrap();
        assert!(e_small >= small.len() && e_small < 64 << 10, "{e_small}");
        // A million tiny attributes: ~16 bytes each on the wire, far more once decoded.
        let many = request(vec![], 1, 1_000_000);
        let e_many = protobuf_decoded_estimate(&many, Signal::Traces).unwrap();
        assert!(e_many > 8 * many.len(), "{e_many} for {} bytes", many.len());
        // A big resource copied into each of many spans counts once per span.
        let big = "x".repeat(4000);
        let attrs: Vec<KeyValue> = (0..100).map(|i| kv(&format!("r{i}"), &big)).collect();
        let copies = request(attrs.clone(), 2000, 0);
        let once = request(attrs, 1, 0);
        let (e_copies, e_once) = (
            protobuf_decoded_estimate(&copies, Signal::Traces).unwrap(),
            protobuf_decoded_estimate(&once, Signal::Traces).unwrap(),
        );
        assert!(e_copies > 1000 * e_once / 2, "{e_copies} vs {e_once}");
        assert!(e_copies > 400_000 * 2000, "{e_copies}");
        // Not protobuf of this shape: no estimate (decoding refuses it).
        assert_eq!(
            protobuf_decoded_estimate(&[0x0a, 0xff], Signal::Traces),
            None
        );
    }

    #[test]
    fn strings_are_cut_at_a_char_boundary_with_a_marker_and_counted() {
        let mut s = "é".repeat(200); // 400 bytes
        assert!(cut(&mut s, 255));
        assert!(s.starts_with(&"é".repeat(127)), "{s}");
        assert!(s.ends_with("…[+146 bytes]"), "{s}");
        // Within the slack: left alone (a marker may be there already).
        let mut again = s.clone();
        assert!(!cut(&mut again, 255));
        let mut t = Truncated::default();
        let pairs = limit_pairs(
            (0..200).map(|i| (format!("k{i}"), "v".repeat(5000))),
            &mut t,
        );
        // 32 KiB of text is reached after 7 values of 4 KiB.
        assert!(pairs.len() <= MAX_ATTRIBUTES + 1);
        let (k, n) = pairs.last().unwrap();
        assert_eq!(k, DROPPED_ATTRIBUTES);
        assert_eq!(n.parse::<u64>().unwrap(), t.attributes);
        assert!(t.values >= 7 && t.attributes > 150, "{t:?}");
        assert!(t.warning().unwrap().contains("attributes dropped"));
    }

    #[test]
    fn tenant_names_are_checked() {
        assert_eq!(tenant_name(None).unwrap(), "default");
        assert_eq!(
            tenant_name(Some(b"team-a.prod_1")).unwrap(),
            "team-a.prod_1"
        );
        for bad in [
            &b""[..],
            b"a b",
            b"x\0",
            b"\xff",
            &[b'a'; 65][..],
            b"<script>",
        ] {
            assert!(tenant_name(Some(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn buckets_are_per_tenant_and_refusals_take_nothing() {
        let l = TenantLimiter::new(NonZeroU32::new(10), NonZeroU32::new(100).unwrap());
        l.check("a", 100).unwrap();
        let e = l.check("a", 50).unwrap_err();
        assert!(
            matches!(e, TenantLimitError::RateLimited { retry_after_secs, .. } if (1..=6).contains(&retry_after_secs)),
            "{e:?}"
        );
        // Another tenant is unaffected.
        l.check("b", 100).unwrap();
        // Larger than the burst: never possible, said so.
        assert!(matches!(
            l.check("c", 101),
            Err(TenantLimitError::TooManyItems { burst: 100, .. })
        ));
        // The refused 101 took nothing from c.
        l.check("c", 100).unwrap();
        assert_eq!(l.tracked_tenants(), 3);
        // Unlimited.
        let u = TenantLimiter::new(None, NonZeroU32::new(1).unwrap());
        u.check("a", 1_000_000).unwrap();
    }
}
