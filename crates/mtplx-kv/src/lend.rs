//! Storage a cache lends to be filled in place ([`crate::KvCache::append_in_place`]), and
//! host memory a cache lends to be filled and handed back ([`StagingBuffer`]).

use std::any::Any;
use std::ops::Range;

use crate::error::KvError;

/// Host memory a cache copies stored rows out of as they are ([`crate::KvCache::append_staged`]),
/// lent by [`crate::KvCache::lend_staging`]: for a device's cache, page-locked memory its copy
/// engine reads directly. A restore reads a block's rows from disk into it and hands it to
/// the cache, which queues their copy and returns at once; the buffer is filled again only
/// once that copy is done, which [`StagingBuffer::to_fill`] waits for.
pub trait StagingBuffer: Send {
    /// The whole buffer, to be written: waits first until no copy queued from it still
    /// reads it.
    fn to_fill(&mut self) -> Result<&mut [u8], KvError>;
    /// The buffer as filled (a copy out of it may be reading it too).
    fn bytes(&self) -> &[u8];
    /// For the cache that lent it, to find its own type again.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// `buf[range]`, or a [`KvError::StagedRange`].
pub fn staged_part(buf: &[u8], range: Range<usize>) -> Result<&[u8], KvError> {
    let len = buf.len();
    buf.get(range.clone()).ok_or(KvError::StagedRange {
        start: range.start,
        end: range.end,
        len,
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CacheFactory, KvCache, KvDtype, KvShape};

    struct Heap(Vec<u8>);

    impl StagingBuffer for Heap {
        fn to_fill(&mut self) -> Result<&mut [u8], KvError> {
            Ok(&mut self.0)
        }
        fn bytes(&self) -> &[u8] {
            &self.0
        }
        fn as_any_mut(&mut self) -> &mut dyn Any {
            self
        }
    }

    /// A host layout lends no buffers, and rows staged in any buffer are appended as
    /// `append_stored` appends the same bytes; a range past the buffer is refused.
    #[test]
    fn staged_rows_are_appended_as_stored_rows_are() {
        let shape = KvShape {
            layers: 1,
            kv_heads: 2,
            head_dim: 4,
        };
        let factory = CacheFactory::contiguous().with_dtype(KvDtype::F16).unwrap();
        let row = KvDtype::F16.bytes(shape.row_len());
        let bytes: Vec<u8> = (0..6 * row).map(|i| (i * 7 % 251) as u8).collect();
        let (k, v) = (row..3 * row, 3 * row..5 * row);
        let mut staged = factory.new_cache(shape);
        assert!(staged.lend_staging(2, 64).is_none());
        let mut buf = Heap(bytes.clone());
        staged
            .append_staged(0, &mut buf, k.clone(), v.clone())
            .unwrap();
        let mut stored = factory.new_cache(shape);
        stored
            .append_stored(0, &bytes[k.clone()], &bytes[v])
            .unwrap();
        let read = |c: &dyn KvCache| {
            let (mut k, mut v) = (vec![0u8; 2 * row], vec![0u8; 2 * row]);
            c.read_raw(0, 0..2, &mut k, &mut v).unwrap();
            (k, v)
        };
        assert_eq!(read(&*staged), read(&*stored));
        let past = staged.append_staged(0, &mut buf, k, 5 * row..7 * row);
        assert_eq!(
            past,
            Err(KvError::StagedRange {
                start: 5 * row,
                end: 7 * row,
                len: 6 * row
            })
        );
        assert_eq!(
            staged.layer_len(0),
            2,
            "nothing appended by the refused call"
        );
    }
}
