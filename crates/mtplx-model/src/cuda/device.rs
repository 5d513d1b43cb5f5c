//! One CUDA device: its context, the stream everything runs on, and the compiled kernels.

use std::sync::Arc;

use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
    PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;
use mtplx_kv::KvDtype;

pub(crate) use super::fault::device_error;
use super::fused::FusedKernels;
use super::lent::{Lent, LentPool};
use super::matrix::{DeviceMatrix, Upload};
use super::q8::{Q8Kernels, RoundedX};
use super::source::{
    attend_mma_shared, compile_source, quietly, source, LaunchShape, WeightCode, ATTEND_KEYS,
    ATTEND_MMA_HEADS, ATTEND_ROWS, MATVEC1_XSTRIDE, MATVEC_OUTS, MATVEC_ROWS, MATVEC_WARPS,
    QKV_THREADS, ROW_THREADS,
};
use super::staging::Staging;
use crate::error::{ModelError, Result};
use crate::kernels::Activations;

pub(super) mod attention;
pub(super) mod before;
mod capture;
mod rounded;

struct Kernels {
    embed: CudaFunction,
    rms_norm: CudaFunction,
    /// One per weight format, by [`WeightCode`].
    matvec: Vec<CudaFunction>,
    /// The decode step's (one row of x), one per weight format; empty for a source
    /// (`MTPLX_CUDA_KERNELS`) from before they were written, whose decode uses `matvec`.
    matvec1: Vec<CudaFunction>,
    /// The most dynamic shared memory a `matvec1` or 8-bit block may use (the device's
    /// opt-in limit): `matvec1`'s x of up to this many bytes ÷ 4.5 values.
    shared_limit: usize,
    /// The device's multiprocessors.
    sms: usize,
    /// How the source in use launches `matvec1` and attention.
    shape: LaunchShape,
    /// The products with 8-bit activations (none in an older source).
    q8: Option<Q8Kernels>,
    /// The decode step's products that norm or `silu_mul` their x themselves.
    fused: Option<FusedKernels>,
    silu_mul: CudaFunction,
    /// `rms_norm` and `silu_mul` of a decode step's row that also round it for the 8-bit
    /// products that read x rounded (none in an older source).
    rms_norm_q8: Option<CudaFunction>,
    silu_mul_q8: Option<CudaFunction>,
    /// K/V writes and attention for `f32` caches, then for `f16` caches (none in an older
    /// source).
    kv_f32: KvKernels,
    kv_f16: Option<KvKernels>,
}

/// The kernels that touch a cache's rows, built for one stored type.
struct KvKernels {
    qkv_post: CudaFunction,
    attend: CudaFunction,
    /// A prefill chunk's attention, each part's rows read once for many rows and heads
    /// (`f16` caches, where the source has it).
    attend_tile: Option<CudaFunction>,
    /// Attention on tensor cores by head size (`f16` caches on sm_80 and later; none in
    /// an older source or with `MTPLX_CUDA_ATTEND_MMA=0`): taken for every row count.
    attend_mma: Vec<MmaAttend>,
}

/// The tensor-core attention kernels for one head size.
struct MmaAttend {
    head_dim: usize,
    /// `attend_mma_{hd}`: any launch.
    rows: CudaFunction,
    /// `attend_mma_split_{hd}`: a launch whose pairs fit one tile, its warps sharing the
    /// tile's work (the same bits). `None` with `MTPLX_CUDA_ATTEND_SPLIT=0` (to time it
    /// against `rows` in one binary; see docs/bench/h200.md) or in an older source.
    split: Option<CudaFunction>,
}

