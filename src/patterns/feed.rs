//! [`PatternFeed`]: the one task that clusters. Every interval it ranks the patterns of the
//! last [`WINDOW_MS`] (off the async workers: clustering holds the engine's lock, which the
//! ingest tagger also takes) and publishes them on a `watch` channel. The web UI and the
//! degradation controller read the latest [`PatternsSnapshot`]; neither clusters by itself.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::engine::{Pattern, SharedEngine};

/// The window the published patterns cover, ending at their computation.
pub const WINDOW_MS: u64 = 24 * 3_600_000;
/// How often `brownout serve` recomputes them.
pub const DEFAULT_EVERY: Duration = Duration::from_secs(5);

/// Patterns ranked over `[since_ms, until_ms)`; `computed_at_ms` is 0 before the first.
#[derive(Debug, Clone, Default)]
pub struct PatternsSnapshot {
    pub computed_at_ms: u64,
    pub since_ms: u64,
    pub until_ms: u64,
    pub patterns: Vec<Pattern>,
}

impl PatternsSnapshot {
    /// Patterns first seen within `recent_ms` of the computation, with their failures per
    /// minute over that span (all of a pattern's failures are that recent, since its first
    /// one is).
    pub fn new_pattern_rates(&self, recent_ms: u64) -> Vec<(String, f64)> {
        let since = self.computed_at_ms.saturating_sub(recent_ms);
        let minutes = recent_ms as f64 / 60_000.0;
        self.patterns
            .iter()
            .filter(|p| p.first_seen_ms >= since)
            .map(|p| (p.id.0.clone(), p.count as f64 / minutes))
            .collect()
    }
}

/// Where the latest snapshot is read.
pub type PatternsRx = watch::Receiver<Arc<PatternsSnapshot>>;

/// The publisher. Create it with [`PatternFeed::new`], run it with [`PatternFeed::run`]
/// (tests may call [`PatternFeed::publish_now`] instead).
pub struct PatternFeed {
    engine: SharedEngine,
    tx: watch::Sender<Arc<PatternsSnapshot>>,
    /// Where the window's SLO-bad events are read (ranking by real impact); `None`: impact is
    /// the share of all failures.
    slo_bad: Option<SloBadSource>,
}

/// The stored SLI buckets and the SLOs they are counted for.
#[derive(Clone)]
pub struct SloBadSource {
    pub store: Arc<dyn crate::store::Store>,
    pub slos: Arc<Vec<crate::slo::SloSpec>>,
}

impl PatternFeed {
    /// The feed over `engine`, and its receiver (more with `.clone()`).
    pub fn new(engine: SharedEngine) -> (PatternFeed, PatternsRx) {
        let (tx, rx) = watch::channel(Arc::new(PatternsSnapshot::default()));
        (
            PatternFeed {
                engine,
                tx,
                slo_bad: None,
            },
            rx,
        )
    }

    /// Ranks by real impact: each pattern's share of the window's SLO-bad events, read from
    /// the stored SLI buckets ([`crate::slo::persist::slo_bad_events`]).
    pub fn with_slo_bad(mut self, source: SloBadSource) -> PatternFeed {
        self.slo_bad = Some(source);
        self
    }

    /// Ranks the patterns of the window ending at `now_ms` and publishes them.
    pub async fn publish_now(&self, now_ms: u64) {
        let engine = self.engine.clone();
        let since_ms = now_ms.saturating_sub(WINDOW_MS);
        let until_ms = now_ms + 1;
        let bad = match &self.slo_bad {
            None => None,
            Some(src) => {
                match crate::slo::persist::slo_bad_events(
                    src.store.as_ref(),
                    &src.slos,
                    since_ms,
                    until_ms,
                )
                .await
                {
                    Ok(b) => b,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the SLO-bad events; ranking patterns by their share of failures");
                        None
                    }
                }
            }
        };
        let ranked = tokio::task::spawn_blocking(move || {
            let e = engine
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match bad {
                Some(bad) => e.patterns_by_slo_impact(since_ms, until_ms, &bad),
                None => e.patterns(since_ms, until_ms),
            }
        })
        .await;
        match ranked {
            Ok(patterns) => {
                self.tx.send_replace(Arc::new(PatternsSnapshot {
                    computed_at_ms: now_ms,
                    since_ms,
                    until_ms,
                    patterns,
                }));
            }
            Err(e) => {
                tracing::error!(error = %e, "pattern clustering failed; keeping the last patterns")
            }
        }
    }

    /// Publishes at once, then every `every`, until `shutdown` resolves.
    pub async fn run(self, every: Duration, shutdown: impl std::future::Future<Output = ()>) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = tick.tick() => self.publish_now(brownout_protocol::now_ms()).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use brownout_protocol::{Category, FailureEvent};

    use super::*;
    use crate::patterns::engine::PatternEngine;

    const H: u64 = 3_600_000;

    fn ev(ts_ms: u64, msg: &str) -> FailureEvent {
        let mut e =
            FailureEvent::from_attributes(ts_ms, msg, [("service.name", "chat".to_string())]);
        e.category = Category::ToolUnavailable;
        e
    }

    #[tokio::test]
    async fn one_computation_is_published_and_new_patterns_are_the_recent_ones() {
        let engine: SharedEngine = Arc::new(Mutex::new(PatternEngine::default()));
        let now = 100 * H + 30 * 60_000;
        {
            let mut e = engine.lock().unwrap();
            // 10 failures in the last 2 minutes.
            for i in 0..10 {
                e.observe(&ev(
                    now - 120_000 + i * 1000,
                    &format!(
                        "tool call to the weather API timed out after {} ms",
                        100 + i
                    ),
                ));
            }
        }
        let (feed, mut rx) = PatternFeed::new(engine);
        assert_eq!(
            rx.borrow_and_update().computed_at_ms,
            0,
            "nothing before the first"
        );
        feed.publish_now(now).await;
        assert!(rx.has_changed().unwrap());
        let snap = rx.borrow_and_update().clone();
        assert_eq!(
            (snap.computed_at_ms, snap.until_ms - snap.since_ms),
            (now, WINDOW_MS + 1)
        );
        assert_eq!(snap.patterns.len(), 1, "{:#?}", snap.patterns);
        assert_eq!(snap.patterns[0].count, 10);
        // New within 5 minutes: 10 failures over 5 minutes.
        let rates = snap.new_pattern_rates(5 * 60_000);
        assert_eq!(rates, vec![(snap.patterns[0].id.0.clone(), 2.0)]);
        // Not new within one minute (its first failure is 2 minutes old).
        assert!(snap.new_pattern_rates(60_000).is_empty());
        // A pattern first seen before the span is not new, whatever its count.
        let mut old = PatternsSnapshot::clone(&snap);
        old.patterns[0].first_seen_ms = now - 2 * H;
        assert!(old.new_pattern_rates(5 * 60_000).is_empty());
    }
}
