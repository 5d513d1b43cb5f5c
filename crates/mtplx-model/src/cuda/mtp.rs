//! The MTP head on the GPU, beside a [`CudaModel`] trunk.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaSlice;
use mtplx_kv::{KvCache, KvShape, KvView};

use super::cache::CudaKvCache;
use super::device::{CudaDevice, DeviceRope};
use super::matrix::DeviceMatrix;
use super::model::CudaModel;
use super::pass::{fit, launch_layer, run_pass, Layer, Scratch};
use crate::config::{ModelConfig, RopeStyle};
use crate::error::{ModelError, Result};
use crate::mtp::{MtpHead, MtpRunner};
use crate::{LanguageModel, Linear};

/// An [`MtpHead`]'s weights on the trunk's device, drafting without leaving it: the
/// token's embedding comes from the trunk's table on the device, and a draft step (the
/// head's layer over one row, then its scores) is one captured graph's replay. Its cache is
/// a [`CudaKvCache`] from the trunk's factory.
///
/// It computes what [`MtpHead`] computes, in `f32`, summed in another order (the `fc`
/// product as its two halves); its drafts are the CPU head's up to those roundings, and
/// they never change what speculation outputs, only how much of it is accepted.
pub struct CudaMtpHead {
    dev: Arc<CudaDevice>,
    config: ModelConfig,
    table: Arc<DeviceMatrix>,
    norm_embedding: CudaSlice<f32>,
    norm_hidden: CudaSlice<f32>,
    /// `fc`'s columns for the embedding half and for the hidden half (`[H, H]` each).
    fc_embedding: DeviceMatrix,
    fc_hidden: DeviceMatrix,
    layer: Layer,
    norm: CudaSlice<f32>,
    /// The scored rows (`[ids.len() or vocab, H]`).
    out: DeviceMatrix,
    ids: Option<Vec<u32>>,
    rope: DeviceRope,
    max_len: usize,
    graphs: AtomicBool,
    scratch: Mutex<Option<Scratch>>,
}

/// One map from several maps over the same input, their outputs side by side, each part as
/// its weights are held ([`Linear::file_parts`]).
pub(super) fn concat(dev: &CudaDevice, parts: &[&Linear]) -> Result<DeviceMatrix> {
    let mut file = Vec::with_capacity(parts.len());
    for p in parts {
        file.extend(p.file_parts()?);
    }
    let bias = crate::weights::side_by_side_bias(parts);
    DeviceMatrix::from_parts(dev, file, bias.as_deref())
}

impl CudaMtpHead {
    /// Uploads `head` (loaded for `trunk`'s CPU model) to `trunk`'s device.
    pub fn new(head: &MtpHead, trunk: &CudaModel) -> Result<Self> {
        let dev = trunk.dev.clone();
        let c = head.config.clone();
        if c.qk_norm {
            return Err(ModelError::Device(
                "the CUDA backend's MTP head does not run per-head Q/K norms (Qwen3) yet".into(),
            ));
        }
        let h = c.hidden_size;
        let fc = head.fc.dense_rows()?;
        let (mut fc_e, mut fc_h) = (Vec::with_capacity(h * h), Vec::with_capacity(h * h));
        for row in fc.chunks_exact(2 * h) {
            fc_e.extend_from_slice(&row[..h]);
            fc_h.extend_from_slice(&row[h..]);
        }
        let l = &head.layer;
        let layer = Layer {
            attn_norm: dev.upload(&l.attn_norm)?,
            qkv: concat(&dev, &[&l.q, &l.k, &l.v])?,
            qk_norm: None,
            o: concat(&dev, &[&l.o])?,
            ffn_norm: dev.upload(&l.ffn_norm)?,
            gate_up: concat(&dev, &[&l.gate, &l.up])?,
            down: concat(&dev, &[&l.down])?,
        };
        let (cos, sin) = head.rope.tables();
        let rope = DeviceRope {
            cos: dev.upload(cos)?,
            sin: dev.upload(sin)?,
            interleaved: head.rope.style() == RopeStyle::Interleaved,
        };
        let max_len = trunk.max_len.min(head.rope.max_positions());
        Ok(CudaMtpHead {
            table: trunk.embed.clone(),
            norm_embedding: dev.upload(&head.norm_embedding)?,
            norm_hidden: dev.upload(&head.norm_hidden)?,
            fc_embedding: DeviceMatrix::upload(&*dev, &fc_e, None, h, h)?,
            fc_hidden: DeviceMatrix::upload(&*dev, &fc_h, None, h, h)?,
            layer,
            norm: dev.upload(&head.norm)?,
            out: concat(&dev, &[&head.out])?,
            ids: head.ids.clone(),
            rope,
            max_len,
            graphs: AtomicBool::new(trunk.graphs.load(std::sync::atomic::Ordering::Relaxed)),
            scratch: Mutex::new(None),
            config: c,
            dev,
        })
    }

