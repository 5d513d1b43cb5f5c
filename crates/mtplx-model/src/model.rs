//! The decoder graph of the Llama / Qwen2 / Qwen3 family.

use std::path::Path;
use std::sync::{Arc, Mutex};

use candle_core::{Device, Tensor};
use mtplx_kv::{CacheFactory, Sequence, StateShape};

use crate::config::{Architecture, Dims, ModelConfig};
use crate::error::{ModelError, Result};
use crate::kernels::QuantMatrix;
use crate::ops::{self, Rope};
use crate::source::{GgufSource, HfSource, TensorRole, WeightSource};
use crate::weights::{Linear, RawWeight, WeightFormat};

/// Which rows of a forward pass the caller wants logits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// No logits (an intermediate prefill chunk).
    Nothing,
    /// The last row only (the end of a prefill, a decode step).
    Last,
    /// Every row (a speculative verify block).
    All,
    /// Every row's hidden state and no logits: a prefill chunk whose rows an MTP head reads
    /// (the output head, a fifth of a row's work here, is skipped).
    Hidden,
}

/// What a forward pass returns for the rows the caller wanted.
#[derive(Debug, Clone, Default)]
pub struct ForwardOutput {
    /// Rows for which logits and hidden states are given.
    pub rows: usize,
    /// `[rows, vocab]`.
    pub logits: Vec<f32>,
    /// `[rows, hidden]`: the last layer's output before the final norm (what an MTP head
    /// consumes).
    pub hidden: Vec<f32>,
}

impl ForwardOutput {
    /// Logits of row `r`.
    pub fn logits_row(&self, r: usize) -> &[f32] {
        let v = self.logits.len() / self.rows.max(1);
        &self.logits[r * v..(r + 1) * v]
    }

    /// Logits of the last row.
    pub fn last_logits(&self) -> &[f32] {
        self.logits_row(self.rows.saturating_sub(1))
    }
}

/// The seam the rest of mtplx uses: a causal language model that runs on a [`Sequence`]
/// (K/V in the caller's layout, plus the recurrent state and its checkpoints for a hybrid
/// model; an attention-only model has none). Dense and hybrid models, and another backend
/// (MLX on macOS, say), implement it; no caller has a path per family.
pub trait LanguageModel: Send + Sync {
    fn dims(&self) -> Dims;

    /// The shape of the state a sequence of this model holds.
    fn state_shape(&self) -> StateShape;

    /// An empty sequence for this model, its K/V in `factory`'s layout.
    fn new_sequence(&self, factory: &CacheFactory) -> Sequence {
        Sequence::new(factory, &self.state_shape())
    }

    /// Runs `tokens` at positions `seq.len()..`, folding them into `seq`.
    fn forward(&self, tokens: &[u32], seq: &mut Sequence, want: Want) -> Result<ForwardOutput> {
        let mut out = ForwardOutput::default();
        self.forward_into(tokens, seq, want, &mut out)?;
        Ok(out)
    }

    /// [`forward`](Self::forward) into `out`, reusing its buffers: with [`Model`]'s native
    /// weights a decode step allocates nothing once the buffers have grown.
    fn forward_into(
        &self,
        tokens: &[u32],
        seq: &mut Sequence,
        want: Want,
        out: &mut ForwardOutput,
    ) -> Result<()>;

    /// Embeds tokens (`[n, hidden]`); an MTP head reuses the trunk's embedding.
    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>>;

    /// Final norm and output head on hidden rows (`[n, hidden]` → `[n, vocab]`).
    fn head(&self, hidden: &[f32]) -> Result<Vec<f32>>;

    /// What makes this model's states comparable: family and geometry, as text (part of
    /// the key a stored state is reused under).
    fn geometry(&self) -> String;

    /// How the numbers are computed (the weight format: each runs its own kernels, so its
    /// own bits), as text (part of the reuse key).
    fn numerics(&self) -> String;

    /// Bytes the weights take in memory.
    fn weight_bytes(&self) -> usize;

