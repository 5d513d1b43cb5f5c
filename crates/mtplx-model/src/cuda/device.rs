//! One CUDA device: its context, the stream everything runs on, and the compiled kernels.

use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    LaunchConfig, PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

use crate::error::{ModelError, Result};

const SOURCE: &str = include_str!("kernels.cu");

/// Threads of a row-wise block (norms, embedding, QKV split).
const ROW_THREADS: u32 = 256;
/// Warps of a matvec block (one output each).
const MATVEC_WARPS: u32 = 8;
/// Rows a matvec block computes per pass over its weights (`ROWS` in the source).
const MATVEC_ROWS: usize = 8;
/// Threads of an attention block.
const ATTEND_THREADS: u32 = 128;
/// Dynamic shared memory an attention block may use without opting in.
const MAX_SHARED_BYTES: usize = 48 * 1024;

/// Compiles the kernels for `arch` (`compute_90`) with NVRTC: needs the NVRTC library, not
/// a device. Returns the PTX.
pub fn compile(arch: &'static str) -> Result<String> {
    let ptx = std::panic::catch_unwind(|| {
        compile_ptx_with_opts(
            SOURCE,
            CompileOptions {
                fmad: Some(false),
                arch: Some(arch),
                ..Default::default()
            },
        )
    })
    .map_err(|_| ModelError::Device("the NVRTC library is not installed".into()))?
    .map_err(|e| ModelError::Device(format!("compile the kernels: {e:?}")))?;
    Ok(ptx.to_src())
}

pub(crate) fn device_error(what: &str, e: impl std::fmt::Display) -> ModelError {
    ModelError::Device(format!("{what}: {e}"))
}

struct Kernels {
    embed: CudaFunction,
    rms_norm: CudaFunction,
    matvec: CudaFunction,
    qkv_post: CudaFunction,
    attend: CudaFunction,
    silu_mul: CudaFunction,
}

/// A CUDA device with the backend's kernels loaded. Every launch and copy goes to one
/// stream, in order; copies to the host wait for what came before them.
pub struct CudaDevice {
    ordinal: usize,
    name: String,
    stream: Arc<CudaStream>,
    k: Kernels,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaDevice(cuda:{}, {})", self.ordinal, self.name)
    }
}

