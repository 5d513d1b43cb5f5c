//! Reading an entry's KV blocks: a reader thread streams each block from disk in extents
//! of whole layers (≥ 1 MiB), straight into the sink's own rows when it lends them
//! ([`KvSink::direct_rows`]: per layer one piece of storage or several, pages or segments,
//! cut here at block bounds) or into a few recycled staging buffers otherwise, while the
//! calling thread hashes each extent as it arrives (and, when staged, hands its rows to the
//! sink). Verification thus overlaps with I/O instead of following it; the price is that
//! rows reach the sink before their block's checksum is known, which the sink contract
//! covers (a failed restore calls [`KvSink::discard`]).
//!
//! When every block is already in memory and the sink lends its rows, there is no I/O to
//! overlap with: `resident.rs` reads and hashes whole blocks on several threads instead.

use std::ops::Range;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::read::{check_header, from_le, open_blob};
use super::resident;
use super::Inner;
use crate::codec::blob::{CHECKSUM_AT, HEADER_LEN};
use crate::codec::{BlobKind, Descriptor, EntryBody, EntryHead};
use crate::error::ReadError;
use crate::index::ReadPath;
use crate::key::{blocks_for, BLOCK_TOKENS};
use crate::payload::{DirectLayer, DirectPiece, KvGeometry, KvSink};
use crate::storage::StorageFile;

/// Bytes the reader fetches per extent, at least: whole layers of one block.
const EXTENT_BYTES: usize = 1 << 20;
/// Staging buffers in flight (only a sink without direct rows, or a partial last block,
/// uses them).
const STAGING_BUFFERS: usize = 4;

/// A failure, and the blob at fault if the stored bytes are bad.
pub(super) type Failed = (ReadError, Option<(BlobKind, [u8; 32])>);

/// One layer's K and V rows of one block, in the sink: the sink's pieces cut at the
/// block's bounds, in position order. The K slices in order, then the V slices, take the
/// layer's bytes of the block in file order.
#[derive(Debug, Default)]
pub(super) struct LayerRows<'s> {
    k: Vec<&'s mut [f32]>,
    v: Vec<&'s mut [f32]>,
}

/// blake3 over many small slices at the speed of large ones. blake3 hashes several 1 KiB
/// chunks at once only within one `update`, so slices of a few KiB (a 16-position page of
/// the default model's K rows is 12 KiB) hash about 1.6× slower than large ones; they are
/// gathered into a buffer first, which costs a copy of bytes that were just written and are
/// still in cache. The digest does not depend on how the input is split.
#[derive(Default)]
pub(super) struct GatherHasher {
    hasher: blake3::Hasher,
    buf: Vec<u8>,
}

impl GatherHasher {
    /// Updates of this many bytes or more go to blake3 as they are.
    const GATHER: usize = 64 << 10;

    /// Starts over.
    pub(super) fn reset(&mut self) {
        self.hasher.reset();
        self.buf.clear();
    }

    pub(super) fn update(&mut self, mut bytes: &[u8]) {
        if !self.buf.is_empty() {
            let take = (Self::GATHER - self.buf.len()).min(bytes.len());
            self.buf.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.buf.len() < Self::GATHER {
                return;
            }
            self.hasher.update(&self.buf);
            self.buf.clear();
        }
        if bytes.len() >= Self::GATHER {
            self.hasher.update(bytes);
        } else {
            self.buf.extend_from_slice(bytes);
        }
    }

    /// The digest of everything since the last reset.
    pub(super) fn finalize(&mut self) -> [u8; 32] {
        self.hasher.update(&self.buf);
        self.buf.clear();
        *self.hasher.finalize().as_bytes()
    }
}

impl<'s> LayerRows<'s> {
    /// The slices in file order: every K slice, then every V slice.
    pub(super) fn file_order(&mut self) -> impl Iterator<Item = &mut [f32]> + use<'_, 's> {
        self.k.iter_mut().chain(self.v.iter_mut()).map(|s| &mut **s)
    }

    /// Copies a staged layer's wanted rows into the slices: `k` (and `v`) hold as many
    /// values as the K (and the V) slices together.
    pub(super) fn fill(&mut self, k: &[f32], v: &[f32]) {
        for (parts, mut src) in [(&mut self.k, k), (&mut self.v, v)] {
            for part in parts.iter_mut() {
                let (head, rest) = src.split_at(part.len());
                part.copy_from_slice(head);
                src = rest;
            }
        }
    }
}

/// What the blocks cost, for the restore's report.
#[derive(Debug, Default)]
pub(super) struct BlocksRead {
    /// How the blocks were read.
    pub(super) path: ReadPath,
    pub(super) blocks: usize,
    pub(super) bytes: u64,
    /// Time the reader waited for the calling thread, plus the time from the last byte
    /// read to the last checksum checked: how much hashing and delivery held up the I/O.
    pub(super) io_stalled: Duration,
}

