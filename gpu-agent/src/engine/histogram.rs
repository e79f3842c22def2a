//! Cumulative Prometheus histograms: bucket-wise differences and quantiles with
//! `histogram_quantile` semantics (linear interpolation inside the bucket that holds the rank).

/// One cumulative histogram as scraped: `(upper_bound, cumulative_count)` sorted by bound, the
/// last bound `+Inf`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Histogram {
    pub buckets: Vec<(f64, f64)>,
}

impl Histogram {
    /// Builds a histogram from unsorted `(le, count)` pairs, summing pairs with the same bound
    /// (several label sets, e.g. one per data-parallel engine, are merged into one).
    pub fn from_pairs(pairs: impl IntoIterator<Item = (f64, f64)>) -> Self {
        let mut buckets: Vec<(f64, f64)> = pairs
            .into_iter()
            .filter(|(le, c)| !le.is_nan() && c.is_finite())
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut merged: Vec<(f64, f64)> = Vec::with_capacity(buckets.len());
        for (le, c) in buckets {
            match merged.last_mut() {
                Some(last) if last.0 == le => last.1 += c,
                _ => merged.push((le, c)),
            }
        }
        Self { buckets: merged }
    }

    /// Observations in the histogram (the `+Inf` bucket, else the largest cumulative count).
    pub fn total(&self) -> f64 {
        self.buckets.iter().map(|b| b.1).fold(0.0, f64::max)
    }

    /// `self − earlier`, bucket by bucket, when both have the same bounds and no bucket went
    /// down; `None` otherwise (a restart reset the counters, or the bounds changed).
    pub fn since(&self, earlier: &Histogram) -> Option<Histogram> {
        if self.buckets.len() != earlier.buckets.len() {
            return None;
        }
        let mut out = Vec::with_capacity(self.buckets.len());
        for (now, then) in self.buckets.iter().zip(&earlier.buckets) {
            if now.0 != then.0 || now.1 < then.1 {
                return None;
            }
            out.push((now.0, now.1 - then.1));
        }
        Some(Histogram { buckets: out })
    }

    /// The `q` quantile (0–1) like PromQL's `histogram_quantile`: `None` when there are no
    /// observations or no buckets; the highest finite bound when the rank falls in `+Inf`.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.total();
        if self.buckets.is_empty() || total <= 0.0 || !q.is_finite() {
            return None;
        }
        let q = q.clamp(0.0, 1.0);
        let rank = q * total;
        let mut prev_bound = 0.0;
        let mut prev_count = 0.0;
        for (i, &(le, count)) in self.buckets.iter().enumerate() {
            if count >= rank && count > prev_count {
                if le.is_infinite() {
                    // Prometheus returns the upper bound of the last finite bucket.
                    return Some(if i == 0 { 0.0 } else { self.buckets[i - 1].0 });
                }
                let lower = if i == 0 && le <= 0.0 { le } else { prev_bound };
                let in_bucket = count - prev_count;
                return Some(lower + (le - lower) * ((rank - prev_count) / in_bucket));
            }
            if le.is_finite() {
                prev_bound = le;
            }
            prev_count = count.max(prev_count);
        }
        // Only reachable when counts are not monotone; answer the last finite bound.
        self.buckets
            .iter()
            .rev()
            .find(|b| b.0.is_finite())
            .map(|b| b.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn h(pairs: &[(f64, f64)]) -> Histogram {
        Histogram::from_pairs(pairs.iter().copied())
    }

    #[test]
    fn quantiles_match_promql_histogram_quantile() {
        // (buckets, q, expected) — values worked out by hand with PromQL's rules.
        type Case<'a> = (&'a [(f64, f64)], f64, Option<f64>);
        let cases: &[Case<'_>] = &[
            (
                &[(0.1, 0.0), (0.5, 10.0), (1.0, 20.0), (f64::INFINITY, 20.0)],
                0.5,
                Some(0.5),
            ),
            (
                &[(0.1, 0.0), (0.5, 10.0), (1.0, 20.0), (f64::INFINITY, 20.0)],
                0.75,
                Some(0.75),
            ),
            (
                &[(0.1, 0.0), (0.5, 10.0), (1.0, 20.0), (f64::INFINITY, 20.0)],
                0.25,
                Some(0.3),
            ),
            (&[(0.1, 5.0), (f64::INFINITY, 10.0)], 0.99, Some(0.1)),
            (&[(0.1, 10.0), (f64::INFINITY, 10.0)], 0.5, Some(0.05)),
            (&[(0.1, 0.0), (f64::INFINITY, 0.0)], 0.5, None),
            (&[], 0.5, None),
        ];
        for (buckets, q, want) in cases {
            let got = h(buckets).quantile(*q);
            match (got, want) {
                (Some(g), Some(w)) => {
                    assert!((g - w).abs() < 1e-9, "{buckets:?} q={q}: got {g}, want {w}")
                }
                (g, w) => assert_eq!(g, *w, "{buckets:?} q={q}"),
            }
        }
    }

    #[test]
    fn since_subtracts_and_detects_resets() {
        let a = h(&[(0.1, 1.0), (1.0, 3.0), (f64::INFINITY, 4.0)]);
        let b = h(&[(0.1, 2.0), (1.0, 7.0), (f64::INFINITY, 9.0)]);
        assert_eq!(
            b.since(&a),
            Some(h(&[(0.1, 1.0), (1.0, 4.0), (f64::INFINITY, 5.0)]))
        );
        assert_eq!(a.since(&b), None, "a counter going down is a reset");
        assert_eq!(b.since(&h(&[(0.1, 0.0)])), None, "different bounds");
    }

    #[test]
    fn label_sets_with_the_same_bounds_are_summed() {
        let merged = h(&[
            (1.0, 2.0),
            (f64::INFINITY, 3.0),
            (1.0, 5.0),
            (f64::INFINITY, 5.0),
        ]);
        assert_eq!(merged.buckets, vec![(1.0, 7.0), (f64::INFINITY, 8.0)]);
    }

    proptest! {
        #[test]
        fn quantile_is_within_bounds_and_monotone_in_q(
            counts in proptest::collection::vec(0u32..50, 1..12),
            q1 in 0.0f64..1.0, q2 in 0.0f64..1.0,
        ) {
            let mut cum = 0.0;
            let mut pairs = Vec::new();
            for (i, c) in counts.iter().enumerate() {
                cum += f64::from(*c);
                pairs.push((0.01 * 2f64.powi(i as i32), cum));
            }
            pairs.push((f64::INFINITY, cum));
            let hist = Histogram::from_pairs(pairs.clone());
            let (lo, hi) = if q1 <= q2 { (q1, q2) } else { (q2, q1) };
            match (hist.quantile(lo), hist.quantile(hi)) {
                (Some(a), Some(b)) => {
                    prop_assert!(a <= b + 1e-12, "q{lo}={a} > q{hi}={b}");
                    let max_bound = pairs[pairs.len() - 2].0;
                    prop_assert!(a >= 0.0 && b <= max_bound + 1e-12);
                }
                (None, None) => prop_assert_eq!(cum, 0.0),
                other => prop_assert!(false, "inconsistent {:?}", other),
            }
        }
    }
}
