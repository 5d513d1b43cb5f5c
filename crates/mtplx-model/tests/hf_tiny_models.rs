//! Tiny synthetic Hugging Face models (Llama, Qwen2, Qwen3) against the independent numpy
//! reference in tools/reference (float64): last-position logits and greedy continuations.

use std::path::PathBuf;

use mtplx_kv::CacheFactory;
use mtplx_model::{generate_greedy, Architecture, LanguageModel, Model, Want, WeightFormat};
use serde::Deserialize;

#[derive(Deserialize)]
struct Expected {
    model_type: String,
    tie_word_embeddings: bool,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    input_ids: Vec<u32>,
    last_logits: Vec<f32>,
    greedy_tokens: Vec<u32>,
}

fn fixture(arch: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(arch)
}

fn check(arch: &str, want_arch: Architecture) {
    let dir = fixture(arch);
    let expected: Expected =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    assert_eq!(expected.model_type, arch);
    let model = Model::load(&dir, WeightFormat::F32).unwrap();
    assert_eq!(model.config().arch, want_arch);
    assert_eq!(model.config().tie_embeddings, expected.tie_word_embeddings);
    let factory = CacheFactory::contiguous();
    for case in &expected.cases {
        let mut cache = model.new_sequence(&factory);
        let out = model
            .forward(&case.input_ids, &mut cache, Want::Last)
            .unwrap();
        let err = out
            .last_logits()
            .iter()
            .zip(&case.last_logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(err < 1e-4, "{arch}/{}: max |logit error| {err}", case.name);

        for chunk in [1, 3, 512] {
            let mut cache = model.new_sequence(&factory);
            let n = case.greedy_tokens.len();
            let got = generate_greedy(&model, &mut cache, &case.input_ids, n, &[], chunk).unwrap();
            assert_eq!(
                got, case.greedy_tokens,
                "{arch}/{} chunk {chunk}",
                case.name
            );
        }
    }
}

#[test]
fn llama_matches_reference() {
    check("llama", Architecture::Llama);
}

#[test]
fn qwen2_matches_reference() {
    check("qwen2", Architecture::Qwen2);
}

#[test]
fn qwen3_matches_reference() {
    check("qwen3", Architecture::Qwen3);
}
