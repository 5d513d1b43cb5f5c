//! The shipped MTP head computes in Rust what its recipe trained in PyTorch.
//!
//! `xtask/mtp_gpu/train.py` writes, beside the head, a probe: the head's depth-1 and depth-2
//! top-5 scores at one row of a fixed sequence, computed by the training graph on the
//! exported (f16-rounded) weights. Here [`MtpHead`] recomputes them from the trunk's hidden
//! states, the head's own KV cache and the recursion `MtpProposer` drafts with. A graph that
//! differs (RoPE layout, norm order, concat order, the depth-2 attention context) moves
//! the scores by whole units; the two implementations differ only in summation order.

use std::path::PathBuf;

use mtplx_kv::CacheFactory;
use mtplx_model::mtp::{MtpHead, Vocab};
use mtplx_model::store::{ModelStore, DEFAULT_MODEL};
use mtplx_model::{Bundle, Want, WeightFormat};

fn model_path() -> PathBuf {
    let path = std::env::var_os("MTPLX_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| ModelStore::from_env().path_of(&DEFAULT_MODEL));
    assert!(path.is_file(), "test model {} is missing", path.display());
    path
}

fn head_path() -> PathBuf {
    std::env::var_os("MTPLX_MTP_HEAD").map_or_else(
        || {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../models/mtp/smollm2-135m-mtp.safetensors")
        },
        PathBuf::from,
    )
}

fn check(depth: usize, scores: &[f32], probe: &serde_json::Value) {
    let want = &probe[format!("depth{depth}")];
    let ids: Vec<usize> = want["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|v| v.as_u64().expect("id") as usize)
        .collect();
    let expected: Vec<f32> = want["scores"]
        .as_array()
        .expect("scores")
        .iter()
        .map(|v| v.as_f64().expect("score") as f32)
        .collect();
    let top = mtplx_model::sampling::argmax(scores) as usize;
    assert_eq!(
        top, ids[0],
        "depth {depth}: top token differs from the recipe's"
    );
    for (&id, &e) in ids.iter().zip(&expected) {
        let got = scores[id];
        assert!(
            (got - e).abs() <= 0.05 + 0.005 * e.abs(),
            "depth {depth}: token {id} scored {got}, the recipe's graph {e}"
        );
    }
}

#[test]
fn shipped_head_matches_its_training_graph() {
    let head = head_path();
    let probe_path = head.with_extension("probe.json");
    let probe: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&probe_path).expect("probe beside the head"))
            .expect("probe JSON");
    let ids: Vec<u32> = probe["ids"]
        .as_array()
        .expect("ids")
        .iter()
        .map(|v| v.as_u64().expect("id") as u32)
        .collect();
    let row = probe["row"].as_u64().expect("row") as usize;
    assert!(row + 2 < ids.len());

    let b = Bundle::load(&model_path(), WeightFormat::Native).expect("model");
    let head = MtpHead::load(&head, &*b.model, Vocab::Full).expect("head");
    let factory = CacheFactory::contiguous();
    let mut trunk_cache = b.model.new_sequence(&factory);
    let out = b
        .model
        .forward(&ids, &mut trunk_cache, Want::All)
        .expect("trunk");
    let h = b.model.dims().hidden_size;

    // Depth 1 at `row`: the head observes rows 0..=row (hidden h_p, next token p+1).
    let mut cache = factory.new_cache(head.kv_shape());
    let o1 = head
        .forward(
            &*b.model,
            &out.hidden[..(row + 1) * h],
            &ids[1..row + 2],
            cache.as_mut(),
            0,
        )
        .expect("depth 1");
    let last = &o1[row * h..];
    check(1, &head.logits(last).expect("scores"), &probe);
    // Depth 2: its own output and token row+2, at position row+1.
    let o2 = head
        .forward(
            &*b.model,
            last,
            &ids[row + 2..row + 3],
            cache.as_mut(),
            row + 1,
        )
        .expect("depth 2");
    check(2, &head.logits(&o2).expect("scores"), &probe);
}
