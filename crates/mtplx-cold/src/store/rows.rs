//! What the read paths (streamed and staged in `blocks.rs`, lent in `lent.rs`, resident in
//! `resident.rs`) share: the sink's rows cut at block bounds, the hashing of gathered pieces,
//! the plan of a read and its outcome, an extent's read in pieces side by side.

use std::ops::Range;
use std::time::Duration;

use super::blob::{check_header, open_blob};
use super::inner::Inner;
use crate::codec::blob::HEADER_LEN;
use crate::codec::{BlobKind, Descriptor, EntryBody, EntryHead};
use crate::error::ReadError;
use crate::index::ReadPath;
use crate::key::{blocks_for, BLOCK_TOKENS};
use crate::payload::KvGeometry;
use crate::storage::StorageFile;

/// Bytes the reader fetches per extent, at least: whole layers of one block.
pub(super) const EXTENT_BYTES: usize = 1 << 20;

/// A failure, and the blob at fault if the stored bytes are bad.
pub(super) type Failed = (ReadError, Option<(BlobKind, [u8; 32])>);

/// One layer's K and V rows of one block, in the sink: the sink's pieces cut at the
/// block's bounds, in position order. The K slices in order, then the V slices, take the
/// layer's bytes of the block in file order.
#[derive(Debug, Default)]
pub(super) struct LayerRows<'s> {
    pub(super) k: Vec<&'s mut [u8]>,
    pub(super) v: Vec<&'s mut [u8]>,
}

/// blake3 over many small slices at the speed of large ones. blake3 hashes several 1 KiB
/// chunks at once only within one `update`, so slices of a few KiB (a 16-position page of
/// the default model's K rows is 12 KiB) hash about 1.6× slower than large ones; they are
/// gathered into a buffer first, which costs a copy of bytes that were just written and are
/// still in cache. The digest does not depend on how the input is split.
///
/// A parallel hasher ([`GatherHasher::parallel`]) hashes an update of
/// [`GatherHasher::PARALLEL_FROM`] bytes or more on blake3's threads (the same digest): for
/// the restores whose checksums are their pace (a sink without direct rows: a device's
/// cache, staged or lent).
#[derive(Default)]
pub(super) struct GatherHasher {
    hasher: blake3::Hasher,
    buf: Vec<u8>,
    parallel: bool,
}

impl GatherHasher {
    /// Updates of this many bytes or more go to blake3 as they are.
    const GATHER: usize = 64 << 10;
    /// Updates of this many bytes or more a parallel hasher spreads over threads (blake3's
    /// threads pay off from a few hundred KiB).
    pub(super) const PARALLEL_FROM: usize = 512 << 10;

    /// A hasher whose large updates run on several threads.
    pub(super) fn parallel() -> Self {
        GatherHasher {
            parallel: true,
            ..Self::default()
        }
    }

    fn absorb(&mut self, bytes: &[u8]) {
        if self.parallel && bytes.len() >= Self::PARALLEL_FROM {
            self.hasher.update_rayon(bytes);
        } else {
            self.hasher.update(bytes);
        }
    }

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
            self.absorb(bytes);
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
    pub(super) fn file_order(&mut self) -> impl Iterator<Item = &mut [u8]> + use<'_, 's> {
        self.k.iter_mut().chain(self.v.iter_mut()).map(|s| &mut **s)
    }

    /// Copies a staged layer's wanted rows into the slices: `k` (and `v`) hold as many
    /// bytes as the K (and the V) slices together.
    pub(super) fn fill(&mut self, k: &[u8], v: &[u8]) {
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
    /// The reader's time in reads; the calling thread's time on extents and waiting for
    /// them (see [`crate::RestoreTimings`]).
    pub(super) reading: Duration,
    pub(super) delivering: Duration,
    pub(super) handing_over: Duration,
    pub(super) awaiting_reads: Duration,
    pub(super) hashing: Duration,
}

/// The shape of a restore: which blocks, how many of their rows, in which extents.
pub(super) struct Plan {
    pub(super) g: KvGeometry,
    /// Bytes of one K (or V) row.
    pub(super) row_bytes: usize,
    pub(super) point: usize,
    pub(super) nblocks: usize,
    pub(super) entry_tokens: usize,
    pub(super) layers_per_extent: usize,
}

impl Plan {
    pub(super) fn new(head: &EntryHead, point: usize) -> Plan {
        Plan::with_extents(head, point, EXTENT_BYTES)
    }

