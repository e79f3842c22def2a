//! The tasks that carry one component's output into another's input:
//!
//! - [`feed_slo`]: every accepted failure and request span becomes an SLO observation;
//! - [`feed_controller`]: once a second, host snapshots, SLO alerts and the new patterns of the
//!   pattern feed's latest ranking become the degradation controller's inputs (and
//!   `brownout_host_up` is set).

use std::time::Duration;

use brownout_protocol::now_ms;
use prometheus::IntGaugeVec;

use crate::degrade::{DegradeHandle, PatternRate, SloAlert};
use crate::ingest::IngestState;
use crate::ingest::hosts::{HostRegistry, HostState};
use crate::patterns::feed::PatternsRx;
use crate::slo::task::{SloHandle, SloReport};

/// Every accepted failure and request span becomes an SLO observation, until `shutdown`.
pub async fn feed_slo(
    ingest: IngestState,
    slo: SloHandle,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut failures = ingest.subscribe_failures();
    let mut spans = ingest.subscribe_spans();
    drop(ingest);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            f = failures.recv() => match f {
                // A failure with a trace id is also a span (the serving tier's, or the error span
                // it came from): count it once, through the span. Failures without one (plain log
                // lines) are the only record of that bad event.
                Ok(row) if row.event.trace_id.is_empty() => { slo.record_failure(&row.event); }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => tracing::warn!(missed = n, "SLO feeder fell behind on failures"),
                Err(_) => break,
            },
            s = spans.recv() => match s {
                Ok(batch) => {
                    for span in batch.iter().filter(|s| s.is_request) {
                        slo.record(&span_observation(span));
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => tracing::warn!(missed = n, "SLO feeder fell behind on spans"),
                Err(_) => break,
            },
        }
    }
}

pub use crate::slo::persist::span_observation;

/// What [`feed_controller`] reads and writes.
pub struct ControllerFeed {
    pub hosts: HostRegistry,
    /// `brownout_host_up`, set per host.
    pub host_up: IntGaugeVec,
    pub slo: SloHandle,
    /// The pattern feed's latest ranking.
    pub patterns: PatternsRx,
    pub degrade: DegradeHandle,
}

/// A pattern is new when its first failure is this recent; its rate is over this span.
const NEW_PATTERN_MS: u64 = 5 * 60_000;

/// Once a second, until `shutdown`: host snapshots, SLO alerts and new patterns into the
/// controller's inputs.
pub async fn feed_controller(
    feed: ControllerFeed,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let ControllerFeed {
        hosts,
        host_up,
        slo,
        mut patterns,
        degrade,
    } = feed;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = tick.tick() => {}
        }
        let now = now_ms();
        for h in hosts.list(now) {
            let up = h.state != HostState::Down;
            host_up
                .with_label_values(&[h.host.as_str()])
                .set(i64::from(up));
            if up {
                degrade.push_snapshot(h.snapshot);
            }
        }
        degrade.set_slo_alerts(slo_alerts(&slo.latest()));
        // The feed clusters; here only its latest ranking is read, when it changed.
        if patterns.has_changed().unwrap_or(false) {
            let fresh: Vec<PatternRate> = patterns
                .borrow_and_update()
                .new_pattern_rates(NEW_PATTERN_MS)
                .into_iter()
                .map(|(pattern_id, per_min)| PatternRate {
                    pattern_id,
                    per_min,
                })
                .collect();
            degrade.set_new_patterns(fresh);
        }
    }
}

/// The alert pairs of an SLO report, as the controller's inputs.
pub fn slo_alerts(report: &SloReport) -> Vec<SloAlert> {
    report
        .slos
        .iter()
        .flat_map(|s| {
            s.alerts.iter().map(move |a| SloAlert {
                slo: s.name.clone(),
                severity: a.severity.as_str().to_string(),
                firing: a.state.is_firing(),
                burn_rate: a.long_burn_rate,
                threshold: a.factor,
                window: a.window.clone(),
            })
        })
        .collect()
}
