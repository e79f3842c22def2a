//! The proxy's own concurrency queue: at most `max_concurrency` requests in flight to the
//! upstreams (lowered by the command's `limits.max_num_seqs` or this instance's entry, as the
//! bundled engine's `max_num_seqs`), of which `round(max × ratio)` slots are a critical reserve
//! (the engine's critical reserve, as a concurrency reserve): non-critical requests start while
//! fewer than `max − reserve` of them are in flight; a critical one starts whenever any slot is
//! free. The rest wait, up to `max_queue_wait` and at most `max_waiting` of them.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use brownout_protocol::Criticality;
use tokio::sync::Notify;

use crate::control::ControlHandle;

/// `round(n × ratio)`, leaving at least one slot to the rest (0 when `n` < 2) — the engine's rule.
pub fn reserve_of(n: usize, ratio: f64) -> usize {
    if ratio.is_nan() || ratio <= 0.0 {
        return 0;
    }
    let r = (n as f64 * ratio.min(1.0)).round() as usize;
    r.min(n.saturating_sub(1))
}

#[derive(Debug, Default)]
struct State {
    in_flight: usize,
    non_critical_in_flight: usize,
    waiting: usize,
}

struct Inner {
    configured: usize,
    reserve_ratio: f64,
    max_waiting: usize,
    control: Option<ControlHandle>,
    state: Mutex<State>,
    freed: Notify,
}

/// The limiter (cheap to clone).
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("configured", &self.inner.configured)
            .finish_non_exhaustive()
    }
}

/// A slot; given back on drop.
#[derive(Debug)]
pub struct Slot {
    limiter: Limiter,
    critical: bool,
    /// Time spent waiting for it.
    pub queued: Duration,
}

impl Drop for Slot {
    fn drop(&mut self) {
        {
            let mut s = self.limiter.state();
            s.in_flight -= 1;
            if !self.critical {
                s.non_critical_in_flight -= 1;
            }
        }
        self.limiter.inner.freed.notify_waiters();
    }
}

/// Why no slot was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// `max_waiting` requests wait already.
    QueueFull,
    /// No slot within `max_queue_wait`.
    TimedOut,
}

/// The limiter's figures (for `/metrics` and `/debug/resource`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LimiterFigures {
    pub configured: usize,
    pub in_force: usize,
    pub reserve: usize,
    pub in_flight: usize,
    pub non_critical_in_flight: usize,
    /// Critical requests in flight beyond the non-critical share (holding reserve slots).
    pub reserve_used: usize,
    pub waiting: usize,
}