    /// Bytes of weights a decode step reads: every matrix a token is multiplied by, the
    /// output head included, and of an embedding table that is not the head only one row
    /// (left out). The numerator of a decode step's bandwidth bound.
    fn weight_bytes_per_token(&self) -> usize;

    /// Peak activation bytes of a prefill pass of `chunk_tokens` rows (for admission).
    fn prefill_activation_bytes(&self, chunk_tokens: usize) -> u64;

    /// Whether a row's result is bit-identical however the tokens before it arrived.
    fn is_batch_invariant(&self) -> bool;

    /// The geometry of the decoder layer an MTP head of this model repeats, where mtplx can
    /// load one for the model's family (`None`: no MTP head layout is known for it).
    fn mtp_layer(&self) -> Option<&ModelConfig> {
        None
    }
}

pub(crate) struct Layer {
    pub(crate) attn_norm: Vec<f32>,
    /// Q, K and V side by side in each output row.
    pub(crate) qkv: Linear,
    pub(crate) o: Linear,
    pub(crate) q_norm: Option<Vec<f32>>,
    pub(crate) k_norm: Option<Vec<f32>>,
    pub(crate) ffn_norm: Vec<f32>,
    /// Gate and up side by side in each output row.
    pub(crate) gate_up: Linear,
    pub(crate) down: Linear,
}

/// The token embedding table.
#[derive(Clone)]
pub(crate) enum Embedding {
    /// `[vocab, hidden]`, dense `f32` (the `F32` and `Quantized` formats).
    Dense(Tensor),
    /// The file's own blocks; a lookup dequantizes one row. Shared with a tied output head.
    Table(Arc<QuantMatrix>),
}

impl Embedding {
    /// Rows `tokens` (checked to be in the vocabulary) into `x` (`[n, hidden]`).
    pub(crate) fn lookup(&self, tokens: &[u32], h: usize, x: &mut [f32]) -> Result<()> {
        match self {
            Embedding::Table(m) => {
                for (&t, row) in tokens.iter().zip(x.chunks_exact_mut(h)) {
                    m.dequantize_row(t as usize, row);
                }
            }
            Embedding::Dense(t) => {
                let ids = Tensor::from_slice(tokens, tokens.len(), &Device::Cpu)?;
                let rows = t.index_select(&ids, 0)?.flatten_all()?.to_vec1::<f32>()?;
                x.copy_from_slice(&rows);
            }
        }
        Ok(())
    }
}

/// Activation buffers of a forward pass, kept between calls so that a decode step
/// allocates nothing once they have grown.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    normed: Vec<f32>,
    qkv: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate_up: Vec<f32>,
    act: Vec<f32>,
}

impl Scratch {
    fn fit(&mut self, n: usize, c: &ModelConfig) {
        let (qd, kvd) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let h = c.hidden_size;
        let i = c.intermediate_size;
        for (buf, len) in [
            (&mut self.x, n * h),
            (&mut self.normed, n * h),
            (&mut self.qkv, n * (qd + 2 * kvd)),
            (&mut self.q, n * qd),
            (&mut self.k, n * kvd),
            (&mut self.v, n * kvd),
            (&mut self.attn, n * qd),
            (&mut self.proj, n * h),
            (&mut self.gate_up, n * 2 * i),
            (&mut self.act, n * i),
        ] {
            buf.resize(len, 0.0);
        }
    }
}

/// A loaded model: weights in memory, ready to run.
pub struct Model {
    config: ModelConfig,
    format: WeightFormat,
    pub(crate) embed: Embedding,
    pub(crate) layers: Vec<Layer>,
    pub(crate) final_norm: Vec<f32>,
    pub(crate) lm_head: Linear,
    pub(crate) rope: Rope,
    scratch: Mutex<Scratch>,
}

impl Model {
    /// Loads a GGUF file or a Hugging Face folder.
    pub fn load(path: &Path, format: WeightFormat) -> Result<Self> {
        if path.is_dir() {
            let mut src = HfSource::open(path)?;
            let config = src.config()?;
            Self::from_source(&mut src, config, format)
        } else {
            let mut src = GgufSource::open(path)?;
            let config = src.config()?;
            Self::from_source(&mut src, config, format)
        }
    }

