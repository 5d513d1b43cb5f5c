//! The hybrid model against an independent implementation: plain float64 loops written
//! from Qwen3-Next's formulas (the gated delta rule as transformers'
//! `torch_recurrent_gated_delta_rule` and flash-linear-attention's naive recurrence state
//! it), sharing no code with the model, only its weights. The model's logits stay within
//! 1e-4 of the reference (relative to the largest logit) over 300 tokens; a reference with
//! one formula wrong is farther than that, so the tolerance tells them apart.

use mtplx_kv::CacheFactory;
use mtplx_kv::Sequence;
use mtplx_model::hybrid::{
    AttentionWeights, GdnWeights, HybridConfig, HybridModel, HybridWeights, MixerWeights,
};
use mtplx_model::LanguageModel as _;
use mtplx_model::Want;

const TOLERANCE: f64 = 1e-4;

/// Which formulas the reference uses.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Variant {
    /// Qwen3-Next's.
    Exact,
    /// The delta rule reads `S_{t-1}ᵀk` before the decay instead of `(exp(g)·S_{t-1})ᵀk`.
    ReadBeforeDecay,
    /// The convolution's kernel applied the wrong way round in time.
    ConvReversed,
    /// Rotary embedding over the whole head instead of its first `partial_rotary_factor`.
    FullRotary,
}

fn matvec(w: &[f32], rows: usize, x: &[f64]) -> Vec<f64> {
    let cols = x.len();
    assert_eq!(w.len(), rows * cols);
    (0..rows)
        .map(|r| (0..cols).map(|c| w[r * cols + c] as f64 * x[c]).sum())
        .collect()
}

fn rms_norm(x: &[f64], w: &[f32], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, &g)| v * inv * g as f64).collect()
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn softplus(x: f64) -> f64 {
    (1.0 + x.exp()).ln()
}

fn l2_normalised(x: &[f64]) -> Vec<f64> {
    let n = (x.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
    x.iter().map(|v| v / n).collect()
}

enum LayerState {
    Gdn {
        /// Every input the convolution has seen, per token.
        inputs: Vec<Vec<f64>>,
        /// `[heads][dk][dv]`.
        s: Vec<Vec<Vec<f64>>>,
    },
    Attention {
        keys: Vec<Vec<f64>>,
        values: Vec<Vec<f64>>,
    },
}

struct Reference<'a> {
    c: &'a HybridConfig,
    w: &'a HybridWeights,
    variant: Variant,
    layers: Vec<LayerState>,
    pos: usize,
    /// The last layer's output for the newest token (before the final norm).
    hidden: Vec<f64>,
}

impl<'a> Reference<'a> {
    fn new(c: &'a HybridConfig, w: &'a HybridWeights, variant: Variant) -> Self {
        let layers = w
            .layers
            .iter()
            .map(|l| match l.mixer {
                MixerWeights::GatedDeltaNet(_) => LayerState::Gdn {
                    inputs: Vec::new(),
                    s: vec![
                        vec![vec![0.0; c.linear_value_head_dim]; c.linear_key_head_dim];
                        c.linear_num_value_heads
                    ],
                },
                MixerWeights::FullAttention(_) => LayerState::Attention {
                    keys: Vec::new(),
                    values: Vec::new(),
                },
            })
            .collect();
        Reference {
            c,
            w,
            variant,
            layers,
            pos: 0,
            hidden: Vec::new(),
        }
    }

