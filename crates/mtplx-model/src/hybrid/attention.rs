//! The hybrid model's full-attention layer: Qwen3-style attention (RMSNorm on every query
//! and key head, rotary positions) with Qwen3-Next's sigmoid output gate, over a
//! [`KvCache`].

use mtplx_kv::KvCache;

use crate::error::Result;
use crate::hybrid::config::HybridConfig;
use crate::hybrid::weights::AttentionWeights;
use crate::ops::{self, Rope};
use crate::weights::{Linear, WeightFormat};

pub(crate) struct GatedAttention {
    /// `[q | gate | k | v]` in each output row.
    qkv: Linear,
    o: Linear,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    eps: f32,
}

impl GatedAttention {
    pub(crate) fn new(c: &HybridConfig, w: &AttentionWeights) -> Result<Self> {
        let h = c.hidden_size;
        let q = c.num_attention_heads * c.head_dim;
        let kv = c.num_key_value_heads * c.head_dim;
        let f = WeightFormat::Native;
        Ok(GatedAttention {
            qkv: Linear::concat(vec![
                Linear::from_f32(&w.q_proj, 2 * q, h, f)?,
                Linear::from_f32(&w.k_proj, kv, h, f)?,
                Linear::from_f32(&w.v_proj, kv, h, f)?,
            ])?,
            o: Linear::from_f32(&w.o_proj, h, q, f)?,
            q_norm: w.q_norm.clone(),
            k_norm: w.k_norm.clone(),
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            eps: c.rms_norm_eps,
        })
    }

    pub(crate) fn is_batch_invariant(&self) -> bool {
        self.qkv.is_batch_invariant() && self.o.is_batch_invariant()
    }

    /// Bytes of its projections (the per-head norms are a rounding error).
    pub(crate) fn weight_bytes(&self) -> usize {
        self.qkv.weight_bytes() + self.o.weight_bytes()
    }

    /// Runs the `n` rows of `x` (`[n, hidden]`, normed), at positions `pos0..`, into `out`
    /// (`[n, hidden]`), appending their K/V to the cache's `layer`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        x: &[f32],
        n: usize,
        cache: &mut dyn KvCache,
        layer: usize,
        rope: &Rope,
        pos0: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let hd = self.head_dim;
        let (qd, kvd) = (self.heads * hd, self.kv_heads * hd);
        let proj = self.qkv.forward(x, n)?;
        let (mut q, mut gate) = (vec![0f32; n * qd], vec![0f32; n * qd]);
        let (mut k, mut v) = (vec![0f32; n * kvd], vec![0f32; n * kvd]);
        for (r, row) in proj.chunks_exact(2 * qd + 2 * kvd).enumerate() {
            q[r * qd..(r + 1) * qd].copy_from_slice(&row[..qd]);
            gate[r * qd..(r + 1) * qd].copy_from_slice(&row[qd..2 * qd]);
            k[r * kvd..(r + 1) * kvd].copy_from_slice(&row[2 * qd..2 * qd + kvd]);
            v[r * kvd..(r + 1) * kvd].copy_from_slice(&row[2 * qd + kvd..]);
        }
        ops::rms_norm_inplace(&mut q, &self.q_norm, self.eps);
        ops::rms_norm_inplace(&mut k, &self.k_norm, self.eps);
        rope.apply(&mut q, self.heads, pos0);
        rope.apply(&mut k, self.kv_heads, pos0);
        cache.append(layer, &k, &v)?;
        let mut attn = vec![0f32; n * qd];
        cache.attend(layer, &q, self.heads, 1.0 / (hd as f32).sqrt(), &mut attn)?;
        for (a, g) in attn.iter_mut().zip(&gate) {
            *a *= 1.0 / (1.0 + (-g).exp());
        }
        self.o.forward_into(&attn, n, out)
    }
}
