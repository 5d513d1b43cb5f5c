//! Issue 9 for speculation on the default model's native (kernel) path: greedy, and seeded
//! sampling at temperature > 0, give the tokens of plain decoding and bit-identical KV for
//! every deterministic proposer (prompt lookup, the shipped MTP head, lookup then MTP, a
//! draft model drafting greedily) at every depth 1-4, in every KV layout and whatever the
//! prefill chunk. Random drafts (`DraftSampling::Random`, verified by the `min(1, p/q)`
//! rule) are lossless only in distribution (`sampling_lossless.rs`, `mtp.rs`): their tokens
//! depend on the drafts, but still not on the layout or the prefill chunk.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use mtplx_kv::CacheFactory;
use mtplx_model::mtp::{MtpHead, Vocab};
use mtplx_model::sampling::{Penalties, RandomSampling, Sampler, Sampling};
use mtplx_model::{Bundle, Generator, Model, WeightFormat};
use mtplx_spec::{
    generate, DepthPolicy, DraftModel, DraftSampling, LookupThenMtp, MtpProposer, PromptHidden,
    PromptLookup, Proposer, SpecDecoder,
};

const NEW_TOKENS: usize = 16;

fn bundle() -> Bundle {
    let b = Bundle::load(&common::default_path(), WeightFormat::Native).unwrap();
    assert!(b.model.is_batch_invariant());
    b
}

fn head(trunk: &dyn mtplx_model::LanguageModel) -> Arc<MtpHead> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/mtp/smollm2-135m-mtp.safetensors");
    Arc::new(MtpHead::load(&path, trunk, Vocab::FromFile).unwrap())
}

fn seeded(seed: u64) -> Sampler {
    Sampler::new(
        Sampling::Random(RandomSampling {
            temperature: 0.8,
            top_k: 0,
            top_p: 0.95,
            min_p: 0.0,
            seed,
        }),
        Penalties::default(),
    )
}

