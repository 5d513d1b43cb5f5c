//! Sampling statistics the lossless-sampling tests share: a fixed prompt on the tiny
//! models, the exact distribution of two sampled tokens, and a chi-square test.

use std::collections::BTreeMap;

use mtplx_model::sampling::RandomSampling;
use mtplx_model::Want;

pub const PROMPT: [u32; 7] = [3, 41, 97, 5, 200, 17, 64];
pub const SAMPLES: u64 = 20_000;

pub fn sampling(seed: u64) -> RandomSampling {
    RandomSampling {
        temperature: 1.0,
        top_k: 4,
        top_p: 1.0,
        min_p: 0.0,
        seed,
    }
}

/// The exact distribution of (t0, t1) under plain sampling.
pub fn exact_pairs(
    model: &dyn mtplx_model::LanguageModel,
    s: RandomSampling,
) -> BTreeMap<(u32, u32), f64> {
    let mut out = BTreeMap::new();
    let mut cache = super::cache(model);
    let first = model.forward(&PROMPT, &mut cache, Want::Last).unwrap();
    let d0 = s.distribution(first.last_logits());
    for (&t0, &p0) in d0.tokens.iter().zip(&d0.probs) {
        let mut c = super::cache(model);
        let mut ctx = PROMPT.to_vec();
        ctx.push(t0);
        let next = model.forward(&ctx, &mut c, Want::Last).unwrap();
        let d1 = s.distribution(next.last_logits());
        for (&t1, &p1) in d1.tokens.iter().zip(&d1.probs) {
            *out.entry((t0, t1)).or_default() += p0 as f64 * p1 as f64;
        }
    }
    out
}

/// Pearson's statistic of `counts` against `expected` probabilities (bins with an expected
/// count under 5 pooled), and its degrees of freedom.
pub fn chi_square(
    counts: &BTreeMap<(u32, u32), u64>,
    expected: &BTreeMap<(u32, u32), f64>,
    n: f64,
) -> (f64, usize) {
    let mut stat = 0.0;
    let mut bins = 0;
    let (mut pooled_obs, mut pooled_exp) = (0.0, 0.0);
    for (k, &p) in expected {
        let obs = *counts.get(k).unwrap_or(&0) as f64;
        if n * p < 5.0 {
            pooled_obs += obs;
            pooled_exp += n * p;
        } else {
            stat += (obs - n * p).powi(2) / (n * p);
            bins += 1;
        }
    }
    // Anything observed outside the expected support is impossible under plain sampling.
    let outside: u64 = counts
        .iter()
        .filter(|(k, _)| !expected.contains_key(k))
        .map(|(_, c)| c)
        .sum();
    pooled_obs += outside as f64;
    if pooled_exp > 0.0 {
        stat += (pooled_obs - pooled_exp).powi(2) / pooled_exp.max(1e-9);
        bins += 1;
    } else if pooled_obs > 0.0 {
        stat = f64::INFINITY;
    }
    (stat, bins.max(2) - 1)
}

/// Chi-square critical value at p = 0.001 (Wilson-Hilferty approximation).
pub fn critical(df: usize) -> f64 {
    let k = df as f64;
    let z = 3.09;
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}
