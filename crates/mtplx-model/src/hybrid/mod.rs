//! A Qwen3-Next-style hybrid decoder: gated delta nets (recurrent) and full attention.
//!
//! Layers alternate `full_attention_interval - 1` gated delta nets ([`LayerKind`]) with
//! one gated attention layer, each followed by a dense SwiGLU MLP. The model runs on a
//! [`mtplx_kv::Sequence`] through [`crate::LanguageModel`], like the dense ones: the gated
//! delta nets keep their convolution and delta-rule state in its recurrent state, the
//! attention layers keep K/V in its cache of the caller's layout, and its checkpoints of the
//! recurrent state (on a grid of positions, or wherever the caller records one) are where it
//! can rewind to.
//!
//! Its weights load from a Qwen3-Next Hugging Face folder under the published names
//! ([`HybridModel::load`], [`hf`]) or from a GGUF file under llama.cpp's (`qwen35`, or a
//! dense `qwen3next`: [`gguf`]); no published checkpoint is small enough for tests, so
//! the tests draw weights from a seed ([`HybridWeights::random`], written as such a folder
//! by `cargo xtask make-hybrid`) and check the model against an independent float64
//! implementation of the same formulas (`tests/hybrid_reference.rs`). Every product runs on
//! the batch-invariant kernels and the recurrence runs token by token, so a row's logits do
//! not depend on how the tokens before it arrived: prefill chunk, checkpoint restore or KV
//! layout (`tests/invariance_hybrid.rs`).
//!
//! ```
//! use mtplx_kv::{CacheFactory, CheckpointPolicy};
//! use mtplx_model::hybrid::{HybridConfig, HybridModel, HybridWeights};
//! use mtplx_model::{prefill, LanguageModel, Want};
//!
//! # fn main() -> Result<(), mtplx_model::ModelError> {
//! let config = HybridConfig::tiny();
//! let model = HybridModel::new(config.clone(), &HybridWeights::random(&config, 7))?;
//! let every = CheckpointPolicy::Every(8.try_into().unwrap());
//! let mut seq = model.new_sequence(&CacheFactory::paged()).with_policy(every);
//! let prompt: Vec<u32> = (0..20).collect();
//! let out = prefill(&model, &prompt, &mut seq, 7)?;
//! // Checkpoints at 8 and 16 (the grid), 7 and 14 (the chunk edges) and 20 (the end).
//! let at: Vec<usize> = seq.checkpoints().unwrap().iter().map(|c| c.position).collect();
//! assert_eq!(at, [7, 8, 14, 16, 20]);
//! // Rewind to 18: back at 16; run the rest again: the same bits.
//! assert_eq!(seq.rewind(18).unwrap(), 16);
//! let again = model.forward(&prompt[16..], &mut seq, Want::Last)?;
//! assert_eq!(again.last_logits(), out.last_logits());
//! # Ok(()) }
//! ```

mod attention;
mod config;
mod gdn;
pub mod gguf;
pub mod hf;
mod layer;
mod model;
mod mtp;
pub mod synthetic;
mod weights;

pub use config::{HybridConfig, LayerKind};
pub use model::HybridModel;
pub use mtp::HybridMtpHead;
pub use weights::{
    AttentionWeights, GdnWeights, HybridWeights, LayerWeights, MixerWeights, MlpWeights, MtpWeights,
};
