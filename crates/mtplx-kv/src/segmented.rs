//! Shared immutable segments plus one growing tail per layer.

use std::mem::size_of;
use std::ops::Range;
use std::sync::Arc;

use crate::check::{
    append_rows, attend_geometry, bytes_mut, check_layer, read_range, row_elems, zeroed, Incoming,
    Raw, RowsOut, Wide,
};
use crate::{
    BufferId, KvCache, KvDtype, KvElem, KvError, KvShape, KvView, LayoutKind, LentLayer, LentPiece,
    ShareTarget,
};
use mtplx_kernels::attention::{self, RowSource, ATTN_BLOCK};

/// The smallest allocation for a new tail, in positions.
const MIN_TAIL_ROWS: usize = ATTN_BLOCK;

/// Per layer, a list of reference-counted segments of consecutive positions; all are
/// immutable except the last while this cache alone holds it (the tail).
///
/// Shape: layer `l` is segments `s_0, s_1, ..` covering positions `0..len` in order; segment
/// `s` holds `[s.len, kv_heads * head_dim]` K rows and as many V rows in one shared buffer.
/// A tail grows (doubling, from [`ATTN_BLOCK`] rows) up to the next multiple of
/// `segment_tokens` positions and is then sealed, so sealed boundaries fall on multiples of
/// `segment_tokens`.
///
/// A [`KvCache::snapshot`] or [`KvCache::fork`] clones the segment lists: O(segments), no
/// row is copied, not even the tail's. The tail becomes shared by that, so it is sealed in
/// place: the next append (by either side) starts a new segment instead of writing to it.
/// A sealed tail keeps its spare capacity (at most its own length, or [`ATTN_BLOCK`] rows),
/// which [`KvView::physical_bytes`] counts. Truncating into a shared segment shortens this
/// cache's view of it without copying; truncating into a segment this cache owns alone
/// truncates it in place and makes it the tail again.
///
/// Attention runs the shared kernel over the segments in place: one binary search over the
/// layer's segments per segment read, each block of [`ATTN_BLOCK`] keys read as one slice
/// unless it straddles a segment boundary (then row by row).
///
/// # When to use
/// Conversations and agents that snapshot after every turn: a snapshot or restore costs
/// O(segments) and a follow-up turn pays only for its new tokens. Decode attention costs
/// about what [`crate::Contiguous`] does. For many concurrent sequences on one shared
/// memory budget, prefer [`crate::Paged`].
#[derive(Debug, Clone)]
pub struct Segmented<E: KvElem = f32> {
    shape: KvShape,
    segment_tokens: usize,
    layers: Vec<SegLayer<E>>,
}

#[derive(Debug, Clone)]
struct SegLayer<E> {
    /// Invariant: non-empty segments, `segs[0].start == 0`, each starting where the previous
    /// one ends, the last ending at `len`.
    segs: Vec<Segment<E>>,
    len: usize,
}

#[derive(Debug, Clone)]
struct Segment<E> {
    start: usize,
    /// Positions of `rows` this cache uses (the buffer may hold more after a truncate).
    len: usize,
    rows: Arc<Rows<E>>,
}

#[derive(Debug)]
struct Rows<E> {
    k: Vec<E>,
    v: Vec<E>,
}

impl<E: KvElem> Rows<E> {
    /// Room for `need` values in `k` and `v`: doubling, but never past `cap` (the segment's
    /// full size).
    fn reserve_for(&mut self, need: usize, cap: usize) {
        if need > self.k.capacity() {
            let grown = (self.k.capacity() * 2).max(need).min(cap);
            self.k.reserve_exact(grown - self.k.len());
            self.v.reserve_exact(grown - self.v.len());
        }
    }

    fn bytes(&self) -> usize {
        (self.k.capacity() + self.v.capacity()) * size_of::<E>()
    }

    /// Room for `cap` values in K and in V, the first `len` of them zeros (from the
    /// allocator's zeroed pages: no memset).
    fn zeroed(cap: usize, len: usize) -> Rows<E> {
        let buf = || {
            let mut b = zeroed(cap);
            b.truncate(len);
            b
        };
        Rows { k: buf(), v: buf() }
    }
}

/// What a new tail starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NewTail {
    /// No rows: the caller appends them.
    Empty,
    /// As many zeroed rows as the incoming positions it can take: the caller fills them in
    /// place.
    Zeroed,
}

impl<E> Segment<E> {
    fn end(&self) -> usize {
        self.start + self.len
    }
}

