//! Reading KV blocks whose blob files are all in memory (the OS page cache) into a sink
//! that lends its rows.
//!
//! With no disk to wait for, a warm restore is two CPU costs: copying the bytes out of the
//! page cache into the sink, and hashing them. Both are shared out by block: each of a few
//! threads (the calling thread among them) claims the next block in file order, copies its
//! rows layer by layer into the sink and hashes each layer's K and V right after copying
//! them, while they are still in its cache, and checks the block's checksum. Every block
//! has its own checksum, so blocks hash independently, and the wall time approaches
//! (copy + hash) / threads. (A single hasher with copiers beside it runs at the pace of the
//! hashing: blake3 on one core is about as slow as the copy.)
//!
//! Rows still reach the sink before their block's checksum is known; the sink contract
//! covers that as it does for the streamed path. A thread that meets a failure stops the
//! others from claiming more blocks; every claimed block is finished, and since blocks are
//! claimed in file order, the first failing block in file order is the one reported, as the
//! streamed path reports it.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::blob::{blob_name, check_header};
use super::rows::{read_into, BlocksRead, Failed, GatherHasher, LayerRows, Plan};
use crate::codec::blob::{CHECKSUM_AT, HEADER_LEN};
use crate::codec::{BlobKind, EntryBody};
use crate::error::ReadError;
use crate::index::ReadPath;
use crate::storage::StorageFile;

/// Threads a resident restore uses at most, the calling thread included: enough to
/// saturate memory bandwidth on a large machine without taking every core from the engine.
const MAX_THREADS: usize = 4;

/// Threads for a resident restore on this machine (at least 2).
pub(super) fn threads() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    let cores =
        *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, NonZeroUsize::get));
    cores.clamp(2, MAX_THREADS)
}

/// One block's destination: the block's rows of each layer, in the sink.
struct Block<'s> {
    layers: Vec<LayerRows<'s>>,
    /// The first rows of a block restored only in part: each layer is staged (its checksum
    /// covers rows the sink has no room for), then its wanted rows are copied.
    partial: bool,
}

/// A block read and verified.
struct Verified {
    bytes: u64,
    /// Time spent hashing it.
    hashing: Duration,
}

/// The shared state of one restore.
struct Work<'a, 's> {
    body: &'a EntryBody,
    plan: &'a Plan,
    files: &'a [Box<dyn StorageFile>],
    /// Taken by the thread that claims the block.
    blocks: Vec<Mutex<Option<Block<'s>>>>,
    /// Set by the thread that reads the block.
    results: Vec<OnceLock<Result<Verified, Failed>>>,
    /// The next block nobody has claimed.
    next: AtomicUsize,
    /// Set when a block fails: nobody claims another.
    stop: AtomicBool,
}

impl Work<'_, '_> {
    /// Claims blocks in file order until none is left or one has failed.
    fn worker(&self) {
        while !self.stop.load(Ordering::Acquire) {
            let i = self.next.fetch_add(1, Ordering::AcqRel);
            if i >= self.blocks.len() {
                return;
            }
            let result = self.read(i);
            if result.is_err() {
                self.stop.store(true, Ordering::Release);
            }
            let _ = self.results[i].set(result);
        }
    }

    /// Copies block `i` from its blob into the sink (its header checked first), hashing
    /// each layer's rows right after they are copied, and checks the block's checksum.
    fn read(&self, i: usize) -> Result<Verified, Failed> {
        let plan = self.plan;
        let key = self.body.blocks[i].0;
        let blob = |e| (e, Some((BlobKind::KvBlock, key)));
        let io = |source| {
            blob(ReadError::Io {
                blob: blob_name(BlobKind::KvBlock, &key),
                source,
            })
        };
        let file = self.files[i].as_ref();
        let n = plan.stored(i);
        let payload = n * plan.g.bytes_per_token() as usize;
        let (head, sum) = check_header(file, &key, plan.descriptor(i), payload).map_err(blob)?;
        let Block {
            mut layers,
            partial,
        } = self.blocks[i]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .expect("each block is claimed once");
        let mut hashing = Duration::ZERO;
        let mut hasher = GatherHasher::default();
        hasher.update(&head[..CHECKSUM_AT]);
        let mut offset = HEADER_LEN as u64;
        let span = n * plan.row_bytes;
        let mut staged = match partial {
            true => vec![0u8; 2 * span],
            false => Vec::new(),
        };
        for rows in layers.iter_mut() {
            if partial {
                file.read_at(offset, &mut staged).map_err(io)?;
                offset += staged.len() as u64;
                let t = Instant::now();
                hasher.update(&staged);
                hashing += t.elapsed();
                let take = plan.wanted(i) * plan.row_bytes;
                let (sk, sv) = staged.split_at(span);
                rows.fill(&sk[..take], &sv[..take]);
                continue;
            }
            read_into(file, offset, std::slice::from_mut(rows)).map_err(io)?;
            offset += 2 * span as u64;
            let t = Instant::now();
            for part in rows.file_order() {
                hasher.update(part);
            }
            hashing += t.elapsed();
        }
        if hasher.finalize() != sum {
            return Err(blob(ReadError::Checksum {
                blob: blob_name(BlobKind::KvBlock, &key),
            }));
        }
        Ok(Verified {
            bytes: (HEADER_LEN + payload) as u64,
            hashing,
        })
    }
}

/// Reads the blocks (`rows`: the sink's rows of each block; `files`: each block's blob) and
/// verifies them. The last block is staged when `partial_last`.
pub(super) fn read_resident<'s>(
    body: &EntryBody,
    plan: &Plan,
    files: Vec<Box<dyn StorageFile>>,
    rows: Vec<Vec<LayerRows<'s>>>,
    partial_last: bool,
) -> Result<BlocksRead, Failed> {
    let last = plan.nblocks - 1;
    let blocks: Vec<_> = rows
        .into_iter()
        .enumerate()
        .map(|(i, layers)| {
            Mutex::new(Some(Block {
                layers,
                partial: i == last && partial_last,
            }))
        })
        .collect();
    let threads = threads().min(blocks.len()).max(1);
    let work = Work {
        body,
        plan,
        files: &files,
        results: blocks.iter().map(|_| OnceLock::new()).collect(),
        blocks,
        next: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
    };
    std::thread::scope(|scope| {
        for _ in 1..threads {
            let work = &work;
            scope.spawn(move || work.worker());
        }
        work.worker();
    });
    let mut out = BlocksRead {
        path: ReadPath::Resident { threads },
        ..BlocksRead::default()
    };
    // Blocks are claimed in file order and every claimed block is finished, so the blocks
    // before the first missing result all have one, and a failure comes before any gap.
    for result in work.results {
        match result.into_inner() {
            Some(Ok(v)) => {
                out.blocks += 1;
                out.bytes += v.bytes;
                out.io_stalled += v.hashing;
            }
            Some(Err(e)) => return Err(e),
            None => unreachable!("a block is left unread only after an earlier one failed"),
        }
    }
    out.io_stalled /= threads as u32;
    Ok(out)
}
