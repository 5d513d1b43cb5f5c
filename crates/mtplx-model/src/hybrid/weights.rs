//! A hybrid model's weights as plain row-major `f32` data, drawn from a seed.
//!
//! No published checkpoint ships gated-delta-net weights small enough for tests, so the
//! hybrid model is synthetic: its weights come from [`HybridWeights::random`]. They are
//! plain data (public fields) so that an independent implementation can run the same
//! model.

use crate::hybrid::config::{HybridConfig, LayerKind};
use crate::sampling::Rng;

/// Every weight of a hybrid model. Matrices are `[out, in]`, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct HybridWeights {
    /// `[vocab, hidden]`.
    pub embed: Vec<f32>,
    pub layers: Vec<LayerWeights>,
    /// `[hidden]`.
    pub final_norm: Vec<f32>,
    /// `[vocab, hidden]` (not tied to the embedding).
    pub lm_head: Vec<f32>,
    /// The multi-token-prediction head, when the checkpoint carries one (`mtp.*`).
    pub mtp: Option<MtpWeights>,
}

/// A multi-token-prediction head (Qwen3-Next's `mtp.*`, vLLM's `Qwen3NextMultiTokenPredictor`):
/// from the trunk's hidden state at position `p` (after the trunk's final norm) and the
/// embedding of token `p + 1`, one gated-attention decoder layer predicts token `p + 2`
/// through the trunk's output head. The embedding and output head are the trunk's.
#[derive(Debug, Clone, PartialEq)]
pub struct MtpWeights {
    /// `[hidden]`: the norm of the next token's embedding.
    pub pre_fc_norm_embedding: Vec<f32>,
    /// `[hidden]`: the norm of the trunk's hidden state.
    pub pre_fc_norm_hidden: Vec<f32>,
    /// `[hidden, 2 * hidden]`: input `[embedding ⊕ hidden]`.
    pub fc: Vec<f32>,
    /// One decoder layer; its mixer is [`MixerWeights::FullAttention`].
    pub layer: LayerWeights,
    /// `[hidden]`: the norm before the output head.
    pub norm: Vec<f32>,
}

/// One decoder layer: `x += mixer(norm(x)); x += mlp(norm(x))`.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerWeights {
    /// `[hidden]`: the norm before the token mixer.
    pub input_norm: Vec<f32>,
    pub mixer: MixerWeights,
    /// `[hidden]`: the norm before the MLP.
    pub post_attention_norm: Vec<f32>,
    pub mlp: MlpWeights,
}

#[derive(Debug, Clone, PartialEq)]
pub enum MixerWeights {
    GatedDeltaNet(GdnWeights),
    FullAttention(AttentionWeights),
}

/// A gated delta net (Qwen3-Next's `linear_attn`), with `K = key_dim`, `V = value_dim`,
/// `H = v_heads`, `C = 2K + V` the convolution's channels.
#[derive(Debug, Clone, PartialEq)]
pub struct GdnWeights {
    /// `[2K + 2V, hidden]`: output rows are q (K), k (K), v (V), z (V, the output gate).
    pub in_proj_qkvz: Vec<f32>,
    /// `[2H, hidden]`: output rows are b (H, β logits), a (H, decay logits).
    pub in_proj_ba: Vec<f32>,
    /// `[C, kernel]`: depthwise weights; the last column multiplies the newest input.
    pub conv1d: Vec<f32>,
    /// `[H]`.
    pub dt_bias: Vec<f32>,
    /// `[H]`: the decay rate is `exp(A_log)`.
    pub a_log: Vec<f32>,
    /// `[value_head_dim]`: the gated RMSNorm's weight, shared by every v head.
    pub norm: Vec<f32>,
    /// `[hidden, V]`.
    pub out_proj: Vec<f32>,
}

/// A gated full-attention layer (Qwen3-Next's `self_attn`), with `Q = heads * head_dim`,
/// `KV = kv_heads * head_dim`.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionWeights {
    /// `[2Q, hidden]`: output rows are the queries (Q), then the output gate (Q).
    pub q_proj: Vec<f32>,
    /// `[KV, hidden]`.
    pub k_proj: Vec<f32>,
    /// `[KV, hidden]`.
    pub v_proj: Vec<f32>,
    /// `[hidden, Q]`.
    pub o_proj: Vec<f32>,
    /// `[head_dim]` each: RMSNorm of every query and key head.
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
}

/// A dense SwiGLU MLP: `down(silu(gate(x)) * up(x))`.
#[derive(Debug, Clone, PartialEq)]
pub struct MlpWeights {
    /// `[intermediate, hidden]`.
    pub gate: Vec<f32>,
    /// `[intermediate, hidden]`.
    pub up: Vec<f32>,
    /// `[hidden, intermediate]`.
    pub down: Vec<f32>,
}

