//! The gated delta net (Qwen3-Next's linear attention), one token at a time.
//!
//! For each token: an in-projection to q, k, v, z (output gate), b (β logits) and a (decay
//! logits); a depthwise causal convolution (SiLU) over the q/k/v channels whose last
//! `kernel - 1` inputs are the convolution state; L2-normalised q and k, q scaled by
//! `1/√d_k`; `g = −exp(A_log)·softplus(a + dt_bias)`, `β = sigmoid(b)`; per v head the delta
//! rule
//!
//! ```text
//! S_t = exp(g_t)·S_{t−1} + β_t·k_t ⊗ (v_t − (exp(g_t)·S_{t−1})ᵀ k_t)
//! o_t = S_tᵀ q_t
//! ```
//!
//! with `S` a `[d_k, d_v]` matrix, then an RMSNorm of each head of `o` times `silu(z)`, and
//! the out-projection. The recurrence runs token by token and the projections are
//! batch-invariant, so a token's output never depends on how many tokens came with it.

use crate::error::Result;
use crate::hybrid::config::HybridConfig;
use crate::hybrid::weights::GdnWeights;
use crate::weights::{Linear, WeightFormat};

/// L2 normalisation's epsilon (flash-linear-attention's `l2norm`).
const L2_EPS: f32 = 1e-6;

pub(crate) struct GatedDeltaNet {
    /// `[q | k | v | z | b | a]` in each output row.
    in_proj: Linear,
    /// `[channels, kernel]`.
    conv: Vec<f32>,
    kernel: usize,
    dt_bias: Vec<f32>,
    /// `exp(A_log)`.
    rate: Vec<f32>,
    norm: Vec<f32>,
    out_proj: Linear,
    key_heads: usize,
    value_heads: usize,
    dk: usize,
    dv: usize,
    eps: f32,
}

impl GatedDeltaNet {
    pub(crate) fn new(c: &HybridConfig, w: &GdnWeights) -> Result<Self> {
        let (h, kd, vd) = (c.hidden_size, c.linear_key_dim(), c.linear_value_dim());
        let heads = c.linear_num_value_heads;
        let f = WeightFormat::Native;
        let in_proj = Linear::concat(vec![
            Linear::from_f32(&w.in_proj_qkvz, 2 * kd + 2 * vd, h, f)?,
            Linear::from_f32(&w.in_proj_ba, 2 * heads, h, f)?,
        ])?;
        Ok(GatedDeltaNet {
            in_proj,
            conv: w.conv1d.clone(),
            kernel: c.linear_conv_kernel_dim,
            dt_bias: w.dt_bias.clone(),
            rate: w.a_log.iter().map(|a| a.exp()).collect(),
            norm: w.norm.clone(),
            out_proj: Linear::from_f32(&w.out_proj, h, vd, f)?,
            key_heads: c.linear_num_key_heads,
            value_heads: heads,
            dk: c.linear_key_head_dim,
            dv: c.linear_value_head_dim,
            eps: c.rms_norm_eps,
        })
    }

    pub(crate) fn is_batch_invariant(&self) -> bool {
        self.in_proj.is_batch_invariant() && self.out_proj.is_batch_invariant()
    }

    /// Bytes of its weights.
    pub(crate) fn weight_bytes(&self) -> usize {
        let vectors = self.conv.len() + self.dt_bias.len() + self.rate.len() + self.norm.len();
        self.in_proj.weight_bytes() + self.out_proj.weight_bytes() + vectors * 4
    }

    /// Runs the `n` rows of `x` (`[n, hidden]`, normed) through the layer into `out`
    /// (`[n, hidden]`), folding them into `conv_state` and `ssm_state` in order.
    pub(crate) fn forward(
        &self,
        x: &[f32],
        n: usize,
        conv_state: &mut [f32],
        ssm_state: &mut [f32],
        out: &mut [f32],
    ) -> Result<()> {
        let (kd, vd) = (self.key_heads * self.dk, self.value_heads * self.dv);
        let channels = 2 * kd + vd;
        let width = 2 * kd + 2 * vd + 2 * self.value_heads;
        let proj = self.in_proj.forward(x, n)?;
        let mut mixed = vec![0f32; channels];
        let mut core = vec![0f32; n * vd];
        for (row, o) in proj.chunks_exact(width).zip(core.chunks_exact_mut(vd)) {
            self.conv_step(&row[..channels], conv_state, &mut mixed);
            let (z, ba) = row[channels..].split_at(vd);
            let (b, a) = ba.split_at(self.value_heads);
            self.delta_step(&mut mixed, b, a, ssm_state, o);
            self.gated_norm(o, z);
        }
        self.out_proj.forward_into(&core, n, out)
    }

