//! Issue 9 for a hybrid (recurrent) model: after a prompt, the logits and the tokens that
//! follow (greedy, and seeded at temperature 0.8) are bit-identical whichever way the
//! prompt arrived: a cold prefill in chunks of 1, 7 or 64, a rollback to the checkpoint at
//! the end of an earlier prompt or to one on the checkpoint grid followed by a prefill of
//! the rest, or a checkpoint restored into a new cache of another layout; and in every KV
//! layout, for each K/V element type (f32, f16, bf16). Checkpoints land on the grid and at the end of each prompt whatever the chunks,
//! and hold the same bits.

use mtplx_kv::{CheckpointPolicy, Sequence};
use mtplx_model::LanguageModel as _;
use std::num::NonZeroUsize;

use mtplx_kv::{CacheFactory, KvDtype, Layout};
use mtplx_model::hybrid::{HybridConfig, HybridModel, HybridWeights};
use mtplx_model::sampling::{Penalties, RandomSampling, Sampler, Sampling};
use mtplx_model::Want;

/// Checkpoints every this many tokens.
const EVERY: usize = 16;
/// Tokens decoded after each prompt.
const DECODE: usize = 24;

fn model() -> HybridModel {
    // Attention heads of 32 values: whole groups of the quantized K/V types.
    let config = HybridConfig {
        head_dim: 32,
        ..HybridConfig::tiny()
    };
    let m = HybridModel::new(config.clone(), &HybridWeights::random(&config, 5)).unwrap();
    assert!(m.is_batch_invariant());
    m
}

fn policy() -> CheckpointPolicy {
    CheckpointPolicy::Every(NonZeroUsize::new(EVERY).unwrap())
}

/// Every layout, storing K/V as `dtype`.
fn layouts(dtype: KvDtype) -> Vec<(&'static str, CacheFactory)> {
    vec![
        ("contiguous", CacheFactory::contiguous()),
        ("paged", CacheFactory::paged()),
        ("segmented", Layout::Segmented { segment_tokens: 32 }.into()),
    ]
    .into_iter()
    .map(|(name, f)| (name, f.with_dtype(dtype).unwrap()))
    .collect()
}

/// Prompts of several lengths (none on the checkpoint grid) from a fixed xorshift stream.
fn prompts(vocab: usize) -> Vec<Vec<u32>> {
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    [45usize, 131, 301]
        .iter()
        .map(|&n| {
            (0..n)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed % vocab as u64) as u32
                })
                .collect()
        })
        .collect()
}

