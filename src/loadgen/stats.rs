//! Per-criticality outcome counting and the final report.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use brownout_protocol::Criticality;
use serde::Serialize;

/// How one request ended (every request sent counts, retries included).
#[derive(Debug, Clone, PartialEq)]
pub enum CallOutcome {
    Ok {
        ttft: Duration,
        e2e: Duration,
        /// Completion tokens streamed (the `usage` figure when the server sent one).
        tokens: u64,
    },
    /// 429: shed by tier 3 (or a rate limit).
    Shed {
        retry_after: Option<Duration>,
    },
    /// 503 `feature_disabled` (tier 1/2) or another refusal with Retry-After (draining).
    Disabled {
        retry_after: Option<Duration>,
    },
    /// The client hung up first: the flow's deadline passed (`deadline`), or the impatient
    /// client's own call timeout.
    Abandoned {
        ttft: Option<Duration>,
        after: Duration,
        tokens: u64,
        deadline: bool,
    },
    Error {
        reason: String,
    },
}

/// Error reason of a request that waited in the engine's queue past `max_queue_wait`.
pub const EXPIRED_REASON: &str = "timeout_resource";

/// How one flow (one try of a user's task) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FlowEnd {
    /// Every call finished before the flow's deadline.
    Ok,
    /// The deadline passed (the client dropped the connection).
    Deadline,
    /// A call was refused with 429 and the client gave up.
    Shed,
    /// A call was refused with 503 (feature greyed out) and the client gave up.
    Disabled,
    /// A call waited in the engine's queue past its limit.
    Expired,
    /// Any other error the client gave up on.
    Error,
    /// Not started: the in-flight cap was reached.
    ClientDropped,
}

impl FlowEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            FlowEnd::Ok => "ok",
            FlowEnd::Deadline => "deadline",
            FlowEnd::Shed => "shed",
            FlowEnd::Disabled => "disabled",
            FlowEnd::Expired => "expired",
            FlowEnd::Error => "error",
            FlowEnd::ClientDropped => "client_dropped",
        }
    }

    /// How a flow ended given its last call's outcome and whether the deadline had passed.
    /// A call that succeeded after the deadline still fails the flow (8.03 s is a miss).
    pub fn of(last: &CallOutcome, past_deadline: bool) -> FlowEnd {
        if past_deadline {
            return FlowEnd::Deadline;
        }
        match last {
            CallOutcome::Ok { .. } => FlowEnd::Ok,
            CallOutcome::Shed { .. } => FlowEnd::Shed,
            CallOutcome::Disabled { .. } => FlowEnd::Disabled,
            CallOutcome::Abandoned { deadline: true, .. } => FlowEnd::Deadline,
            CallOutcome::Error { reason } if reason == EXPIRED_REASON => FlowEnd::Expired,
            CallOutcome::Abandoned { .. } | CallOutcome::Error { .. } => FlowEnd::Error,
        }
    }
}

/// One finished flow, as the runner reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowRecord {
    pub criticality: Criticality,
    /// 0: the user's first try; n: the n-th retry of the whole flow.
    pub attempt: u32,
    /// Offsets from the start of the run.
    pub started: Duration,
    pub ended: Duration,
    pub end: FlowEnd,
    /// Completion tokens the flow's calls received.
    pub tokens: u64,
    /// Requests the flow sent beyond one per call.
    pub call_retries: u32,
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
    abandoned: u64,
    expired: u64,
    ttft_s: Vec<f64>,
    errors_by_reason: BTreeMap<String, u64>,
    flows: FlowClass,
}

#[derive(Debug, Default)]
struct FlowClass {
    users: u64,
    users_ok: u64,
    attempts: u64,
    by_end: BTreeMap<FlowEnd, u64>,
    wasted_tokens: u64,
    useful_tokens: u64,
    call_retries: u64,
}

/// Thread-safe outcome recorder.
#[derive(Debug)]
pub struct Recorder {
    ttft_slo: Duration,
    classes: Mutex<BTreeMap<Criticality, Class>>,
    timeline: Mutex<Timeline>,
}

/// Per-second flow counts, by the second a flow ended (ok, failed) or started (started).
#[derive(Debug, Default, Clone, PartialEq, Serialize)]
pub struct Timeline {
    pub ok: Vec<u32>,
    pub failed: Vec<u32>,
    pub started: Vec<u32>,
}

/// Longest timeline kept (a day of seconds); later flows land in the last bucket.
const MAX_TIMELINE_S: usize = 86_400;

