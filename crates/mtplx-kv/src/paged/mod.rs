//! Fixed-size blocks from a shared pool, one block table per sequence.

mod pool;

pub use pool::{BlockPool, PoolStats};

use std::ops::Range;
use std::sync::Arc;

use crate::check::{
    append_rows, attend_geometry, bytes_mut, check_layer, read_range, row_elems, Incoming, Raw,
    RowsOut, Wide,
};
use crate::{
    BufferId, KvCache, KvDtype, KvElem, KvError, KvShape, KvView, LayoutKind, LentLayer, LentPiece,
    ShareTarget,
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
#[derive(Debug)]
pub struct Paged<E: KvElem = f32> {
    shape: KvShape,
    block_tokens: usize,
    pool: BlockPool,
    layers: Vec<PagedLayer>,
    elem: std::marker::PhantomData<E>,
}

impl<E: KvElem> Clone for Paged<E> {
    fn clone(&self) -> Self {
        Paged {
            shape: self.shape,
            block_tokens: self.block_tokens,
            pool: self.pool.clone(),
            layers: self.layers.clone(),
            elem: std::marker::PhantomData,
        }
    }
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
    fn own<E: KvElem>(
        &mut self,
        bi: usize,
        keep: usize,
        row: usize,
        pool: &BlockPool,
    ) -> &mut Block {
        let slot = &mut self.blocks[bi];
        if Arc::get_mut(slot).is_none() {
            let mut fresh = pool.alloc(slot.bytes());
            let (fk, fv) = Arc::get_mut(&mut fresh)
                .expect("a fresh block is unique")
                .kv_mut::<E>();
            fk[..keep * row].copy_from_slice(&slot.k::<E>()[..keep * row]);
            fv[..keep * row].copy_from_slice(&slot.v::<E>()[..keep * row]);
            *slot = fresh;
        }
        Arc::get_mut(slot).expect("unique after copy-on-write")
    }
}

struct PagedSource<'a, E> {
    blocks: &'a [Arc<Block>],
    len: usize,
    block_tokens: usize,
    row_len: usize,
    elem: std::marker::PhantomData<E>,
}

impl<E: KvElem> RowSource for PagedSource<'_, E> {
    type Elem = E;
    #[inline]
    fn k_row(&self, pos: usize) -> &[E] {
        let b = &self.blocks[pos / self.block_tokens];
        let o = (pos % self.block_tokens) * self.row_len;
        &b.k()[o..o + self.row_len]
    }
    #[inline]
    fn v_row(&self, pos: usize) -> &[E] {
        let b = &self.blocks[pos / self.block_tokens];
        let o = (pos % self.block_tokens) * self.row_len;
        &b.v()[o..o + self.row_len]
    }
    #[inline]
    fn run(&self, start: usize) -> Option<(&[E], &[E])> {
        let bi = start / self.block_tokens;
        let filled = (self.len - bi * self.block_tokens).min(self.block_tokens);
        let b = &self.blocks[bi];
        let r = (start % self.block_tokens) * self.row_len..filled * self.row_len;
        Some((&b.k()[r.clone()], &b.v()[r]))
    }
}

impl Paged {
    /// An empty `f32` cache taking blocks of `block_tokens` positions from `pool`.
    pub fn new(shape: KvShape, block_tokens: usize, pool: BlockPool) -> Self {
        Paged::empty(shape, block_tokens, pool)
    }
}

