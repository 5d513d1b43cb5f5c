//! The hybrid model against transformers' own Qwen3-Next (`Qwen3NextForCausalLM`, float32,
//! eager attention). `tests/fixtures/hybrid/transformers_tiny.json` holds its logits for
//! the tests' tiny checkpoint (`HybridConfig::tiny`, seed 11: what `cargo xtask make-hybrid
//! --tiny --seed 11` writes), made by `tools/reference/transformers_qwen3_next.py` on a
//! machine that has transformers. The same checkpoint, written here and read through the
//! loader a user's folder goes through, must give the same logits: this is what checks
//! the published names, the layouts and the formulas against the implementation users run.

use mtplx_kv::Sequence;
use mtplx_model::LanguageModel as _;
use std::path::PathBuf;

use mtplx_kv::CacheFactory;
use mtplx_model::hybrid::{hf, HybridConfig, HybridModel, HybridWeights};
use mtplx_model::Want;
use serde_json::Value;

/// Relative to the largest logit: transformers' float32 and ours reduce in other orders.
const TOLERANCE: f64 = 1e-4;

#[test]
fn a_checkpoint_gives_transformers_logits() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/hybrid/transformers_tiny.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let ids: Vec<u32> = fixture["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let want: Vec<Vec<f64>> = fixture["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect()
        })
        .collect();

    let config = HybridConfig::tiny();
    assert_eq!(fixture["vocab"].as_u64(), Some(config.vocab_size as u64));
    let dir = tempfile::tempdir().unwrap();
    hf::save(dir.path(), &config, &HybridWeights::random(&config, 11)).unwrap();
    let model = HybridModel::load(dir.path()).unwrap();
    let mut cache = Sequence::new(&CacheFactory::paged(), &config.state_shape());
    let mut got: Vec<Vec<f32>> = Vec::new();
    for chunk in ids.chunks(17) {
        let out = model.forward(chunk, &mut cache, Want::All).unwrap();
        got.extend((0..out.rows).map(|r| out.logits_row(r).to_vec()));
    }
    assert_eq!(got.len(), want.len());
    let scale = want.iter().flatten().fold(1.0f64, |m, v| m.max(v.abs()));
    let err = got
        .iter()
        .zip(&want)
        .flat_map(|(g, w)| g.iter().zip(w).map(|(a, b)| (*a as f64 - b).abs()))
        .fold(0.0, f64::max)
        / scale;
    let argmax = |row: &[f64]| {
        (0..row.len())
            .max_by(|&a, &b| row[a].total_cmp(&row[b]))
            .unwrap()
    };
    let same_argmax = got
        .iter()
        .zip(&want)
        .filter(|(g, w)| {
            let g: Vec<f64> = g.iter().map(|&v| v as f64).collect();
            argmax(&g) == argmax(w)
        })
        .count();
    eprintln!(
        "against transformers {}: relative error {err:e}, argmax equal at {same_argmax}/{}",
        fixture["transformers"],
        got.len()
    );
    assert!(
        err < TOLERANCE,
        "relative error {err:e} against transformers"
    );
    assert_eq!(same_argmax, got.len());
}
