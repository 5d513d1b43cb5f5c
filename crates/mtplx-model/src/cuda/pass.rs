//! One forward pass on the device: a decoder layer's weights, the scratch buffers a pass
//! runs in (sized to fit, replaced when too small), and the launches, replayed from a
//! captured graph for decode steps and verify blocks.

use std::collections::HashMap;

use cudarc::driver::CudaSlice;
use mtplx_kv::{KvDtype, KvView};

use super::cache::CudaKvCache;
use super::device::attention::AttendIn;
use super::device::before::{Before, Room};
use super::device::{AttendParts, CudaDevice, DeviceRope};
use super::graph::Graph;
use super::matrix::DeviceMatrix;

use crate::config::ModelConfig;
use crate::error::Result;

pub(super) struct Layer {
    pub(super) attn_norm: CudaSlice<f32>,
    pub(super) qkv: DeviceMatrix,
    /// Qwen3's per-head Q and K norms.
    pub(super) qk_norm: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    pub(super) o: DeviceMatrix,
    pub(super) ffn_norm: CudaSlice<f32>,
    pub(super) gate_up: DeviceMatrix,
    pub(super) down: DeviceMatrix,
}

/// Activation buffers, grown to the largest block seen, and the graphs captured over them.
pub(super) struct Scratch {
    pub(super) rows: usize,
    /// `[row0, pos0, token ids...]`, what a pass's launches read (see `kernels.cu`).
    pub(super) meta: CudaSlice<u32>,
    /// The cache's K and V addresses per layer, and what was last written there.
    pub(super) kv: CudaSlice<u64>,
    pub(super) kv_host: Vec<u64>,
    /// The type the cache stores its rows as, which picks the kernels that touch them.
    pub(super) kv_dtype: KvDtype,
    /// One captured pass over the layers per row count up to [`GRAPH_ROWS`].
    pub(super) graphs: HashMap<usize, Graph>,
    pub(super) x: CudaSlice<f32>,
    pub(super) normed: CudaSlice<f32>,
    pub(super) qkv: CudaSlice<f32>,
    pub(super) q: CudaSlice<f32>,
    pub(super) attn: CudaSlice<f32>,
    /// Attention's parts before they are merged (see `kernels.cu`).
    pub(super) attn_parts: AttendParts,
    pub(super) gate_up: CudaSlice<f32>,
    pub(super) act: CudaSlice<f32>,
    /// A decode step's row of x rounded by the kernel that wrote it, for the 8-bit
    /// products that read it so (`CudaDevice::rounds_row_for`).
    pub(super) rounded: CudaSlice<u8>,
    pub(super) logits: CudaSlice<f32>,
    /// An MTP head's inputs: the trunk's hidden rows, and the two normed halves of the
    /// head's input (empty for the trunk).
    pub(super) head_in: [CudaSlice<f32>; 3],
}

impl Scratch {
    /// Buffers for `rows` rows of `c`'s geometry over `layers` layers of K/V, with `out`
    /// scores per row, attending over up to `max_len` positions.
    pub(super) fn new(
        dev: &CudaDevice,
        c: &ModelConfig,
        rows: usize,
        layers: usize,
        out: usize,
        max_len: usize,
    ) -> Result<Self> {
        Self::with_head_inputs(dev, c, rows, layers, out, max_len, false)
    }

