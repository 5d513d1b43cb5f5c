//! Attention launches: on tensor cores where the device has the kernel for the heads,
//! else a block per (row, head, part), or for a prefill chunk over an `f16` cache a block
//! per 16 rows of a KV head (`attend_tile_h`, the same bits as the per-row kernel).

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};
use mtplx_kv::KvDtype;

use super::{device_error, AttendParts, CudaDevice, MmaAttend};
use crate::cuda::source::{
    attend_mma_shared, ATTEND_KEYS, ATTEND_MMA_PAIRS, ATTEND_MMA_TILE_PAIRS, ATTEND_MMA_WARPS,
    ATTEND_ROWS, ATTEND_TILE_FROM, ATTEND_TILE_ROWS, MAX_SHARED_BYTES,
};
use crate::error::{ModelError, Result};

/// What an attention launch reads: `n` query rows `q` (`[n, qh, hd]`) of layer `layer`
/// against the cache whose K and V addresses per layer `kv` holds (rows stored as
/// `kv_dtype`), the rows' cache row and position in `meta` (see `kernels.cu`), a window of
/// `max_len` positions (which sizes the launch's parts).
pub(crate) struct AttendIn<'a> {
    pub(crate) q: &'a CudaSlice<f32>,
    pub(crate) kv: &'a CudaSlice<u64>,
    pub(crate) kv_dtype: KvDtype,
    pub(crate) layer: usize,
    /// Query heads, KV heads, head size.
    pub(crate) heads: (usize, usize, usize),
    pub(crate) n: usize,
    pub(crate) meta: &'a CudaSlice<u32>,
    pub(crate) scale: f32,
    pub(crate) max_len: usize,
}

/// The kernel a launch's attention runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttendPath {
    /// `attend_mma_{hd}`: for an `f16` cache on sm_80 and later, at every row count, so a
    /// decode step and a prefill chunk give a row the same bits.
    TensorCores,
    /// `attend_tile_h`: a prefill chunk's rows over an `f16` cache without the former (the
    /// same bits as `PerRow`).
    Tiles,
    /// `attend` / `attend_h`: a block per (row, head, part).
    PerRow,
}

/// Blocks a tensor-core attention launch wants at least, a multiprocessor: below it, the
/// blocks each take one part.
const BLOCKS_A_MULTIPROCESSOR: usize = 8;

/// The parts each block of a tensor-core attention launch takes, one after another, for
/// `count` parts and `others` blocks a part (row blocks × KV heads) on `sms`
/// multiprocessors: the most, up to `span`, that still leaves the launch
/// [`BLOCKS_A_MULTIPROCESSOR`] blocks a multiprocessor, so that a long context's blocks pay
/// their prologue, their publishing and their count fewer times while the device stays
/// full; else 1. (No bit depends on it: each part is computed alone into its own slot.)
fn parts_a_block(count: usize, others: usize, sms: usize, span: usize) -> usize {
    let want = BLOCKS_A_MULTIPROCESSOR * sms;
    (1..=span.max(1))
        .rev()
        .find(|&per| others * count.div_ceil(per) >= want)
        .unwrap_or(1)
}

impl MmaAttend {
    /// The kernel for a launch of `n` rows of `g` query heads a KV head, and the (row, head)
    /// pairs a block of it takes: one tile, its warps sharing the tile's work (the same
    /// bits), where the launch's pairs fit one; else blocks of [`ATTEND_MMA_PAIRS`].
    fn launch_for(&self, g: usize, n: usize) -> (&CudaFunction, usize) {
        match &self.split {
            Some(split) if n * g <= ATTEND_MMA_TILE_PAIRS => (split, ATTEND_MMA_TILE_PAIRS),
            _ => (&self.rows, ATTEND_MMA_PAIRS),
        }
    }
}

