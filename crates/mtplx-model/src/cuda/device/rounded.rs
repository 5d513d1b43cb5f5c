//! A decode step's row rounded to 8 bits by the kernel that writes it (`rms_norm_q8`,
//! `silu_mul_q8`), for the 8-bit products after it that read x rounded: no rounding launch
//! of their own.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::{device_error, rows, CudaDevice, ROW_THREADS};
use crate::cuda::matrix::DeviceMatrix;
use crate::cuda::q8::rounded_bytes;
use crate::error::Result;
use crate::kernels::Activations;

impl CudaDevice {
    /// Whether a decode step's product with `w` reads its row of x rounded by the kernel
    /// that wrote it ([`Self::rms_norm_rounding`], [`Self::silu_mul_rounding`]; then
    /// [`Self::matvec_from`] takes the rounding).
    pub(crate) fn rounds_row_for(&self, w: &DeviceMatrix) -> bool {
        w.activations == Activations::Q8
            && self.has_rounding_writers()
            && self
                .k
                .q8
                .as_ref()
                .is_some_and(|q8| q8.reads_rounded(1, w.cols))
    }

    /// Whether the source has the kernels that round the row they write.
    pub(crate) fn has_rounding_writers(&self) -> bool {
        self.k.rms_norm_q8.is_some() && self.k.silu_mul_q8.is_some()
    }

    /// Makes room for the rounding of a decode step's row of up to `cols` values that a
    /// product does itself (the o projection's, the head's), before any pass is captured
    /// into a graph (a capture can't allocate).
    pub(crate) fn reserve_row_rounding(&self, cols: usize) -> Result<()> {
        match &self.k.q8 {
            Some(q8) => q8.reserve_row(&|len| self.zeros(len), cols),
            None => Ok(()),
        }
    }

    /// Bytes of one row of `cols` values rounded as [`Self::rms_norm_rounding`] leaves it.
    pub(crate) fn rounded_row_bytes(cols: usize) -> usize {
        rounded_bytes(1, cols)
    }

    /// [`Self::rms_norm`] of `n` rows; with `rq` (one row, where [`Self::rounds_row_for`]
    /// says so) the row also rounded into it (`rms_norm_q8`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rms_norm_rounding(
        &self,
        x: &CudaSlice<f32>,
        w: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        n: usize,
        d: usize,
        eps: f32,
        rq: Option<&mut CudaSlice<u8>>,
    ) -> Result<()> {
        let Some(rq) = rq else {
            return self.rms_norm(x, w, out, n, d, eps);
        };
        assert_eq!(n, 1, "a decode step's row");
        let func = self.k.rms_norm_q8.as_ref().expect("rounds_row_for said so");
        assert!(d.is_multiple_of(256) && rq.len() >= Self::rounded_row_bytes(d));
        let di = d as i32;
        let mut b = self.stream.launch_builder(func);
        b.arg(x).arg(w).arg(out).arg(&di).arg(&eps).arg(rq);
        // SAFETY: x and out hold a row of d (at least), w holds d, rq its rounding.
        unsafe { b.launch(rows(1, ROW_THREADS, 0)) }
            .map(drop)
            .map_err(|e| device_error("rms_norm_q8", e))
    }

    /// [`Self::silu_mul`] of `n` rows; with `rq` (one row) also rounded into it
    /// (`silu_mul_q8`).
    pub(crate) fn silu_mul_rounding(
        &self,
        gate_up: &CudaSlice<f32>,
        out: &mut CudaSlice<f32>,
        n: usize,
        width: usize,
        rq: Option<&mut CudaSlice<u8>>,
    ) -> Result<()> {
        let Some(rq) = rq else {
            return self.silu_mul(gate_up, out, n, width);
        };
        assert_eq!(n, 1, "a decode step's row");
        let func = self.k.silu_mul_q8.as_ref().expect("rounds_row_for said so");
        assert!(width.is_multiple_of(256) && rq.len() >= Self::rounded_row_bytes(width));
        let w = width as i32;
        let mut b = self.stream.launch_builder(func);
        b.arg(gate_up).arg(out).arg(&w).arg(rq);
        let cfg = LaunchConfig {
            grid_dim: ((width as u32 / 256).div_ceil(8), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: gate_up holds 2·width, out width, rq its rounding; a warp a block of 256.
        unsafe { b.launch(cfg) }
            .map(drop)
            .map_err(|e| device_error("silu_mul_q8", e))
    }
}