    /// Builds the graph from any checkpoint.
    pub fn from_source(
        src: &mut dyn WeightSource,
        mut config: ModelConfig,
        format: WeightFormat,
    ) -> Result<Self> {
        let c = config.clone();
        let mut take = |role: TensorRole, layer: usize, expected: &[usize]| -> Result<RawWeight> {
            let name = src.name(role, layer);
            let w = src.get(&name)?.ok_or_else(|| ModelError::MissingTensor {
                path: src.path().to_path_buf(),
                tensor: name.clone(),
            })?;
            check_shape(src.path(), &name, &w.dims(), expected)?;
            Ok(w)
        };
        let (h, hd) = (c.hidden_size, c.head_dim);
        let (qd, kvd) = (c.num_heads * hd, c.num_kv_heads * hd);
        let embed_raw = take(TensorRole::Embed, 0, &[c.vocab_size, h])?;
        let embed = match (format, &embed_raw) {
            (f, RawWeight::Quant(q)) if f.is_native() => {
                match crate::kernels::from_qtensor_with(q, f.activations()) {
                    Ok(m) => Embedding::Table(Arc::new(m)),
                    Err(_) => Embedding::Dense(embed_raw.to_dense()?),
                }
            }
            _ => Embedding::Dense(embed_raw.to_dense()?),
        };
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let mut lin = |role, shape: [usize; 2]| Linear::new(take(role, i, &shape)?, format);
            let q = lin(TensorRole::Q, [qd, h])?;
            let k = lin(TensorRole::K, [kvd, h])?;
            let v = lin(TensorRole::V, [kvd, h])?;
            let o = lin(TensorRole::O, [h, qd])?;
            let gate = lin(TensorRole::Gate, [c.intermediate_size, h])?;
            let up = lin(TensorRole::Up, [c.intermediate_size, h])?;
            let down = lin(TensorRole::Down, [h, c.intermediate_size])?;
            let mut vec = |role, len: usize| take(role, i, &[len])?.to_vec();
            let (q, k, v) = if c.qkv_bias {
                (
                    q.with_bias(vec(TensorRole::QBias, qd)?),
                    k.with_bias(vec(TensorRole::KBias, kvd)?),
                    v.with_bias(vec(TensorRole::VBias, kvd)?),
                )
            } else {
                (q, k, v)
            };
            let (q_norm, k_norm) = if c.qk_norm {
                (
                    Some(vec(TensorRole::QNorm, hd)?),
                    Some(vec(TensorRole::KNorm, hd)?),
                )
            } else {
                (None, None)
            };
            layers.push(Layer {
                attn_norm: vec(TensorRole::AttnNorm, h)?,
                ffn_norm: vec(TensorRole::FfnNorm, h)?,
                qkv: Linear::concat(vec![q, k, v])?,
                o,
                q_norm,
                k_norm,
                gate_up: Linear::concat(vec![gate, up])?,
                down,
            });
        }
        let final_norm = take(TensorRole::FinalNorm, 0, &[h])?.to_vec()?;
        let head_name = src.name(TensorRole::LmHead, 0);
        let lm_head = match src.get(&head_name)? {
            Some(w) => {
                check_shape(src.path(), &head_name, &w.dims(), &[c.vocab_size, h])?;
                config.tie_embeddings = false;
                Linear::new(w, format)?
            }
            // GGUF files without `output.weight` tie the head to the embedding.
            None if c.tie_embeddings || matches!(embed_raw, RawWeight::Quant(_)) => {
                config.tie_embeddings = true;
                match (&embed, format) {
                    (Embedding::Table(m), _) => Linear::shared(m.clone()),
                    (Embedding::Dense(t), WeightFormat::F32) => Linear::dense(t.clone())?,
                    (Embedding::Dense(_), _) => Linear::new(embed_raw, format)?,
                }
            }
            None => {
                return Err(ModelError::MissingTensor {
                    path: src.path().to_path_buf(),
                    tensor: head_name,
                })
            }
        };
        let rope = Rope::new(hd, c.rope_theta, c.context_length, c.rope_style);
        Ok(Model {
            config,
            format,
            embed,
            layers,
            final_norm,
            lm_head,
            rope,
            scratch: Mutex::new(Scratch::default()),
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn format(&self) -> WeightFormat {
        self.format
    }

    pub fn arch(&self) -> Architecture {
        self.config.arch
    }

    /// Bytes of weights held in memory.
    pub fn weight_bytes(&self) -> usize {
        let (layers, embed, head) = self.weight_parts();
        layers + embed + head
    }

    /// Bytes of weights a decode step reads ([`LanguageModel::weight_bytes_per_token`]): the
    /// layers' matrices and the output head (the table itself when tied to it).
    pub fn weight_bytes_per_token(&self) -> usize {
        let (layers, embed, head) = self.weight_parts();
        layers + if head == 0 { embed } else { head }
    }

    /// The layers' matrices, the embedding table and the output head (0 when the head is the
    /// table), in bytes.
    fn weight_parts(&self) -> (usize, usize, usize) {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                [&l.qkv, &l.o, &l.gate_up, &l.down]
                    .iter()
                    .map(|x| x.weight_bytes())
                    .sum::<usize>()
            })
            .sum();
        let (embed, head) = match &self.embed {
            // A tied head shares the table.
            Embedding::Table(m) if self.config.tie_embeddings => (m.size_in_bytes(), 0),
            Embedding::Table(m) => (m.size_in_bytes(), self.lm_head.weight_bytes()),
            Embedding::Dense(t) if self.config.tie_embeddings && !self.lm_head.is_quantized() => {
                (t.elem_count() * 4, 0)
            }
            Embedding::Dense(t) => (t.elem_count() * 4, self.lm_head.weight_bytes()),
        };
        (layers, embed, head)
    }

