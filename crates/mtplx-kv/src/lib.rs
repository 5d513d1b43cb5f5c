//! KV-cache layouts for mtplx, behind one narrow trait.
//!
//! A model's attention writes keys and values through [`KvCache`] and asks the cache to
//! attend for a block of queries: the layout owns the attention over its own storage, so a
//! model never knows (or copies) how rows are laid out. A [`CacheFactory`] is how a caller
//! says which layout it wants; restores and conversions build through it, never through a
//! default.
//!
//! | layout | storage | snapshot / fork | use for |
//! | --- | --- | --- | --- |
//! | [`Contiguous`] | one growing buffer per layer | copies the rows | prefill, one sequence |
//! | [`Paged`] | fixed blocks from a shared [`BlockPool`] | shares blocks, copy-on-write | many sequences sharing prefixes |
//! | [`Segmented`] | shared immutable segments + a tail | shares segments, O(segments) | snapshot every turn |
//!
//! Every layout runs the one kernel in [`attention`], which reduces keys in blocks aligned
//! to absolute positions: the output for a query is bit-identical whichever layout holds the
//! rows and however many queries are computed together. [`RecurrentState`] holds the
//! convolution and SSM state of hybrid models, with the same cheap snapshots.
//!
//! This crate must not know about models, tensor libraries, files or HTTP, and does no I/O:
//! it stores `f32` rows and does arithmetic on them.
//!
//! ```
//! use mtplx_kv::{CacheFactory, KvCache, KvShape, KvView};
//!
//! let shape = KvShape { layers: 1, kv_heads: 1, head_dim: 4 };
//! let mut cache = CacheFactory::contiguous().new_cache(shape);
//! // Two positions of one layer: K and V rows of `kv_heads * head_dim` values each.
//! let k = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0];
//! let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
//! cache.append(0, &k, &v).unwrap();
//! // One query (at the newest position) with one head.
//! let mut out = [0.0; 4];
//! cache.attend(0, &[0.0; 4], 1, 1.0, &mut out).unwrap();
//! assert_eq!(out, [3.0, 4.0, 5.0, 6.0]); // equal scores: the mean of the two values
//! assert_eq!(cache.len(), 2);
//!
//! // Convert to the segmented layout: same rows, same attention bits.
//! let segmented = CacheFactory::segmented();
//! let mut turn = segmented.restore(&*cache, cache.len()).unwrap();
//! let mut again = [0.0; 4];
//! turn.attend(0, &[0.0; 4], 1, 1.0, &mut again).unwrap();
//! assert_eq!(again, out);
//!
//! // A snapshot shares the segments; the cache keeps growing without touching it.
//! let snap = turn.snapshot();
//! turn.append(0, &[0.0; 4], &[0.0; 4]).unwrap();
//! assert_eq!((snap.len(), turn.len()), (2, 3));
//! // Restoring the snapshot in the same layout copies no rows.
//! let resumed = segmented.restore(&*snap, snap.len()).unwrap();
//! assert_eq!(resumed.unique_bytes(), 0);
//! ```

pub mod attention;
mod bytes;
mod check;
mod contiguous;
mod error;
mod factory;
mod lend;
mod paged;
pub mod pool;
mod recurrent;
mod segmented;

pub use bytes::{footprint, BufferId};
pub use contiguous::Contiguous;
pub use error::KvError;
pub use factory::{CacheFactory, DeviceCaches, MakeDeviceCache};
pub use lend::{LentLayer, LentPiece};
pub use paged::{BlockPool, Paged, PoolStats};
pub use recurrent::{RecurrentLayerShape, RecurrentSnapshot, RecurrentState};
pub use segmented::Segmented;

use std::ops::Range;
use std::sync::Arc;

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

    /// Bytes that one token costs across all layers, K and V, in `f32`.
    pub fn bytes_per_token(&self) -> usize {
        2 * self.layers * self.row_len() * std::mem::size_of::<f32>()
    }
}

/// Which layout a cache uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayoutKind {
    /// [`Contiguous`]: one growing buffer per layer.
    Contiguous,
    /// [`Paged`]: fixed-size blocks from a shared pool.
    Paged,
    /// [`Segmented`]: shared immutable segments plus a growing tail.
    Segmented,
    /// Rows in an accelerator's memory, in a cache its model backend built
    /// ([`CacheFactory::Device`]); its snapshots are host copies.
    Device,
}