impl<E: KvElem> SegLayer<E> {
    /// The tail to write `incoming` rows into and the positions it can still take: the last
    /// segment if this layer alone holds it and it has room, else a new one (holding no
    /// rows or, for [`NewTail::Zeroed`], the zeroed rows it will take; its `len` is 0
    /// either way).
    fn tail(
        &mut self,
        seg_tokens: usize,
        row: usize,
        incoming: usize,
        new: NewTail,
    ) -> (&mut Segment<E>, usize) {
        // A segment ends at the next multiple of `seg_tokens` positions.
        let limit = |start: usize| seg_tokens - start % seg_tokens;
        let writable = match self.segs.last_mut() {
            Some(s) if s.len < limit(s.start) => match Arc::get_mut(&mut s.rows) {
                Some(rows) => {
                    // Drop rows a shared past left beyond this cache's view.
                    rows.k.truncate(s.len * row);
                    rows.v.truncate(s.len * row);
                    true
                }
                None => false,
            },
            _ => false,
        };
        if !writable {
            let room = limit(self.len);
            let cap = incoming.max(MIN_TAIL_ROWS).min(room) * row;
            let rows = match new {
                NewTail::Empty => Rows {
                    k: Vec::with_capacity(cap),
                    v: Vec::with_capacity(cap),
                },
                NewTail::Zeroed => Rows::zeroed(cap, incoming.min(room) * row),
            };
            self.segs.push(Segment {
                start: self.len,
                len: 0,
                rows: Arc::new(rows),
            });
        }
        let s = self.segs.last_mut().expect("a tail exists");
        let room = limit(s.start) - s.len;
        (s, room)
    }
}

struct SegSource<'a, E> {
    segs: &'a [Segment<E>],
    row_len: usize,
}

impl<E> SegSource<'_, E> {
    #[inline]
    fn find(&self, pos: usize) -> &Segment<E> {
        &self.segs[self.segs.partition_point(|s| s.end() <= pos)]
    }
}

impl<E: KvElem> RowSource for SegSource<'_, E> {
    type Elem = E;
    #[inline]
    fn k_row(&self, pos: usize) -> &[E] {
        let s = self.find(pos);
        let o = (pos - s.start) * self.row_len;
        &s.rows.k[o..o + self.row_len]
    }
    #[inline]
    fn v_row(&self, pos: usize) -> &[E] {
        let s = self.find(pos);
        let o = (pos - s.start) * self.row_len;
        &s.rows.v[o..o + self.row_len]
    }
    #[inline]
    fn run(&self, start: usize) -> Option<(&[E], &[E])> {
        let s = self.find(start);
        let r = (start - s.start) * self.row_len..s.len * self.row_len;
        Some((&s.rows.k[r.clone()], &s.rows.v[r]))
    }
}

impl Segmented {
    /// An empty `f32` cache whose segments hold `segment_tokens` positions.
    pub fn new(shape: KvShape, segment_tokens: usize) -> Self {
        Segmented::empty(shape, segment_tokens)
    }
}

impl<E: KvElem> Segmented<E> {
    /// An empty cache of `E` rows whose segments hold `segment_tokens` positions (rounded up
    /// to a multiple of [`ATTN_BLOCK`], so sealed boundaries fall between attention blocks).
    pub fn empty(shape: KvShape, segment_tokens: usize) -> Self {
        Segmented {
            shape,
            segment_tokens: segment_tokens.max(1).next_multiple_of(ATTN_BLOCK),
            layers: (0..shape.layers)
                .map(|_| SegLayer {
                    segs: Vec::new(),
                    len: 0,
                })
                .collect(),
        }
    }

    /// Positions per full segment.
    pub fn segment_tokens(&self) -> usize {
        self.segment_tokens
    }

    /// Segments in `layer` (sealed ones and the tail).
    pub fn segment_count(&self, layer: usize) -> usize {
        self.layers.get(layer).map_or(0, |l| l.segs.len())
    }

    fn layer(&self, layer: usize) -> Result<&SegLayer<E>, KvError> {
        check_layer(self.shape, layer)?;
        Ok(&self.layers[layer])
    }

    fn segments(&self) -> impl Iterator<Item = &Segment<E>> {
        self.layers.iter().flat_map(|l| l.segs.iter())
    }

