//! Fixed-size blocks from a shared pool, one block table per sequence.

mod pool;

pub use pool::{BlockPool, PoolStats};

use std::ops::Range;
use std::sync::Arc;

use crate::check::{append_rows, attend_geometry, check_layer, read_range};
use crate::{
    BufferId, KvCache, KvError, KvShape, KvView, LayoutKind, LentLayer, LentPiece, ShareTarget,
};
use mtplx_kernels::attention::{self, RowSource};

use pool::Block;

/// K/V rows in fixed-size blocks of `block_tokens` positions taken from a shared
/// [`BlockPool`], with a block table per layer.
///
/// Shape: layer `l` holds `ceil(len / block_tokens)` blocks; block `b` holds positions
/// `b * block_tokens ..` as `[block_tokens, kv_heads * head_dim]` K rows followed by as many
/// V rows. Blocks are reference-counted: a [`KvCache::fork`], a [`KvCache::snapshot`] or a
/// restore through the same pool share every block, and the first append to a shared,
/// partly filled last block copies it (copy-on-write of at most `block_tokens - 1` rows).
/// Attention reads rows in place through the block table.
///
/// # When to use
/// Many live sequences that share prefixes (several requests on one system prompt, beams,
/// speculative branches): shared blocks are stored once, a fork costs one table copy, and
/// memory is reused block by block through the pool instead of growing per sequence.
/// For a single long sequence prefer [`crate::Contiguous`] (prefill) or
/// [`crate::Segmented`] (cheap snapshots).
#[derive(Debug, Clone)]
pub struct Paged {
    shape: KvShape,
    block_tokens: usize,
    pool: BlockPool,
    layers: Vec<PagedLayer>,
}

#[derive(Debug, Clone, Default)]
struct PagedLayer {
    /// Invariant: `blocks.len() == len.div_ceil(block_tokens)`.
    blocks: Vec<Arc<Block>>,
    len: usize,
}

impl PagedLayer {
    /// Block `bi` (which must exist), made this layer's alone: a block shared with a fork or
    /// snapshot is replaced by a copy of its first `keep` rows.
    fn own(&mut self, bi: usize, keep: usize, row: usize, pool: &BlockPool) -> &mut Block {
        let slot = &mut self.blocks[bi];
        if Arc::get_mut(slot).is_none() {
            let mut fresh = pool.alloc(slot.k().len() * 2);
            let (fk, fv) = Arc::get_mut(&mut fresh)
                .expect("a fresh block is unique")
                .kv_mut();
            fk[..keep * row].copy_from_slice(&slot.k()[..keep * row]);
            fv[..keep * row].copy_from_slice(&slot.v()[..keep * row]);
            *slot = fresh;
        }
        Arc::get_mut(slot).expect("unique after copy-on-write")
    }
}

struct PagedSource<'a> {
    blocks: &'a [Arc<Block>],
    len: usize,
    block_tokens: usize,
    row_len: usize,
}

impl RowSource for PagedSource<'_> {
    #[inline]
    fn k_row(&self, pos: usize) -> &[f32] {
        let b = &self.blocks[pos / self.block_tokens];
        let o = (pos % self.block_tokens) * self.row_len;
        &b.k()[o..o + self.row_len]
    }
    #[inline]
    fn v_row(&self, pos: usize) -> &[f32] {
        let b = &self.blocks[pos / self.block_tokens];
        let o = (pos % self.block_tokens) * self.row_len;
        &b.v()[o..o + self.row_len]
    }
    #[inline]
    fn run(&self, start: usize) -> Option<(&[f32], &[f32])> {
        let bi = start / self.block_tokens;
        let filled = (self.len - bi * self.block_tokens).min(self.block_tokens);
        let b = &self.blocks[bi];
        let r = (start % self.block_tokens) * self.row_len..filled * self.row_len;
        Some((&b.k()[r.clone()], &b.v()[r]))
    }
}

impl Paged {
    /// An empty cache taking blocks of `block_tokens` positions from `pool`.
    ///
    /// A `block_tokens` that is a multiple of [`attention::ATTN_BLOCK`] lets attention read
    /// each key block as one slice.
    pub fn new(shape: KvShape, block_tokens: usize, pool: BlockPool) -> Self {
        Paged {
            shape,
            block_tokens: block_tokens.max(1),
            pool,
            layers: vec![PagedLayer::default(); shape.layers],
        }
    }

    /// The pool this cache takes its blocks from.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Positions per block.
    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// Blocks in `layer`'s block table.
    pub fn block_count(&self, layer: usize) -> usize {
        self.layers.get(layer).map_or(0, |l| l.blocks.len())
    }

    fn block_floats(&self) -> usize {
        2 * self.block_tokens * self.shape.row_len()
    }

