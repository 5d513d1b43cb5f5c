//! Property: however a prompt is split into forward passes, and in whichever KV layout, the
//! hybrid model ends in the same state bit for bit: every row's logits, every recurrent
//! buffer (convolution and delta-rule state), every K/V row, and the checkpoints.

use mtplx_kv::{CheckpointPolicy, Sequence};
use mtplx_model::LanguageModel as _;
use std::num::NonZeroUsize;

use mtplx_kv::CacheFactory;
use mtplx_model::hybrid::{HybridConfig, HybridModel, HybridWeights};
use mtplx_model::Want;
use proptest::prelude::*;

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Everything the cache and the forward passes produced, as bits.
#[derive(Debug, PartialEq)]
struct State {
    logits: Vec<u32>,
    recurrent: Vec<Vec<u32>>,
    kv: Vec<Vec<u32>>,
    checkpoints: Vec<(usize, Vec<u32>)>,
}

fn run(model: &HybridModel, prompt: &[u32], splits: &[usize], factory: &CacheFactory) -> State {
    let c = model.config();
    let policy = CheckpointPolicy::Every(NonZeroUsize::new(8).unwrap());
    let mut cache = Sequence::new(factory, &c.state_shape()).with_policy(policy);
    let mut logits = Vec::new();
    let mut start = 0;
    for &len in splits.iter().chain([&prompt.len()]) {
        let end = (start + len).min(prompt.len());
        if end > start {
            let out = model
                .forward(&prompt[start..end], &mut cache, Want::All)
                .unwrap();
            assert_eq!(out.rows, end - start);
            logits.extend(bits(&out.logits));
        }
        start = end;
    }
    let r = cache.recurrent().unwrap();
    assert_eq!(r.tokens(), prompt.len());
    let recurrent = (0..r.layers())
        .flat_map(|l| [bits(r.conv(l).unwrap()), bits(r.ssm(l).unwrap())])
        .collect();
    let kv_view = cache.kv();
    let row = c.kv_shape().row_len();
    let kv = (0..c.kv_shape().layers)
        .map(|l| {
            let (mut k, mut v) = (
                vec![0f32; prompt.len() * row],
                vec![0f32; prompt.len() * row],
            );
            kv_view
                .read_rows(l, 0..prompt.len(), &mut k, &mut v)
                .unwrap();
            bits(&k).into_iter().chain(bits(&v)).collect()
        })
        .collect();
    let checkpoints = cache
        .checkpoints()
        .unwrap()
        .iter()
        .map(|cp| {
            let s = &cp.state;
            let all = (0..s.layers())
                .flat_map(|l| {
                    bits(s.conv(l).unwrap())
                        .into_iter()
                        .chain(bits(s.ssm(l).unwrap()))
                })
                .collect();
            (cp.position, all)
        })
        .collect();
    State {
        logits,
        recurrent,
        kv,
        checkpoints,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_chunk_splits_give_identical_state_bits(
        prompt in prop::collection::vec(0u32..256, 1..100),
        splits in prop::collection::vec(1usize..40, 0..12),
        layout in 0usize..3,
    ) {
        let config = HybridConfig::tiny();
        let model = HybridModel::new(config.clone(), &HybridWeights::random(&config, 3)).unwrap();
        let factory = [
            CacheFactory::contiguous(),
            CacheFactory::paged(),
            mtplx_kv::Layout::Segmented { segment_tokens: 16 }.into(),
        ][layout].clone();
        let whole = run(&model, &prompt, &[], &CacheFactory::contiguous());
        let split = run(&model, &prompt, &splits, &factory);
        prop_assert_eq!(whole.checkpoints.len(), prompt.len() / 8);
        prop_assert!(whole == split, "splits {:?} in layout {}", splits, layout);
    }
}