    /// Whether every product of a forward pass is batch-invariant, so that a row's logits do
    /// not depend on the rows computed with it (prefill chunk, verify block, decode step).
    /// True for [`WeightFormat::Native`] and [`WeightFormat::NativeQ8`].
    pub fn is_batch_invariant(&self) -> bool {
        self.layers.iter().all(|l| {
            [&l.qkv, &l.o, &l.gate_up, &l.down]
                .iter()
                .all(|x| x.is_batch_invariant())
        }) && self.lm_head.is_batch_invariant()
    }

    /// Embeds `tokens` into `x` (`[n, hidden]`).
    fn embed_into(&self, tokens: &[u32], x: &mut [f32]) -> Result<()> {
        self.check_tokens(tokens)?;
        self.embed.lookup(tokens, self.config.hidden_size, x)
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        let vocab = self.config.vocab_size;
        match tokens.iter().find(|&&t| t as usize >= vocab) {
            Some(&id) => Err(ModelError::TokenOutOfRange { id, vocab }),
            None => Ok(()),
        }
    }
}

fn check_shape(path: &Path, name: &str, got: &[usize], expected: &[usize]) -> Result<()> {
    if got != expected {
        return Err(ModelError::TensorShape {
            path: path.to_path_buf(),
            tensor: name.to_string(),
            got: got.to_vec(),
            expected: expected.to_vec(),
        });
    }
    Ok(())
}

impl LanguageModel for Model {
    fn dims(&self) -> Dims {
        let dims = self.config.dims();
        Dims {
            context_length: dims.context_length.min(self.rope.max_positions()),
            ..dims
        }
    }

    fn state_shape(&self) -> StateShape {
        StateShape::attention_only(self.config.kv_shape())
    }

    fn geometry(&self) -> String {
        self.config.geometry()
    }

    fn numerics(&self) -> String {
        format!("weights={:?}", self.format)
    }

    fn weight_bytes(&self) -> usize {
        Model::weight_bytes(self)
    }

    fn weight_bytes_per_token(&self) -> usize {
        Model::weight_bytes_per_token(self)
    }

