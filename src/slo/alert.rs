//! The life of one alert, as Prometheus runs it: a condition that holds makes it *pending*; held
//! for the pending time (`for`) it *fires*; when the condition stops it is *resolved* for a
//! while (so consumers see that it ended and when), then *inactive*.
//!
//! ```text
//!            cond, for = 0
//!   ┌──────────────────────────────────────┐
//!   │        cond          cond ≥ for      v        !cond
//! inactive ───────> pending ───────> firing ───────> resolved ──(keep_resolved)──> inactive
//!   ^                 │ !cond                           │ cond
//!   └─────────────────┘                                 └──> pending / firing
//! ```

/// Where an alert is, and since when (unix ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum AlertState {
    Inactive,
    /// The condition holds but not yet for the pending time.
    Pending {
        since_ms: u64,
    },
    /// The condition has held for the pending time.
    Firing {
        since_ms: u64,
    },
    /// The condition stopped at `since_ms`; it had been firing since `fired_since_ms`.
    Resolved {
        since_ms: u64,
        fired_since_ms: u64,
    },
}

impl AlertState {
    pub fn is_firing(self) -> bool {
        matches!(self, AlertState::Firing { .. })
    }
    pub fn name(self) -> &'static str {
        match self {
            AlertState::Inactive => "inactive",
            AlertState::Pending { .. } => "pending",
            AlertState::Firing { .. } => "firing",
            AlertState::Resolved { .. } => "resolved",
        }
    }
}

/// How long a resolved alert stays visible as resolved (Prometheus keeps 15 minutes).
pub const KEEP_RESOLVED_MS: u64 = 15 * 60_000;

/// One alert's state machine.
#[derive(Debug, Clone)]
pub struct AlertMachine {
    state: AlertState,
    pending_ms: u64,
    keep_resolved_ms: u64,
}

impl AlertMachine {
    pub fn new(pending_ms: u64) -> AlertMachine {
        AlertMachine {
            state: AlertState::Inactive,
            pending_ms,
            keep_resolved_ms: KEEP_RESOLVED_MS,
        }
    }

    pub fn state(&self) -> AlertState {
        self.state
    }

    /// Puts the machine back where a previous process left it (stored alert states, seeded at
    /// start): the next [`AlertMachine::step`] goes on from there.
    pub fn restore(&mut self, state: AlertState) {
        self.state = state;
    }

    /// Advances with the condition as evaluated at `now_ms`; returns the new state. Times are
    /// expected not to go backwards; if they do, durations count as zero.
    pub fn step(&mut self, condition: bool, now_ms: u64) -> AlertState {
        let start = |pending_ms: u64| {
            if pending_ms == 0 {
                AlertState::Firing { since_ms: now_ms }
            } else {
                AlertState::Pending { since_ms: now_ms }
            }
        };
        self.state = match (self.state, condition) {
            (AlertState::Inactive, true) => start(self.pending_ms),
            (AlertState::Inactive, false) => AlertState::Inactive,
            (AlertState::Pending { since_ms }, true) => {
                if now_ms.saturating_sub(since_ms) >= self.pending_ms {
                    AlertState::Firing { since_ms: now_ms }
                } else {
                    AlertState::Pending { since_ms }
                }
            }
            (AlertState::Pending { .. }, false) => AlertState::Inactive,
            (s @ AlertState::Firing { .. }, true) => s,
            (AlertState::Firing { since_ms }, false) => AlertState::Resolved {
                since_ms: now_ms,
                fired_since_ms: since_ms,
            },
            (AlertState::Resolved { .. }, true) => start(self.pending_ms),
            (s @ AlertState::Resolved { since_ms, .. }, false) => {
                if now_ms.saturating_sub(since_ms) >= self.keep_resolved_ms {
                    AlertState::Inactive
                } else {
                    s
                }
            }
        };
        self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pending_then_firing_then_resolved_then_inactive() {
        let mut m = AlertMachine::new(60_000);
        let steps = [
            (0, false, AlertState::Inactive),
            (10_000, true, AlertState::Pending { since_ms: 10_000 }),
            (40_000, true, AlertState::Pending { since_ms: 10_000 }),
            (70_000, true, AlertState::Firing { since_ms: 70_000 }),
            (80_000, true, AlertState::Firing { since_ms: 70_000 }),
            (
                90_000,
                false,
                AlertState::Resolved {
                    since_ms: 90_000,
                    fired_since_ms: 70_000,
                },
            ),
            (
                90_000 + KEEP_RESOLVED_MS - 1,
                false,
                AlertState::Resolved {
                    since_ms: 90_000,
                    fired_since_ms: 70_000,
                },
            ),
            (90_000 + KEEP_RESOLVED_MS, false, AlertState::Inactive),
        ];
        for (t, cond, want) in steps {
            assert_eq!(m.step(cond, t), want, "at {t}");
        }
    }

    #[test]
    fn zero_pending_fires_at_once_and_a_blip_while_pending_resets() {
        let mut m = AlertMachine::new(0);
        assert_eq!(m.step(true, 5), AlertState::Firing { since_ms: 5 });
        let mut m = AlertMachine::new(100);
        m.step(true, 0);
        m.step(false, 50);
        assert_eq!(m.step(true, 120), AlertState::Pending { since_ms: 120 });
    }

    proptest! {
        /// Model check: firing only after the condition held continuously for the pending time;
        /// resolved only right after firing; a firing alert stays firing while the condition holds.
        #[test]
        fn follows_the_condition(pending in 0u64..100, conds in proptest::collection::vec((any::<bool>(), 1u64..60), 1..60)) {
            let mut m = AlertMachine::new(pending);
            let mut t = 0u64;
            let mut held_since: Option<u64> = None;
            let mut prev = AlertState::Inactive;
            for (cond, dt) in conds {
                t += dt;
                held_since = if cond { Some(held_since.unwrap_or(t)) } else { None };
                let s = m.step(cond, t);
                match s {
                    AlertState::Firing { .. } => {
                        prop_assert!(cond);
                        prop_assert!(t - held_since.unwrap() >= pending);
                    }
                    AlertState::Pending { since_ms } => {
                        prop_assert!(cond);
                        prop_assert!(t - since_ms < pending);
                    }
                    AlertState::Resolved { .. } => {
                        prop_assert!(!cond);
                        let after_firing = matches!(prev, AlertState::Firing { .. } | AlertState::Resolved { .. });
                        prop_assert!(after_firing, "resolved after {:?}", prev);
                    }
                    AlertState::Inactive => prop_assert!(!cond),
                }
                if prev.is_firing() && cond {
                    prop_assert_eq!(s, prev);
                }
                prev = s;
            }
        }
    }
}
