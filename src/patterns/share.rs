//! One template miner for every control-plane replica of a cluster: the failures each replica
//! ingests are shared through Redis and every replica mines all of them in one canonical order
//! (`control.share_patterns`, docs/SCALING.md "N control-plane replicas", docs/PATTERNS.md
//! "Several replicas"). The one module of `patterns` that does IO.
//!
//! A template's id is a hash of the masked text of the first line that created it, and which
//! template a line joins depends on the lines before it: a miner's ids are a function of the
//! *sequence* it mined. So the replicas agree on ids, whatever each ingested first, exactly
//! when they mine the same sequence. This module makes that sequence the same everywhere:
//!
//! 1. The ingest tagger does not mine. It tags the failure with the id the shared miner would
//!    give it now ([`crate::patterns::PatternEngine::lookup`], read-only) and queues what the
//!    engine uses of it ([`SharedFailure`]) in this replica's [`FailureOutbox`].
//! 2. Once a round (1 s) each replica appends its queued failures to the Redis stream
//!    `brownout:{<cluster>}:failures` (`o` origin, `s` sequence number, `t` its clock's unix
//!    second, `d` the failures as JSON) and reads every entry after the last one it read, its
//!    own included.
//! 3. Each failure read goes into the time slice of its second, clamped to
//!    `[W − grace, max(W, t) + grace]`, where `W` (the watermark) is the highest `t` of the
//!    entries *before* it in the stream and `grace` is 5 s. A slice `S` is complete once
//!    `W > S + grace`: no later entry can put anything into it. Complete slices are mined in
//!    the order (slice, timestamp, the failure's JSON).
//!
//! Every input of that order — the stream's entries, in the stream's order — is the same for
//! every reader, so every replica runs the same sequence through its miner and its engine and
//! holds the same templates, ids, counts and patterns. The order depends only on which
//! failures fall in which second, not on which replica ingested them or when its entry reached
//! Redis (within the grace): two replicas fed the halves of a stream, in any order, mine what
//! one replica fed all of it mines (tests/it/patterns_share.rs). A failure more than `grace`
//! late is not dropped: it is mined in the oldest open slice.
//!
//! - **Exactly once.** An entry whose `XADD` answer was lost is sent again with the same `s`;
//!   readers take each (origin, `s`) once (the outbox of [`crate::stream_outbox`]).
//! - **Heartbeats.** Slices complete only as `W` moves, so a replica holding failures not yet
//!   mined appends an empty entry each round.
//! - **Restarts.** The miner's state, the stream position, the watermark and the failures read
//!   but not yet mined are one [`ShareCheckpoint`], saved to the store every minute and at
//!   shutdown by every replica under one key; since all replicas mine the same sequence, any
//!   replica's checkpoint is valid for all, and a replica (re)starting continues from the
//!   latest one, reading the stream after its position.
//! - **Redis down.** Failures are still stored and tagged; they wait in the outbox (at most
//!   [`MAX_OUTBOX`], then the oldest are dropped and counted) and are mined when Redis answers.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use brownout_protocol::{Category, Criticality, FailureEvent, RedisKeys};
use serde::{Deserialize, Serialize};

use super::engine::SharedEngine;
use super::engine::{EngineConfig, PatternEngine};
use super::miner::{MAX_LINE_BYTES, MinerState};
use crate::stream_outbox::{ReadRules, StreamOutbox, StreamSpec};

