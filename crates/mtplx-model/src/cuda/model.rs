//! [`CudaModel`]: the Llama / Qwen2 graph on the device, as a [`LanguageModel`].

use std::path::Path;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaSlice;
use mtplx_kv::{CacheFactory, DeviceCaches, KvView, Sequence, StateShape};

use super::cache::{CudaCaches, CudaKvCache};
use super::device::{CudaDevice, DeviceRope};
use super::matrix::DeviceMatrix;
use super::pass::{fit, launch_layer, run_pass, Layer, Scratch};

use crate::config::Dims;
use crate::config::{ModelConfig, RopeStyle};
use crate::error::{ModelError, Result};
use crate::kernels::Activations;
use crate::model::{Embedding, ForwardOutput, LanguageModel, Model, Want};
use crate::weights::WeightFormat;

/// A model on a CUDA device.
///
/// Threading: the model, its caches and an MTP head on its device share one stream, and a
/// pass may be recorded into a graph while it is queued: use them from one thread at a time
/// (as the decode loop does). Work queued from another thread meanwhile could be recorded
/// into the graph.
pub struct CudaModel {
    pub(super) dev: Arc<CudaDevice>,
    pub(super) config: ModelConfig,
    /// `[vocab, hidden]` in its file's format: what `embed` reads, and an MTP head's
    /// embedding. The output head too when tied (the same matrix).
    pub(super) embed: Arc<DeviceMatrix>,
    pub(super) layers: Vec<Layer>,
    pub(super) final_norm: CudaSlice<f32>,
    pub(super) lm_head: Arc<DeviceMatrix>,
    pub(super) rope: DeviceRope,
    /// The embedding on the host (the CPU model's own, shared): what `embed` reads, with no
    /// round trip to the device.
    pub(super) host_embed: Embedding,
    /// Positions a pass may reach: the model's context (and its RoPE tables').
    pub(super) max_len: usize,
    /// Whether passes of up to [`GRAPH_ROWS`](super::pass::GRAPH_ROWS) rows replay captured
    /// graphs (`MTPLX_CUDA_GRAPHS=0` turns them off).
    pub(super) graphs: std::sync::atomic::AtomicBool,
    pub(super) scratch: Mutex<Option<Scratch>>,
}

impl CudaModel {
    /// Loads a dense (Llama / Qwen2 / Qwen3) GGUF file or Hugging Face folder onto `dev`,
    /// each weight in its file's own blocks (see [`CudaModel::from_model`]).
    pub fn load(path: &Path, dev: Arc<CudaDevice>) -> Result<Self> {
        Self::load_with(path, dev, Activations::F32)
    }

    /// [`CudaModel::load`] with the model's products taking `activations`
    /// ([`WeightFormat::activations`]: [`Activations::Q8`] for what the CPU runs as
    /// [`WeightFormat::NativeQ8`], the default for K-quant files). The MTP head's products
    /// keep `f32` activations.
    pub fn load_with(path: &Path, dev: Arc<CudaDevice>, activations: Activations) -> Result<Self> {
        Self::from_model_with(
            &Model::load(path, WeightFormat::Quantized)?,
            dev,
            activations,
        )
    }

    /// Uploads `model`'s weights to `dev`. A model loaded with [`WeightFormat::Quantized`]
    /// holds its file's blocks, which the kernels read as they are (GGUF Q4_0, Q4_1, Q5_0,
    /// Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; F32, F16, BF16); weights in another form (the native
    /// kernels' tiles, types without a device format) go up as `f32` values.
    pub fn from_model(model: &Model, dev: Arc<CudaDevice>) -> Result<Self> {
        Self::from_model_with(model, dev, Activations::F32)
    }

