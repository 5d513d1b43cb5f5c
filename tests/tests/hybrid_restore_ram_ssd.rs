//! Issue 9 through the session bank for a hybrid (recurrent) model: a turn's state
//! committed with its recurrent checkpoints and restored from RAM, from the SSD tier (the
//! checkpoint serialised to a state blob and decoded again), or from the SSD tier after a
//! restart, then prefilled to the end of the next prompt, gives the logits and tokens of a
//! cold prefill bit for bit (greedy and seeded at temperature 0.8), in every KV layout the
//! restore builds; for a prompt that continues the stored turn (restored at its end) and for
//! one that edits its answer (restored at the checkpoint on the 256-token block boundary).

mod hybrid_support;

use std::num::NonZeroUsize;
use std::path::Path;

use hybrid_support::{bank_config, cold_store};
use mtplx_bank::{Bank, Checkpoint, Commit, LookupQuery, RestoreMode, SessionId};
use mtplx_cold::Identity;
use mtplx_kv::{CacheFactory, CheckpointPolicy, Sequence};
use mtplx_model::hybrid::{HybridConfig, HybridModel, HybridWeights};
use mtplx_model::sampling::{Penalties, RandomSampling, Sampler, Sampling};
use mtplx_model::LanguageModel as _;
use mtplx_model::Want;

const DECODE: usize = 16;

fn model() -> HybridModel {
    let config = HybridConfig::tiny();
    HybridModel::new(config.clone(), &HybridWeights::random(&config, 9)).unwrap()
}

fn policy() -> CheckpointPolicy {
    CheckpointPolicy::Every(NonZeroUsize::new(64).unwrap())
}

fn identity() -> Identity {
    hybrid_support::identity("synthetic-hybrid-seed-9")
}

fn xorshift_tokens(n: usize, seed: u64) -> Vec<u32> {
    hybrid_support::xorshift_tokens(n, seed, 256)
}

fn samplers() -> [Sampler; 2] {
    let random = RandomSampling {
        temperature: 0.8,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 7,
    };
    [
        Sampler::greedy(),
        Sampler::new(Sampling::Random(random), Penalties::default()),
    ]
}

/// The prompt's last logits and each decoded token with its step's logits, as bits.
type Trace = (Vec<Vec<u32>>, Vec<u32>);

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Prefills `prompt[cache.len()..]` and decodes [`DECODE`] tokens with `sampler`.
fn finish(model: &HybridModel, mut cache: Sequence, prompt: &[u32], mut sampler: Sampler) -> Trace {
    let out = mtplx_model::prefill(model, &prompt[cache.len()..], &mut cache, 16).unwrap();
    let mut logits = out.last_logits().to_vec();
    let (mut all, mut tokens) = (vec![bits(&logits)], Vec::new());
    for _ in 0..DECODE {
        let t = sampler.sample(&logits, prompt, &tokens);
        tokens.push(t);
        let out = model.forward(&[t], &mut cache, Want::Last).unwrap();
        logits = out.last_logits().to_vec();
        all.push(bits(&logits));
    }
    (all, tokens)
}

/// The first turn: a 600-token prompt and a 20-token greedy answer, committed with its
/// checkpoints (every 64 tokens, the prompt's end, the answer's end).
fn first_turn(model: &HybridModel) -> (Vec<u32>, Commit) {
    let mut cache = Sequence::new(&CacheFactory::contiguous(), &model.config().state_shape())
        .with_policy(policy());
    let mut tokens = xorshift_tokens(600, 1);
    let out = mtplx_model::prefill(model, &tokens, &mut cache, 64).unwrap();
    let mut next = mtplx_model::sampling::argmax(out.last_logits());
    for _ in 0..20 {
        tokens.push(next);
        let out = model.forward(&[next], &mut cache, Want::Last).unwrap();
        next = mtplx_model::sampling::argmax(out.last_logits());
    }
    cache.checkpoint();
    let checkpoints = cache
        .checkpoints()
        .unwrap()
        .iter()
        .map(|c| Checkpoint {
            position: c.position,
            state: c.state.clone(),
        })
        .collect();
    let commit = Commit {
        session: SessionId::new("turns"),
        identity: identity(),
        tokens: tokens.clone(),
        kv: cache.kv().snapshot(),
        continuation: None,
        checkpoints: Some(checkpoints),
    };
    (tokens, commit)
}