/// Entries the stream keeps (approximately: `MAXLEN ~`).
pub const DEFAULT_MAX_LEN: u64 = 100_000;
/// Seconds a time slice stays open for failures appended late.
pub const DEFAULT_GRACE_SECS: u64 = 5;
/// Failures queued while Redis does not answer; beyond it the oldest are dropped.
pub const MAX_OUTBOX: usize = 100_000;
/// Failures per stream entry.
const MAX_PER_ENTRY: usize = 2_000;
/// Entries waiting to be appended (beyond it the oldest are dropped).
const MAX_PENDING: usize = 3_600;
/// Entries read per `XREAD`.
const READ_COUNT: usize = 500;
/// Origins remembered for exactly-once.
const MAX_ORIGINS: usize = 10_000;
/// The version of [`ShareCheckpoint`] this build writes and reads.
pub const CHECKPOINT_VERSION: u32 = 1;
/// Where the checkpoint lives in the store (`(kind, key)` of a doc).
pub const CHECKPOINT_DOC: (&str, &str) = ("patterns", "shared_miner");

/// The stream, its length and read size.
const STREAM: StreamSpec = StreamSpec {
    key: stream_key,
    max_len: DEFAULT_MAX_LEN,
    read_count: READ_COUNT,
};

/// The stream's key for `cluster`.
pub fn stream_key(keys: &RedisKeys) -> String {
    format!("brownout:{{{}}}:failures", keys.cluster())
}

/// What the pattern engine uses of a failure, as it travels between replicas.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SharedFailure {
    #[serde(rename = "t")]
    pub ts_ms: u64,
    #[serde(rename = "m")]
    pub message: String,
    #[serde(rename = "c")]
    pub category: String,
    #[serde(rename = "e", default, skip_serializing_if = "String::is_empty")]
    pub error_type: String,
    #[serde(rename = "s", default, skip_serializing_if = "String::is_empty")]
    pub service: String,
    #[serde(rename = "f", default, skip_serializing_if = "String::is_empty")]
    pub feature: String,
    #[serde(rename = "md", default, skip_serializing_if = "String::is_empty")]
    pub model: String,
    #[serde(rename = "u", default, skip_serializing_if = "String::is_empty")]
    pub user_id: String,
    #[serde(rename = "r", default, skip_serializing_if = "String::is_empty")]
    pub request_id: String,
    #[serde(rename = "tr", default, skip_serializing_if = "String::is_empty")]
    pub trace_id: String,
}

impl SharedFailure {
    /// What the engine uses of `ev` (the message cut to what the miner reads).
    pub fn from_event(ev: &FailureEvent) -> SharedFailure {
        let mut end = ev.message.len().min(MAX_LINE_BYTES);
        while !ev.message.is_char_boundary(end) {
            end -= 1;
        }
        SharedFailure {
            ts_ms: ev.ts_ms,
            message: ev.message[..end].to_string(),
            category: ev.category.as_str().to_string(),
            error_type: ev.error_type.clone(),
            service: ev.service.clone(),
            feature: ev.feature.clone(),
            model: ev.attributes.get("model").cloned().unwrap_or_default(),
            user_id: ev.user_id.clone(),
            request_id: ev.request_id.clone(),
            trace_id: ev.trace_id.clone(),
        }
    }

    /// A failure event carrying what [`SharedFailure::from_event`] kept.
    pub fn to_event(&self) -> FailureEvent {
        let mut attributes = BTreeMap::new();
        if !self.model.is_empty() {
            attributes.insert("model".to_string(), self.model.clone());
        }
        FailureEvent {
            ts_ms: self.ts_ms,
            service: self.service.clone(),
            host: String::new(),
            request_id: self.request_id.clone(),
            trace_id: self.trace_id.clone(),
            user_id: self.user_id.clone(),
            feature: self.feature.clone(),
            criticality: Criticality::default(),
            category: Category::parse(&self.category).unwrap_or(Category::Other),
            error_type: self.error_type.clone(),
            message: self.message.clone(),
            latency_ms: 0.0,
            attributes,
        }
    }
}

/// This replica's failures not yet appended to the stream (filled by the ingest tagger).
#[derive(Debug, Default)]
pub struct FailureOutbox {
    queue: Mutex<VecDeque<SharedFailure>>,
    dropped: AtomicU64,
}