    /// A plan whose extents hold at least `extent_bytes` bytes (whole layers of a block).
    pub(super) fn with_extents(head: &EntryHead, point: usize, extent_bytes: usize) -> Plan {
        let g = head.geometry;
        let layer_bytes = 2 * BLOCK_TOKENS * g.row_bytes();
        Plan {
            g,
            row_bytes: g.row_bytes(),
            point,
            nblocks: blocks_for(point),
            entry_tokens: head.n_tokens as usize,
            layers_per_extent: extent_bytes
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

/// Fills the sink's rows from the file: each layer's K rows, then its V rows, in file order.
pub(super) fn read_into(
    file: &dyn StorageFile,
    offset: u64,
    rows: &mut [LayerRows<'_>],
) -> std::io::Result<()> {
    let mut parts: Vec<&mut [u8]> = rows.iter_mut().flat_map(LayerRows::file_order).collect();
    file.read_vectored_at(offset, &mut parts)
}

/// A block of the entry, opened, its header checked against the manifest (its checksum not
/// yet: that needs the payload).
pub(super) struct OpenBlock {
    pub(super) block: usize,
    pub(super) key: [u8; 32],
    pub(super) file: Box<dyn StorageFile>,
    pub(super) head: Box<[u8; HEADER_LEN]>,
    pub(super) sum: [u8; 32],
}

/// Opens `blocks` of the entry in turn, for a reader that streams each: a block's successor
/// is opened (and the kernel asked to read it ahead) before the block's own header is
/// checked. Stop at the first error.
pub(super) fn open_in_turn<'a>(
    inner: &'a Inner,
    body: &'a EntryBody,
    plan: &'a Plan,
    blocks: impl Iterator<Item = usize> + Clone + 'a,
) -> impl Iterator<Item = Result<OpenBlock, Failed>> + 'a {
    let open = move |i: usize| {
        let f = open_blob(inner, BlobKind::KvBlock, &body.blocks[i].0);
        if let Ok(f) = &f {
            f.will_need();
        }
        f
    };
    let mut ahead = blocks.clone().skip(1);
    let mut next = blocks.clone().next().map(open);
    blocks.map(move |block| {
        let key = body.blocks[block].0;
        let blob = |e| (e, Some((BlobKind::KvBlock, key)));
        let file = next.take().expect("opened ahead").map_err(blob)?;
        next = ahead.next().map(open);
        let bytes = plan.stored(block) * plan.g.bytes_per_token() as usize;
        let (head, sum) =
            check_header(file.as_ref(), &key, plan.descriptor(block), bytes).map_err(blob)?;
        Ok(OpenBlock {
            block,
            key,
            file,
            head: Box::new(head),
            sum,
        })
    })
}

/// Bytes of an extent one pool thread reads (staged and lent paths).
const READ_PIECE: usize = 256 << 10;

/// Fills `buf` from `offset` in pieces of [`READ_PIECE`] read side by side on rayon's pool:
/// one thread's copies out of the page cache (or one request at a time to the disk) are
/// slower than the rest of a staged restore (measured on an H100's host: a 4.2 GB restore
/// into a device cache read 5.4 GB/s with one reader thread).
pub(super) fn read_pieces(
    file: &dyn StorageFile,
    offset: u64,
    buf: &mut [u8],
) -> std::io::Result<()> {
    use rayon::prelude::*;
    buf.par_chunks_mut(READ_PIECE)
        .enumerate()
        .try_for_each(|(i, piece)| file.read_at(offset + (i * READ_PIECE) as u64, piece))
}

pub(super) fn io(source: std::io::Error, key: [u8; 32]) -> ReadError {
    ReadError::Io {
        blob: super::blob::blob_name(BlobKind::KvBlock, &key),
        source,
    }
}
