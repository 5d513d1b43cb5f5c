//! What an entry holds, as plain descriptors: the cold tier knows nothing of tensors or
//! layouts. The bank converts its caches to a [`KvSource`] on the way out and builds its
//! caches through a [`KvSink`] on the way back.

use std::ops::Range;

use crate::dtype::KvDtype;

/// A boxed error from the caller's side of a [`KvSource`] or [`KvSink`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The shape of a model's attention KV state and the type of its values. One K (or V) row
/// is one position of one layer: `kv_heads * head_dim` values of `dtype`, heads outermost.
/// Rows travel as bytes (the values' little-endian bytes, [`KvGeometry::row_bytes`] a row);
/// the cold tier stores them as they are and never interprets them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvGeometry {
    pub layers: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub dtype: KvDtype,
}

impl KvGeometry {
    /// Values in one K (or V) row.
    pub fn row_len(&self) -> usize {
        self.kv_heads as usize * self.head_dim as usize
    }

    /// Bytes of one K (or V) row: `row_len` values of `dtype`.
    pub fn row_bytes(&self) -> usize {
        self.dtype.bytes(self.row_len())
    }

    /// Bytes one token costs on disk: all layers, K and V.
    pub fn bytes_per_token(&self) -> u64 {
        2 * self.layers as u64 * self.row_bytes() as u64
    }

    /// Whether the geometry describes rows at all: no empty dimension, and heads of whole
    /// groups of a quantized type.
    pub(crate) fn is_valid(&self) -> bool {
        self.layers > 0
            && self.kv_heads > 0
            && self.head_dim > 0
            && (self.head_dim as usize).is_multiple_of(self.dtype.group())
    }
}

/// An opaque f32 buffer with a name and a shape (row-major; the product of `shape` is
/// `data.len()`).
#[derive(Debug, Clone, PartialEq)]
pub struct F32Buffer {
    pub name: String,
    pub shape: Vec<u32>,
    pub data: Vec<f32>,
}

/// Opaque bytes with a name (e.g. the MTP head's state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedBytes {
    pub name: String,
    pub bytes: Vec<u8>,
}

/// The recurrent state of a hybrid model after `position` tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct RecurrentCheckpoint {
    pub position: u32,
    pub buffers: Vec<F32Buffer>,
}

/// Whether an entry's model has recurrent layers, and the checkpoints it captured.
///
/// A hybrid entry can only be restored at a checkpoint position: its recurrent state can't be
/// trimmed like KV.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Recurrent {
    /// Attention only: any prefix of the KV rows is a valid state.
    #[default]
    None,
    /// Hybrid: restorable only at these positions (sorted ascending, no duplicates).
    Checkpoints(Vec<RecurrentCheckpoint>),
}

/// What continuing to decode from the entry's last position needs, beyond KV rows.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TailState {
    /// Last-position data, e.g. logits or the last hidden state.
    pub last: Vec<F32Buffer>,
    /// Opaque extra state, e.g. the MTP head's.
    pub extra: Vec<NamedBytes>,
}

/// One layer's storage that a sink lends a restore ([`KvSink::direct_rows`]), to be filled
/// in place: pieces in position order that together cover positions `0..rows` exactly,
/// each starting where the previous one ends. A sink that keeps a layer in one buffer
/// lends one piece; one that keeps it in pages or segments lends a piece per buffer.
#[derive(Debug)]
pub struct DirectLayer<'s> {
    pub pieces: Vec<DirectPiece<'s>>,
}

/// Consecutive positions of one layer held in one of the sink's buffers: `k` and `v` hold
/// `positions.len() * row_bytes` bytes each, positions outermost. They need no alignment.
#[derive(Debug)]
pub struct DirectPiece<'s> {
    pub positions: Range<usize>,
    pub k: &'s mut [u8],
    pub v: &'s mut [u8],
}

impl<'s> DirectLayer<'s> {
    /// A layer held in one buffer: positions `0..rows`, `k` and `v` holding exactly
    /// `rows * row_bytes` bytes each.
    pub fn whole(rows: usize, k: &'s mut [u8], v: &'s mut [u8]) -> DirectLayer<'s> {
        DirectLayer {
            pieces: vec![DirectPiece {
                positions: 0..rows,
                k,
                v,
            }],
        }
    }
}