/// Where the first turn's state is when the next prompt arrives.
#[derive(Debug, Clone, Copy)]
enum Source {
    Ram,
    Ssd,
    SsdAfterRestart,
}

fn bank_holding(source: Source, commit: Commit, dir: &Path) -> Bank {
    match source {
        Source::Ram => {
            let bank = Bank::new(bank_config(10));
            bank.commit(commit).unwrap();
            bank
        }
        Source::Ssd | Source::SsdAfterRestart => {
            let bank = Bank::new(bank_config(1)).with_cold(cold_store(dir));
            bank.commit(commit).unwrap();
            // A second conversation takes the only RAM slot: the first spills to SSD.
            let other = Commit {
                session: SessionId::new("other"),
                tokens: vec![1, 2, 3],
                kv: {
                    let mut c = Sequence::new(
                        &CacheFactory::contiguous(),
                        &HybridConfig::tiny().state_shape(),
                    );
                    mtplx_model::prefill(&model(), &[1, 2, 3], &mut c, 3).unwrap();
                    c.kv().snapshot()
                },
                checkpoints: None,
                continuation: None,
                identity: identity(),
            };
            bank.commit(other).unwrap();
            assert_eq!(bank.wait_for_spills().written, 1);
            match source {
                Source::Ssd => bank,
                _ => {
                    drop(bank);
                    Bank::new(bank_config(1)).with_cold(cold_store(dir))
                }
            }
        }
    }
}

#[test]
fn a_restored_hybrid_checkpoint_gives_the_cold_tokens_from_ram_and_ssd() {
    let model = model();
    let (turn, commit) = first_turn(&model);
    let continued: Vec<u32> = turn.iter().copied().chain(xorshift_tokens(30, 2)).collect();
    let edited: Vec<u32> = turn[..600]
        .iter()
        .copied()
        .chain(xorshift_tokens(40, 3))
        .collect();
    let cases = [
        (
            "continued",
            &continued,
            620,
            [RestoreMode::Clone, RestoreMode::SsdClone],
        ),
        (
            "edited",
            &edited,
            512,
            [
                RestoreMode::BlockPrefixBoundaryClone,
                RestoreMode::SsdBlockPrefixBoundaryClone,
            ],
        ),
    ];
    let layouts = [
        CacheFactory::contiguous(),
        CacheFactory::paged(),
        CacheFactory::segmented(),
    ];
    let id = identity();
    for (name, prompt, restored_at, modes) in cases {
        let cold: Vec<Trace> = samplers()
            .into_iter()
            .map(|s| {
                let cache =
                    Sequence::new(&CacheFactory::contiguous(), &model.config().state_shape())
                        .with_policy(policy());
                finish(&model, cache, prompt, s)
            })
            .collect();
        let distinct = cold[1]
            .1
            .iter()
            .collect::<std::collections::HashSet<_>>()
            .len();
        assert!(distinct > 3, "{name}: a degenerate continuation");
        for source in [Source::Ram, Source::Ssd, Source::SsdAfterRestart] {
            let dir = tempfile::tempdir().unwrap();
            let bank = bank_holding(source, commit.clone(), dir.path());
            for factory in &layouts {
                for (sampler, want) in samplers().into_iter().zip(&cold) {
                    let plan = bank.lookup(&LookupQuery {
                        identity: &id,
                        prompt,
                        session: None,
                        floor: 0,
                    });
                    let mode = match source {
                        Source::Ram => modes[0],
                        _ => modes[1],
                    };
                    assert_eq!(plan.mode(), mode, "{name} from {source:?}");
                    let restored = plan
                        .restore(factory, &model.config().state_shape())
                        .unwrap();
                    assert_eq!(restored.prefix_len(), restored_at, "{name} from {source:?}");
                    let cache = restored.sequence.with_policy(policy());
                    assert!(cache.recurrent().is_some(), "a hybrid restore's state");
                    let got = finish(&model, cache, prompt, sampler);
                    assert!(
                        &got == want,
                        "{name} from {source:?} into {:?}: not the cold prefill's bits",
                        factory.layout()
                    );
                }
            }
        }
    }
}
