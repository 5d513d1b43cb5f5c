//! Speculative decoding on a hybrid model: its recurrent state cannot be trimmed, so a
//! rejected draft rewinds the sequence to the checkpoint taken before the verify block and
//! the accepted tokens run again. The output is exactly plain decoding's, greedy and seeded,
//! at every depth and with every proposer (the checkpoint's own MTP head among them); the
//! step's own checkpoint does not stay behind.

use std::sync::Arc;

use mtplx_kv::CacheFactory;
use mtplx_model::hybrid::{HybridConfig, HybridModel, HybridWeights};
use mtplx_model::mtp::MtpRunner;
use mtplx_model::sampling::{argmax, Penalties, RandomSampling, Sampler, Sampling};
use mtplx_model::{LanguageModel, Want};
use mtplx_spec::{
    drive, Collect, Decode, DepthPolicy, DraftContext, DraftModel, DraftSampling, End, MtpProposer,
    PromptLookup, Proposer, Request, TrunkRows,
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
/// each with its own hybrid sequence to rewind; the checkpoint's MTP head (seeded weights:
/// mostly wrong).
fn proposers(target: &HybridModel) -> Vec<(&'static str, Box<dyn Proposer + '_>)> {
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
        ("mtp head", Box::new(mtp(target))),
    ]
}

fn mtp(target: &HybridModel) -> MtpProposer<'_> {
    let head: Arc<dyn MtpRunner> = target.mtp_head().expect("the seeded checkpoint's head");
    MtpProposer::new(
        target,
        head,
        &CacheFactory::contiguous(),
        DraftSampling::Greedy,
    )
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
    spec: Option<(Box<dyn Proposer + '_>, usize)>,
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
            for (proposer, p) in proposers(&model) {
                let (got, checkpoints, (drafted, accepted)) =
                    run(&model, sampler(), Some((p, depth)));
                assert_eq!(got, want, "{name}, {proposer}, depth {depth}");
                // The head drafts at every step (lookup only where the text repeats).
                assert!(
                    drafted > 0 || proposer != "mtp head",
                    "{name}, depth {depth}: the head drafted nothing"
                );
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

#[test]
fn the_mtp_proposer_drafts_what_the_head_computes_from_the_trunks_rows() {
    let model = model();
    let head = model.mtp_head().unwrap();
    let prompt = prompt();
    let n = prompt.len();
    // The trunk's rows for the prompt, as the decoder hands them over (before its norm).
    let mut seq = model.new_sequence(&CacheFactory::paged());
    let out = model.forward(&prompt, &mut seq, Want::All).unwrap();
    let newest = argmax(out.logits_row(n - 1)) as u32;
    let mut context = prompt.clone();
    context.push(newest);
    let mut next = prompt[1..].to_vec();
    next.push(newest);
    let mut proposer = mtp(&model);
    proposer
        .observe(&TrunkRows {
            pos: 0,
            hidden: &out.hidden,
            next: &next,
        })
        .unwrap();
    let draft = proposer
        .propose(&DraftContext {
            tokens: &context,
            max_len: 3,
        })
        .unwrap();

    // By hand: the head reads the rows after the trunk's final norm, then recurses on its
    // own output.
    let mut hidden = out.hidden.clone();
    head.prepare_trunk_rows(&mut hidden);
    let mut cache = CacheFactory::contiguous().new_cache(head.kv_shape());
    let (mut x, mut logits) = head
        .last_row(&model, &hidden, &next, cache.as_mut(), 0)
        .unwrap();
    let mut want = Vec::new();
    for i in 0..3 {
        let t = argmax(&logits) as u32;
        want.push(t);
        (x, logits) = head
            .last_row(&model, &x, &[t], cache.as_mut(), n + i)
            .unwrap();
    }
    assert_eq!(draft.tokens, want);
    // Rows not through the trunk's norm score otherwise (what makes the check tell).
    let fresh = || CacheFactory::contiguous().new_cache(head.kv_shape());
    let scores = |rows: &[f32]| {
        head.last_row(&model, rows, &next, fresh().as_mut(), 0)
            .unwrap()
            .1
    };
    assert_ne!(scores(&out.hidden), scores(&hidden));
}
