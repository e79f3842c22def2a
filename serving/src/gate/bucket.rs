//! The admission token bucket (`admit_rps`): `rate` tokens per second, at most `max(1, rate)`
//! held (a burst of one second's worth; none at rate 0), one token per admitted non-critical
//! request. Time comes
//! from the caller, so tests drive it with a logical clock.

use std::time::Instant;

/// `Retry-After` when the rate is 0 (nothing non-critical is admitted until a new command).
pub const ZERO_RATE_RETRY_AFTER_S: u64 = 10;
/// The longest `Retry-After` the bucket asks for.
pub const MAX_RETRY_AFTER_S: u64 = 60;

#[derive(Debug, Clone)]
pub struct TokenBucket {
    rate: Option<f64>,
    tokens: f64,
    last: Option<Instant>,
    /// Requests refused for want of a token.
    pub throttled_total: u64,
}

impl Default for TokenBucket {
    fn default() -> TokenBucket {
        TokenBucket::new()
    }
}

impl TokenBucket {
    /// No rate: admits everything.
    pub fn new() -> TokenBucket {
        TokenBucket {
            rate: None,
            tokens: 0.0,
            last: None,
            throttled_total: 0,
        }
    }

    pub fn rate(&self) -> Option<f64> {
        self.rate
    }

    /// The burst: one second's worth, at least one token (none at rate 0).
    fn capacity(rate: f64) -> f64 {
        if rate > 0.0 { rate.max(1.0) } else { 0.0 }
    }

    fn refill(&mut self, now: Instant) {
        if let (Some(rate), Some(last)) = (self.rate, self.last) {
            let dt = now.saturating_duration_since(last).as_secs_f64();
            self.tokens = (self.tokens + dt * rate).min(Self::capacity(rate));
        }
        self.last = Some(self.last.map_or(now, |l| l.max(now)));
    }

    /// Sets the rate (`None`: unlimited). A bucket that had no rate starts full; a changed rate
    /// keeps the tokens earned so far (up to the new burst).
    pub fn set_rate(&mut self, rate: Option<f64>, now: Instant) {
        let rate = rate.filter(|r| r.is_finite() && *r >= 0.0);
        if rate == self.rate {
            return;
        }
        self.refill(now);
        match (self.rate, rate) {
            (None, Some(r)) => self.tokens = Self::capacity(r),
            (Some(_), Some(r)) => self.tokens = self.tokens.min(Self::capacity(r)),
            (_, None) => self.tokens = 0.0,
        }
        self.rate = rate;
    }

    /// Tokens available now (`None` when unlimited).
    pub fn tokens(&mut self, now: Instant) -> Option<f64> {
        self.refill(now);
        self.rate.map(|_| self.tokens)
    }