    /// [`CudaModel::from_model`] with the model's products taking `activations`.
    pub fn from_model_with(
        model: &Model,
        dev: Arc<CudaDevice>,
        activations: Activations,
    ) -> Result<Self> {
        let c = model.config().clone();
        let (h, v) = (c.hidden_size, c.vocab_size);
        let matrix = |l: &crate::Linear| DeviceMatrix::from_linear(&*dev, l, activations);
        let mut layers = Vec::with_capacity(model.layers.len());
        for l in &model.layers {
            let qk_norm = match (&l.q_norm, &l.k_norm) {
                (Some(q), Some(k)) => Some((dev.upload(q)?, dev.upload(k)?)),
                _ => None,
            };
            layers.push(Layer {
                attn_norm: dev.upload(&l.attn_norm)?,
                qkv: matrix(&l.qkv)?,
                qk_norm,
                o: matrix(&l.o)?,
                ffn_norm: dev.upload(&l.ffn_norm)?,
                gate_up: matrix(&l.gate_up)?,
                down: matrix(&l.down)?,
            });
        }
        let lm_head = Arc::new(matrix(&model.lm_head)?);
        let embed = if c.tie_embeddings && lm_head.parts.len() == 1 {
            lm_head.clone()
        } else {
            let table: Vec<f32> = match &model.embed {
                Embedding::Table(m) => m.dequantize(),
                Embedding::Dense(t) => t.flatten_all()?.to_vec1::<f32>()?,
            };
            Arc::new(DeviceMatrix::upload(&*dev, &table, None, v, h)?)
        };
        let (cos, sin) = model.rope.tables();
        let rope = DeviceRope {
            cos: dev.upload(cos)?,
            sin: dev.upload(sin)?,
            interleaved: model.rope.style() == RopeStyle::Interleaved,
        };
        let max_len = c.context_length.min(model.rope.max_positions());
        let graphs = super::switches::switched_on("MTPLX_CUDA_GRAPHS");
        Ok(CudaModel {
            host_embed: model.embed.clone(),
            max_len,
            graphs: std::sync::atomic::AtomicBool::new(graphs),
            embed,
            final_norm: dev.upload(&model.final_norm)?,
            layers,
            lm_head,
            rope,
            scratch: Mutex::new(None),
            config: c,
            dev,
        })
    }

    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.dev
    }

    /// The factory of this model's caches (on its device).
    pub fn cache_factory(&self) -> CacheFactory {
        CacheFactory::device(DeviceCaches(Arc::new(CudaCaches(self.dev.clone()))))
    }

    /// Buffers for passes of up to `rows` rows.
    fn new_scratch(&self, rows: usize) -> Result<Scratch> {
        let c = &self.config;
        Scratch::new(&self.dev, c, rows, c.num_layers, c.vocab_size, self.max_len)
    }

    /// Queues the pass over every layer for `n` rows (whose `meta` and `kv` are on the
    /// device).
    fn layers_pass(&self, s: &mut Scratch, n: usize) -> Result<()> {
        run_pass(&self.dev, &self.graphs, s, n, &|s| self.launch_layers(s, n))
    }

    /// The launches of one pass over every layer for `n` rows.
    fn launch_layers(&self, s: &mut Scratch, n: usize) -> Result<()> {
        debug_assert_eq!(self.embed.cols, self.config.hidden_size);
        self.dev.embed(&s.meta, &self.embed, &mut s.x, n)?;
        for (li, l) in self.layers.iter().enumerate() {
            launch_layer(
                &self.dev,
                &self.config,
                l,
                li,
                s,
                n,
                &self.rope,
                self.max_len,
            )?;
        }
        Ok(())
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let vocab = self.config.vocab_size;
        match tokens.iter().find(|&&t| t as usize >= vocab) {
            Some(&id) => Err(ModelError::TokenOutOfRange { id, vocab }),
            None => Ok(()),
        }
    }

    /// The output head over `rows` normed rows of `s.normed` into `s.logits`.
    fn output_head(&self, s: &mut Scratch, rows: usize) -> Result<()> {
        self.dev
            .matvec(&self.lm_head, &s.normed, &mut s.logits, rows, false)
    }
}

impl LanguageModel for CudaModel {
    fn dims(&self) -> Dims {
        self.config.dims()
    }

    fn state_shape(&self) -> StateShape {
        StateShape::attention_only(self.config.kv_shape())
    }

    fn geometry(&self) -> String {
        self.config.geometry()
    }

    fn numerics(&self) -> String {
        "weights=file-blocks device=cuda".into()
    }

    fn weight_bytes(&self) -> usize {
        // What a token reads, and an untied embedding's table (a tied one is the head).
        let table = if Arc::ptr_eq(&self.embed, &self.lm_head) {
            0
        } else {
            self.embed.bytes()
        };
        self.weight_bytes_per_token() + table
    }

