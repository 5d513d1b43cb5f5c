//! The products with 8-bit activations on the device (`matvecq_F` and `matvec1q_F` in the
//! source): the CPU's `Activations::Q8` arithmetic (`mtplx_kernels::q8`, what
//! [`WeightFormat::NativeQ8`](crate::WeightFormat::NativeQ8) runs) for Q4_K and Q6_K weights,
//! so that a K-quant file gives the same numbers on either. The weights' integers times
//! the rounded activations are summed exactly (`dp4a`), about a tenth of the instructions a
//! weight takes through the `f32` kernels, which dequantize each value to a float first.
//!
//! The CPU rounds the activations of Q8_0, Q5_0, Q4_0 and Q4_1 products too; here those formats
//! (and every other) keep `f32` activations: the same numbers as the CPU's only for Q4_K and Q6_K,
//! but batch-invariant for every format, as each part takes one path whatever the row count.

use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg};

use super::fault::device_error;
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
/// Bytes between two rows of rounded x in a tensor-core block's stage (`MMQ_XSTRIDE`).
pub(super) const MMQ_XSTRIDE: usize = 272;
/// Bytes a tensor-core block's stage keeps of a Q4_K and of a Q6_K weight block
/// (`MMQ_W4K`, `MMQ_W6K`: Q6_K's 2-byte aligned 210 bytes in the 16-byte pieces around them).
pub(super) const MMQ_WEIGHT_BYTES: [usize; 2] = [144, 240];
/// Bytes of a tensor-core block's stage (`MMQ_STAGE`) before its weights: its rows of
/// rounded x, their sums of each 16 values, their scales.
const MMQ_STAGE_X: usize = MMQ_ROWS * MMQ_XSTRIDE + MMQ_ROWS * 16 * 4 + MMQ_ROWS * 4;
/// Q4_K's decoded sub-block scales and mins a block keeps (`MMQ_SCALES`).
const MMQ_SCALES: usize = MMQ_OUTS as usize * (16 + 8);
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
    /// For one row, reading x rounded beforehand (`matvec1r_F`), unless
    /// `MTPLX_CUDA_DECODE_ROUNDED=0`: then a decode step's products round x in each block
    /// (`one`, the same bits, so one binary times both; see docs/bench/h200.md), as do
    /// those of a source without them.
    one_rounded: Option<[CudaFunction; 2]>,
    tiles: Option<[CudaFunction; 2]>,
    /// `q8_round_rows` and the buffer it rounds into, for the kernels that read x rounded
    /// (`None` where there are none).
    rounding: Option<Rounding>,
}

/// The kernel that rounds x for the kernels that read it rounded, and the buffer it rounds
/// into (grown to the largest product seen; the launches of one product hold it, and a
/// product's launches all go to the device's one stream, so the next rounding waits for
/// the last product to have read it).
struct Rounding {
    round: CudaFunction,
    rounded: Mutex<Option<CudaSlice<u8>>>,
}

impl Rounding {
    /// The buffer, held, grown with `alloc` to at least `bytes`.
    fn holding(
        &self,
        alloc: &dyn Fn(usize) -> Result<CudaSlice<u8>>,
        bytes: usize,
    ) -> Result<MutexGuard<'_, Option<CudaSlice<u8>>>> {
        let mut held = self.rounded.lock().unwrap_or_else(|p| p.into_inner());
        if held.as_ref().is_none_or(|b| b.len() < bytes) {
            *held = Some(alloc(bytes)?);
        }
        Ok(held)
    }
}

/// What a product's parts take as x: the `f32` rows, or (tensor-core and rounded decode
/// kernels) the device address of their rounding, held until the product's launches are
/// queued.
pub(super) struct RoundedX<'a> {
    pub(super) address: u64,
    /// The rounding buffer, where this product's launch rounded x into it (none where the
    /// kernel that wrote x rounded it into the caller's buffer).
    _held: Option<MutexGuard<'a, Option<CudaSlice<u8>>>>,
}

impl RoundedX<'_> {
    /// x as the kernel that wrote it rounded it into `buf` (`rms_norm_q8`, `silu_mul_q8`).
    pub(super) fn given(buf: &CudaSlice<u8>, stream: &Arc<CudaStream>) -> Self {
        RoundedX {
            address: buf.device_ptr(stream).0,
            _held: None,
        }
    }
}