impl Timeline {
    fn bump(v: &mut Vec<u32>, at: Duration) {
        let i = (at.as_secs() as usize).min(MAX_TIMELINE_S - 1);
        if v.len() <= i {
            v.resize(i + 1, 0);
        }
        v[i] += 1;
    }

    /// Flows that ended ok per second, averaged over windows of `window_s` seconds:
    /// `(window start s, flows/s)`.
    pub fn goodput_series(&self, window_s: u64) -> Vec<(f64, f64)> {
        let w = window_s.max(1) as usize;
        self.ok
            .chunks(w)
            .enumerate()
            .map(|(i, c)| ((i * w) as f64, f64::from(c.iter().sum::<u32>()) / w as f64))
            .collect()
    }

    /// Flows that ended ok in `[from, to)` seconds, per second.
    pub fn goodput_between(&self, from: Duration, to: Duration) -> f64 {
        let (a, b) = (from.as_secs() as usize, to.as_secs() as usize);
        if b <= a {
            return 0.0;
        }
        let n: u32 = self.ok.iter().skip(a).take(b - a).sum();
        f64::from(n) / (b - a) as f64
    }
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
    /// Requests the client hung up on (deadline or its own call timeout).
    pub abandoned: u64,
    /// Requests the engine dropped after waiting in its queue too long.
    pub expired: u64,
    /// TTFT over requests that got a first token, and over requests abandoned before one (the
    /// time until the client hung up: a lower bound).
    pub ttft_p50_s: f64,
    pub ttft_p99_s: f64,
    pub errors_by_reason: BTreeMap<String, u64>,
    pub flows: FlowReport,
}

/// Flow figures for one criticality.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FlowReport {
    /// Users (first tries).
    pub users: u64,
    /// Users whose task succeeded on some try.
    pub users_ok: u64,
    /// users_ok / users (1 when there were none).
    pub success_rate: f64,
    /// Every flow run, retries of whole flows included.
    pub attempts: u64,
    pub flow_retries: u64,
    /// Flow tries by how they ended (`ok`, `deadline`, `shed`, …).
    pub by_end: BTreeMap<String, u64>,
    /// Completion tokens received by flows that failed anyway.
    pub wasted_tokens: u64,
    /// Completion tokens received by flows that succeeded.
    pub useful_tokens: u64,
    pub call_retries: u64,
}

/// The end-of-run report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoadReport {
    pub elapsed_s: f64,
    /// Successful calls with TTFT within the objective, per second.
    pub goodput_rps: f64,
    pub ttft_slo_s: f64,
    /// Flows that finished within their deadline, per second of the run (DistServe's goodput).
    pub flow_goodput_per_s: f64,
    /// Tokens received by flows that failed anyway, all classes.
    pub wasted_tokens: u64,
    pub by_criticality: BTreeMap<String, ClassReport>,
    pub timeline: Timeline,
}

impl LoadReport {
    pub fn class(&self, c: Criticality) -> Option<&ClassReport> {
        self.by_criticality.get(c.as_str())
    }

    /// A table for humans.
    pub fn human(&self) -> String {
        let mut s = format!(
            "loadgen: {:.1}s, flow goodput {:.2} flows/s (within deadline), {:.2} calls/s with TTFT ≤ {:.1}s, {} tokens wasted\n{:<10} {:>6} {:>8} {:>7} {:>8} {:>6} {:>8} {:>6} {:>8} {:>9} {:>9}\n",
            self.elapsed_s,
            self.flow_goodput_per_s,
            self.goodput_rps,
            self.ttft_slo_s,
            self.wasted_tokens,
            "class",
            "users",
            "flow_ok",
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
                "{:<10} {:>6} {:>7.2}% {:>7} {:>7.2}% {:>6} {:>8} {:>6} {:>8} {:>8.3}s {:>8.3}s\n",
                name,
                c.flows.users,
                c.flows.success_rate * 100.0,
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
            timeline: Mutex::new(Timeline::default()),
        }
    }

    /// A flow try started at `at` (for the offered-load timeline).
    pub fn flow_started(&self, at: Duration) {
        let mut t = self
            .timeline
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Timeline::bump(&mut t.started, at);
    }

