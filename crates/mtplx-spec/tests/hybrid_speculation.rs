//! Speculative decoding on a hybrid model: its recurrent state cannot be trimmed, so a
//! rejected draft rewinds the sequence to the checkpoint taken before the verify block and
//! the accepted tokens run again. The output is exactly plain decoding's, greedy and seeded,
//! at every depth; the step's own checkpoint does not stay behind.

use mtplx_kv::CacheFactory;
use mtplx_model::hybrid::{HybridConfig, HybridModel, HybridWeights};
use mtplx_model::sampling::{Penalties, RandomSampling, Sampler, Sampling};
use mtplx_model::LanguageModel;
use mtplx_spec::{
    drive, Collect, Decode, DepthPolicy, DraftModel, DraftSampling, End, PromptLookup, Proposer,
    Request,
};

fn model_seeded(seed: u64) -> HybridModel {
    let c = HybridConfig::tiny();
    HybridModel::new(c.clone(), &HybridWeights::random(&c, seed)).unwrap()
}

fn model() -> HybridModel {
    model_seeded(5)
}

/// The proposers tried: prompt lookup; a hybrid draft model with the target's own weights
/// (its drafts are the target's greedy tokens) and one with other weights (mostly wrong),
/// each with its own hybrid sequence to rewind.
fn proposers() -> Vec<(&'static str, Box<dyn Proposer>)> {
    let draft = |seed| {
        let d = DraftModel::new(
            model_seeded(seed),
            &CacheFactory::paged(),
            DraftSampling::Greedy,
        );
        Box::new(d) as Box<dyn Proposer>
    };
    vec![
        (
            "lookup",
            Box::new(PromptLookup::default()) as Box<dyn Proposer>,
        ),
        ("same weights", draft(5)),
        ("other weights", draft(6)),
    ]
}

/// A prompt that repeats itself, so prompt lookup drafts often (and is often wrong).
fn prompt() -> Vec<u32> {
    let phrase: Vec<u32> = (0..9).map(|i| 17 + i * 13).collect();
    let mut p = Vec::new();
    for i in 0..6u32 {
        p.extend_from_slice(&phrase);
        p.push(200 + i);
    }
    p
}

fn sampled(seed: u64) -> Sampler {
    Sampler::new(
        Sampling::Random(RandomSampling {
            temperature: 0.9,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed,
        }),
        Penalties::default(),
    )
}

/// Tokens generated, the sequence's checkpoint positions after, and (drafted, accepted).
fn run(
    model: &HybridModel,
    sampler: Sampler,
    spec: Option<(Box<dyn Proposer>, usize)>,
) -> (Vec<u32>, Vec<usize>, (u64, u64)) {
    let prompt = prompt();
    let never = |_: u32| false;
    let request = Request {
        chunk: 16,
        ..Request::new(&prompt, sampler, 40, &never)
    };
    let decode = match spec {
        None => Decode::Plain,
        Some((proposer, d)) => Decode::Speculative {
            proposer,
            policy: DepthPolicy::fixed(d),
        },
    };
    let mut seq = model.new_sequence(&CacheFactory::paged());
    let mut out = Collect::default();
    let report = drive(model, &mut seq, &request, decode, &mut out).unwrap();
    assert_eq!(report.end, End::Length);
    let checkpoints = seq
        .checkpoints()
        .unwrap()
        .iter()
        .map(|c| c.position)
        .collect();
    let counts = report.speculation.map_or((0, 0), |s| {
        let drafted: u64 = s.stats.drafted_by_depth.iter().sum();
        let accepted: u64 = s.stats.accepted_by_depth.iter().sum();
        (drafted, accepted)
    });
    (out.0, checkpoints, counts)
}

#[test]
fn speculation_on_a_hybrid_model_gives_plain_decodings_tokens() {
    let model = model();
    type MakeSampler = fn() -> Sampler;
    let samplers: [(&str, MakeSampler); 2] =
        [("greedy", Sampler::greedy), ("seeded", || sampled(11))];
    for (name, sampler) in samplers {
        let (want, plain_checkpoints, _) = run(&model, sampler(), None);
        assert_eq!(want.len(), 40);
        let (mut all_accepted, mut rejected) = (false, false);
        for depth in 1..=4 {
            for (proposer, p) in proposers() {
                let (got, checkpoints, (drafted, accepted)) =
                    run(&model, sampler(), Some((p, depth)));
                assert_eq!(got, want, "{name}, {proposer}, depth {depth}");
                all_accepted |= drafted > 0 && accepted == drafted;
                rejected |= accepted < drafted;
                // The prefill's checkpoints, and no step's.
                assert_eq!(
                    checkpoints, plain_checkpoints,
                    "{name}, {proposer}, depth {depth}"
                );
            }
        }
        // Greedy drafts of the target's own weights are its tokens: all accepted, no rewind.
        assert!(
            all_accepted || name == "seeded",
            "{name}: no run had every draft accepted"
        );
        assert!(
            rejected,
            "{name}: no draft was ever rejected, so no rewind was tested"
        );
    }
}
