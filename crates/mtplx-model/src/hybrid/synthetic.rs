//! A small deterministic Qwen3-Next checkpoint to test with (what `cargo xtask make-hybrid`
//! writes): no package ships a hybrid model small enough, so its weights are drawn from a
//! seed ([`HybridWeights::random`]) and saved under the published names, with a tokenizer
//! and chat template beside them, as a folder the same loader as a user's reads
//! ([`crate::Bundle::load`]); or as one GGUF file under llama.cpp's names ([`write_gguf`]).

use std::path::Path;

use crate::error::{ModelError, Result};
use crate::hybrid::{gguf, hf, HybridConfig, HybridWeights};
use crate::tokenizer::Tokenizer;

/// The geometry `make-hybrid` writes by default: the default model's vocabulary (49,152),
/// a context of 8,192 tokens, 8 layers (3 gated delta nets then an attention layer,
/// twice), hidden 128: small enough to run a long prompt in a test.
pub fn config() -> HybridConfig {
    HybridConfig {
        vocab_size: 49_152,
        hidden_size: 128,
        intermediate_size: 256,
        num_layers: 8,
        full_attention_interval: 4,
        layer_types: None,
        rms_norm_eps: 1e-6,
        context_length: 8192,
        rope_theta: 10_000.0,
        partial_rotary_factor: 0.25,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 32,
        linear_num_key_heads: 2,
        linear_num_value_heads: 4,
        linear_key_head_dim: 32,
        linear_value_head_dim: 32,
        linear_conv_kernel_dim: 4,
        tie_word_embeddings: false,
    }
}

/// Writes a Hugging Face folder at `dir`: `config` with weights drawn from `seed`, and,
/// when given, `tokenizer` as `tokenizer.json` and `tokenizer_config.json` (its chat
/// template included). The same arguments write the same bytes.
pub fn write(
    dir: &Path,
    config: &HybridConfig,
    seed: u64,
    tokenizer: Option<&Tokenizer>,
) -> Result<()> {
    fits(config, tokenizer)?;
    let weights = HybridWeights::random(config, seed);
    hf::save(dir, config, &weights)?;
    if let Some(tokenizer) = tokenizer {
        let (json, tokenizer_config) = tokenizer.to_hf_json()?;
        let io = |path: std::path::PathBuf, text: String| {
            std::fs::write(&path, text).map_err(|source| ModelError::Io { path, source })
        };
        io(dir.join("tokenizer.json"), json)?;
        io(dir.join("tokenizer_config.json"), tokenizer_config + "\n")?;
    }
    Ok(())
}

/// Writes the same model as [`write()`] as one `qwen35` GGUF file at `path`
/// ([`gguf::save`]), the tokenizer and chat template (when given) in its metadata. The same
/// arguments write the same bytes.
pub fn write_gguf(
    path: &Path,
    config: &HybridConfig,
    seed: u64,
    tokenizer: Option<&Tokenizer>,
) -> Result<()> {
    fits(config, tokenizer)?;
    gguf::save(
        path,
        config,
        &HybridWeights::random(config, seed),
        tokenizer,
    )
}

/// A tokenizer must not name ids beyond the model's vocabulary.
fn fits(config: &HybridConfig, tokenizer: Option<&Tokenizer>) -> Result<()> {
    match tokenizer {
        Some(t) if t.vocab_size() > config.vocab_size => Err(ModelError::Hybrid {
            reason: format!(
                "a tokenizer of {} ids for a vocabulary of {}",
                t.vocab_size(),
                config.vocab_size
            ),
        }),
        _ => Ok(()),
    }
}