/// Greedy, and a seed at temperature 0.8.
fn samplers() -> [(&'static str, Sampler); 2] {
    [("greedy", Sampler::greedy()), ("seed 7", seeded(7))]
}

/// Generated tokens and the KV's bits after plain decoding.
fn plain(
    model: &dyn mtplx_model::LanguageModel,
    factory: &CacheFactory,
    prompt: &[u32],
    sampler: Sampler,
    chunk: usize,
) -> (Vec<u32>, Vec<u32>) {
    let mut cache = model.new_sequence(factory);
    let mut g = Generator::new(model, &mut cache, prompt, sampler, chunk).unwrap();
    for _ in 0..NEW_TOKENS {
        g.step().unwrap();
    }
    let tokens = g.generated().to_vec();
    drop(g);
    (tokens, common::kv_bits(cache.kv()))
}

/// Generated tokens, the KV's bits and the draft tokens accepted after speculative decoding.
#[allow(clippy::too_many_arguments)]
fn speculative(
    model: &dyn mtplx_model::LanguageModel,
    factory: &CacheFactory,
    prompt: &[u32],
    sampler: Sampler,
    chunk: usize,
    hidden: PromptHidden,
    proposer: &mut dyn Proposer,
    depth: usize,
) -> (Vec<u32>, Vec<u32>, usize) {
    let mut cache = model.new_sequence(factory);
    let mut d =
        SpecDecoder::with_prompt_hidden(model, &mut cache, prompt, sampler, chunk, hidden).unwrap();
    let mut policy = DepthPolicy::fixed(depth);
    generate(&mut d, proposer, &mut policy, NEW_TOKENS, &|_| false).unwrap();
    let tokens = d.generated().to_vec();
    let accepted = d.stats.accepted_by_depth.iter().sum::<u64>() as usize;
    drop(d);
    (tokens, common::kv_bits(cache.kv()), accepted)
}

fn same_bits(got: &[u32], want: &[u32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: KV length");
    let differ = got.iter().zip(want).filter(|(a, b)| a != b).count();
    assert_eq!(differ, 0, "{what}: {differ} KV values differ in their bits");
}

#[test]
fn every_deterministic_proposer_and_depth_gives_plain_tokens_greedy_and_seeded() {
    let b = bundle();
    let model = &*b.model;
    let head = head(model);
    let factory = CacheFactory::contiguous();
    // Drafting greedily for itself: accepted at temperature 0, often rejected when sampling.
    let mut draft = DraftModel::new(
        Model::load(&common::default_path(), WeightFormat::Native).unwrap(),
        &factory,
        DraftSampling::Greedy,
    );
    let mut accepted = std::collections::BTreeMap::<&str, usize>::new();
    for prompt in common::prompts(&b) {
        for (name, sampler) in samplers() {
            let (want, want_kv) = plain(model, &factory, &prompt, sampler.clone(), 64);
            for depth in 1..=4 {
                let mut lookup = PromptLookup::default();
                let mut mtp =
                    MtpProposer::new(model, head.clone(), &factory, DraftSampling::Greedy);
                let mut both = LookupThenMtp::new(MtpProposer::new(
                    model,
                    head.clone(),
                    &factory,
                    DraftSampling::Greedy,
                ));
                let proposers: [(&mut dyn Proposer, PromptHidden); 4] = [
                    (&mut lookup, PromptHidden::Last),
                    (&mut mtp, PromptHidden::All),
                    (&mut both, PromptHidden::Last),
                    (&mut draft, PromptHidden::Last),
                ];
                for (p, hidden) in proposers {
                    let what = format!("{name}, {} depth {depth}", p.name());
                    let (got, kv, acc) = speculative(
                        model,
                        &factory,
                        &prompt,
                        sampler.clone(),
                        64,
                        hidden,
                        p,
                        depth,
                    );
                    assert_eq!(got, want, "{what}");
                    same_bits(&kv, &want_kv, &what);
                    *accepted.entry(p.name()).or_default() += acc;
                }
            }
        }
    }
    // Every proposer had drafts accepted, so the verify path was exercised, not only the
    // model's own token after an empty or rejected draft.
    for name in ["lookup", "mtp", "lookup+mtp", "draft_model"] {
        assert!(
            accepted.get(name).copied().unwrap_or(0) > 0,
            "{name} never had a draft accepted: {accepted:?}"
        );
    }
}

#[test]
fn seeded_tokens_do_not_depend_on_the_layout_or_the_prefill_chunk() {
    let b = bundle();
    let model = &*b.model;
    let head = head(model);
    let prompt = &common::prompts(&b)[0];
    let layouts = [
        ("contiguous", CacheFactory::contiguous()),
        ("paged", CacheFactory::paged()),
        ("segmented", CacheFactory::segmented()),
    ];
    let sampler = seeded(7);
    let (want, want_kv) = plain(model, &layouts[0].1, prompt, sampler.clone(), 512);
    for (layout, factory) in &layouts {
        for chunk in [1, 7, 64, 512] {
            let what = format!("{layout}, chunk {chunk}");
            let (got, kv) = plain(model, factory, prompt, sampler.clone(), chunk);
            assert_eq!(got, want, "plain, {what}");
            same_bits(&kv, &want_kv, &format!("plain, {what}"));
            let mut both = LookupThenMtp::new(MtpProposer::new(
                model,
                head.clone(),
                factory,
                DraftSampling::Greedy,
            ));
            let (got, kv, _) = speculative(
                model,
                factory,
                prompt,
                sampler.clone(),
                chunk,
                PromptHidden::All,
                &mut both,
                3,
            );
            assert_eq!(got, want, "lookup+mtp, {what}");
            same_bits(&kv, &want_kv, &format!("lookup+mtp, {what}"));
        }
    }
}

/// Random drafts are verified by the ratio rule, which spends the seed's draws differently
/// from plain sampling: their tokens are lossless in distribution, not equal to plain
/// sampling's. They still do not depend on the layout or on how the prompt was chunked.
#[test]
fn random_drafts_do_not_depend_on_the_layout_or_the_prefill_chunk() {
    let b = bundle();
    let model = &*b.model;
    let head = head(model);
    let prompt = &common::prompts(&b)[0];
    let draft_sampling = DraftSampling::Random(RandomSampling {
        temperature: 0.8,
        top_k: 0,
        top_p: 0.95,
        min_p: 0.0,
        seed: 99,
    });
    let mut want = None;
    for (layout, factory) in [
        ("contiguous", CacheFactory::contiguous()),
        ("paged", CacheFactory::paged()),
        ("segmented", CacheFactory::segmented()),
    ] {
        for chunk in [1, 7, 64, 512] {
            let mut mtp = MtpProposer::new(model, head.clone(), &factory, draft_sampling);
            let got = speculative(
                model,
                &factory,
                prompt,
                seeded(7),
                chunk,
                PromptHidden::All,
                &mut mtp,
                3,
            );
            match &want {
                None => {
                    assert!(got.2 > 0, "no random draft was accepted");
                    want = Some(got);
                }
                Some(w) => {
                    let what = format!("random mtp, {layout}, chunk {chunk}");
                    assert_eq!(got.0, w.0, "{what}");
                    same_bits(&got.1, &w.1, &what);
                }
            }
        }
    }
}
