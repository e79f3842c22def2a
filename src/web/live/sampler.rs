//! The history the pages chart: per host VRAM, queue and per-engine KV usage, per SLO the
//! remaining budget and the alert transitions. Sampled at most every [`SAMPLE_EVERY_MS`].

use std::time::Duration;

use brownout_protocol::now_ms;

use super::{
    ALERT_EVENTS_KEPT, Caches, HISTORY_LEN, LiveDataSource, SAMPLE_EVERY_MS, finite, lock,
};
use crate::ingest::hosts::HostView;
use crate::slo::task::SloReport;
use crate::slo::{AlertState as SloAlertState, Severity};
use crate::web::model::{AlertEvent, AlertState, Point};

/// One sample of a host.
#[derive(Debug, Clone)]
pub(super) struct HostSample {
    pub(super) ts_ms: u64,
    pub(super) max_vram: f64,
    pub(super) queue: u64,
    /// Engine id → (KV usage, waiting requests).
    pub(super) engines: Vec<(String, f64, u64)>,
}

impl LiveDataSource {
    /// Samples the history every [`SAMPLE_EVERY_MS`] until `shutdown` resolves, so charts
    /// fill in even while nobody looks.
    pub async fn run_sampler(self, shutdown: impl std::future::Future<Output = ()>) {
        let mut tick = tokio::time::interval(Duration::from_millis(SAMPLE_EVERY_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = tick.tick() => self.sample(now_ms()),
            }
        }
    }

    /// Records one history sample if the last is older than [`SAMPLE_EVERY_MS`]; new SLO
    /// reports are always recorded.
    pub(super) fn sample(&self, now: u64) {
        let report = self.parts.slo.latest();
        let hosts = self.registry().list(now);
        let mut c = lock(&self.caches);
        record_hosts(&mut c, &hosts, now);
        record_report(&mut c, &report);
    }

    pub(super) fn host_history(&self, host: &str) -> Vec<HostSample> {
        lock(&self.caches)
            .hosts
            .get(host)
            .map(|r| r.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Records one sample per host if the last is older than [`SAMPLE_EVERY_MS`].
fn record_hosts(c: &mut Caches, hosts: &[HostView], now: u64) {
    if c.last_sample_ms != 0 && now < c.last_sample_ms + SAMPLE_EVERY_MS {
        return;
    }
    c.last_sample_ms = now;
    for h in hosts {
        let s = &h.snapshot;
        let ring = c.hosts.entry(h.host.clone()).or_default();
        ring.push_back(HostSample {
            ts_ms: now,
            max_vram: s.max_vram_ratio(),
            queue: s.queue_depth(),
            engines: s
                .engines
                .iter()
                .map(|e| (e.id.clone(), e.kv.usage_ratio, e.num_requests_waiting))
                .collect(),
        });
        while ring.len() > HISTORY_LEN {
            ring.pop_front();
        }
    }
}

/// Records a new SLO report: budget points and alert transitions.
pub(super) fn record_report(c: &mut Caches, report: &SloReport) {
    if report.evaluated_at_ms == 0 || report.evaluated_at_ms == c.last_report_ms {
        return;
    }
    c.last_report_ms = report.evaluated_at_ms;
    for s in &report.slos {
        let ring = c.budgets.entry(s.name.clone()).or_default();
        if ring
            .back()
            .is_none_or(|p| report.evaluated_at_ms >= p.ts_ms + SAMPLE_EVERY_MS)
        {
            ring.push_back(Point::new(
                report.evaluated_at_ms,
                finite(s.budget_remaining_ratio),
            ));
            while ring.len() > HISTORY_LEN {
                ring.pop_front();
            }
        }
        let events = c.alert_events.entry(s.name.clone()).or_default();
        for a in &s.alerts {
            let firing_state = match a.severity {
                Severity::Page => AlertState::Page,
                Severity::Ticket => AlertState::Ticket,
            };
            let mut push = |ts_ms: u64, state: AlertState| {
                let ev = AlertEvent {
                    ts_ms,
                    state,
                    window: a.window.clone(),
                    burn_rate: finite(a.long_burn_rate),
                };
                if !events
                    .iter()
                    .any(|e| e.ts_ms == ev.ts_ms && e.state == ev.state && e.window == ev.window)
                {
                    let at = events
                        .iter()
                        .position(|e| e.ts_ms < ts_ms)
                        .unwrap_or(events.len());
                    events.insert(at, ev);
                }
            };
            match a.state {
                SloAlertState::Firing { since_ms } => push(since_ms, firing_state),
                SloAlertState::Resolved {
                    since_ms,
                    fired_since_ms,
                } => {
                    push(fired_since_ms, firing_state);
                    push(since_ms, AlertState::Ok);
                }
                SloAlertState::Inactive | SloAlertState::Pending { .. } => {}
            }
        }
        while events.len() > ALERT_EVENTS_KEPT {
            events.pop_back();
        }
    }
}
