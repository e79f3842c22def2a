//! The round loop both Redis sharing tasks run (`patterns::share` for the shared miner's
//! failures, `slo::share` for the SLO counters): a round every interval until shutdown, then
//! one last round; the connection retried every interval until Redis answers; one warning
//! when sharing starts failing and one line when it works again, not one per round.

use std::time::Duration;

/// What a sharing task logs: Redis cannot be reached, a round failed, Redis answers again.
pub(crate) struct RoundLogs {
    pub unreachable: &'static str,
    pub round_failed: &'static str,
    pub back: &'static str,
}

/// One sharing task: how it connects, what a round does, and what follows each round.
pub(crate) trait Sharing {
    /// The connected share (its Redis connection and state).
    type Share: Send;
    /// Connects to Redis.
    fn connect(&mut self) -> impl Future<Output = anyhow::Result<Self::Share>> + Send;
    /// One round: send what waits, read what the others sent.
    fn round(&mut self, share: &mut Self::Share)
    -> impl Future<Output = anyhow::Result<()>> + Send;
    /// After each round, whether it worked or not (`stopping`: it was the last one).
    fn after(
        &mut self,
        share: &mut Self::Share,
        stopping: bool,
    ) -> impl Future<Output = ()> + Send {
        let _ = (share, stopping);
        async {}
    }
}

/// Runs `task`'s rounds every `interval` until `shutdown` (then once more), connecting first
/// (retried every interval until it succeeds; on shutdown without a connection it stops at
/// once), with [`Sharing::after`] after each round.
pub(crate) async fn run_rounds<T: Sharing>(
    mut task: T,
    interval: Duration,
    shutdown: impl Future<Output = ()>,
    logs: &RoundLogs,
) {
    tokio::pin!(shutdown);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut share: Option<T::Share> = None;
    let mut failing = false;
    loop {
        let stopping = tokio::select! {
            () = &mut shutdown => true,
            _ = ticker.tick() => false,
        };
        if share.is_none() {
            match task.connect().await {
                Ok(s) => share = Some(s),
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "{}", logs.unreachable);
                        failing = true;
                    }
                    if stopping {
                        break;
                    }
                    continue;
                }
            }
        }
        if let Some(s) = share.as_mut() {
            match task.round(s).await {
                Ok(()) => {
                    if failing {
                        tracing::info!("{}", logs.back);
                        failing = false;
                    }
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "{}", logs.round_failed);
                        failing = true;
                    }
                }
            }
            task.after(s, stopping).await;
        }
        if stopping {
            break;
        }
    }
}
