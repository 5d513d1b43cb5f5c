//! Reading an entry's KV blocks into host buffers the sink lends ([`KvSink::lend_staging`]:
//! a device cache's page-locked memory). Three stages run side by side, each buffer passing
//! through them in turn:
//!
//! - the reader thread fills a free buffer with an extent (whole layers of a block, read in
//!   pieces on rayon's threads), after [`StagingBuffer::to_fill`] has waited for the
//!   buffer's last copy out;
//! - the calling thread hands the extent's rows to the sink ([`KvSink::write_staged`]),
//!   which queues their copy and returns;
//! - hasher threads, each taking every `HASHERS`-th block, hash the extent and free the
//!   buffer for the reader.
//!
//! Nothing copies the rows between the read and the sink's own copy, and the checksums no
//! longer hold up the hand-over: the staged path (`blocks.rs`) copies every byte into the
//! sink's staging and waits for each extent's checksum. As there, rows reach the sink before
//! their block's checksum is known (the sink contract covers it: a failed restore discards).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::blob::{blob_name, check_header, open_blob};
use super::blocks::{io, read_pieces};
use super::inner::Inner;
use super::rows::{BlocksRead, Failed, GatherHasher, Plan};
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

/// Buffers asked of the sink: enough for the reader to run ahead of the hand-over and the
/// checksums of a few blocks.
pub(super) const LENT_BUFFERS: usize = 12;

/// Threads hashing blocks side by side (block `i` on thread `i % HASHERS`): one thread
/// hashes 4-7 GB/s, a device's restore reads faster than that.
const HASHERS: usize = 4;

type Buffer = Box<dyn StagingBuffer>;

/// What the reader sends the calling thread, in file order.
enum Read {
    /// Block `block`'s header, already checked against the manifest; its checksum is not.
    Header {
        block: usize,
        head: Box<[u8; HEADER_LEN]>,
        sum: [u8; 32],
    },
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
    Header {
        block: usize,
        head: Box<[u8; HEADER_LEN]>,
        sum: [u8; 32],
    },
    Extent {
        len: usize,
        last: bool,
        buf: Buffer,
    },
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
    let (read_tx, read_rx) = mpsc::channel::<Result<Read, Failed>>();
    let (free_tx, free_rx) = mpsc::channel::<Buffer>();
    let (sum_tx, sum_rx) = mpsc::channel::<(usize, bool)>();
    for buf in buffers {
        free_tx.send(buf).expect("the receiver is here");
    }
    let hashers = HASHERS.min(plan.nblocks).max(1);

    // `move`: the channels' ends are dropped when the caller stops early, which ends the
    // reader (its free buffers stop coming) and the hashers (their work stops coming).
    std::thread::scope(move |scope| {
        scope.spawn(move || {
            if let Err(e) = read_all(inner, body, plan, &read_tx, free_rx) {
                let _ = read_tx.send(Err(e));
            }
        });
        let mut to_hash = Vec::with_capacity(hashers);
        for _ in 0..hashers {
            let (tx, rx) = mpsc::channel::<Hash>();
            let (free, sums) = (free_tx.clone(), sum_tx.clone());
            scope.spawn(move || hash_blocks(rx, free, sums));
            to_hash.push(tx);
        }
        drop((free_tx, sum_tx));

        let mut out = BlocksRead {
            path: ReadPath::Lent { hashers },
            ..BlocksRead::default()
        };
        let row = plan.row_bytes;
        loop {
            let t = Instant::now();
            let Ok(read) = read_rx.recv() else {
                unreachable!("the reader ends with `Done` or an error")
            };
            let received = Instant::now();
            out.awaiting_reads += received - t;
            match read? {
                Read::Header { block, head, sum } => {
                    let work = Hash::Header { block, head, sum };
                    let _ = to_hash[block % hashers].send(work);
                }
                Read::Extent {
                    block,
                    layers,
                    len,
                    mut buf,
                } => {
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
                    let _ = to_hash[block % hashers].send(Hash::Extent { len, last, buf });
                    if last {
                        let n = plan.stored(block);
                        out.bytes += (HEADER_LEN + n * plan.g.bytes_per_token() as usize) as u64;
                    }
                    out.delivering += received.elapsed();
                }
                Read::Done {
                    at,
                    waited,
                    reading,
                } => {
                    drop(to_hash);
                    // Every block's verdict, in block order: the first failure is the miss.
                    let mut sums: Vec<(usize, bool)> = sum_rx.iter().collect();
                    sums.sort_unstable();
                    let failed = sums.iter().find(|(_, ok)| !ok).map(|(b, _)| *b);
                    let failed = failed.or((sums.len() < plan.nblocks).then_some(sums.len()));
                    if let Some(block) = failed {
                        let key = body.blocks[block].0;
                        let blob = blob_name(BlobKind::KvBlock, &key);
                        let e = ReadError::Checksum { blob };
                        return Err((e, Some((BlobKind::KvBlock, key))));
                    }
                    out.blocks = plan.nblocks;
                    out.io_stalled = waited + at.elapsed();
                    out.reading = reading;
                    return Ok(out);
                }
            }
        }
    })
}

/// A hasher thread: its blocks' headers and extents in order; a verdict for each block;
/// each buffer back to the reader once hashed.
fn hash_blocks(
    work: mpsc::Receiver<Hash>,
    free: mpsc::Sender<Buffer>,
    sums: mpsc::Sender<(usize, bool)>,
) {
    let mut hasher = GatherHasher::default();
    let (mut block, mut sum) = (0, [0u8; 32]);
    for w in work {
        match w {
            Hash::Header {
                block: b,
                head,
                sum: s,
            } => {
                hasher.reset();
                hasher.update(&head[..CHECKSUM_AT]);
                (block, sum) = (b, s);
            }
            Hash::Extent { len, last, buf } => {
                hasher.update(&buf.bytes()[..len]);
                let _ = free.send(buf);
                if last {
                    let _ = sums.send((block, hasher.finalize() == sum));
                }
            }
        }
    }
}

/// The reader thread: every block's header, then its extents, in file order.
fn read_all(
    inner: &Inner,
    body: &EntryBody,
    plan: &Plan,
    tx: &mpsc::Sender<Result<Read, Failed>>,
    free: mpsc::Receiver<Buffer>,
) -> Result<(), Failed> {
    let (mut waited, mut reading) = (Duration::ZERO, Duration::ZERO);
    let open = |i: usize| {
        let f = open_blob(inner, BlobKind::KvBlock, &body.blocks[i].0);
        if let Ok(f) = &f {
            f.will_need();
        }
        f
    };
    let mut next = Some(open(0));
    for block in 0..plan.nblocks {
        let key = body.blocks[block].0;
        let blob = |e| (e, Some((BlobKind::KvBlock, key)));
        let file = next.take().expect("opened ahead").map_err(blob)?;
        // The kernel reads the next block ahead while this one streams.
        if block + 1 < plan.nblocks {
            next = Some(open(block + 1));
        }
        let n = plan.stored(block);
        let layer_bytes = 2 * n * plan.row_bytes;
        let bytes = n * plan.g.bytes_per_token() as usize;
        let (head, sum) =
            check_header(file.as_ref(), &key, plan.descriptor(block), bytes).map_err(blob)?;
        let head = Box::new(head);
        if tx.send(Ok(Read::Header { block, head, sum })).is_err() {
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