    /// [`KvCache::append`] and [`KvCache::append_stored`].
    fn append_incoming(
        &mut self,
        layer: usize,
        k: Incoming<'_>,
        v: Incoming<'_>,
    ) -> Result<(), KvError> {
        let n = append_rows::<E>(self.shape, layer, k, v)?;
        let (row, seg_tokens) = (row_elems::<E>(self.shape), self.segment_tokens);
        let shape = self.shape;
        let l = &mut self.layers[layer];
        let mut done = 0;
        while done < n {
            let (s, room) = l.tail(seg_tokens, row, n - done, NewTail::Empty);
            let rows = Arc::get_mut(&mut s.rows).expect("the tail is unique");
            let take = room.min(n - done);
            let need = (s.len + take) * row;
            rows.reserve_for(need, (s.len + room) * row);
            k.extend(shape, done..done + take, &mut rows.k);
            v.extend(shape, done..done + take, &mut rows.v);
            s.len += take;
            l.len += take;
            done += take;
        }
        Ok(())
    }

    /// Rows `range` of `l` (checked by the caller) into `out`, segment by segment.
    fn read_into(&self, l: &SegLayer<E>, range: Range<usize>, mut out: impl RowsOut) {
        let row = row_elems::<E>(self.shape);
        let first = l.segs.partition_point(|s| s.end() <= range.start);
        for s in &l.segs[first..] {
            if s.start >= range.end {
                break;
            }
            let (a, b) = (s.start.max(range.start), s.end().min(range.end));
            let src = (a - s.start) * row..(b - s.start) * row;
            out.put(
                (a - range.start) * row,
                &s.rows.k[src.clone()],
                &s.rows.v[src],
            );
        }
    }
}

impl<E: KvElem> KvView for Segmented<E> {
    fn shape(&self) -> KvShape {
        self.shape
    }

    fn layout(&self) -> LayoutKind {
        LayoutKind::Segmented
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

    /// Bytes of every segment buffer this cache references (capacity included), shared
    /// segments included.
    fn physical_bytes(&self) -> usize {
        self.segments().map(|s| s.rows.bytes()).sum()
    }

    /// Bytes of the segments no other cache or snapshot references.
    fn unique_bytes(&self) -> usize {
        self.segments()
            .filter(|s| Arc::strong_count(&s.rows) == 1)
            .map(|s| s.rows.bytes())
            .sum()
    }

    fn visit_buffers(&self, visit: &mut dyn FnMut(BufferId, usize)) {
        for s in self.segments() {
            visit(BufferId::of(&*s.rows), s.rows.bytes());
        }
    }

    /// Shares every segment when `target` is segmented (its `segment_tokens` applies to
    /// the new cache's future segments).
    fn share_into(&self, target: ShareTarget<'_>) -> Option<Box<dyn KvCache>> {
        match target {
            ShareTarget::Segmented { segment_tokens } => {
                let mut c = self.clone();
                c.segment_tokens = Segmented::<E>::empty(self.shape, segment_tokens).segment_tokens;
                Some(Box::new(c))
            }
            _ => None,
        }
    }
}

impl<E: KvElem> KvCache for Segmented<E> {
    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<(), KvError> {
        self.append_incoming(layer, Incoming::Values(k), Incoming::Values(v))
    }

    fn append_stored(&mut self, layer: usize, k: &[u8], v: &[u8]) -> Result<(), KvError> {
        self.append_incoming(layer, Incoming::Stored(k), Incoming::Stored(v))
    }