/// Draws weights in a fixed order from [`Rng`], so a seed names one model.
struct Draw(Rng);

impl Draw {
    /// `n` values uniform in `[-bound, bound)`.
    fn uniform(&mut self, n: usize, bound: f64) -> Vec<f32> {
        (0..n)
            .map(|_| ((2.0 * self.0.uniform() - 1.0) * bound) as f32)
            .collect()
    }

    /// A `[out, in]` matrix with unit output variance for unit inputs, times `gain`.
    fn matrix(&mut self, out: usize, inp: usize, gain: f64) -> Vec<f32> {
        self.uniform(out * inp, gain * (3.0 / inp as f64).sqrt())
    }

    /// A norm weight near 1.
    fn norm(&mut self, n: usize) -> Vec<f32> {
        self.uniform(n, 0.2).into_iter().map(|v| 1.0 + v).collect()
    }

    /// A gated attention layer's weights.
    fn attention(&mut self, c: &HybridConfig) -> MixerWeights {
        let h = c.hidden_size;
        let q = c.num_attention_heads * c.head_dim;
        let kv = c.num_key_value_heads * c.head_dim;
        MixerWeights::FullAttention(AttentionWeights {
            q_proj: self.matrix(2 * q, h, 1.0),
            k_proj: self.matrix(kv, h, 1.0),
            v_proj: self.matrix(kv, h, 1.0),
            o_proj: self.matrix(h, q, 0.5),
            q_norm: self.norm(c.head_dim),
            k_norm: self.norm(c.head_dim),
        })
    }

    /// A dense MLP's weights.
    fn mlp(&mut self, c: &HybridConfig) -> MlpWeights {
        let (h, i) = (c.hidden_size, c.intermediate_size);
        MlpWeights {
            gate: self.matrix(i, h, 1.0),
            up: self.matrix(i, h, 1.0),
            down: self.matrix(h, i, 0.5),
        }
    }

    /// `n` values uniform in `[lo, hi)`.
    fn range(&mut self, n: usize, lo: f64, hi: f64) -> Vec<f32> {
        (0..n)
            .map(|_| (lo + (hi - lo) * self.0.uniform()) as f32)
            .collect()
    }
}

impl HybridWeights {
    /// Weights for `config` drawn from `seed`: the same seed gives the same bits.
    pub fn random(config: &HybridConfig, seed: u64) -> Self {
        let c = config;
        let mut d = Draw(Rng::new(seed));
        let h = c.hidden_size;
        let embed = d.uniform(c.vocab_size * h, 1.0);
        let layers = (0..c.num_layers)
            .map(|l| {
                let input_norm = d.norm(h);
                let mixer = match c.layer_kind(l) {
                    LayerKind::GatedDeltaNet => {
                        let (k, v, heads) = (
                            c.linear_key_dim(),
                            c.linear_value_dim(),
                            c.linear_num_value_heads,
                        );
                        let kernel = c.linear_conv_kernel_dim;
                        MixerWeights::GatedDeltaNet(GdnWeights {
                            in_proj_qkvz: d.matrix(2 * k + 2 * v, h, 1.0),
                            in_proj_ba: d.matrix(2 * heads, h, 1.0),
                            conv1d: d.matrix(c.linear_conv_dim(), kernel, 1.0),
                            dt_bias: d.range(heads, -1.0, 1.0),
                            // Decay rates between 0.05 and 1: the state remembers a few
                            // to a few dozen tokens.
                            a_log: d.range(heads, 0.05f64.ln(), 0.0),
                            norm: d.norm(c.linear_value_head_dim),
                            out_proj: d.matrix(h, v, 0.5),
                        })
                    }
                    LayerKind::FullAttention => d.attention(c),
                };
                let post_attention_norm = d.norm(h);
                LayerWeights {
                    input_norm,
                    mixer,
                    post_attention_norm,
                    mlp: d.mlp(c),
                }
            })
            .collect();
        let final_norm = d.norm(h);
        let lm_head = d.matrix(c.vocab_size, h, 3.0);
        // Drawn after the trunk, so the trunk's weights are those of a seed with or
        // without a head.
        let mtp = MtpWeights {
            pre_fc_norm_embedding: d.norm(h),
            pre_fc_norm_hidden: d.norm(h),
            fc: d.matrix(h, 2 * h, 1.0),
            layer: LayerWeights {
                input_norm: d.norm(h),
                mixer: d.attention(c),
                post_attention_norm: d.norm(h),
                mlp: d.mlp(c),
            },
            norm: d.norm(h),
        };
        HybridWeights {
            embed,
            layers,
            final_norm,
            lm_head,
            mtp: Some(mtp),
        }
    }
}
