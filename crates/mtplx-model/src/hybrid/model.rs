//! The hybrid decoder: embedding, layers of gated delta nets and gated attention (each
//! followed by a SwiGLU MLP), final norm, output head.

use crate::error::{ModelError, Result};
use crate::hybrid::attention::GatedAttention;
use crate::hybrid::cache::HybridCache;
use crate::hybrid::config::HybridConfig;
use crate::hybrid::gdn::GatedDeltaNet;
use crate::hybrid::weights::{HybridWeights, MixerWeights, MlpWeights};
use crate::model::{ForwardOutput, Want};
use crate::ops::{self, Rope};
use crate::weights::{Linear, WeightFormat};
use crate::RopeStyle;

enum Mixer {
    /// The gated delta net and its index among the recurrent layers.
    GatedDeltaNet(GatedDeltaNet, usize),
    /// The attention layer and its index among the attention layers (its KV layer).
    FullAttention(GatedAttention, usize),
}

struct Layer {
    input_norm: Vec<f32>,
    mixer: Mixer,
    post_attention_norm: Vec<f32>,
    /// Gate and up side by side in each output row.
    gate_up: Linear,
    down: Linear,
}

/// A Qwen3-Next-style hybrid model on the CPU, its weights run by the batch-invariant
/// kernels. Its state is a [`HybridCache`], not a bare [`mtplx_kv::KvCache`], so it does
/// not implement [`crate::LanguageModel`].
pub struct HybridModel {
    config: HybridConfig,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
    lm_head: Linear,
    rope: Rope,
}

impl HybridModel {
    /// Builds the model from `weights` (whose shapes must follow `config`).
    pub fn new(config: HybridConfig, weights: &HybridWeights) -> Result<Self> {
        let c = &config;
        validate(c, weights)?;
        let (h, inter) = (c.hidden_size, c.intermediate_size);
        let f = WeightFormat::Native;
        let (mut recurrent, mut attention) = (0, 0);
        let mut layers = Vec::with_capacity(c.num_layers);
        for w in &weights.layers {
            let mixer = match &w.mixer {
                MixerWeights::GatedDeltaNet(g) => {
                    recurrent += 1;
                    Mixer::GatedDeltaNet(GatedDeltaNet::new(c, g)?, recurrent - 1)
                }
                MixerWeights::FullAttention(a) => {
                    attention += 1;
                    Mixer::FullAttention(GatedAttention::new(c, a)?, attention - 1)
                }
            };
            let MlpWeights { gate, up, down } = &w.mlp;
            layers.push(Layer {
                input_norm: w.input_norm.clone(),
                mixer,
                post_attention_norm: w.post_attention_norm.clone(),
                gate_up: Linear::concat(vec![
                    Linear::from_f32(gate, inter, h, f)?,
                    Linear::from_f32(up, inter, h, f)?,
                ])?,
                down: Linear::from_f32(down, h, inter, f)?,
            });
        }
        Ok(HybridModel {
            embed: weights.embed.clone(),
            layers,
            final_norm: weights.final_norm.clone(),
            lm_head: Linear::from_f32(&weights.lm_head, c.vocab_size, h, f)?,
            rope: Rope::partial(
                c.head_dim,
                c.rotary_dim(),
                c.rope_theta,
                c.context_length,
                RopeStyle::Half,
            ),
            config,
        })
    }

    /// Loads a Qwen3-Next Hugging Face folder (`config.json` and safetensors under the
    /// published names, [`crate::hybrid::hf`]).
    pub fn load(dir: &std::path::Path) -> Result<Self> {
        let (config, weights) = crate::hybrid::hf::load(dir)?;
        Self::new(config, &weights)
    }

    pub fn config(&self) -> &HybridConfig {
        &self.config
    }

    /// Whether every product is batch-invariant (always, with the kernels).
    pub fn is_batch_invariant(&self) -> bool {
        self.lm_head.is_batch_invariant()
            && self.layers.iter().all(|l| {
                l.gate_up.is_batch_invariant()
                    && l.down.is_batch_invariant()
                    && match &l.mixer {
                        Mixer::GatedDeltaNet(g, _) => g.is_batch_invariant(),
                        Mixer::FullAttention(a, _) => a.is_batch_invariant(),
                    }
            })
    }

    /// Runs `tokens` at positions `cache.len()..`, folding them into the cache. When the
    /// cache's policy asks for checkpoints on a grid, the pass is split at the grid's
    /// positions and a checkpoint recorded at each (a row's result does not depend on the
    /// split).
    pub fn forward(
        &self,
        tokens: &[u32],
        cache: &mut HybridCache,
        want: Want,
    ) -> Result<ForwardOutput> {
        let n = tokens.len();
        if n == 0 {
            return Err(ModelError::EmptyInput);
        }
        self.check(tokens, cache)?;
        let mut out = ForwardOutput::default();
        let mut start = 0;
        while start < n {
            let pos = cache.len();
            let end = match cache.next_boundary(pos) {
                Some(b) if b - pos < n - start => start + (b - pos),
                _ => n,
            };
            let piece_want = match want {
                Want::All => Want::All,
                Want::Last if end == n => Want::Last,
                _ => Want::Nothing,
            };
            let piece = self.forward_piece(&tokens[start..end], cache, piece_want)?;
            out.rows += piece.rows;
            out.logits.extend_from_slice(&piece.logits);
            out.hidden.extend_from_slice(&piece.hidden);
            cache.checkpoint_if_due();
            start = end;
        }
        Ok(out)
    }