    /// One piece per segment the new positions go to: the tail while this cache alone
    /// holds it and it has room, then new segments, sealed at the same boundaries as
    /// [`KvCache::append`] seals them.
    fn append_in_place(&mut self, n: usize) -> Option<Vec<LentLayer<'_>>> {
        let (row, seg_tokens) = (row_elems::<E>(self.shape), self.segment_tokens);
        let lent = self
            .layers
            .iter_mut()
            .map(|l| {
                let start = l.len;
                let mut done = 0;
                while done < n {
                    let (s, room) = l.tail(seg_tokens, row, n - done, NewTail::Zeroed);
                    let rows = Arc::get_mut(&mut s.rows).expect("the tail is unique");
                    let take = room.min(n - done);
                    let need = (s.len + take) * row;
                    rows.reserve_for(need, (s.len + room) * row);
                    // A new tail already holds its zeroed rows; an old one grows by them.
                    rows.k.resize(need, E::default());
                    rows.v.resize(need, E::default());
                    s.len += take;
                    l.len += take;
                    done += take;
                }
                let first = l.segs.partition_point(|s| s.end() <= start);
                let pieces = l.segs[first..]
                    .iter_mut()
                    .filter(|s| s.len > 0)
                    .map(|s| {
                        let positions = start.max(s.start)..s.end();
                        let from = (positions.start - s.start) * row;
                        let rows = Arc::get_mut(&mut s.rows).expect("written just now");
                        LentPiece {
                            positions,
                            k: bytes_mut(&mut rows.k[from..]),
                            v: bytes_mut(&mut rows.v[from..]),
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
        let src = SegSource {
            segs: &l.segs,
            row_len: row_elems::<E>(self.shape),
        };
        attention::attend(&src, q, g, out);
        Ok(())
    }

    fn truncate(&mut self, len: usize) {
        let row = row_elems::<E>(self.shape);
        for l in &mut self.layers {
            if l.len <= len {
                continue;
            }
            l.len = len;
            while l.segs.last().is_some_and(|s| s.start >= len) {
                l.segs.pop();
            }
            if let Some(s) = l.segs.last_mut() {
                s.len = len - s.start;
                if let Some(rows) = Arc::get_mut(&mut s.rows) {
                    rows.k.truncate(s.len * row);
                    rows.v.truncate(s.len * row);
                }
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

    fn read(c: &dyn KvView, range: Range<usize>) -> Vec<f32> {
        let n = range.len() * 2;
        let (mut k, mut v) = (vec![0.0; n], vec![0.0; n]);
        c.read_rows(0, range, &mut k, &mut v).unwrap();
        k
    }

    #[test]
    fn seals_at_segment_boundaries() {
        let mut c = Segmented::new(shape(), 16);
        c.append(0, &rows(40, 0.0), &rows(40, 0.0)).unwrap();
        assert_eq!(c.segment_count(0), 3);
        let starts: Vec<_> = c.layers[0].segs.iter().map(|s| (s.start, s.len)).collect();
        assert_eq!(starts, [(0, 16), (16, 16), (32, 8)]);
        assert_eq!(read(&c, 10..20), rows(40, 0.0)[20..40]);
    }

    #[test]
    fn snapshot_seals_the_tail_without_copying() {
        let mut c = Segmented::new(shape(), 64);
        c.append(0, &rows(10, 0.0), &rows(10, 0.0)).unwrap();
        let before = c.physical_bytes();
        let snap = c.snapshot();
        assert_eq!(
            footprint_of(&c, &*snap),
            before,
            "the snapshot copied nothing"
        );
        c.append(0, &rows(1, 99.0), &rows(1, 99.0)).unwrap();
        assert_eq!(c.segment_count(0), 2, "the shared tail was sealed");
        assert_eq!(read(&*snap, 0..10), rows(10, 0.0));
        drop(snap);
        // Alone again: truncating into the first segment makes it the tail.
        c.truncate(5);
        assert_eq!(c.segment_count(0), 1);
        c.append(0, &rows(1, 7.0), &rows(1, 7.0)).unwrap();
        assert_eq!(c.segment_count(0), 1);
        assert_eq!(read(&c, 5..6), [7.0, 8.0]);
    }

    #[test]
    fn truncate_into_a_shared_segment_shortens_the_view() {
        let mut c = Segmented::new(shape(), 16);
        c.append(0, &rows(20, 0.0), &rows(20, 0.0)).unwrap();
        let snap = c.snapshot();
        c.truncate(7);
        c.append(0, &rows(3, 50.0), &rows(3, 50.0)).unwrap();
        let segs: Vec<_> = c.layers[0].segs.iter().map(|s| (s.start, s.len)).collect();
        assert_eq!(segs, [(0, 7), (7, 3)]);
        assert_eq!(read(&c, 0..10)[..14], rows(20, 0.0)[..14]);
        assert_eq!(read(&c, 7..10), rows(3, 50.0));
        assert_eq!(read(&*snap, 0..20), rows(20, 0.0));
    }

    #[test]
    fn a_tail_regained_after_its_sharer_drops_overwrites_stale_rows() {
        let mut c = Segmented::new(shape(), 64);
        c.append(0, &rows(10, 0.0), &rows(10, 0.0)).unwrap();
        let fork = c.fork();
        c.truncate(4);
        drop(fork);
        c.append(0, &rows(2, 70.0), &rows(2, 70.0)).unwrap();
        assert_eq!(c.segment_count(0), 1, "the tail is written in place again");
        assert_eq!(read(&c, 4..6), rows(2, 70.0));
    }

    fn footprint_of(a: &dyn KvView, b: &dyn KvView) -> usize {
        crate::footprint(&[a, b])
    }
}
