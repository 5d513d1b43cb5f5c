//! Reading KV blocks whose blob files are all in memory (the OS page cache) into a sink
//! that lends its rows.
//!
//! With no disk to wait for, a warm restore is two CPU costs: copying the bytes out of the
//! page cache into the sink, and hashing them. The streamed path (`blocks.rs`) gives each
//! its own thread, so it runs at the pace of the slower one (the copy, into memory the
//! sink has not touched lately). Here the copying is shared: the blocks are cut into the
//! same extents (whole layers, ≥ 1 MiB) and copier threads claim them in file order, while
//! the calling thread hashes them in file order, each block's extents in sequence; when the
//! next extent to hash has not been claimed yet, the calling thread claims it and copies it
//! itself, then hashes it while it is still in its cache. The hasher thus never idles while
//! there is copying left, and the wall time approaches (copy + hash) / threads instead of
//! the larger of the two, for any number of blocks.
//!
//! Rows still reach the sink before their block's checksum is known; the sink contract
//! covers that as it does for the streamed path. Errors are reported in file order, as the
//! streamed path reports them.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::Instant;

use super::blocks::{BlocksRead, Failed, LayerRows, Plan};
use super::read::{blob_name, check_header, from_le};
use crate::codec::blob::{CHECKSUM_AT, HEADER_LEN};
use crate::codec::{BlobKind, EntryBody};
use crate::error::ReadError;
use crate::index::ReadPath;
use crate::storage::StorageFile;

/// Threads a resident restore uses at most, the calling thread (the hasher) included: one
/// hasher and a few copiers saturate it on a large machine without taking every core from
/// the engine.
const MAX_THREADS: usize = 4;

/// Threads for a resident restore on this machine (at least 2: the hasher and a copier).
pub(super) fn threads() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    let cores =
        *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, NonZeroUsize::get));
    cores.clamp(2, MAX_THREADS)
}

/// Where one extent's rows go.
enum Rows<'s> {
    /// Straight into the sink: one `(k, v)` per layer of the extent, the block's rows.
    Sink(Vec<LayerRows<'s>>),
    /// The first rows of a block restored only in part: the extent is staged (its checksum
    /// covers rows the sink has no room for), then its wanted rows are copied.
    Part(Vec<LayerRows<'s>>),
}

/// One extent: some layers of one block.
struct Unit<'s> {
    block: usize,
    layers: Range<usize>,
    /// Taken by whoever copies the extent.
    rows: Mutex<Option<Rows<'s>>>,
}

/// A copied extent, waiting to be hashed.
struct Copied<'s> {
    /// For the first extent of a block: its header, checked against the manifest, and the
    /// checksum it stores.
    header: Option<(Box<[u8; HEADER_LEN]>, [u8; 32])>,
    rows: Rows<'s>,
    /// The staged bytes of a `Part` extent, in file order.
    staged: Vec<f32>,
}

/// The shared state of one restore.
struct Work<'a, 's> {
    body: &'a EntryBody,
    plan: &'a Plan,
    files: &'a [Box<dyn StorageFile>],
    units: Vec<Unit<'s>>,
    /// The next unit nobody has claimed.
    next: AtomicUsize,
    /// Set when the restore fails: copiers stop claiming.
    stop: AtomicBool,
}