/// Where a spill reads K/V rows from (the bank wraps its KV view in one).
pub trait KvSource: Send + Sync {
    /// Copies rows `range` of `layer` into `k` and `v`, each `range.len() * row_bytes`
    /// bytes (values of the entry's [`KvGeometry::dtype`], little-endian), positions
    /// outermost. The slices need not be aligned for the element type.
    fn read_rows(
        &self,
        layer: usize,
        range: Range<usize>,
        k: &mut [u8],
        v: &mut [u8],
    ) -> Result<(), BoxError>;
}

/// Host memory a sink lends for a restore to read stored rows into and hand back
/// ([`KvSink::lend_staging`], [`KvSink::write_staged`]): for a device's cache, page-locked
/// memory its copies to the device read directly. The sink may still be copying out of a
/// buffer when `write_staged` returns; [`StagingBuffer::to_fill`] waits for that.
pub trait StagingBuffer: Send {
    /// The whole buffer, to be written: waits first until nothing the sink queued from it
    /// still reads it.
    fn to_fill(&mut self) -> Result<&mut [u8], BoxError>;
    /// The buffer as filled.
    fn bytes(&self) -> &[u8];
    /// For the sink that lent it, to find its own type again.
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

/// Where a restore writes what it read; the caller builds its own layout from these calls
/// (its cache factory decides which).
///
/// Call order: [`KvSink::begin`] once; then either [`KvSink::direct_rows`] lends the
/// sink's own storage and the restore reads blocks from disk straight into it, or
/// [`KvSink::lend_staging`] lends host buffers the restore reads blocks into and hands back
/// through [`KvSink::write_staged`], or (the default) [`KvSink::write_rows`] is called; the
/// rows of the last two arrive for positions in increasing order, every layer
/// of a block before the next block, so for each layer the rows arrive contiguous from
/// position 0 (an append-only cache can just append); then [`KvSink::recurrent`] for a
/// hybrid entry; then [`KvSink::tail`] when the restore point is the entry's full length and
/// it has a tail.
///
/// # Unverified rows and `discard`
///
/// To overlap checksum verification with disk reads, rows reach the sink *before* the
/// checksum of the block they belong to has been checked. Only the restore's result says
/// whether they are good: when [`crate::ColdIndex::restore`] returns `Ok`, every byte the
/// sink received was verified; when it returns `Err` after [`KvSink::begin`], the restore
/// calls [`KvSink::discard`] and the caller must not use anything the sink received (it
/// starts cold, or from another candidate). Never publish a restored cache as accepted state
/// before `restore` has returned `Ok`.
pub trait KvSink {
    /// `rows` positions will be written to every layer of a cache of this geometry.
    fn begin(&mut self, geometry: KvGeometry, rows: usize) -> Result<(), BoxError>;
    /// Optional fast path: the sink's own storage for positions `0..rows` of every layer
    /// (the `rows` given to [`KvSink::begin`]), zeroed, one [`DirectLayer`] per layer in
    /// layer order, whose pieces cover exactly those positions in order. The restore then
    /// reads each block's rows from disk straight into the pieces (a block's layer may span
    /// several pieces, a piece several blocks), with no staging copy, and makes no
    /// [`KvSink::write_rows`] calls. Called once, right after `begin`. `None` (the default)
    /// selects `write_rows`. Layers of the wrong number, or pieces that don't cover
    /// `0..rows` in order with `row_bytes` bytes per position, fail the restore.
    fn direct_rows(&mut self) -> Option<Vec<DirectLayer<'_>>> {
        None
    }
    /// Optional, for a sink without [`KvSink::direct_rows`]: up to `count` host buffers of at
    /// least `bytes` bytes each that [`KvSink::write_staged`] takes rows from without a copy
    /// of its own. Called once, after `direct_rows` said `None`. `None` (the default)
    /// selects `write_rows`.
    fn lend_staging(&mut self, count: usize, bytes: usize) -> Option<Vec<Box<dyn StagingBuffer>>> {
        let _ = (count, bytes);
        None
    }
    /// Rows `start ..` of `layer` as [`KvSink::write_rows`] takes them, found at bytes `k`
    /// and `v` of `buf`, a buffer [`KvSink::lend_staging`] lent. The default passes those
    /// bytes to `write_rows`.
    fn write_staged(
        &mut self,
        layer: usize,
        start: usize,
        buf: &mut dyn StagingBuffer,
        k: Range<usize>,
        v: Range<usize>,
    ) -> Result<(), BoxError> {
        let bytes = buf.bytes();
        let part = |r: Range<usize>| {
            bytes.get(r.clone()).ok_or_else(|| {
                format!("rows at bytes {r:?} of a staging buffer of {}", bytes.len())
            })
        };
        let (k, v) = (part(k)?, part(v)?);
        self.write_rows(layer, start, k, v)
    }
    /// Rows `start .. start + k.len() / row_bytes` of `layer`, as stored: values of the
    /// geometry's dtype given to [`KvSink::begin`], little-endian. The slices need not be
    /// aligned for the element type.
    fn write_rows(
        &mut self,
        layer: usize,
        start: usize,
        k: &[u8],
        v: &[u8],
    ) -> Result<(), BoxError>;
    /// The recurrent state at the restore point.
    fn recurrent(&mut self, checkpoint: RecurrentCheckpoint) -> Result<(), BoxError> {
        let _ = checkpoint;
        Ok(())
    }
    /// The entry's tail state.
    fn tail(&mut self, tail: TailState) -> Result<(), BoxError> {
        let _ = tail;
        Ok(())
    }
    /// The restore failed after [`KvSink::begin`]: what the sink received (possibly rows
    /// whose block later failed its checksum) is not a valid state. Drop it. The default
    /// does nothing; the caller must then discard the sink itself.
    fn discard(&mut self) {}
}

