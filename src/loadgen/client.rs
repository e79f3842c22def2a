//! How each kind of client retries, and the flow deadlines. Pure functions, so the schedules are
//! tested exactly (no clock).
//!
//! | client | after a refusal (429/503) | after an error or a timeout | gives up |
//! |---|---|---|---|
//! | well-behaved | `Retry-After × (1 + 0.5·u)`, `u` uniform in [0, 1) | full jitter, `u × min(8, 0.5·2ⁿ⁻¹)` s | when the wait would pass the deadline; after 4 retries |
//! | naive | 1, 2, 4, 8 s (no jitter, Retry-After ignored) | the same | after 4 retries; at the deadline |
//! | impatient | at once | at once (its own call timeout is short) | after 16 retries; at the deadline |
//!
//! Every kind drops its connection at the flow's deadline (the flow has failed; the serving tier
//! cancels the request on disconnect). A user whose flow failed retries the whole flow with
//! probability `flow_retry_prob` after 1–3 s (refreshing the page), at most `max_flow_retries`
//! times; each retry is a new flow with its own deadline.

use std::time::Duration;

use super::plan::{ClientKind, FlowKind};

/// Why the last attempt of a call failed (what the retry schedule looks at).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Failure {
    /// 429 or 503 from the gate, with the server's Retry-After when it sent one.
    Refused { retry_after: Option<Duration> },
    /// A connection error, a broken stream, a server error or a client-side call timeout.
    Error,
}

/// The jitter well-behaved clients add on top of Retry-After (a share of it).
pub const WELL_BEHAVED_JITTER: f64 = 0.5;
/// The naive client's backoff periods, in seconds.
pub const NAIVE_BACKOFF_S: [u64; 4] = [1, 2, 4, 8];
/// Retries per call a well-behaved client makes at most.
pub const WELL_BEHAVED_MAX_RETRIES: u32 = 4;
/// Retries per call an impatient client makes at most (it would spin forever otherwise).
pub const IMPATIENT_MAX_RETRIES: u32 = 16;

/// The wait before retry number `attempt` (1 for the first retry) of a call that failed with
/// `failure`, for a client of `kind`; `None`: the client gives up. `u` is a uniform draw in
/// [0, 1) (the caller derives it from the flow's seed). The deadline check is the caller's
/// ([`gives_up_before_deadline`]).
pub fn retry_delay(kind: ClientKind, attempt: u32, failure: Failure, u: f64) -> Option<Duration> {
    if attempt == 0 {
        return Some(Duration::ZERO);
    }
    let u = u.clamp(0.0, 1.0 - f64::EPSILON);
    match kind {
        ClientKind::WellBehaved => {
            if attempt > WELL_BEHAVED_MAX_RETRIES {
                return None;
            }
            Some(match failure {
                Failure::Refused {
                    retry_after: Some(ra),
                } => ra.mul_f64(1.0 + WELL_BEHAVED_JITTER * u),
                _ => {
                    let cap = (0.5 * f64::from(1u32 << (attempt - 1).min(8))).min(8.0);
                    Duration::from_secs_f64(cap * u)
                }
            })
        }
        ClientKind::Naive => NAIVE_BACKOFF_S
            .get(attempt as usize - 1)
            .map(|s| Duration::from_secs(*s)),
        ClientKind::Impatient => (attempt <= IMPATIENT_MAX_RETRIES).then_some(Duration::ZERO),
    }
}

/// True when a client of `kind` would rather give up than wait `delay` with `remaining` left
/// before the flow's deadline. Only the well-behaved client looks ahead; the others find out at
/// the deadline (their wait is cut there).
pub fn gives_up_before_deadline(kind: ClientKind, delay: Duration, remaining: Duration) -> bool {
    kind == ClientKind::WellBehaved && delay >= remaining
}