/// Where an extent's bytes went.
enum Dest<'s> {
    /// Into the sink: the block's rows of each layer of the extent.
    Sink(Vec<LayerRows<'s>>),
    /// Into a staging buffer: the extent's bytes in file order.
    Staged(Vec<f32>),
}

/// What the reader sends, in file order.
enum Piece<'s> {
    /// A block's header, already checked against the manifest; its checksum is not.
    Header {
        head: Box<[u8; HEADER_LEN]>,
        sum: [u8; 32],
    },
    /// The next layers of the current block.
    Extent {
        layers: Range<usize>,
        dest: Dest<'s>,
    },
    /// Everything was read (`at`); the time the reader spent waiting for free staging
    /// buffers.
    Done { at: Instant, waited: Duration },
}

/// The shape of a restore: which blocks, how many of their rows, in which extents.
pub(super) struct Plan {
    pub(super) g: KvGeometry,
    pub(super) row: usize,
    point: usize,
    pub(super) nblocks: usize,
    entry_tokens: usize,
    layers_per_extent: usize,
}

impl Plan {
    fn new(head: &EntryHead, point: usize) -> Plan {
        let g = head.geometry;
        let layer_bytes = 2 * BLOCK_TOKENS * g.row_len() * 4;
        Plan {
            g,
            row: g.row_len(),
            point,
            nblocks: blocks_for(point),
            entry_tokens: head.n_tokens as usize,
            layers_per_extent: EXTENT_BYTES
                .div_ceil(layer_bytes)
                .clamp(1, g.layers as usize),
        }
    }

    /// Rows stored in block `i`.
    pub(super) fn stored(&self, i: usize) -> usize {
        (self.entry_tokens - i * BLOCK_TOKENS).min(BLOCK_TOKENS)
    }

    /// Rows of block `i` the restore delivers.
    pub(super) fn wanted(&self, i: usize) -> usize {
        (self.point - i * BLOCK_TOKENS).min(BLOCK_TOKENS)
    }

    pub(super) fn extents(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        let layers = self.g.layers as usize;
        (0..layers)
            .step_by(self.layers_per_extent)
            .map(move |l| l..(l + self.layers_per_extent).min(layers))
    }

    pub(super) fn descriptor(&self, i: usize) -> Descriptor {
        Descriptor::Kv {
            geometry: self.g,
            n_tokens: self.stored(i) as u32,
            first_position: (i * BLOCK_TOKENS) as u32,
        }
    }
}

/// Reads blocks `0 .. ceil(point / 256)` of the entry into `sink`, verifying each.
pub(super) fn read_blocks(
    inner: &Inner,
    head: &EntryHead,
    body: &EntryBody,
    point: usize,
    sink: &mut dyn KvSink,
) -> Result<BlocksRead, Failed> {
    let plan = Plan::new(head, point);
    match sink.direct_rows() {
        None => run(inner, body, &plan, Vec::new(), Deliver::Calls(sink)),
        Some(layers) => {
            let per_block = split_at_blocks(layers, &plan)
                .map_err(|what| (ReadError::Sink(what.into()), None))?;
            // The last block, when only part of it is restored, can't be read into the
            // sink (its checksum covers rows the sink has no room for): it is staged.
            let last = plan.nblocks - 1;
            let partial = plan.wanted(last) < plan.stored(last);
            if let Some(files) = resident_files(inner, body, &plan) {
                return resident::read_resident(body, &plan, files, per_block, partial);
            }
            let mut direct: Vec<_> = per_block.into_iter().map(Some).collect();
            let partial = match partial {
                true => direct[last].take(),
                false => None,
            };
            run(inner, body, &plan, direct, Deliver::Direct(partial))
        }
    }
}