impl Q8Kernels {
    /// A kernel every source with the 8-bit kernels has: a source without it (given to
    /// `MTPLX_CUDA_KERNELS`, from before they were written) takes `f32` activations for
    /// every product.
    pub(super) const PROBE: &'static str = "matvecq_8";

    /// The kernels, each loaded by `load` (by name). The kernels that read x rounded are
    /// taken only with the rounding (a source from before it had `mmq_F` read `f32` x).
    pub(super) fn load(load: impl Fn(&str) -> Result<CudaFunction>) -> Result<Q8Kernels> {
        let rounding = load("q8_round_rows").ok().map(|round| Rounding {
            round,
            rounded: Mutex::new(None),
        });
        let pair = |a: &str, b: &str| match (load(a), load(b)) {
            (Ok(a), Ok(b)) if rounding.is_some() => Some([a, b]),
            _ => None,
        };
        let decode_rounded = super::switches::switched_on("MTPLX_CUDA_DECODE_ROUNDED");
        Ok(Q8Kernels {
            rows: [load("matvecq_8")?, load("matvecq_10")?],
            one: [load("matvec1q_8")?, load("matvec1q_10")?],
            one_rounded: pair("matvec1r_8", "matvec1r_10").filter(|_| decode_rounded),
            tiles: pair("mmq_8", "mmq_10"),
            rounding,
        })
    }

    /// Whether the tensor-core kernels loaded.
    #[cfg(test)]
    pub(super) fn has_tiles(&self) -> bool {
        self.tiles.is_some()
    }

    /// Every kernel with dynamic shared memory (its limit is set at load, as `matvec1`'s).
    pub(super) fn all(&self) -> impl Iterator<Item = &CudaFunction> {
        let tiles = self.tiles.iter().flatten();
        let rounded = self.one_rounded.iter().flatten();
        self.rows
            .iter()
            .chain(&self.one)
            .chain(tiles)
            .chain(rounded)
    }

    /// Whether a product of `n` rows of x goes to the tensor-core kernels (for its parts of
    /// their formats).
    fn takes_tiles(&self, n: usize) -> bool {
        self.tiles.is_some() && n >= MMQ_FROM_ROWS
    }

    /// Whether a product of `n` rows of x, `cols` wide, reads x rounded once for all its
    /// parts ([`Self::round`]): on tensor cores, or a decode step's row.
    pub(super) fn reads_rounded(&self, n: usize, cols: usize) -> bool {
        cols.is_multiple_of(QBLOCK)
            && (self.takes_tiles(n) || (n == 1 && self.one_rounded.is_some()))
    }

    /// Grows the rounding buffer (with `alloc`) to hold one row of `cols` values, so that a
    /// decode step's rounding never allocates: its pass may be recorded into a graph, where
    /// nothing can be (the device's allocation waits for the capture's lock: it hung).
    pub(super) fn reserve_row(
        &self,
        alloc: &dyn Fn(usize) -> Result<CudaSlice<u8>>,
        cols: usize,
    ) -> Result<()> {
        match &self.rounding {
            Some(rounding) => rounding.holding(alloc, rounded_bytes(1, cols)).map(drop),
            None => Ok(()),
        }
    }