    fn layer(&self, layer: usize) -> Result<&PagedLayer, KvError> {
        check_layer(self.shape, layer)?;
        Ok(&self.layers[layer])
    }

    fn blocks(&self) -> impl Iterator<Item = &Arc<Block>> {
        self.layers.iter().flat_map(|l| l.blocks.iter())
    }
}

impl KvView for Paged {
    fn shape(&self) -> KvShape {
        self.shape
    }

    fn layout(&self) -> LayoutKind {
        LayoutKind::Paged
    }

    fn layer_len(&self, layer: usize) -> usize {
        self.layers.get(layer).map_or(0, |l| l.len)
    }

    fn read_rows(
        &self,
        layer: usize,
        range: Range<usize>,
        k: &mut [f32],
        v: &mut [f32],
    ) -> Result<(), KvError> {
        let l = self.layer(layer)?;
        read_range(self.shape, l.len, &range, k, v)?;
        let (bt, row) = (self.block_tokens, self.shape.row_len());
        let mut pos = range.start;
        while pos < range.end {
            let (bi, off) = (pos / bt, pos % bt);
            let take = (bt - off).min(range.end - pos);
            let src = off * row..(off + take) * row;
            let dst = (pos - range.start) * row..(pos - range.start + take) * row;
            k[dst.clone()].copy_from_slice(&l.blocks[bi].k()[src.clone()]);
            v[dst].copy_from_slice(&l.blocks[bi].v()[src]);
            pos += take;
        }
        Ok(())
    }

    fn logical_bytes(&self) -> usize {
        let per_row = self.shape.row_len() * std::mem::size_of::<f32>() * 2;
        self.layers.iter().map(|l| l.len * per_row).sum()
    }

    /// Bytes of every block in the block tables, shared blocks included.
    fn physical_bytes(&self) -> usize {
        self.blocks().map(|b| b.bytes()).sum()
    }

    /// Bytes of the blocks no other cache or snapshot references.
    fn unique_bytes(&self) -> usize {
        self.blocks()
            .filter(|b| Arc::strong_count(b) == 1)
            .map(|b| b.bytes())
            .sum()
    }

    fn visit_buffers(&self, visit: &mut dyn FnMut(BufferId, usize)) {
        for b in self.blocks() {
            visit(BufferId::of(&**b), b.bytes());
        }
    }

    /// Shares every block when `target` is paged with the same block size and pool.
    fn share_into(&self, target: ShareTarget<'_>) -> Option<Box<dyn KvCache>> {
        match target {
            ShareTarget::Paged { block_tokens, pool }
                if block_tokens == self.block_tokens && pool.same_pool(&self.pool) =>
            {
                Some(Box::new(self.clone()))
            }
            _ => None,
        }
    }
}

impl KvCache for Paged {
    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<(), KvError> {
        let n = append_rows(self.shape, layer, k, v)?;
        let (bt, row) = (self.block_tokens, self.shape.row_len());
        let floats = self.block_floats();
        let pool = &self.pool;
        let l = &mut self.layers[layer];
        let mut done = 0;
        while done < n {
            let (bi, off) = (l.len / bt, l.len % bt);
            if bi == l.blocks.len() {
                l.blocks.push(pool.alloc(floats));
            }
            // Shared with a fork or snapshot: copy the rows written so far.
            let (bk, bv) = l.own(bi, off, row, pool).kv_mut();
            let take = (bt - off).min(n - done);
            let (dst, src) = (
                off * row..(off + take) * row,
                done * row..(done + take) * row,
            );
            bk[dst.clone()].copy_from_slice(&k[src.clone()]);
            bv[dst].copy_from_slice(&v[src]);
            l.len += take;
            done += take;
        }
        Ok(())
    }

