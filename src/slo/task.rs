//! The evaluator shared with ingest (writers), the API and the degradation controller (readers),
//! and the tokio task that evaluates it every few seconds.
//!
//! Writers take a `std::sync::Mutex` for the few array writes of one record (never across an
//! `.await`); readers never lock: each evaluation publishes an `Arc<SloReport>` on a watch
//! channel, so the API and the controller read the latest report for free and can wait for the
//! next one.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use brownout_protocol::FailureEvent;
use prometheus::{GaugeVec, IntGaugeVec, Opts, Registry};
use tokio::sync::watch;

use super::eval::{EvalStats, Evaluator, Observation, SharedDelta, SloStatus};

/// All SLOs at one instant.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SloReport {
    /// 0 before the first evaluation.
    pub evaluated_at_ms: u64,
    pub slos: Vec<SloStatus>,
}

impl SloReport {
    pub fn get(&self, name: &str) -> Option<&SloStatus> {
        self.slos.iter().find(|s| s.name == name)
    }
}

/// A cheap, cloneable handle on the shared evaluator.
#[derive(Debug, Clone)]
pub struct SloHandle {
    evaluator: Arc<Mutex<Evaluator>>,
    report_tx: Arc<watch::Sender<Arc<SloReport>>>,
    names: Arc<[String]>,
    dropped_future: Arc<AtomicU64>,
}

/// Events dated further than this ahead of the wall clock are refused: written into the rings
/// they would overwrite current buckets.
pub const FUTURE_SLACK_MS: u64 = 5 * 60_000;

impl SloHandle {
    pub fn new(evaluator: Evaluator) -> SloHandle {
        let (tx, _rx) = watch::channel(Arc::new(SloReport::default()));
        let names = evaluator.specs().map(|s| s.name.clone()).collect();
        SloHandle {
            evaluator: Arc::new(Mutex::new(evaluator)),
            report_tx: Arc::new(tx),
            names,
            dropped_future: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The SLO names, known without locking or evaluating.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The evaluator itself, locked (the store loader seeds it; never held across an await).
    pub(crate) fn lock_evaluator(&self) -> MutexGuard<'_, Evaluator> {
        self.lock()
    }

    fn lock(&self) -> MutexGuard<'_, Evaluator> {
        // A panic while holding the lock leaves only counters half-updated; keep serving.
        self.evaluator
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts one event (a finished span, a failure…); returns how many SLOs it counted for.
    /// Events dated more than [`FUTURE_SLACK_MS`] ahead of the wall clock are refused.
    pub fn record(&self, obs: &Observation<'_>) -> usize {
        let limit = brownout_protocol::now_ms() + FUTURE_SLACK_MS;
        if obs.ts_ms > limit {
            self.dropped_future.fetch_add(1, Ordering::Relaxed);
            return 0;
        }
        self.lock().record(obs)
    }

    /// Counts many events under one lock.
    pub fn record_all<'a>(&self, obs: impl IntoIterator<Item = Observation<'a>>) -> usize {
        let limit = brownout_protocol::now_ms() + FUTURE_SLACK_MS;
        let mut ev = self.lock();
        let mut n = 0;
        for o in obs {
            if o.ts_ms > limit {
                self.dropped_future.fetch_add(1, Ordering::Relaxed);
            } else {
                n += ev.record(&o);
            }
        }
        n
    }

    /// Counts a failure event as one bad event ([`Observation::from_failure`]).
    pub fn record_failure(&self, ev: &FailureEvent) -> usize {
        self.record(&Observation::from_failure(ev))
    }

    /// Evaluates at `now_ms`, publishes the report and returns it.
    pub fn evaluate(&self, now_ms: u64) -> Arc<SloReport> {
        let slos = self.lock().evaluate(now_ms);
        let report = Arc::new(SloReport {
            evaluated_at_ms: now_ms,
            slos,
        });
        self.report_tx.send_replace(report.clone());
        report
    }

    /// The latest published report.
    pub fn latest(&self) -> Arc<SloReport> {
        self.report_tx.borrow().clone()
    }

    /// A receiver that wakes on every new report (the degradation controller's input).
    pub fn subscribe(&self) -> watch::Receiver<Arc<SloReport>> {
        self.report_tx.subscribe()
    }

    /// Turns on sharing with other replicas (`slo::share`): what this replica counts from now
    /// on is also kept for [`SloHandle::take_shared`].
    pub fn enable_sharing(&self) {
        self.lock().enable_sharing();
    }

    /// What this replica counted since the last call (per SLO and second).
    pub fn take_shared(&self) -> Vec<SharedDelta> {
        self.lock().take_shared()
    }