/// K/V rows held in plain vectors of bytes, one pair per layer (positions outermost, each
/// value little-endian in the geometry's dtype). A simple [`KvSource`] and [`KvSink`] for
/// callers without a layout of their own, and for tests.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KvRows {
    pub geometry: Option<KvGeometry>,
    pub k: Vec<Vec<u8>>,
    pub v: Vec<Vec<u8>>,
    pub recurrent: Option<RecurrentCheckpoint>,
    pub tail: Option<TailState>,
}

impl KvRows {
    /// Rows from a function of (layer, position, index in row, is_v), each value encoded
    /// in the geometry's dtype (f16 and bf16 round to nearest even).
    ///
    /// # Panics
    /// For a quantized dtype ([`KvDtype::encode`]): build such rows from their bytes.
    pub fn from_fn(
        geometry: KvGeometry,
        positions: usize,
        f: impl Fn(usize, usize, usize, bool) -> f32,
    ) -> KvRows {
        let row = geometry.row_len();
        let layer = |is_v| -> Vec<Vec<u8>> {
            (0..geometry.layers as usize)
                .map(|l| {
                    let mut out = Vec::with_capacity(positions * geometry.row_bytes());
                    for i in 0..positions * row {
                        geometry
                            .dtype
                            .encode(f(l, i / row, i % row, is_v), &mut out);
                    }
                    out
                })
                .collect()
        };
        KvRows {
            geometry: Some(geometry),
            k: layer(false),
            v: layer(true),
            recurrent: None,
            tail: None,
        }
    }

    /// Rows of any type, quantized ones included, whose bytes are a function of (layer, byte
    /// offset in the layer, is_v): the cold tier never reads them as values, so any bytes
    /// are rows it stores and restores.
    pub fn from_bytes_fn(
        geometry: KvGeometry,
        positions: usize,
        f: impl Fn(usize, usize, bool) -> u8,
    ) -> KvRows {
        let len = positions * geometry.row_bytes();
        let layer = |is_v| -> Vec<Vec<u8>> {
            (0..geometry.layers as usize)
                .map(|l| (0..len).map(|i| f(l, i, is_v)).collect())
                .collect()
        };
        KvRows {
            geometry: Some(geometry),
            k: layer(false),
            v: layer(true),
            recurrent: None,
            tail: None,
        }
    }

