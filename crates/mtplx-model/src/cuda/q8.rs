//! The products with 8-bit activations on the device (`matvecq_F` and `matvec1q_F` in the
//! source): the CPU's `Activations::Q8` arithmetic (`mtplx_kernels::q8`, what
//! [`WeightFormat::NativeQ8`](crate::WeightFormat::NativeQ8) runs) for Q4_K and Q6_K weights,
//! so that a K-quant file gives the same numbers on either. The weights' integers times
//! the rounded activations are summed exactly (`dp4a`), about a tenth of the instructions a
//! weight takes through the `f32` kernels, which dequantize each value to a float first.
//!
//! The CPU rounds the activations of Q8_0 and Q5_0 products too; here those formats (and
//! every other) keep `f32` activations: the same numbers as the CPU's only for Q4_K and
//! Q6_K, but batch-invariant for every format, as each part takes one path whatever the
//! row count.

use cudarc::driver::{CudaFunction, LaunchConfig};

use super::source::WeightCode;
use crate::error::Result;

/// Bytes of shared memory between two half blocks (128 values) of rounded x (`QHALF`).
pub(super) const QHALF: usize = 144;
/// Outputs a warp computes (`QOUTS`).
pub(super) const QOUTS: u32 = 2;
/// Rows of x a block takes past the decode step's one (`QROWS`).
pub(super) const QROWS: usize = 4;
/// Warps a block (`QWARPS`: the kernels' launch bounds).
pub(super) const QWARPS: u32 = 8;
/// Inputs per block of rounded activations (the K-quants' 256).
const QBLOCK: usize = 256;
/// Rows of x a tensor-core block takes (`MMQ_ROWS`: `mmq_F`, a prefill chunk's products).
pub(super) const MMQ_ROWS: usize = 64;
/// Outputs a tensor-core block computes (`MMQ_OUTS`).
pub(super) const MMQ_OUTS: u32 = 128;
/// Warps a tensor-core block (`MMQ_WARPS`: its launch bounds).
pub(super) const MMQ_WARPS: u32 = 8;
/// From this many rows of x a product goes to the tensor-core kernel (the same bits as
/// `matvecq_F`, so the choice is speed only): a verify block of a few drafted tokens stays
/// on `matvecq_F`, a prefill chunk reads its weights a sixteenth as often.
pub(super) const MMQ_FROM_ROWS: usize = 16;

/// The kernels, by format: Q4_K and Q6_K, for several rows and for one, and on tensor
/// cores for many (`None`: a device before sm_80, whose source leaves them out, or a
/// source without them).
pub(super) struct Q8Kernels {
    rows: [CudaFunction; 2],
    one: [CudaFunction; 2],
    tiles: Option<[CudaFunction; 2]>,
}

impl Q8Kernels {
    /// A kernel every source with the 8-bit kernels has: a source without it (given to
    /// `MTPLX_CUDA_KERNELS`, from before they were written) takes `f32` activations for
    /// every product.
    pub(super) const PROBE: &'static str = "matvecq_8";

    /// The kernels, each loaded by `load` (by name).
    pub(super) fn load(load: impl Fn(&str) -> Result<CudaFunction>) -> Result<Q8Kernels> {
        Ok(Q8Kernels {
            rows: [load("matvecq_8")?, load("matvecq_10")?],
            one: [load("matvec1q_8")?, load("matvec1q_10")?],
            tiles: match (load("mmq_8"), load("mmq_10")) {
                (Ok(q4k), Ok(q6k)) => Some([q4k, q6k]),
                _ => None,
            },
        })
    }

    /// Whether the tensor-core kernels loaded.
    #[cfg(test)]
    pub(super) fn has_tiles(&self) -> bool {
        self.tiles.is_some()
    }

    /// Every kernel (their shared-memory limit is set at load, as `matvec1`'s).
    pub(super) fn all(&self) -> impl Iterator<Item = &CudaFunction> {
        self.rows.iter().chain(&self.one)
    }

    /// The kernel and launch for a part of `code` with `rows` outputs of `cols` inputs,
    /// for `n` rows of x; `None` where the 8-bit path does not take the part (another
    /// format, a width not of whole 256-blocks, more shared memory than `limit`).
    pub(super) fn launch(
        &self,
        code: WeightCode,
        rows: usize,
        cols: usize,
        n: usize,
        limit: usize,
    ) -> Option<(&CudaFunction, LaunchConfig)> {
        let slot = match code {
            WeightCode::Q4K => 0,
            WeightCode::Q6K => 1,
            _ => return None,
        };
        if !cols.is_multiple_of(QBLOCK) {
            return None;
        }
        if let (Some(tiles), true) = (&self.tiles, n >= MMQ_FROM_ROWS) {
            // Its shared memory is static (one block of 256 of its rows at a time).
            let cfg = LaunchConfig {
                grid_dim: (
                    (rows as u32).div_ceil(MMQ_OUTS),
                    n.div_ceil(MMQ_ROWS) as u32,
                    1,
                ),
                block_dim: (32 * MMQ_WARPS, 1, 1),
                shared_mem_bytes: 0,
            };
            return Some((&tiles[slot], cfg));
        }
        let nr = if n == 1 { 1 } else { QROWS };
        let shared = shared_bytes(cols, nr);
        if shared > limit {
            return None;
        }
        let func = if n == 1 {
            &self.one[slot]
        } else {
            &self.rows[slot]
        };
        let cfg = LaunchConfig {
            grid_dim: (
                (rows as u32).div_ceil(QWARPS * QOUTS),
                n.div_ceil(nr) as u32,
                1,
            ),
            block_dim: (32 * QWARPS, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        Some((func, cfg))
    }
}

/// A block's dynamic shared memory: `nr` rows of rounded x (half blocks [`QHALF`] bytes
/// apart), their sums of each 16 values, their scales of each block of 256 (rounded up to
/// four, so the slots after start 16-byte aligned), then 16 four-float slots for each of
/// its warps' `QOUTS · nr` chains.
fn shared_bytes(cols: usize, nr: usize) -> usize {
    nr * (cols / 128 * QHALF + cols / 16 * 4)
        + (nr * (cols / QBLOCK)).next_multiple_of(4) * 4
        + (QWARPS * QOUTS) as usize * nr * 16 * 16
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The widest product of the families served (Llama-3-8B's down projection, 14,336
    /// inputs) fits an H100's 227 KiB a block with a prefill block's rows, and every region
    /// of the layout starts where the kernel's 16-byte accesses need it to.
    #[test]
    fn the_shared_memory_layout_fits_and_is_aligned() {
        for cols in [256, 768, 4096, 17 * 256, 14_336] {
            for nr in [1, QROWS] {
                let x = nr * cols / 128 * QHALF;
                let sums = nr * cols / 16 * 4;
                let scales = (nr * (cols / QBLOCK)).next_multiple_of(4) * 4;
                assert_eq!(x % 16, 0);
                assert_eq!((x + sums) % 16, 0);
                assert_eq!((x + sums + scales) % 16, 0);
                assert!(shared_bytes(cols, nr) > x + sums + scales);
            }
        }
        assert!(shared_bytes(14_336, QROWS) <= 227 * 1024);
    }
}
