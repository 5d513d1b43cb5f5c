//! A multi-token-prediction (MTP) head, DeepSeek-V3 / Qwen3-Next / Qwen3.5 style.
//!
//! The head predicts the token after next from the trunk's last hidden state `h_t` (the last
//! layer's output before the final norm) and the embedding of the next token `t+1`:
//!
//! ```text
//! x   = fc( [ rms(embed(t+1); pre_fc_norm_embedding) ⊕ rms(h_t; pre_fc_norm_hidden) ] )  2H → H
//! h'  = decoder_layer(x)           one layer of the trunk's own architecture, own KV cache
//! p   = lm_head( rms(h'; norm) )   the trunk's tied output head (or a shortlist of its rows)
//! ```
//!
//! Applied recursively, `h'` takes the place of `h_t` to draft one more token. Tensor names
//! are the ones Qwen3-Next / Qwen3.5 checkpoints publish (`mtp.fc.weight`,
//! `mtp.pre_fc_norm_embedding.weight`, `mtp.pre_fc_norm_hidden.weight`,
//! `mtp.layers.0.self_attn.q_proj.weight` …, `mtp.norm.weight`), so a real MTP checkpoint
//! loads. One extension: an optional `mtp.shortlist` (`u32`, ascending token ids) restricts
//! the output head to those rows of the vocabulary, which makes a draft step several times
//! cheaper; tokens outside it get probability zero.

use std::path::{Path, PathBuf};

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::Device;
use mtplx_kv::{KvCache, KvShape};
use safetensors::{Dtype, SafeTensors};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::model::LanguageModel;
use crate::ops::{self, Rope};
use crate::source::{HfSource, TensorRole, WeightSource};
use crate::weights::{Linear, RawWeight, WeightFormat};

/// A head weight for the native kernels, stored as `format` when that holds its values
/// exactly, as `f32` otherwise: the head's own weights as `F16` (what the shipped checkpoint
/// holds: half the bytes of `f32`), the shortlisted output rows as `Q8_0` (the default
/// trunk's tied table is `Q8_0`, and requantizing its dequantized rows gives back the same
/// blocks). A draft step then streams about 13 MB instead of 36 MB of dense `f32`, and
/// runs on the trunk's thread pool instead of candle's `f32` matmul. A head or trunk whose
/// values the smaller format would round keeps them in `f32`, so the head computes what it
/// was trained to whatever the files hold.
fn kernel(w: RawWeight, format: GgmlDType) -> Result<Linear> {
    let dense = w.to_dense()?;
    let q = QTensor::quantize(&dense, format)?;
    let exact = q
        .dequantize(&Device::Cpu)?
        .flatten_all()?
        .to_vec1::<f32>()?
        == dense.flatten_all()?.to_vec1::<f32>()?;
    if exact {
        Linear::new(RawWeight::Quant(q), WeightFormat::Native)
    } else {
        Linear::new(RawWeight::Dense(dense), WeightFormat::Native)
    }
}

/// The input of an MTP head's `fc`, row by row `[rms(embed(next); norm_embedding) ⊕
/// rms(hidden; norm_hidden)]` (`[n, 2H]`): what every head here reads first.
pub(crate) fn fc_input(
    trunk: &dyn LanguageModel,
    hidden: &[f32],
    next: &[u32],
    norm_embedding: &[f32],
    norm_hidden: &[f32],
    eps: f32,
) -> Result<Vec<f32>> {
    let h = norm_hidden.len();
    let mut e = trunk.embed(next)?;
    ops::rms_norm_inplace(&mut e, norm_embedding, eps);
    let mut hn = vec![0f32; hidden.len()];
    ops::rms_norm(hidden, norm_hidden, eps, &mut hn);
    let mut cat = Vec::with_capacity(e.len() + hn.len());
    for (e, hn) in e.chunks_exact(h).zip(hn.chunks_exact(h)) {
        cat.extend_from_slice(e);
        cat.extend_from_slice(hn);
    }
    Ok(cat)
}

/// Prefix of every MTP tensor.
pub const PREFIX: &str = "mtp";
/// Name of the optional shortlist tensor (an mtplx extension).
pub const SHORTLIST: &str = "mtp.shortlist";