impl CudaDevice {
    /// The kernel [`Self::attend`] takes for `n` rows of `heads` (query heads, KV heads,
    /// head size) over a `dtype` cache. Whether it is the tensor cores' does not depend on
    /// `n`: a row's bits must not depend on how many rows share its launch.
    pub(crate) fn attend_path(
        &self,
        dtype: KvDtype,
        heads: (usize, usize, usize),
        n: usize,
    ) -> Result<AttendPath> {
        let (qh, kvh, hd) = heads;
        let kernels = self.kv_kernels(dtype)?;
        let grouped = kvh > 0 && qh.is_multiple_of(kvh);
        if grouped
            && qh / kvh <= ATTEND_MMA_PAIRS
            && kernels.attend_mma.iter().any(|k| k.head_dim == hd)
        {
            return Ok(AttendPath::TensorCores);
        }
        let tile_shared = self.tile_shared_bytes(hd, self.attend_shared_bytes(hd)?);
        let tiles = kernels.attend_tile.is_some()
            && n >= ATTEND_TILE_FROM
            && hd.is_multiple_of(8)
            && grouped
            && tile_shared <= self.k.shared_limit;
        Ok(if tiles {
            AttendPath::Tiles
        } else {
            AttendPath::PerRow
        })
    }

    /// Whether [`Self::attend`] of `n` rows of `heads` over an `f16` cache runs on the
    /// tensor cores' split kernel (its pairs in one tile).
    #[cfg(test)]
    pub(crate) fn attend_splits(&self, heads: (usize, usize, usize), n: usize) -> Result<bool> {
        let (qh, kvh, hd) = heads;
        Ok(
            self.attend_path(KvDtype::F16, heads, n)? == AttendPath::TensorCores
                && self
                    .kv_kernels(KvDtype::F16)?
                    .attend_mma
                    .iter()
                    .find(|k| k.head_dim == hd)
                    .is_some_and(|k| k.launch_for(qh / kvh, n).1 == ATTEND_MMA_TILE_PAIRS),
        )
    }

    /// Makes each tensor-core attention block take `per` parts (at most the source's
    /// span; 0: the launch's own choice), as a long context on a large device does.
    #[cfg(test)]
    pub(crate) fn force_attend_span(&self, per: usize) {
        self.attend_span
            .store(per, std::sync::atomic::Ordering::Relaxed);
    }

    /// The parts a block takes where a test set them ([`Self::force_attend_span`]).
    #[cfg(test)]
    fn forced_attend_span(&self) -> Option<usize> {
        Some(self.attend_span.load(std::sync::atomic::Ordering::Relaxed)).filter(|&p| p > 0)
    }

    /// None outside the tests: the launch chooses.
    #[cfg(not(test))]
    fn forced_attend_span(&self) -> Option<usize> {
        None
    }

