//! The candle copy of the MTP head (trainable variables, the forward graph, saving) and
//! its starting point, the trunk's last layer.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, Var, D};
use mtplx_model::mtp::{self, tensor_name};
use mtplx_model::sampling::Rng;
use mtplx_model::source::{GgufSource, TensorRole, WeightSource};
use mtplx_model::{ModelConfig, RopeStyle};

/// The head's trainable tensors, by checkpoint name.
pub struct Head {
    pub vars: Vec<(String, Var)>,
    config: ModelConfig,
}

impl Head {
    fn var(&self, name: &str) -> &Tensor {
        self.vars
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_tensor())
            .unwrap_or_else(|| panic!("no variable {name}"))
    }

    /// A head for `config`: the decoder layer from `init` (name → tensor, trunk layer names
    /// already mapped to `mtp.*`) where given, else random; norms at one; `fc` random.
    pub fn new(config: &ModelConfig, init: &HashMap<String, Tensor>, seed: u64) -> Result<Self> {
        if config.qkv_bias || config.qk_norm {
            bail!("train-mtp supports Llama-style layers (no QKV bias, no QK norm)");
        }
        let (h, hd) = (config.hidden_size, config.head_dim);
        let (qd, kvd, ff) = (
            config.num_heads * hd,
            config.num_kv_heads * hd,
            config.intermediate_size,
        );
        let mut rng = Rng::new(seed);
        let mut normal = |shape: (usize, usize), std: f32| -> Result<Tensor> {
            // Irwin–Hall approximation of a normal: deterministic and enough for an init.
            let v: Vec<f32> = (0..shape.0 * shape.1)
                .map(|_| {
                    let s: f64 = (0..4).map(|_| rng.uniform()).sum::<f64>() - 2.0;
                    (s * (3.0f64).sqrt()) as f32 * std
                })
                .collect();
            Ok(Tensor::from_vec(v, shape, &Device::Cpu)?)
        };
        let mut vars = Vec::new();
        let matrices = [
            (mtp::FC.to_string(), (h, 2 * h)),
            (tensor_name(TensorRole::Q), (qd, h)),
            (tensor_name(TensorRole::K), (kvd, h)),
            (tensor_name(TensorRole::V), (kvd, h)),
            (tensor_name(TensorRole::O), (h, qd)),
            (tensor_name(TensorRole::Gate), (ff, h)),
            (tensor_name(TensorRole::Up), (ff, h)),
            (tensor_name(TensorRole::Down), (h, ff)),
        ];
        for (name, shape) in matrices {
            let t = match init.get(&name) {
                Some(t) => t.clone(),
                None => normal(shape, 0.02)?,
            };
            vars.push((name, Var::from_tensor(&t)?));
        }
        for name in [
            mtp::NORM_EMBEDDING.to_string(),
            mtp::NORM_HIDDEN.to_string(),
            tensor_name(TensorRole::AttnNorm),
            tensor_name(TensorRole::FfnNorm),
            tensor_name(TensorRole::FinalNorm),
        ] {
            let t = match init.get(&name) {
                Some(t) => t.clone(),
                None => Tensor::ones(h, DType::F32, &Device::Cpu)?,
            };
            vars.push((name, Var::from_tensor(&t)?));
        }
        Ok(Head {
            vars,
            config: config.clone(),
        })
    }

    fn rms(&self, x: &Tensor, w: &str) -> Result<Tensor> {
        let eps = self.config.rms_norm_eps as f64;
        let inv = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
        Ok(x.broadcast_mul(&inv)?.broadcast_mul(self.var(w))?)
    }

    fn linear(&self, x: &Tensor, w: &str) -> Result<Tensor> {
        Ok(x.broadcast_matmul(&self.var(w).t()?)?)
    }

    /// RoPE on `[b, heads, t, hd]` for positions `0..t`, in the trunk's style.
    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
        let (b, nh, t, hd) = x.dims4()?;
        let half = hd / 2;
        Ok(match self.config.rope_style {
            RopeStyle::Half => {
                let x0 = x.narrow(3, 0, half)?;
                let x1 = x.narrow(3, half, half)?;
                let r0 = (x0.broadcast_mul(cos)? - x1.broadcast_mul(sin)?)?;
                let r1 = (x0.broadcast_mul(sin)? + x1.broadcast_mul(cos)?)?;
                Tensor::cat(&[r0, r1], 3)?
            }
            RopeStyle::Interleaved => {
                let x = x.reshape((b, nh, t, half, 2))?;
                let x0 = x.narrow(4, 0, 1)?.squeeze(4)?;
                let x1 = x.narrow(4, 1, 1)?.squeeze(4)?;
                let r0 = (x0.broadcast_mul(cos)? - x1.broadcast_mul(sin)?)?;
                let r1 = (x0.broadcast_mul(sin)? + x1.broadcast_mul(cos)?)?;
                Tensor::stack(&[r0, r1], 4)?.reshape((b, nh, t, hd))?
            }
        })
    }

    /// The head's layer output (`[b, t, H]`, before `mtp.norm`) for embeddings `emb` of the
    /// next tokens and trunk hidden states `hid` (both `[b, t, H]`), causal over `t`.
    pub fn forward(&self, emb: &Tensor, hid: &Tensor) -> Result<Tensor> {
        let c = &self.config;
        let (b, t, h) = emb.dims3()?;
        let (nh, kvh, hd) = (c.num_heads, c.num_kv_heads, c.head_dim);
        let e = self.rms(emb, mtp::NORM_EMBEDDING)?;
        let hn = self.rms(hid, mtp::NORM_HIDDEN)?;
        let x = self.linear(&Tensor::cat(&[e, hn], 2)?, mtp::FC)?;

        let normed = self.rms(&x, &tensor_name(TensorRole::AttnNorm))?;
        let q = self.linear(&normed, &tensor_name(TensorRole::Q))?;
        let k = self.linear(&normed, &tensor_name(TensorRole::K))?;
        let v = self.linear(&normed, &tensor_name(TensorRole::V))?;
        let q = q.reshape((b, t, nh, hd))?.transpose(1, 2)?.contiguous()?;
        let k = k.reshape((b, t, kvh, hd))?.transpose(1, 2)?.contiguous()?;
        let v = v.reshape((b, t, kvh, hd))?.transpose(1, 2)?.contiguous()?;
        let (cos, sin) = rope_tables(c, t)?;
        let q = self.rope(&q, &cos, &sin)?;
        let k = self.rope(&k, &cos, &sin)?;
        // Grouped-query attention: query head `i` reads KV head `i / (nh / kvh)`.
        let rep = nh / kvh;
        let expand = |x: Tensor| -> Result<Tensor> {
            Ok(x.unsqueeze(2)?
                .broadcast_as((b, kvh, rep, t, hd))?
                .reshape((b, nh, t, hd))?)
        };
        let (k, v) = (expand(k)?, expand(v)?);
        let scale = 1.0 / (hd as f64).sqrt();
        let scores = (q.matmul(&k.t()?)? * scale)?;
        let mask: Vec<f32> = (0..t * t)
            .map(|i| {
                if i % t > i / t {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mask = Tensor::from_vec(mask, (t, t), &Device::Cpu)?;
        let probs = candle_nn::ops::softmax(&scores.broadcast_add(&mask)?, D::Minus1)?;
        let attn = probs
            .matmul(&v)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, t, nh * hd))?;
        let x = (x + self.linear(&attn, &tensor_name(TensorRole::O))?)?;
        let normed = self.rms(&x, &tensor_name(TensorRole::FfnNorm))?;
        let g = self.linear(&normed, &tensor_name(TensorRole::Gate))?;
        let u = self.linear(&normed, &tensor_name(TensorRole::Up))?;
        let y = self.linear(
            &(candle_nn::ops::silu(&g)? * u)?,
            &tensor_name(TensorRole::Down),
        )?;
        let _ = h;
        Ok((x + y)?)
    }

    /// Scores over the output rows `out` (`[rows, H]`) for layer outputs `x`.
    pub fn logits(&self, x: &Tensor, out: &Tensor) -> Result<Tensor> {
        let y = self.rms(x, &tensor_name(TensorRole::FinalNorm))?;
        Ok(y.broadcast_matmul(&out.t()?)?)
    }

    /// Writes the head (`dtype`) and the shortlist as safetensors.
    pub fn save(&self, path: &Path, shortlist: Option<&[u32]>, dtype: DType) -> Result<()> {
        let mut map = HashMap::new();
        for (name, v) in &self.vars {
            map.insert(name.clone(), v.as_tensor().to_dtype(dtype)?);
        }
        if let Some(ids) = shortlist {
            map.insert(
                mtp::SHORTLIST.to_string(),
                Tensor::from_vec(ids.to_vec(), ids.len(), &Device::Cpu)?,
            );
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        candle_core::safetensors::save(&map, path)?;
        Ok(())
    }
}

/// `[t, hd/2]` cosine and sine tables, computed as `mtplx_model::ops::Rope` does.
pub(super) fn rope_tables(c: &ModelConfig, t: usize) -> Result<(Tensor, Tensor)> {
    let half = c.head_dim / 2;
    let mut cos = Vec::with_capacity(t * half);
    let mut sin = Vec::with_capacity(t * half);
    for p in 0..t {
        for i in 0..half {
            let inv = (c.rope_theta as f64).powf(-((2 * i) as f64) / c.head_dim as f64);
            let a = p as f64 * inv;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    Ok((
        Tensor::from_vec(cos, (t, half), &Device::Cpu)?,
        Tensor::from_vec(sin, (t, half), &Device::Cpu)?,
    ))
}

/// The trunk's last layer under `mtp.layers.0.*` names: the head's starting point.
pub(super) fn last_layer(path: &Path, config: &ModelConfig) -> Result<HashMap<String, Tensor>> {
    let mut src = GgufSource::open(path)?;
    let last = config.num_layers - 1;
    let mut map = HashMap::new();
    for role in [
        TensorRole::Q,
        TensorRole::K,
        TensorRole::V,
        TensorRole::O,
        TensorRole::Gate,
        TensorRole::Up,
        TensorRole::Down,
        TensorRole::AttnNorm,
        TensorRole::FfnNorm,
        TensorRole::FinalNorm,
    ] {
        let name = if role == TensorRole::FinalNorm {
            src.name(role, 0)
        } else {
            src.name(role, last)
        };
        let w = src
            .get(&name)?
            .with_context(|| format!("trunk tensor {name}"))?;
        map.insert(tensor_name(role), w.to_dense()?);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtplx_kv::CacheFactory;
    use mtplx_model::mtp::{MtpHead, Vocab};
    use mtplx_model::{LanguageModel, Model, WeightFormat};
    use std::path::PathBuf;

    /// The candle training graph and the inference graph compute the same head.
    #[test]
    fn training_forward_matches_inference_forward() -> Result<()> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny/llama");
        let trunk = Model::load(&dir, WeightFormat::F32)?;
        let c = trunk.config().clone();
        let head = Head::new(&c, &HashMap::new(), 3)?;
        // Norm weights away from one so a mix-up of norms shows.
        for (i, (name, v)) in head.vars.iter().enumerate() {
            if v.as_tensor().rank() == 1 {
                let t = (Tensor::ones(c.hidden_size, DType::F32, &Device::Cpu)?
                    * (0.5 + 0.25 * i as f64))?;
                v.set(&t).with_context(|| name.clone())?;
            }
        }
        let tmp = tempfile::tempdir()?;
        let path = tmp.path().join("head.safetensors");
        let ids: Vec<u32> = (0..c.vocab_size as u32).rev().step_by(3).collect();
        head.save(&path, Some(&ids), DType::F32)?;
        let inf = MtpHead::load(&path, &trunk, Vocab::FromFile)?;
        assert_eq!(inf.shortlist(), Some(&ids[..]));

        let t = 21;
        let h = c.hidden_size;
        let next: Vec<u32> = (0..t as u32).map(|i| (i * 37 + 5) % 300).collect();
        let hidden: Vec<f32> = (0..t * h)
            .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
            .collect();
        let out = Tensor::from_vec(trunk.embed(&ids)?, (ids.len(), h), &Device::Cpu)?;
        let emb = Tensor::from_vec(trunk.embed(&next)?, (1, t, h), &Device::Cpu)?;
        let hid = Tensor::from_vec(hidden.clone(), (1, t, h), &Device::Cpu)?;
        let x = head.forward(&emb, &hid)?;
        let want: Vec<f32> = head
            .logits(&x.reshape((t, h))?, &out)?
            .flatten_all()?
            .to_vec1()?;

        // Inference: rows one at a time through its own cache.
        let mut cache = CacheFactory::contiguous().new_cache(inf.kv_shape());
        let mut got = Vec::new();
        for r in 0..t {
            let y = inf.forward(
                &trunk,
                &hidden[r * h..(r + 1) * h],
                &next[r..r + 1],
                cache.as_mut(),
                r,
            )?;
            got.extend(inf.logits(&y)?);
        }
        assert_eq!(got.len(), want.len());
        let diff = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            diff < 1e-3,
            "training and inference logits differ by {diff}"
        );
        Ok(())
    }
}
