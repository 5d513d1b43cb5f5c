//! The CUDA backend (feature `cuda`): the Llama / Qwen2 graph with its weights, K/V and
//! every operation on an NVIDIA GPU.
//!
//! [`CudaModel`] implements [`LanguageModel`] over [`CudaKvCache`]s (built through
//! `CacheFactory::Device` with [`CudaCaches`]), so generation, speculative decoding and the
//! bank use it as they use the CPU model. Weights are dequantized to `f32` on load; the
//! kernels (`kernels.cu`, compiled at run time by NVRTC, so building needs no CUDA) compute
//! each row the same way whatever rows share its launch, so a verify block's logits equal a
//! decode step's bit for bit and greedy speculation stays token-identical.
//!
//! The driver and NVRTC libraries are loaded when a device is opened: a binary built with
//! this feature runs on a machine without CUDA, where [`CudaDevice::open`] returns
//! [`ModelError::Device`].

mod cache;
mod device;
mod mtp;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaGraph, CudaSlice};
use mtplx_kv::{CacheFactory, DeviceCaches, KvCache, KvView};

pub use cache::{CudaCaches, CudaKvCache};
pub use device::{compile, CudaDevice};
use device::{DeviceMatrix, DeviceRope};
pub use mtp::CudaMtpHead;

use crate::config::{ModelConfig, RopeStyle};
use crate::error::{ModelError, Result};
use crate::model::{Embedding, ForwardOutput, LanguageModel, Model, Want};

struct Layer {
    attn_norm: CudaSlice<f32>,
    qkv: DeviceMatrix,
    o: DeviceMatrix,
    ffn_norm: CudaSlice<f32>,
    gate_up: DeviceMatrix,
    down: DeviceMatrix,
}

/// Activation buffers, grown to the largest block seen, and the graphs captured over them.
struct Scratch {
    rows: usize,
    /// `[row0, pos0, token ids...]`, what a pass's launches read (see `kernels.cu`).
    meta: CudaSlice<u32>,
    /// The cache's K and V addresses per layer, and what was last written there.
    kv: CudaSlice<u64>,
    kv_host: Vec<u64>,
    /// One captured pass over the layers per row count up to [`GRAPH_ROWS`].
    graphs: HashMap<usize, Graph>,
    x: CudaSlice<f32>,
    normed: CudaSlice<f32>,
    qkv: CudaSlice<f32>,
    q: CudaSlice<f32>,
    attn: CudaSlice<f32>,
    gate_up: CudaSlice<f32>,
    act: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    /// An MTP head's inputs: the trunk's hidden rows, and the two normed halves of the
    /// head's input (empty for the trunk).
    head_in: [CudaSlice<f32>; 3],
}

impl Scratch {
    /// Buffers for `rows` rows of `c`'s geometry over `layers` layers of K/V, with `out`
    /// scores per row.
    fn new(
        dev: &CudaDevice,
        c: &ModelConfig,
        rows: usize,
        layers: usize,
        out: usize,
    ) -> Result<Self> {
        Self::with_head_inputs(dev, c, rows, layers, out, false)
    }

    fn with_head_inputs(
        dev: &CudaDevice,
        c: &ModelConfig,
        rows: usize,
        layers: usize,
        out: usize,
        head: bool,
    ) -> Result<Self> {
        let head_rows = if head { rows * c.hidden_size } else { 1 };
        let (h, hd, i) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (qd, kvd) = (c.num_heads * hd, c.num_kv_heads * hd);
        Ok(Scratch {
            rows,
            meta: dev.zeros(rows + 2)?,
            kv: dev.zeros(2 * layers)?,
            kv_host: Vec::new(),
            graphs: HashMap::new(),
            x: dev.zeros(rows * h)?,
            normed: dev.zeros(rows * h)?,
            qkv: dev.zeros(rows * (qd + 2 * kvd))?,
            q: dev.zeros(rows * qd)?,
            attn: dev.zeros(rows * qd)?,
            gate_up: dev.zeros(rows * 2 * i)?,
            act: dev.zeros(rows * i)?,
            logits: dev.zeros(rows * out)?,
            head_in: [
                dev.zeros(head_rows)?,
                dev.zeros(head_rows)?,
                dev.zeros(head_rows)?,
            ],
        })
    }
}

/// The buffers in `slot`, replaced by `make(rows)` (at least [`GRAPH_ROWS`]) when there are
/// none or they hold fewer than `n` rows. Replacing them drops the graphs captured on them.
fn fit(
    slot: &mut Option<Scratch>,
    n: usize,
    make: impl FnOnce(usize) -> Result<Scratch>,
) -> Result<&mut Scratch> {
    if slot.as_ref().is_none_or(|s| s.rows < n) {
        *slot = Some(make(n.max(GRAPH_ROWS))?);
    }
    Ok(slot.as_mut().expect("scratch just made"))
}

