//! The exactly-once outbox of a Redis stream every control-plane replica of a cluster writes
//! and reads: the shared failures of `patterns::share` and the SLO deltas of `slo::share`.
//!
//! - Each entry carries `o` (this process's origin id: the replica's name and a random suffix),
//!   `s` (its sequence number, counted per process), optionally `t` (the writer's unix second)
//!   and `d` (the payload, JSON).
//! - **Exactly once.** An entry is queued with its `s` before it is sent and leaves the queue
//!   only once `XADD` answered; an entry whose answer was lost is sent again with the same `s`,
//!   and readers take each (origin, `s`) once ([`StreamOutbox::read`], which keeps the highest
//!   `s` taken per origin).
//! - **Bounds.** The stream keeps about `max_len` entries (`XADD … MAXLEN ~`); the entries
//!   waiting for Redis are bounded by the caller ([`StreamOutbox::bound_pending`]); one `XREAD`
//!   returns at most `read_count` entries; the origins remembered are bounded by
//!   [`ReadRules::max_origins`].
//! - Every Redis operation times out after `op_timeout`.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use brownout_protocol::{HaConnection, RedisKeys, RedisTarget};
use redis::streams::StreamReadReply;

/// An entry queued but not yet appended.
#[derive(Debug, Clone)]
struct Pending {
    seq: u64,
    /// The `t` field, when the stream carries one.
    at: Option<u64>,
    data: String,
}

/// Which stream, and its bounds.
#[derive(Debug, Clone, Copy)]
pub struct StreamSpec {
    /// The stream's key for a cluster.
    pub key: fn(&RedisKeys) -> String,
    /// Entries the stream keeps (approximately: `MAXLEN ~`).
    pub max_len: u64,
    /// Entries read per `XREAD`.
    pub read_count: usize,
}

/// How [`StreamOutbox::read`] takes entries.
#[derive(Debug, Clone, Copy)]
pub struct ReadRules<'a> {
    /// Entries without a `t` field are skipped (and `t` is handed to the reader).
    pub with_t: bool,
    /// This process's own entries are skipped.
    pub skip_own: bool,
    /// Origins remembered for exactly-once; when a new one would go beyond, the memory is
    /// cleared.
    pub max_origins: usize,
    /// What an entry is, for the log (`a shared failure`, `an SLO delta`).
    pub what: &'a str,
}

/// One replica's side of a shared stream: its origin, its sequence, its entries waiting for
/// Redis, and the connection.
pub struct StreamOutbox {
    conn: HaConnection,
    key: String,
    origin: String,
    max_len: u64,
    read_count: usize,
    seq: u64,
    pending: VecDeque<Pending>,
    last_sent_at: Option<u64>,
    op_timeout: Duration,
}

impl StreamOutbox {
    /// Connects (a Sentinel URL as well as a plain one) to the stream `spec` names for
    /// `cluster`. `replica` names this replica in the origin id (a random suffix makes it
    /// unique per process).
    ///
    /// # Errors
    /// A bad URL or cluster name, or Redis not answering within a few `op_timeout`s.
    pub async fn connect(
        spec: &StreamSpec,
        url: &str,
        cluster: &str,
        replica: &str,
        op_timeout: Duration,
    ) -> anyhow::Result<StreamOutbox> {
        let keys = RedisKeys::new(cluster)?;
        let target = RedisTarget::parse(url)?;
        let conn = HaConnection::connect_bounded(&target, op_timeout).await?;
        Ok(StreamOutbox {
            conn,
            key: (spec.key)(&keys),
            origin: format!(
                "{replica}/{}",
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            ),
            max_len: spec.max_len,
            read_count: spec.read_count,
            seq: 0,
            pending: VecDeque::new(),
            last_sent_at: None,
            op_timeout,
        })
    }

    /// This process's origin id in the stream.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// Queues one entry (`at`: its `t` field, when the stream carries one) under the next
    /// sequence number.
    pub fn queue(&mut self, at: Option<u64>, data: String) {
        self.seq += 1;
        self.pending.push_back(Pending {
            seq: self.seq,
            at,
            data,
        });
    }