/// The checkpoint name of `role` in the head's single decoder layer
/// (`mtp.layers.0.self_attn.q_proj.weight`, …), and of the head's own tensors.
pub fn tensor_name(role: TensorRole) -> String {
    use TensorRole::*;
    let suffix = match role {
        Embed => "embed_tokens.weight",
        FinalNorm => return "mtp.norm.weight".into(),
        LmHead => "lm_head.weight",
        AttnNorm => "layers.0.input_layernorm.weight",
        Q => "layers.0.self_attn.q_proj.weight",
        K => "layers.0.self_attn.k_proj.weight",
        V => "layers.0.self_attn.v_proj.weight",
        O => "layers.0.self_attn.o_proj.weight",
        QBias => "layers.0.self_attn.q_proj.bias",
        KBias => "layers.0.self_attn.k_proj.bias",
        VBias => "layers.0.self_attn.v_proj.bias",
        QNorm => "layers.0.self_attn.q_norm.weight",
        KNorm => "layers.0.self_attn.k_norm.weight",
        FfnNorm => "layers.0.post_attention_layernorm.weight",
        Gate => "layers.0.mlp.gate_proj.weight",
        Up => "layers.0.mlp.up_proj.weight",
        Down => "layers.0.mlp.down_proj.weight",
    };
    format!("{PREFIX}.{suffix}")
}

/// `mtp.fc.weight`: `[hidden, 2 * hidden]`, input `[embedding ⊕ hidden]`.
pub const FC: &str = "mtp.fc.weight";
/// `mtp.pre_fc_norm_embedding.weight`.
pub const NORM_EMBEDDING: &str = "mtp.pre_fc_norm_embedding.weight";
/// `mtp.pre_fc_norm_hidden.weight`.
pub const NORM_HIDDEN: &str = "mtp.pre_fc_norm_hidden.weight";

/// Which rows of the vocabulary the head scores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Vocab {
    /// The shortlist the file carries, or the whole vocabulary if it carries none.
    FromFile,
    /// The whole vocabulary.
    Full,
    /// The first `n` tokens of the file's shortlist (which is ordered by frequency).
    Top(usize),
}

pub(crate) struct Layer {
    pub(crate) attn_norm: Vec<f32>,
    pub(crate) q: Linear,
    pub(crate) k: Linear,
    pub(crate) v: Linear,
    pub(crate) o: Linear,
    pub(crate) q_norm: Option<Vec<f32>>,
    pub(crate) k_norm: Option<Vec<f32>>,
    pub(crate) ffn_norm: Vec<f32>,
    pub(crate) gate: Linear,
    pub(crate) up: Linear,
    pub(crate) down: Linear,
}

/// A loaded MTP head, bound to the geometry of its trunk.
pub struct MtpHead {
    pub(crate) config: ModelConfig,
    pub(crate) norm_embedding: Vec<f32>,
    pub(crate) norm_hidden: Vec<f32>,
    pub(crate) fc: Linear,
    pub(crate) layer: Layer,
    pub(crate) norm: Vec<f32>,
    /// Token id of each output row (`None`: row `i` is token `i`).
    pub(crate) ids: Option<Vec<u32>>,
    /// The tied output rows (`[ids.len() or vocab, hidden]`).
    pub(crate) out: Linear,
    pub(crate) rope: Rope,
}

/// What the MTP proposer drafts with: the head's layer and its scores, on some backend
/// ([`MtpHead`] on the CPU; the CUDA backend's head on the GPU).
pub trait MtpRunner: Send + Sync {
    /// The KV geometry of the head's own cache (one layer).
    fn kv_shape(&self) -> KvShape;
    fn hidden_size(&self) -> usize;
    /// Positions the head can reach.
    fn max_positions(&self) -> usize;
    /// Token id of output row `i`.
    fn token_of(&self, i: usize) -> u32;
    /// Turns the trunk's hidden rows (`[n, H]`, as [`crate::ForwardOutput::hidden`] gives
    /// them: the last layer's output before the final norm) into the rows
    /// [`MtpRunner::last_row`] reads. The heads mtplx trains read them as they are (the
    /// default); a Qwen3-Next checkpoint's head reads them after the trunk's final norm.
    fn prepare_trunk_rows(&self, _hidden: &mut [f32]) {}
    /// Runs the head's layer over `n` rows (as [`MtpHead::forward`]), appending their K/V
    /// to `cache`, and returns the row the next step continues from (`[H]`: for
    /// [`MtpHead`], the last row's output before `mtp.norm`) and the last row's scores (see
    /// [`MtpRunner::token_of`]), what the next draft token is picked from.
    fn last_row(
        &self,
        trunk: &dyn LanguageModel,
        hidden: &[f32],
        next: &[u32],
        cache: &mut dyn KvCache,
        pos0: usize,
    ) -> Result<(Vec<f32>, Vec<f32>)>;
}