impl FailureOutbox {
    pub fn push(&self, f: SharedFailure) {
        let mut q = self
            .queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if q.len() >= MAX_OUTBOX {
            q.pop_front();
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        q.push_back(f);
    }

    /// Everything queued, oldest first.
    pub fn take(&self) -> Vec<SharedFailure> {
        let mut q = self
            .queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        q.drain(..).collect()
    }

    /// Failures dropped because the outbox was full (Redis away for long).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Where a reader stands in the stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShareCursor {
    /// The last stream id read (`0`: from the start).
    pub last_id: String,
    /// The highest `t` of the entries read.
    pub watermark: u64,
    /// Failures read but not mined yet: `(slice, ts_ms, the failure's JSON)`.
    pub buffered: Vec<(u64, u64, String)>,
    /// Per origin, the highest `s` taken.
    pub applied: BTreeMap<String, u64>,
}

impl Default for ShareCursor {
    fn default() -> Self {
        ShareCursor {
            last_id: "0".into(),
            watermark: 0,
            buffered: Vec::new(),
            applied: BTreeMap::new(),
        }
    }
}

/// The shared miner's state at one stream position (saved to the store).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShareCheckpoint {
    pub version: u32,
    pub cursor: ShareCursor,
    pub miner: MinerState,
}

impl ShareCheckpoint {
    /// The engine and cursor to continue from.
    ///
    /// # Errors
    /// An unknown checkpoint version, or a miner state the miner refuses.
    pub fn restore(self, config: EngineConfig) -> anyhow::Result<(PatternEngine, ShareCursor)> {
        anyhow::ensure!(
            self.version == CHECKPOINT_VERSION,
            "shared miner checkpoint version {} is not supported (expected {CHECKPOINT_VERSION})",
            self.version
        );
        Ok((
            PatternEngine::with_miner_state(config, self.miner)?,
            self.cursor,
        ))
    }
}

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundStats {
    /// Entries this replica appended (heartbeats included).
    pub sent: u64,
    /// Entries read and taken (this replica's own included).
    pub read: u64,
    /// Failures mined.
    pub mined: u64,
}

/// One replica's side of the shared miner.
pub struct PatternShare {
    /// Origin, sequence, entries waiting for Redis (`t` = the round's second).
    stream: StreamOutbox,
    grace: u64,
    cursor: ShareCursor,
}

impl PatternShare {
    /// Connects (a Sentinel URL as well as a plain one). `replica` names this replica in the
    /// origin id (a random suffix makes it unique per process). Reads from the stream's start
    /// unless given a cursor ([`PatternShare::with_cursor`]).
    ///
    /// # Errors
    /// A bad URL or cluster name, or Redis not answering within a few `op_timeout`s.
    pub async fn connect(
        url: &str,
        cluster: &str,
        replica: &str,
        op_timeout: Duration,
    ) -> anyhow::Result<PatternShare> {
        let stream = StreamOutbox::connect(&STREAM, url, cluster, replica, op_timeout).await?;
        Ok(PatternShare {
            stream,
            grace: DEFAULT_GRACE_SECS,
            cursor: ShareCursor::default(),
        })
    }

    /// Continues from `cursor` (a checkpoint's) instead of the stream's start.
    #[must_use]
    pub fn with_cursor(mut self, cursor: ShareCursor) -> PatternShare {
        self.cursor = cursor;
        self
    }

    /// This process's origin id in the stream.
    pub fn origin(&self) -> &str {
        self.stream.origin()
    }

    pub fn cursor(&self) -> &ShareCursor {
        &self.cursor
    }

    /// The state to save: the engine's miner at this reader's position. Take it between
    /// rounds (only rounds mine).
    pub fn checkpoint(&self, engine: &SharedEngine) -> ShareCheckpoint {
        let miner = engine
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .miner_state();
        ShareCheckpoint {
            version: CHECKPOINT_VERSION,
            cursor: self.cursor.clone(),
            miner,
        }
    }