    /// The logits after `token`.
    fn step(&mut self, token: u32) -> Vec<f64> {
        let (c, w) = (self.c, self.w);
        let h = c.hidden_size;
        let eps = c.rms_norm_eps as f64;
        let t = token as usize;
        let mut x: Vec<f64> = w.embed[t * h..(t + 1) * h]
            .iter()
            .map(|&v| v as f64)
            .collect();
        for (lw, state) in w.layers.iter().zip(self.layers.iter_mut()) {
            let normed = rms_norm(&x, &lw.input_norm, eps);
            let mixed = match (&lw.mixer, state) {
                (MixerWeights::GatedDeltaNet(g), LayerState::Gdn { inputs, s }) => {
                    gdn(c, g, &normed, inputs, s, self.variant)
                }
                (MixerWeights::FullAttention(a), LayerState::Attention { keys, values }) => {
                    attention(c, a, &normed, self.pos, keys, values, self.variant)
                }
                _ => unreachable!(),
            };
            for (xi, m) in x.iter_mut().zip(&mixed) {
                *xi += m;
            }
            let normed = rms_norm(&x, &lw.post_attention_norm, eps);
            let i = c.intermediate_size;
            let gate = matvec(&lw.mlp.gate, i, &normed);
            let up = matvec(&lw.mlp.up, i, &normed);
            let act: Vec<f64> = gate.iter().zip(&up).map(|(g, u)| silu(*g) * u).collect();
            let down = matvec(&lw.mlp.down, h, &act);
            for (xi, d) in x.iter_mut().zip(&down) {
                *xi += d;
            }
        }
        self.pos += 1;
        let logits = matvec(&w.lm_head, c.vocab_size, &rms_norm(&x, &w.final_norm, eps));
        self.hidden = x;
        logits
    }
}

/// How the reference MTP head reads its inputs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum MtpVariant {
    /// vLLM's `Qwen3NextMultiTokenPredictor`: the trunk's hidden state after its final
    /// norm, `fc` over `[embedding ⊕ hidden]`.
    Exact,
    /// The trunk's hidden state before its final norm.
    PreNormHidden,
    /// `fc` over `[hidden ⊕ embedding]`.
    HiddenFirst,
}

/// The MTP head as vLLM runs it, in float64: one row per call, its own K/V.
struct ReferenceMtp<'a> {
    c: &'a HybridConfig,
    w: &'a HybridWeights,
    variant: MtpVariant,
    keys: Vec<Vec<f64>>,
    values: Vec<Vec<f64>>,
}

impl ReferenceMtp<'_> {
    /// Logits for the row at `pos` reading `hidden` (the trunk's, before its final norm,
    /// when `prepare_trunk_rows`; else the head's own previous output) and token `next`, and the
    /// head's output (after `mtp.norm`) that the next draft step reads.
    fn step(
        &mut self,
        hidden: &[f64],
        prepare_trunk_rows: bool,
        next: u32,
        pos: usize,
    ) -> (Vec<f64>, Vec<f64>) {
        let (c, w) = (self.c, self.w);
        let m = w.mtp.as_ref().expect("a head");
        let h = c.hidden_size;
        let eps = c.rms_norm_eps as f64;
        let hidden = match prepare_trunk_rows && self.variant != MtpVariant::PreNormHidden {
            true => rms_norm(hidden, &w.final_norm, eps),
            false => hidden.to_vec(),
        };
        let t = next as usize;
        let e: Vec<f64> = w.embed[t * h..(t + 1) * h]
            .iter()
            .map(|&v| v as f64)
            .collect();
        let e = rms_norm(&e, &m.pre_fc_norm_embedding, eps);
        let hn = rms_norm(&hidden, &m.pre_fc_norm_hidden, eps);
        let cat = match self.variant {
            MtpVariant::HiddenFirst => [hn, e].concat(),
            _ => [e, hn].concat(),
        };
        let mut x = matvec(&m.fc, h, &cat);
        let lw = &m.layer;
        let MixerWeights::FullAttention(a) = &lw.mixer else {
            panic!("the head's layer is attention");
        };
        let normed = rms_norm(&x, &lw.input_norm, eps);
        let mixed = attention(
            c,
            a,
            &normed,
            pos,
            &mut self.keys,
            &mut self.values,
            Variant::Exact,
        );
        x.iter_mut().zip(&mixed).for_each(|(xi, m)| *xi += m);
        let normed = rms_norm(&x, &lw.post_attention_norm, eps);
        let i = c.intermediate_size;
        let gate = matvec(&lw.mlp.gate, i, &normed);
        let up = matvec(&lw.mlp.up, i, &normed);
        let act: Vec<f64> = gate.iter().zip(&up).map(|(g, u)| silu(*g) * u).collect();
        let down = matvec(&lw.mlp.down, h, &act);
        x.iter_mut().zip(&down).for_each(|(xi, d)| *xi += d);
        let out = rms_norm(&x, &m.norm, eps);
        (matvec(&w.lm_head, c.vocab_size, &out), out)
    }
}

