//! A hybrid checkpoint's multi-token-prediction head (Qwen3-Next / Qwen3.5's `mtp.*`), as
//! vLLM's `Qwen3NextMultiTokenPredictor` runs it:
//!
//! ```text
//! x  = fc( [ rms(embed(t+1); pre_fc_norm_embedding) ⊕ rms(h_t; pre_fc_norm_hidden) ] )
//! x  = decoder_layer(x)         one gated-attention layer at position t, its own K/V
//! h' = rms(x; mtp.norm)         what the next draft step reads as its h
//! p  = lm_head(h')              the trunk's output head
//! ```
//!
//! `h_t` is the trunk's hidden state after its final norm (what vLLM's trunk hands its
//! drafter); mtplx's trunks hand over the state before it, so the head applies the trunk's
//! final norm first ([`MtpRunner::prepare_trunk_rows`]). The head shares the trunk's embedding,
//! output head and rotary table.

use std::sync::Arc;

use mtplx_kv::{KvCache, KvShape};

use crate::error::{ModelError, Result};
use crate::hybrid::config::HybridConfig;
use crate::hybrid::layer::{Layer, Scratch, State};
use crate::hybrid::weights::MtpWeights;
use crate::model::LanguageModel;
use crate::mtp::MtpRunner;
use crate::ops::{self, Rope};
use crate::weights::{Linear, WeightFormat};

/// The MTP head of a [`crate::hybrid::HybridModel`] (from [`crate::hybrid::HybridModel::mtp_head`]).
pub struct HybridMtpHead {
    hidden: usize,
    eps: f32,
    kv: KvShape,
    /// The trunk's final norm, applied to the trunk's rows the head reads.
    trunk_norm: Vec<f32>,
    norm_embedding: Vec<f32>,
    norm_hidden: Vec<f32>,
    fc: Linear,
    layer: Layer,
    norm: Vec<f32>,
    lm_head: Arc<Linear>,
    rope: Arc<Rope>,
}

impl HybridMtpHead {
    pub(crate) fn new(
        c: &HybridConfig,
        w: &MtpWeights,
        trunk_norm: &[f32],
        lm_head: Arc<Linear>,
        rope: Arc<Rope>,
    ) -> Result<Self> {
        let h = c.hidden_size;
        Ok(HybridMtpHead {
            hidden: h,
            eps: c.rms_norm_eps,
            kv: KvShape {
                layers: 1,
                kv_heads: c.num_key_value_heads,
                head_dim: c.head_dim,
            },
            trunk_norm: trunk_norm.to_vec(),
            norm_embedding: w.pre_fc_norm_embedding.clone(),
            norm_hidden: w.pre_fc_norm_hidden.clone(),
            fc: Linear::from_f32(&w.fc, h, 2 * h, WeightFormat::Native)?,
            layer: Layer::new(c, &w.layer, 0)?,
            norm: w.norm.clone(),
            lm_head,
            rope,
        })
    }

    pub(crate) fn is_batch_invariant(&self) -> bool {
        self.fc.is_batch_invariant() && self.layer.is_batch_invariant()
    }

    /// Bytes of its own weights (the output head is the trunk's).
    pub fn weight_bytes(&self) -> usize {
        self.fc.weight_bytes() + self.layer.weight_bytes()
    }

    /// Runs the head's layer over `n` rows: `hidden` (`[n, H]`, read as
    /// [`MtpRunner::prepare_trunk_rows`] left it) with `next` (the token after each row's position,
    /// embedded by `trunk`), at positions `pos0..`. Appends the rows' K/V to `cache` and
    /// returns the layer's output (`[n, H]`, before `mtp.norm`).
    pub fn forward(
        &self,
        trunk: &dyn LanguageModel,
        hidden: &[f32],
        next: &[u32],
        cache: &mut dyn KvCache,
        pos0: usize,
    ) -> Result<Vec<f32>> {
        let (n, h) = (next.len(), self.hidden);
        if n == 0 {
            return Err(ModelError::EmptyInput);
        }
        if hidden.len() != n * h {
            return Err(ModelError::Hybrid {
                reason: format!("{} hidden values for {n} rows of {h}", hidden.len()),
            });
        }
        let max = self.rope.max_positions();
        if pos0 + n > max {
            return Err(ModelError::ContextFull {
                len: pos0,
                new: n,
                max,
            });
        }
        let cat = crate::mtp::fc_input(
            trunk,
            hidden,
            next,
            &self.norm_embedding,
            &self.norm_hidden,
            self.eps,
        )?;
        let mut x = self.fc.forward(&cat, n)?;
        let mut state = State {
            kv: cache,
            recurrent: None,
            pos0,
        };
        self.layer
            .forward(&mut x, n, &mut state, &self.rope, &mut Scratch::default())?;
        Ok(x)
    }
}

impl MtpRunner for HybridMtpHead {
    fn kv_shape(&self) -> KvShape {
        self.kv
    }

    fn hidden_size(&self) -> usize {
        self.hidden
    }

    fn max_positions(&self) -> usize {
        self.rope.max_positions()
    }

    fn token_of(&self, i: usize) -> u32 {
        i as u32
    }

    fn prepare_trunk_rows(&self, hidden: &mut [f32]) {
        ops::rms_norm_inplace(hidden, &self.trunk_norm, self.eps);
    }

    /// The last row after `mtp.norm` (what the next step reads, as vLLM feeds it back) and
    /// its logits over the whole vocabulary.
    fn last_row(
        &self,
        trunk: &dyn LanguageModel,
        hidden: &[f32],
        next: &[u32],
        cache: &mut dyn KvCache,
        pos0: usize,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let mut x = self.forward(trunk, hidden, next, cache, pos0)?;
        let mut last = x.split_off(x.len() - self.hidden);
        ops::rms_norm_inplace(&mut last, &self.norm, self.eps);
        let logits = self.lm_head.forward(&last, 1)?;
        Ok((last, logits))
    }
}
