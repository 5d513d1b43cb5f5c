//! Argument checks every layout shares, so all layouts fail the same way on bad input.

use crate::{KvElem, KvError, KvShape};
use mtplx_kernels::attention::{AttnGeometry, MAX_HEAD_DIM};

/// The number of whole rows of `row_len` in `got` values.
pub(crate) fn check_rows(what: &'static str, got: usize, row_len: usize) -> Result<usize, KvError> {
    if !got.is_multiple_of(row_len) {
        return Err(KvError::RaggedRows { what, got, row_len });
    }
    Ok(got / row_len)
}

/// The number of rows an append of `k` and `v` brings to `layer`.
pub(crate) fn append_rows(
    shape: KvShape,
    layer: usize,
    k: &[f32],
    v: &[f32],
) -> Result<usize, KvError> {
    check_layer(shape, layer)?;
    let row = shape.row_len();
    let nk = check_rows("K", k.len(), row)?;
    let nv = check_rows("V", v.len(), row)?;
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

/// Validates a `read_rows` (`T = f32`) or `read_raw` (`T = u8`, `unit` bytes a value) call
/// over a layer of `len` positions.
pub(crate) fn read_range<T>(
    shape: KvShape,
    len: usize,
    range: &std::ops::Range<usize>,
    k: &[T],
    v: &[T],
    unit: usize,
) -> Result<(), KvError> {
    if range.end > len || range.start > range.end {
        return Err(KvError::RowsOutOfRange {
            start: range.start,
            end: range.end,
            len,
        });
    }
    let n = range.len() * shape.row_len() * unit;
    if k.len() != n || v.len() != n {
        return Err(KvError::OutputSize {
            got: k.len().min(v.len()),
            expected: n,
        });
    }
    Ok(())
}

/// Copies stored rows out: widened to `f32` (`read_rows`), or as their bytes (`read_raw`).
pub(crate) trait RowsOut {
    fn put<E: KvElem>(&mut self, at: usize, k: &[E], v: &[E]);
}

/// `read_rows`'s destination: rows from value `at` on, widened.
pub(crate) struct Wide<'a>(pub &'a mut [f32], pub &'a mut [f32]);

impl RowsOut for Wide<'_> {
    #[inline]
    fn put<E: KvElem>(&mut self, at: usize, k: &[E], v: &[E]) {
        E::widen(k, &mut self.0[at..at + k.len()]);
        E::widen(v, &mut self.1[at..at + v.len()]);
    }
}

/// `read_raw`'s destination: rows from value `at` on, as stored bytes.
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

/// `dst` extended by `src`, each value rounded to `E` once.
#[inline]
pub(crate) fn extend_narrowed<E: KvElem>(dst: &mut Vec<E>, src: &[f32]) {
    dst.extend(src.iter().map(|&x| E::from_f32(x)));
}

/// `n` zeros, from the allocator's zeroed pages (no memset).
pub(crate) fn zeroed<E: KvElem>(n: usize) -> Vec<E> {
    bytemuck::zeroed_vec(n)
}

/// Stored rows lent as bytes ([`crate::LentPiece`]).
pub(crate) fn bytes_mut<E: KvElem>(rows: &mut [E]) -> &mut [u8] {
    bytemuck::cast_slice_mut(rows)
}
