//! Argument checks every layout shares, so all layouts fail the same way on bad input.

use std::ops::Range;

use crate::{KvElem, KvError, KvShape};
use mtplx_kernels::attention::{AttnGeometry, MAX_HEAD_DIM};

/// The number of whole rows of `row_len` in `got` values.
pub(crate) fn check_rows(what: &'static str, got: usize, row_len: usize) -> Result<usize, KvError> {
    if !got.is_multiple_of(row_len) {
        return Err(KvError::RaggedRows { what, got, row_len });
    }
    Ok(got / row_len)
}

/// Rows arriving to be appended: `f32` values, rounded once to the stored type
/// ([`crate::KvCache::append`]), or stored bytes, kept as they are
/// ([`crate::KvCache::append_stored`]).
#[derive(Clone, Copy)]
pub(crate) enum Incoming<'a> {
    Values(&'a [f32]),
    Stored(&'a [u8]),
}

impl Incoming<'_> {
    /// Units (values or bytes) one row of `shape` takes here when stored as `E`.
    fn per_row<E: KvElem>(self, shape: KvShape) -> usize {
        match self {
            Incoming::Values(_) => shape.row_len(),
            Incoming::Stored(_) => E::DTYPE.bytes(shape.row_len()),
        }
    }

    fn units(self) -> usize {
        match self {
            Incoming::Values(x) => x.len(),
            Incoming::Stored(b) => b.len(),
        }
    }

    /// Writes rows `rows` of the incoming ones (rows of `shape`) into `dst`, which holds
    /// exactly their elements.
    #[inline]
    pub(crate) fn write<E: KvElem>(self, shape: KvShape, rows: Range<usize>, dst: &mut [E]) {
        let per = self.per_row::<E>(shape);
        let span = rows.start * per..rows.end * per;
        match self {
            Incoming::Values(x) => E::narrow(&x[span], dst),
            Incoming::Stored(b) => bytemuck::cast_slice_mut::<E, u8>(dst).copy_from_slice(&b[span]),
        }
    }

    /// `dst` extended by rows `rows` of the incoming ones.
    #[inline]
    pub(crate) fn extend<E: KvElem>(self, shape: KvShape, rows: Range<usize>, dst: &mut Vec<E>) {
        let at = dst.len();
        dst.resize(at + rows.len() * row_elems::<E>(shape), E::default());
        self.write(shape, rows, &mut dst[at..]);
    }
}

/// The number of rows an append of `k` and `v` (both values, or both stored bytes of `E`)
/// brings to `layer`.
pub(crate) fn append_rows<E: KvElem>(
    shape: KvShape,
    layer: usize,
    k: Incoming<'_>,
    v: Incoming<'_>,
) -> Result<usize, KvError> {
    check_layer(shape, layer)?;
    let row = k.per_row::<E>(shape);
    let nk = check_rows("K", k.units(), row)?;
    let nv = check_rows("V", v.units(), row)?;
    if nk != nv {
        return Err(KvError::KvRowMismatch { k: nk, v: nv });
    }
    Ok(nk)
}

pub(crate) fn check_layer(shape: KvShape, layer: usize) -> Result<(), KvError> {
    if layer >= shape.layers {
        return Err(KvError::LayerOutOfRange {
            layer,
            layers: shape.layers,
        });
    }
    Ok(())
}

/// Validates an attention call over a layer of `len` positions and returns its geometry.
pub(crate) fn attend_geometry(
    shape: KvShape,
    len: usize,
    q: &[f32],
    q_heads: usize,
    scale: f32,
    out: &[f32],
) -> Result<AttnGeometry, KvError> {
    let KvShape {
        kv_heads, head_dim, ..
    } = shape;
    if head_dim > MAX_HEAD_DIM {
        return Err(KvError::HeadDimTooLarge(head_dim));
    }
    if q_heads == 0 || !q_heads.is_multiple_of(kv_heads) {
        return Err(KvError::HeadMismatch { q_heads, kv_heads });
    }
    let n_q = check_rows("Q", q.len(), q_heads * head_dim)?;
    if out.len() != q.len() {
        return Err(KvError::OutputSize {
            got: out.len(),
            expected: q.len(),
        });
    }
    if n_q > len {
        return Err(KvError::TooManyQueries { n_q, len });
    }
    Ok(AttnGeometry {
        q_heads,
        kv_heads,
        head_dim,
        first_pos: len - n_q,
        scale,
    })
}

/// Validates a `read_rows` (`T = f32`, `per_row` the row's values) or `read_raw` (`T = u8`,
/// `per_row` the row's stored bytes) call over a layer of `len` positions.
pub(crate) fn read_range<T>(
    len: usize,
    range: &std::ops::Range<usize>,
    k: &[T],
    v: &[T],
    per_row: usize,
) -> Result<(), KvError> {
    if range.end > len || range.start > range.end {
        return Err(KvError::RowsOutOfRange {
            start: range.start,
            end: range.end,
            len,
        });
    }
    let n = range.len() * per_row;
    if k.len() != n || v.len() != n {
        return Err(KvError::OutputSize {
            got: k.len().min(v.len()),
            expected: n,
        });
    }
    Ok(())
}

/// Copies stored rows out: widened to `f32` (`read_rows`), or as their bytes (`read_raw`).
/// `at` counts elements of `E` from the first row read.
pub(crate) trait RowsOut {
    fn put<E: KvElem>(&mut self, at: usize, k: &[E], v: &[E]);
}

/// `read_rows`'s destination: rows from element `at` on, widened.
pub(crate) struct Wide<'a>(pub &'a mut [f32], pub &'a mut [f32]);

impl RowsOut for Wide<'_> {
    #[inline]
    fn put<E: KvElem>(&mut self, at: usize, k: &[E], v: &[E]) {
        let (at, kn, vn) = (at * E::GROUP, k.len() * E::GROUP, v.len() * E::GROUP);
        E::widen(k, &mut self.0[at..at + kn]);
        E::widen(v, &mut self.1[at..at + vn]);
    }
}

/// `read_raw`'s destination: rows from element `at` on, as stored bytes.
pub(crate) struct Raw<'a>(pub &'a mut [u8], pub &'a mut [u8]);

impl RowsOut for Raw<'_> {
    #[inline]
    fn put<E: KvElem>(&mut self, at: usize, k: &[E], v: &[E]) {
        let (kb, vb): (&[u8], &[u8]) = (bytemuck::cast_slice(k), bytemuck::cast_slice(v));
        let at = at * std::mem::size_of::<E>();
        self.0[at..at + kb.len()].copy_from_slice(kb);
        self.1[at..at + vb.len()].copy_from_slice(vb);
    }
}

/// Elements of `E` in one K (or V) row of `shape` (its values, or their groups).
#[inline]
pub(crate) fn row_elems<E: KvElem>(shape: KvShape) -> usize {
    shape.row_len() / E::GROUP
}

/// `n` zeros, from the allocator's zeroed pages (no memset).
pub(crate) fn zeroed<E: KvElem>(n: usize) -> Vec<E> {
    bytemuck::zeroed_vec(n)
}

/// Stored rows lent as bytes ([`crate::LentPiece`]).
pub(crate) fn bytes_mut<E: KvElem>(rows: &mut [E]) -> &mut [u8] {
    bytemuck::cast_slice_mut(rows)
}
