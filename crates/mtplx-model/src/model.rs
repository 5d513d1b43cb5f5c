//! The decoder graph of the Llama / Qwen2 / Qwen3 family.

use std::path::Path;

use candle_core::{Device, Tensor};
use mtplx_kv::KvCache;

use crate::config::{Architecture, ModelConfig};
use crate::error::{ModelError, Result};
use crate::ops::{self, Rope};
use crate::source::{GgufSource, HfSource, TensorRole, WeightSource};
use crate::weights::{Linear, RawWeight, WeightFormat};

/// Which rows of a forward pass the caller wants logits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// No logits (an intermediate prefill chunk).
    Nothing,
    /// The last row only (the end of a prefill, a decode step).
    Last,
    /// Every row (a speculative verify block).
    All,
}

/// What a forward pass returns for the rows the caller wanted.
#[derive(Debug, Clone, Default)]
pub struct ForwardOutput {
    /// Rows for which logits and hidden states are given.
    pub rows: usize,
    /// `[rows, vocab]`.
    pub logits: Vec<f32>,
    /// `[rows, hidden]`: the last layer's output before the final norm (what an MTP head
    /// consumes).
    pub hidden: Vec<f32>,
}

impl ForwardOutput {
    /// Logits of row `r`.
    pub fn logits_row(&self, r: usize) -> &[f32] {
        let v = self.logits.len() / self.rows.max(1);
        &self.logits[r * v..(r + 1) * v]
    }

    /// Logits of the last row.
    pub fn last_logits(&self) -> &[f32] {
        self.logits_row(self.rows.saturating_sub(1))
    }
}

/// The seam the rest of mtplx uses: a causal language model that writes its K/V through a
/// [`KvCache`]. Another backend (MLX on macOS, say) implements this trait.
pub trait LanguageModel: Send + Sync {
    fn config(&self) -> &ModelConfig;

    /// Runs `tokens` at positions `cache.len()..`, appending their K/V to `cache`.
    fn forward(&self, tokens: &[u32], cache: &mut dyn KvCache, want: Want)
        -> Result<ForwardOutput>;

    /// Embeds tokens (`[n, hidden]`); an MTP head reuses the trunk's embedding.
    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>>;

    /// Final norm and output head on hidden rows (`[n, hidden]` → `[n, vocab]`).
    fn head(&self, hidden: &[f32]) -> Result<Vec<f32>>;
}

struct Layer {
    attn_norm: Vec<f32>,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// A loaded model: weights in memory, ready to run.
pub struct Model {
    config: ModelConfig,
    format: WeightFormat,
    /// `[vocab, hidden]`, dense `f32`.
    embed: Tensor,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
    lm_head: Linear,
    rope: Rope,
}

impl Model {
    /// Loads a GGUF file or a Hugging Face folder.
    pub fn load(path: &Path, format: WeightFormat) -> Result<Self> {
        if path.is_dir() {
            let mut src = HfSource::open(path)?;
            let config = src.config()?;
            Self::from_source(&mut src, config, format)
        } else {
            let mut src = GgufSource::open(path)?;
            let config = src.config()?;
            Self::from_source(&mut src, config, format)
        }
    }

    /// Builds the graph from any checkpoint.
    pub fn from_source(
        src: &mut dyn WeightSource,
        mut config: ModelConfig,
        format: WeightFormat,
    ) -> Result<Self> {
        let c = config.clone();
        let mut take = |role: TensorRole, layer: usize, expected: &[usize]| -> Result<RawWeight> {
            let name = src.name(role, layer);
            let w = src.get(&name)?.ok_or_else(|| ModelError::MissingTensor {
                path: src.path().to_path_buf(),
                tensor: name.clone(),
            })?;
            check_shape(src.path(), &name, &w.dims(), expected)?;
            Ok(w)
        };
        let (h, hd) = (c.hidden_size, c.head_dim);
        let (qd, kvd) = (c.num_heads * hd, c.num_kv_heads * hd);
        let embed_raw = take(TensorRole::Embed, 0, &[c.vocab_size, h])?;
        let embed = embed_raw.to_dense()?;
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let mut lin = |role, shape: [usize; 2]| Linear::new(take(role, i, &shape)?, format);
            let q = lin(TensorRole::Q, [qd, h])?;
            let k = lin(TensorRole::K, [kvd, h])?;
            let v = lin(TensorRole::V, [kvd, h])?;
            let o = lin(TensorRole::O, [h, qd])?;
            let gate = lin(TensorRole::Gate, [c.intermediate_size, h])?;
            let up = lin(TensorRole::Up, [c.intermediate_size, h])?;
            let down = lin(TensorRole::Down, [h, c.intermediate_size])?;
            let mut vec = |role, len: usize| take(role, i, &[len])?.to_vec();
            let (q, k, v) = if c.qkv_bias {
                (
                    q.with_bias(vec(TensorRole::QBias, qd)?),
                    k.with_bias(vec(TensorRole::KBias, kvd)?),
                    v.with_bias(vec(TensorRole::VBias, kvd)?),
                )
            } else {
                (q, k, v)
            };
            let (q_norm, k_norm) = if c.qk_norm {
                (
                    Some(vec(TensorRole::QNorm, hd)?),
                    Some(vec(TensorRole::KNorm, hd)?),
                )
            } else {
                (None, None)
            };
            layers.push(Layer {
                attn_norm: vec(TensorRole::AttnNorm, h)?,
                ffn_norm: vec(TensorRole::FfnNorm, h)?,
                q,
                k,
                v,
                o,
                q_norm,
                k_norm,
                gate,
                up,
                down,
            });
        }
        let final_norm = take(TensorRole::FinalNorm, 0, &[h])?.to_vec()?;
        let head_name = src.name(TensorRole::LmHead, 0);
        let lm_head = match src.get(&head_name)? {
            Some(w) => {
                check_shape(src.path(), &head_name, &w.dims(), &[c.vocab_size, h])?;
                config.tie_embeddings = false;
                Linear::new(w, format)?
            }
            // GGUF files without `output.weight` tie the head to the embedding.
            None if c.tie_embeddings || matches!(embed_raw, RawWeight::Quant(_)) => {
                config.tie_embeddings = true;
                match format {
                    WeightFormat::F32 => Linear::dense(embed.clone())?,
                    WeightFormat::Quantized => Linear::new(embed_raw, format)?,
                }
            }
            None => {
                return Err(ModelError::MissingTensor {
                    path: src.path().to_path_buf(),
                    tensor: head_name,
                })
            }
        };
        let rope = Rope::new(hd, c.rope_theta, c.context_length, c.rope_style);
        Ok(Model {
            config,
            format,
            embed,
            layers,
            final_norm,
            lm_head,
            rope,
        })
    }

