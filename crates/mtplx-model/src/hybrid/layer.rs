//! One decoder layer of the hybrid model: `x += mixer(norm(x)); x += mlp(norm(x))`, its
//! mixer a gated delta net or gated attention. The trunk's layers and the MTP head's one
//! layer are both this.

use mtplx_kv::{KvCache, RecurrentState};

use crate::error::{ModelError, Result};
use crate::hybrid::attention::GatedAttention;
use crate::hybrid::config::HybridConfig;
use crate::hybrid::gdn::GatedDeltaNet;
use crate::hybrid::weights::{LayerWeights, MixerWeights, MlpWeights};
use crate::ops::{self, Rope};
use crate::weights::{Linear, WeightFormat};

pub(crate) enum Mixer {
    /// The gated delta net and its index among the recurrent layers.
    GatedDeltaNet(GatedDeltaNet, usize),
    /// The attention layer and its index among the attention layers (its KV layer).
    FullAttention(GatedAttention, usize),
}

pub(crate) struct Layer {
    input_norm: Vec<f32>,
    mixer: Mixer,
    post_attention_norm: Vec<f32>,
    /// Gate and up side by side in each output row.
    gate_up: Linear,
    down: Linear,
    intermediate: usize,
    eps: f32,
}

/// Where a layer's mixer keeps its state: the attention layers' K/V, the gated delta nets'
/// recurrent state (none for a head of attention alone), and the position of the first row.
pub(crate) struct State<'a> {
    pub(crate) kv: &'a mut dyn KvCache,
    pub(crate) recurrent: Option<&'a mut RecurrentState>,
    pub(crate) pos0: usize,
}

/// Buffers one pass's layers share (sized for its rows on first use), so a pass allocates
/// them once, not once per layer.
#[derive(Default)]
pub(crate) struct Scratch {
    normed: Vec<f32>,
    mixed: Vec<f32>,
    act: Vec<f32>,
}

impl Layer {
    /// The layer of `w`; `index` is its mixer's index among the layers of its kind.
    pub(crate) fn new(c: &HybridConfig, w: &LayerWeights, index: usize) -> Result<Self> {
        let (h, inter) = (c.hidden_size, c.intermediate_size);
        let f = WeightFormat::Native;
        let mixer = match &w.mixer {
            MixerWeights::GatedDeltaNet(g) => {
                Mixer::GatedDeltaNet(GatedDeltaNet::new(c, g)?, index)
            }
            MixerWeights::FullAttention(a) => {
                Mixer::FullAttention(GatedAttention::new(c, a)?, index)
            }
        };
        let MlpWeights { gate, up, down } = &w.mlp;
        Ok(Layer {
            input_norm: w.input_norm.clone(),
            mixer,
            post_attention_norm: w.post_attention_norm.clone(),
            gate_up: Linear::concat(vec![
                Linear::from_f32(gate, inter, h, f)?,
                Linear::from_f32(up, inter, h, f)?,
            ])?,
            down: Linear::from_f32(down, h, inter, f)?,
            intermediate: inter,
            eps: c.rms_norm_eps,
        })
    }

    pub(crate) fn is_batch_invariant(&self) -> bool {
        self.gate_up.is_batch_invariant()
            && self.down.is_batch_invariant()
            && match &self.mixer {
                Mixer::GatedDeltaNet(g, _) => g.is_batch_invariant(),
                Mixer::FullAttention(a, _) => a.is_batch_invariant(),
            }
    }

    pub(crate) fn weight_bytes(&self) -> usize {
        let mixer = match &self.mixer {
            Mixer::GatedDeltaNet(g, _) => g.weight_bytes(),
            Mixer::FullAttention(a, _) => a.weight_bytes(),
        };
        mixer + self.gate_up.weight_bytes() + self.down.weight_bytes()
    }

    /// Runs the `n` rows of `x` (`[n, hidden]`) through the layer in place, their mixer
    /// state in `state`.
    pub(crate) fn forward(
        &self,
        x: &mut [f32],
        n: usize,
        state: &mut State<'_>,
        rope: &Rope,
        scratch: &mut Scratch,
    ) -> Result<()> {
        let h = self.input_norm.len();
        let Scratch { normed, mixed, act } = scratch;
        normed.resize(n * h, 0.0);
        mixed.resize(n * h, 0.0);
        act.resize(n * self.intermediate, 0.0);
        let (normed, mixed, act) = (&mut normed[..], &mut mixed[..], &mut act[..]);
        ops::rms_norm(x, &self.input_norm, self.eps, normed);
        match &self.mixer {
            Mixer::GatedDeltaNet(g, i) => {
                let recurrent =
                    state
                        .recurrent
                        .as_deref_mut()
                        .ok_or_else(|| ModelError::Hybrid {
                            reason: "the sequence has no recurrent state".into(),
                        })?;
                let (conv, ssm) = recurrent.state_mut(*i)?;
                g.forward(normed, n, conv, ssm, mixed)?;
            }
            Mixer::FullAttention(a, i) => {
                a.forward(normed, n, state.kv, *i, rope, state.pos0, mixed)?
            }
        }
        ops::add_inplace(x, mixed);
        ops::rms_norm(x, &self.post_attention_norm, self.eps, normed);
        let gate_up = self.gate_up.forward(normed, n)?;
        ops::silu_mul_halves(&gate_up, self.intermediate, act);
        self.down.forward_into(act, n, mixed)?;
        ops::add_inplace(x, mixed);
        Ok(())
    }
}