    fn weight_bytes_per_token(&self) -> usize {
        // An untied embedding is an `f32` table of its own (one row a token).
        let layers: usize = self
            .layers
            .iter()
            .map(|l| l.qkv.bytes() + l.o.bytes() + l.gate_up.bytes() + l.down.bytes())
            .sum();
        layers + self.lm_head.bytes()
    }

    fn is_batch_invariant(&self) -> bool {
        false
    }

    fn prefill_activation_bytes(&self, chunk_tokens: usize) -> u64 {
        self.config.prefill_activation_bytes(chunk_tokens)
    }

    fn mtp_layer(&self) -> Option<&ModelConfig> {
        Some(&self.config)
    }

    fn forward_into(
        &self,
        tokens: &[u32],
        seq: &mut Sequence,
        want: Want,
        out: &mut ForwardOutput,
    ) -> Result<()> {
        let cache = seq.kv_mut();
        let c = &self.config;
        let n = tokens.len();
        if n == 0 {
            return Err(ModelError::EmptyInput);
        }
        self.check_tokens(tokens)?;
        let cache = cache
            .device_mut()
            .and_then(|a| a.downcast_mut::<CudaKvCache>())
            .ok_or_else(|| {
                ModelError::Device(
                    "the CUDA model runs on caches from its own factory (CudaModel::cache_factory)"
                        .into(),
                )
            })?;
        if !Arc::ptr_eq(cache.device(), &self.dev) {
            return Err(ModelError::Device("the cache is on another device".into()));
        }
        // The kernels write through the cache's addresses: its geometry must be the model's.
        if cache.shape() != c.kv_shape() {
            return Err(mtplx_kv::KvError::ShapeMismatch {
                cache: cache.shape(),
                source_shape: c.kv_shape(),
            }
            .into());
        }
        let pos0 = cache.len();
        let max = self.max_len;
        if pos0 + n > max {
            return Err(ModelError::ContextFull {
                len: pos0,
                new: n,
                max,
            });
        }
        cache.reserve(pos0 + n)?;
        let mut guard = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let s = fit(&mut guard, n, |rows| self.new_scratch(rows))?;
        let h = c.hidden_size;
        let eps = c.rms_norm_eps;
        let dev = &*self.dev;
        s.begin(dev, cache, pos0, pos0, tokens)?;
        self.layers_pass(s, n)?;
        cache.commit(pos0 + n);
        let first = match want {
            Want::Nothing => {
                out.rows = 0;
                out.logits.clear();
                out.hidden.clear();
                return dev.sync();
            }
            Want::Hidden => 0,
            Want::Last => n - 1,
            Want::All => 0,
        };
        let rows = n - first;
        out.rows = rows;
        out.hidden.resize(rows * h, 0.0);
        dev.read(&s.x, first * h, &mut out.hidden)?;
        if want == Want::Hidden {
            out.logits.clear();
            return Ok(());
        }
        // The head runs over the wanted rows only: normed rows start at row 0.
        dev.rms_norm_rows(&s.x, first, &self.final_norm, &mut s.normed, rows, h, eps)?;
        self.output_head(s, rows)?;
        out.logits.resize(rows * c.vocab_size, 0.0);
        dev.read(&s.logits, 0, &mut out.logits)
    }

    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check_tokens(tokens)?;
        let h = self.config.hidden_size;
        let mut out = vec![0f32; tokens.len() * h];
        self.host_embed.lookup(tokens, h, &mut out)?;
        Ok(out)
    }

    fn head(&self, hidden: &[f32]) -> Result<Vec<f32>> {
        let (h, v) = (self.config.hidden_size, self.config.vocab_size);
        let n = hidden.len() / h;
        if n == 0 {
            return Ok(Vec::new());
        }
        let hidden = &hidden[..n * h];
        let mut guard = self.scratch.lock().unwrap_or_else(|p| p.into_inner());
        let s = fit(&mut guard, n, |rows| self.new_scratch(rows))?;
        self.dev.write(hidden, &mut s.x, 0)?;
        self.dev.rms_norm_rows(
            &s.x,
            0,
            &self.final_norm,
            &mut s.normed,
            n,
            h,
            self.config.rms_norm_eps,
        )?;
        self.output_head(s, n)?;
        let mut out = vec![0f32; n * v];
        self.dev.read(&s.logits, 0, &mut out)?;
        Ok(out)
    }
}