    /// Positions held (in layer 0).
    pub fn positions(&self) -> usize {
        match (self.geometry, self.k.first()) {
            (Some(g), Some(k)) => k.len() / g.row_bytes(),
            _ => 0,
        }
    }

    /// The values of `layer`'s K (or, `is_v`, V) rows, decoded from the geometry's float
    /// dtype (empty without a geometry or such a layer).
    ///
    /// # Panics
    /// For a quantized dtype ([`KvDtype::decode`]).
    pub fn values(&self, layer: usize, is_v: bool) -> Vec<f32> {
        let (Some(g), Some(bytes)) = (
            self.geometry,
            if is_v { &self.v } else { &self.k }.get(layer),
        ) else {
            return Vec::new();
        };
        bytes
            .chunks_exact(g.dtype.element_bytes())
            .map(|b| g.dtype.decode(b))
            .collect()
    }

    /// The first `positions` rows of every layer.
    pub fn truncated(&self, positions: usize) -> KvRows {
        let n = positions * self.geometry.map_or(0, |g| g.row_bytes());
        KvRows {
            geometry: self.geometry,
            k: self.k.iter().map(|l| l[..n].to_vec()).collect(),
            v: self.v.iter().map(|l| l[..n].to_vec()).collect(),
            recurrent: None,
            tail: None,
        }
    }
}

impl KvSource for KvRows {
    fn read_rows(
        &self,
        layer: usize,
        range: Range<usize>,
        k: &mut [u8],
        v: &mut [u8],
    ) -> Result<(), BoxError> {
        let row = self.geometry.ok_or("no geometry")?.row_bytes();
        let span = range.start * row..range.end * row;
        let (sk, sv) = (self.k.get(layer), self.v.get(layer));
        match (
            sk.and_then(|l| l.get(span.clone())),
            sv.and_then(|l| l.get(span)),
        ) {
            (Some(sk), Some(sv)) if sk.len() == k.len() && sv.len() == v.len() => {
                k.copy_from_slice(sk);
                v.copy_from_slice(sv);
                Ok(())
            }
            _ => Err(format!("rows {range:?} of layer {layer} are not held").into()),
        }
    }
}

impl KvSink for KvRows {
    fn begin(&mut self, geometry: KvGeometry, rows: usize) -> Result<(), BoxError> {
        let n = rows * geometry.row_bytes();
        self.geometry = Some(geometry);
        self.k = (0..geometry.layers)
            .map(|_| Vec::with_capacity(n))
            .collect();
        self.v = (0..geometry.layers)
            .map(|_| Vec::with_capacity(n))
            .collect();
        Ok(())
    }

    fn write_rows(
        &mut self,
        layer: usize,
        start: usize,
        k: &[u8],
        v: &[u8],
    ) -> Result<(), BoxError> {
        let row = self.geometry.ok_or("begin was not called")?.row_bytes();
        let (lk, lv) = (&mut self.k[layer], &mut self.v[layer]);
        if lk.len() != start * row {
            return Err(format!("layer {layer}: rows from {start} arrived out of order").into());
        }
        lk.extend_from_slice(k);
        lv.extend_from_slice(v);
        Ok(())
    }

    fn direct_rows(&mut self) -> Option<Vec<DirectLayer<'_>>> {
        let row = self.geometry?.row_bytes();
        // `begin` reserved exactly `rows * row` bytes per layer (`Vec::with_capacity`
        // guarantees the requested capacity).
        let rows = self.k.first().map_or(0, Vec::capacity) / row;
        Some(
            self.k
                .iter_mut()
                .zip(self.v.iter_mut())
                .map(|(k, v)| {
                    k.resize(rows * row, 0);
                    v.resize(rows * row, 0);
                    DirectLayer::whole(rows, k, v)
                })
                .collect(),
        )
    }
    fn recurrent(&mut self, checkpoint: RecurrentCheckpoint) -> Result<(), BoxError> {
        self.recurrent = Some(checkpoint);
        Ok(())
    }

    fn tail(&mut self, tail: TailState) -> Result<(), BoxError> {
        self.tail = Some(tail);
        Ok(())
    }

    fn discard(&mut self) {
        *self = KvRows::default();
    }
}