impl MtpRunner for MtpHead {
    fn kv_shape(&self) -> KvShape {
        MtpHead::kv_shape(self)
    }

    fn hidden_size(&self) -> usize {
        MtpHead::hidden_size(self)
    }

    fn max_positions(&self) -> usize {
        MtpHead::max_positions(self)
    }

    fn token_of(&self, i: usize) -> u32 {
        MtpHead::token_of(self, i)
    }

    fn last_row(
        &self,
        trunk: &dyn LanguageModel,
        hidden: &[f32],
        next: &[u32],
        cache: &mut dyn KvCache,
        pos0: usize,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let h = self.hidden_size();
        let mut x = self.forward(trunk, hidden, next, cache, pos0)?;
        let last = x.split_off(x.len() - h);
        let logits = self.logits(&last)?;
        Ok((last, logits))
    }
}

/// A single `.safetensors` file as a [`WeightSource`] with the MTP names.
struct MtpFile {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl MtpFile {
    fn open(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        SafeTensors::deserialize(&bytes).map_err(|e| ModelError::BadSafetensors {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        Ok(MtpFile {
            path: path.to_path_buf(),
            bytes,
        })
    }

    fn shortlist(&self) -> Result<Option<Vec<u32>>> {
        let st = SafeTensors::deserialize(&self.bytes).expect("checked at open");
        let Ok(view) = st.tensor(SHORTLIST) else {
            return Ok(None);
        };
        let bad = |reason: String| ModelError::BadTensor {
            path: self.path.clone(),
            tensor: SHORTLIST.into(),
            reason,
        };
        let ids: Vec<u32> = match view.dtype() {
            Dtype::U32 | Dtype::I32 => view
                .data()
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::I64 | Dtype::U64 => view
                .data()
                .chunks_exact(8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as u32)
                .collect(),
            other => return Err(bad(format!("dtype {other:?}, expected u32"))),
        };
        Ok(Some(ids))
    }
}

impl WeightSource for MtpFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn name(&self, role: TensorRole, _layer: usize) -> String {
        tensor_name(role)
    }

    fn get(&mut self, name: &str) -> Result<Option<RawWeight>> {
        let st = SafeTensors::deserialize(&self.bytes).expect("checked at open");
        let Ok(view) = st.tensor(name) else {
            return Ok(None);
        };
        crate::source::dense_from_view(&self.path, name, &view).map(Some)
    }
}

/// A Hugging Face folder whose shards hold `mtp.*` next to the trunk.
struct MtpFolder(HfSource);

impl WeightSource for MtpFolder {
    fn path(&self) -> &Path {
        self.0.path()
    }

    fn name(&self, role: TensorRole, _layer: usize) -> String {
        tensor_name(role)
    }

    fn get(&mut self, name: &str) -> Result<Option<RawWeight>> {
        self.0.get(name)
    }
}

impl MtpHead {
    /// Loads the head from a `.safetensors` file (or a Hugging Face folder whose shards hold
    /// `mtp.*`) for `trunk`, whose tied embedding becomes the output head.
    pub fn load(path: &Path, trunk: &dyn LanguageModel, vocab: Vocab) -> Result<Self> {
        if path.is_dir() {
            let mut src = MtpFolder(HfSource::open(path)?);
            Self::from_source(&mut src, None, trunk, vocab)
        } else {
            let mut src = MtpFile::open(path)?;
            let shortlist = src.shortlist()?;
            Self::from_source(&mut src, shortlist, trunk, vocab)
        }
    }