    pub fn format(&self) -> WeightFormat {
        self.format
    }

    pub fn arch(&self) -> Architecture {
        self.config.arch
    }

    /// Bytes of weights held in memory.
    pub fn weight_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]
                    .iter()
                    .map(|x| x.weight_bytes())
                    .sum::<usize>()
            })
            .sum();
        let head = if self.config.tie_embeddings && !self.lm_head.is_quantized() {
            0
        } else {
            self.lm_head.weight_bytes()
        };
        layers + self.embed.elem_count() * 4 + head
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let vocab = self.config.vocab_size;
        match tokens.iter().find(|&&t| t as usize >= vocab) {
            Some(&id) => Err(ModelError::TokenOutOfRange { id, vocab }),
            None => Ok(()),
        }
    }
}

fn check_shape(path: &Path, name: &str, got: &[usize], expected: &[usize]) -> Result<()> {
    if got != expected {
        return Err(ModelError::TensorShape {
            path: path.to_path_buf(),
            tensor: name.to_string(),
            got: got.to_vec(),
            expected: expected.to_vec(),
        });
    }
    Ok(())
}

impl LanguageModel for Model {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check_tokens(tokens)?;
        let ids = Tensor::from_slice(tokens, tokens.len(), &Device::Cpu)?;
        Ok(self.embed.index_select(&ids, 0)?.flatten_all()?.to_vec1()?)
    }

    fn head(&self, hidden: &[f32]) -> Result<Vec<f32>> {
        let n = hidden.len() / self.config.hidden_size;
        let mut x = hidden.to_vec();
        ops::rms_norm_inplace(&mut x, &self.final_norm, self.config.rms_norm_eps);
        self.lm_head.forward(&x, n)
    }

    fn forward(
        &self,
        tokens: &[u32],
        cache: &mut dyn KvCache,
        want: Want,
    ) -> Result<ForwardOutput> {
        let c = &self.config;
        let n = tokens.len();
        if n == 0 {
            return Err(ModelError::EmptyInput);
        }
        let pos0 = cache.len();
        let max = c.context_length.min(self.rope.max_positions());
        if pos0 + n > max {
            return Err(ModelError::ContextFull {
                len: pos0,
                new: n,
                max,
            });
        }
        let (h, hd) = (c.hidden_size, c.head_dim);
        let eps = c.rms_norm_eps;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut x = self.embed(tokens)?;
        let mut normed = vec![0f32; n * h];
        let mut attn = vec![0f32; n * c.num_heads * hd];
        for (li, l) in self.layers.iter().enumerate() {
            ops::rms_norm(&x, &l.attn_norm, eps, &mut normed);
            let mut q = l.q.forward(&normed, n)?;
            let mut k = l.k.forward(&normed, n)?;
            let v = l.v.forward(&normed, n)?;
            if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
                ops::rms_norm_inplace(&mut q, qn, eps);
                ops::rms_norm_inplace(&mut k, kn, eps);
            }
            self.rope.apply(&mut q, c.num_heads, pos0);
            self.rope.apply(&mut k, c.num_kv_heads, pos0);
            cache.append(li, &k, &v)?;
            cache.attend(li, &q, c.num_heads, scale, &mut attn)?;
            ops::add_inplace(&mut x, &l.o.forward(&attn, n)?);
            ops::rms_norm(&x, &l.ffn_norm, eps, &mut normed);
            let mut g = l.gate.forward(&normed, n)?;
            ops::silu_mul(&mut g, &l.up.forward(&normed, n)?);
            ops::add_inplace(&mut x, &l.down.forward(&g, n)?);
        }
        let first = match want {
            Want::Nothing => {
                return Ok(ForwardOutput::default());
            }
            Want::Last => n - 1,
            Want::All => 0,
        };
        let hidden = x[first * h..].to_vec();
        let logits = self.head(&hidden)?;
        Ok(ForwardOutput {
            rows: n - first,
            logits,
            hidden,
        })
    }
}