    /// [`Self::attend`] on tensor cores: launches of up to [`ATTEND_ROWS`] rows, a block per
    /// [`ATTEND_MMA_PAIRS`] (row, head) pairs of a KV head and part, or one block for a
    /// launch of at most [`ATTEND_MMA_TILE_PAIRS`] pairs.
    fn attend_mma(
        &self,
        a: &AttendIn,
        parts: &mut AttendParts,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let AttendIn {
            q,
            kv,
            kv_dtype,
            layer,
            heads: (qh, kvh, hd),
            n,
            meta,
            scale,
            max_len,
        } = *a;
        let kernels = self.kv_kernels(kv_dtype)?;
        let mma = kernels
            .attend_mma
            .iter()
            .find(|k| k.head_dim == hd)
            .ok_or_else(|| {
                ModelError::Device(format!("no tensor-core attention for heads of {hd}"))
            })?;
        let (func, pairs) = mma.launch_for(qh / kvh, n);
        let rows_per_block = pairs / (qh / kvh);
        let count = max_len.div_ceil(ATTEND_KEYS);
        let span = crate::cuda::switches::count(
            "MTPLX_CUDA_ATTEND_SPAN",
            self.k.shape.attend_span as usize,
            1..=self.k.shape.attend_span as usize,
        );
        let (qhi, kvhi, li, pi) = (qh as i32, kvh as i32, layer as i32, count as i32);
        let mut r0 = 0;
        while r0 < n {
            let rows_now = (n - r0).min(ATTEND_ROWS);
            let (r0i, rows_i) = (r0 as i32, rows_now as i32);
            let others = rows_now.div_ceil(rows_per_block) * kvh;
            let per = self.forced_attend_span().map_or_else(
                || parts_a_block(count, others, self.k.sms, span),
                |f| f.min(span),
            );
            let mut b = self.stream.launch_builder(func);
            b.arg(q)
                .arg(kv)
                .arg(&li)
                .arg(&mut parts.values)
                .arg(&mut parts.done)
                .arg(&mut *out)
                .arg(&qhi)
                .arg(&kvhi)
                .arg(meta)
                .arg(&scale)
                .arg(&r0i)
                .arg(&pi)
                .arg(&rows_i);
            let cfg = LaunchConfig {
                grid_dim: (
                    rows_now.div_ceil(rows_per_block) as u32,
                    kvh as u32,
                    count.div_ceil(per) as u32,
                ),
                block_dim: (32 * ATTEND_MMA_WARPS, 1, 1),
                shared_mem_bytes: attend_mma_shared(hd) as u32,
            };
            // SAFETY: as for `attend`'s launches: q and out hold n × qh × hd; the caches
            // (f16) hold pos0 + n rows of kvh × hd (at most max_len); `parts` was made for
            // these heads and max_len, its counters all 0 between launches; qh is a multiple
            // of kvh with at most ATTEND_MMA_PAIRS query heads a KV head; the block's shared
            // memory is the kernel's two buffers of K and V rows for heads of hd, within
            // the limit its attribute was set to at load.
            unsafe { b.launch(cfg) }
                .map(drop)
                .map_err(|e| device_error("attend_mma", e))?;
            r0 += rows_now;
        }
        Ok(())
    }

    /// Shared memory of an attention part's block.
    fn attend_shared_bytes(&self, head_dim: usize) -> Result<u32> {
        let warps = self.k.shape.attend_warps as usize;
        if !head_dim.is_multiple_of(4) {
            return Err(ModelError::Device(format!(
                "heads of {head_dim} values: the CUDA backend needs a multiple of 4"
            )));
        }
        let shared = (32 + head_dim + warps * head_dim + ATTEND_KEYS) * 4;
        if shared > MAX_SHARED_BYTES {
            return Err(ModelError::Device(format!(
                "heads of {head_dim} values need {shared} bytes of shared memory; the CUDA \
                 backend supports up to {MAX_SHARED_BYTES}"
            )));
        }
        Ok(shared as u32)
    }

    /// Shared memory of an `attend_tile_h` block: a part's K and V rows of one head (`f16`),
    /// then each group's per-row buffers (`shared`, [`Self::attend_shared_bytes`]) and flag.
    fn tile_shared_bytes(&self, head_dim: usize, shared: u32) -> usize {
        let groups = self.k.shape.tile_groups as usize;
        2 * ATTEND_KEYS * head_dim * 2 + groups * (shared as usize + 4)
    }

