//! Snapshot push: a bounded queue of the latest snapshots and a task that POSTs them, oldest
//! first, to `<control-plane>/v1/agents/snapshot` with a bearer token.
//!
//! The cycle never waits for the push: it enqueues and moves on ([`SnapshotQueue::push`] only
//! takes a short, uncontended lock). When the queue is full the oldest snapshot is dropped and
//! counted. While the control plane is unreachable (connection error, timeout, 5xx, 408, 429)
//! the pusher retries the same snapshot with exponential backoff and jitter; a snapshot the
//! server refuses outright (any other 4xx: bad token, bad payload) is dropped and counted as
//! rejected, since resending it cannot help.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use rand::Rng;
use reqwest::{Client, StatusCode, Url};
use tokio::sync::{Notify, watch};

/// Counters of the push, exported as `brownout_gpu_agent_snapshot*`.
#[derive(Debug, Default)]
pub struct PushStats {
    /// Snapshots the control plane accepted (2xx).
    pub pushed: AtomicU64,
    /// Attempts that failed and will be retried.
    pub failed_attempts: AtomicU64,
    /// Snapshots dropped because the queue was full (the oldest go first).
    pub dropped: AtomicU64,
    /// Snapshots the control plane refused with a 4xx that retrying cannot fix.
    pub rejected: AtomicU64,
}

/// A plain copy of [`PushStats`] plus the queue length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PushCounts {
    pub pushed: u64,
    pub failed_attempts: u64,
    pub dropped: u64,
    pub rejected: u64,
    pub queued: usize,
    pub capacity: usize,
}

/// The latest `capacity` snapshots, serialised once, each with a sequence number so that a
/// snapshot dropped while it was being sent is not popped twice.
#[derive(Debug)]
pub struct SnapshotQueue {
    entries: Mutex<VecDeque<(u64, Bytes)>>,
    next_seq: AtomicU64,
    capacity: usize,
    notify: Notify,
    pub stats: PushStats,
}

impl SnapshotQueue {
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: Mutex::new(VecDeque::with_capacity(capacity)),
            next_seq: AtomicU64::new(0),
            capacity: capacity.max(1),
            notify: Notify::new(),
            stats: PushStats::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, Bytes)>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Enqueues one serialised snapshot, dropping (and counting) the oldest when full.
    pub fn push(&self, body: Bytes) {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        {
            let mut q = self.lock();
            while q.len() >= self.capacity {
                q.pop_front();
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            }
            q.push_back((seq, body));
        }
        self.notify.notify_one();
    }

    /// The oldest queued snapshot, left in the queue.
    pub fn front(&self) -> Option<(u64, Bytes)> {
        self.lock().front().cloned()
    }

    /// Removes snapshot `seq` if it is still the oldest (it may have been dropped meanwhile).
    pub fn remove(&self, seq: u64) {
        let mut q = self.lock();
        if q.front().is_some_and(|(s, _)| *s == seq) {
            q.pop_front();
        }
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn counts(&self) -> PushCounts {
        PushCounts {
            pushed: self.stats.pushed.load(Ordering::Relaxed),
            failed_attempts: self.stats.failed_attempts.load(Ordering::Relaxed),
            dropped: self.stats.dropped.load(Ordering::Relaxed),
            rejected: self.stats.rejected.load(Ordering::Relaxed),
            queued: self.len(),
            capacity: self.capacity,
        }
    }
}

/// Exponential backoff with "equal jitter": the `k`-th delay is uniform in
/// `[d/2, d]` with `d = min(max, min·2^k)`.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    current: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            current: min,
        }
    }

    /// The next delay; doubles the base up to the cap.
    pub fn next_delay(&mut self, rng: &mut impl Rng) -> Duration {
        let d = self.current;
        self.current = (self.current * 2).min(self.max);
        let half = d / 2;
        half + Duration::from_nanos(rng.random_range(0..=(d - half).as_nanos() as u64))
    }

    pub fn reset(&mut self) {
        self.current = self.min;
    }
}

/// What to do after one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Accepted,
    /// Retry the same snapshot after a backoff.
    Retry,
    /// Drop it: the server will never take it.
    Rejected,
}

/// Classifies a response status.
pub fn classify(status: StatusCode) -> Outcome {
    if status.is_success() {
        Outcome::Accepted
    } else if status.is_client_error()
        && status != StatusCode::REQUEST_TIMEOUT
        && status != StatusCode::TOO_MANY_REQUESTS
    {
        Outcome::Rejected
    } else {
        Outcome::Retry
    }
}

/// Where and how to push.
#[derive(Debug, Clone)]
pub struct PushTarget {
    /// Full URL of the snapshot endpoint.
    pub url: Url,
    pub token: Option<String>,
    pub backoff_min: Duration,
    pub backoff_max: Duration,
}

impl PushTarget {
    /// `<base>/v1/agents/snapshot`.
    pub fn endpoint(base: &Url) -> Url {
        let mut u = base.clone();
        let path = u.path().trim_end_matches('/').to_string();
        u.set_path(&format!("{path}/v1/agents/snapshot"));
        u
    }
}

async fn attempt(
    client: &Client,
    target: &PushTarget,
    body: Bytes,
) -> Result<StatusCode, reqwest::Error> {
    let mut req = client
        .post(target.url.clone())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body);
    if let Some(t) = &target.token {
        req = req.bearer_auth(t);
    }
    Ok(req.send().await?.status())
}

