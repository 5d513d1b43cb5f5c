//! [`Contiguous`]: per-layer K and V buffers grown in chunks; the simplest layout, and the
//! one a prefill writes fastest into.

use std::mem::size_of;
use std::ops::Range;
use std::sync::Arc;

use crate::check::{
    append_rows, attend_geometry, bytes_mut, check_layer, read_range, row_elems, zeroed, Incoming,
    Raw, RowsOut, Wide,
};
use crate::{
    BufferId, KvCache, KvDtype, KvElem, KvError, KvShape, KvView, LayoutKind, LentLayer, LentPiece,
};
use mtplx_kernels::attention::{self, RowSource};

/// Per-layer contiguous K and V buffers, grown in chunks of positions.
///
/// Shape: for each layer, `k` and `v` are `[len, kv_heads * head_dim]` row-major buffers of
/// `E` (`f32` by default; [`crate::f16`], [`crate::bf16`]). When a buffer is full it grows to 1.5 times its capacity (or to what the append
/// needs, if more), rounded up to a multiple of `chunk_tokens` positions; truncation keeps
/// the capacity.
///
/// # When to use
/// The prefill layout and the simplest decode layout: rows of a layer sit back to back, so
/// appends are a memcpy and attention streams memory in order. A snapshot or fork copies
/// the rows (cost grows with context); use [`crate::Segmented`] when snapshots must be
/// cheap, or [`crate::Paged`] when many sequences share prefixes.
#[derive(Debug, Clone)]
pub struct Contiguous<E: KvElem = f32> {
    shape: KvShape,
    chunk_tokens: usize,
    layers: Vec<LayerRows<E>>,
}

#[derive(Debug, Clone, Default)]
struct LayerRows<E> {
    k: Vec<E>,
    v: Vec<E>,
    len: usize,
}

impl<E: KvElem> LayerRows<E> {
    /// Cuts the buffers to the live rows and makes room for `n` more, growing by half
    /// again (at least to what is needed) in whole chunks of `chunk` positions: amortised
    /// O(1) per row, where growing by one chunk at a time would recopy the layer every chunk.
    fn make_room(&mut self, n: usize, row: usize, chunk: usize) {
        let chunk = chunk * row;
        let live = self.len * row;
        let need = live + n * row;
        if need > self.k.capacity() {
            let target = need.max(self.k.capacity() * 3 / 2).div_ceil(chunk) * chunk;
            self.k.reserve_exact(target - self.k.len());
            self.v.reserve_exact(target - self.v.len());
        }
        self.k.truncate(live);
        self.v.truncate(live);
    }
}

struct LayerSource<'a, E> {
    rows: &'a LayerRows<E>,
    row_len: usize,
}

impl<E: KvElem> RowSource for LayerSource<'_, E> {
    type Elem = E;
    #[inline]
    fn k_row(&self, pos: usize) -> &[E] {
        &self.rows.k[pos * self.row_len..(pos + 1) * self.row_len]
    }
    #[inline]
    fn v_row(&self, pos: usize) -> &[E] {
        &self.rows.v[pos * self.row_len..(pos + 1) * self.row_len]
    }
    #[inline]
    fn run(&self, start: usize) -> Option<(&[E], &[E])> {
        let r = start * self.row_len..self.rows.len * self.row_len;
        Some((&self.rows.k[r.clone()], &self.rows.v[r]))
    }
}

impl Contiguous {
    /// An empty `f32` cache whose buffers grow by `chunk_tokens` positions at a time.
    pub fn new(shape: KvShape, chunk_tokens: usize) -> Self {
        Contiguous::empty(shape, chunk_tokens)
    }
}

impl<E: KvElem> Contiguous<E> {
    /// An empty cache of `E` rows whose buffers grow by `chunk_tokens` positions at a time.
    pub fn empty(shape: KvShape, chunk_tokens: usize) -> Self {
        Contiguous {
            shape,
            chunk_tokens: chunk_tokens.max(1),
            layers: (0..shape.layers)
                .map(|_| LayerRows {
                    k: Vec::new(),
                    v: Vec::new(),
                    len: 0,
                })
                .collect(),
        }
    }

