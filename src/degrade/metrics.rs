//! The degradation component's metrics (`brownout_degradation_*`, `brownout_degrade_*`).

use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGaugeVec, Opts, Registry};

use super::controller::Decision;

/// Metrics of the component (`brownout_degradation_*`).
#[derive(Debug, Clone)]
pub struct DegradeMetrics {
    pub tier: IntGaugeVec,
    pub decisions_total: IntCounterVec,
    pub publish_seconds: Histogram,
    pub ack_lag_seconds: prometheus::GaugeVec,
    pub unacked_commands: IntGaugeVec,
    /// Per-instance actions in force by action (`halve`, `drain`, `operator`, `ramp`, `watch`,
    /// `recovery_storm`).
    pub instance_actions: IntGaugeVec,
    /// Retry waves detected (counted once per wave).
    pub recovery_storms_total: prometheus::IntCounter,
    /// The `"*"` entry's `admit_rps` while the admission ramp runs (0 otherwise).
    pub admit_rps: prometheus::Gauge,
}

impl DegradeMetrics {
    pub(super) fn new() -> DegradeMetrics {
        DegradeMetrics {
            tier: IntGaugeVec::new(
                Opts::new(
                    "brownout_degradation_tier",
                    "Degradation tier in force (0-3).",
                ),
                &["cluster"],
            )
            .expect("valid metric"),
            decisions_total: IntCounterVec::new(
                Opts::new(
                    "brownout_degradation_decisions_total",
                    "Recorded degradation decisions by trigger.",
                ),
                &["trigger"],
            )
            .expect("valid metric"),
            publish_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "brownout_degradation_publish_seconds",
                    "Time to publish one command to Redis.",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                ]),
            )
            .expect("valid metric"),
            ack_lag_seconds: prometheus::GaugeVec::new(
                Opts::new(
                    "brownout_degradation_ack_lag_seconds",
                    "Decision to applied lag of the latest ack per serving instance.",
                ),
                &["cluster", "engine_instance"],
            )
            .expect("valid metric"),
            unacked_commands: IntGaugeVec::new(
                Opts::new(
                    "brownout_degradation_unacked_commands",
                    "Commands this replica published more than 5 s ago that no serving instance \
                     has acknowledged (0 while some instance acks).",
                ),
                &["cluster"],
            )
            .expect("valid metric"),
            instance_actions: IntGaugeVec::new(
                Opts::new(
                    "brownout_degrade_instance_actions",
                    "Per-instance actions in force, by action (halve, drain, operator, ramp, watch, recovery_storm).",
                ),
                &["cluster", "action"],
            )
            .expect("valid metric"),
            recovery_storms_total: prometheus::IntCounter::new(
                "brownout_degrade_recovery_storms_total",
                "Retry waves (recovery storms) detected in the arrival rate.",
            )
            .expect("valid metric"),
            admit_rps: prometheus::Gauge::new(
                "brownout_degrade_admit_rps",
                "Admission rate per instance of the ramp after T3 (0 when no ramp runs).",
            )
            .expect("valid metric"),
        }
    }

    pub(super) fn register(&self, r: &Registry) -> Result<(), prometheus::Error> {
        r.register(Box::new(self.tier.clone()))?;
        r.register(Box::new(self.decisions_total.clone()))?;
        r.register(Box::new(self.publish_seconds.clone()))?;
        r.register(Box::new(self.ack_lag_seconds.clone()))?;
        r.register(Box::new(self.unacked_commands.clone()))?;
        r.register(Box::new(self.instance_actions.clone()))?;
        r.register(Box::new(self.recovery_storms_total.clone()))?;
        r.register(Box::new(self.admit_rps.clone()))?;
        Ok(())
    }

    /// `brownout_degrade_instance_actions` and `brownout_degrade_admit_rps` from a decision.
    pub(super) fn set_actions(&self, cluster: &str, d: &Decision) {
        let m = self;
        for action in [
            "watch",
            "halve",
            "drain",
            "operator",
            "ramp",
            "recovery_storm",
        ] {
            let n = d
                .instance_actions
                .iter()
                .filter(|a| a.action == action)
                .count();
            m.instance_actions
                .with_label_values(&[cluster, action])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        m.admit_rps.set(
            d.instances
                .get(brownout_protocol::ALL_INSTANCES)
                .and_then(|e| e.admit_rps)
                .unwrap_or(0.0),
        );
    }
}