/// Sends queued snapshots until `shutdown` turns true, then tries once more to flush what is
/// queued within `flush_deadline`.
pub async fn run_pusher(
    queue: &SnapshotQueue,
    client: Client,
    target: PushTarget,
    mut shutdown: watch::Receiver<bool>,
    flush_deadline: Duration,
) {
    let mut backoff = Backoff::new(target.backoff_min, target.backoff_max);
    let mut last_logged: Option<String> = None;
    loop {
        if *shutdown.borrow() {
            break;
        }
        let Some((seq, body)) = queue.front() else {
            tokio::select! {
                () = queue.notify.notified() => {}
                _ = shutdown.changed() => {}
            }
            continue;
        };
        let result = tokio::select! {
            r = attempt(&client, &target, body) => r,
            _ = shutdown.changed() => break,
        };
        let (outcome, what) = match result {
            Ok(status) => (classify(status), format!("status {status}")),
            Err(e) => (Outcome::Retry, format!("{e}")),
        };
        match outcome {
            Outcome::Accepted => {
                queue.remove(seq);
                queue.stats.pushed.fetch_add(1, Ordering::Relaxed);
                backoff.reset();
                if last_logged.take().is_some() {
                    tracing::info!(url = %target.url, "snapshot push recovered");
                }
            }
            Outcome::Rejected => {
                queue.remove(seq);
                queue.stats.rejected.fetch_add(1, Ordering::Relaxed);
                if last_logged.as_deref() != Some(what.as_str()) {
                    tracing::warn!(url = %target.url, result = %what, "control plane refused a snapshot; dropping it (check BROWNOUT_INGEST_TOKEN)");
                    last_logged = Some(what);
                }
            }
            Outcome::Retry => {
                queue.stats.failed_attempts.fetch_add(1, Ordering::Relaxed);
                let delay = backoff.next_delay(&mut rand::rng());
                if last_logged.as_deref() != Some(what.as_str()) {
                    tracing::warn!(url = %target.url, result = %what, retry_in_ms = delay.as_millis() as u64, queued = queue.len(), "snapshot push failed; will retry");
                    last_logged = Some(what);
                }
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    _ = shutdown.changed() => break,
                }
            }
        }
    }
    // Best effort: one pass over what is queued, bounded in time.
    let _ = tokio::time::timeout(flush_deadline, async {
        while let Some((seq, body)) = queue.front() {
            match attempt(&client, &target, body).await.map(classify) {
                Ok(Outcome::Accepted) => {
                    queue.remove(seq);
                    queue.stats.pushed.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Outcome::Rejected) => {
                    queue.remove(seq);
                    queue.stats.rejected.fetch_add(1, Ordering::Relaxed);
                }
                _ => break,
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;

    #[test]
    fn full_queue_drops_the_oldest_and_counts() {
        let q = SnapshotQueue::new(3);
        for i in 0..5u8 {
            q.push(Bytes::from(vec![i]));
        }
        assert_eq!(q.counts().dropped, 2);
        assert_eq!(q.len(), 3);
        let (seq, body) = q.front().unwrap();
        assert_eq!((seq, &body[..]), (2, &[2u8][..]));
        q.remove(seq);
        q.remove(seq); // idempotent: a second remove of the same seq leaves the next one
        assert_eq!(q.front().unwrap().0, 3);
    }

    #[test]
    fn a_snapshot_dropped_while_in_flight_is_not_popped_twice() {
        let q = SnapshotQueue::new(2);
        q.push(Bytes::from_static(b"a"));
        q.push(Bytes::from_static(b"b"));
        let (seq, _) = q.front().unwrap(); // "a" in flight
        q.push(Bytes::from_static(b"c")); // drops "a"
        q.remove(seq); // success for "a" must not remove "b"
        assert_eq!(q.front().unwrap().1, Bytes::from_static(b"b"));
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn statuses_are_classified() {
        let cases = [
            (200, Outcome::Accepted),
            (202, Outcome::Accepted),
            (204, Outcome::Accepted),
            (400, Outcome::Rejected),
            (401, Outcome::Rejected),
            (413, Outcome::Rejected),
            (408, Outcome::Retry),
            (429, Outcome::Retry),
            (500, Outcome::Retry),
            (503, Outcome::Retry),
        ];
        for (code, want) in cases {
            assert_eq!(
                classify(StatusCode::from_u16(code).unwrap()),
                want,
                "{code}"
            );
        }
    }

    #[test]
    fn endpoint_appends_the_snapshot_path() {
        for (base, want) in [
            ("http://cp:8080", "http://cp:8080/v1/agents/snapshot"),
            ("http://cp:8080/", "http://cp:8080/v1/agents/snapshot"),
            (
                "https://cp/brownout/",
                "https://cp/brownout/v1/agents/snapshot",
            ),
        ] {
            assert_eq!(
                PushTarget::endpoint(&Url::parse(base).unwrap()).as_str(),
                want
            );
        }
    }

    proptest! {
        #[test]
        fn backoff_doubles_within_jitter_bounds_and_caps(seed in any::<u64>(), min_ms in 1u64..500, cap_mul in 1u32..64, steps in 1usize..20) {
            let min = Duration::from_millis(min_ms);
            let max = min * cap_mul;
            let mut b = Backoff::new(min, max);
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut base = min;
            for _ in 0..steps {
                let d = b.next_delay(&mut rng);
                prop_assert!(d >= base / 2 && d <= base, "{d:?} not in [{:?}, {base:?}]", base / 2);
                base = (base * 2).min(max);
            }
            b.reset();
            prop_assert!(b.next_delay(&mut rng) <= min);
        }
    }
}