    /// Takes a token, or says how many seconds until one is there.
    pub fn try_take(&mut self, now: Instant) -> Result<(), u64> {
        let Some(rate) = self.rate else {
            return Ok(());
        };
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            return Ok(());
        }
        self.throttled_total += 1;
        if rate <= 0.0 {
            return Err(ZERO_RATE_RETRY_AFTER_S);
        }
        let wait = ((1.0 - self.tokens) / rate).ceil() as u64;
        Err(wait.clamp(1, MAX_RETRY_AFTER_S))
    }

    /// Takes a token only while more than `reserve` would be left (a lower priority leaves the
    /// last `reserve` tokens of the burst to the higher one). `reserve` 0 is [`Self::try_take`].
    ///
    /// # Errors
    /// The seconds until enough tokens are there, as [`Self::try_take`].
    pub fn try_take_above(&mut self, now: Instant, reserve: f64) -> Result<(), u64> {
        let Some(rate) = self.rate else {
            return Ok(());
        };
        self.refill(now);
        let need = 1.0 + reserve.max(0.0);
        if self.tokens >= need {
            self.tokens -= 1.0;
            return Ok(());
        }
        self.throttled_total += 1;
        if rate <= 0.0 {
            return Err(ZERO_RATE_RETRY_AFTER_S);
        }
        let wait = ((need - self.tokens) / rate).ceil() as u64;
        Err(wait.clamp(1, MAX_RETRY_AFTER_S))
    }

    /// Takes a token whatever is left (a request that is never refused, but whose work the
    /// rate must account for): the bucket may go into debt down to minus one burst, which
    /// the refill pays back before anyone else is admitted.
    pub fn draw(&mut self, now: Instant) {
        let Some(rate) = self.rate else {
            return;
        };
        self.refill(now);
        self.tokens = (self.tokens - 1.0).max(-Self::capacity(rate));
    }

    /// The burst at the current rate (0 without a rate).
    pub fn burst(&self) -> f64 {
        self.rate.map_or(0.0, Self::capacity)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn admits_the_burst_then_the_rate_on_a_logical_clock() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new();
        assert_eq!(b.try_take(t0), Ok(()), "unlimited without a rate");
        b.set_rate(Some(4.0), t0);
        for _ in 0..4 {
            assert_eq!(b.try_take(t0), Ok(()));
        }
        assert_eq!(b.try_take(t0), Err(1));
        // Half a second later two tokens are back.
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(b.try_take(t1), Ok(()));
        assert_eq!(b.try_take(t1), Ok(()));
        assert_eq!(b.try_take(t1), Err(1));
        assert_eq!(b.throttled_total, 2);
        // Ten seconds idle never holds more than the burst.
        let t2 = t1 + Duration::from_secs(10);
        assert_eq!(b.tokens(t2), Some(4.0));
    }

    #[test]
    fn slow_rates_ask_for_long_retries_and_zero_admits_nothing() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new();
        b.set_rate(Some(0.1), t0);
        assert_eq!(b.try_take(t0), Ok(()), "a burst of at least one");
        assert_eq!(b.try_take(t0), Err(10));
        b.set_rate(Some(0.0), t0);
        assert_eq!(
            b.try_take(t0 + Duration::from_secs(100)),
            Err(ZERO_RATE_RETRY_AFTER_S)
        );
        b.set_rate(None, t0);
        assert_eq!(b.try_take(t0), Ok(()));
        assert_eq!(b.tokens(t0), None);
    }

    #[test]
    fn a_reserve_keeps_the_last_tokens_for_the_higher_priority_and_draws_go_into_debt() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new();
        b.set_rate(Some(4.0), t0);
        // The low priority leaves 2 of the 4 tokens.
        assert_eq!(b.try_take_above(t0, 2.0), Ok(()));
        assert_eq!(b.try_take_above(t0, 2.0), Ok(()));
        assert_eq!(b.try_take_above(t0, 2.0), Err(1));
        // The high priority takes them.
        assert_eq!(b.try_take(t0), Ok(()));
        assert_eq!(b.try_take(t0), Ok(()));
        assert_eq!(b.try_take(t0), Err(1));
        // Draws are never refused but go into debt, at most one burst.
        for _ in 0..10 {
            b.draw(t0);
        }
        assert_eq!(b.tokens(t0), Some(-4.0));
        // The debt is paid back first: after 1 s the bucket is at 0, after 1.25 s one token.
        assert_eq!(b.try_take(t0 + Duration::from_secs(1)), Err(1));
        assert_eq!(b.try_take(t0 + Duration::from_millis(1250)), Ok(()));
        assert_eq!(b.burst(), 4.0);
    }

    #[test]
    fn a_clock_going_backwards_does_not_mint_tokens() {
        let t0 = Instant::now() + Duration::from_secs(5);
        let mut b = TokenBucket::new();
        b.set_rate(Some(1.0), t0);
        assert_eq!(b.try_take(t0), Ok(()));
        assert!(b.try_take(t0 - Duration::from_secs(3)).is_err());
        assert!(b.try_take(t0).is_err());
    }
}