impl Scratch {
    /// Sets up a pass over `tokens`: their K/V land at `cache` rows `row0..` and they are
    /// rotated for positions `pos0..` (see `kernels.cu`'s `meta`).
    fn begin(
        &mut self,
        dev: &CudaDevice,
        cache: &CudaKvCache,
        row0: usize,
        pos0: usize,
        tokens: &[u32],
    ) -> Result<()> {
        let mut meta = Vec::with_capacity(tokens.len() + 2);
        meta.push(row0 as u32);
        meta.push(pos0 as u32);
        meta.extend_from_slice(tokens);
        dev.write(&meta, &mut self.meta, 0)?;
        self.point_at(dev, cache)
    }

    /// Points the pass at `cache`'s buffers (a copy to the device only when they moved:
    /// another cache, or this one grown).
    fn point_at(&mut self, dev: &CudaDevice, cache: &CudaKvCache) -> Result<()> {
        let addresses = cache.addresses();
        if addresses != self.kv_host {
            dev.write(&addresses, &mut self.kv, 0)?;
            self.kv_host = addresses;
        }
        Ok(())
    }
}

/// A captured pass.
struct Graph(CudaGraph);

// SAFETY: CUDA graphs may be launched and destroyed from any thread, one thread at a time
// (the driver's graph thread-safety rules); every `Graph` lives in the model's scratch,
// behind its mutex.
unsafe impl Send for Graph {}

/// Row counts whose passes are captured as graphs and replayed (decode steps and verify
/// blocks); longer blocks (prefill chunks) launch kernel by kernel.
const GRAPH_ROWS: usize = 8;

/// A model on a CUDA device.
///
/// Threading: the model, its caches and an MTP head on its device share one stream, and a
/// pass may be recorded into a graph while it is queued: use them from one thread at a time
/// (as the decode loop does). Work queued from another thread meanwhile could be recorded
/// into the graph.
pub struct CudaModel {
    dev: Arc<CudaDevice>,
    config: ModelConfig,
    /// `[vocab, hidden]`; also the output head when tied, and an MTP head's embedding.
    embed: Arc<CudaSlice<f32>>,
    layers: Vec<Layer>,
    final_norm: CudaSlice<f32>,
    /// `None`: the tied embedding.
    lm_head: Option<DeviceMatrix>,
    rope: DeviceRope,
    /// The embedding on the host (the CPU model's own, shared): what `embed` reads, with no
    /// round trip to the device.
    host_embed: Embedding,
    /// Positions a pass may reach: the model's context, or less where an attention block's
    /// shared memory runs out.
    max_len: usize,
    /// Shared memory of an attention block, sized for `max_len`.
    attend_shared: u32,
    /// Whether passes of up to [`GRAPH_ROWS`] rows replay captured graphs
    /// (`MTPLX_CUDA_GRAPHS=0` turns them off).
    graphs: std::sync::atomic::AtomicBool,
    scratch: Mutex<Option<Scratch>>,
}