fn gdn(
    c: &HybridConfig,
    w: &GdnWeights,
    x: &[f64],
    inputs: &mut Vec<Vec<f64>>,
    s: &mut [Vec<Vec<f64>>],
    variant: Variant,
) -> Vec<f64> {
    let (nk, nv) = (c.linear_num_key_heads, c.linear_num_value_heads);
    let (dk, dv) = (c.linear_key_head_dim, c.linear_value_head_dim);
    let (kd, vd) = (nk * dk, nv * dv);
    let qkvz = matvec(&w.in_proj_qkvz, 2 * kd + 2 * vd, x);
    let ba = matvec(&w.in_proj_ba, 2 * nv, x);
    let channels = 2 * kd + vd;
    inputs.push(qkvz[..channels].to_vec());
    let z = &qkvz[channels..];
    let (b, a) = ba.split_at(nv);
    // Causal depthwise convolution: weight j of K multiplies the input K-1-j tokens back.
    let kernel = c.linear_conv_kernel_dim;
    let t = inputs.len() - 1;
    let conv: Vec<f64> = (0..channels)
        .map(|ch| {
            let mut y = 0.0;
            for j in 0..kernel {
                let back = match variant {
                    Variant::ConvReversed => j,
                    _ => kernel - 1 - j,
                };
                if back <= t {
                    y += w.conv1d[ch * kernel + j] as f64 * inputs[t - back][ch];
                }
            }
            silu(y)
        })
        .collect();
    let mut out = vec![0.0; vd];
    for head in 0..nv {
        let kh = head / (nv / nk);
        let q: Vec<f64> = l2_normalised(&conv[kh * dk..(kh + 1) * dk])
            .into_iter()
            .map(|v| v / (dk as f64).sqrt())
            .collect();
        let k = l2_normalised(&conv[kd + kh * dk..kd + (kh + 1) * dk]);
        let v = &conv[2 * kd + head * dv..2 * kd + (head + 1) * dv];
        let beta = sigmoid(b[head]);
        let g = -(w.a_log[head] as f64).exp() * softplus(a[head] + w.dt_bias[head] as f64);
        let sh = &mut s[head];
        let read = |m: &Vec<Vec<f64>>, j: usize| (0..dk).map(|i| m[i][j] * k[i]).sum::<f64>();
        let before: Vec<f64> = (0..dv).map(|j| read(sh, j)).collect();
        for row in sh.iter_mut() {
            for e in row.iter_mut() {
                *e *= g.exp();
            }
        }
        for j in 0..dv {
            let mem = match variant {
                Variant::ReadBeforeDecay => before[j],
                _ => read(sh, j),
            };
            let delta = beta * (v[j] - mem);
            for i in 0..dk {
                sh[i][j] += k[i] * delta;
            }
        }
        let o: Vec<f64> = (0..dv)
            .map(|j| (0..dk).map(|i| sh[i][j] * q[i]).sum())
            .collect();
        // Gated RMSNorm over the head.
        let normed = rms_norm(&o, &w.norm, c.rms_norm_eps as f64);
        for j in 0..dv {
            out[head * dv + j] = normed[j] * silu(z[head * dv + j]);
        }
    }
    matvec(&w.out_proj, c.hidden_size, &out)
}