    /// Runs `tokens` in chunks of at most `chunk`, records a checkpoint at their end (the
    /// end of a prompt), and returns the last row's logits and hidden state.
    pub fn prefill(
        &self,
        tokens: &[u32],
        cache: &mut HybridCache,
        chunk: usize,
    ) -> Result<ForwardOutput> {
        let mut out = ForwardOutput::default();
        let pieces = tokens.chunks(chunk.max(1));
        let last = pieces.len().saturating_sub(1);
        for (i, piece) in pieces.enumerate() {
            let want = if i == last { Want::Last } else { Want::Nothing };
            out = self.forward(piece, cache, want)?;
        }
        cache.checkpoint();
        Ok(out)
    }

    fn check(&self, tokens: &[u32], cache: &HybridCache) -> Result<()> {
        let c = &self.config;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(ModelError::TokenOutOfRange {
                id,
                vocab: c.vocab_size,
            });
        }
        let shapes = c.recurrent_shapes();
        let r = cache.recurrent();
        let same_recurrent = r.layers() == shapes.len()
            && shapes
                .iter()
                .enumerate()
                .all(|(l, s)| r.layer_shape(l).ok() == Some(s));
        if cache.kv().shape() != c.kv_shape() || !same_recurrent {
            return Err(ModelError::Hybrid {
                reason: "the cache was built for another model".into(),
            });
        }
        if cache.kv().len() != r.tokens() {
            return Err(ModelError::Hybrid {
                reason: format!(
                    "{} K/V positions but a recurrent state after {} tokens",
                    cache.kv().len(),
                    r.tokens()
                ),
            });
        }
        let max = c.context_length;
        if cache.len() + tokens.len() > max {
            return Err(ModelError::ContextFull {
                len: cache.len(),
                new: tokens.len(),
                max,
            });
        }
        Ok(())
    }

    fn forward_piece(
        &self,
        tokens: &[u32],
        cache: &mut HybridCache,
        want: Want,
    ) -> Result<ForwardOutput> {
        let c = &self.config;
        let (n, h, eps) = (tokens.len(), c.hidden_size, c.rms_norm_eps);
        let mut x = Vec::with_capacity(n * h);
        for &t in tokens {
            x.extend_from_slice(&self.embed[t as usize * h..(t as usize + 1) * h]);
        }
        let mut normed = vec![0f32; n * h];
        let mut mixed = vec![0f32; n * h];
        let mut act = vec![0f32; n * c.intermediate_size];
        let (kv, recurrent) = cache.parts_mut();
        for l in &self.layers {
            ops::rms_norm(&x, &l.input_norm, eps, &mut normed);
            match &l.mixer {
                Mixer::GatedDeltaNet(g, i) => {
                    let (conv, ssm) = recurrent.state_mut(*i)?;
                    g.forward(&normed, n, conv, ssm, &mut mixed)?;
                }
                Mixer::FullAttention(a, i) => {
                    a.forward(&normed, n, kv, *i, &self.rope, &mut mixed)?
                }
            }
            ops::add_inplace(&mut x, &mixed);
            ops::rms_norm(&x, &l.post_attention_norm, eps, &mut normed);
            let gate_up = l.gate_up.forward(&normed, n)?;
            ops::silu_mul_halves(&gate_up, c.intermediate_size, &mut act);
            l.down.forward_into(&act, n, &mut mixed)?;
            ops::add_inplace(&mut x, &mixed);
        }
        recurrent.advance(n);
        let first = match want {
            Want::Nothing => return Ok(ForwardOutput::default()),
            Want::Hidden => {
                return Ok(ForwardOutput {
                    rows: n,
                    logits: Vec::new(),
                    hidden: x,
                })
            }
            Want::Last => n - 1,
            Want::All => 0,
        };
        let rows = n - first;
        let hidden = x[first * h..].to_vec();
        let mut final_normed = vec![0f32; rows * h];
        ops::rms_norm(&hidden, &self.final_norm, eps, &mut final_normed);
        let logits = self.lm_head.forward(&final_normed, rows)?;
        Ok(ForwardOutput {
            rows,
            logits,
            hidden,
        })
    }
}

/// Checks that `w` has the shapes `c` names.
fn validate(c: &HybridConfig, w: &HybridWeights) -> Result<()> {
    let bad = |reason: String| Err(ModelError::Hybrid { reason });
    c.check().or_else(bad)?;
    if w.layers.len() != c.num_layers {
        return bad(format!(
            "{} layers of weights for {}",
            w.layers.len(),
            c.num_layers
        ));
    }
    for (l, lw) in w.layers.iter().enumerate() {
        let kind_ok = matches!(
            (&lw.mixer, c.layer_kind(l)),
            (
                MixerWeights::GatedDeltaNet(_),
                crate::hybrid::LayerKind::GatedDeltaNet
            ) | (
                MixerWeights::FullAttention(_),
                crate::hybrid::LayerKind::FullAttention
            )
        );
        if !kind_ok {
            return bad(format!("layer {l}'s weights are of the other kind"));
        }
    }
    let (h, v) = (c.hidden_size, c.vocab_size);
    if w.embed.len() != v * h || w.lm_head.len() != v * h || w.final_norm.len() != h {
        return bad("embedding, head or final norm of the wrong size".into());
    }
    Ok(())
}
