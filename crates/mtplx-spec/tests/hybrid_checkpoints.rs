//! The checkpoints the driver records on a hybrid model are restore points: a long prompt
//! driven cold keeps at most `MAX_CHECKPOINTS` (at chunk ends and on the tail grid, thinned
//! by distance from the tail), and restoring at every one of them (its K/V trimmed there
//! into a new sequence of another layout, its recurrent state installed) then driving the
//! same prompt gives the cold run's greedy tokens, and prefilling the rest of the prompt gives
//! the cold prefill's last logits bit for bit.

use mtplx_kv::{CacheFactory, Sequence, MAX_CHECKPOINTS};
use mtplx_model::hybrid::{HybridConfig, HybridModel, HybridWeights};
use mtplx_model::sampling::Sampler;
use mtplx_model::LanguageModel;
use mtplx_spec::{drive, Collect, Decode, Request, TAIL_GRID};

fn model() -> HybridModel {
    let c = HybridConfig {
        context_length: 4096,
        ..HybridConfig::tiny()
    };
    HybridModel::new(c.clone(), &HybridWeights::random(&c, 3)).unwrap()
}

fn prompt(n: usize) -> Vec<u32> {
    let mut x = 0x9E37_79B9u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 256) as u32
        })
        .collect()
}

#[test]
fn every_kept_checkpoint_restores_to_the_cold_tokens() {
    let model = model();
    let prompt = prompt(2500);
    let never = |_: u32| false;
    let request = Request {
        chunk: 300,
        ..Request::new(&prompt, Sampler::greedy(), 12, &never)
    };
    let mut cold = model.new_sequence(&CacheFactory::contiguous());
    let mut want = Collect::default();
    drive(&model, &mut cold, &request, Decode::Plain, &mut want).unwrap();
    assert_eq!(want.0.len(), 12);

    let kept: Vec<usize> = cold
        .checkpoints()
        .unwrap()
        .iter()
        .map(|c| c.position)
        .collect();
    assert!(kept.len() <= MAX_CHECKPOINTS, "{kept:?}");
    assert!(kept.len() >= 4, "{kept:?}");
    // The tail grid's newest point and the prompt's last chunk end are among them.
    let grid = (prompt.len() - 1) / TAIL_GRID * TAIL_GRID;
    assert!(kept.contains(&grid), "{kept:?}");
    assert!(kept.contains(&(prompt.len() - 1)), "{kept:?}");

    let snapshot = cold.kv().snapshot();
    let shape = model.state_shape();
    let mut whole = model.new_sequence(&CacheFactory::contiguous());
    let cold_logits = mtplx_model::prefill(&model, &prompt, &mut whole, 300).unwrap();
    for cp in cold.checkpoints().unwrap() {
        if cp.position >= prompt.len() {
            continue;
        }
        let restore = || {
            let kv = CacheFactory::paged()
                .restore(&*snapshot, cp.position)
                .unwrap();
            Sequence::from_parts(&shape, kv, Some(cp.state.to_state())).unwrap()
        };
        let mut rest = restore();
        let out = mtplx_model::prefill(&model, &prompt[cp.position..], &mut rest, 300).unwrap();
        assert_eq!(
            out.last_logits(),
            cold_logits.last_logits(),
            "logits after restoring at {}",
            cp.position
        );
        let mut seq = restore();
        let mut got = Collect::default();
        let report = drive(&model, &mut seq, &request, Decode::Plain, &mut got).unwrap();
        assert_eq!(report.cached_tokens, cp.position);
        assert_eq!(got.0, want.0, "restored at {}", cp.position);
    }
}