/// A CUDA device with the backend's kernels loaded. Every launch and copy goes to one
/// stream, in order; copies to the host wait for what came before them.
///
/// The model's passes run on one thread, but a server restores caches (copies rows in,
/// allocates, frees) on others: those copies, allocations and frees wait for `host_ops`,
/// which a graph capture holds from its start to its end, so nothing another thread queues
/// is ever recorded into a captured pass.
pub struct CudaDevice {
    ordinal: usize,
    name: String,
    /// Its compute capability (major, minor).
    capability: (i32, i32),
    stream: Arc<CudaStream>,
    k: Kernels,
    host_ops: std::sync::Mutex<()>,
    /// Pinned buffers for copies from pageable memory (made on first use).
    staging: std::sync::Mutex<Option<Staging>>,
    /// Page-locked buffers lent to restores, kept between them.
    lent: LentPool,
    /// Whether captured passes may chain their kernels by programmatic launch: a device of
    /// sm_90 or later, and every kernel of the source waits for the one before it.
    kernels_wait: bool,
    /// Whether they do (with `MTPLX_CUDA_PDL=1`; see `graph.rs`).
    programmatic: bool,
    /// The parts a tensor-core attention block takes where a test sets them (0: the
    /// launch's own choice).
    #[cfg(test)]
    attend_span: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (o, name, (major, minor)) = (self.ordinal, &self.name, self.capability);
        write!(f, "CudaDevice(cuda:{o}, {name}, sm_{major}{minor})")
    }
}

