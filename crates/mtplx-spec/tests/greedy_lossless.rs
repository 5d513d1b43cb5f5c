//! Greedy speculative output equals plain decoding token for token, for every proposer and
//! depth, and the KV after rollback equals plain decoding's bit for bit: the models run on
//! the native (kernel) weights, whose rows do not depend on the batch (issue 9), so a
//! verify block of k+1 rows computes exactly what k+1 decode steps compute.

mod common;

use mtplx_model::sampling::Sampler;
use mtplx_model::tokenizer::Special;
use mtplx_model::{Model, WeightFormat};
use mtplx_spec::{
    generate, DepthPolicy, DraftModel, DraftSampling, PromptLookup, Proposer, SpecDecoder,
};

fn speculative(
    model: &Model,
    prompt: &[u32],
    n: usize,
    proposer: &mut dyn Proposer,
    policy: &mut DepthPolicy,
) -> (Vec<u32>, Vec<u32>, mtplx_spec::SpecStats) {
    let mut cache = common::cache(model);
    let mut d = SpecDecoder::new(model, &mut cache, prompt, Sampler::greedy(), 64).unwrap();
    generate(&mut d, proposer, policy, n, &|_| false).unwrap();
    let tokens = d.generated().to_vec();
    let stats = d.stats.clone();
    drop(d);
    (tokens, common::kv_bits(cache.kv()), stats)
}

fn check_all(target: &Model, draft: impl Fn() -> Model, prompts: &[Vec<u32>], n: usize) {
    for prompt in prompts {
        let (want, want_kv) = common::plain_greedy(target, prompt, n);
        for depth in 1..=4 {
            let mut proposers: Vec<Box<dyn Proposer>> = vec![
                Box::new(PromptLookup::default()),
                Box::new(DraftModel::new(
                    draft(),
                    &mtplx_kv::CacheFactory::contiguous(),
                    DraftSampling::Greedy,
                )),
            ];
            for p in proposers.iter_mut() {
                let mut policy = DepthPolicy::fixed(depth);
                let (got, kv, stats) = speculative(target, prompt, n, p.as_mut(), &mut policy);
                assert_eq!(got, want, "{} depth {depth}", p.name());
                assert_eq!(
                    kv.len(),
                    want_kv.len(),
                    "{} depth {depth}: KV length",
                    p.name()
                );
                let differ = kv.iter().zip(&want_kv).filter(|(a, b)| a != b).count();
                assert_eq!(
                    differ,
                    0,
                    "{} depth {depth}: {differ} KV values differ in their bits",
                    p.name()
                );
                assert!(stats.verify_calls > 0 || p.name() == "lookup");
            }
        }
        // Adaptive policies too.
        for mut policy in [
            DepthPolicy::Streak { depth: 2, max: 4 },
            DepthPolicy::ExpectedValue(mtplx_spec::Acceptance::with_priors(3)),
            DepthPolicy::cost(3),
            DepthPolicy::by_source(DepthPolicy::cost(3)),
        ] {
            let mut p = PromptLookup::default();
            let (got, _, _) = speculative(target, prompt, n, &mut p, &mut policy);
            assert_eq!(got, want, "{policy:?}");
        }
    }
}

/// A tiny Hugging Face test model on the native (kernel) path.
fn tiny(arch: &str) -> Model {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(arch);
    let m = Model::load(&dir, WeightFormat::Native).unwrap();
    assert!(m.is_batch_invariant());
    m
}

/// The default model on the native (kernel) path.
fn default_model() -> Model {
    let m = Model::load(&common::default_path(), WeightFormat::Native).unwrap();
    assert!(m.is_batch_invariant());
    m
}

#[test]
fn tiny_models_every_proposer_and_depth() {
    let target = tiny("llama");
    // A repetitive prompt so lookup drafts get accepted, and a varied one.
    let prompts = vec![
        [5u32, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6].to_vec(),
        (0..40).map(|i| (i * 37 % 300) as u32).collect(),
    ];
    // The target drafting for itself (all accepted) and another model (mostly rejected).
    check_all(&target, || tiny("llama"), &prompts, 24);
    check_all(&target, || tiny("qwen3"), &prompts[..1], 24);
}

#[test]
fn default_model_every_proposer_and_depth() {
    let target = default_model();
    let bundle = common::default_bundle();
    let code = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef add(";
    let prompt = bundle.tokenizer.encode(code, Special::AsText).unwrap();
    // Lookup copies from the code; the model drafting for itself is always accepted.
    check_all(&target, default_model, &[prompt], 12);
    assert_eq!(target.config().vocab_size, 49152);
}