    /// A flow try ended.
    pub fn record_flow(&self, f: &FlowRecord) {
        {
            let mut t = self
                .timeline
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if f.end == FlowEnd::Ok {
                Timeline::bump(&mut t.ok, f.ended);
            } else {
                Timeline::bump(&mut t.failed, f.ended);
            }
        }
        self.with(f.criticality, |k| {
            let fl = &mut k.flows;
            fl.attempts += 1;
            if f.attempt == 0 {
                fl.users += 1;
            }
            *fl.by_end.entry(f.end).or_default() += 1;
            fl.call_retries += u64::from(f.call_retries);
            if f.end == FlowEnd::Ok {
                fl.users_ok += 1;
                fl.useful_tokens += f.tokens;
            } else {
                fl.wasted_tokens += f.tokens;
            }
        });
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
                CallOutcome::Abandoned { ttft, after, .. } => {
                    k.abandoned += 1;
                    if k.ttft_s.len() < MAX_SAMPLES {
                        k.ttft_s.push(ttft.unwrap_or(*after).as_secs_f64());
                    }
                }
                CallOutcome::Shed { .. } => k.shed += 1,
                CallOutcome::Disabled { .. } => k.disabled += 1,
                CallOutcome::Error { reason } => {
                    k.errors += 1;
                    if reason == EXPIRED_REASON {
                        k.expired += 1;
                    }
                    *k.errors_by_reason.entry(reason.clone()).or_default() += 1;
                }
            }
        });
    }

    pub fn retry(&self, c: Criticality) {
        self.with(c, |k| k.retries += 1);
    }

    /// An arrival the client could not start (in-flight cap reached): a failed call and a
    /// failed flow.
    pub fn client_dropped(&self, c: Criticality, at: Duration) {
        self.with(c, |k| {
            k.calls += 1;
            k.client_dropped += 1;
        });
        self.record_flow(&FlowRecord {
            criticality: c,
            attempt: 0,
            started: at,
            ended: at,
            end: FlowEnd::ClientDropped,
            tokens: 0,
            call_retries: 0,
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
                "{c}: flows {}/{} ok, calls {} ok / {} shed / {} disabled / {} abandoned",
                k.flows.users_ok, k.flows.users, k.ok, k.shed, k.disabled, k.abandoned
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
        let mut flows_ok = 0;
        let mut wasted = 0;
        let mut by = BTreeMap::new();
        for (c, k) in g.iter_mut() {
            good += k.ok_within_slo;
            flows_ok += k.flows.by_end.get(&FlowEnd::Ok).copied().unwrap_or(0);
            wasted += k.flows.wasted_tokens;
            let fl = &k.flows;
            let flows = FlowReport {
                users: fl.users,
                users_ok: fl.users_ok,
                success_rate: if fl.users == 0 {
                    1.0
                } else {
                    fl.users_ok as f64 / fl.users as f64
                },
                attempts: fl.attempts,
                flow_retries: fl.attempts - fl.users,
                by_end: fl
                    .by_end
                    .iter()
                    .map(|(e, n)| (e.as_str().to_string(), *n))
                    .collect(),
                wasted_tokens: fl.wasted_tokens,
                useful_tokens: fl.useful_tokens,
                call_retries: fl.call_retries,
            };
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
                    abandoned: k.abandoned,
                    expired: k.expired,
                    success_rate: rate(k.ok),
                    shed_share: if k.calls == 0 {
                        0.0
                    } else {
                        k.shed as f64 / k.calls as f64
                    },
                    ttft_p50_s: quantile(&mut k.ttft_s, 0.5),
                    ttft_p99_s: quantile(&mut k.ttft_s, 0.99),
                    errors_by_reason: k.errors_by_reason.clone(),
                    flows,
                },
            );
        }
        let timeline = self
            .timeline
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        LoadReport {
            elapsed_s: secs,
            goodput_rps: good as f64 / secs,
            ttft_slo_s: self.ttft_slo.as_secs_f64(),
            flow_goodput_per_s: flows_ok as f64 / secs,
            wasted_tokens: wasted,
            by_criticality: by,
            timeline,
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
            tokens: 5,
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
        r.client_dropped(Criticality::Default, Duration::ZERO);
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

    fn flow(c: Criticality, attempt: u32, ended_s: u64, end: FlowEnd, tokens: u64) -> FlowRecord {
        FlowRecord {
            criticality: c,
            attempt,
            started: Duration::from_secs(ended_s.saturating_sub(3)),
            ended: Duration::from_secs(ended_s),
            end,
            tokens,
            call_retries: 1,
        }
    }

    #[test]
    fn flow_accounting_counts_users_retries_goodput_and_wasted_tokens() {
        let r = Recorder::new(Duration::from_secs(2));
        // User A: fails at the deadline after 40 tokens, retries the whole flow, succeeds.
        r.record_flow(&flow(Criticality::Default, 0, 5, FlowEnd::Deadline, 40));
        r.record_flow(&flow(Criticality::Default, 1, 9, FlowEnd::Ok, 30));
        // User B: shed, gives up.
        r.record_flow(&flow(Criticality::Default, 0, 6, FlowEnd::Shed, 0));
        // User C: ok at once; user D: expired in the queue after 12 tokens of an earlier call.
        r.record_flow(&flow(Criticality::Critical, 0, 1, FlowEnd::Ok, 10));
        r.record_flow(&flow(Criticality::Critical, 0, 1, FlowEnd::Expired, 12));
        r.client_dropped(Criticality::Sheddable, Duration::from_secs(2));
        let rep = r.report(Duration::from_secs(10));
        let d = &rep.class(Criticality::Default).unwrap().flows;
        assert_eq!(
            (d.users, d.users_ok, d.attempts, d.flow_retries),
            (2, 1, 3, 1)
        );
        assert_eq!(d.success_rate, 0.5);
        assert_eq!((d.wasted_tokens, d.useful_tokens), (40, 30));
        assert_eq!(d.by_end["deadline"], 1);
        assert_eq!(d.by_end["shed"], 1);
        assert_eq!(d.call_retries, 3);
        let c = &rep.class(Criticality::Critical).unwrap().flows;
        assert_eq!((c.users, c.users_ok, c.wasted_tokens), (2, 1, 12));
        let s = &rep.class(Criticality::Sheddable).unwrap().flows;
        assert_eq!((s.users, s.success_rate), (1, 0.0));
        assert_eq!(s.by_end["client_dropped"], 1);
        // Two flows ended ok in 10 s.
        assert!((rep.flow_goodput_per_s - 0.2).abs() < 1e-9);
        assert_eq!(rep.wasted_tokens, 52);
        assert_eq!(rep.timeline.ok[1], 1);
        assert_eq!(rep.timeline.ok[9], 1);
        assert_eq!(rep.timeline.failed.iter().sum::<u32>(), 4);
        assert_eq!(
            rep.timeline
                .goodput_between(Duration::ZERO, Duration::from_secs(2)),
            0.5
        );
        assert_eq!(rep.timeline.goodput_series(5), vec![(0.0, 0.2), (5.0, 0.2)]);
    }

    #[test]
    fn a_flow_is_judged_by_its_deadline_and_its_last_call() {
        let ok = CallOutcome::Ok {
            ttft: Duration::from_millis(10),
            e2e: Duration::from_millis(20),
            tokens: 3,
        };
        assert_eq!(FlowEnd::of(&ok, false), FlowEnd::Ok);
        // Finishing after the deadline is a miss, even when the answer arrived.
        assert_eq!(FlowEnd::of(&ok, true), FlowEnd::Deadline);
        let cut = CallOutcome::Abandoned {
            ttft: None,
            after: Duration::from_secs(8),
            tokens: 0,
            deadline: true,
        };
        assert_eq!(FlowEnd::of(&cut, false), FlowEnd::Deadline);
        let impatient = CallOutcome::Abandoned {
            deadline: false,
            ttft: None,
            after: Duration::from_secs(2),
            tokens: 0,
        };
        assert_eq!(FlowEnd::of(&impatient, false), FlowEnd::Error);
        assert_eq!(
            FlowEnd::of(&CallOutcome::Shed { retry_after: None }, false),
            FlowEnd::Shed
        );
        assert_eq!(
            FlowEnd::of(&CallOutcome::Disabled { retry_after: None }, false),
            FlowEnd::Disabled
        );
        let expired = CallOutcome::Error {
            reason: EXPIRED_REASON.into(),
        };
        assert_eq!(FlowEnd::of(&expired, false), FlowEnd::Expired);
        let r = Recorder::new(Duration::from_secs(1));
        r.record(Criticality::Default, &expired);
        r.record(Criticality::Default, &cut);
        let rep = r.report(Duration::from_secs(1));
        let d = rep.class(Criticality::Default).unwrap();
        assert_eq!((d.expired, d.abandoned, d.errors), (1, 1, 1));
        // The abandoned call's wait counts as a TTFT lower bound.
        assert_eq!(d.ttft_p99_s, 8.0);
    }
}