    fn prefill_activation_bytes(&self, chunk_tokens: usize) -> u64 {
        self.config.prefill_activation_bytes(chunk_tokens)
    }

    fn is_batch_invariant(&self) -> bool {
        Model::is_batch_invariant(self)
    }

    fn mtp_layer(&self) -> Option<&ModelConfig> {
        Some(&self.config)
    }

    fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let mut x = vec![0f32; tokens.len() * self.config.hidden_size];
        self.embed_into(tokens, &mut x)?;
        Ok(x)
    }

    fn head(&self, hidden: &[f32]) -> Result<Vec<f32>> {
        let n = hidden.len() / self.config.hidden_size;
        let mut x = hidden.to_vec();
        ops::rms_norm_inplace(&mut x, &self.final_norm, self.config.rms_norm_eps);
        self.lm_head.forward(&x, n)
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
        let pos0 = cache.len();
        let max = c.context_length.min(self.rope.max_positions());
        if pos0 + n > max {
            return Err(ModelError::ContextFull {
                len: pos0,
                new: n,
                max,
            });
        }
        // One forward pass at a time uses the kept buffers; a concurrent one gets its own.
        let mut own = None;
        let mut guard = self.scratch.try_lock().ok();
        let s: &mut Scratch = match guard.as_deref_mut() {
            Some(s) => s,
            None => own.insert(Scratch::default()),
        };
        s.fit(n, c);
        let (h, hd) = (c.hidden_size, c.head_dim);
        let (qd, kvd) = (c.num_heads * hd, c.num_kv_heads * hd);
        let inter = c.intermediate_size;
        let eps = c.rms_norm_eps;
        let scale = 1.0 / (hd as f32).sqrt();
        self.embed_into(tokens, &mut s.x)?;
        for (li, l) in self.layers.iter().enumerate() {
            ops::rms_norm(&s.x, &l.attn_norm, eps, &mut s.normed);
            l.qkv.forward_into(&s.normed, n, &mut s.qkv)?;
            for (r, row) in s.qkv.chunks_exact(qd + 2 * kvd).enumerate() {
                s.q[r * qd..(r + 1) * qd].copy_from_slice(&row[..qd]);
                s.k[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd..qd + kvd]);
                s.v[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd + kvd..]);
            }
            if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
                ops::rms_norm_inplace(&mut s.q, qn, eps);
                ops::rms_norm_inplace(&mut s.k, kn, eps);
            }
            self.rope.apply(&mut s.q, c.num_heads, pos0);
            self.rope.apply(&mut s.k, c.num_kv_heads, pos0);
            cache.append(li, &s.k, &s.v)?;
            cache.attend(li, &s.q, c.num_heads, scale, &mut s.attn)?;
            l.o.forward_into(&s.attn, n, &mut s.proj)?;
            ops::add_inplace(&mut s.x, &s.proj);
            ops::rms_norm(&s.x, &l.ffn_norm, eps, &mut s.normed);
            l.gate_up.forward_into(&s.normed, n, &mut s.gate_up)?;
            ops::silu_mul_halves(&s.gate_up, inter, &mut s.act);
            l.down.forward_into(&s.act, n, &mut s.proj)?;
            ops::add_inplace(&mut s.x, &s.proj);
        }
        let first = match want {
            Want::Nothing => {
                out.rows = 0;
                out.logits.clear();
                out.hidden.clear();
                return Ok(());
            }
            Want::Hidden => {
                out.rows = n;
                out.logits.clear();
                out.hidden.clear();
                out.hidden.extend_from_slice(&s.x[..n * h]);
                return Ok(());
            }
            Want::Last => n - 1,
            Want::All => 0,
        };
        let rows = n - first;
        out.rows = rows;
        out.hidden.clear();
        out.hidden.extend_from_slice(&s.x[first * h..]);
        let normed = &mut s.normed[..rows * h];
        ops::rms_norm(&out.hidden, &self.final_norm, eps, normed);
        out.logits.resize(rows * c.vocab_size, 0.0);
        self.lm_head.forward_into(normed, rows, &mut out.logits)?;
        Ok(())
    }
}
