//! Tiny synthetic Hugging Face models (Llama, Qwen2, Qwen3) against the independent numpy
//! reference in tools/reference (float64): last-position logits and greedy continuations.

mod tiny_fixture;

use mtplx_kv::CacheFactory;
use mtplx_model::{Architecture, Model, WeightFormat};

fn check(arch: &str, want_arch: Architecture) {
    let expected = tiny_fixture::expected(arch);
    assert_eq!(expected.model_type, arch);
    let model = Model::load(&tiny_fixture::fixture(arch), WeightFormat::F32).unwrap();
    assert_eq!(model.config().arch, want_arch);
    assert_eq!(model.config().tie_embeddings, expected.tie_word_embeddings);
    tiny_fixture::check(&model, &CacheFactory::contiguous(), arch, 1e-4);
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