    /// One step of the depthwise causal convolution with SiLU: `input` (one value per
    /// channel) joins the `kernel - 1` kept inputs of its channel.
    fn conv_step(&self, input: &[f32], state: &mut [f32], out: &mut [f32]) {
        let k = self.kernel;
        for (c, (&x, o)) in input.iter().zip(out.iter_mut()).enumerate() {
            let w = &self.conv[c * k..(c + 1) * k];
            let s = &mut state[c * (k - 1)..(c + 1) * (k - 1)];
            let mut y = 0f32;
            for (wj, sj) in w.iter().zip(s.iter()) {
                y += wj * sj;
            }
            y += w[k - 1] * x;
            *o = silu(y);
            s.copy_within(1.., 0);
            s[k - 2] = x;
        }
    }

    /// The delta rule for one token: `qkv` holds the convolved q, k, v (q and k are
    /// normalised in place), `b` and `a` the β and decay logits per v head; writes `S_tᵀq_t`
    /// per v head to `o`.
    fn delta_step(&self, qkv: &mut [f32], b: &[f32], a: &[f32], ssm: &mut [f32], o: &mut [f32]) {
        let (dk, dv) = (self.dk, self.dv);
        let kd = self.key_heads * dk;
        let (qk, v) = qkv.split_at_mut(2 * kd);
        let scale = 1.0 / (dk as f32).sqrt();
        for head in qk.chunks_exact_mut(dk) {
            l2_normalise(head);
        }
        for q in qk[..kd].iter_mut() {
            *q *= scale;
        }
        let (q, k) = qk.split_at(kd);
        let group = self.value_heads / self.key_heads;
        let mut kv_mem = vec![0f32; dv];
        for h in 0..self.value_heads {
            let kh = h / group;
            let (qh, kh) = (&q[kh * dk..(kh + 1) * dk], &k[kh * dk..(kh + 1) * dk]);
            let vh = &v[h * dv..(h + 1) * dv];
            let beta = sigmoid(b[h]);
            let g = -self.rate[h] * softplus(a[h] + self.dt_bias[h]);
            let decay = g.exp();
            let s = &mut ssm[h * dk * dv..(h + 1) * dk * dv];
            for x in s.iter_mut() {
                *x *= decay;
            }
            kv_mem.fill(0.0);
            for (srow, &ki) in s.chunks_exact(dv).zip(kh) {
                for (m, &sij) in kv_mem.iter_mut().zip(srow) {
                    *m += sij * ki;
                }
            }
            for (m, &vj) in kv_mem.iter_mut().zip(vh) {
                *m = (vj - *m) * beta;
            }
            for (srow, &ki) in s.chunks_exact_mut(dv).zip(kh) {
                for (sij, &dj) in srow.iter_mut().zip(&kv_mem) {
                    *sij += ki * dj;
                }
            }
            let oh = &mut o[h * dv..(h + 1) * dv];
            oh.fill(0.0);
            for (srow, &qi) in s.chunks_exact(dv).zip(qh) {
                for (oj, &sij) in oh.iter_mut().zip(srow) {
                    *oj += sij * qi;
                }
            }
        }
    }

    /// RMSNorm of each v head of `o`, times the norm weight and `silu(z)`.
    fn gated_norm(&self, o: &mut [f32], z: &[f32]) {
        for (head, zh) in o.chunks_exact_mut(self.dv).zip(z.chunks_exact(self.dv)) {
            let mut ss = 0f32;
            for v in head.iter() {
                ss += v * v;
            }
            let inv = 1.0 / (ss / self.dv as f32 + self.eps).sqrt();
            for ((v, &w), &g) in head.iter_mut().zip(&self.norm).zip(zh) {
                *v = *v * inv * w * silu(g);
            }
        }
    }
}

fn l2_normalise(x: &mut [f32]) {
    let mut ss = 0f32;
    for v in x.iter() {
        ss += v * v;
    }
    let inv = 1.0 / (ss + L2_EPS).sqrt();
    for v in x.iter_mut() {
        *v *= inv;
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `ln(1 + eˣ)`, linear above 20 as PyTorch's `softplus`.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}