    /// Appends what `outbox` holds (or a heartbeat while failures wait to be mined), stamped
    /// `now_sec`; reads what the stream holds after this reader's position; mines every
    /// complete time slice into `engine`.
    ///
    /// # Errors
    /// Redis errors and timeouts: what was not appended is kept for the next round, and what
    /// was read is kept.
    pub async fn round(
        &mut self,
        engine: &SharedEngine,
        outbox: &FailureOutbox,
        now_sec: u64,
    ) -> anyhow::Result<RoundStats> {
        let queued = outbox.take();
        for chunk in queued.chunks(MAX_PER_ENTRY) {
            self.stream
                .queue(Some(now_sec), serde_json::to_string(chunk)?);
        }
        if self.stream.is_idle()
            && !self.cursor.buffered.is_empty()
            && self.stream.last_sent_at().is_none_or(|t| t < now_sec)
        {
            // A heartbeat: moves the watermark so that the waiting slices complete.
            self.stream.queue(Some(now_sec), "[]".into());
        }
        for _ in 0..self.stream.bound_pending(MAX_PENDING) {
            tracing::warn!(
                "shared failures waited too long for Redis; the oldest entry is dropped (no replica mines it)"
            );
        }
        let mut stats = RoundStats {
            sent: self.stream.send().await?,
            ..RoundStats::default()
        };
        let ShareCursor {
            last_id,
            watermark,
            buffered,
            applied,
        } = &mut self.cursor;
        let grace = self.grace;
        let rules = ReadRules {
            with_t: true,
            skip_own: false,
            max_origins: MAX_ORIGINS,
            what: "a shared failure",
        };
        stats.read = self
            .stream
            .read(last_id, applied, rules, |id, t, json| {
                let failures: Vec<SharedFailure> = match serde_json::from_str(json) {
                    Ok(f) => f,
                    Err(err) => {
                        tracing::warn!(id = %id, error = %err, "a shared failure entry that does not parse; skipped");
                        return Ok(false);
                    }
                };
                take_entry(watermark, buffered, grace, &failures, t)?;
                Ok(true)
            })
            .await?;
        stats.mined = self.mine_complete(engine)?;
        Ok(stats)
    }

    /// Mines every buffered failure of a complete slice, in (slice, ts, JSON) order.
    fn mine_complete(&mut self, engine: &SharedEngine) -> anyhow::Result<u64> {
        let w = self.cursor.watermark;
        let grace = self.grace;
        let (mut ready, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.cursor.buffered)
            .into_iter()
            .partition(|(slice, _, _)| slice.saturating_add(grace) < w);
        self.cursor.buffered = keep;
        if ready.is_empty() {
            return Ok(0);
        }
        ready.sort_unstable();
        let events: Vec<FailureEvent> = ready
            .iter()
            .filter_map(|(_, _, json)| serde_json::from_str::<SharedFailure>(json).ok())
            .map(|f| f.to_event())
            .collect();
        let mut e = engine
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for ev in &events {
            e.observe(ev);
        }
        Ok(events.len() as u64)
    }
}

/// Files one entry's failures into their time slices, then moves the watermark.
fn take_entry(
    watermark: &mut u64,
    buffered: &mut Vec<(u64, u64, String)>,
    grace: u64,
    failures: &[SharedFailure],
    t: u64,
) -> anyhow::Result<()> {
    let w = *watermark;
    let lo = w.saturating_sub(grace);
    let hi = w.max(t).saturating_add(grace);
    for f in failures {
        let slice = (f.ts_ms / 1000).clamp(lo, hi);
        buffered.push((slice, f.ts_ms, serde_json::to_string(f)?));
    }
    *watermark = w.max(t);
    Ok(())
}