    fn layer(&self, layer: usize) -> Result<&LayerRows<E>, KvError> {
        check_layer(self.shape, layer)?;
        Ok(&self.layers[layer])
    }

    /// A copy holding exactly the live rows, with no spare capacity.
    fn compact(&self) -> Contiguous<E> {
        let row = row_elems::<E>(self.shape);
        let layers = self
            .layers
            .iter()
            .map(|l| LayerRows {
                k: l.k[..l.len * row].to_vec(),
                v: l.v[..l.len * row].to_vec(),
                len: l.len,
            })
            .collect();
        Contiguous {
            shape: self.shape,
            chunk_tokens: self.chunk_tokens,
            layers,
        }
    }

    /// [`KvCache::append`] and [`KvCache::append_stored`].
    fn append_incoming(
        &mut self,
        layer: usize,
        k: Incoming<'_>,
        v: Incoming<'_>,
    ) -> Result<(), KvError> {
        let n = append_rows::<E>(self.shape, layer, k, v)?;
        let (row, chunk) = (row_elems::<E>(self.shape), self.chunk_tokens);
        let rows = &mut self.layers[layer];
        rows.make_room(n, row, chunk);
        k.extend(self.shape, 0..n, &mut rows.k);
        v.extend(self.shape, 0..n, &mut rows.v);
        rows.len += n;
        Ok(())
    }

    /// Rows `range` of `layer`, checked, into `out`.
    fn read_into(
        &self,
        layer: usize,
        range: Range<usize>,
        mut out: impl RowsOut,
    ) -> Result<(), KvError> {
        let rows = self.layer(layer)?;
        let row = row_elems::<E>(self.shape);
        let span = range.start * row..range.end * row;
        out.put(0, &rows.k[span.clone()], &rows.v[span]);
        Ok(())
    }
}

impl<E: KvElem> KvView for Contiguous<E> {
    fn shape(&self) -> KvShape {
        self.shape
    }

    fn layout(&self) -> LayoutKind {
        LayoutKind::Contiguous
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
        read_range(self.layer(layer)?.len, &range, k, v, self.shape.row_len())?;
        self.read_into(layer, range, Wide(k, v))
    }

    fn read_raw(
        &self,
        layer: usize,
        range: Range<usize>,
        k: &mut [u8],
        v: &mut [u8],
    ) -> Result<(), KvError> {
        let len = self.layer(layer)?.len;
        read_range(len, &range, k, v, E::DTYPE.bytes(self.shape.row_len()))?;
        self.read_into(layer, range, Raw(k, v))
    }

    fn physical_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| (l.k.capacity() + l.v.capacity()) * size_of::<E>())
            .sum()
    }

    fn visit_buffers(&self, visit: &mut dyn FnMut(BufferId, usize)) {
        for l in &self.layers {
            for buf in [&l.k, &l.v] {
                if buf.capacity() > 0 {
                    visit(
                        BufferId::of(buf.as_slice()),
                        buf.capacity() * size_of::<E>(),
                    );
                }
            }
        }
    }
}

impl<E: KvElem> KvCache for Contiguous<E> {
    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<(), KvError> {
        self.append_incoming(layer, Incoming::Values(k), Incoming::Values(v))
    }

    fn append_stored(&mut self, layer: usize, k: &[u8], v: &[u8]) -> Result<(), KvError> {
        self.append_incoming(layer, Incoming::Stored(k), Incoming::Stored(v))
    }

