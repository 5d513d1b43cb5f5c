//! The tiny synthetic Hugging Face models (`tests/fixtures/tiny`) and what the independent
//! float64 reference computed for them (`expected.json`), checked on any backend.
#![allow(dead_code)]

use std::path::PathBuf;

use mtplx_kv::CacheFactory;
use mtplx_model::{generate_greedy, LanguageModel, Want};
use serde::Deserialize;

#[derive(Deserialize)]
pub struct Expected {
    pub model_type: String,
    pub tie_word_embeddings: bool,
    pub cases: Vec<Case>,
}

#[derive(Deserialize)]
pub struct Case {
    pub name: String,
    pub input_ids: Vec<u32>,
    pub last_logits: Vec<f32>,
    pub greedy_tokens: Vec<u32>,
}

/// The folder of the tiny model of family `arch` (`llama`, `qwen2`, `qwen3`).
pub fn fixture(arch: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(arch)
}

pub fn expected(arch: &str) -> Expected {
    let path = fixture(arch).join("expected.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every case of `arch`'s reference on `model` (caches from `factory`): the last position's
/// logits within `tolerance` of the reference's, and its greedy tokens in prefill chunks of
/// 1, 3 and 512.
pub fn check(model: &dyn LanguageModel, factory: &CacheFactory, arch: &str, tolerance: f32) {
    for case in &expected(arch).cases {
        let mut seq = model.new_sequence(factory);
        let out = model
            .forward(&case.input_ids, &mut seq, Want::Last)
            .unwrap();
        let err = out
            .last_logits()
            .iter()
            .zip(&case.last_logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            err < tolerance,
            "{arch}/{}: max |logit error| {err}",
            case.name
        );
        for chunk in [1, 3, 512] {
            let mut seq = model.new_sequence(factory);
            let n = case.greedy_tokens.len();
            let got = generate_greedy(model, &mut seq, &case.input_ids, n, &[], chunk).unwrap();
            assert_eq!(
                got, case.greedy_tokens,
                "{arch}/{} chunk {chunk}",
                case.name
            );
        }
    }
}
