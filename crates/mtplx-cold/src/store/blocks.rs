//! Reading an entry's KV blocks: a reader thread streams each block from disk in extents
//! of whole layers (≥ 1 MiB), straight into the sink's own rows when it lends them
//! ([`KvSink::direct_rows`]: per layer one piece of storage or several, pages or segments,
//! cut here at block bounds) or into a few recycled staging buffers otherwise, while the
//! calling thread hashes each extent as it arrives (when staged, it hands the extent's rows
//! to the sink while rayon's pool hashes them). Verification thus overlaps with I/O instead
//! of following it; the price is that rows reach the sink before their block's checksum is
//! known, which the sink contract covers (a failed restore calls [`KvSink::discard`]).
//!
//! When every block is already in memory and the sink lends its rows, there is no I/O to
//! overlap with: `resident.rs` reads and hashes whole blocks on several threads instead. A
//! sink that lends host buffers rather than its rows (a device's cache) gets its blocks read
//! into them by `lent.rs`.

use std::ops::Range;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::blob::open_blob;
use super::inner::Inner;
use super::lent::{read_lent, LENT_BUFFERS, LENT_EXTENT_BYTES};
use super::resident;
use super::rows::{
    io, open_in_turn, read_into, read_pieces, BlocksRead, Failed, GatherHasher, LayerRows,
    OpenBlock, Plan,
};
use crate::codec::blob::{CHECKSUM_AT, HEADER_LEN};
use crate::codec::{BlobKind, EntryBody, EntryHead};
use crate::error::ReadError;
use crate::index::ReadPath;
use crate::key::BLOCK_TOKENS;
use crate::payload::{DirectLayer, DirectPiece, KvSink};
use crate::storage::StorageFile;

/// Staging buffers in flight (only a sink without direct rows, or a partial last block,
/// uses them).
const STAGING_BUFFERS: usize = 4;

/// Where an extent's bytes went.
enum Dest<'s> {
    /// Into the sink: the block's rows of each layer of the extent.
    Sink(Vec<LayerRows<'s>>),
    /// Into a staging buffer: the extent's bytes in file order.
    Staged(Vec<u8>),
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
    /// buffers, and in reads.
    Done {
        at: Instant,
        waited: Duration,
        reading: Duration,
    },
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
        None => {
            // A sink that lends host buffers gets its rows in them (`lent.rs`): no more
            // buffers than the restore has extents (a device pins each one it lends).
            let lent = Plan::with_extents(head, point, LENT_EXTENT_BYTES);
            let bytes = lent.layers_per_extent * 2 * BLOCK_TOKENS * lent.row_bytes;
            let count = LENT_BUFFERS.min(lent.nblocks * lent.extents().count());
            match sink.lend_staging(count, bytes) {
                Some(buffers) if !buffers.is_empty() => {
                    read_lent(inner, body, &lent, sink, buffers)
                }
                _ => run(inner, body, &plan, Vec::new(), Deliver::Calls(sink)),
            }
        }
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
    let (row, point) = (plan.row_bytes, plan.point);
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
                     bytes after position {at}, of {point} positions of {row} bytes",
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
    let (free_tx, free_rx) = mpsc::channel::<Vec<u8>>();
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
        // Staged: this thread hashes and hands over every byte, the restore's pace.
        let mut hasher = match out.path {
            ReadPath::Staged => GatherHasher::parallel(),
            _ => GatherHasher::default(),
        };
        let mut sum = [0u8; 32];
        let mut block = 0;
        loop {
            let t = Instant::now();
            let Ok(piece) = piece_rx.recv() else {
                unreachable!("the reader ends with `Done` or an error")
            };
            let received = Instant::now();
            out.awaiting_reads += received - t;
            match piece? {
                Piece::Header { head, sum: s } => {
                    hasher.reset();
                    hasher.update(&head[..CHECKSUM_AT]);
                    sum = s;
                }
                Piece::Extent { layers, dest } => {
                    let n = plan.stored(block);
                    let span = n * plan.row_bytes;
                    match dest {
                        Dest::Sink(mut rows) => {
                            for part in rows.iter_mut().flat_map(LayerRows::file_order) {
                                hasher.update(part);
                            }
                        }
                        Dest::Staged(buf) => {
                            let start = block * BLOCK_TOKENS;
                            let take = plan.wanted(block) * plan.row_bytes;
                            // The extent's checksum on the pool while this thread hands its
                            // rows over (a device's cache copies them out to its staging):
                            // the two read the same bytes, and an extent costs the longer
                            // of them, not their sum.
                            let handing_over = &mut out.handing_over;
                            let delivered = rayon::in_place_scope(|s| {
                                s.spawn(|_| hasher.update(&buf));
                                let t = Instant::now();
                                let per_layer = layers.clone().zip(buf.chunks_exact(2 * span));
                                for (l, kv) in per_layer {
                                    let (k, v) = kv.split_at(span);
                                    let (k, v) = (&k[..take], &v[..take]);
                                    match &mut deliver {
                                        Deliver::Calls(sink) => sink
                                            .write_rows(l, start, k, v)
                                            .map_err(|e| (ReadError::Sink(e), None))?,
                                        Deliver::Direct(Some(rows)) => rows[l].fill(k, v),
                                        Deliver::Direct(None) => {
                                            unreachable!("staged direct block")
                                        }
                                    }
                                }
                                *handing_over += t.elapsed();
                                Ok::<_, Failed>(())
                            });
                            delivered?;
                            let _ = free_tx.send(buf);
                        }
                    }
                    if layers.end == plan.g.layers as usize {
                        if hasher.finalize() != sum {
                            let key = body.blocks[block].0;
                            let blob = super::blob::blob_name(BlobKind::KvBlock, &key);
                            let e = ReadError::Checksum { blob };
                            return Err((e, Some((BlobKind::KvBlock, key))));
                        }
                        out.blocks += 1;
                        out.bytes += (HEADER_LEN + n * plan.g.bytes_per_token() as usize) as u64;
                        block += 1;
                    }
                    out.delivering += received.elapsed();
                }
                Piece::Done {
                    at,
                    waited,
                    reading,
                } => {
                    // Everything read and verified: what the reader waited for, plus the
                    // time from its last byte to the last checksum.
                    out.io_stalled = waited + at.elapsed();
                    out.reading = reading;
                    return Ok(out);
                }
            }
        }
    })
}

