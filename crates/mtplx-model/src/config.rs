//! Model configuration, read from the checkpoint's own metadata.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use serde::Deserialize;

use crate::error::{ModelError, Result};

/// The model families mtplx runs. They share one graph and differ in a few switches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Architecture {
    /// Llama family (SmolLM2, Llama 2/3): no biases, no Q/K norm.
    Llama,
    /// Qwen2 / Qwen2.5: biases on the Q, K and V projections.
    Qwen2,
    /// Qwen3 (dense): per-head RMSNorm on Q and K before RoPE, no biases.
    Qwen3,
}

impl Architecture {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "llama" => Some(Architecture::Llama),
            "qwen2" => Some(Architecture::Qwen2),
            "qwen3" => Some(Architecture::Qwen3),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
        }
    }

    fn qkv_bias(self) -> bool {
        self == Architecture::Qwen2
    }

    fn qk_norm(self) -> bool {
        self == Architecture::Qwen3
    }
}

/// How rotary embeddings pair up the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// Pairs `(2i, 2i+1)`: llama.cpp's layout for Llama GGUFs, whose Q/K weights are stored
    /// permuted for it.
    Interleaved,
    /// Pairs `(i, i + d/2)`: Hugging Face's `rotate_half` (GPT-NeoX style).
    Half,
}

/// What every caller of a model needs to know of it, whatever its family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dims {
    pub vocab_size: usize,
    /// Width of a hidden row ([`crate::ForwardOutput::hidden`], [`crate::LanguageModel::embed`]).
    pub hidden_size: usize,
    /// Most positions a sequence may hold.
    pub context_length: usize,
}

/// Everything the graph needs to know about a model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_style: RopeStyle,
    pub context_length: usize,
    pub tie_embeddings: bool,
    pub qkv_bias: bool,
    pub qk_norm: bool,
}

impl ModelConfig {
    /// The KV geometry of this model.
    pub fn kv_shape(&self) -> mtplx_kv::KvShape {
        mtplx_kv::KvShape {
            layers: self.num_layers,
            kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
        }
    }

    /// What callers of a model of this config need to know of it.
    pub fn dims(&self) -> Dims {
        Dims {
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            context_length: self.context_length,
        }
    }

    /// The geometry part of the reuse key (`LanguageModel::geometry`).
    pub fn geometry(&self) -> String {
        format!(
            "layers={} hidden={} vocab={}",
            self.num_layers, self.hidden_size, self.vocab_size
        )
    }

    /// Peak activation bytes of a prefill pass of `chunk_tokens` rows: per row the
    /// residual, norm, q/k/v/o, gate/up/act (`f32`), plus the last row's logits.
    pub fn prefill_activation_bytes(&self, chunk_tokens: usize) -> u64 {
        let (h, i, v) = (
            self.hidden_size as u64,
            self.intermediate_size as u64,
            self.vocab_size as u64,
        );
        chunk_tokens.max(1) as u64 * (8 * h + 3 * i) * 4 + v * 4
    }

    fn validate(self, path: &Path) -> Result<Self> {
        let bad = |reason: String| ModelError::BadConfig {
            path: path.to_path_buf(),
            reason,
        };
        let dims = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("num_kv_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("context_length", self.context_length),
        ];
        if let Some((name, _)) = dims.iter().find(|(_, v)| *v == 0) {
            return Err(bad(format!("{name} is zero")));
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(bad(format!(
                "{} attention heads cannot share {} KV heads",
                self.num_heads, self.num_kv_heads
            )));
        }
        if !self.head_dim.is_multiple_of(2)
            || self.head_dim > mtplx_kernels::attention::MAX_HEAD_DIM
        {
            return Err(bad(format!("unsupported head_dim {}", self.head_dim)));
        }
        if !(self.rms_norm_eps > 0.0 && self.rope_theta > 0.0) {
            return Err(bad("rms_norm_eps and rope_theta must be positive".into()));
        }
        Ok(self)
    }

