//! Reading an entry's KV blocks into host buffers the sink lends ([`KvSink::lend_staging`]:
//! a device cache's page-locked memory). Three stages run side by side, each buffer passing
//! through them in turn:
//!
//! - a reader thread fills a free buffer with an extent (whole layers of a block, read in
//!   pieces on rayon's threads), after [`StagingBuffer::to_fill`] has waited for the
//!   buffer's last copy out;
//! - the calling thread hands the extent's rows to the sink ([`KvSink::write_staged`]),
//!   which queues their copy and returns;
//! - hasher threads, each taking every `HASHERS`-th block, hash the extent and free the
//!   buffer for its reader.
//!
//! Two readers take alternate blocks, each with its own share of the buffers (the calling
//! thread takes blocks in order from each in turn, so a reader never waits for buffers the
//! other holds).
//!
//! Nothing copies the rows between the read and the sink's own copy, and the checksums no
//! longer hold up the hand-over: the staged path (`blocks.rs`) copies every byte into the
//! sink's staging and waits for each extent's checksum. As there, rows reach the sink before
//! their block's checksum is known (the sink contract covers it: a failed restore discards).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::blob::blob_name;
use super::inner::Inner;
use super::rows::{
    io, open_in_turn, read_pieces, BlocksRead, Failed, GatherHasher, OpenBlock, Plan,
};
use crate::codec::blob::{CHECKSUM_AT, HEADER_LEN};
use crate::codec::{BlobKind, EntryBody};
use crate::error::ReadError;
use crate::index::ReadPath;
use crate::key::BLOCK_TOKENS;
use crate::payload::{KvSink, StagingBuffer};

/// Bytes of a lent buffer, at least: an extent of whole layers of a block. Larger than the
/// staged path's extents: a buffer costs the sink page-locked memory, but each extent is
/// one hand-over, and its pieces are read side by side.
pub(super) const LENT_EXTENT_BYTES: usize = 4 << 20;

/// Buffers asked of the sink, shared out among the readers: enough for each to run ahead
/// of the hand-over and the checksums.
pub(super) const LENT_BUFFERS: usize = 16;

/// Reader threads, each taking every `READERS`-th block with buffers of its own, so one
/// block's reads are under way while another's last piece comes in.
const READERS: usize = 2;

/// Threads hashing blocks side by side (block `i` on thread `i % HASHERS`), each extent on
/// rayon's threads: one thread hashes a few GB/s, and a device's restore reads faster.
const HASHERS: usize = 6;

type Buffer = Box<dyn StagingBuffer>;

/// Block `block`'s header, already checked against the manifest, and its stored checksum,
/// not yet checked: from a reader to the calling thread, then on to the block's hasher.
struct Header {
    block: usize,
    head: Box<[u8; HEADER_LEN]>,
    sum: [u8; 32],
}

/// What a reader sends the calling thread, in file order of its blocks.
enum Read {
    Header(Header),
    /// Layers `layers` of block `block`, in the buffer's first `len` bytes.
    Extent {
        block: usize,
        layers: std::ops::Range<usize>,
        len: usize,
        buf: Buffer,
    },
    /// Everything was read (`at`); the reader's time waiting for free buffers (and their
    /// copies out), and in reads.
    Done {
        at: Instant,
        waited: Duration,
        reading: Duration,
    },
}

/// What a hasher is given, in file order for its blocks.
enum Hash {
    Header(Header),
    /// `home`: the reader the buffer goes back to.
    Extent {
        len: usize,
        last: bool,
        home: usize,
        buf: Buffer,
    },
}

/// A hasher's word on a block: whether its checksum held, and the time spent hashing it.
struct Verdict {
    block: usize,
    ok: bool,
    busy: Duration,
}

