//! Time-bucketed good/total counters, at three resolutions, in fixed rings.
//!
//! ```text
//!  fine    10 s buckets × 362   covers 1 h   (+ the open bucket) ─ windows ≤ 1 h
//!  medium   1 m buckets × 4 322 covers 3 d                      ─ windows ≤ 3 d
//!  coarse   1 h buckets × (period + 2 h)                        ─ the budget period
//! ```
//!
//! Each slot remembers which bucket it holds (`epoch` = ts / bucket length), so a ring never
//! needs a clock or a sweep: a slot whose epoch is not the one asked for is empty, and a write
//! to a slot holding an older bucket resets it. Recording is three array writes; a window sum
//! reads `window / bucket` slots. An SLO with a 31-day period holds about 140 KB.

use super::budget::Counts;

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    epoch: u64,
    counts: Counts,
}

/// One ring of equal buckets.
#[derive(Debug, Clone)]
pub struct Ring {
    bucket_ms: u64,
    slots: Box<[Slot]>,
}

impl Ring {
    /// A ring able to answer windows up to `span_ms` ending at any instant (one extra slot for
    /// the open bucket, one for the partly covered oldest bucket).
    pub fn new(bucket_ms: u64, span_ms: u64) -> Ring {
        assert!(bucket_ms > 0, "bucket length must be positive");
        let n = span_ms.div_ceil(bucket_ms) as usize + 2;
        // epoch u64::MAX marks "never written"; no real bucket has that epoch.
        Ring {
            bucket_ms,
            slots: vec![
                Slot {
                    epoch: u64::MAX,
                    counts: Counts::default()
                };
                n
            ]
            .into_boxed_slice(),
        }
    }

    pub fn bucket_ms(&self) -> u64 {
        self.bucket_ms
    }

    /// The longest window this ring answers exactly.
    pub fn span_ms(&self) -> u64 {
        (self.slots.len() as u64 - 2) * self.bucket_ms
    }

    /// Adds `n` events (`good` of them good) at `ts_ms`. Returns false (and records nothing)
    /// when the bucket has already been overwritten by a newer one: the event is too old.
    #[inline]
    pub fn add(&mut self, ts_ms: u64, good: u64, n: u64) -> bool {
        self.add_epoch(ts_ms / self.bucket_ms, good, n)
    }

    /// [`Ring::add`] with the bucket number already computed (`ts / bucket_ms`).
    #[inline]
    fn add_epoch(&mut self, epoch: u64, good: u64, n: u64) -> bool {
        let len = self.slots.len() as u64;
        let slot = &mut self.slots[(epoch % len) as usize];
        if slot.epoch != epoch {
            if slot.epoch != u64::MAX && slot.epoch > epoch {
                return false;
            }
            slot.epoch = epoch;
            slot.counts = Counts::default();
        }
        slot.counts.good += good;
        slot.counts.total += n;
        true
    }

    /// Sum of the buckets in `(now − window, now]`, bucket-aligned: the bucket holding `now`
    /// and the `window / bucket − 1` before it. Windows longer than the ring are cut to it.
    pub fn sum(&self, now_ms: u64, window_ms: u64) -> Counts {
        let now_epoch = now_ms / self.bucket_ms;
        let n = (window_ms / self.bucket_ms).clamp(1, self.slots.len() as u64 - 1);
        self.sum_epochs(now_epoch.saturating_sub(n - 1), now_epoch)
    }

    /// Sum of the buckets whose start is at or after `from_ms`, up to the one holding `now`.
    pub fn sum_since(&self, from_ms: u64, now_ms: u64) -> Counts {
        let now_epoch = now_ms / self.bucket_ms;
        let first =
            (from_ms / self.bucket_ms).max(now_epoch.saturating_sub(self.slots.len() as u64 - 2));
        self.sum_epochs(first, now_epoch)
    }

    fn sum_epochs(&self, first: u64, last: u64) -> Counts {
        let len = self.slots.len() as u64;
        let mut c = Counts::default();
        let mut e = first;
        while e <= last {
            let slot = &self.slots[(e % len) as usize];
            if slot.epoch == e {
                c += slot.counts;
            }
            e += 1;
        }
        c
    }

    /// Bytes held by the slots.
    pub fn heap_bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<Slot>()
    }
}

