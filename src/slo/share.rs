//! SLO counters shared by every control-plane replica of one cluster, through Redis
//! (`control.share_slo_counters`, docs/SCALING.md "N control-plane replicas").
//!
//! Behind a load balancer each replica ingests part of the traffic. Each one keeps what it
//! counts per SLO and second ([`SharedDelta`]), and once per round
//!
//! 1. appends it to the stream `brownout:{<cluster>}:slo-deltas` (`XADD … MAXLEN ~`), one
//!    entry per round: `o` = this process's origin id, `s` = its sequence number, `d` = the
//!    deltas as JSON;
//! 2. reads every entry after the last one it read (`XREAD`) and adds the others' deltas to
//!    its own counters.
//!
//! So every replica — the leader among them — holds the counters of the whole stream, and its
//! burn rates are those one replica fed everything would compute (one second divides every
//! ring bucket and time slice, so the sums are exact; tests/it/slo_share.rs).
//!
//! - **Exactly once.** An entry whose `XADD` answer was lost is sent again with the same `s`;
//!   readers apply each (origin, `s`) once (the outbox of [`crate::stream_outbox`]). Entries not yet sent wait in order (up to
//!   [`MAX_PENDING`] rounds, then the oldest go, with a warning).
//! - **Restarts.** The origin id is new per process and a replica reads the stream from its
//!   start, so a restarted replica gets back what the stream still holds — its own earlier
//!   counts included. The stream keeps about [`DEFAULT_MAX_LEN`] entries (one per replica and
//!   round): with 3 replicas at 1 s about 9 hours. Older history is lost on a restart, as it is
//!   with one replica today.
//! - **Late deltas.** A delta older than the counters hold, or for a time slice already closed
//!   (5 s after it ends), is dropped and counted in `dropped_late`, as a late event is.
//! - **Redis down.** Counting goes on locally; deltas wait and are sent when Redis answers.

use std::collections::BTreeMap;
use std::time::Duration;

use brownout_protocol::RedisKeys;

use super::eval::SharedDelta;
use super::task::SloHandle;
use crate::stream_outbox::{ReadRules, StreamOutbox, StreamSpec};

/// Entries the stream keeps (approximately: `MAXLEN ~`).
pub const DEFAULT_MAX_LEN: u64 = 100_000;
/// Rounds of deltas kept while Redis does not answer.
pub const MAX_PENDING: usize = 3_600;
/// Entries read per `XREAD`.
const READ_COUNT: usize = 1_000;

/// The stream, its length and read size.
const STREAM: StreamSpec = StreamSpec {
    key: stream_key,
    max_len: DEFAULT_MAX_LEN,
    read_count: READ_COUNT,
};

/// The stream's key for `cluster`.
pub fn stream_key(keys: &RedisKeys) -> String {
    format!("brownout:{{{}}}:slo-deltas", keys.cluster())
}

/// One delta on the wire: `[slo, sec, good, total, refused, first_ms]`.
type WireDelta = (String, u64, u64, u64, u64, u64);

/// What one round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RoundStats {
    /// Entries this replica appended.
    pub sent: u64,
    /// Entries of other origins applied.
    pub applied_entries: u64,
    /// Events (good + bad) those entries counted here.
    pub applied_events: u64,
}

/// One replica's side of the sharing.
pub struct SloShare {
    /// Origin, sequence, rounds waiting for Redis.
    stream: StreamOutbox,
    /// The last stream id read (`0`: from the start).
    last_id: String,
    /// Per origin, the highest `s` applied.
    applied: BTreeMap<String, u64>,
}

impl SloShare {
    /// Connects (a Sentinel URL as well as a plain one). `replica` names this replica in the
    /// origin id (a random suffix makes it unique per process).
    ///
    /// # Errors
    /// A bad URL or cluster name, or Redis not answering within a few `op_timeout`s.
    pub async fn connect(
        url: &str,
        cluster: &str,
        replica: &str,
        op_timeout: Duration,
    ) -> anyhow::Result<SloShare> {
        let stream = StreamOutbox::connect(&STREAM, url, cluster, replica, op_timeout).await?;
        Ok(SloShare {
            stream,
            last_id: "0".into(),
            applied: BTreeMap::new(),
        })
    }