    /// Causal attention of `n` query rows over the layer's cache rows, in parts of
    /// [`ATTEND_KEYS`] positions (as many as `max_len` needs: the launch's shape does not
    /// change with the context, so a captured pass replays at any length), merged in order
    /// by the last part of each row and head to finish. The kernel is [`Self::attend_path`]'s.
    pub(crate) fn attend(
        &self,
        a: &AttendIn,
        parts: &mut AttendParts,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let AttendIn {
            q,
            kv,
            kv_dtype,
            layer,
            heads,
            n,
            meta,
            scale,
            max_len,
        } = *a;
        let (qh, kvh, hd) = heads;
        let path = self.attend_path(kv_dtype, heads, n)?;
        if path == AttendPath::TensorCores {
            return self.attend_mma(a, parts, out);
        }
        let shared = self.attend_shared_bytes(hd)?;
        let kernels = self.kv_kernels(kv_dtype)?;
        let warps = self.k.shape.attend_warps;
        // A prefill chunk's rows share each part's keys and values (`attend_tile_h`): the
        // same bits as `attend`'s blocks, one copy of the keys for many rows and heads.
        let groups = self.k.shape.tile_groups;
        let tile_shared = self.tile_shared_bytes(hd, shared);
        let tile = kernels
            .attend_tile
            .as_ref()
            .filter(|_| path == AttendPath::Tiles);
        let count = max_len.div_ceil(ATTEND_KEYS);
        let (qhi, kvhi, hdi) = (qh as i32, kvh as i32, hd as i32);
        let (li, pi) = (layer as i32, count as i32);
        let mut r0 = 0;
        while r0 < n {
            let rows_now = (n - r0).min(ATTEND_ROWS);
            let r0i = r0 as i32;
            let kernel = tile.unwrap_or(&kernels.attend);
            let mut b = self.stream.launch_builder(kernel);
            b.arg(q)
                .arg(kv)
                .arg(&li)
                .arg(&mut parts.values)
                .arg(&mut parts.done)
                .arg(&mut *out)
                .arg(&qhi)
                .arg(&kvhi)
                .arg(&hdi)
                .arg(meta)
                .arg(&scale)
                .arg(&r0i)
                .arg(&pi);
            let rows_i = rows_now as i32;
            let cfg = if tile.is_some() {
                b.arg(&rows_i);
                LaunchConfig {
                    grid_dim: (
                        rows_now.div_ceil(ATTEND_TILE_ROWS) as u32,
                        kvh as u32,
                        count as u32,
                    ),
                    block_dim: (32 * warps * groups, 1, 1),
                    shared_mem_bytes: tile_shared as u32,
                }
            } else {
                LaunchConfig {
                    grid_dim: (rows_now as u32, qh as u32, count as u32),
                    block_dim: (32 * warps, 1, 1),
                    shared_mem_bytes: shared,
                }
            };
            // SAFETY: q and out hold n × qh × hd; the caches hold pos0 + n rows of kvh × hd
            // (at most max_len); `parts` was made for these heads and max_len
            // ([`AttendParts::new`]), its counters all 0 between launches. A tile block's
            // shared memory holds a part's K and V rows of one head (`f16`, hd a multiple
            // of 8 for its 16-byte copies) and its groups' buffers, within the limit set at
            // load; qh is a multiple of kvh.
            unsafe { b.launch(cfg) }
                .map(drop)
                .map_err(|e| device_error("attend", e))?;
            r0 += rows_now;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::parts_a_block;

    /// A long prefill chunk's launch (4 row blocks × 8 KV heads, 128 parts at 32K) gives
    /// its blocks several parts and still fills an H100's 132 multiprocessors eight times;
    /// a decode step at 32K (8 blocks a part), a 4K context or a one-part span keeps a block
    /// a part; a block never takes more than the span.
    #[test]
    fn long_contexts_give_a_block_several_parts_while_the_device_stays_full() {
        assert_eq!(parts_a_block(128, 32, 132, 8), 3);
        assert!(32 * 128usize.div_ceil(3) >= 8 * 132);
        assert_eq!(parts_a_block(136, 8, 132, 8), 1);
        assert_eq!(parts_a_block(16, 32, 132, 8), 1);
        assert_eq!(parts_a_block(128, 32, 132, 1), 1);
        assert_eq!(parts_a_block(1024, 32, 132, 8), 8);
        assert_eq!(parts_a_block(128, 32, 132, 0), 1);
        assert_eq!(parts_a_block(0, 32, 132, 8), 1);
    }
}