    /// The launches of one head pass over `n` rows: the head's input from the tokens in
    /// `meta` and the hidden rows in `head_in[0]`, its layer, and the last row's scores.
    fn launch(&self, s: &mut Scratch, n: usize) -> Result<()> {
        let c = &self.config;
        let (h, eps) = (c.hidden_size, c.rms_norm_eps);
        let dev = &*self.dev;
        let [hidden, ne, nh] = &mut s.head_in;
        dev.embed(&s.meta, &self.table, &mut s.x, n)?;
        dev.rms_norm(&s.x, &self.norm_embedding, ne, n, h, eps)?;
        dev.rms_norm(hidden, &self.norm_hidden, nh, n, h, eps)?;
        dev.matvec(&self.fc_embedding, ne, &mut s.x, n, false)?;
        dev.matvec(&self.fc_hidden, nh, &mut s.x, n, true)?;
        launch_layer(dev, c, &self.layer, 0, s, n, &self.rope, self.max_len)?;
        dev.rms_norm_rows(&s.x, n - 1, &self.norm, &mut s.normed, 1, h, eps)?;
        dev.matvec(&self.out, &s.normed, &mut s.logits, 1, false)
    }
}

impl MtpRunner for CudaMtpHead {
    fn kv_shape(&self) -> KvShape {
        KvShape {
            layers: 1,
            kv_heads: self.config.num_kv_heads,
            head_dim: self.config.head_dim,
        }
    }

    fn hidden_size(&self) -> usize {
        self.config.hidden_size
    }

    fn max_positions(&self) -> usize {
        self.max_len
    }

    fn token_of(&self, i: usize) -> u32 {
        self.ids.as_ref().map_or(i as u32, |ids| ids[i])
    }

    fn last_row(
        &self,
        _trunk: &dyn LanguageModel,
        hidden: &[f32],
        next: &[u32],
        cache: &mut dyn KvCache,
        pos0: usize,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let c = &self.config;
        let (n, h) = (next.len(), c.hidden_size);
        if n == 0 {
            return Err(ModelError::EmptyInput);
        }
        if hidden.len() != n * h {
            return Err(ModelError::Device(format!(
                "{} hidden values for {n} rows of {h}",
                hidden.len()
            )));
        }
        if let Some(&id) = next.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(ModelError::TokenOutOfRange {
                id,
                vocab: c.vocab_size,
            });
        }
        if pos0 + n > self.max_len {
            return Err(ModelError::ContextFull {
                len: pos0,
                new: n,
                max: self.max_len,
            });
        }
        let cache = cache
            .device_mut()
            .and_then(|a| a.downcast_mut::<CudaKvCache>())
            .ok_or_else(|| {
                ModelError::Device(
                    "the CUDA MTP head runs on a cache from its trunk's factory".into(),
                )
            })?;
        if cache.shape() != MtpRunner::kv_shape(self) {
            return Err(mtplx_kv::KvError::ShapeMismatch {
                cache: cache.shape(),
                source_shape: MtpRunner::kv_shape(self),
            }
            .into());
        }
        // The cache may start after position 0 (RoPE is relative): rows land after its
        // own, rotated for their positions.
        let row0 = cache.len();
        if row0 + n > self.max_len {
            return Err(ModelError::ContextFull {
                len: row0,
                new: n,
                max: self.max_len,
            });
        }
        cache.reserve(row0 + n)?;
        let mut guard = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let s = fit(&mut guard, n, |rows| {
            Scratch::with_head_inputs(&self.dev, c, rows, 1, self.out.rows, self.max_len, true)
        })?;
        let dev = &*self.dev;
        s.begin(dev, cache, row0, pos0, next)?;
        dev.write(hidden, &mut s.head_in[0], 0)?;
        run_pass(dev, &self.graphs, s, n, &|s| self.launch(s, n))?;
        cache.commit(row0 + n);
        let mut x = vec![0f32; h];
        dev.read(&s.x, (n - 1) * h, &mut x)?;
        let mut logits = vec![0f32; self.out.rows];
        dev.read(&s.logits, 0, &mut logits)?;
        Ok((x, logits))
    }
}