fn samplers() -> Vec<(&'static str, Sampler)> {
    let random = RandomSampling {
        temperature: 0.8,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 42,
    };
    vec![
        ("greedy", Sampler::greedy()),
        (
            "seeded",
            Sampler::new(Sampling::Random(random), Penalties::default()),
        ),
    ]
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// What came out after the prompt: the prompt's last logits, then each decoded token and
/// the logits of the step that consumed it.
#[derive(Debug, PartialEq)]
struct Trace {
    logits: Vec<Vec<u32>>,
    tokens: Vec<u32>,
}

fn decode(
    model: &HybridModel,
    cache: &mut Sequence,
    prompt: &[u32],
    last_logits: &[f32],
    mut sampler: Sampler,
) -> Trace {
    let mut trace = Trace {
        logits: vec![bits(last_logits)],
        tokens: Vec::new(),
    };
    let mut logits = last_logits.to_vec();
    for _ in 0..DECODE {
        let t = sampler.sample(&logits, prompt, &trace.tokens);
        trace.tokens.push(t);
        logits = model
            .forward(&[t], cache, Want::Last)
            .unwrap()
            .last_logits()
            .to_vec();
        trace.logits.push(bits(&logits));
    }
    trace
}

/// How the prompt reaches the model.
#[derive(Debug, Clone, Copy)]
enum Arrival {
    /// A cold prefill in chunks of this many tokens.
    Cold(usize),
    /// An earlier turn's prompt (the first `2/3`), decoded on, then rolled back to the
    /// checkpoint at that prompt's end; the rest prefilled in chunks of 7.
    RollbackToPromptEnd,
    /// The same, rolled back one token further, onto the checkpoint grid.
    RollbackToGrid,
    /// The newest grid checkpoint of an earlier turn, with its K/V rows, restored into a
    /// new cache of the layout at hand (built in the contiguous layout).
    RestoreIntoNewCache,
}

fn earlier_turn(model: &HybridModel, prompt: &[u32], factory: &CacheFactory) -> (Sequence, usize) {
    let mut cache = Sequence::new(factory, &model.config().state_shape()).with_policy(policy());
    let m = prompt.len() * 2 / 3;
    let out = mtplx_model::prefill(model, &prompt[..m], &mut cache, 7).unwrap();
    // The earlier turn's answer, which the new prompt does not share.
    decode(
        model,
        &mut cache,
        &prompt[..m],
        out.last_logits(),
        Sampler::greedy(),
    );
    (cache, m)
}

/// Brings `prompt` into a cache of `factory`'s layout as `how` says; returns the cache and
/// the prompt's last logits.
fn arrive(
    model: &HybridModel,
    prompt: &[u32],
    factory: &CacheFactory,
    how: Arrival,
) -> (Sequence, Vec<f32>) {
    let (mut cache, from) = match how {
        Arrival::Cold(chunk) => {
            let mut cache =
                Sequence::new(factory, &model.config().state_shape()).with_policy(policy());
            let out = mtplx_model::prefill(model, prompt, &mut cache, chunk).unwrap();
            return (cache, out.last_logits().to_vec());
        }
        Arrival::RollbackToPromptEnd => {
            let (mut cache, m) = earlier_turn(model, prompt, factory);
            let at = cache.rewind(m).unwrap();
            assert_eq!(at, m, "the earlier prompt's end is a checkpoint");
            (cache, at)
        }
        Arrival::RollbackToGrid => {
            let (mut cache, m) = earlier_turn(model, prompt, factory);
            let at = cache.rewind(m - 1).unwrap();
            // The newest below: on the grid or at the end of one of the prefill's chunks.
            let below = ((m - 1) / EVERY * EVERY).max((m - 1) / 7 * 7);
            assert_eq!(at, below, "the checkpoint below");
            (cache, at)
        }
        Arrival::RestoreIntoNewCache => {
            // Another layout, the same element type (rows of another type are other values).
            let contiguous = CacheFactory::contiguous()
                .with_dtype(factory.dtype())
                .unwrap();
            let (source, m) = earlier_turn(model, prompt, &contiguous);
            let cp = source
                .checkpoints()
                .unwrap()
                .iter()
                .rev()
                .find(|c| c.position < m)
                .unwrap()
                .clone();
            assert_eq!(cp.position, ((m - 1) / EVERY * EVERY).max((m - 1) / 7 * 7));
            let kv = factory
                .restore(&*source.kv().snapshot(), cp.position)
                .unwrap();
            let shape = model.config().state_shape();
            let cache = Sequence::from_parts(&shape, kv, Some(cp.state.to_state()))
                .unwrap()
                .with_policy(policy());
            (cache, cp.position)
        }
    };
    assert_eq!(cache.len(), from);
    let out = mtplx_model::prefill(model, &prompt[from..], &mut cache, 7).unwrap();
    (cache, out.last_logits().to_vec())
}

#[test]
fn tokens_and_logits_do_not_depend_on_how_the_prompt_arrived_or_the_layout() {
    let model = model();
    let arrivals = [
        Arrival::Cold(64),
        Arrival::Cold(7),
        Arrival::Cold(1),
        Arrival::RollbackToPromptEnd,
        Arrival::RollbackToGrid,
        Arrival::RestoreIntoNewCache,
    ];
    for (prompt, dtype) in prompts(model.config().vocab_size)
        .into_iter()
        .flat_map(|p| KvDtype::ALL.map(|d| (p.clone(), d)))
    {
        for (sname, sampler) in samplers() {
            let mut reference: Option<Trace> = None;
            for (lname, factory) in layouts(dtype) {
                for how in arrivals {
                    let (mut cache, logits) = arrive(&model, &prompt, &factory, how);
                    let trace = decode(&model, &mut cache, &prompt, &logits, sampler.clone());
                    match &reference {
                        None => reference = Some(trace),
                        Some(want) => {
                            let differ = (trace.logits.iter().flatten())
                                .zip(want.logits.iter().flatten())
                                .filter(|(a, b)| a != b)
                                .count();
                            assert_eq!(
                                differ,
                                0,
                                "prompt of {}, {dtype} K/V, {sname}, {lname}, {how:?}: {differ} \
                                 logits differ",
                                prompt.len()
                            );
                            assert_eq!(&trace, want, "{dtype}, {sname}, {lname}, {how:?}");
                        }
                    }
                }
            }
            let tokens = &reference.unwrap().tokens;
            let distinct = tokens
                .iter()
                .collect::<std::collections::HashSet<_>>()
                .len();
            assert!(
                distinct > 3,
                "{sname}: a degenerate continuation {tokens:?}"
            );
        }
    }
}

#[test]
fn checkpoints_land_on_the_grid_and_the_prompt_end_with_the_same_bits_whatever_the_chunks() {
    let model = model();
    let prompt = &prompts(model.config().vocab_size)[1];
    let grid: Vec<usize> = (1..=prompt.len() / EVERY)
        .map(|i| i * EVERY)
        .chain([prompt.len()])
        .collect();
    let mut reference: Option<Vec<Vec<u32>>> = None;
    for chunk in [1, 5, 16, 64, prompt.len()] {
        // The grid's, and the prefill's at the end of every chunk.
        let mut want: Vec<usize> = (1..=prompt.len() / chunk)
            .map(|i| i * chunk)
            .chain(grid.iter().copied())
            .collect();
        want.sort_unstable();
        want.dedup();
        let mut cache = Sequence::new(&CacheFactory::paged(), &model.config().state_shape())
            .with_policy(policy());
        mtplx_model::prefill(&model, prompt, &mut cache, chunk).unwrap();
        let at: Vec<usize> = cache
            .checkpoints()
            .unwrap()
            .iter()
            .map(|c| c.position)
            .collect();
        assert_eq!(at, want, "chunks of {chunk}");
        let states: Vec<Vec<u32>> = cache
            .checkpoints()
            .unwrap()
            .iter()
            .filter(|c| grid.contains(&c.position))
            .flat_map(|c| {
                assert_eq!(c.state.tokens(), c.position);
                (0..c.state.layers()).flat_map(|l| {
                    [
                        bits(c.state.conv(l).unwrap()),
                        bits(c.state.ssm(l).unwrap()),
                    ]
                })
            })
            .collect();
        match &reference {
            None => reference = Some(states),
            Some(r) => assert!(r == &states, "chunks of {chunk}: checkpoint bits differ"),
        }
    }
}
