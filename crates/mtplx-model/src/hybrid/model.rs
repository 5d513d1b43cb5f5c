//! The hybrid decoder: embedding, layers of gated delta nets and gated attention (each
//! followed by a SwiGLU MLP), final norm, output head.

use crate::config::Dims;
use crate::error::{ModelError, Result};
use std::sync::Arc;

use crate::hybrid::config::HybridConfig;
use crate::hybrid::layer::{Layer, Scratch, State};
use crate::hybrid::mtp::HybridMtpHead;
use crate::hybrid::weights::{HybridWeights, MixerWeights};
use crate::model::{ForwardOutput, LanguageModel, Want};
use crate::ops::{self, Rope};
use crate::weights::{Linear, WeightFormat};
use crate::RopeStyle;
use mtplx_kv::{Sequence, StateShape};

/// A Qwen3-Next-style hybrid model on the CPU, its weights run by the batch-invariant
/// kernels. It runs on a [`Sequence`] whose recurrent state its gated delta nets fold
/// tokens into, through the same [`LanguageModel`] seam as the dense models.
pub struct HybridModel {
    config: HybridConfig,
    /// `config.state_shape()`, kept: every forward pass checks the sequence against it.
    state: StateShape,
    embed: Vec<f32>,
    layers: Vec<Layer>,
    final_norm: Vec<f32>,
    lm_head: Arc<Linear>,
    rope: Arc<Rope>,
    /// The checkpoint's multi-token-prediction head, sharing the output head and rotary
    /// table.
    mtp: Option<Arc<HybridMtpHead>>,
}

impl HybridModel {
    /// Builds the model from `weights` (whose shapes must follow `config`).
    pub fn new(config: HybridConfig, weights: &HybridWeights) -> Result<Self> {
        let c = &config;
        validate(c, weights)?;
        let (mut recurrent, mut attention) = (0, 0);
        let mut layers = Vec::with_capacity(c.num_layers);
        for w in &weights.layers {
            let index = match &w.mixer {
                MixerWeights::GatedDeltaNet(_) => &mut recurrent,
                MixerWeights::FullAttention(_) => &mut attention,
            };
            layers.push(Layer::new(c, w, *index)?);
            *index += 1;
        }
        let lm_head = Arc::new(Linear::from_f32(
            &weights.lm_head,
            c.vocab_size,
            c.hidden_size,
            WeightFormat::Native,
        )?);
        let rope = Arc::new(Rope::partial(
            c.head_dim,
            c.rotary_dim(),
            c.rope_theta,
            c.context_length,
            RopeStyle::Half,
        ));
        let mtp = match &weights.mtp {
            Some(w) => Some(Arc::new(HybridMtpHead::new(
                c,
                w,
                &weights.final_norm,
                lm_head.clone(),
                rope.clone(),
            )?)),
            None => None,
        };
        Ok(HybridModel {
            embed: weights.embed.clone(),
            layers,
            final_norm: weights.final_norm.clone(),
            lm_head,
            rope,
            mtp,
            state: config.state_shape(),
            config,
        })
    }

    /// Loads a Qwen3-Next Hugging Face folder (`config.json` and safetensors under the
    /// published names, [`crate::hybrid::hf`]) or, when `path` is a file, a hybrid GGUF
    /// file under llama.cpp's names ([`crate::hybrid::gguf`]).
    pub fn load(path: &std::path::Path) -> Result<Self> {
        let (config, weights) = if path.is_dir() {
            crate::hybrid::hf::load(path)?
        } else {
            crate::hybrid::gguf::load(path)?
        };
        Self::new(config, &weights)
    }

    pub fn config(&self) -> &HybridConfig {
        &self.config
    }

    /// The multi-token-prediction head the checkpoint carries (its `mtp.*` tensors), if any.
    pub fn mtp_head(&self) -> Option<Arc<HybridMtpHead>> {
        self.mtp.clone()
    }

    /// Whether every product is batch-invariant (always, with the kernels).
    pub fn is_batch_invariant(&self) -> bool {
        self.lm_head.is_batch_invariant()
            && self.layers.iter().all(Layer::is_batch_invariant)
            && self.mtp.as_ref().is_none_or(|m| m.is_batch_invariant())
    }

    fn check(&self, tokens: &[u32], seq: &Sequence) -> Result<()> {
        let c = &self.config;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(ModelError::TokenOutOfRange {
                id,
                vocab: c.vocab_size,
            });
        }
        if !seq.fits(&self.state) {
            return Err(ModelError::Hybrid {
                reason: "the sequence was built for another model".into(),
            });
        }
        let max = c.context_length;
        if seq.len() + tokens.len() > max {
            return Err(ModelError::ContextFull {
                len: seq.len(),
                new: tokens.len(),
                max,
            });
        }
        Ok(())
    }

    fn forward_piece(
        &self,
        tokens: &[u32],
        seq: &mut Sequence,
        want: Want,
    ) -> Result<ForwardOutput> {
        let (n, h) = (tokens.len(), self.config.hidden_size);
        let mut x = self.embed(tokens)?;
        let pos0 = seq.len();
        let (kv, recurrent) = seq.parts_mut();
        let Some(recurrent) = recurrent else {
            return Err(ModelError::Hybrid {
                reason: "the sequence has no recurrent state".into(),
            });
        };
        let mut state = State {
            kv,
            recurrent: Some(recurrent),
            pos0,
        };
        let mut scratch = Scratch::default();
        for l in &self.layers {
            l.forward(&mut x, n, &mut state, &self.rope, &mut scratch)?;
        }
        if let Some(r) = state.recurrent {
            r.advance(n);
        }
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
        let logits = self.head(&hidden)?;
        Ok(ForwardOutput {
            rows,
            logits,
            hidden,
        })
    }
}