fn attention(
    c: &HybridConfig,
    w: &AttentionWeights,
    x: &[f64],
    pos: usize,
    keys: &mut Vec<Vec<f64>>,
    values: &mut Vec<Vec<f64>>,
    variant: Variant,
) -> Vec<f64> {
    let (nh, nkv, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    let qg = matvec(&w.q_proj, 2 * nh * hd, x);
    let (q, gate) = qg.split_at(nh * hd);
    let k = matvec(&w.k_proj, nkv * hd, x);
    let v = matvec(&w.v_proj, nkv * hd, x);
    let eps = c.rms_norm_eps as f64;
    // Partial rotary (Qwen3-Next): the first `rot` dimensions rotate, pairs (i, i + rot/2),
    // frequencies over `rot`; the rest of the head passes through.
    let rot = if variant == Variant::FullRotary {
        hd
    } else {
        ((hd as f64 * c.partial_rotary_factor as f64) as usize).min(hd) & !1
    };
    let rotate = |head: &[f64], norm: &[f32]| -> Vec<f64> {
        let n = rms_norm(head, norm, eps);
        let half = rot / 2;
        let mut r = n.clone();
        for i in 0..half {
            let inv_freq = (c.rope_theta as f64).powf(-((2 * i) as f64) / rot as f64);
            let (cos, sin) = ((pos as f64 * inv_freq).cos(), (pos as f64 * inv_freq).sin());
            r[i] = n[i] * cos - n[i + half] * sin;
            r[i + half] = n[i] * sin + n[i + half] * cos;
        }
        r
    };
    keys.push(
        (0..nkv)
            .flat_map(|kh| rotate(&k[kh * hd..(kh + 1) * hd], &w.k_norm))
            .collect(),
    );
    values.push(v);
    let mut out = vec![0.0; nh * hd];
    for head in 0..nh {
        let kh = head / (nh / nkv);
        let qh = rotate(&q[head * hd..(head + 1) * hd], &w.q_norm);
        let scores: Vec<f64> = keys
            .iter()
            .map(|kr| (0..hd).map(|d| qh[d] * kr[kh * hd + d]).sum::<f64>() / (hd as f64).sqrt())
            .collect();
        let max = scores.iter().cloned().fold(f64::MIN, f64::max);
        let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let z: f64 = e.iter().sum();
        for d in 0..hd {
            let o: f64 = e
                .iter()
                .zip(values.iter())
                .map(|(p, vr)| p * vr[kh * hd + d])
                .sum();
            out[head * hd + d] = o / z * sigmoid(gate[head * hd + d]);
        }
    }
    matvec(&w.o_proj, c.hidden_size, &out)
}

/// Tokens from a fixed xorshift stream.
fn tokens(n: usize, vocab: usize, mut seed: u64) -> Vec<u32> {
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % vocab as u64) as u32
        })
        .collect()
}

/// The largest difference between the model's logits and the reference's over the
/// sequence, relative to the largest reference logit.
fn worst_error(model: &[Vec<f32>], reference: &[Vec<f64>]) -> f64 {
    let scale = reference
        .iter()
        .flatten()
        .fold(1.0f64, |m, v| m.max(v.abs()));
    model
        .iter()
        .zip(reference)
        .flat_map(|(m, r)| m.iter().zip(r).map(|(a, b)| (*a as f64 - b).abs()))
        .fold(0.0, f64::max)
        / scale
}

#[test]
fn the_model_matches_an_independent_float64_implementation() {
    let config = HybridConfig::tiny();
    let weights = HybridWeights::random(&config, 11);
    let model = HybridModel::new(config.clone(), &weights).unwrap();
    let ids = tokens(300, config.vocab_size, 0x9E37_79B9);

    // The model's logits for every position, in chunks of 50.
    let mut cache = Sequence::new(&CacheFactory::paged(), &config.state_shape());
    let mut got = Vec::new();
    for chunk in ids.chunks(50) {
        let out = model.forward(chunk, &mut cache, Want::All).unwrap();
        got.extend((0..out.rows).map(|r| out.logits_row(r).to_vec()));
    }

    let reference = |variant| {
        let mut r = Reference::new(&config, &weights, variant);
        ids.iter().map(|&t| r.step(t)).collect::<Vec<_>>()
    };
    let exact = reference(Variant::Exact);
    // The logits must vary enough for the comparison to mean something.
    let spread = exact[299].iter().cloned().fold(f64::MIN, f64::max)
        - exact[299].iter().cloned().fold(f64::MAX, f64::min);
    assert!(spread > 1.0, "logits spread {spread}");
    let err = worst_error(&got, &exact);
    eprintln!("exact: relative error {err:e}, logits spread {spread}");
    assert!(
        err < TOLERANCE,
        "model vs reference: relative error {err:e}"
    );
    for wrong in [
        Variant::ReadBeforeDecay,
        Variant::ConvReversed,
        Variant::FullRotary,
    ] {
        let err = worst_error(&got, &reference(wrong));
        eprintln!("{wrong:?}: relative error {err:e}");
        assert!(
            err > 10.0 * TOLERANCE,
            "{wrong:?}: the tolerance cannot tell it apart ({err:e})"
        );
    }
}