impl CudaModel {
    /// Uploads `model`'s weights (dequantized to `f32`) to `dev`.
    pub fn from_model(model: &Model, dev: Arc<CudaDevice>) -> Result<Self> {
        let c = model.config().clone();
        if c.qk_norm {
            return Err(ModelError::Device(
                "the CUDA backend does not run per-head Q/K norms (Qwen3) yet".into(),
            ));
        }
        let (h, v) = (c.hidden_size, c.vocab_size);
        let table: Vec<f32> = match &model.embed {
            Embedding::Table(m) => {
                let mut t = vec![0f32; v * h];
                for (r, row) in t.chunks_exact_mut(h).enumerate() {
                    m.dequantize_row(r, row);
                }
                t
            }
            Embedding::Dense(t) => t.flatten_all()?.to_vec1::<f32>()?,
        };
        let matrix = |l: &crate::Linear| -> Result<DeviceMatrix> {
            DeviceMatrix::upload(
                &dev,
                &l.dense_rows()?,
                l.bias().as_deref(),
                l.out_features(),
                l.in_features(),
            )
        };
        let mut layers = Vec::with_capacity(model.layers.len());
        for l in &model.layers {
            layers.push(Layer {
                attn_norm: dev.upload(&l.attn_norm)?,
                qkv: matrix(&l.qkv)?,
                o: matrix(&l.o)?,
                ffn_norm: dev.upload(&l.ffn_norm)?,
                gate_up: matrix(&l.gate_up)?,
                down: matrix(&l.down)?,
            });
        }
        let lm_head = if c.tie_embeddings {
            None
        } else {
            Some(matrix(&model.lm_head)?)
        };
        if !h.is_multiple_of(4) {
            return Err(ModelError::Device(format!(
                "hidden size {h}: the CUDA backend needs a multiple of 4"
            )));
        }
        let (cos, sin) = model.rope.tables();
        let rope = DeviceRope {
            cos: dev.upload(cos)?,
            sin: dev.upload(sin)?,
            interleaved: model.rope.style() == RopeStyle::Interleaved,
        };
        let max_len = c
            .context_length
            .min(model.rope.max_positions())
            .min(CudaDevice::max_attend_len(c.head_dim));
        let attend_shared = CudaDevice::attend_shared_bytes(c.head_dim, max_len)?;
        let graphs = std::env::var("MTPLX_CUDA_GRAPHS").map_or(true, |v| v != "0");
        Ok(CudaModel {
            host_embed: model.embed.clone(),
            max_len,
            attend_shared,
            graphs: std::sync::atomic::AtomicBool::new(graphs),
            embed: Arc::new(dev.upload(&table)?),
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
        CacheFactory::Device(DeviceCaches(Arc::new(CudaCaches(self.dev.clone()))))
    }

    /// Buffers for passes of up to `rows` rows.
    fn new_scratch(&self, rows: usize) -> Result<Scratch> {
        let c = &self.config;
        Scratch::new(&self.dev, c, rows, c.num_layers, c.vocab_size)
    }

    /// Queues the pass over every layer for `n` rows (whose `meta` and `kv` are on the
    /// device).
    fn layers_pass(&self, s: &mut Scratch, n: usize) -> Result<()> {
        run_pass(&self.dev, &self.graphs, s, n, &|s| self.launch_layers(s, n))
    }

    /// The launches of one pass over every layer for `n` rows.
    fn launch_layers(&self, s: &mut Scratch, n: usize) -> Result<()> {
        let h = self.config.hidden_size;
        self.dev.embed(&s.meta, &self.embed, &mut s.x, n, h)?;
        for (li, l) in self.layers.iter().enumerate() {
            launch_layer(
                &self.dev,
                &self.config,
                l,
                li,
                s,
                n,
                &self.rope,
                self.attend_shared,
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
        match &self.lm_head {
            Some(m) => self.dev.matvec(m, &s.normed, &mut s.logits, rows, false),
            // The tied embedding, without a second copy of it.
            None => self.dev.matvec_raw(
                &self.embed,
                None,
                self.config.vocab_size,
                self.config.hidden_size,
                &s.normed,
                &mut s.logits,
                rows,
                false,
            ),
        }
    }
}

/// Queues `launch` for `n` rows: the replay of the graph captured for `n` where there is
/// one (captured on first use when `n` is at most [`GRAPH_ROWS`] and graphs are on), else
/// the launches themselves. A capture that fails turns graphs off for good.
fn run_pass(
    dev: &CudaDevice,
    graphs: &std::sync::atomic::AtomicBool,
    s: &mut Scratch,
    n: usize,
    launch: &dyn Fn(&mut Scratch) -> Result<()>,
) -> Result<()> {
    use std::sync::atomic::Ordering;
    if n > GRAPH_ROWS || !graphs.load(Ordering::Relaxed) {
        return launch(s);
    }
    if let Some(g) = s.graphs.get(&n) {
        return dev.replay(&g.0);
    }
    match dev.capture(|| launch(s)) {
        Ok(g) => {
            dev.replay(&g)?;
            s.graphs.insert(n, Graph(g));
            Ok(())
        }
        Err(e) => {
            eprintln!("mtplx: CUDA graphs off, launching kernel by kernel: {e}");
            graphs.store(false, Ordering::Relaxed);
            launch(s)
        }
    }
}

/// The launches of decoder layer `l` (K/V slot `li` of `s.kv`) over `n` rows of `s.x`,
/// which it updates in place.
#[allow(clippy::too_many_arguments)]
fn launch_layer(
    dev: &CudaDevice,
    c: &ModelConfig,
    l: &Layer,
    li: usize,
    s: &mut Scratch,
    n: usize,
    rope: &DeviceRope,
    attend_shared: u32,
) -> Result<()> {
    let (h, hd) = (c.hidden_size, c.head_dim);
    let heads = (c.num_heads, c.num_kv_heads, hd);
    let eps = c.rms_norm_eps;
    let scale = 1.0 / (hd as f32).sqrt();
    dev.rms_norm(&s.x, &l.attn_norm, &mut s.normed, n, h, eps)?;
    dev.matvec(&l.qkv, &s.normed, &mut s.qkv, n, false)?;
    dev.qkv_post(&s.qkv, &mut s.q, &s.kv, li, rope, heads, n, &s.meta)?;
    dev.attend(
        &s.q,
        &s.kv,
        li,
        &mut s.attn,
        heads,
        n,
        &s.meta,
        scale,
        attend_shared,
    )?;
    dev.matvec(&l.o, &s.attn, &mut s.x, n, true)?;
    dev.rms_norm(&s.x, &l.ffn_norm, &mut s.normed, n, h, eps)?;
    dev.matvec(&l.gate_up, &s.normed, &mut s.gate_up, n, false)?;
    dev.silu_mul(&s.gate_up, &mut s.act, n, c.intermediate_size)?;
    dev.matvec(&l.down, &s.act, &mut s.x, n, true)
}

impl LanguageModel for CudaModel {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn forward_into(
        &self,
        tokens: &[u32],
        cache: &mut dyn KvCache,
        want: Want,
        out: &mut ForwardOutput,
    ) -> Result<()> {
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