    /// One piece per layer: the new rows sit after the old ones in the layer's buffers.
    fn append_in_place(&mut self, n: usize) -> Option<Vec<LentLayer<'_>>> {
        let (row, chunk) = (row_elems::<E>(self.shape), self.chunk_tokens);
        let lent = self
            .layers
            .iter_mut()
            .map(|rows| {
                let live = rows.len * row;
                if rows.k.capacity() == 0 {
                    // A fresh layer: zeroed pages straight from the allocator, no memset.
                    let target = (n * row).div_ceil(chunk * row) * chunk * row;
                    rows.k = zeroed(target);
                    rows.v = zeroed(target);
                    rows.k.truncate(n * row);
                    rows.v.truncate(n * row);
                } else {
                    rows.make_room(n, row, chunk);
                    rows.k.resize(live + n * row, E::default());
                    rows.v.resize(live + n * row, E::default());
                }
                let positions = rows.len..rows.len + n;
                rows.len += n;
                LentLayer {
                    pieces: vec![LentPiece {
                        positions,
                        k: bytes_mut(&mut rows.k[live..]),
                        v: bytes_mut(&mut rows.v[live..]),
                    }],
                }
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
        let rows = self.layer(layer)?;
        let g = attend_geometry(self.shape, rows.len, q, q_heads, scale, out)?;
        let src = LayerSource {
            rows,
            row_len: row_elems::<E>(self.shape),
        };
        attention::attend(&src, q, g, out);
        Ok(())
    }

    fn truncate(&mut self, len: usize) {
        let row = row_elems::<E>(self.shape);
        for l in &mut self.layers {
            if l.len > len {
                l.len = len;
                l.k.truncate(len * row);
                l.v.truncate(len * row);
            }
        }
    }

    fn snapshot(&self) -> Arc<dyn KvView> {
        Arc::new(self.compact())
    }

    fn fork(&self) -> Box<dyn KvCache> {
        Box::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::f16;

    fn shape() -> KvShape {
        KvShape {
            layers: 2,
            kv_heads: 1,
            head_dim: 2,
        }
    }

    #[test]
    fn grows_in_chunks_and_accounts_bytes() {
        let mut c = Contiguous::new(shape(), 4);
        c.append(0, &[1.0; 6], &[2.0; 6]).unwrap();
        c.append(1, &[1.0; 6], &[2.0; 6]).unwrap();
        assert_eq!(c.len(), 3);
        assert_eq!(c.logical_bytes(), 3 * shape().bytes_per_token(KvDtype::F32));
        // One chunk of 4 positions per layer, K and V.
        assert_eq!(c.physical_bytes(), 2 * 2 * 4 * 2 * 4);
    }

    #[test]
    fn grows_geometrically_in_whole_chunks() {
        let mut c = Contiguous::new(shape(), 4);
        let mut capacities = vec![];
        for _ in 0..1000 {
            c.append(0, &[1.0; 2], &[2.0; 2]).unwrap();
            let cap = c.layers[0].k.capacity() / 2;
            assert_eq!(cap % 4, 0, "whole chunks");
            if capacities.last() != Some(&cap) {
                capacities.push(cap);
            }
        }
        // 1000 rows in 4-row chunks: 250 growths one chunk at a time, a handful by 1.5x.
        assert!(capacities.len() <= 16, "{capacities:?}");
        assert!(*capacities.last().unwrap() < 1500);
    }

    #[test]
    fn rows_written_in_place_read_back_like_appended_ones() {
        let mut a = Contiguous::new(shape(), 4);
        let mut b = Contiguous::new(shape(), 4);
        for round in 0..2 {
            // 3 positions of 2 values per layer, then (second round) 3 more after them.
            let val = |l: usize, i: usize, v: bool| {
                (round * 100 + l * 10 + i) as f32 + v as u8 as f32 * 0.5
            };
            let lent = a.append_in_place(3).expect("contiguous lends its rows");
            assert_eq!(lent.len(), 2);
            for (l, mut layer) in lent.into_iter().enumerate() {
                let [piece] = &mut layer.pieces[..] else {
                    panic!("one piece per layer");
                };
                assert_eq!(piece.positions, round * 3..round * 3 + 3);
                assert_eq!((piece.k.len(), piece.v.len()), (24, 24), "6 f32 each");
                let k: Vec<f32> = (0..6).map(|i| val(l, i, false)).collect();
                let v: Vec<f32> = (0..6).map(|i| val(l, i, true)).collect();
                piece.fill::<f32>(&k, &v);
            }
            for l in 0..2 {
                let k: Vec<f32> = (0..6).map(|i| val(l, i, false)).collect();
                let v: Vec<f32> = (0..6).map(|i| val(l, i, true)).collect();
                b.append(l, &k, &v).unwrap();
            }
        }
        assert_eq!(a.len(), 6);
        for l in 0..2 {
            let (mut ka, mut va, mut kb, mut vb) = ([0.0; 12], [0.0; 12], [0.0; 12], [0.0; 12]);
            a.read_rows(l, 0..6, &mut ka, &mut va).unwrap();
            b.read_rows(l, 0..6, &mut kb, &mut vb).unwrap();
            assert_eq!((ka, va), (kb, vb));
        }
        // Whole chunks, as for appends.
        assert_eq!(a.layers[0].k.capacity() % (4 * 2), 0);
    }

    #[test]
    fn half_rows_take_half_the_bytes_and_read_back_rounded() {
        let mut c = Contiguous::<f16>::empty(shape(), 4);
        let k = [1.0, 1.0 + 1.0 / 4096.0, 3.0e5, -2.5, 0.1, 7.0];
        for l in 0..2 {
            c.append(l, &k, &k).unwrap();
        }
        assert_eq!(c.dtype(), KvDtype::F16);
        assert_eq!(c.logical_bytes(), 3 * shape().bytes_per_token(KvDtype::F16));
        assert_eq!(
            c.logical_bytes() * 2,
            3 * shape().bytes_per_token(KvDtype::F32)
        );
        let (mut rk, mut rv) = ([0.0; 6], [0.0; 6]);
        c.read_rows(1, 0..3, &mut rk, &mut rv).unwrap();
        let rounded = k.map(|x| <f16 as mtplx_kernels::elem::FloatElem>::from_f32(x).to_f32());
        assert_eq!(rk, rounded);
        assert_eq!(rk[2], 65504.0, "saturated");
        assert_ne!(rk[4], 0.1, "rounded once, when stored");
        // The raw bytes are the halves themselves.
        let (mut bk, mut bv) = ([0u8; 12], [0u8; 12]);
        c.read_raw(1, 0..3, &mut bk, &mut bv).unwrap();
        let halves: Vec<u8> = k
            .iter()
            .flat_map(|&x| <f16 as mtplx_kernels::elem::FloatElem>::from_f32(x).to_le_bytes())
            .collect();
        assert_eq!(&bk[..], &halves[..]);
        assert!(matches!(
            c.read_raw(1, 0..3, &mut [0u8; 24], &mut [0u8; 24]),
            Err(KvError::OutputSize { .. })
        ));
    }

    #[test]
    fn snapshot_survives_truncate_and_growth() {
        let mut c = Contiguous::new(shape(), 4);
        for l in 0..2 {
            c.append(l, &[1.0, 2.0, 3.0, 4.0], &[5.0, 6.0, 7.0, 8.0])
                .unwrap();
        }
        let snap = c.snapshot();
        c.truncate(1);
        for l in 0..2 {
            c.append(l, &[9.0, 9.0], &[9.0, 9.0]).unwrap();
        }
        let (mut k, mut v) = ([0.0; 4], [0.0; 4]);
        snap.read_rows(1, 0..2, &mut k, &mut v).unwrap();
        assert_eq!(k, [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(v, [5.0, 6.0, 7.0, 8.0]);
        assert_eq!(snap.physical_bytes(), snap.logical_bytes());
    }

    #[test]
    fn rejects_bad_input() {
        let mut c = Contiguous::new(shape(), 4);
        assert!(matches!(
            c.append(0, &[1.0; 3], &[1.0; 3]),
            Err(KvError::RaggedRows { .. })
        ));
        assert!(matches!(
            c.append(5, &[1.0; 2], &[1.0; 2]),
            Err(KvError::LayerOutOfRange { .. })
        ));
        let mut out = [0.0; 2];
        assert!(matches!(
            c.attend(0, &[1.0; 2], 1, 1.0, &mut out),
            Err(KvError::TooManyQueries { .. })
        ));
    }
}
