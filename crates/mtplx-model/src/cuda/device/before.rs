//! A decode step's products that make their own x from the row before them: the RMSNorm
//! (`matvec1n_F`) or the `silu_mul` (`matvec1s_F`) computed in each block of the product,
//! so a small model's layer is six launches, not nine (the default model's step is about
//! 300 kernels of a few microseconds, each mostly waiting on memory; with these, 5-6% less
//! time a step on an H100: docs/bench/h200.md). Every block computes the
//! same floats as the kernel it replaces (`rms_norm` of `ROW_THREADS` threads, `silu_mul`),
//! so a row's result is the same bits either way; `MTPLX_CUDA_DECODE_FUSED=0` launches
//! them apart (to time one against the other in one binary).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::{device_error, CudaDevice, MATVEC1_XSTRIDE, ROW_THREADS};
use crate::cuda::matrix::DeviceMatrix;
use crate::error::Result;
use crate::kernels::Activations;

/// Widest x a fused product makes in each block: every block reads the whole row before it
/// (and, for the norm, its weights), which for a wide row costs more than the launch it
/// saves (a Llama-3-8B's 4,096 wide rows are taken by its 8-bit products anyway).
const FUSED_MAX_COLS: usize = 2048;

/// Bytes of the norm's reduction after x in a `matvec1n_F` block's shared memory.
const NORM_RED_BYTES: usize = 32 * 4;

/// What a fused product makes its x from.
#[derive(Clone, Copy)]
pub(crate) enum Before<'a> {
    /// RMSNorm of the row with these weights and epsilon.
    Norm(&'a CudaSlice<f32>, f32),
    /// `silu_mul` of a `[gate | up]` row twice x's width.
    SiluMul,
}

/// Where [`CudaDevice::matvec_made`] writes a product's x when the product does not make it
/// itself: the row buffer, and its 8-bit rounding for the products that read x so.
pub(crate) struct Room<'a> {
    pub(crate) x: &'a mut CudaSlice<f32>,
    pub(crate) rounded: &'a mut CudaSlice<u8>,
}

impl CudaDevice {
    /// Whether [`Self::matvec_after`] takes `n` rows of a product with `w`: a decode step's
    /// row, its x narrow enough, a product `matvec1_F` computes (not the 8-bit kernels'),
    /// in blocks of at least the norm's `ROW_THREADS` threads.
    pub(crate) fn fuses_before(&self, w: &DeviceMatrix, n: usize) -> bool {
        n == 1
            && self.k.fused.is_some()
            && 32 * self.k.shape.warps >= ROW_THREADS
            && w.activations != Activations::Q8
            && w.cols <= FUSED_MAX_COLS
            && Self::fused_shared(w.cols) <= self.k.shared_limit
    }

    /// Dynamic shared memory of a fused block over x of `cols` values: x's chunks as
    /// `matvec1_F` holds them, then the norm's reduction.
    fn fused_shared(cols: usize) -> usize {
        cols / 32 * MATVEC1_XSTRIDE * 4 + NORM_RED_BYTES
    }