/// Checks the layers a sink lent against the plan and cuts their pieces at block bounds:
/// per block, per layer, the sink's rows of that block.
fn split_at_blocks<'s>(
    layers: Vec<DirectLayer<'s>>,
    plan: &Plan,
) -> Result<Vec<Vec<LayerRows<'s>>>, String> {
    let (row, point) = (plan.row, plan.point);
    if layers.len() != plan.g.layers as usize {
        return Err(format!(
            "direct rows: {} layers lent, {} expected",
            layers.len(),
            plan.g.layers
        ));
    }
    let mut per_block: Vec<Vec<LayerRows<'s>>> = (0..plan.nblocks)
        .map(|_| (0..layers.len()).map(|_| LayerRows::default()).collect())
        .collect();
    for (l, layer) in layers.into_iter().enumerate() {
        let mut at = 0;
        for DirectPiece {
            positions,
            mut k,
            mut v,
        } in layer.pieces
        {
            let len = positions.len() * row;
            if positions.start != at || positions.end > point || k.len() != len || v.len() != len {
                return Err(format!(
                    "direct rows: layer {l} lends positions {positions:?} in {} K and {} V \
                     values after position {at}, of {point} positions of {row} values",
                    k.len(),
                    v.len()
                ));
            }
            while at < positions.end {
                let b = at / BLOCK_TOKENS;
                let take = ((b + 1) * BLOCK_TOKENS).min(positions.end) - at;
                let (bk, rest_k) = std::mem::take(&mut k).split_at_mut(take * row);
                let (bv, rest_v) = std::mem::take(&mut v).split_at_mut(take * row);
                per_block[b][l].k.push(bk);
                per_block[b][l].v.push(bv);
                (k, v) = (rest_k, rest_v);
                at += take;
            }
        }
        if at != point {
            return Err(format!(
                "direct rows: layer {l} lends positions 0..{at}, not 0..{point}"
            ));
        }
    }
    Ok(per_block)
}

/// The blocks' files, when every one of them opens and is in memory.
fn resident_files(
    inner: &Inner,
    body: &EntryBody,
    plan: &Plan,
) -> Option<Vec<Box<dyn StorageFile>>> {
    body.blocks
        .get(..plan.nblocks)?
        .iter()
        .map(|key| {
            open_blob(inner, BlobKind::KvBlock, &key.0)
                .ok()
                .filter(|f| f.resident())
        })
        .collect()
}

/// How staged rows reach the sink.
enum Deliver<'a, 's> {
    /// Through [`KvSink::write_rows`].
    Calls(&'a mut dyn KvSink),
    /// Copied into the sink's rows of a partially restored last block (`None`: every block
    /// goes straight into the sink).
    Direct(Option<Vec<LayerRows<'s>>>),
}

fn run<'s>(
    inner: &Inner,
    body: &EntryBody,
    plan: &Plan,
    mut direct: Vec<Option<Vec<LayerRows<'s>>>>,
    mut deliver: Deliver<'_, 's>,
) -> Result<BlocksRead, Failed> {
    let (piece_tx, piece_rx) = mpsc::channel::<Result<Piece<'s>, Failed>>();
    let (free_tx, free_rx) = mpsc::channel::<Vec<f32>>();
    direct.resize_with(plan.nblocks, || None);

    // `move`: the receivers are dropped when the caller stops early, which ends the reader.
    std::thread::scope(move |scope| {
        scope.spawn(move || {
            let sent = read_all(inner, body, plan, direct, &piece_tx, free_rx);
            if let Err(e) = sent {
                let _ = piece_tx.send(Err(e));
            }
        });

        let mut out = BlocksRead {
            path: match deliver {
                Deliver::Calls(_) => ReadPath::Staged,
                Deliver::Direct(_) => ReadPath::Streamed,
            },
            ..BlocksRead::default()
        };
        let mut hasher = GatherHasher::default();
        let mut sum = [0u8; 32];
        let mut block = 0;
        for piece in piece_rx.iter() {
            match piece? {
                Piece::Header { head, sum: s } => {
                    hasher.reset();
                    hasher.update(&head[..CHECKSUM_AT]);
                    sum = s;
                }
                Piece::Extent { layers, dest } => {
                    let n = plan.stored(block);
                    let span = n * plan.row;
                    match dest {
                        Dest::Sink(mut rows) => {
                            for part in rows.iter_mut().flat_map(LayerRows::file_order) {
                                hasher.update(bytemuck::cast_slice(part));
                                from_le(part);
                            }
                        }
                        Dest::Staged(mut buf) => {
                            hasher.update(bytemuck::cast_slice(&buf));
                            from_le(&mut buf);
                            let start = block * BLOCK_TOKENS;
                            let take = plan.wanted(block) * plan.row;
                            for (l, kv) in layers.clone().zip(buf.chunks_exact(2 * span)) {
                                let (k, v) = kv.split_at(span);
                                let (k, v) = (&k[..take], &v[..take]);
                                match &mut deliver {
                                    Deliver::Calls(sink) => sink
                                        .write_rows(l, start, k, v)
                                        .map_err(|e| (ReadError::Sink(e), None))?,
                                    Deliver::Direct(Some(rows)) => rows[l].fill(k, v),
                                    Deliver::Direct(None) => unreachable!("staged direct block"),
                                }
                            }
                            let _ = free_tx.send(buf);
                        }
                    }
                    if layers.end == plan.g.layers as usize {
                        if hasher.finalize() != sum {
                            let key = body.blocks[block].0;
                            let blob = super::read::blob_name(BlobKind::KvBlock, &key);
                            let e = ReadError::Checksum { blob };
                            return Err((e, Some((BlobKind::KvBlock, key))));
                        }
                        out.blocks += 1;
                        out.bytes += (HEADER_LEN + n * plan.g.bytes_per_token() as usize) as u64;
                        block += 1;
                    }
                }
                Piece::Done { at, waited } => {
                    // Everything read and verified: what the reader waited for, plus the
                    // time from its last byte to the last checksum.
                    out.io_stalled = waited + at.elapsed();
                    return Ok(out);
                }
            }
        }
        unreachable!("the reader ends with `Done` or an error")
    })
}

/// The reader thread: every block's header, then its extents, in file order.
fn read_all<'s>(
    inner: &Inner,
    body: &EntryBody,
    plan: &Plan,
    direct: Vec<Option<Vec<LayerRows<'s>>>>,
    tx: &mpsc::Sender<Result<Piece<'s>, Failed>>,
    free: mpsc::Receiver<Vec<f32>>,
) -> Result<(), Failed> {
    let mut waited = Duration::ZERO;
    let mut staging = 0;
    let open = |i: usize| {
        let key = &body.blocks[i].0;
        let f = open_blob(inner, BlobKind::KvBlock, key);
        if let Ok(f) = &f {
            f.will_need();
        }
        f
    };
    let mut next = Some(open(0));
    for (i, mut rows) in direct.into_iter().enumerate() {
        let key = body.blocks[i].0;
        let blob = |e| (e, Some((BlobKind::KvBlock, key)));
        let file = next.take().expect("opened ahead").map_err(blob)?;
        // The kernel reads the next block ahead while this one streams.
        if i + 1 < plan.nblocks {
            next = Some(open(i + 1));
        }
        let n = plan.stored(i);
        let layer_len = 2 * n * plan.row;
        let (head, sum) = check_header(
            file.as_ref(),
            &key,
            plan.descriptor(i),
            n * plan.g.bytes_per_token() as usize,
        )
        .map_err(blob)?;
        let head = Box::new(head);
        if tx.send(Ok(Piece::Header { head, sum })).is_err() {
            return Ok(());
        }
        for layers in plan.extents() {
            let offset = (HEADER_LEN + layers.start * layer_len * 4) as u64;
            let dest = match rows.as_mut() {
                Some(rows) => {
                    let mut mine: Vec<LayerRows<'s>> = rows.drain(..layers.len()).collect();
                    read_into(file.as_ref(), offset, &mut mine).map_err(|e| blob(io(e, key)))?;
                    Dest::Sink(mine)
                }
                None => {
                    let mut buf = match free.try_recv() {
                        Ok(buf) => buf,
                        Err(_) if staging < STAGING_BUFFERS => {
                            staging += 1;
                            Vec::new()
                        }
                        Err(_) => {
                            let t = Instant::now();
                            let Ok(buf) = free.recv() else {
                                return Ok(());
                            };
                            waited += t.elapsed();
                            buf
                        }
                    };
                    buf.resize(layers.len() * layer_len, 0.0);
                    file.read_at(offset, bytemuck::cast_slice_mut(&mut buf))
                        .map_err(|e| blob(io(e, key)))?;
                    Dest::Staged(buf)
                }
            };
            if tx.send(Ok(Piece::Extent { layers, dest })).is_err() {
                return Ok(());
            }
        }
    }
    let at = Instant::now();
    let _ = tx.send(Ok(Piece::Done { at, waited }));
    Ok(())
}