/// Reads a Qwen3-Next folder's `model.safetensors` as transformers' forward pass reads it,
/// written without the loader's code: `in_proj_qkvz` viewed as `[k_heads, 2dk + 2r·dv]`
/// and split per key head, `in_proj_ba` as `[k_heads, 2r]`, `q_proj` as `[heads, 2hd]`,
/// zero-centred norms as `1 + w`; then regrouped into the reference's weights.
fn published_weights(dir: &std::path::Path, c: &HybridConfig) -> HybridWeights {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let get = |name: &str| -> Vec<f32> {
        let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
        t.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let one_plus = |v: Vec<f32>| v.into_iter().map(|w| 1.0 + w).collect::<Vec<_>>();
    let h = c.hidden_size;
    // Row `i` of a `[_, h]` matrix.
    let row = |m: &[f32], i: usize| m[i * h..(i + 1) * h].to_vec();
    // A gated attention layer's weights under the names `p` gives.
    let attention_weights = |a: &mut AttentionWeights, p: &dyn Fn(&str) -> String| {
        let qg = get(&p("self_attn.q_proj.weight"));
        let hd = c.head_dim;
        let (mut q, mut gate) = (vec![], vec![]);
        for head in 0..c.num_attention_heads {
            let base = head * 2 * hd;
            q.extend((base..base + hd).flat_map(|i| row(&qg, i)));
            gate.extend((base + hd..base + 2 * hd).flat_map(|i| row(&qg, i)));
        }
        a.q_proj = [q, gate].concat();
        a.k_proj = get(&p("self_attn.k_proj.weight"));
        a.v_proj = get(&p("self_attn.v_proj.weight"));
        a.o_proj = get(&p("self_attn.o_proj.weight"));
        a.q_norm = one_plus(get(&p("self_attn.q_norm.weight")));
        a.k_norm = one_plus(get(&p("self_attn.k_norm.weight")));
    };
    // A layer's norms and MLP.
    let layer_weights = |lw: &mut mtplx_model::hybrid::LayerWeights, p: &dyn Fn(&str) -> String| {
        lw.input_norm = one_plus(get(&p("input_layernorm.weight")));
        lw.post_attention_norm = one_plus(get(&p("post_attention_layernorm.weight")));
        lw.mlp.gate = get(&p("mlp.gate_proj.weight"));
        lw.mlp.up = get(&p("mlp.up_proj.weight"));
        lw.mlp.down = get(&p("mlp.down_proj.weight"));
    };
    let mut w = HybridWeights::random(c, 0);
    w.embed = get("model.embed_tokens.weight");
    w.final_norm = one_plus(get("model.norm.weight"));
    w.lm_head = get("lm_head.weight");
    let (nk, dk, dv) = (
        c.linear_num_key_heads,
        c.linear_key_head_dim,
        c.linear_value_head_dim,
    );
    let r = c.linear_num_value_heads / nk;
    for (l, lw) in w.layers.iter_mut().enumerate() {
        let p = |n: &str| format!("model.layers.{l}.{n}");
        layer_weights(lw, &p);
        match &mut lw.mixer {
            MixerWeights::GatedDeltaNet(g) => {
                let qkvz = get(&p("linear_attn.in_proj_qkvz.weight"));
                let group = 2 * dk + 2 * r * dv;
                let (mut q, mut k, mut v, mut z) = (vec![], vec![], vec![], vec![]);
                for kh in 0..nk {
                    let rows = |a: usize, b: usize| {
                        (kh * group + a..kh * group + b).flat_map(|i| row(&qkvz, i))
                    };
                    q.extend(rows(0, dk));
                    k.extend(rows(dk, 2 * dk));
                    v.extend(rows(2 * dk, 2 * dk + r * dv));
                    z.extend(rows(2 * dk + r * dv, group));
                }
                g.in_proj_qkvz = [q, k, v, z].concat();
                let ba = get(&p("linear_attn.in_proj_ba.weight"));
                let (mut b, mut a) = (vec![], vec![]);
                for kh in 0..nk {
                    b.extend((kh * 2 * r..kh * 2 * r + r).flat_map(|i| row(&ba, i)));
                    a.extend((kh * 2 * r + r..(kh + 1) * 2 * r).flat_map(|i| row(&ba, i)));
                }
                g.in_proj_ba = [b, a].concat();
                g.conv1d = get(&p("linear_attn.conv1d.weight"));
                g.dt_bias = get(&p("linear_attn.dt_bias"));
                g.a_log = get(&p("linear_attn.A_log"));
                g.norm = get(&p("linear_attn.norm.weight"));
                g.out_proj = get(&p("linear_attn.out_proj.weight"));
            }
            MixerWeights::FullAttention(a) => attention_weights(a, &p),
        }
    }
    if let Some(m) = &mut w.mtp {
        let p = |n: &str| format!("mtp.{n}");
        m.fc = get(&p("fc.weight"));
        m.pre_fc_norm_embedding = one_plus(get(&p("pre_fc_norm_embedding.weight")));
        m.pre_fc_norm_hidden = one_plus(get(&p("pre_fc_norm_hidden.weight")));
        m.norm = one_plus(get(&p("norm.weight")));
        let lw = &mut m.layer;
        let p = |n: &str| format!("mtp.layers.0.{n}");
        layer_weights(lw, &p);
        let MixerWeights::FullAttention(a) = &mut lw.mixer else {
            panic!("the head's layer is attention");
        };
        attention_weights(a, &p);
    }
    w
}

#[test]
fn a_checkpoint_loaded_under_the_published_names_matches_the_reference() {
    let config = HybridConfig::tiny();
    let weights = HybridWeights::random(&config, 23);
    let dir = tempfile::tempdir().unwrap();
    mtplx_model::hybrid::hf::save(dir.path(), &config, &weights).unwrap();
    // The user's path: the folder through the loader.
    let model = HybridModel::load(dir.path()).unwrap();
    let ids = tokens(120, config.vocab_size, 0x51ED_270B);
    let mut cache = Sequence::new(&CacheFactory::paged(), &config.state_shape());
    let out = model.forward(&ids, &mut cache, Want::All).unwrap();
    let got: Vec<Vec<f32>> = (0..out.rows).map(|r| out.logits_row(r).to_vec()).collect();
    // The reference reads the file its own way.
    let published = published_weights(dir.path(), &config);
    let mut reference = Reference::new(&config, &published, Variant::Exact);
    let want: Vec<Vec<f64>> = ids.iter().map(|&t| reference.step(t)).collect();
    let err = worst_error(&got, &want);
    eprintln!("loaded checkpoint: relative error {err:e}");
    assert!(
        err < TOLERANCE,
        "loaded vs reference: relative error {err:e}"
    );
}

#[test]
fn a_gguf_file_loaded_matches_the_reference() {
    // llama.cpp's `qwen35` layout (tiled value heads, `-exp(A_log)`), through the loader.
    let config = HybridConfig::tiny();
    let weights = HybridWeights::random(&config, 29);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("model.gguf");
    mtplx_model::hybrid::gguf::save(&file, &config, &weights, None).unwrap();
    let model = HybridModel::load(&file).unwrap();
    let ids = tokens(120, config.vocab_size, 0x2545_F491);
    let mut cache = Sequence::new(&CacheFactory::paged(), &config.state_shape());
    let out = model.forward(&ids, &mut cache, Want::All).unwrap();
    let got: Vec<Vec<f32>> = (0..out.rows).map(|r| out.logits_row(r).to_vec()).collect();
    // The reference runs the weights the file was written from.
    let mut reference = Reference::new(&config, &weights, Variant::Exact);
    let want: Vec<Vec<f64>> = ids.iter().map(|&t| reference.step(t)).collect();
    let err = worst_error(&got, &want);
    eprintln!("loaded GGUF: relative error {err:e}");
    assert!(err < TOLERANCE, "GGUF vs reference: relative error {err:e}");
}

/// The MTP head's rows over a prompt and one recursive draft step, for `weights` run by
/// the reference (`variant`), as (logits per row, the recursive step's logits).
fn reference_mtp(
    config: &HybridConfig,
    weights: &HybridWeights,
    ids: &[u32],
    variant: MtpVariant,
) -> Vec<Vec<f64>> {
    let mut trunk = Reference::new(config, weights, Variant::Exact);
    let hidden: Vec<Vec<f64>> = ids
        .iter()
        .map(|&t| {
            trunk.step(t);
            trunk.hidden.clone()
        })
        .collect();
    let mut head = ReferenceMtp {
        c: config,
        w: weights,
        variant,
        keys: Vec::new(),
        values: Vec::new(),
    };
    let n = ids.len();
    let mut rows = Vec::new();
    let mut out = Vec::new();
    for p in 0..n - 1 {
        let (logits, o) = head.step(&hidden[p], true, ids[p + 1], p);
        rows.push(logits);
        out = o;
    }
    // The next draft step reads the head's own output with a drafted token.
    rows.push(head.step(&out, false, ids[0], n - 1).0);
    rows
}

#[test]
fn the_mtp_head_matches_an_independent_float64_implementation() {
    use mtplx_model::mtp::MtpRunner;
    let config = HybridConfig::tiny();
    let weights = HybridWeights::random(&config, 13);
    let dir = tempfile::tempdir().unwrap();
    mtplx_model::hybrid::hf::save(dir.path(), &config, &weights).unwrap();
    // The user's path: the folder through the loader, the head from its `mtp.*`.
    let model = HybridModel::load(dir.path()).unwrap();
    let head = model.mtp_head().expect("the checkpoint's head");
    let ids = tokens(80, config.vocab_size, 0x0DDB_1A5E);
    let n = ids.len();

    let mut seq = Sequence::new(&CacheFactory::paged(), &config.state_shape());
    let mut hidden = model.forward(&ids, &mut seq, Want::Hidden).unwrap().hidden;
    head.prepare_trunk_rows(&mut hidden);
    let h = config.hidden_size;
    let mut cache = CacheFactory::contiguous().new_cache(head.kv_shape());
    let mut got = Vec::new();
    // The first rows in one pass, the rest one by one (as the proposer catches up).
    let (_, mut out) = head
        .last_row(&model, &hidden[..40 * h], &ids[1..41], cache.as_mut(), 0)
        .unwrap();
    for p in 40..n - 1 {
        let (o, logits) = head
            .last_row(
                &model,
                &hidden[p * h..(p + 1) * h],
                &[ids[p + 1]],
                cache.as_mut(),
                p,
            )
            .unwrap();
        got.push(logits);
        out = o;
    }
    let (_, logits) = head
        .last_row(&model, &out, &[ids[0]], cache.as_mut(), n - 1)
        .unwrap();
    got.push(logits);

    // The reference reads the file its own way.
    let published = published_weights(dir.path(), &config);
    let want = |variant| reference_mtp(&config, &published, &ids, variant)[40..].to_vec();
    let exact = want(MtpVariant::Exact);
    let err = worst_error(&got, &exact);
    eprintln!("MTP head: relative error {err:e}");
    assert!(err < TOLERANCE, "head vs reference: relative error {err:e}");
    for wrong in [MtpVariant::PreNormHidden, MtpVariant::HiddenFirst] {
        let err = worst_error(&got, &want(wrong));
        eprintln!("{wrong:?}: relative error {err:e}");
        assert!(
            err > 10.0 * TOLERANCE,
            "{wrong:?}: the tolerance cannot tell it apart ({err:e})"
        );
    }
}