/// A read-only view of stored K/V rows, whatever the layout: what the bank keeps and what
/// the cold tier serialises.
///
/// # Byte accounting
/// [`KvView::physical_bytes`] counts every live buffer this view references, including
/// buffers it shares with other caches or snapshots (a shared block is counted by each
/// holder). [`KvView::unique_bytes`] counts only buffers no one else references: what
/// dropping this view would free. [`footprint`] counts the buffers of several views once
/// each: what they hold together.
pub trait KvView: Send + Sync {
    fn shape(&self) -> KvShape;
    fn layout(&self) -> LayoutKind;
    /// Positions stored in `layer`.
    fn layer_len(&self, layer: usize) -> usize;
    /// Copies rows `range` of `layer` into `k` and `v` (`range.len() * row_len` each).
    fn read_rows(
        &self,
        layer: usize,
        range: Range<usize>,
        k: &mut [f32],
        v: &mut [f32],
    ) -> Result<(), KvError>;
    /// Bytes the stored rows would take packed (`len * bytes_per_token`).
    fn logical_bytes(&self) -> usize;
    /// Bytes of every live buffer this view references, shared ones included.
    fn physical_bytes(&self) -> usize;

    /// Bytes of the live buffers that only this view references.
    fn unique_bytes(&self) -> usize {
        self.physical_bytes()
    }

    /// Calls `visit(id, bytes)` once for each live buffer this view references; views that
    /// share a buffer report the same [`BufferId`]. The bytes visited sum to
    /// [`KvView::physical_bytes`]. By default the view reports itself as one buffer.
    fn visit_buffers(&self, visit: &mut dyn FnMut(BufferId, usize)) {
        visit(BufferId::of(self), self.physical_bytes());
    }

    /// A writable cache in `factory`'s layout that shares this view's storage instead of
    /// copying its rows, when the layout allows it (same layout and, for paged caches, the
    /// same pool). [`CacheFactory::restore`] tries this first.
    fn share_into(&self, factory: &CacheFactory) -> Option<Box<dyn KvCache>> {
        let _ = factory;
        None
    }

    /// Positions stored in every layer (the committed length).
    fn len(&self) -> usize {
        (0..self.shape().layers)
            .map(|l| self.layer_len(l))
            .min()
            .unwrap_or(0)
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A growable KV cache the model writes through.
///
/// A forward pass over `n` new tokens calls, for each layer in order, [`KvCache::append`]
/// with `n` rows and then [`KvCache::attend`] for the `n` queries, which sit at the newest
/// `n` positions of that layer.
pub trait KvCache: KvView {
    /// Appends `k.len() / row_len` positions to `layer`.
    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<(), KvError>;

    /// Appends `n` zeroed positions to every layer and lends their storage, to be filled in
    /// place: one [`LentLayer`] per layer, in layer order, whose pieces cover exactly the
    /// `n` new positions of that layer, in order (a layer kept in several buffers, pages or
    /// segments, lends one piece per buffer). Writing a piece's rows is what
    /// [`KvCache::append`] of the same rows would have stored. A restore reads rows from
    /// disk straight into the pieces.
    ///
    /// Every layout here lends. The default (`None`, nothing appended) is for a layout
    /// whose storage can't be lent as `f32` slices; the caller then uses
    /// [`KvCache::append`].
    fn append_in_place(&mut self, n: usize) -> Option<Vec<LentLayer<'_>>> {
        let _ = n;
        None
    }

    /// Causal attention of `q` (`[n_q, q_heads, head_dim]`, the newest `n_q` positions of
    /// `layer`) over the layer's rows, written to `out` (same shape).
    ///
    /// Every layout runs [`attention::attend`], so the result for a query is bit-identical
    /// whichever layout holds the rows and however many queries are computed with it.
    fn attend(
        &self,
        layer: usize,
        q: &[f32],
        q_heads: usize,
        scale: f32,
        out: &mut [f32],
    ) -> Result<(), KvError>;

    /// Drops every position at or after `len` in every layer (speculative rollback).
    fn truncate(&mut self, len: usize);

    /// The cache as its concrete type, for the model backend that keeps rows in an
    /// accelerator's memory and runs attention there itself. Host layouts return `None`.
    fn device_mut(&mut self) -> Option<&mut dyn std::any::Any> {
        None
    }

    /// A frozen copy-on-write view of the current rows: it never changes when this cache
    /// grows or is truncated.
    fn snapshot(&self) -> Arc<dyn KvView>;

    /// A writable copy of this cache in the same layout that shares what the layout can
    /// share: paged and segmented forks reference the same blocks or segments and pay only
    /// for their own new tokens; a contiguous fork copies the rows.
    fn fork(&self) -> Box<dyn KvCache>;
}
