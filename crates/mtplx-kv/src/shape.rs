//! [`KvShape`] and [`LayoutKind`]: a model's KV geometry and the name of a layout.

use crate::KvDtype;

/// The geometry of a model's KV state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvShape {
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl KvShape {
    /// Values in one K (or V) row: all KV heads of one position.
    pub fn row_len(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Bytes that one token costs across all layers, K and V, stored as `dtype`.
    pub fn bytes_per_token(&self, dtype: KvDtype) -> usize {
        2 * self.layers * dtype.bytes(self.row_len())
    }
}

/// Which layout a cache uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayoutKind {
    /// [`Contiguous`](crate::Contiguous): one growing buffer per layer.
    Contiguous,
    /// [`Paged`](crate::Paged): fixed-size blocks from a shared pool.
    Paged,
    /// [`Segmented`](crate::Segmented): shared immutable segments plus a growing tail.
    Segmented,
    /// Rows in an accelerator's memory, in a cache its model backend built
    /// ([`crate::CacheFactory::Device`]); its snapshots are host copies.
    Device,
}
