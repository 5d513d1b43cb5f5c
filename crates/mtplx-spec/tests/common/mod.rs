//! Shared by the speculation tests: the models they run, greedy plain decoding, and the
//! statistics of the sampling tests.

#![allow(dead_code)]

pub mod stats;

use mtplx_model::tokenizer::Special;
use std::path::PathBuf;

use mtplx_kv::{CacheFactory, KvView, Sequence};
use mtplx_model::{Model, WeightFormat};

pub fn tiny(arch: &str) -> Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/tiny")
        .join(arch);
    Model::load(&dir, WeightFormat::F32).unwrap()
}

pub fn default_path() -> PathBuf {
    let path = std::env::var_os("MTPLX_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            mtplx_model::store::ModelStore::from_env().path_of(&mtplx_model::store::DEFAULT_MODEL)
        });
    assert!(
        path.exists(),
        "default model missing at {}: cargo xtask fetch-model",
        path.display()
    );
    path
}

pub fn default_model() -> Model {
    Model::load(&default_path(), WeightFormat::F32).unwrap()
}

pub fn default_bundle() -> mtplx_model::Bundle {
    mtplx_model::Bundle::load(&default_path(), WeightFormat::F32).unwrap()
}

pub fn cache(model: &dyn mtplx_model::LanguageModel) -> Sequence {
    model.new_sequence(&CacheFactory::contiguous())
}

/// Every K and V value of every layer, as bits.
pub fn kv_bits(cache: &dyn KvView) -> Vec<u32> {
    let shape = cache.shape();
    let n = cache.len();
    let mut all = Vec::new();
    for layer in 0..shape.layers {
        let mut k = vec![0f32; n * shape.row_len()];
        let mut v = vec![0f32; n * shape.row_len()];
        cache.read_rows(layer, 0..n, &mut k, &mut v).unwrap();
        all.extend(k.iter().chain(&v).map(|x| x.to_bits()));
    }
    all
}

/// Greedy plain decoding of `n` tokens after `prompt`: the tokens, and the KV's bits.
pub fn plain_greedy(
    model: &dyn mtplx_model::LanguageModel,
    prompt: &[u32],
    n: usize,
) -> (Vec<u32>, Vec<u32>) {
    let mut c = cache(model);
    let mut g = mtplx_model::Generator::new(
        model,
        &mut c,
        prompt,
        mtplx_model::sampling::Sampler::greedy(),
        64,
    )
    .unwrap();
    for _ in 0..n {
        g.step().unwrap();
    }
    let tokens = g.generated().to_vec();
    drop(g);
    (tokens, kv_bits(c.kv()))
}

/// A chat turn, and code that prompt lookup can copy from.
pub fn prompts(b: &mtplx_model::Bundle) -> Vec<Vec<u32>> {
    let req = mtplx_model::chat::ChatRequest {
        messages: vec![mtplx_model::chat::ChatMessage::text(
            mtplx_model::chat::Role::User,
            "Name three colours of the rainbow.",
        )],
        add_generation_prompt: true,
        ..Default::default()
    };
    let rendered = b.template.as_ref().unwrap().render(&req).unwrap();
    let code = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef add(";
    vec![
        b.tokenizer.encode(&rendered, Special::Parse).unwrap(),
        b.tokenizer.encode(code, Special::AsText).unwrap(),
    ]
}