impl<E: KvElem> Paged<E> {
    /// An empty cache of `E` rows taking blocks of `block_tokens` positions from `pool`
    /// (a pool may serve caches of several element types: their blocks differ in size).
    ///
    /// A `block_tokens` that is a multiple of [`attention::ATTN_BLOCK`] lets attention read
    /// each key block as one slice.
    pub fn empty(shape: KvShape, block_tokens: usize, pool: BlockPool) -> Self {
        Paged {
            shape,
            block_tokens: block_tokens.max(1),
            pool,
            layers: vec![PagedLayer::default(); shape.layers],
            elem: std::marker::PhantomData,
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

    /// Bytes of one block (K and V): a multiple of 4, the pool's word, for every element
    /// type (two halves of values of at least 2 bytes).
    fn block_bytes(&self) -> usize {
        2 * self.block_tokens * E::DTYPE.bytes(self.shape.row_len())
    }

    fn layer(&self, layer: usize) -> Result<&PagedLayer, KvError> {
        check_layer(self.shape, layer)?;
        Ok(&self.layers[layer])
    }

    fn blocks(&self) -> impl Iterator<Item = &Arc<Block>> {
        self.layers.iter().flat_map(|l| l.blocks.iter())
    }

    /// [`KvCache::append`] and [`KvCache::append_stored`].
    fn append_incoming(
        &mut self,
        layer: usize,
        k: Incoming<'_>,
        v: Incoming<'_>,
    ) -> Result<(), KvError> {
        let n = append_rows::<E>(self.shape, layer, k, v)?;
        let (bt, row) = (self.block_tokens, row_elems::<E>(self.shape));
        let shape = self.shape;
        let block_bytes = self.block_bytes();
        let pool = &self.pool;
        let l = &mut self.layers[layer];
        let mut done = 0;
        while done < n {
            let (bi, off) = (l.len / bt, l.len % bt);
            if bi == l.blocks.len() {
                l.blocks.push(pool.alloc(block_bytes));
            }
            // Shared with a fork or snapshot: copy the rows written so far.
            let (bk, bv) = l.own::<E>(bi, off, row, pool).kv_mut::<E>();
            let take = (bt - off).min(n - done);
            let dst = off * row..(off + take) * row;
            k.write(shape, done..done + take, &mut bk[dst.clone()]);
            v.write(shape, done..done + take, &mut bv[dst]);
            l.len += take;
            done += take;
        }
        Ok(())
    }

    /// Rows `range` of `layer` (checked by the caller) into `out`, block by block.
    fn read_into(&self, layer: &PagedLayer, range: Range<usize>, mut out: impl RowsOut) {
        let (bt, row) = (self.block_tokens, row_elems::<E>(self.shape));
        let mut pos = range.start;
        while pos < range.end {
            let (bi, off) = (pos / bt, pos % bt);
            let take = (bt - off).min(range.end - pos);
            let src = off * row..(off + take) * row;
            let b = &layer.blocks[bi];
            out.put(
                (pos - range.start) * row,
                &b.k::<E>()[src.clone()],
                &b.v::<E>()[src],
            );
            pos += take;
        }
    }
}

impl<E: KvElem> KvView for Paged<E> {
    fn shape(&self) -> KvShape {
        self.shape
    }

    fn layout(&self) -> LayoutKind {
        LayoutKind::Paged
    }

    fn dtype(&self) -> KvDtype {
        E::DTYPE
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
        read_range(l.len, &range, k, v, self.shape.row_len())?;
        self.read_into(l, range, Wide(k, v));
        Ok(())
    }

    fn read_raw(
        &self,
        layer: usize,
        range: Range<usize>,
        k: &mut [u8],
        v: &mut [u8],
    ) -> Result<(), KvError> {
        let l = self.layer(layer)?;
        read_range(l.len, &range, k, v, E::DTYPE.bytes(self.shape.row_len()))?;
        self.read_into(l, range, Raw(k, v));
        Ok(())
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

impl<E: KvElem> KvCache for Paged<E> {
    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<(), KvError> {
        self.append_incoming(layer, Incoming::Values(k), Incoming::Values(v))
    }

    fn append_stored(&mut self, layer: usize, k: &[u8], v: &[u8]) -> Result<(), KvError> {
        self.append_incoming(layer, Incoming::Stored(k), Incoming::Stored(v))
    }

    /// One piece per block the new positions touch: the rest of the partly filled last
    /// block (copied first if it is shared, as [`KvCache::append`] does), then new blocks
    /// from the pool.
    fn append_in_place(&mut self, n: usize) -> Option<Vec<LentLayer<'_>>> {
        let (bt, row) = (self.block_tokens, row_elems::<E>(self.shape));
        let block_bytes = self.block_bytes();
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
                    let (k, v) = l.own::<E>(first, start % bt, row, pool).kv_mut::<E>();
                    k[(start % bt) * row..].fill(E::default());
                    v[(start % bt) * row..].fill(E::default());
                }
                while l.blocks.len() < end.div_ceil(bt) {
                    l.blocks.push(pool.alloc_zeroed(block_bytes));
                }
                l.len = end;
                let pieces = (first..)
                    .zip(&mut l.blocks[first..])
                    .map(|(bi, block)| {
                        let at = bi * bt;
                        let positions = start.max(at)..end.min(at + bt);
                        let rows = (positions.start - at) * row..(positions.end - at) * row;
                        let (k, v) = Arc::get_mut(block).expect("owned above").kv_mut::<E>();
                        LentPiece {
                            positions,
                            k: bytes_mut(&mut k[rows.clone()]),
                            v: bytes_mut(&mut v[rows]),
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
        let src = PagedSource::<E> {
            blocks: &l.blocks,
            len: l.len,
            block_tokens: self.block_tokens,
            row_len: row_elems::<E>(self.shape),
            elem: std::marker::PhantomData,
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
        let src = PagedSource::<f32> {
            blocks: &a.layers[0].blocks,
            len: 7,
            block_tokens: 4,
            row_len: 2,
            elem: std::marker::PhantomData,
        };
        assert_eq!(src.run(0).unwrap().0, &rows(8, 0.0)[..8]);
        // The last block ends at the cache length, not the block size.
        assert_eq!(src.run(4).unwrap().0, &rows(8, 0.0)[8..14]);
        assert_eq!(src.run(5).unwrap().0, &rows(8, 0.0)[10..14]);
        assert_eq!(src.k_row(5), &[10.0, 11.0]);
    }
}