    /// Whether nothing waits to be appended.
    pub fn is_idle(&self) -> bool {
        self.pending.is_empty()
    }

    /// The `t` of the last entry appended, if any.
    pub fn last_sent_at(&self) -> Option<u64> {
        self.last_sent_at
    }

    /// Drops the oldest waiting entries beyond `max`; returns how many went.
    pub fn bound_pending(&mut self, max: usize) -> usize {
        let mut dropped = 0;
        while self.pending.len() > max {
            self.pending.pop_front();
            dropped += 1;
        }
        dropped
    }

    /// Appends every waiting entry, oldest first; returns how many were appended.
    ///
    /// # Errors
    /// Redis errors and timeouts: the entry that failed and those after it stay queued.
    pub async fn send(&mut self) -> anyhow::Result<u64> {
        let mut sent = 0;
        while let Some(p) = self.pending.front() {
            let mut cmd = redis::cmd("XADD");
            cmd.arg(&self.key)
                .arg("MAXLEN")
                .arg("~")
                .arg(self.max_len)
                .arg("*")
                .arg("o")
                .arg(&self.origin)
                .arg("s")
                .arg(p.seq);
            if let Some(t) = p.at {
                cmd.arg("t").arg(t);
            }
            cmd.arg("d").arg(p.data.as_str());
            let _: String = self.timed(cmd.query_async(&mut self.conn.clone())).await?;
            self.last_sent_at = p.at;
            self.pending.pop_front();
            sent += 1;
        }
        Ok(sent)
    }

    /// Reads every entry after `last_id` (moved along), once per (origin, `s`) as `applied`
    /// remembers them, and hands each one's `t` (0 without [`ReadRules::with_t`]) and `d` to
    /// `take`, which says whether it took the entry (false: it could not use it, and it is not
    /// remembered). Returns how many entries were taken.
    ///
    /// # Errors
    /// Redis errors and timeouts (what was read until then is taken), and `take`'s errors.
    pub async fn read(
        &mut self,
        last_id: &mut String,
        applied: &mut BTreeMap<String, u64>,
        rules: ReadRules<'_>,
        mut take: impl FnMut(&str, u64, &str) -> anyhow::Result<bool>,
    ) -> anyhow::Result<u64> {
        let mut taken = 0;
        loop {
            let mut cmd = redis::cmd("XREAD");
            cmd.arg("COUNT")
                .arg(self.read_count)
                .arg("STREAMS")
                .arg(&self.key)
                .arg(last_id.as_str());
            let reply: Option<StreamReadReply> =
                self.timed(cmd.query_async(&mut self.conn.clone())).await?;
            let entries: Vec<_> = reply
                .into_iter()
                .flat_map(|r| r.keys)
                .flat_map(|k| k.ids)
                .collect();
            let n = entries.len();
            for e in entries {
                last_id.clone_from(&e.id);
                let t = if rules.with_t {
                    e.get::<u64>("t")
                } else {
                    Some(0)
                };
                let (Some(origin), Some(seq), Some(t), Some(json)) = (
                    e.get::<String>("o"),
                    e.get::<u64>("s"),
                    t,
                    e.get::<String>("d"),
                ) else {
                    let fields = if rules.with_t {
                        "o, s, t or d"
                    } else {
                        "o, s or d"
                    };
                    tracing::warn!(id = %e.id, "{} entry without {fields}; skipped", rules.what);
                    continue;
                };
                if (rules.skip_own && origin == self.origin)
                    || applied.get(&origin).is_some_and(|&last| seq <= last)
                {
                    continue;
                }
                if !take(&e.id, t, &json)? {
                    continue;
                }
                if applied.len() >= rules.max_origins && !applied.contains_key(&origin) {
                    applied.clear();
                }
                applied.insert(origin, seq);
                taken += 1;
            }
            if n < self.read_count {
                break;
            }
        }
        Ok(taken)
    }

    async fn timed<T>(
        &self,
        f: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> anyhow::Result<T> {
        match tokio::time::timeout(self.op_timeout, f).await {
            Ok(r) => Ok(r?),
            Err(_) => anyhow::bail!("Redis did not answer within {:?}", self.op_timeout),
        }
    }
}