    /// Rounds `n` rows of `cols` values of `x` (a multiple of 256) for the kernels that
    /// read x rounded (`q8_round_rows`) on `stream`, into the buffer they read (grown with
    /// `alloc`, the device's allocation).
    pub(super) fn round<'a>(
        &'a self,
        stream: &Arc<CudaStream>,
        alloc: &dyn Fn(usize) -> Result<CudaSlice<u8>>,
        x: &CudaSlice<f32>,
        n: usize,
        cols: usize,
    ) -> Result<RoundedX<'a>> {
        let rounding = self
            .rounding
            .as_ref()
            .expect("rounding only where kernels read x rounded");
        let mut held = rounding.holding(alloc, rounded_bytes(n, cols))?;
        let buf = held.as_mut().expect("just made");
        let (ni, ci) = (n as i32, cols as i32);
        let warps = (n * cols / QBLOCK) as u32;
        let mut b = stream.launch_builder(&rounding.round);
        b.arg(x).arg(&ni).arg(&ci).arg(&mut *buf);
        let cfg = LaunchConfig {
            grid_dim: (warps.div_ceil(8), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: x holds n rows of cols values, a multiple of 256; buf holds
        // rounded_bytes(n, cols).
        unsafe { b.launch(cfg) }
            .map(drop)
            .map_err(|e| device_error("q8_round_rows", e))?;
        let address = buf.device_ptr(stream).0;
        Ok(RoundedX {
            address,
            _held: Some(held),
        })
    }

    /// The kernel and launch for a part of `code` with `rows` outputs of `cols` inputs,
    /// for `n` rows of x, and whether it reads x as [`Q8Kernels::round`] left it (as every
    /// part of a product does where [`Self::reads_rounded`] says so); `None` where the
    /// 8-bit path does not take the part (another format, a width not of whole 256-blocks,
    /// more shared memory than `limit`).
    pub(super) fn launch(
        &self,
        code: WeightCode,
        rows: usize,
        cols: usize,
        n: usize,
        limit: usize,
    ) -> Option<(&CudaFunction, LaunchConfig, bool)> {
        let slot = match code {
            WeightCode::Q4K => 0,
            WeightCode::Q6K => 1,
            _ => return None,
        };
        if !cols.is_multiple_of(QBLOCK) {
            return None;
        }
        if let (Some(tiles), true) = (&self.tiles, self.takes_tiles(n)) {
            let staged = MMQ_WEIGHT_BYTES[slot];
            let scales = if slot == 0 { MMQ_SCALES } else { 0 };
            let cfg = LaunchConfig {
                grid_dim: (
                    (rows as u32).div_ceil(MMQ_OUTS),
                    n.div_ceil(MMQ_ROWS) as u32,
                    1,
                ),
                block_dim: (32 * MMQ_WARPS, 1, 1),
                shared_mem_bytes: (2 * (MMQ_STAGE_X + MMQ_OUTS as usize * staged) + scales) as u32,
            };
            // A device with less shared memory a block (sm_86: 99 KiB) takes Q6_K's
            // products on `matvecq_F`: the same bits.
            if cfg.shared_mem_bytes as usize <= limit {
                return Some((&tiles[slot], cfg, true));
            }
        }
        let nr = if n == 1 { 1 } else { QROWS };
        let shared = shared_bytes(cols, nr);
        if shared > limit {
            return None;
        }
        let (func, rounded) = match (&self.one_rounded, n) {
            (Some(one), 1) => (&one[slot], true),
            (None, 1) => (&self.one[slot], false),
            _ => (&self.rows[slot], false),
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
        Some((func, cfg, rounded))
    }
}

/// Bytes of `n` rows of `cols` values rounded for the kernels that read x rounded: the
/// values, the sums of each 16, the scales of each 256 (`q8_round_rows`).
pub(super) fn rounded_bytes(n: usize, cols: usize) -> usize {
    n * cols + n * cols / 16 * 4 + n * cols / QBLOCK * 4
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

    /// A tensor-core block's stages start its regions (rows of x, sums, scales, weights)
    /// where its 16-byte copies need them, two of its Q4_K blocks fit a multiprocessor of
    /// an H100 (228 KiB) and a Q6_K block fits a block's 227 KiB; the rounded rows' sums and
    /// scales start where `q8_round_rows` writes them aligned.
    #[test]
    fn the_tensor_core_stages_fit_and_are_aligned() {
        assert_eq!(MMQ_XSTRIDE % 16, 0);
        assert_eq!((MMQ_ROWS * MMQ_XSTRIDE) % 16, 0);
        assert_eq!(MMQ_STAGE_X % 16, 0);
        let block = |slot: usize| {
            let stage = MMQ_STAGE_X + MMQ_OUTS as usize * MMQ_WEIGHT_BYTES[slot];
            assert_eq!(stage % 16, 0);
            2 * stage + if slot == 0 { MMQ_SCALES } else { 0 }
        };
        assert!(2 * (block(0) + 1024) <= 228 * 1024);
        assert!(block(1) <= 227 * 1024);
        for (n, cols) in [(16, 256), (83, 17 * 256), (512, 14_336)] {
            assert_eq!((n * cols) % 16, 0);
            assert_eq!((cols / 16 * 4) % 16, 0);
            assert_eq!(
                rounded_bytes(n, cols),
                n * cols * 5 / 4 + n * cols / QBLOCK * 4
            );
        }
    }
}
