//! Per-criticality outcome counting and the final report.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use brownout_protocol::Criticality;
use serde::Serialize;

/// How one call ended (after retries).
#[derive(Debug, Clone, PartialEq)]
pub enum CallOutcome {
    Ok {
        ttft: Duration,
        e2e: Duration,
    },
    /// 429: shed by tier 3.
    Shed {
        retry_after: Option<Duration>,
    },
    /// 503: the feature is greyed out (tier 1) or the server is unavailable.
    Disabled {
        retry_after: Option<Duration>,
    },
    Error {
        reason: String,
    },
}

/// Cap on kept latency samples per criticality (memory stays bounded on long runs).
const MAX_SAMPLES: usize = 1_000_000;

#[derive(Debug, Default)]
struct Class {
    calls: u64,
    ok: u64,
    ok_within_slo: u64,
    shed: u64,
    disabled: u64,
    errors: u64,
    retries: u64,
    client_dropped: u64,
    ttft_s: Vec<f64>,
    errors_by_reason: BTreeMap<String, u64>,
}

/// Thread-safe outcome recorder.
#[derive(Debug)]
pub struct Recorder {
    ttft_slo: Duration,
    classes: Mutex<BTreeMap<Criticality, Class>>,
}

/// Figures for one criticality.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClassReport {
    pub calls: u64,
    pub ok: u64,
    pub shed: u64,
    pub disabled: u64,
    pub errors: u64,
    pub retries: u64,
    pub client_dropped: u64,
    /// ok / calls (1 when there were no calls).
    pub success_rate: f64,
    /// share of calls answered 429.
    pub shed_share: f64,
    pub ttft_p50_s: f64,
    pub ttft_p99_s: f64,
    pub errors_by_reason: BTreeMap<String, u64>,
}

/// The end-of-run report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoadReport {
    pub elapsed_s: f64,
    /// Successful calls with TTFT within the objective, per second.
    pub goodput_rps: f64,
    pub ttft_slo_s: f64,
    pub by_criticality: BTreeMap<String, ClassReport>,
}

impl LoadReport {
    pub fn class(&self, c: Criticality) -> Option<&ClassReport> {
        self.by_criticality.get(c.as_str())
    }

    /// A table for humans.
    pub fn human(&self) -> String {
        let mut s = format!(
            "loadgen: {:.1}s, goodput {:.2} calls/s (TTFT ≤ {:.1}s)\n{:<10} {:>7} {:>8} {:>6} {:>8} {:>6} {:>8} {:>9} {:>9}\n",
            self.elapsed_s,
            self.goodput_rps,
            self.ttft_slo_s,
            "class",
            "calls",
            "success",
            "shed",
            "disabled",
            "errors",
            "retries",
            "ttft_p50",
            "ttft_p99"
        );
        for (name, c) in &self.by_criticality {
            s.push_str(&format!(
                "{:<10} {:>7} {:>7.2}% {:>6} {:>8} {:>6} {:>8} {:>8.3}s {:>8.3}s\n",
                name,
                c.calls,
                c.success_rate * 100.0,
                c.shed,
                c.disabled,
                c.errors,
                c.retries,
                c.ttft_p50_s,
                c.ttft_p99_s
            ));
        }
        s
    }
}

