//! The seam every layout implements: [`KvView`] (read-only rows: what the bank keeps and the
//! cold tier serialises) and [`KvCache`] (the cache a model writes through), and
//! [`footprint`], the bytes several views hold together.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use crate::bytes::BufferId;
use crate::error::KvError;
use crate::lend::{staged_part, LentLayer, StagingBuffer};
use crate::shape::{KvShape, LayoutKind};
use crate::share::ShareTarget;
use crate::KvDtype;

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
    /// The element type the rows are stored in.
    fn dtype(&self) -> KvDtype;
    /// Positions stored in `layer`.
    fn layer_len(&self, layer: usize) -> usize;
    /// Copies rows `range` of `layer` into `k` and `v` (`range.len() * row_len` each),
    /// widened to `f32` (exactly: the values attention reads).
    fn read_rows(
        &self,
        layer: usize,
        range: Range<usize>,
        k: &mut [f32],
        v: &mut [f32],
    ) -> Result<(), KvError>;
    /// Copies rows `range` of `layer` into `k` and `v` as stored: the bytes of
    /// [`KvView::dtype`] values (`range.len() * dtype.bytes(row_len)` each), what the SSD
    /// tier writes and [`KvCache::append_in_place`] lends back.
    fn read_raw(
        &self,
        layer: usize,
        range: Range<usize>,
        k: &mut [u8],
        v: &mut [u8],
    ) -> Result<(), KvError>;
    /// Bytes the stored rows take packed: every layer's positions, K and V, in
    /// [`KvView::dtype`].
    fn logical_bytes(&self) -> usize {
        let shape = self.shape();
        let per_row = 2 * self.dtype().bytes(shape.row_len());
        (0..shape.layers).map(|l| self.layer_len(l) * per_row).sum()
    }
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

    /// A writable cache in the `target` layout that shares this view's storage instead of
    /// copying its rows, when the layout allows it (same layout and, for paged caches, the
    /// same pool). [`crate::CacheFactory::restore`] tries this first, only when the factory
    /// stores this view's element type.
    fn share_into(&self, target: ShareTarget<'_>) -> Option<Box<dyn KvCache>> {
        let _ = target;
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
    /// Appends `k.len() / row_len` positions to `layer`, each value rounded to
    /// [`KvView::dtype`] once ([`crate::KvElem::narrow`]).
    fn append(&mut self, layer: usize, k: &[f32], v: &[f32]) -> Result<(), KvError>;

    /// Appends rows given as the stored bytes of [`KvView::dtype`] (what
    /// [`KvView::read_raw`] gives, at any alignment), kept exactly: a restore of stored rows
    /// never rounds them again.
    ///
    /// The default widens them (exactly) and calls [`KvCache::append`], which stores the
    /// same values again for a float type; every host layout overrides it with a copy,
    /// which quantized types need.
    fn append_stored(&mut self, layer: usize, k: &[u8], v: &[u8]) -> Result<(), KvError> {
        let dtype = self.dtype();
        let widen = |what, bytes: &[u8]| {
            dtype.decode(bytes).ok_or(KvError::RaggedRows {
                what,
                got: bytes.len(),
                row_len: dtype.element_bytes(),
            })
        };
        self.append(layer, &widen("K", k)?, &widen("V", v)?)
    }

    /// Appends `n` zeroed positions to every layer and lends their storage, to be filled in
    /// place: one [`LentLayer`] per layer, in layer order, whose pieces cover exactly the
    /// `n` new positions of that layer, in order (a layer kept in several buffers, pages or
    /// segments, lends one piece per buffer), as the bytes of [`KvView::dtype`] values.
    /// Writing a piece the bytes [`KvView::read_raw`] gave for some rows stores those rows
    /// exactly; [`LentPiece::fill`](crate::LentPiece::fill) writes `f32` values as
    /// [`KvCache::append`] would. A restore reads rows from disk straight into the pieces.
    ///
    /// Every layout here lends. The default (`None`, nothing appended) is for a layout
    /// whose storage can't be lent in host memory; the caller then uses
    /// [`KvCache::append`].
    fn append_in_place(&mut self, n: usize) -> Option<Vec<LentLayer<'_>>> {
        let _ = n;
        None
    }

    /// Up to `count` host buffers of at least `bytes` bytes each that
    /// [`KvCache::append_staged`] copies rows out of as they are: a cache whose storage is
    /// not host memory (a device's) lends memory its copies read directly, sparing the copy
    /// into its own staging that [`KvCache::append_stored`] makes of the caller's bytes.
    /// `None` (the default, and every host layout): use [`KvCache::append_stored`] (or
    /// [`KvCache::append_in_place`]).
    fn lend_staging(&mut self, count: usize, bytes: usize) -> Option<Vec<Box<dyn StagingBuffer>>> {
        let _ = (count, bytes);
        None
    }

    /// Appends the stored rows at bytes `k` and `v` of `buf`, as [`KvCache::append_stored`]
    /// appends the same bytes. A buffer this cache lent may still be read by the copy when
    /// this returns (its [`StagingBuffer::to_fill`] waits for that); the default, for any
    /// buffer, calls `append_stored`.
    fn append_staged(
        &mut self,
        layer: usize,
        buf: &mut dyn StagingBuffer,
        k: Range<usize>,
        v: Range<usize>,
    ) -> Result<(), KvError> {
        let bytes = buf.bytes();
        self.append_stored(layer, staged_part(bytes, k)?, staged_part(bytes, v)?)
    }

    /// Makes room for `n` positions in every layer ahead of the appends that will bring it
    /// there (a restore knows its length before its first row): a hint, with the same rows
    /// stored either way. The default does nothing; a layout that grows by copying (a
    /// device's) grows once instead of once per block of rows.
    fn reserve_positions(&mut self, n: usize) -> Result<(), KvError> {
        let _ = n;
        Ok(())
    }

    /// Causal attention of `q` (`[n_q, q_heads, head_dim]`, the newest `n_q` positions of
    /// `layer`) over the layer's rows, written to `out` (same shape).
    ///
    /// Every layout runs [`mtplx_kernels::attention::attend`], so the result for a query is bit-identical
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

/// Bytes held by `views` together, each shared buffer counted once: the memory that dropping
/// all of them would free (if nothing else references those buffers).
pub fn footprint(views: &[&dyn KvView]) -> usize {
    let mut seen = HashMap::new();
    for view in views {
        view.visit_buffers(&mut |id, bytes| {
            seen.insert(id, bytes);
        });
    }
    seen.values().sum()
}