    /// This process's origin id in the stream.
    pub fn origin(&self) -> &str {
        self.stream.origin()
    }

    /// Sends what `slo` counted since the last round, then applies what the other replicas
    /// sent. `slo` must have sharing on ([`SloHandle::enable_sharing`]).
    ///
    /// # Errors
    /// Redis errors and timeouts: what was not sent is kept for the next round.
    pub async fn round(&mut self, slo: &SloHandle) -> anyhow::Result<RoundStats> {
        let deltas = slo.take_shared();
        if !deltas.is_empty() {
            let wire: Vec<WireDelta> = deltas
                .into_iter()
                .map(|d| (d.slo, d.sec, d.good, d.total, d.refused, d.first_ms))
                .collect();
            self.stream.queue(None, serde_json::to_string(&wire)?);
            if self.stream.bound_pending(MAX_PENDING) > 0 {
                tracing::warn!(
                    "SLO deltas waited too long for Redis; the oldest round is dropped (other replicas will not count it)"
                );
            }
        }
        let mut stats = RoundStats {
            sent: self.stream.send().await?,
            ..RoundStats::default()
        };
        let rules = ReadRules {
            with_t: false,
            skip_own: true,
            // Every origin is remembered (one per process that ever wrote to the stream).
            max_origins: usize::MAX,
            what: "an SLO delta",
        };
        let applied_events = &mut stats.applied_events;
        stats.applied_entries = self
            .stream
            .read(&mut self.last_id, &mut self.applied, rules, |id, _, json| {
                let wire: Vec<WireDelta> = match serde_json::from_str(json) {
                    Ok(w) => w,
                    Err(err) => {
                        tracing::warn!(id = %id, error = %err, "an SLO delta entry that does not parse; skipped");
                        return Ok(false);
                    }
                };
                let deltas: Vec<SharedDelta> = wire
                    .into_iter()
                    .map(|(slo, sec, good, total, refused, first_ms)| SharedDelta {
                        slo,
                        sec,
                        good,
                        total,
                        refused,
                        first_ms,
                    })
                    .collect();
                *applied_events += slo.apply_shared(&deltas);
                Ok(true)
            })
            .await?;
        Ok(stats)
    }
}

/// Shares `slo`'s counters through Redis every `interval` until `shutdown` (then one last
/// round, so the last counts reach the others). Counting is captured from the start; the
/// connection is retried every interval until it succeeds.
pub async fn run(
    slo: SloHandle,
    url: String,
    cluster: String,
    replica: String,
    interval: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    slo.enable_sharing();
    let logs = crate::share_rounds::RoundLogs {
        unreachable: "SLO counter sharing: cannot reach Redis; counting locally until it answers",
        round_failed: "SLO counter sharing: a round failed; deltas are kept and sent later",
        back: "SLO counter sharing: Redis answers again",
    };
    let rounds = SloRounds {
        slo,
        url,
        cluster,
        replica,
    };
    crate::share_rounds::run_rounds(rounds, interval, shutdown, &logs).await;
}

/// [`run`]'s task.
struct SloRounds {
    slo: SloHandle,
    url: String,
    cluster: String,
    replica: String,
}

impl crate::share_rounds::Sharing for SloRounds {
    type Share = SloShare;

    async fn connect(&mut self) -> anyhow::Result<SloShare> {
        SloShare::connect(
            &self.url,
            &self.cluster,
            &self.replica,
            Duration::from_secs(2),
        )
        .await
    }

    async fn round(&mut self, s: &mut SloShare) -> anyhow::Result<()> {
        s.round(&self.slo).await.map(drop)
    }
}
