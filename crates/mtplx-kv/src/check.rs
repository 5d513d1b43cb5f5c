//! Argument checks every layout shares, so all layouts fail the same way on bad input.

use crate::{KvError, KvShape};
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

/// Validates a `read_rows` call over a layer of `len` positions.
pub(crate) fn read_range(
    shape: KvShape,
    len: usize,
    range: &std::ops::Range<usize>,
    k: &[f32],
    v: &[f32],
) -> Result<(), KvError> {
    if range.end > len || range.start > range.end {
        return Err(KvError::RowsOutOfRange {
            start: range.start,
            end: range.end,
            len,
        });
    }
    let n = range.len() * shape.row_len();
    if k.len() != n || v.len() != n {
        return Err(KvError::OutputSize {
            got: k.len().min(v.len()),
            expected: n,
        });
    }
    Ok(())
}