/// The latest checkpoint in the store, restored (`None`: none saved yet, or unusable — said
/// in the log).
pub async fn load_checkpoint(
    store: &dyn crate::store::Store,
    config: EngineConfig,
) -> Option<(PatternEngine, ShareCursor)> {
    match store.get_doc(CHECKPOINT_DOC.0, CHECKPOINT_DOC.1).await {
        Ok(Some(doc)) => match serde_json::from_value::<ShareCheckpoint>(doc.value)
            .map_err(anyhow::Error::from)
            .and_then(|c| c.restore(config))
        {
            Ok(r) => {
                tracing::info!(
                    templates = r.0.miner().num_templates(),
                    position = %r.1.last_id,
                    "shared miner checkpoint restored"
                );
                Some(r)
            }
            Err(e) => {
                tracing::warn!(error = %e, "the shared miner checkpoint is unusable; mining the stream from its start");
                None
            }
        },
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the shared miner checkpoint; mining the stream from its start");
            None
        }
    }
}

async fn save_checkpoint(store: &dyn crate::store::Store, c: &ShareCheckpoint) {
    match serde_json::to_value(c) {
        Ok(v) => {
            if let Err(e) = store.put_doc(CHECKPOINT_DOC.0, CHECKPOINT_DOC.1, &v).await {
                tracing::warn!(error = %e, "cannot save the shared miner checkpoint");
            }
        }
        Err(e) => tracing::warn!(error = %e, "cannot serialise the shared miner checkpoint"),
    }
}

/// What [`run`] needs.
pub struct ShareTask {
    pub engine: SharedEngine,
    pub outbox: std::sync::Arc<FailureOutbox>,
    pub store: std::sync::Arc<dyn crate::store::Store>,
    pub url: String,
    pub cluster: String,
    pub replica: String,
    /// Where to continue (a restored checkpoint's cursor, else the stream's start).
    pub cursor: ShareCursor,
    pub interval: Duration,
}

/// Runs rounds every `interval` until `shutdown` (then one last round, so the last failures
/// reach the others), saving a checkpoint every minute and at the end. The connection is
/// retried every interval until it succeeds.
pub async fn run(task: ShareTask, shutdown: impl std::future::Future<Output = ()>) {
    let logs = crate::share_rounds::RoundLogs {
        unreachable: "failure sharing: cannot reach Redis; failures wait until it answers",
        round_failed: "failure sharing: a round failed; failures are kept and sent later",
        back: "failure sharing: Redis answers again",
    };
    let interval = task.interval;
    let rounds = ShareRounds {
        cursor: Some(task.cursor.clone()),
        task,
        last_save: tokio::time::Instant::now(),
    };
    crate::share_rounds::run_rounds(rounds, interval, shutdown, &logs).await;
}

/// [`run`]'s task: the cursor to continue from (until connected) and the last checkpoint.
struct ShareRounds {
    task: ShareTask,
    cursor: Option<ShareCursor>,
    last_save: tokio::time::Instant,
}

impl crate::share_rounds::Sharing for ShareRounds {
    type Share = PatternShare;

    async fn connect(&mut self) -> anyhow::Result<PatternShare> {
        let t = &self.task;
        PatternShare::connect(&t.url, &t.cluster, &t.replica, Duration::from_secs(2))
            .await
            .map(|s| s.with_cursor(self.cursor.take().unwrap_or_default()))
    }

    async fn round(&mut self, s: &mut PatternShare) -> anyhow::Result<()> {
        let now_sec = brownout_protocol::now_ms() / 1000;
        s.round(&self.task.engine, &self.task.outbox, now_sec)
            .await
            .map(drop)
    }

    /// A checkpoint every minute and at the end.
    async fn after(&mut self, s: &mut PatternShare, stopping: bool) {
        if stopping || self.last_save.elapsed() >= Duration::from_secs(60) {
            self.last_save = tokio::time::Instant::now();
            save_checkpoint(self.task.store.as_ref(), &s.checkpoint(&self.task.engine)).await;
        }
    }
}
