//! Sampling under speculation follows the model's own distribution.
//!
//! - A random draft (`q` known) verified by the `min(1, p/q)` rule: over 20,000 seeded runs
//!   on tiny models with a small vocabulary, the empirical distribution of the first two
//!   generated tokens matches the exact plain-sampling distribution (chi-square), while the
//!   draft's own distribution (what a rule that accepts everything would give) fails the
//!   same threshold by far.
//! - A deterministic draft at temperature > 0 gives exactly the tokens plain sampling gives
//!   with the same seed.

mod common;

use std::collections::BTreeMap;

use mtplx_kv::CacheFactory;
use mtplx_model::sampling::{Penalties, RandomSampling, Sampler, Sampling};
use mtplx_model::{Generator, LanguageModel, Model, Want};
use mtplx_spec::{DraftModel, DraftSampling, PromptLookup, SpecDecoder};

const PROMPT: [u32; 7] = [3, 41, 97, 5, 200, 17, 64];
const SAMPLES: u64 = 20_000;

fn sampling(seed: u64) -> RandomSampling {
    RandomSampling {
        temperature: 1.0,
        top_k: 4,
        top_p: 1.0,
        min_p: 0.0,
        seed,
    }
}

/// The exact distribution of (t0, t1) under plain sampling.
fn exact_pairs(model: &Model, s: RandomSampling) -> BTreeMap<(u32, u32), f64> {
    let mut out = BTreeMap::new();
    let mut cache = common::cache(model);
    let first = model.forward(&PROMPT, cache.as_mut(), Want::Last).unwrap();
    let d0 = s.distribution(first.last_logits());
    for (&t0, &p0) in d0.tokens.iter().zip(&d0.probs) {
        let mut c = common::cache(model);
        let mut ctx = PROMPT.to_vec();
        ctx.push(t0);
        let next = model.forward(&ctx, c.as_mut(), Want::Last).unwrap();
        let d1 = s.distribution(next.last_logits());
        for (&t1, &p1) in d1.tokens.iter().zip(&d1.probs) {
            *out.entry((t0, t1)).or_default() += p0 as f64 * p1 as f64;
        }
    }
    out
}

/// Pearson's statistic of `counts` against `expected` probabilities (bins with an expected
/// count under 5 pooled), and its degrees of freedom.
fn chi_square(
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
fn critical(df: usize) -> f64 {
    let k = df as f64;
    let z = 3.09;
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

#[test]
fn ratio_rule_matches_plain_sampling_in_distribution() {
    let target = common::tiny("llama");
    let draft_model = common::tiny("qwen3");
    let expected = exact_pairs(&target, sampling(0));
    let mut counts = BTreeMap::<(u32, u32), u64>::new();
    let factory = CacheFactory::contiguous();
    let mut proposer = DraftModel::new(
        common::tiny("qwen3"),
        &factory,
        DraftSampling::Random(RandomSampling {
            seed: 99,
            ..sampling(0)
        }),
    );
    for seed in 0..SAMPLES {
        let mut cache = common::cache(&target);
        let sampler = Sampler::new(Sampling::Random(sampling(seed)), Penalties::default());
        let mut d = SpecDecoder::new(&target, cache.as_mut(), &PROMPT, sampler, 64).unwrap();
        d.step(&mut proposer, 2, 2, &|_| false).unwrap();
        let g = d.generated();
        *counts.entry((g[0], g[1])).or_default() += 1;
    }
    let (stat, df) = chi_square(&counts, &expected, SAMPLES as f64);
    let crit = critical(df);
    assert!(stat < crit, "chi-square {stat:.1} over {crit:.1} (df {df})");

    // The same threshold rejects the draft's own distribution: a rule that accepted every
    // draft token would produce t1 from q, not p.
    let s = sampling(0);
    let q_pairs: BTreeMap<(u32, u32), f64> = expected
        .keys()
        .map(|&(t0, _)| t0)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .flat_map(|t0| {
            let p0: f64 = expected
                .iter()
                .filter(|(k, _)| k.0 == t0)
                .map(|(_, p)| p)
                .sum();
            let mut c = common::cache(&draft_model);
            let mut ctx = PROMPT.to_vec();
            ctx.push(t0);
            let out = draft_model.forward(&ctx, c.as_mut(), Want::Last).unwrap();
            let q = s.distribution(out.last_logits());
            q.tokens
                .into_iter()
                .zip(q.probs)
                .map(move |(t1, q1)| ((t0, t1), p0 * q1 as f64))
        })
        .collect();
    let as_counts: BTreeMap<(u32, u32), u64> = q_pairs
        .iter()
        .map(|(k, p)| (*k, (p * SAMPLES as f64).round() as u64))
        .collect();
    let (wrong, _) = chi_square(&as_counts, &expected, SAMPLES as f64);
    assert!(
        wrong > 10.0 * crit,
        "the test has no power: {wrong:.1} vs {crit:.1}"
    );
}

#[test]
fn deterministic_drafts_reproduce_plain_sampling_exactly() {
    let target = common::tiny("llama");
    let prompt: Vec<u32> = [5u32, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6].to_vec();
    for seed in 0..20 {
        let s = Sampling::Random(RandomSampling {
            temperature: 0.7,
            top_k: 0,
            top_p: 0.95,
            min_p: 0.0,
            seed,
        });
        let mut cache = common::cache(&target);
        let mut g = Generator::new(
            &target,
            cache.as_mut(),
            &prompt,
            Sampler::new(s, Penalties::default()),
            64,
        )
        .unwrap();
        for _ in 0..20 {
            g.step().unwrap();
        }
        let want = g.generated().to_vec();
        for depth in 1..=3 {
            let mut greedy_draft = DraftModel::new(
                common::tiny("llama"),
                &CacheFactory::contiguous(),
                DraftSampling::Greedy,
            );
            let mut lookup = PromptLookup::default();
            let proposers: [&mut dyn mtplx_spec::Proposer; 2] = [&mut greedy_draft, &mut lookup];
            for p in proposers {
                let mut cache = common::cache(&target);
                let sampler = Sampler::new(s, Penalties::default());
                let mut d =
                    SpecDecoder::new(&target, cache.as_mut(), &prompt, sampler, 64).unwrap();
                let mut policy = mtplx_spec::DepthPolicy::fixed(depth);
                mtplx_spec::generate(&mut d, p, &mut policy, 20, &|_| false).unwrap();
                assert_eq!(
                    d.generated(),
                    want,
                    "seed {seed} depth {depth} {}",
                    p.name()
                );
            }
        }
    }
}