/// Nearest-rank quantile of unsorted samples (0 when empty).
pub fn quantile(samples: &mut [f64], q: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_by(f64::total_cmp);
    let rank = ((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
    samples[rank - 1]
}

impl Recorder {
    pub fn new(ttft_slo: Duration) -> Recorder {
        Recorder {
            ttft_slo,
            classes: Mutex::new(BTreeMap::new()),
        }
    }

    fn with<R>(&self, c: Criticality, f: impl FnOnce(&mut Class) -> R) -> R {
        let mut g = self
            .classes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(g.entry(c).or_default())
    }

    pub fn record(&self, c: Criticality, o: &CallOutcome) {
        let slo = self.ttft_slo;
        self.with(c, |k| {
            k.calls += 1;
            match o {
                CallOutcome::Ok { ttft, .. } => {
                    k.ok += 1;
                    if *ttft <= slo {
                        k.ok_within_slo += 1;
                    }
                    if k.ttft_s.len() < MAX_SAMPLES {
                        k.ttft_s.push(ttft.as_secs_f64());
                    }
                }
                CallOutcome::Shed { .. } => k.shed += 1,
                CallOutcome::Disabled { .. } => k.disabled += 1,
                CallOutcome::Error { reason } => {
                    k.errors += 1;
                    *k.errors_by_reason.entry(reason.clone()).or_default() += 1;
                }
            }
        });
    }

    pub fn retry(&self, c: Criticality) {
        self.with(c, |k| k.retries += 1);
    }

    /// An arrival the client could not start (in-flight cap reached): a failed call.
    pub fn client_dropped(&self, c: Criticality) {
        self.with(c, |k| {
            k.calls += 1;
            k.client_dropped += 1;
        });
    }

    pub fn progress_line(&self, planned: usize) -> String {
        let g = self
            .classes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut parts = vec![format!("planned flows {planned}")];
        for (c, k) in g.iter() {
            parts.push(format!(
                "{c}: {} ok / {} calls, {} shed, {} disabled, {} err",
                k.ok, k.calls, k.shed, k.disabled, k.errors
            ));
        }
        parts.join(" | ")
    }

    pub fn report(&self, elapsed: Duration) -> LoadReport {
        let mut g = self
            .classes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let secs = elapsed.as_secs_f64().max(1e-9);
        let mut good = 0;
        let mut by = BTreeMap::new();
        for (c, k) in g.iter_mut() {
            good += k.ok_within_slo;
            let rate = |n: u64| {
                if k.calls == 0 {
                    1.0
                } else {
                    n as f64 / k.calls as f64
                }
            };
            by.insert(
                c.as_str().to_string(),
                ClassReport {
                    calls: k.calls,
                    ok: k.ok,
                    shed: k.shed,
                    disabled: k.disabled,
                    errors: k.errors,
                    retries: k.retries,
                    client_dropped: k.client_dropped,
                    success_rate: rate(k.ok),
                    shed_share: if k.calls == 0 {
                        0.0
                    } else {
                        k.shed as f64 / k.calls as f64
                    },
                    ttft_p50_s: quantile(&mut k.ttft_s, 0.5),
                    ttft_p99_s: quantile(&mut k.ttft_s, 0.99),
                    errors_by_reason: k.errors_by_reason.clone(),
                },
            );
        }
        LoadReport {
            elapsed_s: secs,
            goodput_rps: good as f64 / secs,
            ttft_slo_s: self.ttft_slo.as_secs_f64(),
            by_criticality: by,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&mut v, 0.5), 50.0);
        assert_eq!(quantile(&mut v, 0.99), 99.0);
        assert_eq!(quantile(&mut [], 0.5), 0.0);
    }

    #[test]
    fn report_counts_outcomes_and_goodput_respects_the_slo() {
        let r = Recorder::new(Duration::from_secs(1));
        let ok = |ms| CallOutcome::Ok {
            ttft: Duration::from_millis(ms),
            e2e: Duration::from_millis(ms * 2),
        };
        r.record(Criticality::Critical, &ok(100));
        r.record(Criticality::Critical, &ok(3000));
        r.record(
            Criticality::Sheddable,
            &CallOutcome::Shed { retry_after: None },
        );
        r.record(
            Criticality::Sheddable,
            &CallOutcome::Error {
                reason: "timeout".into(),
            },
        );
        r.client_dropped(Criticality::Default);
        let rep = r.report(Duration::from_secs(2));
        let c = rep.class(Criticality::Critical).unwrap();
        assert_eq!((c.calls, c.ok, c.success_rate), (2, 2, 1.0));
        assert_eq!(c.ttft_p99_s, 3.0);
        assert!(
            (rep.goodput_rps - 0.5).abs() < 1e-9,
            "only the call within 1 s counts"
        );
        let s = rep.class(Criticality::Sheddable).unwrap();
        assert_eq!(
            (s.shed, s.errors, s.success_rate, s.shed_share),
            (1, 1, 0.0, 0.5)
        );
        assert_eq!(s.errors_by_reason["timeout"], 1);
        assert_eq!(rep.class(Criticality::Default).unwrap().success_rate, 0.0);
    }
}