impl<'s> Work<'_, 's> {
    /// Claims `u` if it is the next unclaimed unit.
    fn claim(&self, u: usize) -> bool {
        self.next
            .compare_exchange(u, u + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Copies unit `u` from its blob into the sink (or a staging buffer), checking the
    /// block's header first when `u` starts a block.
    fn copy(&self, u: usize) -> Result<Copied<'s>, Failed> {
        let unit = &self.units[u];
        let (plan, i) = (self.plan, unit.block);
        let key = self.body.blocks[i].0;
        let blob = |e| (e, Some((BlobKind::KvBlock, key)));
        let file = self.files[i].as_ref();
        let n = plan.stored(i);
        let header = match unit.layers.start {
            0 => {
                let payload = n * plan.g.bytes_per_token() as usize;
                let (head, sum) =
                    check_header(file, &key, plan.descriptor(i), payload).map_err(blob)?;
                Some((Box::new(head), sum))
            }
            _ => None,
        };
        let layer_len = 2 * n * plan.row;
        let mut offset = (HEADER_LEN + unit.layers.start * layer_len * 4) as u64;
        let io = |source| {
            blob(ReadError::Io {
                blob: blob_name(BlobKind::KvBlock, &key),
                source,
            })
        };
        let mut rows = unit
            .rows
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .expect("each unit is claimed once");
        let mut staged = Vec::new();
        match &mut rows {
            Rows::Sink(layers) => {
                for (k, v) in layers.iter_mut() {
                    for part in [&mut **k, &mut **v] {
                        file.read_at(offset, bytemuck::cast_slice_mut(part))
                            .map_err(io)?;
                        offset += part.len() as u64 * 4;
                    }
                }
            }
            Rows::Part(_) => {
                staged = vec![0f32; unit.layers.len() * layer_len];
                file.read_at(offset, bytemuck::cast_slice_mut(&mut staged))
                    .map_err(io)?;
            }
        }
        Ok(Copied {
            header,
            rows,
            staged,
        })
    }

    /// A copier thread: claims units in file order and sends each copy (or its failure).
    /// Every claimed unit gets a result, so the hasher never waits for one that won't come.
    fn copier(&self, tx: mpsc::Sender<(usize, Result<Copied<'s>, Failed>)>) {
        while !self.stop.load(Ordering::Acquire) {
            let u = self.next.fetch_add(1, Ordering::AcqRel);
            if u >= self.units.len() {
                return;
            }
            let copied = self.copy(u);
            let failed = copied.is_err();
            if tx.send((u, copied)).is_err() || failed {
                return;
            }
        }
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
    let mut units = Vec::new();
    for (block, mut layers) in rows.into_iter().enumerate() {
        for range in plan.extents() {
            let mine: Vec<LayerRows<'s>> = layers.drain(..range.len()).collect();
            let rows = match block == last && partial_last {
                true => Rows::Part(mine),
                false => Rows::Sink(mine),
            };
            units.push(Unit {
                block,
                layers: range,
                rows: Mutex::new(Some(rows)),
            });
        }
    }
    let threads = threads();
    let work = Work {
        body,
        plan,
        files: &files,
        units,
        next: AtomicUsize::new(0),
        stop: AtomicBool::new(false),
    };
    let (tx, rx) = mpsc::channel();
    let mut out = std::thread::scope(|scope| {
        for _ in 1..threads {
            let tx = tx.clone();
            let work = &work;
            scope.spawn(move || work.copier(tx));
        }
        drop(tx);
        let result = hash_all(&work, &rx);
        if result.is_err() {
            work.stop.store(true, Ordering::Release);
        }
        // Dropping the receiver ends copiers blocked on nothing but a send.
        drop(rx);
        result
    })?;
    out.path = ReadPath::Resident { threads };
    out.io_stalled /= threads as u32;
    Ok(out)
}

/// The calling thread: every unit in file order, copied by a copier or by itself, hashed,
/// each block verified after its last extent. `io_stalled` is its time spent hashing.
fn hash_all<'s>(
    work: &Work<'_, 's>,
    rx: &mpsc::Receiver<(usize, Result<Copied<'s>, Failed>)>,
) -> Result<BlocksRead, Failed> {
    let plan = work.plan;
    let layers = plan.g.layers as usize;
    let mut out = BlocksRead::default();
    let mut early: BTreeMap<usize, Result<Copied<'s>, Failed>> = BTreeMap::new();
    let mut hasher = blake3::Hasher::new();
    let mut sum = [0u8; 32];
    for u in 0..work.units.len() {
        let copied = if work.claim(u) {
            work.copy(u)
        } else {
            loop {
                if let Some(c) = early.remove(&u) {
                    break c;
                }
                let (at, c) = rx.recv().expect("a claimed unit always gets a result");
                early.insert(at, c);
            }
        }?;
        let unit = &work.units[u];
        let i = unit.block;
        let t = Instant::now();
        if let Some((head, s)) = &copied.header {
            hasher.reset();
            hasher.update(&head[..CHECKSUM_AT]);
            sum = *s;
        }
        match copied.rows {
            Rows::Sink(mut rows) => {
                for (k, v) in rows.iter_mut() {
                    hasher.update(bytemuck::cast_slice(k));
                    hasher.update(bytemuck::cast_slice(v));
                    from_le(k);
                    from_le(v);
                }
            }
            Rows::Part(mut rows) => {
                let mut buf = copied.staged;
                hasher.update(bytemuck::cast_slice(&buf));
                from_le(&mut buf);
                let span = plan.stored(i) * plan.row;
                let take = plan.wanted(i) * plan.row;
                for ((k, v), kv) in rows.iter_mut().zip(buf.chunks_exact(2 * span)) {
                    let (sk, sv) = kv.split_at(span);
                    k.copy_from_slice(&sk[..take]);
                    v.copy_from_slice(&sv[..take]);
                }
            }
        }
        out.io_stalled += t.elapsed();
        if unit.layers.end == layers {
            if *hasher.finalize().as_bytes() != sum {
                let key = work.body.blocks[i].0;
                let e = ReadError::Checksum {
                    blob: blob_name(BlobKind::KvBlock, &key),
                };
                return Err((e, Some((BlobKind::KvBlock, key))));
            }
            out.blocks += 1;
            out.bytes += (HEADER_LEN + plan.stored(i) * plan.g.bytes_per_token() as usize) as u64;
        }
    }
    Ok(out)
}