    /// Reads the config from GGUF metadata (`general.architecture` and `<arch>.*` keys).
    pub fn from_gguf(path: &Path, md: &HashMap<String, Value>) -> Result<Self> {
        let bad = |reason: String| ModelError::BadConfig {
            path: path.to_path_buf(),
            reason,
        };
        let arch_name = md
            .get("general.architecture")
            .and_then(|v| v.to_string().ok())
            .ok_or_else(|| bad("missing general.architecture".into()))?;
        let arch =
            Architecture::parse(arch_name).ok_or_else(|| ModelError::UnsupportedArchitecture {
                path: path.to_path_buf(),
                arch: arch_name.clone(),
            })?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let int = |k: &str| -> Result<usize> {
            let v = md
                .get(&key(k))
                .ok_or_else(|| bad(format!("missing {}", key(k))))?;
            v.to_u64()
                .or_else(|_| v.to_u32().map(u64::from))
                .or_else(|_| v.to_i32().map(|x| x.max(0) as u64))
                .map(|x| x as usize)
                .map_err(|e| bad(format!("{}: {e}", key(k))))
        };
        let float = |k: &str| -> Option<f32> {
            md.get(&key(k))
                .and_then(|v| v.to_f32().ok().or(v.to_f64().ok().map(|x| x as f32)))
        };
        let hidden_size = int("embedding_length")?;
        let num_heads = int("attention.head_count")?;
        let num_kv_heads = int("attention.head_count_kv").unwrap_or(num_heads);
        let head_dim = int("attention.key_length").unwrap_or(hidden_size / num_heads.max(1));
        let vocab_size = match int("vocab_size") {
            Ok(v) => v,
            Err(_) => md
                .get("tokenizer.ggml.tokens")
                .and_then(|v| v.to_vec().ok())
                .map(|v| v.len())
                .ok_or_else(|| bad("no vocab_size and no tokenizer.ggml.tokens".into()))?,
        };
        ModelConfig {
            arch,
            vocab_size,
            hidden_size,
            intermediate_size: int("feed_forward_length")?,
            num_layers: int("block_count")?,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: float("attention.layer_norm_rms_epsilon").ok_or_else(|| {
                bad(format!(
                    "missing {}",
                    key("attention.layer_norm_rms_epsilon")
                ))
            })?,
            rope_theta: float("rope.freq_base").unwrap_or(10_000.0),
            // llama.cpp stores Llama Q/K permuted for interleaved RoPE; Qwen uses NeoX.
            rope_style: match arch {
                Architecture::Llama => RopeStyle::Interleaved,
                Architecture::Qwen2 | Architecture::Qwen3 => RopeStyle::Half,
            },
            context_length: int("context_length")?,
            // Settled by the loader: tied when the file has no `output.weight`.
            tie_embeddings: true,
            qkv_bias: arch.qkv_bias(),
            qk_norm: arch.qk_norm(),
        }
        .validate(path)
    }

    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_json(path: &Path, text: &str) -> Result<Self> {
        let bad = |reason: String| ModelError::BadConfig {
            path: path.to_path_buf(),
            reason,
        };
        let c: HfConfig = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        let arch = Architecture::parse(&c.model_type).ok_or_else(|| {
            ModelError::UnsupportedArchitecture {
                path: path.to_path_buf(),
                arch: c.model_type.clone(),
            }
        })?;
        if let Some(scaling) = c.rope_scaling.as_ref().filter(|v| !v.is_null()) {
            return Err(bad(format!("rope_scaling {scaling} is not supported yet")));
        }
        ModelConfig {
            arch,
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            num_layers: c.num_hidden_layers,
            num_heads: c.num_attention_heads,
            num_kv_heads: c.num_key_value_heads.unwrap_or(c.num_attention_heads),
            head_dim: c
                .head_dim
                .unwrap_or(c.hidden_size / c.num_attention_heads.max(1)),
            rms_norm_eps: c.rms_norm_eps as f32,
            rope_theta: c.rope_theta.unwrap_or(10_000.0) as f32,
            rope_style: RopeStyle::Half,
            context_length: c.max_position_embeddings,
            tie_embeddings: c.tie_word_embeddings.unwrap_or(false),
            qkv_bias: c.attention_bias.unwrap_or(arch.qkv_bias()),
            qk_norm: arch.qk_norm(),
        }
        .validate(path)
    }
}

#[derive(Deserialize)]
struct HfConfig {
    model_type: String,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    max_position_embeddings: usize,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    rope_scaling: Option<serde_json::Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3: &str = r#"{"model_type":"qwen3","vocab_size":320,"hidden_size":64,
        "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,
        "num_key_value_heads":2,"head_dim":16,"rms_norm_eps":1e-6,"rope_theta":1000000.0,
        "max_position_embeddings":512,"tie_word_embeddings":true}"#;

    #[test]
    fn reads_hf_qwen3() {
        let c = ModelConfig::from_hf_json(Path::new("c.json"), QWEN3).unwrap();
        assert_eq!(c.arch, Architecture::Qwen3);
        assert!(c.qk_norm && !c.qkv_bias && c.tie_embeddings);
        assert_eq!((c.head_dim, c.num_kv_heads), (16, 2));
    }

    #[test]
    fn rejects_bad_configs() {
        let e = ModelConfig::from_hf_json(Path::new("c.json"), &QWEN3.replace("qwen3", "gpt2"));
        assert!(
            matches!(e, Err(ModelError::UnsupportedArchitecture { arch, .. }) if arch == "gpt2")
        );
        let e = ModelConfig::from_hf_json(
            Path::new("c.json"),
            &QWEN3.replace("\"num_key_value_heads\":2", "\"num_key_value_heads\":3"),
        );
        assert!(matches!(e, Err(ModelError::BadConfig { .. })));
        let e = ModelConfig::from_hf_json(Path::new("c.json"), "{");
        assert!(matches!(e, Err(ModelError::BadConfig { .. })));
    }
}