impl CudaDevice {
    /// Opens device `ordinal` and compiles the kernels for it (NVRTC, well under a second).
    /// Fails with [`ModelError::Device`] where the driver or NVRTC library is missing or
    /// there is no such device.
    pub fn open(ordinal: usize) -> Result<Arc<CudaDevice>> {
        // The driver library is loaded on first use and panics if it is absent.
        let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal))
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
        let ptx = Ptx::from_src(compile(arch)?);
        let module = ctx
            .load_module(ptx)
            .map_err(|e| device_error("load the kernels", e))?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| device_error(&format!("kernel {name}"), e))
        };
        let k = Kernels {
            embed: f("embed")?,
            rms_norm: f("rms_norm")?,
            matvec: f("matvec")?,
            qkv_post: f("qkv_post")?,
            attend: f("attend")?,
            silu_mul: f("silu_mul")?,
        };
        // A stream of its own: the legacy default stream cannot be captured into a graph.
        let stream = ctx
            .new_stream()
            .map_err(|e| device_error("create a stream", e))?;
        Ok(Arc::new(CudaDevice {
            ordinal,
            name,
            stream,
            k,
        }))
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
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
        self.stream
            .memcpy_stod(host)
            .map_err(|e| device_error("copy to the device", e))
    }

    pub(crate) fn zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<CudaSlice<T>> {
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
        self.stream
            .memcpy_htod(host, &mut view)
            .map_err(|e| device_error("copy to the device", e))
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
        self.stream
            .memcpy_dtod(&view, &mut out)
            .map_err(|e| device_error("copy on the device", e))
    }

    /// Rows of `table` for the tokens in `meta[2..2 + n]`.
    pub(crate) fn embed(
        &self,
        meta: &CudaSlice<u32>,
        table: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        n: usize,
        h: usize,
    ) -> Result<()> {
        let h = h as i32;
        let mut b = self.stream.launch_builder(&self.k.embed);
        b.arg(meta).arg(table).arg(out).arg(&h);
        // SAFETY: `meta` holds n tokens below the table's rows; `out` holds n rows of h.
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

    /// `y = x Wᵀ (+ bias) (+ y when accumulating)` for `n` rows.
    pub(crate) fn matvec(
        &self,
        w: &DeviceMatrix,
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        self.matvec_raw(&w.w, w.bias.as_ref(), w.rows, w.cols, x, y, n, accumulate)
    }

    /// [`CudaDevice::matvec`] over a bare `[rows, cols]` weight (`cols` a multiple of 4).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matvec_raw(
        &self,
        w: &CudaSlice<f32>,
        bias: Option<&CudaSlice<f32>>,
        rows_out: usize,
        cols: usize,
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        debug_assert_eq!(cols % 4, 0);
        let (ni, inn, out) = (n as i32, cols as i32, rows_out as i32);
        let has_bias = i32::from(bias.is_some());
        let acc = i32::from(accumulate);
        let bias = bias.unwrap_or(w);
        let mut b = self.stream.launch_builder(&self.k.matvec);
        b.arg(w)
            .arg(x)
            .arg(bias)
            .arg(y)
            .arg(&ni)
            .arg(&inn)
            .arg(&out)
            .arg(&has_bias)
            .arg(&acc);
        let cfg = LaunchConfig {
            grid_dim: (
                (rows_out as u32).div_ceil(MATVEC_WARPS),
                n.div_ceil(MATVEC_ROWS) as u32,
                1,
            ),
            block_dim: (32 * MATVEC_WARPS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: W is rows × cols (cols a multiple of 4, checked at upload), x n × cols,
        // y n × rows, bias rows when present.
        unsafe { b.launch(cfg) }
            .map(drop)
            .map_err(|e| device_error("matvec", e))
    }

    /// Waits for everything queued so far.
    pub(crate) fn sync(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| device_error("synchronize", e))
    }

    /// Splits QKV rows, rotates Q and K at positions `meta[0] + r`, writes K and V into
    /// the cache rows of `layer` named by `kv` (device addresses, see the source).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn qkv_post(
        &self,
        qkv: &CudaSlice<f32>,
        q_out: &mut CudaSlice<f32>,
        kv: &CudaSlice<u64>,
        layer: usize,
        rope: &DeviceRope,
        heads: (usize, usize, usize),
        n: usize,
        meta: &CudaSlice<u32>,
    ) -> Result<()> {
        let (qh, kvh, hd) = (heads.0 as i32, heads.1 as i32, heads.2 as i32);
        let (li, inter) = (layer as i32, i32::from(rope.interleaved));
        let mut b = self.stream.launch_builder(&self.k.qkv_post);
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
            .arg(&inter);
        // SAFETY: the caches hold at least pos0 + n rows; the tables cover pos0 + n.
        unsafe { b.launch(rows(n, ROW_THREADS, 0)) }
            .map(drop)
            .map_err(|e| device_error("qkv_post", e))
    }

    /// Shared memory an attention block needs for contexts of up to `max_len` positions,
    /// or an error past what a block may use.
    pub(crate) fn attend_shared_bytes(head_dim: usize, max_len: usize) -> Result<u32> {
        let warps = (ATTEND_THREADS / 32) as usize;
        let shared = (32 + head_dim + warps * head_dim + max_len) * 4;
        if shared > MAX_SHARED_BYTES {
            return Err(ModelError::Device(format!(
                "attention over {max_len} positions needs {shared} bytes of shared memory; the \
                 CUDA backend supports up to {MAX_SHARED_BYTES}"
            )));
        }
        Ok(shared as u32)
    }

    /// Largest context [`CudaDevice::attend_shared_bytes`] allows.
    pub(crate) fn max_attend_len(head_dim: usize) -> usize {
        let warps = (ATTEND_THREADS / 32) as usize;
        MAX_SHARED_BYTES / 4 - (32 + head_dim + warps * head_dim)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attend(
        &self,
        q: &CudaSlice<f32>,
        kv: &CudaSlice<u64>,
        layer: usize,
        out: &mut CudaSlice<f32>,
        heads: (usize, usize, usize),
        n: usize,
        meta: &CudaSlice<u32>,
        scale: f32,
        shared: u32,
    ) -> Result<()> {
        let (qh, kvh, hd) = heads;
        let (qhi, kvhi, hdi, li) = (qh as i32, kvh as i32, hd as i32, layer as i32);
        let mut b = self.stream.launch_builder(&self.k.attend);
        b.arg(q)
            .arg(kv)
            .arg(&li)
            .arg(out)
            .arg(&qhi)
            .arg(&kvhi)
            .arg(&hdi)
            .arg(meta)
            .arg(&scale);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, qh as u32, 1),
            block_dim: (ATTEND_THREADS, 1, 1),
            shared_mem_bytes: shared,
        };
        // SAFETY: q and out hold n × qh × hd; the caches hold pos0 + n rows of kvh × hd;
        // `shared` covers pos0 + n positions.
        unsafe { b.launch(cfg) }
            .map(drop)
            .map_err(|e| device_error("attend", e))
    }

    /// Records the launches `body` queues (and nothing else: no copies, no waits) as a
    /// graph that replays them with one call.
    ///
    /// The stream must not be used from another thread meanwhile (whatever it queued would
    /// be recorded too): see [`CudaModel`](super::CudaModel)'s threading rule.
    pub(crate) fn capture(&self, body: impl FnOnce() -> Result<()>) -> Result<CudaGraph> {
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| device_error("begin a graph capture", e))?;
        // End the capture even if `body` panics, or the stream stays unusable.
        let queued = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
        let graph = self
            .stream
            .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
        let queued = queued.unwrap_or_else(|p| std::panic::resume_unwind(p));
        queued?;
        graph
            .map_err(|e| device_error("instantiate a graph", e))?
            .ok_or_else(|| ModelError::Device("the graph capture recorded nothing".into()))
    }

    pub(crate) fn replay(&self, graph: &CudaGraph) -> Result<()> {
        graph
            .launch()
            .map_err(|e| device_error("launch a graph", e))
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
}

