//! The MTP proposer: the head loads from `mtp.*` safetensors, greedy speculation with it
//! equals plain decoding token for token (tiny synthetic head and the shipped head of the
//! default model), and random MTP drafts keep sampling lossless.

mod common;

use common::stats::{chi_square, critical, exact_pairs, sampling, PROMPT, SAMPLES};
use mtplx_model::tokenizer::Special;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mtplx_kv::CacheFactory;
use mtplx_model::mtp::{self, tensor_name, MtpHead, Vocab};
use mtplx_model::sampling::{Penalties, RandomSampling, Rng, Sampler, Sampling};
use mtplx_model::source::TensorRole;
use mtplx_model::{Model, ModelConfig, ModelError};
use mtplx_spec::{
    generate, DepthPolicy, DraftContext, DraftSampling, DraftSource, LookupThenMtp, MtpProposer,
    PromptHidden, PromptLookup, Proposer, SpecDecoder,
};

/// Writes a random `mtp.*` head for `c` (f32), with a shortlist when given.
fn write_head(path: &Path, c: &ModelConfig, seed: u64, shortlist: Option<&[u32]>, skip: &str) {
    let (h, hd) = (c.hidden_size, c.head_dim);
    let (qd, kvd, ff) = (c.num_heads * hd, c.num_kv_heads * hd, c.intermediate_size);
    let mut rng = Rng::new(seed);
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, around_one: bool| {
        let n: usize = shape.iter().product();
        let bytes = (0..n)
            .flat_map(|_| {
                let u = rng.uniform() as f32 - 0.5;
                let v = if around_one { 1.0 + 0.4 * u } else { 0.4 * u };
                v.to_le_bytes()
            })
            .collect();
        tensors.push((name, shape, bytes));
    };
    add(mtp::FC.into(), vec![h, 2 * h], false);
    for (role, shape) in [
        (TensorRole::Q, [qd, h]),
        (TensorRole::K, [kvd, h]),
        (TensorRole::V, [kvd, h]),
        (TensorRole::O, [h, qd]),
        (TensorRole::Gate, [ff, h]),
        (TensorRole::Up, [ff, h]),
        (TensorRole::Down, [h, ff]),
    ] {
        add(tensor_name(role), shape.to_vec(), false);
    }
    for name in [
        mtp::NORM_EMBEDDING.to_string(),
        mtp::NORM_HIDDEN.to_string(),
        tensor_name(TensorRole::AttnNorm),
        tensor_name(TensorRole::FfnNorm),
        tensor_name(TensorRole::FinalNorm),
    ] {
        add(name, vec![h], true);
    }
    let ids: Vec<u8> = shortlist
        .unwrap_or(&[])
        .iter()
        .flat_map(|t| t.to_le_bytes())
        .collect();
    if let Some(s) = shortlist {
        tensors.push((mtp::SHORTLIST.into(), vec![s.len()], ids));
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .filter(|(name, _, _)| name != skip)
        .map(|(name, shape, bytes)| {
            let dtype = if name == mtp::SHORTLIST {
                safetensors::Dtype::U32
            } else {
                safetensors::Dtype::F32
            };
            let view = safetensors::tensor::TensorView::new(dtype, shape.clone(), bytes).unwrap();
            (name.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

fn tiny_head(trunk: &Model, dir: &Path, shortlist: Option<&[u32]>) -> Arc<MtpHead> {
    let path = dir.join("head.safetensors");
    write_head(&path, trunk.config(), 11, shortlist, "");
    Arc::new(MtpHead::load(&path, trunk, Vocab::FromFile).unwrap())
}

#[test]
fn head_loads_from_mtp_safetensors_and_names_what_is_wrong() {
    let trunk = common::tiny("llama");
    let c = trunk.config().clone();
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u32> = (0..c.vocab_size as u32).step_by(2).collect();
    let head = tiny_head(&trunk, dir.path(), Some(&ids));
    assert_eq!(head.shortlist(), Some(&ids[..]));
    assert_eq!(head.out_rows(), ids.len());
    assert_eq!(head.token_of(3), 6);
    let full = MtpHead::load(&dir.path().join("head.safetensors"), &trunk, Vocab::Full).unwrap();
    assert_eq!((full.out_rows(), full.shortlist()), (c.vocab_size, None));
    let top = MtpHead::load(&dir.path().join("head.safetensors"), &trunk, Vocab::Top(7)).unwrap();
    assert_eq!(top.shortlist(), Some(&ids[..7]));

    // The head's output rows are the trunk's tied embedding: with the shortlist, the scores
    // of a row are the full head's scores of that token.
    let mut cache = CacheFactory::contiguous().new_cache(head.kv_shape());
    let mut cache_full = CacheFactory::contiguous().new_cache(full.kv_shape());
    let hidden: Vec<f32> = (0..c.hidden_size)
        .map(|i| (i as f32 * 0.37).sin())
        .collect();
    let x = head
        .forward(&trunk, &hidden, &[9], cache.as_mut(), 0)
        .unwrap();
    let y = full
        .forward(&trunk, &hidden, &[9], cache_full.as_mut(), 0)
        .unwrap();
    assert_eq!(x, y);
    let (ls, lf) = (head.logits(&x).unwrap(), full.logits(&y).unwrap());
    for (i, &t) in ids.iter().enumerate() {
        assert!((ls[i] - lf[t as usize]).abs() < 1e-4);
    }

    // A missing tensor and a wrong shape are reported by name.
    let missing = dir.path().join("missing.safetensors");
    write_head(&missing, &c, 1, None, mtp::NORM_HIDDEN);
    match MtpHead::load(&missing, &trunk, Vocab::FromFile) {
        Err(ModelError::MissingTensor { tensor, .. }) => assert_eq!(tensor, mtp::NORM_HIDDEN),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a head without {} loaded", mtp::NORM_HIDDEN),
    }
    let other = common::tiny("qwen3");
    let err = MtpHead::load(&dir.path().join("head.safetensors"), &other, Vocab::Full);
    assert!(
        matches!(
            err,
            Err(ModelError::TensorShape { .. }) | Err(ModelError::MissingTensor { .. })
        ),
        "a head for another geometry loaded"
    );
}

fn speculative(
    model: &dyn mtplx_model::LanguageModel,
    prompt: &[u32],
    n: usize,
    proposer: &mut dyn Proposer,
    policy: &mut DepthPolicy,
) -> (Vec<u32>, Vec<u32>, mtplx_spec::SpecStats) {
    let mut cache = common::cache(model);
    let mut d = SpecDecoder::with_prompt_hidden(
        model,
        &mut cache,
        prompt,
        Sampler::greedy(),
        16,
        PromptHidden::All,
    )
    .unwrap();
    generate(&mut d, proposer, policy, n, &|_| false).unwrap();
    let tokens = d.generated().to_vec();
    let stats = d.stats.clone();
    drop(d);
    (tokens, common::kv_bits(cache.kv()), stats)
}

fn max_diff(a: &[u32], b: &[u32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (f32::from_bits(*x) - f32::from_bits(*y)).abs())
        .fold(0f32, f32::max)
}

#[test]
fn tiny_head_greedy_equals_plain_decoding() {
    let trunk = common::tiny("llama");
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u32> = (0..200).collect();
    let heads = [tiny_head(&trunk, dir.path(), None), {
        let sub = dir.path().join("sub");
        std::fs::create_dir_all(&sub).unwrap();
        tiny_head(&trunk, &sub, Some(&ids))
    }];
    let prompts = [
        vec![5u32, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6],
        (0..40).map(|i| (i * 37 % 300) as u32).collect(),
    ];
    let factory = CacheFactory::contiguous();
    for prompt in &prompts {
        let (want, want_kv) = common::plain_greedy(&trunk, prompt, 24);
        for head in &heads {
            for depth in 1..=4 {
                let mut p = MtpProposer::new(&trunk, head.clone(), &factory, DraftSampling::Greedy);
                let (got, kv, stats) =
                    speculative(&trunk, prompt, 24, &mut p, &mut DepthPolicy::fixed(depth));
                assert_eq!(got, want, "mtp depth {depth}");
                assert_eq!(kv.len(), want_kv.len(), "mtp depth {depth}: KV length");
                assert!(max_diff(&kv, &want_kv) < 1e-4, "mtp depth {depth}: KV");
                // The head drafted at every step (the last may have room for none): its
                // observations stayed in sync with the decoder.
                assert!(stats.plain_steps <= 1, "mtp depth {depth}: {stats:?}");
                let mut both = LookupThenMtp::new(MtpProposer::new(
                    &trunk,
                    head.clone(),
                    &factory,
                    DraftSampling::Greedy,
                ));
                let (got, _, _) = speculative(
                    &trunk,
                    prompt,
                    24,
                    &mut both,
                    &mut DepthPolicy::fixed(depth),
                );
                assert_eq!(got, want, "lookup+mtp depth {depth}");
            }
            // A cost policy per draft source (the server's default) decodes the same.
            let mut both = LookupThenMtp::new(MtpProposer::new(
                &trunk,
                head.clone(),
                &factory,
                DraftSampling::Greedy,
            ));
            let mut policy = DepthPolicy::by_source(DepthPolicy::cost(3));
            let (got, _, _) = speculative(&trunk, prompt, 24, &mut both, &mut policy);
            assert_eq!(got, want, "lookup+mtp, cost by source");
        }
    }
}

/// Lookup then MTP says where its next draft would come from: the context's copy when the
/// tail repeats, the head otherwise.
#[test]
fn lookup_then_mtp_names_the_source_of_its_next_draft() {
    let trunk = common::tiny("llama");
    let dir = tempfile::tempdir().unwrap();
    let factory = CacheFactory::contiguous();
    let mut both = LookupThenMtp::new(MtpProposer::new(
        &trunk,
        tiny_head(&trunk, dir.path(), None),
        &factory,
        DraftSampling::Greedy,
    ));
    let ctx = |tokens| DraftContext { tokens, max_len: 3 };
    let repeats = [5, 6, 7, 9, 8, 5, 6];
    assert_eq!(both.next_source(&ctx(&repeats)), DraftSource::Lookup);
    assert_eq!(
        PromptLookup::default().next_source(&ctx(&repeats)),
        DraftSource::Lookup
    );
    // The draft that follows is that lookup's (cut to the depth chosen), and a context
    // that has grown since gets a lookup of its own.
    let draft = both
        .propose(&DraftContext {
            tokens: &repeats,
            max_len: 2,
        })
        .unwrap();
    assert_eq!(draft.tokens, [7, 9]);
    let grown = [5, 6, 7, 9, 8, 5, 6, 7];
    assert_eq!(both.propose(&ctx(&grown)).unwrap().tokens, [9, 8, 5]);
    let fresh = [5, 6, 7, 9, 8, 10, 11];
    assert_eq!(both.next_source(&ctx(&fresh)), DraftSource::Model);
}

/// The shipped head of the default model.
fn shipped_head() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/mtp/smollm2-135m-mtp.safetensors")
}

#[test]
fn shipped_head_greedy_equals_plain_decoding_on_the_default_model() {
    let bundle = common::default_bundle();
    let trunk = &*bundle.model;
    let head = Arc::new(MtpHead::load(&shipped_head(), trunk, Vocab::FromFile).unwrap());
    let chat = |text: &str| {
        let req = mtplx_model::chat::ChatRequest {
            messages: vec![mtplx_model::chat::ChatMessage::text(
                mtplx_model::chat::Role::User,
                text,
            )],
            add_generation_prompt: true,
            ..Default::default()
        };
        let rendered = bundle.template.as_ref().unwrap().render(&req).unwrap();
        bundle.tokenizer.encode(&rendered, Special::Parse).unwrap()
    };
    let prompts = [
        chat("Name three colours of the rainbow."),
        chat("Rename `add` to `plus`:\n\n```python\ndef add(a, b):\n    return a + b\n```"),
        bundle
            .tokenizer
            .encode("fn main() {\n    let x = 1;\n", Special::AsText)
            .unwrap(),
    ];
    let factory = CacheFactory::contiguous();
    let mut accepted = 0;
    for prompt in &prompts {
        let (want, _) = common::plain_greedy(trunk, prompt, 12);
        for depth in 1..=4 {
            let mut p = MtpProposer::new(trunk, head.clone(), &factory, DraftSampling::Greedy);
            let (got, _, stats) =
                speculative(trunk, prompt, 12, &mut p, &mut DepthPolicy::fixed(depth));
            assert_eq!(got, want, "depth {depth}");
            accepted += stats.accepted_by_depth.first().copied().unwrap_or(0);
        }
    }
    // A trained head agrees with its trunk some of the time (a random one almost never).
    assert!(
        accepted > 0,
        "the shipped head never drafted the trunk's token"
    );
}

#[test]
fn random_mtp_drafts_keep_sampling_lossless() {
    let target = common::tiny("llama");
    let dir = tempfile::tempdir().unwrap();
    // A shortlist leaves some of the target's likely tokens undraftable (q = 0 there).
    let ids: Vec<u32> = (0..target.config().vocab_size as u32).step_by(2).collect();
    let head = tiny_head(&target, dir.path(), Some(&ids));
    let expected = exact_pairs(&target, sampling(0));
    let factory = CacheFactory::contiguous();
    let mut counts = BTreeMap::<(u32, u32), u64>::new();
    let mut proposer = MtpProposer::new(
        &target,
        head,
        &factory,
        DraftSampling::Random(RandomSampling {
            seed: 99,
            ..sampling(0)
        }),
    );
    let mut drafted = 0;
    for seed in 0..SAMPLES {
        let mut cache = common::cache(&target);
        let sampler = Sampler::new(Sampling::Random(sampling(seed)), Penalties::default());
        let mut d = SpecDecoder::new(&target, &mut cache, &PROMPT, sampler, 64).unwrap();
        let step = d.step(&mut proposer, 2, 2, &|_| false).unwrap();
        drafted += step.drafted;
        let g = d.generated();
        *counts.entry((g[0], g[1])).or_default() += 1;
    }
    assert!(drafted as u64 >= SAMPLES, "the head did not draft");
    let (stat, df) = chi_square(&counts, &expected, SAMPLES as f64);
    let crit = critical(df);
    assert!(stat < crit, "chi-square {stat:.1} over {crit:.1} (df {df})");
}
