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

use common::stats::{chi_square, critical, exact_pairs, sampling, PROMPT, SAMPLES};

use std::collections::BTreeMap;

use mtplx_kv::CacheFactory;
use mtplx_model::sampling::{Penalties, RandomSampling, Sampler, Sampling};
use mtplx_model::{Generator, LanguageModel, Want};
use mtplx_spec::{DraftModel, DraftSampling, PromptLookup, SpecDecoder};

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
        let mut d = SpecDecoder::new(&target, &mut cache, &PROMPT, sampler, 64).unwrap();
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
            let out = draft_model.forward(&ctx, &mut c, Want::Last).unwrap();
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
            &mut cache,
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
                let mut d = SpecDecoder::new(&target, &mut cache, &prompt, sampler, 64).unwrap();
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