/// Reads blocks `0 .. plan.nblocks` into `buffers` (lent by `sink`, each holding at least
/// an extent) and hands them to the sink, verifying each block.
pub(super) fn read_lent(
    inner: &Inner,
    body: &EntryBody,
    plan: &Plan,
    sink: &mut dyn KvSink,
    buffers: Vec<Buffer>,
) -> Result<BlocksRead, Failed> {
    let readers = READERS.min(plan.nblocks).min(buffers.len()).max(1);
    let hashers = HASHERS.min(plan.nblocks).max(1);
    let (free_tx, free_rx): (Vec<_>, Vec<_>) = (0..readers).map(|_| mpsc::channel()).unzip();
    for (i, buf) in buffers.into_iter().enumerate() {
        free_tx[i % readers]
            .send(buf)
            .expect("the receiver is here");
    }
    let (read_tx, read_rx): (Vec<_>, Vec<_>) = (0..readers).map(|_| mpsc::channel()).unzip();
    let (verdict_tx, verdict_rx) = mpsc::channel::<Verdict>();

    // `move`: the channels' ends are dropped when the caller stops early, which ends the
    // readers (their free buffers stop coming) and the hashers (their work stops coming).
    std::thread::scope(move |scope| {
        for (r, (tx, free)) in read_tx.into_iter().zip(free_rx).enumerate() {
            scope.spawn(move || {
                let blocks = (r..plan.nblocks).step_by(readers);
                if let Err(e) = read_all(inner, body, plan, blocks, &tx, free) {
                    let _ = tx.send(Err(e));
                }
            });
        }
        let mut to_hash = Vec::with_capacity(hashers);
        for _ in 0..hashers {
            let (tx, rx) = mpsc::channel::<Hash>();
            let (free, verdicts) = (free_tx.clone(), verdict_tx.clone());
            scope.spawn(move || hash_blocks(rx, free, verdicts));
            to_hash.push(tx);
        }
        drop((free_tx, verdict_tx));

        let mut out = BlocksRead {
            path: ReadPath::Lent { hashers },
            ..BlocksRead::default()
        };
        let row = plan.row_bytes;
        let recv = |from: usize, out: &mut BlocksRead| {
            let t = Instant::now();
            let Ok(read) = read_rx[from].recv() else {
                unreachable!("a reader ends with `Done` or an error")
            };
            out.awaiting_reads += t.elapsed();
            read
        };
        // Block by block, each from its reader: a header, then its extents.
        for block in 0..plan.nblocks {
            let home = block % readers;
            loop {
                match recv(home, &mut out)? {
                    Read::Header(header) => {
                        debug_assert_eq!(header.block, block, "a reader's blocks come in order");
                        let _ = to_hash[block % hashers].send(Hash::Header(header));
                    }
                    Read::Extent {
                        block: b,
                        layers,
                        len,
                        mut buf,
                    } => {
                        debug_assert_eq!(b, block, "a block's extents follow its header");
                        let t = Instant::now();
                        let span = plan.stored(block) * row;
                        let take = plan.wanted(block) * row;
                        let start = block * BLOCK_TOKENS;
                        for (i, l) in layers.clone().enumerate() {
                            let k = 2 * i * span;
                            let v = k + span;
                            sink.write_staged(l, start, buf.as_mut(), k..k + take, v..v + take)
                                .map_err(|e| (ReadError::Sink(e), None))?;
                        }
                        let last = layers.end == plan.g.layers as usize;
                        let work = Hash::Extent {
                            len,
                            last,
                            home,
                            buf,
                        };
                        let _ = to_hash[block % hashers].send(work);
                        out.delivering += t.elapsed();
                        if last {
                            let n = plan.stored(block);
                            let bytes = HEADER_LEN + n * plan.g.bytes_per_token() as usize;
                            out.bytes += bytes as u64;
                            break;
                        }
                    }
                    Read::Done { .. } => unreachable!("a reader is done after its last block"),
                }
            }
        }
        // Each reader's account: what it waited for and read, plus the time from its last
        // byte to the last checksum.
        let mut last_read: Option<Instant> = None;
        for from in 0..readers {
            if let Read::Done {
                at,
                waited,
                reading,
            } = recv(from, &mut out)?
            {
                out.io_stalled += waited;
                out.reading += reading;
                last_read = last_read.max(Some(at));
            }
        }
        drop(to_hash);
        // Every block's verdict, in block order: the first failure is the miss.
        let mut verdicts: Vec<Verdict> = verdict_rx.iter().collect();
        verdicts.sort_unstable_by_key(|v| v.block);
        out.hashing = verdicts.iter().map(|v| v.busy).sum();
        let failed = verdicts.iter().position(|v| !v.ok);
        let failed = failed.or((verdicts.len() < plan.nblocks).then_some(verdicts.len()));
        if let Some(block) = failed {
            let key = body.blocks[block].0;
            let blob = blob_name(BlobKind::KvBlock, &key);
            let e = ReadError::Checksum { blob };
            return Err((e, Some((BlobKind::KvBlock, key))));
        }
        out.blocks = plan.nblocks;
        out.io_stalled += last_read.map_or(Duration::ZERO, |at| at.elapsed());
        Ok(out)
    })
}