/// Per-call timeout of a client: the impatient one abandons a call that has not finished
/// within `impatient` and retries it; the others wait until the flow's deadline.
pub fn call_timeout(kind: ClientKind, remaining: Duration, impatient: Duration) -> Duration {
    match kind {
        ClientKind::Impatient => remaining.min(impatient),
        _ => remaining,
    }
}

/// A uniform draw in [0, 1) from `(seed, a, b)` (SplitMix64): the same flow gets the same
/// jitter in every configuration of a benchmark.
pub fn unit(seed: u64, a: u64, b: u64) -> f64 {
    let mut z =
        seed ^ a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The whole-flow deadline of each flow kind.
#[derive(Debug, Clone, PartialEq)]
pub struct Deadlines([Duration; 7]);

impl Default for Deadlines {
    fn default() -> Deadlines {
        Deadlines(FlowKind::ALL.map(FlowKind::default_deadline))
    }
}

impl Deadlines {
    pub fn get(&self, kind: FlowKind) -> Duration {
        self.0[kind.index()]
    }

    pub fn set(&mut self, kind: FlowKind, d: Duration) {
        self.0[kind.index()] = d;
    }

    /// Applies `KIND=SECS` overrides (`login=3,trip_planner=10`); `agent=SECS` sets every kind
    /// except login and basic Q&A.
    ///
    /// # Errors
    /// An unknown kind or a deadline that is not a positive number of seconds.
    pub fn apply(&mut self, spec: &str) -> Result<(), String> {
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("deadline {part:?}: expected KIND=SECONDS"))?;
            let secs: f64 = v
                .trim()
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s <= 3600.0)
                .ok_or_else(|| format!("deadline {part:?}: seconds must be in (0, 3600]"))?;
            let d = Duration::from_secs_f64(secs);
            let k = k.trim();
            if k == "agent" {
                for kind in FlowKind::ALL {
                    if !matches!(kind, FlowKind::Login | FlowKind::BasicQa) {
                        self.set(kind, d);
                    }
                }
                continue;
            }
            let kind = FlowKind::ALL
                .into_iter()
                .find(|f| f.as_str() == k)
                .ok_or_else(|| {
                    let names: Vec<_> = FlowKind::ALL.iter().map(|f| f.as_str()).collect();
                    format!("unknown flow kind {k:?} (agent, {})", names.join(", "))
                })?;
            self.set(kind, d);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFUSED_NO_RA: Failure = Failure::Refused { retry_after: None };

    #[test]
    fn naive_backoff_is_exactly_one_two_four_eight_seconds_then_gives_up() {
        for failure in [
            Failure::Error,
            REFUSED_NO_RA,
            Failure::Refused {
                retry_after: Some(Duration::from_secs(30)),
            },
        ] {
            let got: Vec<_> = (1..=5)
                .map(|n| retry_delay(ClientKind::Naive, n, failure, 0.73))
                .collect();
            assert_eq!(
                got,
                vec![
                    Some(Duration::from_secs(1)),
                    Some(Duration::from_secs(2)),
                    Some(Duration::from_secs(4)),
                    Some(Duration::from_secs(8)),
                    None
                ]
            );
        }
        // No jitter: every naive client waits the same, whatever its draw.
        assert_eq!(
            retry_delay(ClientKind::Naive, 2, Failure::Error, 0.0),
            retry_delay(ClientKind::Naive, 2, Failure::Error, 0.999)
        );
    }

    #[test]
    fn well_behaved_honours_retry_after_with_bounded_jitter() {
        let ra = Duration::from_secs(4);
        let f = Failure::Refused {
            retry_after: Some(ra),
        };
        let mut seen = Vec::new();
        for i in 0..1000 {
            let u = unit(42, i, 1);
            let d = retry_delay(ClientKind::WellBehaved, 1, f, u).unwrap();
            assert!(
                d >= ra && d < ra.mul_f64(1.0 + WELL_BEHAVED_JITTER),
                "{d:?}"
            );
            seen.push(d);
        }
        seen.sort();
        // The jitter spreads the clients out: not all at the same instant.
        assert!(seen[999] - seen[0] > Duration::from_millis(1500));
        assert_eq!(
            retry_delay(ClientKind::WellBehaved, 1, f, 0.0),
            Some(Duration::from_secs(4))
        );
        assert_eq!(
            retry_delay(
                ClientKind::WellBehaved,
                WELL_BEHAVED_MAX_RETRIES + 1,
                f,
                0.5
            ),
            None
        );
        // Without Retry-After: full jitter under an exponential cap.
        let d = retry_delay(ClientKind::WellBehaved, 3, Failure::Error, 0.5).unwrap();
        assert_eq!(d, Duration::from_secs(1));
        let d = retry_delay(ClientKind::WellBehaved, 2, REFUSED_NO_RA, 0.999).unwrap();
        assert!(d < Duration::from_secs(1));
    }

    #[test]
    fn impatient_retries_at_once_until_its_cap() {
        for n in 1..=IMPATIENT_MAX_RETRIES {
            assert_eq!(
                retry_delay(ClientKind::Impatient, n, Failure::Error, 0.4),
                Some(Duration::ZERO)
            );
            assert_eq!(
                retry_delay(
                    ClientKind::Impatient,
                    n,
                    Failure::Refused {
                        retry_after: Some(Duration::from_secs(10))
                    },
                    0.4
                ),
                Some(Duration::ZERO)
            );
        }
        assert_eq!(
            retry_delay(
                ClientKind::Impatient,
                IMPATIENT_MAX_RETRIES + 1,
                Failure::Error,
                0.4
            ),
            None
        );
        let r = Duration::from_secs(6);
        assert_eq!(
            call_timeout(ClientKind::Impatient, r, Duration::from_secs(2)),
            Duration::from_secs(2)
        );
        assert_eq!(
            call_timeout(ClientKind::Naive, r, Duration::from_secs(2)),
            r
        );
    }

    #[test]
    fn only_the_well_behaved_client_gives_up_ahead_of_the_deadline() {
        let (d, left) = (Duration::from_secs(5), Duration::from_secs(3));
        assert!(gives_up_before_deadline(ClientKind::WellBehaved, d, left));
        assert!(!gives_up_before_deadline(
            ClientKind::WellBehaved,
            d,
            left * 2
        ));
        assert!(!gives_up_before_deadline(ClientKind::Naive, d, left));
        assert!(!gives_up_before_deadline(ClientKind::Impatient, d, left));
    }

    #[test]
    fn unit_draws_are_deterministic_uniform_and_in_range() {
        assert_eq!(unit(1, 2, 3), unit(1, 2, 3));
        assert_ne!(unit(1, 2, 3), unit(1, 2, 4));
        let n = 10_000;
        let mean: f64 = (0..n).map(|i| unit(9, i, 0)).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
        assert!((0..n).all(|i| (0.0..1.0).contains(&unit(9, i, 7))));
    }

    #[test]
    fn deadlines_default_and_overrides() {
        let mut d = Deadlines::default();
        assert_eq!(d.get(FlowKind::TripPlanner), Duration::from_secs(8));
        assert!(d.get(FlowKind::Login) < d.get(FlowKind::BasicQa));
        assert!(d.get(FlowKind::BasicQa) < d.get(FlowKind::Chat));
        d.apply("agent=10, login=2.5").unwrap();
        assert_eq!(d.get(FlowKind::PdfAnalysis), Duration::from_secs(10));
        assert_eq!(d.get(FlowKind::Login), Duration::from_millis(2500));
        assert_eq!(d.get(FlowKind::BasicQa), Duration::from_secs(4));
        assert!(d.apply("nope=3").is_err());
        assert!(d.apply("login=0").is_err());
        assert!(d.apply("login").is_err());
    }
}