/// The reader thread: every block's header, then its extents, in file order.
fn read_all<'s>(
    inner: &Inner,
    body: &EntryBody,
    plan: &Plan,
    direct: Vec<Option<Vec<LayerRows<'s>>>>,
    tx: &mpsc::Sender<Result<Piece<'s>, Failed>>,
    free: mpsc::Receiver<Vec<u8>>,
) -> Result<(), Failed> {
    let mut waited = Duration::ZERO;
    let mut reading = Duration::ZERO;
    let mut staging = 0;
    let blocks = open_in_turn(inner, body, plan, 0..plan.nblocks);
    for (opened, mut rows) in blocks.zip(direct) {
        let OpenBlock {
            block,
            key,
            file,
            head,
            sum,
        } = opened?;
        let blob = |e| (e, Some((BlobKind::KvBlock, key)));
        let layer_bytes = 2 * plan.stored(block) * plan.row_bytes;
        if tx.send(Ok(Piece::Header { head, sum })).is_err() {
            return Ok(());
        }
        for layers in plan.extents() {
            let offset = (HEADER_LEN + layers.start * layer_bytes) as u64;
            let dest = match rows.as_mut() {
                Some(rows) => {
                    let mut mine: Vec<LayerRows<'s>> = rows.drain(..layers.len()).collect();
                    let t = Instant::now();
                    read_into(file.as_ref(), offset, &mut mine).map_err(|e| blob(io(e, key)))?;
                    reading += t.elapsed();
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
                    buf.resize(layers.len() * layer_bytes, 0);
                    let t = Instant::now();
                    read_pieces(file.as_ref(), offset, &mut buf).map_err(|e| blob(io(e, key)))?;
                    reading += t.elapsed();
                    Dest::Staged(buf)
                }
            };
            if tx.send(Ok(Piece::Extent { layers, dest })).is_err() {
                return Ok(());
            }
        }
    }
    let at = Instant::now();
    let _ = tx.send(Ok(Piece::Done {
        at,
        waited,
        reading,
    }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::rows::GatherHasher;

    proptest! {
        /// However the input is cut (pieces smaller and larger than the gathering buffer,
        /// empty ones, a reset in between), the digest is blake3 of the whole.
        #[test]
        fn gathering_never_changes_the_digest(
            cuts in prop::collection::vec(0usize..700_000, 0..12),
            seed in any::<u8>(),
            parallel in any::<bool>(),
        ) {
            let total: usize = cuts.iter().sum();
            let data: Vec<u8> = (0..total).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
            let mut h = if parallel { GatherHasher::parallel() } else { GatherHasher::default() };
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
