//! Token sampling: greedy, temperature, nucleus (top-p), seeded.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What the client asked for. Validated by the API before it gets here.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// In (0, 1]; 1 disables nucleus filtering.
    pub top_p: f32,
    /// Same seed, same prompt, same params → same tokens.
    pub seed: Option<u64>,
    pub max_tokens: usize,
    /// Generation stops before the first occurrence of any of these (not included in the output).
    pub stop: Vec<String>,
    pub ignore_eos: bool,
}

impl Default for SamplingParams {
    fn default() -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            seed: None,
            max_tokens: 16,
            stop: Vec::new(),
            ignore_eos: false,
        }
    }
}

/// Per-sequence sampler; its RNG survives preemption, so a recomputed sequence continues the
/// same random stream.
#[derive(Debug, Clone)]
pub struct Sampler {
    rng: StdRng,
    /// Scratch for (index, prob), reused across steps.
    scratch: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(seed: Option<u64>) -> Sampler {
        let rng = match seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_rng(&mut rand::rng()),
        };
        Sampler {
            rng,
            scratch: Vec::new(),
        }
    }

    /// Picks the next token from `logits`. Non-finite logits are never chosen (unless all are).
    pub fn sample(&mut self, logits: &[f32], p: &SamplingParams) -> u32 {
        if p.temperature <= 1e-5 {
            return argmax(logits);
        }
        let max = logits
            .iter()
            .copied()
            .filter(|x| x.is_finite())
            .fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() {
            return argmax(logits);
        }
        let inv_t = 1.0 / p.temperature;
        self.scratch.clear();
        let mut sum = 0.0f32;
        for (i, &l) in logits.iter().enumerate() {
            if l.is_finite() {
                let e = ((l - max) * inv_t).exp();
                sum += e;
                self.scratch.push((i as u32, e));
            }
        }
        for e in &mut self.scratch {
            e.1 /= sum;
        }
        let mut mass = 1.0f32;
        if p.top_p < 1.0 {
            self.scratch
                .sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            let mut acc = 0.0;
            let mut keep = self.scratch.len();
            for (k, e) in self.scratch.iter().enumerate() {
                acc += e.1;
                if acc >= p.top_p {
                    keep = k + 1;
                    break;
                }
            }
            self.scratch.truncate(keep);
            mass = self.scratch.iter().map(|e| e.1).sum();
        }
        let mut r = self.rng.random::<f32>() * mass;
        for &(i, pr) in &self.scratch {
            if r < pr {
                return i;
            }
            r -= pr;
        }
        self.scratch.last().map_or(0, |e| e.0)
    }
}

/// Index of the largest finite logit (lowest index on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_argmax_ignoring_nan() {
        let p = SamplingParams::default();
        let mut s = Sampler::new(Some(1));
        assert_eq!(s.sample(&[0.1, 3.0, f32::NAN, 2.9], &p), 1);
    }

    #[test]
    fn same_seed_same_tokens_and_top_p_restricts_support() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = SamplingParams {
            temperature: 1.0,
            seed: Some(7),
            ..SamplingParams::default()
        };
        let run = |seed| {
            let mut s = Sampler::new(Some(seed));
            (0..20).map(|_| s.sample(&logits, &p)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        // top_p tiny: only the single most likely token survives.
        let tight = SamplingParams {
            top_p: 1e-6,
            ..p.clone()
        };
        let mut s = Sampler::new(Some(3));
        for _ in 0..20 {
            assert_eq!(s.sample(&logits, &tight), argmax(&logits));
        }
        // Temperature spreads choices over more than one token.
        let mut s = Sampler::new(Some(3));
        let picks: std::collections::HashSet<u32> =
            (0..200).map(|_| s.sample(&logits, &p)).collect();
        assert!(picks.len() > 5);
    }
}