/// The three rings of one SLO.
#[derive(Debug, Clone)]
pub struct Rings {
    fine: Ring,
    medium: Ring,
    coarse: Ring,
}

pub const FINE_BUCKET_MS: u64 = 10_000;
pub const MEDIUM_BUCKET_MS: u64 = 60_000;
pub const COARSE_BUCKET_MS: u64 = 3_600_000;

impl Rings {
    /// Rings for windows up to 3 days and a budget period up to `period_ms`.
    pub fn new(period_ms: u64) -> Rings {
        Rings {
            fine: Ring::new(FINE_BUCKET_MS, 3_600_000),
            medium: Ring::new(MEDIUM_BUCKET_MS, 3 * 86_400_000),
            coarse: Ring::new(COARSE_BUCKET_MS, period_ms.max(3 * 86_400_000)),
        }
    }

    /// Records `n` events, `good` of them good. False when too old for every ring.
    #[inline]
    pub fn add(&mut self, ts_ms: u64, good: u64, n: u64) -> bool {
        // Constant divisors: the compiler turns these into multiplications (the hot path).
        let a = self.fine.add_epoch(ts_ms / FINE_BUCKET_MS, good, n);
        let b = self.medium.add_epoch(ts_ms / MEDIUM_BUCKET_MS, good, n);
        let c = self.coarse.add_epoch(ts_ms / COARSE_BUCKET_MS, good, n);
        a || b || c
    }

    /// Counts of the window ending at `now`, from the finest ring that spans it.
    pub fn window(&self, now_ms: u64, window_ms: u64) -> Counts {
        if window_ms <= self.fine.span_ms() {
            self.fine.sum(now_ms, window_ms)
        } else if window_ms <= self.medium.span_ms() {
            self.medium.sum(now_ms, window_ms)
        } else {
            self.coarse.sum(now_ms, window_ms)
        }
    }

    /// Counts since `from_ms` (hour-aligned), for calendar periods.
    pub fn since(&self, from_ms: u64, now_ms: u64) -> Counts {
        self.coarse.sum_since(from_ms, now_ms)
    }

    pub fn heap_bytes(&self) -> usize {
        self.fine.heap_bytes() + self.medium.heap_bytes() + self.coarse.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn window_sums_only_the_buckets_inside() {
        let mut r = Ring::new(10_000, 60_000);
        for s in 0..12u64 {
            assert!(r.add(s * 10_000 + 5, s % 2, 1));
        }
        // Buckets 6..=11 (the last 60 s): 6 events, 3 good (odd seconds).
        assert_eq!(r.sum(115_000, 60_000), Counts { good: 3, total: 6 });
        assert_eq!(r.sum(115_000, 10_000), Counts { good: 1, total: 1 });
        // Long after: nothing left in the window.
        assert_eq!(r.sum(1_000_000, 60_000), Counts::default());
    }

    #[test]
    fn overwritten_buckets_refuse_late_events() {
        let mut r = Ring::new(10_000, 20_000); // 4 slots
        assert!(r.add(100_000, 1, 1));
        assert!(
            !r.add(60_000, 1, 1),
            "bucket 6 shares bucket 10's slot and is older"
        );
    }

    proptest! {
        /// Against a model that keeps every event: any window inside the ring's span sums
        /// exactly the events of its buckets.
        #[test]
        fn matches_a_model(events in proptest::collection::vec((0u64..600_000, any::<bool>()), 0..200),
                           now in 300_000u64..700_000, win_buckets in 1u64..30) {
            // Events up to `now` (a ring holds the recent past; it is not asked about times
            // before data newer than `now` was written).
            let mut sorted: Vec<(u64, bool)> = events.into_iter().filter(|(ts, _)| *ts <= now).collect();
            sorted.sort();
            let mut r = Ring::new(10_000, 300_000);
            for &(ts, good) in &sorted {
                r.add(ts, u64::from(good), 1);
            }
            let now_epoch = now / 10_000;
            let first = now_epoch + 1 - win_buckets;
            let want = sorted.iter().filter(|(ts, _)| ts / 10_000 >= first && ts / 10_000 <= now_epoch)
                .fold(Counts::default(), |mut c, &(_, g)| { c.total += 1; c.good += u64::from(g); c });
            prop_assert_eq!(r.sum(now, win_buckets * 10_000), want);
        }
    }
}