fn rows(n: usize, threads: u32, shared: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: shared,
    }
}

/// A weight matrix on the device, row-major `[rows, cols]` `f32`, with its bias.
pub(crate) struct DeviceMatrix {
    pub(crate) w: CudaSlice<f32>,
    pub(crate) bias: Option<CudaSlice<f32>>,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
}

impl DeviceMatrix {
    pub(crate) fn upload(
        dev: &CudaDevice,
        w: &[f32],
        bias: Option<&[f32]>,
        rows: usize,
        cols: usize,
    ) -> Result<Self> {
        if !cols.is_multiple_of(4) {
            return Err(ModelError::Device(format!(
                "a {rows} × {cols} weight: the CUDA backend needs a width that is a multiple of 4"
            )));
        }
        if w.len() != rows * cols {
            return Err(ModelError::Device(format!(
                "a {rows} × {cols} weight given {} values",
                w.len()
            )));
        }
        Ok(DeviceMatrix {
            w: dev.upload(w)?,
            bias: bias.map(|b| dev.upload(b)).transpose()?,
            rows,
            cols,
        })
    }
}

/// RoPE tables on the device.
pub(crate) struct DeviceRope {
    pub(crate) cos: CudaSlice<f32>,
    pub(crate) sin: CudaSlice<f32>,
    pub(crate) interleaved: bool,
}