impl CudaDevice {
    /// Opens device `ordinal` and compiles the kernels for it (NVRTC, well under a second).
    /// Fails with [`ModelError::Device`] where the driver or NVRTC library is missing or
    /// there is no such device.
    pub fn open(ordinal: usize) -> Result<Arc<CudaDevice>> {
        // The driver library is loaded on first use and panics if it is absent.
        let ctx = quietly(|| CudaContext::new(ordinal))
            .map_err(|_| ModelError::Device("the CUDA driver library is not installed".into()))?
            .map_err(|e| device_error(&format!("open cuda:{ordinal}"), e))?;
        // One stream, so the event bookkeeping cudarc does for several streams is not needed.
        // SAFETY: nothing here uses a second stream.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| device_error("compute capability", e))?;
        let name = ctx.name().unwrap_or_else(|_| "unknown".into());
        let arch: &'static str = Box::leak(format!("compute_{major}{minor}").into_boxed_str());
        let source = source()?;
        let shape = LaunchShape::of(&source)?;
        let ptx_text = compile_source(&source, arch)?;
        // Programmatic launch only where every kernel waits for the one before it, and
        // for now only when asked for: its unit tests have run on a device, the model's
        // integration tests and its timing not yet (docs/bench/h200.md).
        let kernels_wait = major >= 9 && super::graph::every_kernel_waits(&ptx_text);
        let programmatic = kernels_wait && super::switches::opted_in("MTPLX_CUDA_PDL");
        let ptx = Ptx::from_src(ptx_text);
        let module = ctx
            .load_module(ptx)
            .map_err(|e| device_error("load the kernels", e))?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| device_error(&format!("kernel {name}"), e))
        };
        let matvec1 = match module.load_function("matvec1_0") {
            Ok(_) => (0..WeightCode::COUNT)
                .map(|c| f(&format!("matvec1_{c}")))
                .collect::<Result<Vec<_>>>()?,
            Err(_) => Vec::new(),
        };
        let q8 = match module.load_function(Q8Kernels::PROBE) {
            Ok(_) => Some(Q8Kernels::load(f)?),
            Err(_) => None,
        };
        // A decode step's x goes in shared memory (a 14,336-wide x, Llama-3-8B's FFN, takes
        // 63 KiB, past the 48 KiB a block gets without opting in), as do the 8-bit kernels'
        // rounded rows.
        let shared_limit = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(|e| device_error("shared memory limit", e))?;
        for func in matvec1.iter().chain(q8.iter().flat_map(Q8Kernels::all)) {
            func.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared_limit,
            )
            .map_err(|e| device_error("matvec shared memory", e))?;
        }
        let k = Kernels {
            embed: f("embed")?,
            rms_norm: f("rms_norm")?,
            matvec: (0..WeightCode::COUNT)
                .map(|c| f(&format!("matvec_{c}")))
                .collect::<Result<_>>()?,
            matvec1,
            shared_limit: shared_limit as usize,
            sms: ctx
                .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
                .map_err(|e| device_error("multiprocessor count", e))? as usize,
            shape,
            q8,
            fused: FusedKernels::load(&module, shared_limit)?,
            silu_mul: f("silu_mul")?,
            rms_norm_q8: module.load_function("rms_norm_q8").ok(),
            silu_mul_q8: module.load_function("silu_mul_q8").ok(),
            kv_f32: KvKernels {
                qkv_post: f("qkv_post")?,
                attend: f("attend")?,
                attend_tile: None,
                attend_mma: Vec::new(),
            },
            kv_f16: match module.load_function("attend_h") {
                Ok(attend) => Some(KvKernels {
                    qkv_post: f("qkv_post_h")?,
                    attend,
                    // Taken only where its shared memory can be raised to the device's limit
                    // (and not with MTPLX_CUDA_ATTEND_TILE=0: the per-row kernel, the same
                    // bits, so one binary times both).
                    attend_tile: module.load_function("attend_tile_h").ok().filter(|f| {
                        super::switches::switched_on("MTPLX_CUDA_ATTEND_TILE") &&
                        f.set_attribute(
                            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            shared_limit,
                        )
                        .is_ok()
                    }),
                    // Where its shared memory can be set (and not with
                    // MTPLX_CUDA_ATTEND_MMA=0, to time the kernels above in one binary).
                    attend_mma: if super::switches::switched_on("MTPLX_CUDA_ATTEND_MMA") {
                        let split = super::switches::switched_on("MTPLX_CUDA_ATTEND_SPLIT");
                        let load = |name: String, hd: usize| {
                            let func = module.load_function(&name).ok()?;
                            func.set_attribute(
                                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                attend_mma_shared(hd) as i32,
                            )
                            .ok()?;
                            Some(func)
                        };
                        ATTEND_MMA_HEADS
                            .iter()
                            .filter_map(|&hd| {
                                Some(MmaAttend {
                                    head_dim: hd,
                                    rows: load(format!("attend_mma_{hd}"), hd)?,
                                    split: load(format!("attend_mma_split_{hd}"), hd)
                                        .filter(|_| split),
                                })
                            })
                            .collect()
                    } else {
                        Vec::new()
                    },
                }),
                Err(_) => None,
            },
        };
        // A stream of its own: the legacy default stream cannot be captured into a graph.
        let stream = ctx
            .new_stream()
            .map_err(|e| device_error("create a stream", e))?;
        Ok(Arc::new(CudaDevice {
            ordinal,
            name,
            capability: (major, minor),
            stream,
            k,
            host_ops: std::sync::Mutex::new(()),
            staging: std::sync::Mutex::new(None),
            lent: LentPool::new(&ctx),
            kernels_wait,
            programmatic,
            #[cfg(test)]
            attend_span: Default::default(),
        }))
    }

    /// Whether a prefill chunk's 8-bit products run on tensor cores (`mmq_F`: a device of
    /// sm_80 or later, whose source has them).
    #[cfg(test)]
    pub(crate) fn q8_on_tensor_cores(&self) -> bool {
        self.k.q8.as_ref().is_some_and(Q8Kernels::has_tiles)
    }

    /// Rounds one row of `cols` values as a decode step's 8-bit products read it, alone
    /// (the speed diagnostic times it apart from the products); false where no product
    /// reads x rounded.
    #[cfg(test)]
    pub(crate) fn round_decode_row(&self, x: &CudaSlice<f32>, cols: usize) -> Result<bool> {
        match self.k.q8.as_ref().filter(|q8| q8.reads_rounded(1, cols)) {
            Some(q8) => q8
                .round(&self.stream, &|len| self.zeros(len), x, 1, cols)
                .map(|_| true),
            None => Ok(false),
        }
    }

    /// Its compute capability (major, minor).
    #[cfg(test)]
    pub(crate) fn capability(&self) -> (i32, i32) {
        self.capability
    }

    /// Held while a copy, allocation or free is queued from the host, and through a whole
    /// graph capture (see the type's docs).
    pub(crate) fn host_ops(&self) -> std::sync::MutexGuard<'_, ()> {
        self.host_ops.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Whether caches on this device can store K/V as `dtype`: `f32`, and `f16` with a
    /// kernel source that has its kernels.
    pub fn stores_kv(&self, dtype: KvDtype) -> bool {
        self.kv_kernels(dtype).is_ok()
    }

    fn kv_kernels(&self, dtype: KvDtype) -> Result<&KvKernels> {
        match dtype {
            KvDtype::F32 => Ok(&self.k.kv_f32),
            KvDtype::F16 => self.k.kv_f16.as_ref().ok_or_else(|| {
                ModelError::Device("this kernel source has no kernels for f16 K/V".into())
            }),
            other => Err(ModelError::Device(format!(
                "K/V on the device is stored as f32 or f16, not {other}"
            ))),
        }
    }

    /// The device's name as the driver reports it.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn upload<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        host: &[T],
    ) -> Result<CudaSlice<T>> {
        if host.is_empty() {
            return self.zeros(1);
        }
        let _host = self.host_ops();
        self.stream
            .memcpy_stod(host)
            .map_err(|e| device_error("copy to the device", e))
    }

    pub(crate) fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<CudaSlice<T>> {
        let _host = self.host_ops();
        self.stream
            .alloc_zeros(len.max(1))
            .map_err(|e| device_error("allocate device memory", e))
    }

    /// Copies `host` into `dst` from element `at`.
    pub(crate) fn write<T: DeviceRepr>(
        &self,
        host: &[T],
        dst: &mut CudaSlice<T>,
        at: usize,
    ) -> Result<()> {
        if host.is_empty() {
            return Ok(());
        }
        let mut view = dst.slice_mut(at..at + host.len());
        let _host = self.host_ops();
        self.stream
            .memcpy_htod(host, &mut view)
            .map_err(|e| device_error("copy to the device", e))
    }

    /// Copies `host` into `dst` from byte `at` through pinned staging (`staging.rs`): in
    /// stream order, asynchronously, `host` free for reuse on return.
    pub(crate) fn write_staged(
        &self,
        host: &[u8],
        dst: &mut CudaSlice<u8>,
        at: usize,
    ) -> Result<()> {
        if host.is_empty() {
            return Ok(());
        }
        if at + host.len() > dst.len() {
            return Err(ModelError::Device(format!(
                "a copy of {} bytes at {at} into {} bytes",
                host.len(),
                dst.len()
            )));
        }
        let base = self.address(dst);
        let mut staging = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        if staging.is_none() {
            *staging = Some(Staging::new(self.stream.context())?);
        }
        let staging = staging.as_mut().expect("just made");
        staging.send(&self.stream, host, base + at as u64, &self.host_ops)
    }

    /// `count` page-locked host buffers of at least `bytes` bytes each, for
    /// [`CudaDevice::write_lent`] (`lent.rs`).
    pub(crate) fn lend_host(&self, count: usize, bytes: usize) -> Result<Vec<Lent>> {
        self.lent.lend(count, bytes)
    }

    /// Copies bytes `range` of `buf` into `dst` from byte `at`: in stream order,
    /// asynchronously, straight from the page-locked buffer (whose refill waits for it).
    pub(crate) fn write_lent(
        &self,
        buf: &mut Lent,
        range: std::ops::Range<usize>,
        dst: &mut CudaSlice<u8>,
        at: usize,
    ) -> Result<()> {
        if at + range.len() > dst.len() {
            return Err(ModelError::Device(format!(
                "a copy of {} bytes at {at} into {} bytes",
                range.len(),
                dst.len()
            )));
        }
        let base = self.address(dst);
        buf.send(&self.stream, range, base + at as u64, &self.host_ops)
    }

    /// Copies elements `at..at + host.len()` of `src` into `host` (waits for the stream).
    pub(crate) fn read<T: DeviceRepr>(
        &self,
        src: &CudaSlice<T>,
        at: usize,
        host: &mut [T],
    ) -> Result<()> {
        if host.is_empty() {
            return Ok(());
        }
        let view = src.slice(at..at + host.len());
        let _host = self.host_ops();
        self.stream
            .memcpy_dtoh(&view, host)
            .map_err(|e| device_error("copy from the device", e))?;
        // A copy into pageable memory blocks on today's drivers, but CUDA does not promise
        // it: wait, so `host` is never read early (nearly free when the copy blocked).
        self.sync()
    }

    /// The device address of `slice`'s first element.
    pub(crate) fn address<T>(&self, slice: &CudaSlice<T>) -> u64 {
        let (ptr, _sync) = slice.device_ptr(&self.stream);
        ptr
    }

    /// Copies the first `len` elements of `src` into `dst`.
    pub(crate) fn copy<T: DeviceRepr>(
        &self,
        src: &CudaSlice<T>,
        dst: &mut CudaSlice<T>,
        len: usize,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let view = src.slice(..len);
        let mut out = dst.slice_mut(..len);
        let _host = self.host_ops();
        self.stream
            .memcpy_dtod(&view, &mut out)
            .map_err(|e| device_error("copy on the device", e))
    }

    /// Rows of `table` (its only part, in its file's format) for the tokens in
    /// `meta[2..2 + n]`.
    pub(crate) fn embed(
        &self,
        meta: &CudaSlice<u32>,
        table: &DeviceMatrix,
        out: &mut CudaSlice<f32>,
        n: usize,
    ) -> Result<()> {
        let [part] = table.parts.as_slice() else {
            return Err(ModelError::Device(
                "an embedding table must be one matrix in one format".into(),
            ));
        };
        let (fmt, row_bytes, h) = (part.code as i32, part.row_bytes as i64, table.cols as i32);
        let mut b = self.stream.launch_builder(&self.k.embed);
        b.arg(meta)
            .arg(&part.blocks)
            .arg(&fmt)
            .arg(&row_bytes)
            .arg(out)
            .arg(&h);
        // SAFETY: `meta` holds n tokens below the table's rows; `out` holds n rows of h (a
        // multiple of 32, checked at upload).
        unsafe { b.launch(rows(n, ROW_THREADS, 0)) }
            .map(drop)
            .map_err(|e| device_error("embed", e))
    }

    pub(crate) fn rms_norm(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        n: usize,
        d: usize,
        eps: f32,
    ) -> Result<()> {
        self.rms_norm_rows(x, 0, w, out, n, d, eps)
    }

    /// RMSNorm of rows `first..first + n` of `x` into rows `0..n` of `out`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rms_norm_rows(
        &self,
        x: &CudaSlice<f32>,
        first: usize,
        w: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        n: usize,
        d: usize,
        eps: f32,
    ) -> Result<()> {
        let rows_in = x.slice(first * d..(first + n) * d);
        let di = d as i32;
        let mut b = self.stream.launch_builder(&self.k.rms_norm);
        b.arg(&rows_in).arg(w).arg(out).arg(&di).arg(&eps);
        // SAFETY: the view and out hold n rows of d; w holds d.
        unsafe { b.launch(rows(n, ROW_THREADS, 0)) }
            .map(drop)
            .map_err(|e| device_error("rms_norm", e))
    }

    /// `y = x Wᵀ (+ bias) (+ y when accumulating)` for `n` rows: one launch per part of
    /// `w` (by its format's kernel), each writing its own columns of `y`. A lone row (a
    /// decode step) goes to `matvec1`, which computes the same bits, unless its x does not
    /// fit the device's shared memory.
    pub(crate) fn matvec(
        &self,
        w: &DeviceMatrix,
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        self.matvec_from(w, x, None, y, n, accumulate)
    }

    /// [`Self::matvec`], with x's row also as rounded by the kernel that wrote it, where
    /// the product reads x rounded (`rq`, from [`Self::rms_norm_rounding`] or
    /// [`Self::silu_mul_rounding`]; else it is rounded here first).
    pub(crate) fn matvec_from(
        &self,
        w: &DeviceMatrix,
        x: &CudaSlice<f32>,
        rq: Option<&CudaSlice<u8>>,
        y: &mut CudaSlice<f32>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        let (ni, inn, stride) = (n as i32, w.cols as i32, w.rows as i32);
        let acc = i32::from(accumulate);
        // An absent bias is a null pointer (as qkv_post's absent norms are).
        let bias = w.bias.as_ref().map_or(0, |b| self.address(b));
        // A lone row goes to `matvec1` (the same bits) where its x fits in shared memory.
        let decode_shared = w.cols / 32 * MATVEC1_XSTRIDE * 4;
        let decode = n == 1 && decode_shared <= self.k.shared_limit && !self.k.matvec1.is_empty();
        let q8 = self
            .k
            .q8
            .as_ref()
            .filter(|_| w.activations == Activations::Q8);
        // The tensor-core kernels (and a decode step's) read x rounded once for all the
        // product's parts.
        let rounded = match (q8, rq) {
            (Some(q8), Some(rq)) if n == 1 && q8.reads_rounded(n, w.cols) => {
                Some(RoundedX::given(rq, &self.stream))
            }
            (Some(q8), _) if q8.reads_rounded(n, w.cols) => {
                Some(q8.round(&self.stream, &|len| self.zeros(len), x, n, w.cols)?)
            }
            _ => None,
        };
        let mut y_off = 0i32;
        for part in &w.parts {
            let (row_bytes, rows_out) = (part.row_bytes as i64, part.rows);
            let ri = rows_out as i32;
            // With 8-bit activations, a part of a format the 8-bit kernels take goes to them
            // at every row count (so a row's result still does not depend on it).
            let q8 =
                q8.and_then(|q8| q8.launch(part.code, rows_out, w.cols, n, self.k.shared_limit));
            let code = part.code as usize;
            // The kernel, its launch, and whether it takes `matvec1`'s shorter arguments
            // (the 8-bit kernels take `matvec_F`'s).
            let (func, cfg, name, short) = match q8 {
                Some((func, cfg, _)) => (func, cfg, "matvecq", false),
                None if decode => {
                    let LaunchShape { outs, warps, .. } = self.k.shape;
                    let cfg = LaunchConfig {
                        grid_dim: ((rows_out as u32).div_ceil(warps * outs), 1, 1),
                        block_dim: (32 * warps, 1, 1),
                        shared_mem_bytes: decode_shared as u32,
                    };
                    (&self.k.matvec1[code], cfg, "matvec1", true)
                }
                None => {
                    let cfg = LaunchConfig {
                        grid_dim: (
                            (rows_out as u32).div_ceil(MATVEC_WARPS * MATVEC_OUTS),
                            n.div_ceil(MATVEC_ROWS) as u32,
                            1,
                        ),
                        block_dim: (32 * MATVEC_WARPS, 1, 1),
                        shared_mem_bytes: 0,
                    };
                    (&self.k.matvec[code], cfg, "matvec", false)
                }
            };
            let mut b = self.stream.launch_builder(func);
            b.arg(&part.blocks).arg(&row_bytes);
            match (&rounded, q8) {
                (Some(r), Some((_, _, true))) => b.arg(&r.address),
                _ => b.arg(x),
            };
            b.arg(&bias).arg(&mut *y);
            if short {
                b.arg(&inn).arg(&ri).arg(&y_off).arg(&acc);
            } else {
                b.arg(&ni)
                    .arg(&inn)
                    .arg(&ri)
                    .arg(&stride)
                    .arg(&y_off)
                    .arg(&acc);
            }
            // SAFETY: the part holds rows_out rows of row_bytes bytes of `cols` values (a
            // multiple of 32, checked at upload) in its code's format; x holds n × cols (for
            // a tensor-core kernel, their rounding: `Q8Kernels::round`), y n × w.rows; bias
            // w.rows when present. A `matvec1` block's shared memory holds
            // x's chunks at MATVEC1_XSTRIDE floats each, and an 8-bit block's is sized by
            // `Q8Kernels::launch`, both within the limit set at load.
            unsafe { b.launch(cfg) }
                .map(drop)
                .map_err(|e| device_error(name, e))?;
            y_off += ri;
        }
        Ok(())
    }

    pub(crate) fn silu_mul(
        &self,
        gate_up: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        n: usize,
        width: usize,
    ) -> Result<()> {
        let total = n * width;
        let (w, t) = (width as i32, total as i32);
        let mut b = self.stream.launch_builder(&self.k.silu_mul);
        b.arg(gate_up).arg(out).arg(&w).arg(&t);
        let cfg = LaunchConfig {
            grid_dim: ((total as u32).div_ceil(256), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: gate_up holds n × 2·width, out n × width.
        unsafe { b.launch(cfg) }
            .map(drop)
            .map_err(|e| device_error("silu_mul", e))
    }

    /// Waits for everything queued so far.
    pub(crate) fn sync(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| device_error("synchronize", e))
    }

    /// Splits QKV rows, rotates Q and K at positions `meta[0] + r`, writes K and V into
    /// the cache rows of `layer` named by `kv` (device addresses, see the source), stored
    /// as `kv_dtype`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn qkv_post(
        &self,
        qkv: &CudaSlice<f32>,
        q_out: &mut CudaSlice<f32>,
        kv: &CudaSlice<u64>,
        kv_dtype: KvDtype,
        layer: usize,
        rope: &DeviceRope,
        heads: (usize, usize, usize),
        n: usize,
        meta: &CudaSlice<u32>,
        qk_norm: Option<&(CudaSlice<f32>, CudaSlice<f32>)>,
        eps: f32,
    ) -> Result<()> {
        let (qh, kvh, hd) = (heads.0 as i32, heads.1 as i32, heads.2 as i32);
        let (li, inter) = (layer as i32, i32::from(rope.interleaved));
        let (qn, kn) = match qk_norm {
            Some((q, k)) => (self.address(q), self.address(k)),
            None => (0u64, 0u64),
        };
        let mut b = self
            .stream
            .launch_builder(&self.kv_kernels(kv_dtype)?.qkv_post);
        b.arg(qkv)
            .arg(q_out)
            .arg(kv)
            .arg(&li)
            .arg(&rope.cos)
            .arg(&rope.sin)
            .arg(&qh)
            .arg(&kvh)
            .arg(&hd)
            .arg(meta)
            .arg(&inter)
            .arg(&qn)
            .arg(&kn)
            .arg(&eps);
        // SAFETY: the caches hold at least pos0 + n rows; the tables cover pos0 + n; the
        // norms (when given) hold head_dim values each, and heads are at most 256.
        unsafe { b.launch(rows(n, QKV_THREADS, 0)) }
            .map(drop)
            .map_err(|e| device_error("qkv_post", e))
    }
}