    /// One piece per block the new positions touch: the rest of the partly filled last
    /// block (copied first if it is shared, as [`KvCache::append`] does), then new blocks
    /// from the pool.
    fn append_in_place(&mut self, n: usize) -> Option<Vec<LentLayer<'_>>> {
        let (bt, row) = (self.block_tokens, self.shape.row_len());
        let floats = self.block_floats();
        let pool = &self.pool;
        let lent = self
            .layers
            .iter_mut()
            .map(|l| {
                let (start, end) = (l.len, l.len + n);
                let first = start / bt;
                if n == 0 {
                    return LentLayer { pieces: Vec::new() };
                }
                if start % bt != 0 {
                    // A truncate may have left stale rows past the length.
                    let (k, v) = l.own(first, start % bt, row, pool).kv_mut();
                    k[(start % bt) * row..].fill(0.0);
                    v[(start % bt) * row..].fill(0.0);
                }
                while l.blocks.len() < end.div_ceil(bt) {
                    l.blocks.push(pool.alloc_zeroed(floats));
                }
                l.len = end;
                let pieces = (first..)
                    .zip(&mut l.blocks[first..])
                    .map(|(bi, block)| {
                        let at = bi * bt;
                        let positions = start.max(at)..end.min(at + bt);
                        let rows = (positions.start - at) * row..(positions.end - at) * row;
                        let (k, v) = Arc::get_mut(block).expect("owned above").kv_mut();
                        LentPiece {
                            positions,
                            k: &mut k[rows.clone()],
                            v: &mut v[rows],
                        }
                    })
                    .collect();
                LentLayer { pieces }
            })
            .collect();
        Some(lent)
    }

    fn attend(
        &self,
        layer: usize,
        q: &[f32],
        q_heads: usize,
        scale: f32,
        out: &mut [f32],
    ) -> Result<(), KvError> {
        let l = self.layer(layer)?;
        let g = attend_geometry(self.shape, l.len, q, q_heads, scale, out)?;
        let src = PagedSource {
            blocks: &l.blocks,
            len: l.len,
            block_tokens: self.block_tokens,
            row_len: self.shape.row_len(),
        };
        attention::attend(&src, q, g, out);
        Ok(())
    }

    /// Releases whole blocks past `len`; a block that `len` cuts keeps its stale rows until
    /// they are overwritten.
    fn truncate(&mut self, len: usize) {
        let bt = self.block_tokens;
        for l in &mut self.layers {
            if l.len > len {
                l.len = len;
                l.blocks.truncate(len.div_ceil(bt));
            }
        }
    }

    fn snapshot(&self) -> Arc<dyn KvView> {
        Arc::new(self.clone())
    }

    fn fork(&self) -> Box<dyn KvCache> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> KvShape {
        KvShape {
            layers: 1,
            kv_heads: 1,
            head_dim: 2,
        }
    }

    fn rows(n: usize, base: f32) -> Vec<f32> {
        (0..2 * n).map(|i| base + i as f32).collect()
    }

    #[test]
    fn fork_shares_full_blocks_and_copies_the_partial_one_on_write() {
        let pool = BlockPool::new();
        let mut a = Paged::new(shape(), 4, pool.clone());
        a.append(0, &rows(6, 0.0), &rows(6, 100.0)).unwrap();
        let block_bytes = 2 * 4 * 2 * 4;
        assert_eq!(pool.stats().live_bytes, 2 * block_bytes);
        let mut b = a.fork();
        assert_eq!(pool.stats().live_blocks, 2, "a fork allocates nothing");
        assert_eq!(b.unique_bytes(), 0);
        b.append(0, &rows(1, 50.0), &rows(1, 150.0)).unwrap();
        // The partly filled second block was copied; the first is still shared.
        assert_eq!(pool.stats().live_blocks, 3);
        assert_eq!(b.unique_bytes(), block_bytes);
        let (mut k, mut v) = (vec![0.0; 14], vec![0.0; 14]);
        b.read_rows(0, 0..7, &mut k, &mut v).unwrap();
        assert_eq!(&k[..12], &rows(6, 0.0)[..]);
        assert_eq!(&k[12..], &[50.0, 51.0]);
        let (mut k, mut v) = (vec![0.0; 12], vec![0.0; 12]);
        a.read_rows(0, 0..6, &mut k, &mut v).unwrap();
        assert_eq!(k, rows(6, 0.0));
        assert_eq!(v, rows(6, 100.0));
        drop((a, b));
        assert_eq!(
            pool.stats().live_blocks,
            0,
            "dropping the caches frees every block"
        );
    }

    #[test]
    fn truncate_releases_whole_blocks() {
        let pool = BlockPool::new();
        let mut a = Paged::new(shape(), 4, pool.clone());
        a.append(0, &rows(9, 0.0), &rows(9, 0.0)).unwrap();
        assert_eq!(a.block_count(0), 3);
        a.truncate(4);
        assert_eq!(a.block_count(0), 1);
        assert_eq!(pool.stats().live_blocks, 1);
        assert_eq!(pool.stats().free_blocks, 2);
    }

    #[test]
    fn runs_end_at_block_boundaries() {
        let pool = BlockPool::new();
        let mut a = Paged::new(shape(), 4, pool);
        a.append(0, &rows(8, 0.0), &rows(8, 0.0)).unwrap();
        let src = PagedSource {
            blocks: &a.layers[0].blocks,
            len: 7,
            block_tokens: 4,
            row_len: 2,
        };
        assert_eq!(src.run(0).unwrap().0, &rows(8, 0.0)[..8]);
        // The last block ends at the cache length, not the block size.
        assert_eq!(src.run(4).unwrap().0, &rows(8, 0.0)[8..14]);
        assert_eq!(src.run(5).unwrap().0, &rows(8, 0.0)[10..14]);
        assert_eq!(src.k_row(5), &[10.0, 11.0]);
    }
}