/// Fills the sink's rows from the file: each layer's K rows, then its V rows, in file order.
pub(super) fn read_into(
    file: &dyn StorageFile,
    offset: u64,
    rows: &mut [LayerRows<'_>],
) -> std::io::Result<()> {
    let mut parts: Vec<&mut [u8]> = rows
        .iter_mut()
        .flat_map(LayerRows::file_order)
        .map(bytemuck::cast_slice_mut)
        .collect();
    file.read_vectored_at(offset, &mut parts)
}

fn io(source: std::io::Error, key: [u8; 32]) -> ReadError {
    ReadError::Io {
        blob: super::read::blob_name(BlobKind::KvBlock, &key),
        source,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::GatherHasher;

    proptest! {
        /// However the input is cut (pieces smaller and larger than the gathering buffer,
        /// empty ones, a reset in between), the digest is blake3 of the whole.
        #[test]
        fn gathering_never_changes_the_digest(
            cuts in prop::collection::vec(0usize..200_000, 0..12),
            seed in any::<u8>(),
        ) {
            let total: usize = cuts.iter().sum();
            let data: Vec<u8> = (0..total).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
            let mut h = GatherHasher::default();
            h.update(b"stale input a reset must drop");
            h.reset();
            let mut at = 0;
            for c in &cuts {
                h.update(&data[at..at + c]);
                at += c;
            }
            prop_assert_eq!(h.finalize(), *blake3::hash(&data).as_bytes());
        }
    }
}