    /// Builds the head from any source of `mtp.*` tensors.
    fn from_source(
        src: &mut dyn WeightSource,
        shortlist: Option<Vec<u32>>,
        trunk: &dyn LanguageModel,
        vocab: Vocab,
    ) -> Result<Self> {
        let c = trunk
            .mtp_layer()
            .ok_or_else(|| ModelError::BadConfig {
                path: src.path().to_path_buf(),
                reason: "mtplx has no MTP head layout for this model's family".into(),
            })?
            .clone();
        if !c.tie_embeddings {
            return Err(ModelError::BadConfig {
                path: src.path().to_path_buf(),
                reason: "the MTP head needs the trunk's tied embedding as its output head".into(),
            });
        }
        let path = src.path().to_path_buf();
        let mut take = |name: String, expected: &[usize]| -> Result<RawWeight> {
            let w = src.get(&name)?.ok_or_else(|| ModelError::MissingTensor {
                path: path.clone(),
                tensor: name.clone(),
            })?;
            if w.dims() != expected {
                return Err(ModelError::TensorShape {
                    path: path.clone(),
                    tensor: name,
                    got: w.dims(),
                    expected: expected.to_vec(),
                });
            }
            Ok(w)
        };
        let (h, hd) = (c.hidden_size, c.head_dim);
        let (qd, kvd, ff) = (c.num_heads * hd, c.num_kv_heads * hd, c.intermediate_size);
        let mut lin =
            |role, shape: [usize; 2]| kernel(take(tensor_name(role), &shape)?, GgmlDType::F16);
        let (q, k, v, o) = (
            lin(TensorRole::Q, [qd, h])?,
            lin(TensorRole::K, [kvd, h])?,
            lin(TensorRole::V, [kvd, h])?,
            lin(TensorRole::O, [h, qd])?,
        );
        let (gate, up, down) = (
            lin(TensorRole::Gate, [ff, h])?,
            lin(TensorRole::Up, [ff, h])?,
            lin(TensorRole::Down, [h, ff])?,
        );
        let mut vec = |name: String, len: usize| take(name, &[len])?.to_vec();
        let (q, k, v) = if c.qkv_bias {
            (
                q.with_bias(vec(tensor_name(TensorRole::QBias), qd)?),
                k.with_bias(vec(tensor_name(TensorRole::KBias), kvd)?),
                v.with_bias(vec(tensor_name(TensorRole::VBias), kvd)?),
            )
        } else {
            (q, k, v)
        };
        let (q_norm, k_norm) = if c.qk_norm {
            (
                Some(vec(tensor_name(TensorRole::QNorm), hd)?),
                Some(vec(tensor_name(TensorRole::KNorm), hd)?),
            )
        } else {
            (None, None)
        };
        let layer = Layer {
            attn_norm: vec(tensor_name(TensorRole::AttnNorm), h)?,
            ffn_norm: vec(tensor_name(TensorRole::FfnNorm), h)?,
            q,
            k,
            v,
            o,
            q_norm,
            k_norm,
            gate,
            up,
            down,
        };
        let norm_embedding = vec(NORM_EMBEDDING.into(), h)?;
        let norm_hidden = vec(NORM_HIDDEN.into(), h)?;
        let norm = vec(tensor_name(TensorRole::FinalNorm), h)?;
        let fc = kernel(take(FC.into(), &[h, 2 * h])?, GgmlDType::F16)?;

        let ids = match (vocab, shortlist) {
            (Vocab::Full, _) | (_, None) => None,
            (Vocab::FromFile, Some(ids)) => Some(ids),
            (Vocab::Top(n), Some(mut ids)) => {
                ids.truncate(n.max(1));
                Some(ids)
            }
        };
        let rows: Vec<u32> = match &ids {
            Some(ids) => ids.clone(),
            None => (0..c.vocab_size as u32).collect(),
        };
        let table = trunk.embed(&rows)?;
        let table = candle_core::Tensor::from_vec(table, (rows.len(), h), &Device::Cpu)?;
        let out = kernel(RawWeight::Dense(table), GgmlDType::Q8_0)?;
        let rope = Rope::new(hd, c.rope_theta, c.context_length, c.rope_style);
        Ok(MtpHead {
            config: c,
            norm_embedding,
            norm_hidden,
            fc,
            layer,
            norm,
            ids,
            out,
            rope,
        })
    }