impl Limiter {
    pub fn new(
        max_concurrency: usize,
        reserve_ratio: f64,
        max_waiting: usize,
        control: Option<ControlHandle>,
    ) -> Limiter {
        Limiter {
            inner: Arc::new(Inner {
                configured: max_concurrency.max(1),
                reserve_ratio,
                max_waiting,
                control,
                state: Mutex::new(State::default()),
                freed: Notify::new(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `(limit, reserve)` in force now.
    fn limits(&self) -> (usize, usize) {
        let n = self
            .inner
            .control
            .as_ref()
            .map_or(self.inner.configured, |c| {
                c.max_num_seqs(self.inner.configured)
            });
        (n, reserve_of(n, self.inner.reserve_ratio))
    }

    fn try_take(&self, critical: bool) -> bool {
        let (limit, reserve) = self.limits();
        let mut s = self.state();
        let ok = if critical {
            s.in_flight < limit
        } else {
            s.in_flight < limit && s.non_critical_in_flight < limit - reserve
        };
        if ok {
            s.in_flight += 1;
            if !critical {
                s.non_critical_in_flight += 1;
            }
        }
        ok
    }

    /// Waits for a slot for a request of `criticality`, at most `max_wait`.
    ///
    /// # Errors
    /// [`Wait`] when the queue is full or the wait ran out.
    pub async fn acquire(
        &self,
        criticality: Criticality,
        max_wait: Duration,
    ) -> Result<Slot, Wait> {
        let critical = criticality == Criticality::Critical;
        let start = Instant::now();
        let slot = |queued| Slot {
            limiter: self.clone(),
            critical,
            queued,
        };
        if self.try_take(critical) {
            return Ok(slot(Duration::ZERO));
        }
        {
            let mut s = self.state();
            if s.waiting >= self.inner.max_waiting {
                return Err(Wait::QueueFull);
            }
            s.waiting += 1;
        }
        struct Waiting<'a>(&'a Limiter);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.state().waiting -= 1;
            }
        }
        let _w = Waiting(self);
        let deadline = Instant::now() + max_wait;
        loop {
            let freed = self.inner.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.try_take(critical) {
                return Ok(slot(start.elapsed()));
            }
            // A command may raise the limit without a slot being freed: look again now and then.
            let tick = Instant::now() + Duration::from_millis(100);
            tokio::select! {
                () = &mut freed => {}
                () = tokio::time::sleep_until(tick.min(deadline)) => {
                    if Instant::now() >= deadline {
                        return if self.try_take(critical) { Ok(slot(start.elapsed())) } else { Err(Wait::TimedOut) };
                    }
                }
            }
        }
    }

    pub fn figures(&self) -> LimiterFigures {
        let (limit, reserve) = self.limits();
        let s = self.state();
        let critical = s.in_flight - s.non_critical_in_flight;
        let share = limit - reserve;
        let non_critical_room = share.saturating_sub(s.non_critical_in_flight);
        LimiterFigures {
            configured: self.inner.configured,
            in_force: limit,
            reserve,
            in_flight: s.in_flight,
            non_critical_in_flight: s.non_critical_in_flight,
            reserve_used: critical.saturating_sub(non_critical_room),
            waiting: s.waiting,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(3600);

    #[test]
    fn the_reserve_follows_the_engines_rule() {
        assert_eq!(reserve_of(10, 0.2), 2);
        assert_eq!(reserve_of(1, 0.5), 0);
        assert_eq!(reserve_of(2, 0.9), 1, "one slot is left to the rest");
        assert_eq!(reserve_of(8, 0.0), 0);
        assert_eq!(reserve_of(8, f64::NAN), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn non_critical_traffic_leaves_the_reserve_to_critical() {
        let l = Limiter::new(4, 0.5, 16, None);
        let a = l.acquire(Criticality::Default, LONG).await.unwrap();
        let _b = l.acquire(Criticality::Sheddable, LONG).await.unwrap();
        // The non-critical share (2) is full: a third default waits and times out.
        assert_eq!(
            l.acquire(Criticality::Default, Duration::from_secs(5))
                .await
                .unwrap_err(),
            Wait::TimedOut
        );
        // Critical takes the reserve at once, both slots of it.
        let c1 = l
            .acquire(Criticality::Critical, Duration::ZERO)
            .await
            .unwrap();
        let _c2 = l
            .acquire(Criticality::Critical, Duration::ZERO)
            .await
            .unwrap();
        let f = l.figures();
        assert_eq!((f.in_flight, f.reserve, f.reserve_used), (4, 2, 2));
        assert_eq!(
            l.acquire(Criticality::Critical, Duration::from_secs(1))
                .await
                .unwrap_err(),
            Wait::TimedOut,
            "no slot at all is left"
        );
        // A critical request leaving frees a slot, but not for non-critical traffic (its share
        // is still full); a non-critical one leaving does.
        drop(c1);
        assert!(
            l.acquire(Criticality::Default, Duration::from_secs(1))
                .await
                .is_err()
        );
        let waiter = tokio::spawn({
            let l = l.clone();
            async move {
                l.acquire(Criticality::Default, LONG)
                    .await
                    .map(|s| s.queued)
            }
        });
        tokio::time::sleep(Duration::from_secs(7)).await;
        assert_eq!(l.figures().waiting, 1);
        drop(a);
        let queued = waiter.await.unwrap().unwrap();
        assert_eq!(queued, Duration::from_secs(7), "queue time is measured");
        assert_eq!(l.figures().waiting, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_queue_is_bounded() {
        let l = Limiter::new(1, 0.0, 1, None);
        let _a = l.acquire(Criticality::Default, LONG).await.unwrap();
        let w = tokio::spawn({
            let l = l.clone();
            async move { l.acquire(Criticality::Default, LONG).await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            l.acquire(Criticality::Default, LONG).await.unwrap_err(),
            Wait::QueueFull
        );
        w.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_command_lowers_the_limit() {
        let control = ControlHandle::with_instance("c", "i");
        let mut cmd =
            brownout_protocol::Command::normal("c", 1, 1, brownout_protocol::now_ms(), 600_000);
        cmd.limits.max_num_seqs = Some(1);
        control.apply(cmd, brownout_protocol::now_ms()).unwrap();
        let l = Limiter::new(8, 0.0, 16, Some(control));
        let _a = l.acquire(Criticality::Critical, LONG).await.unwrap();
        assert_eq!(l.figures().in_force, 1);
        assert_eq!(
            l.acquire(Criticality::Critical, Duration::from_secs(1))
                .await
                .unwrap_err(),
            Wait::TimedOut
        );
    }
}