    /// `y = before(x) Wᵀ (+ y when accumulating)` for `n` rows, `before(x)` of `w.cols`
    /// values a row: inside the product where [`Self::fuses_before`] says so
    /// ([`Self::matvec_after`]), else written into `room.x` first (with its 8-bit rounding
    /// into `room.rounded` where the product reads x rounded) and the product run on it.
    /// The same bits either way.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matvec_made(
        &self,
        w: &DeviceMatrix,
        before: Before,
        x: &CudaSlice<f32>,
        room: Room,
        y: &mut CudaSlice<f32>,
        n: usize,
        accumulate: bool,
    ) -> Result<()> {
        if self.fuses_before(w, n) {
            return self.matvec_after(w, before, x, y, accumulate);
        }
        let Room { x: made, rounded } = room;
        let rounds = n == 1 && self.rounds_row_for(w);
        let rq = rounds.then_some(&mut *rounded);
        match before {
            Before::Norm(nw, eps) => self.rms_norm_rounding(x, nw, made, n, w.cols, eps, rq)?,
            Before::SiluMul => self.silu_mul_rounding(x, made, n, w.cols, rq)?,
        }
        self.matvec_from(w, made, rounds.then_some(&*rounded), y, n, accumulate)
    }

    /// `y = before(x) Wᵀ (+ bias) (+ y when accumulating)` for one row, each part of `w` by
    /// its format's fused kernel: the bits of [`Self::rms_norm`] (or [`Self::silu_mul`])
    /// then [`Self::matvec`]. Only where [`Self::fuses_before`] says so.
    pub(crate) fn matvec_after(
        &self,
        w: &DeviceMatrix,
        before: Before,
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        accumulate: bool,
    ) -> Result<()> {
        assert!(self.fuses_before(w, 1), "a product fuses_before takes");
        let fused = self.k.fused.as_ref().expect("fuses_before said so");
        let (inn, acc) = (w.cols as i32, i32::from(accumulate));
        let bias = w.bias.as_ref().map_or(0, |b| self.address(b));
        let shared = Self::fused_shared(w.cols) as u32;
        let mut y_off = 0i32;
        for part in &w.parts {
            let (row_bytes, rows_out) = (part.row_bytes as i64, part.rows as i32);
            let code = part.code as usize;
            let (func, name) = match before {
                Before::Norm(..) => (&fused.norm[code], "matvec1n"),
                Before::SiluMul => (&fused.silu[code], "matvec1s"),
            };
            let mut b = self.stream.launch_builder(func);
            b.arg(&part.blocks)
                .arg(&row_bytes)
                .arg(x)
                .arg(&bias)
                .arg(&mut *y)
                .arg(&inn)
                .arg(&rows_out)
                .arg(&y_off)
                .arg(&acc);
            if let Before::Norm(nw, eps) = &before {
                b.arg(*nw).arg(eps);
            }
            let cfg = LaunchConfig {
                grid_dim: (
                    (part.rows as u32).div_ceil(self.k.shape.warps * self.k.shape.outs),
                    1,
                    1,
                ),
                block_dim: (32 * self.k.shape.warps, 1, 1),
                shared_mem_bytes: shared,
            };
            // SAFETY: as for `matvec1_F` in `matvec_from`: the part holds rows_out rows of
            // row_bytes bytes of `cols` values (a multiple of 32) in its code's format; y
            // holds w.rows, bias w.rows when present. x holds a row of `cols` values (the
            // norm's weights too), or of 2 · cols for silu_mul's [gate | up]. The block's
            // shared memory is x's chunks and the norm's 32 floats, within the limit set at
            // load (`fuses_before`).
            unsafe { b.launch(cfg) }
                .map(drop)
                .map_err(|e| device_error(name, e))?;
            y_off += rows_out;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Before;
    use crate::cuda::matrix::DeviceMatrix;
    use crate::cuda::switches::switched_on;
    use crate::cuda::tests::{device, random_blocks, Rng};
    use crate::kernels::QuantFormat;
    use crate::weights::{FileData, FilePart};

    /// A decode step's fused products are the bits of the norm (or `silu_mul`) launched
    /// apart and then the product, accumulating or not: every format, rows of 576 values
    /// (the default model's width: 18 chunks, a warp's last step partial) and 1,536 (its
    /// FFN's), a matrix of two parts in two formats with a bias (the QKV of a Qwen2 file),
    /// a norm's weights with a run of zeros.
    #[test]
    fn fused_products_are_the_bits_of_the_launches_they_replace() {
        let Some(dev) = device() else { return };
        let mut rng = Rng(41);
        let read = |x: &cudarc::driver::CudaSlice<f32>, len: usize| {
            let mut v = vec![0f32; len];
            dev.read(x, 0, &mut v).unwrap();
            v
        };
        // (parts: format and rows, width, biased)
        type Shape = (Vec<(QuantFormat, usize)>, usize, bool);
        let mut shapes: Vec<Shape> = Vec::new();
        for format in QuantFormat::ALL {
            for cols in [576, 1536] {
                if cols % format.block_len() == 0 {
                    shapes.push((vec![(format, 70)], cols, false));
                }
            }
        }
        shapes.push((
            vec![(QuantFormat::Q4_1, 40), (QuantFormat::Q8_0, 24)],
            576,
            true,
        ));
        for (formats, cols, biased) in shapes {
            let parts = formats
                .iter()
                .map(|&(format, rows)| FilePart {
                    rows,
                    cols,
                    data: FileData::Blocks {
                        format,
                        bytes: random_blocks(format, rows, cols, &mut rng),
                    },
                })
                .collect();
            let rows: usize = formats.iter().map(|f| f.1).sum();
            let bias: Vec<f32> = (0..rows).map(|_| rng.unit()).collect();
            let m = DeviceMatrix::from_parts(&*dev, parts, biased.then_some(&bias[..])).unwrap();
            let what = format!("{formats:?} {cols} wide");
            assert_eq!(
                dev.fuses_before(&m, 1),
                switched_on("MTPLX_CUDA_DECODE_FUSED")
            );
            if !dev.fuses_before(&m, 1) {
                continue;
            }
            assert!(
                !dev.fuses_before(&m, 2),
                "{what}: two rows are not a decode step"
            );
            let x: Vec<f32> = (0..cols).map(|_| 3.0 * rng.unit()).collect();
            let mut w: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
            w[64..96].fill(0.0);
            let gu: Vec<f32> = (0..2 * cols).map(|_| 4.0 * rng.unit()).collect();
            let y0: Vec<f32> = (0..rows).map(|_| rng.unit()).collect();
            let (xd, wd, gud) = (
                dev.upload(&x).unwrap(),
                dev.upload(&w).unwrap(),
                dev.upload(&gu).unwrap(),
            );
            let mut mid = dev.zeros::<f32>(cols).unwrap();
            for accumulate in [false, true] {
                // Apart: the norm, then the product.
                let mut apart = dev.upload(&y0).unwrap();
                dev.rms_norm(&xd, &wd, &mut mid, 1, cols, 1e-5).unwrap();
                dev.matvec(&m, &mid, &mut apart, 1, accumulate).unwrap();
                let mut fused = dev.upload(&y0).unwrap();
                let before = Before::Norm(&wd, 1e-5);
                dev.matvec_after(&m, before, &xd, &mut fused, accumulate)
                    .unwrap();
                let (a, b) = (read(&apart, rows), read(&fused, rows));
                for (o, (a, b)) in a.iter().zip(&b).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "{what} norm, out {o}: {a} vs {b}");
                }
                // Apart: silu_mul, then the product.
                let mut apart = dev.upload(&y0).unwrap();
                dev.silu_mul(&gud, &mut mid, 1, cols).unwrap();
                dev.matvec(&m, &mid, &mut apart, 1, accumulate).unwrap();
                let mut fused = dev.upload(&y0).unwrap();
                dev.matvec_after(&m, Before::SiluMul, &gud, &mut fused, accumulate)
                    .unwrap();
                let (a, b) = (read(&apart, rows), read(&fused, rows));
                for (o, (a, b)) in a.iter().zip(&b).enumerate() {
                    assert_eq!(
                        a.to_bits(),
                        b.to_bits(),
                        "{what} silu_mul, out {o}: {a} vs {b}"
                    );
                }
            }
        }
    }
}