    /// The KV geometry of the head's own cache (one layer).
    pub fn kv_shape(&self) -> KvShape {
        KvShape {
            layers: 1,
            kv_heads: self.config.num_kv_heads,
            head_dim: self.config.head_dim,
        }
    }

    pub fn hidden_size(&self) -> usize {
        self.config.hidden_size
    }

    /// Positions the head's RoPE table covers.
    pub fn max_positions(&self) -> usize {
        self.rope.max_positions()
    }

    /// The token ids the output rows stand for (`None`: the whole vocabulary).
    pub fn shortlist(&self) -> Option<&[u32]> {
        self.ids.as_deref()
    }

    /// Token id of output row `i`.
    pub fn token_of(&self, i: usize) -> u32 {
        self.ids.as_ref().map_or(i as u32, |ids| ids[i])
    }

    /// Runs the head's layer over `n` rows: `hidden` (`[n, H]`, the trunk's last hidden
    /// state at positions `pos0..pos0+n`, or the head's own output when recursing) with
    /// `next` (the token after each of those positions, embedded by `trunk`). Appends the
    /// rows' K/V to `cache` and returns the layer's output (`[n, H]`, before `mtp.norm`).
    pub fn forward(
        &self,
        trunk: &dyn LanguageModel,
        hidden: &[f32],
        next: &[u32],
        cache: &mut dyn KvCache,
        pos0: usize,
    ) -> Result<Vec<f32>> {
        let c = &self.config;
        let n = next.len();
        let (h, hd) = (c.hidden_size, c.head_dim);
        if n == 0 {
            return Err(ModelError::EmptyInput);
        }
        debug_assert_eq!(hidden.len(), n * h);
        let max = self.rope.max_positions();
        if pos0 + n > max {
            return Err(ModelError::ContextFull {
                len: pos0,
                new: n,
                max,
            });
        }
        let eps = c.rms_norm_eps;
        let cat = fc_input(
            trunk,
            hidden,
            next,
            &self.norm_embedding,
            &self.norm_hidden,
            eps,
        )?;
        let mut x = self.fc.forward(&cat, n)?;

        let l = &self.layer;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut normed = vec![0f32; n * h];
        let mut attn = vec![0f32; n * c.num_heads * hd];
        ops::rms_norm(&x, &l.attn_norm, eps, &mut normed);
        let mut q = l.q.forward(&normed, n)?;
        let mut k = l.k.forward(&normed, n)?;
        let v = l.v.forward(&normed, n)?;
        if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
            ops::rms_norm_inplace(&mut q, qn, eps);
            ops::rms_norm_inplace(&mut k, kn, eps);
        }
        self.rope.apply(&mut q, c.num_heads, pos0);
        self.rope.apply(&mut k, c.num_kv_heads, pos0);
        cache.append(0, &k, &v)?;
        cache.attend(0, &q, c.num_heads, scale, &mut attn)?;
        ops::add_inplace(&mut x, &l.o.forward(&attn, n)?);
        ops::rms_norm(&x, &l.ffn_norm, eps, &mut normed);
        let mut g = l.gate.forward(&normed, n)?;
        ops::silu_mul(&mut g, &l.up.forward(&normed, n)?);
        ops::add_inplace(&mut x, &l.down.forward(&g, n)?);
        Ok(x)
    }

    /// Scores of the output rows (`[n, rows]`, see [`MtpHead::token_of`]) for the head's
    /// outputs `x` (`[n, H]`): `mtp.norm`, then the tied output head.
    pub fn logits(&self, x: &[f32]) -> Result<Vec<f32>> {
        let h = self.config.hidden_size;
        let n = x.len() / h;
        let mut y = x.to_vec();
        ops::rms_norm_inplace(&mut y, &self.norm, self.config.rms_norm_eps);
        self.out.forward(&y, n)
    }

    /// Output rows the head scores.
    pub fn out_rows(&self) -> usize {
        self.out.out_features()
    }
}