    /// Adds what another replica counted; returns the events counted.
    pub fn apply_shared(&self, deltas: &[SharedDelta]) -> u64 {
        self.lock().apply_shared(deltas)
    }

    pub fn stats(&self) -> EvalStats {
        let mut s = self.lock().stats();
        s.dropped_future = self.dropped_future.load(Ordering::Relaxed);
        s
    }
}

/// The `view` label of the real-failure budget (refusals on purpose left out).
pub const VIEW_REAL: &str = "real_failures";
/// The `view` label of the user-felt budget (refusals on purpose counted as bad).
pub const VIEW_USER: &str = "user_felt";

/// `brownout_slo_*` gauges, set after every evaluation.
#[derive(Debug, Clone)]
pub struct SloMetrics {
    budget_remaining: GaugeVec,
    burn_rate: GaugeVec,
    alert_firing: IntGaugeVec,
}

impl SloMetrics {
    /// Registers the gauges on `registry`.
    ///
    /// # Errors
    /// When the names are already registered there.
    pub fn register(registry: &Registry) -> Result<SloMetrics, prometheus::Error> {
        let budget_remaining = GaugeVec::new(
            Opts::new(
                "brownout_slo_error_budget_remaining_ratio",
                "Error budget left over the SLO period (1 untouched, 0 spent, negative overspent); view=real_failures leaves refusals on purpose out (what the alerts read), view=user_felt counts them as bad.",
            ),
            &["slo", "view"],
        )?;
        let burn_rate = GaugeVec::new(
            Opts::new(
                "brownout_slo_burn_rate",
                "Error-budget burn rate over a window (1 = exactly on budget); view as for the budget.",
            ),
            &["slo", "window", "view"],
        )?;
        let alert_firing = IntGaugeVec::new(
            Opts::new(
                "brownout_slo_alert_firing",
                "1 while a burn-rate alert pair of the SLO fires.",
            ),
            &["slo", "severity", "window"],
        )?;
        registry.register(Box::new(budget_remaining.clone()))?;
        registry.register(Box::new(burn_rate.clone()))?;
        registry.register(Box::new(alert_firing.clone()))?;
        Ok(SloMetrics {
            budget_remaining,
            burn_rate,
            alert_firing,
        })
    }

    pub fn update(&self, report: &SloReport) {
        for s in &report.slos {
            let mut views = vec![(VIEW_REAL, s.budget_remaining_ratio, &s.burn_rates)];
            if let Some(u) = &s.user_felt {
                views.push((VIEW_USER, u.budget_remaining_ratio, &u.burn_rates));
            }
            for (view, remaining, burns) in views {
                self.budget_remaining
                    .with_label_values(&[s.name.as_str(), view])
                    .set(remaining);
                for w in burns {
                    self.burn_rate
                        .with_label_values(&[s.name.as_str(), w.window.as_str(), view])
                        .set(w.burn_rate);
                }
            }
            for a in &s.alerts {
                self.alert_firing
                    .with_label_values(&[s.name.as_str(), a.severity.as_str(), a.window.as_str()])
                    .set(i64::from(a.state.is_firing()));
            }
        }
    }
}

/// The default evaluation interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

/// Evaluates every `interval` until `shutdown` completes, timing with tokio's clock anchored at
/// the wall clock now (so `tokio::time::pause` drives it in tests).
pub async fn run(
    handle: SloHandle,
    interval: Duration,
    metrics: Option<SloMetrics>,
    shutdown: impl Future<Output = ()>,
) {
    run_anchored(
        handle,
        interval,
        metrics,
        shutdown,
        brownout_protocol::now_ms(),
    )
    .await;
}

/// Like [`run`], with the wall-clock time of the start given: evaluation `k` happens at
/// `anchor_ms + k · interval` in tokio time.
pub async fn run_anchored(
    handle: SloHandle,
    interval: Duration,
    metrics: Option<SloMetrics>,
    shutdown: impl Future<Output = ()>,
    anchor_ms: u64,
) {
    let start = tokio::time::Instant::now();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = ticker.tick() => {
                let now_ms = anchor_ms + start.elapsed().as_millis() as u64;
                let report = handle.evaluate(now_ms);
                if let Some(m) = &metrics {
                    m.update(&report);
                }
                log_new_firing(&report, now_ms);
            }
        }
    }
}

/// Logs the alerts that started firing at `now_ms`.
pub(crate) fn log_new_firing(report: &SloReport, now_ms: u64) {
    for s in &report.slos {
        for a in s.firing() {
            if a.state == (super::alert::AlertState::Firing { since_ms: now_ms }) {
                tracing::warn!(slo = %s.name, severity = a.severity.as_str(), window = %a.window,
                    long_burn_rate = a.long_burn_rate, "SLO burn-rate alert firing");
            }
        }
    }
}