/// A hasher thread: its blocks' headers and extents in order; a verdict for each block;
/// each buffer back to its reader once hashed.
fn hash_blocks(
    work: mpsc::Receiver<Hash>,
    free: Vec<mpsc::Sender<Buffer>>,
    verdicts: mpsc::Sender<Verdict>,
) {
    // An extent's hash on rayon's threads too: a block's extents are hashed in order, so one
    // thread a block would leave the checksums as slow as the blocks in flight are few.
    let mut hasher = GatherHasher::parallel();
    let (mut block, mut sum, mut busy) = (0, [0u8; 32], Duration::ZERO);
    for w in work {
        let t = Instant::now();
        match w {
            Hash::Header(h) => {
                hasher.reset();
                hasher.update(&h.head[..CHECKSUM_AT]);
                (block, sum, busy) = (h.block, h.sum, Duration::ZERO);
            }
            Hash::Extent {
                len,
                last,
                home,
                buf,
            } => {
                hasher.update(&buf.bytes()[..len]);
                let _ = free[home].send(buf);
                if last {
                    let ok = hasher.finalize() == sum;
                    busy += t.elapsed();
                    let _ = verdicts.send(Verdict { block, ok, busy });
                    continue;
                }
            }
        }
        busy += t.elapsed();
    }
}

/// The reader thread: every block's header, then its extents, in file order.
fn read_all(
    inner: &Inner,
    body: &EntryBody,
    plan: &Plan,
    blocks: impl Iterator<Item = usize> + Clone,
    tx: &mpsc::Sender<Result<Read, Failed>>,
    free: mpsc::Receiver<Buffer>,
) -> Result<(), Failed> {
    let (mut waited, mut reading) = (Duration::ZERO, Duration::ZERO);
    for opened in open_in_turn(inner, body, plan, blocks) {
        let OpenBlock {
            block,
            key,
            file,
            head,
            sum,
        } = opened?;
        let blob = |e| (e, Some((BlobKind::KvBlock, key)));
        let layer_bytes = 2 * plan.stored(block) * plan.row_bytes;
        if tx
            .send(Ok(Read::Header(Header { block, head, sum })))
            .is_err()
        {
            return Ok(());
        }
        for layers in plan.extents() {
            let offset = (HEADER_LEN + layers.start * layer_bytes) as u64;
            let len = layers.len() * layer_bytes;
            let t = Instant::now();
            let Ok(mut buf) = free.recv() else {
                return Ok(());
            };
            let room = buf.to_fill().map_err(|e| (ReadError::Sink(e), None))?;
            waited += t.elapsed();
            let Some(room) = room.get_mut(..len) else {
                let e = format!(
                    "a lent buffer of {} bytes for an extent of {len}",
                    room.len()
                );
                return Err((ReadError::Sink(e.into()), None));
            };
            let t = Instant::now();
            read_pieces(file.as_ref(), offset, room).map_err(|e| blob(io(e, key)))?;
            reading += t.elapsed();
            let extent = Read::Extent {
                block,
                layers,
                len,
                buf,
            };
            if tx.send(Ok(extent)).is_err() {
                return Ok(());
            }
        }
    }
    let at = Instant::now();
    let _ = tx.send(Ok(Read::Done {
        at,
        waited,
        reading,
    }));
    Ok(())
}