impl LanguageModel for HybridModel {
    fn dims(&self) -> Dims {
        let c = &self.config;
        Dims {
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            context_length: c.context_length,
        }
    }

    fn state_shape(&self) -> StateShape {
        self.state.clone()
    }

    /// Runs `tokens` at positions `seq.len()..`, folding them into the sequence. When the
    /// sequence's policy asks for checkpoints on a grid, the pass is split at the grid's
    /// positions and a checkpoint recorded at each (a row's result does not depend on the
    /// split).
    fn forward_into(
        &self,
        tokens: &[u32],
        seq: &mut Sequence,
        want: Want,
        out: &mut ForwardOutput,
    ) -> Result<()> {
        let n = tokens.len();
        if n == 0 {
            return Err(ModelError::EmptyInput);
        }
        self.check(tokens, seq)?;
        out.rows = 0;
        out.logits.clear();
        out.hidden.clear();
        let mut start = 0;
        while start < n {
            let pos = seq.len();
            let end = match seq.next_boundary(pos) {
                Some(b) if b - pos < n - start => start + (b - pos),
                _ => n,
            };
            let piece_want = match want {
                Want::All | Want::Hidden => want,
                Want::Last if end == n => Want::Last,
                _ => Want::Nothing,
            };
            let piece = self.forward_piece(&tokens[start..end], seq, piece_want)?;
            out.rows += piece.rows;
            out.logits.extend_from_slice(&piece.logits);
            out.hidden.extend_from_slice(&piece.hidden);
            seq.checkpoint_if_due();
            start = end;
        }
        Ok(())
    }

    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let c = &self.config;
        let h = c.hidden_size;
        let mut x = Vec::with_capacity(tokens.len() * h);
        for &t in tokens {
            if t as usize >= c.vocab_size {
                return Err(ModelError::TokenOutOfRange {
                    id: t,
                    vocab: c.vocab_size,
                });
            }
            x.extend_from_slice(&self.embed[t as usize * h..(t as usize + 1) * h]);
        }
        Ok(x)
    }

    fn head(&self, hidden: &[f32]) -> Result<Vec<f32>> {
        let c = &self.config;
        let rows = hidden.len() / c.hidden_size;
        let mut normed = vec![0f32; hidden.len()];
        ops::rms_norm(hidden, &self.final_norm, c.rms_norm_eps, &mut normed);
        self.lm_head.forward(&normed, rows)
    }

    fn geometry(&self) -> String {
        let c = &self.config;
        let attention = c.kv_shape().layers;
        format!(
            "qwen3_next layers={} attention_layers={attention} hidden={} vocab={}",
            c.num_layers, c.hidden_size, c.vocab_size
        )
    }

    fn numerics(&self) -> String {
        format!("weights={:?}", WeightFormat::Native)
    }

    fn weight_bytes(&self) -> usize {
        let mtp = self.mtp.as_ref().map_or(0, |m| m.weight_bytes());
        self.weight_bytes_per_token() + mtp + self.embed.len() * 4
    }

    fn weight_bytes_per_token(&self) -> usize {
        // The embedding is an `f32` table of its own (one row a token); the MTP head runs
        // only when drafting.
        let layers: usize = self.layers.iter().map(Layer::weight_bytes).sum();
        layers + self.lm_head.weight_bytes()
    }

    fn is_batch_invariant(&self) -> bool {
        HybridModel::is_batch_invariant(self)
    }

    /// Per row the residual, norms and mixer output, the widest projection (a gated delta
    /// net's `q|k|v|z|b|a`, or gated attention's `q|gate|k|v`), gate/up/act (`f32`), plus
    /// the last row's logits.
    fn prefill_activation_bytes(&self, chunk_tokens: usize) -> u64 {
        let c = &self.config;
        let gdn = 2 * c.linear_key_dim() + 2 * c.linear_value_dim() + 2 * c.linear_num_value_heads;
        let attn = 2 * c.num_attention_heads * c.head_dim + 2 * c.num_key_value_heads * c.head_dim;
        let row = 4 * c.hidden_size + gdn.max(attn) + 3 * c.intermediate_size;
        (chunk_tokens.max(1) * row * 4 + c.vocab_size * 4) as u64
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
    if let Some(m) = &w.mtp {
        if !matches!(m.layer.mixer, MixerWeights::FullAttention(_)) {
            return bad("the MTP head's layer is not full attention".into());
        }
        let norms = [&m.pre_fc_norm_embedding, &m.pre_fc_norm_hidden, &m.norm];
        if m.fc.len() != 2 * h * h || norms.iter().any(|n| n.len() != h) {
            return bad("the MTP head's `fc` or norms are of the wrong size".into());
        }
    }
    Ok(())
}
