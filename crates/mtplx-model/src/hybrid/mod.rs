//! A Qwen3-Next-style hybrid decoder: gated delta nets (recurrent) and full attention.
//!
//! Layers alternate `full_attention_interval - 1` gated delta nets ([`LayerKind`]) with
//! one gated attention layer, each followed by a dense SwiGLU MLP. The gated delta nets
//! keep their convolution and delta-rule state in a [`mtplx_kv::RecurrentState`]; the
//! attention layers keep K/V in a [`mtplx_kv::KvCache`] of the caller's layout; both live
//! in a [`HybridCache`], which also records [`Checkpoint`]s of the recurrent state (on a
//! grid of positions and at the end of each prompt) so that it can roll back.
//!
//! Its weights load from a Qwen3-Next Hugging Face folder under the published names
//! ([`HybridModel::load`], [`hf`]); no published checkpoint is small enough for tests, so
//! the tests draw weights from a seed ([`HybridWeights::random`], written as such a folder
//! by `cargo xtask make-hybrid`) and check the model against an independent float64
//! implementation of the same formulas (`tests/hybrid_reference.rs`). Every product runs on the batch-invariant kernels and the
//! recurrence runs token by token, so a row's logits do not depend on how the tokens before
//! it arrived: prefill chunk, checkpoint restore or KV layout (`tests/invariance_hybrid.rs`).
//!
//! ```
//! use mtplx_kv::CacheFactory;
//! use mtplx_model::hybrid::{CheckpointPolicy, HybridCache, HybridConfig, HybridModel, HybridWeights};
//! use mtplx_model::Want;
//!
//! # fn main() -> Result<(), mtplx_model::ModelError> {
//! let config = HybridConfig::tiny();
//! let model = HybridModel::new(config.clone(), &HybridWeights::random(&config, 7))?;
//! let every = CheckpointPolicy::Every(8.try_into().unwrap());
//! let mut cache = HybridCache::new(&config, &CacheFactory::paged(), every);
//! let prompt: Vec<u32> = (0..20).collect();
//! let out = model.prefill(&prompt, &mut cache, 7)?;
//! // Checkpoints at 8, 16 and the end of the prompt.
//! let at: Vec<usize> = cache.checkpoints().iter().map(|c| c.position).collect();
//! assert_eq!(at, [8, 16, 20]);
//! // Roll back to 16 and run the rest again: the same bits.
//! assert_eq!(cache.rollback(18)?, 16);
//! let again = model.forward(&prompt[16..], &mut cache, Want::Last)?;
//! assert_eq!(again.last_logits(), out.last_logits());
//! # Ok(()) }
//! ```

mod attention;
mod cache;
mod config;
mod gdn;
pub mod hf;
mod model;
mod weights;

pub use cache::{Checkpoint, CheckpointPolicy, HybridCache};
pub use config::{HybridConfig, LayerKind};
pub use model::HybridModel;
pub use weights::{
    AttentionWeights, GdnWeights, HybridWeights, LayerWeights, MixerWeights, MlpWeights,
};