fn rows(n: usize, threads: u32, shared: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: shared,
    }
}

/// The buffers attention's parts meet in: their sums, and per (row, head) of a launch how
/// many parts have finished.
pub(crate) struct AttendParts {
    values: CudaSlice<f32>,
    done: CudaSlice<i32>,
}

impl AttendParts {
    /// For launches of up to `rows` query rows (at most [`ATTEND_ROWS`] at a time) of
    /// `heads` over contexts of up to `max_len` positions.
    pub(crate) fn new(
        dev: &CudaDevice,
        rows: usize,
        heads: (usize, usize, usize),
        max_len: usize,
    ) -> Result<Self> {
        let (qh, _, hd) = heads;
        let rows = rows.min(ATTEND_ROWS);
        Ok(AttendParts {
            values: dev.zeros(rows * qh * max_len.div_ceil(ATTEND_KEYS) * (hd + 2))?,
            done: dev.zeros(rows * qh)?,
        })
    }
}

impl Upload for CudaDevice {
    fn upload_bytes(&self, bytes: &[u8]) -> Result<CudaSlice<u8>> {
        self.upload(bytes)
    }

    fn upload_values(&self, values: &[f32]) -> Result<CudaSlice<f32>> {
        self.upload(values)
    }
}

/// RoPE tables on the device.
pub(crate) struct DeviceRope {
    pub(crate) cos: CudaSlice<f32>,
    pub(crate) sin: CudaSlice<f32>,
    pub(crate) interleaved: bool,
}