    pub(super) fn with_head_inputs(
        dev: &CudaDevice,
        c: &ModelConfig,
        rows: usize,
        layers: usize,
        out: usize,
        max_len: usize,
        head: bool,
    ) -> Result<Self> {
        let head_rows = if head { rows * c.hidden_size } else { 1 };
        let (h, hd, i) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (qd, kvd) = (c.num_heads * hd, c.num_kv_heads * hd);
        // The passes over these buffers may be captured into graphs, where nothing can be
        // allocated: a decode step's products find their rounding's room made.
        dev.reserve_row_rounding(h.max(i).max(qd))?;
        Ok(Scratch {
            rows,
            meta: dev.zeros(rows + 2)?,
            kv: dev.zeros(2 * layers)?,
            kv_host: Vec::new(),
            kv_dtype: KvDtype::F32,
            graphs: HashMap::new(),
            x: dev.zeros(rows * h)?,
            normed: dev.zeros(rows * h)?,
            qkv: dev.zeros(rows * (qd + 2 * kvd))?,
            q: dev.zeros(rows * qd)?,
            attn: dev.zeros(rows * qd)?,
            attn_parts: AttendParts::new(dev, rows, (c.num_heads, c.num_kv_heads, hd), max_len)?,
            gate_up: dev.zeros(rows * 2 * i)?,
            act: dev.zeros(rows * i)?,
            rounded: dev.zeros(CudaDevice::rounded_row_bytes(h.max(i)))?,
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
pub(super) fn fit(
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
    pub(super) fn begin(
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
    /// another cache, or this one grown). A cache of another type drops the captured
    /// graphs, whose launches were of the other type's kernels.
    pub(super) fn point_at(&mut self, dev: &CudaDevice, cache: &CudaKvCache) -> Result<()> {
        if cache.dtype() != self.kv_dtype {
            self.graphs.clear();
            self.kv_dtype = cache.dtype();
        }
        let addresses = cache.addresses();
        if addresses != self.kv_host {
            dev.write(&addresses, &mut self.kv, 0)?;
            self.kv_host = addresses;
        }
        Ok(())
    }
}

/// Row counts whose passes are captured as graphs and replayed (decode steps and verify
/// blocks); longer blocks (prefill chunks) launch kernel by kernel.
pub(super) const GRAPH_ROWS: usize = 8;

/// Queues `launch` for `n` rows: the replay of the graph captured for `n` where there is
/// one (captured on first use when `n` is at most [`GRAPH_ROWS`] and graphs are on), else
/// the launches themselves. A capture that fails turns graphs off for good.
pub(super) fn run_pass(
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
        return dev.replay(g);
    }
    match dev.capture(|| launch(s)) {
        Ok(g) => {
            dev.replay(&g)?;
            s.graphs.insert(n, g);
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
pub(super) fn launch_layer(
    dev: &CudaDevice,
    c: &ModelConfig,
    l: &Layer,
    li: usize,
    s: &mut Scratch,
    n: usize,
    rope: &DeviceRope,
    max_len: usize,
) -> Result<()> {
    let hd = c.head_dim;
    let heads = (c.num_heads, c.num_kv_heads, hd);
    let eps = c.rms_norm_eps;
    let scale = 1.0 / (hd as f32).sqrt();
    // The norms and silu_mul before the products: inside a decode step's products over
    // narrow rows, else launched apart, rounding their row for the 8-bit products that read
    // x so (`matvec_made`; the same bits either way).
    dev.matvec_made(
        &l.qkv,
        Before::Norm(&l.attn_norm, eps),
        &s.x,
        Room {
            x: &mut s.normed,
            rounded: &mut s.rounded,
        },
        &mut s.qkv,
        n,
        false,
    )?;
    dev.qkv_post(
        &s.qkv,
        &mut s.q,
        &s.kv,
        s.kv_dtype,
        li,
        rope,
        heads,
        n,
        &s.meta,
        l.qk_norm.as_ref(),
        eps,
    )?;
    let a = AttendIn {
        q: &s.q,
        kv: &s.kv,
        kv_dtype: s.kv_dtype,
        layer: li,
        heads,
        n,
        meta: &s.meta,
        scale,
        max_len,
    };
    dev.attend(&a, &mut s.attn_parts, &mut s.attn)?;
    dev.matvec(&l.o, &s.attn, &mut s.x, n, true)?;
    dev.matvec_made(
        &l.gate_up,
        Before::Norm(&l.ffn_norm, eps),
        &s.x,
        Room {
            x: &mut s.normed,
            rounded: &mut s.rounded,
        },
        &mut s.gate_up,
        n,
        false,
    )?;
    dev.matvec_made(
        &l.down,
        Before::SiluMul,
        &s.gate_up,
        Room {
            x: &mut s.act,
            rounded: &mut s.rounded,
        },
        &mut s.x,
        n,
        true,
    )
}
