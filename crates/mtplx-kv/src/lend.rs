//! Storage a cache lends to be filled in place ([`crate::KvCache::append_in_place`]).

use std::ops::Range;

/// One layer's storage for the positions a cache has just appended, lent to be filled in
/// place: pieces in position order, each a run of consecutive positions that one of the
/// layer's buffers holds. A [`crate::Contiguous`] layer lends one piece, a
/// [`crate::Paged`] layer one piece per block the positions touch, a
/// [`crate::Segmented`] layer one per segment.
///
/// The pieces cover the appended positions exactly: the first starts at the layer's old
/// length, each starts where the previous one ends, the last ends at the new length.
#[derive(Debug)]
pub struct LentLayer<'a> {
    pub pieces: Vec<LentPiece<'a>>,
}

/// Consecutive positions of one layer held in one buffer: `k` and `v` hold
/// `positions.len() * row_len` values each, positions outermost, as [`crate::KvCache::append`]
/// takes them, lent as the bytes of the cache's element type ([`crate::KvView::dtype`]:
/// what [`crate::KvView::read_raw`] gives back). The bytes are aligned for that type.
#[derive(Debug)]
pub struct LentPiece<'a> {
    /// The positions, numbered as in the cache (the first appended one is the layer's old
    /// length).
    pub positions: Range<usize>,
    pub k: &'a mut [u8],
    pub v: &'a mut [u8],
}

impl LentPiece<'_> {
    /// Writes `k` and `v` (`f32` values, one rounding each, as [`crate::KvCache::append`]
    /// does) into a piece of a cache storing `E`.
    ///
    /// # Panics
    /// If `E` is not the cache's element type or the lengths differ from the piece's.
    pub fn fill<E: crate::KvElem>(&mut self, k: &[f32], v: &[f32]) {
        for (dst, src) in [(&mut *self.k, k), (&mut *self.v, v)] {
            let dst: &mut [E] = bytemuck::cast_slice_mut(dst);
            assert_eq!(dst.len() * E::GROUP, src.len(), "a piece's values");
            E::narrow(src, dst);
        }
    }
}
