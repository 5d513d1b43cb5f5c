//! [`KvError`]: the one error type of the KV layouts.

use thiserror::Error;

/// Everything that can go wrong inside a KV layout.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum KvError {
    #[error("layer {layer} is out of range: the cache has {layers} layers")]
    LayerOutOfRange { layer: usize, layers: usize },
    #[error("{what} has {got} values, which is not a whole number of rows of {row_len}")]
    RaggedRows {
        what: &'static str,
        got: usize,
        row_len: usize,
    },
    #[error("K has {k} rows but V has {v}")]
    KvRowMismatch { k: usize, v: usize },
    #[error("{n_q} queries attend over a layer that holds only {len} positions")]
    TooManyQueries { n_q: usize, len: usize },
    #[error("{q_heads} query heads cannot share {kv_heads} KV heads")]
    HeadMismatch { q_heads: usize, kv_heads: usize },
    #[error("output buffer has {got} values, expected {expected}")]
    OutputSize { got: usize, expected: usize },
    #[error("rows {start}..{end} requested from a layer of {len} positions")]
    RowsOutOfRange {
        start: usize,
        end: usize,
        len: usize,
    },
    #[error("shape mismatch: cache is {cache:?}, source is {source_shape:?}")]
    ShapeMismatch {
        cache: crate::KvShape,
        source_shape: crate::KvShape,
    },
    #[error("head_dim {0} is larger than the supported maximum of {max}", max = mtplx_kernels::attention::MAX_HEAD_DIM)]
    HeadDimTooLarge(usize),
    #[error("the recurrent state's layer shapes differ from the model's")]
    RecurrentShapeMismatch,
    #[error("{kv} K/V positions but a recurrent state after {recurrent} tokens")]
    StateLengthMismatch { kv: usize, recurrent: usize },
    #[error("rows stored as {source_dtype} cannot be copied as bytes into a {cache} cache")]
    DtypeMismatch {
        cache: crate::KvDtype,
        source_dtype: crate::KvDtype,
    },
    #[error("{dtype} K/V stores groups of {group} values, which heads of {head_dim} values do not divide into")]
    HeadNotWholeGroups {
        dtype: crate::KvDtype,
        head_dim: usize,
        group: usize,
    },
    #[error("this device's caches do not store {0} K/V")]
    DeviceDtype(crate::KvDtype),
    #[error("rows at bytes {start}..{end} of a staging buffer of {len}")]
    StagedRange {
        start: usize,
        end: usize,
        len: usize,
    },
    /// A cache in an accelerator's memory failed to copy or compute.
    #[error("device: {0}")]
    Device(String),
}
