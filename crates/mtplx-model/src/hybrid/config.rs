//! The shape of a hybrid model: which layers are recurrent, and every dimension.

use mtplx_kv::{KvShape, RecurrentLayerShape, StateShape};

/// What mixes the tokens in one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerKind {
    /// A gated delta net: a recurrent layer whose state lives in a
    /// [`mtplx_kv::RecurrentState`].
    GatedDeltaNet,
    /// Causal softmax attention over a [`mtplx_kv::KvCache`].
    FullAttention,
}

/// The dimensions of a Qwen3-Next-style hybrid decoder (most field names follow Qwen3-Next's
/// `config.json`; `num_layers` is its `num_hidden_layers`, `context_length` its
/// `max_position_embeddings`: `hybrid::hf` reads and writes the published keys).
#[derive(Debug, Clone, PartialEq)]
pub struct HybridConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    /// Width of the dense SwiGLU MLP of every layer.
    pub intermediate_size: usize,
    pub num_layers: usize,
    /// Every `full_attention_interval`-th layer (1-based) is full attention, the others
    /// gated delta nets: 4 gives 3 GDN + 1 attention, repeated.
    pub full_attention_interval: usize,
    /// Each layer's kind, when the checkpoint lists them (`layer_types`); it then wins over
    /// the interval.
    pub layer_types: Option<Vec<LayerKind>>,
    pub rms_norm_eps: f32,
    /// Positions the attention layers' rotary tables cover.
    pub context_length: usize,
    pub rope_theta: f32,
    /// Share of each attention head's dimensions that are rotated (Qwen3-Next: 0.25); the
    /// rest pass through. See [`HybridConfig::rotary_dim`].
    pub partial_rotary_factor: f32,
    /// Attention layers: query heads, K/V heads, head width.
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// Gated delta nets: q/k heads, v heads (a multiple of the q/k heads), their widths.
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    /// Width of the depthwise causal convolution over q, k and v.
    pub linear_conv_kernel_dim: usize,
    /// Whether the output head is the embedding table.
    pub tie_word_embeddings: bool,
}

impl HybridConfig {
    /// A small model for tests: hidden 64, vocabulary 256, 8 layers (GDN, GDN, GDN,
    /// attention, twice).
    pub fn tiny() -> Self {
        HybridConfig {
            vocab_size: 256,
            hidden_size: 64,
            intermediate_size: 128,
            num_layers: 8,
            full_attention_interval: 4,
            layer_types: None,
            rms_norm_eps: 1e-6,
            context_length: 4096,
            rope_theta: 10_000.0,
            partial_rotary_factor: 0.5,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 16,
            linear_num_key_heads: 2,
            linear_num_value_heads: 4,
            linear_key_head_dim: 16,
            linear_value_head_dim: 16,
            linear_conv_kernel_dim: 4,
            tie_word_embeddings: false,
        }
    }

    /// What the model needs of the dimensions themselves (a convolution over at least two
    /// tokens, whole groups of v heads per q/k head); the reason names the config keys.
    pub fn check(&self) -> Result<(), String> {
        if self.linear_conv_kernel_dim < 2 {
            return Err("`linear_conv_kernel_dim` must be at least 2".into());
        }
        if self.linear_num_key_heads == 0
            || !self
                .linear_num_value_heads
                .is_multiple_of(self.linear_num_key_heads)
        {
            return Err(
                "`linear_num_value_heads` must be a multiple of `linear_num_key_heads`".into(),
            );
        }
        Ok(())
    }

    pub fn layer_kind(&self, layer: usize) -> LayerKind {
        if let Some(kind) = self.layer_types.as_ref().and_then(|t| t.get(layer)) {
            return *kind;
        }
        if (layer + 1).is_multiple_of(self.full_attention_interval.max(1)) {
            LayerKind::FullAttention
        } else {
            LayerKind::GatedDeltaNet
        }
    }

    /// Number of layers of `kind`.
    pub fn count(&self, kind: LayerKind) -> usize {
        (0..self.num_layers)
            .filter(|&l| self.layer_kind(l) == kind)
            .count()
    }

    /// Dimensions of each attention head that are rotated: `head_dim × partial_rotary_factor`
    /// rounded down to even, as transformers does (`int(head_dim * factor)`).
    pub fn rotary_dim(&self) -> usize {
        let rot = (self.head_dim as f64 * self.partial_rotary_factor as f64) as usize;
        rot.min(self.head_dim) & !1
    }

    /// Width of all q (or k) heads of a gated delta net.
    pub fn linear_key_dim(&self) -> usize {
        self.linear_num_key_heads * self.linear_key_head_dim
    }

    /// Width of all v heads of a gated delta net.
    pub fn linear_value_dim(&self) -> usize {
        self.linear_num_value_heads * self.linear_value_head_dim
    }

    /// Channels the convolution runs over: q, k and v side by side.
    pub fn linear_conv_dim(&self) -> usize {
        2 * self.linear_key_dim() + self.linear_value_dim()
    }

    /// The KV geometry of the attention layers (numbered among themselves).
    pub fn kv_shape(&self) -> KvShape {
        KvShape {
            layers: self.count(LayerKind::FullAttention),
            kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
        }
    }

    /// The state of each gated delta net (numbered among themselves): the convolution's
    /// last `kernel - 1` inputs per channel, `[conv_dim, kernel - 1]`, and the delta rule's
    /// matrix per v head, `[v_heads, key_head_dim, value_head_dim]`.
    pub fn recurrent_shapes(&self) -> Vec<RecurrentLayerShape> {
        let shape = RecurrentLayerShape {
            conv: vec![self.linear_conv_dim(), self.linear_conv_kernel_dim - 1],
            ssm: vec![
                self.linear_num_value_heads,
                self.linear_key_head_dim,
                self.linear_value_head_dim,
            ],
        };
        vec![shape; self.count(LayerKind::GatedDeltaNet)]
    }

    /// The per-sequence state: the attention layers' K/V and the gated delta nets' state.
    pub fn state_shape(&self) -> StateShape {
        StateShape {
            kv: self.kv_shape(),
            recurrent: self.recurrent_shapes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_is_three_gdn_then_one_attention_twice() {
        let c = HybridConfig::tiny();
        let kinds: Vec<_> = (0..c.num_layers).map(|l| c.layer_kind(l)).collect();
        let (g, a) = (LayerKind::GatedDeltaNet, LayerKind::FullAttention);
        assert_eq!(kinds, [g, g, g, a, g, g, g, a]);
        assert_eq!(c.kv_shape().layers, 2);
        assert_eq!(c.recurrent_shapes().len(), 6);
        assert_eq!(c.recurrent_shapes()[0].conv, [128, 3]);
        assert_eq!(c.recurrent_shapes()[0].ssm, [4, 16, 16]);
        assert_eq!(c.rotary_dim(), 8);
    }
}
