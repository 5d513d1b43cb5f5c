//! What the bank sees: the [`ColdIndex`] trait, its candidates and its named misses.

use std::time::Duration;

use crate::error::{ReadError, WriteError};
use crate::id::EntryId;
use crate::identity::{Identity, IdentityDigest};
use crate::miss::MissReason;
use crate::payload::KvSink;
use crate::writer::SpillTicket;
use crate::SpillEntry;

/// A lookup: which stored state best covers `prompt` under `identity`.
#[derive(Debug, Clone, Copy)]
pub struct ColdQuery<'a> {
    pub identity: &'a Identity,
    pub prompt: &'a [u32],
    /// The lowest restore point the caller accepts for a hybrid entry (one with recurrent
    /// state): a hybrid row whose newest checkpoint at or below the match lies below it is
    /// refused as [`MissReason::BoundaryBelowFloor`]. 0 accepts any checkpoint.
    pub floor: usize,
}

/// How a candidate matches the prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatchKind {
    /// The entry's tokens are a prefix of the prompt (`ssd_clone`).
    ExactPrefix,
    /// The prompt shares the entry's first `covered / 256` blocks
    /// (`ssd_block_prefix_boundary_clone`).
    BlockPrefix,
}

/// A stored state that can serve a prompt, described from the manifest alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColdCandidate {
    pub entry: EntryId,
    pub kind: MatchKind,
    pub identity: IdentityDigest,
    /// Prompt tokens the entry matches.
    pub covered: usize,
    /// Tokens a restore delivers: `covered` for an attention-only entry, the newest
    /// checkpoint at or below `covered` for a hybrid one.
    pub restore_point: usize,
    /// The entry's own length.
    pub entry_tokens: usize,
    /// Recurrent checkpoint positions; `None` for an attention-only entry.
    pub checkpoints: Option<Vec<u32>>,
    /// Whether a restore delivers the entry's tail state (restore point = entry length).
    pub tail: bool,
    /// Bytes a restore at `restore_point` reads from disk.
    pub read_bytes: u64,
}

/// Both answers to a lookup; the bank ranks them with its RAM candidates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColdLookup {
    pub exact: Result<ColdCandidate, MissReason>,
    pub block: Result<ColdCandidate, MissReason>,
}

impl ColdLookup {
    pub fn miss(reason: MissReason) -> ColdLookup {
        ColdLookup {
            exact: Err(reason),
            block: Err(reason),
        }
    }

    /// The candidate with the highest restore point (the exact one on a tie), or the most
    /// specific miss reason.
    pub fn best(&self) -> Result<&ColdCandidate, MissReason> {
        match (&self.exact, &self.block) {
            (Ok(e), Ok(b)) if b.restore_point > e.restore_point => Ok(b),
            (Ok(e), _) => Ok(e),
            (Err(_), Ok(b)) => Ok(b),
            (Err(e), Err(b)) => Err(if b.rank() > e.rank() { *b } else { *e }),
        }
    }
}

/// What a restore delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreReport {
    /// KV positions written to the sink.
    pub rows: usize,
    pub blocks_read: usize,
    /// Bytes read from blobs (headers included).
    pub bytes_read: u64,
    /// The checkpoint installed, for a hybrid entry.
    pub recurrent_at: Option<u32>,
    pub tail: bool,
    /// How the KV blocks were read.
    pub read_path: ReadPath,
    /// Where the time went.
    pub timings: RestoreTimings,
}

/// How a restore read its KV blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadPath {
    /// The sink lends no rows ([`crate::KvSink::direct_rows`] is `None`): a reader thread
    /// streamed extents into staging buffers while the calling thread hashed them and
    /// handed their rows over through [`crate::KvSink::write_rows`], one copy more.
    Staged,
    /// The sink lent its rows (in one piece per layer or several) and some blob was not in
    /// memory: a reader thread streamed extents from disk straight into them while the
    /// calling thread hashed them.
    #[default]
    Streamed,
    /// The sink lent host buffers ([`crate::KvSink::lend_staging`]: a device's page-locked
    /// memory): a reader thread read extents into them, the calling thread handed each to
    /// the sink (which queues its copy onwards) and `hashers` threads checked the blocks'
    /// checksums, each taking every `hashers`-th block. No copy between the read and the
    /// sink's own.
    Lent { hashers: usize },
    /// Every block was in memory (the page cache) and the sink lent its rows: `threads`
    /// threads (the calling thread one of them) claimed whole blocks, each copying a block
    /// straight into the sink and hashing its rows right after copying them.
    Resident { threads: usize },
}

/// Wall-clock time of a restore's parts, for metrics and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RestoreTimings {
    /// The whole restore.
    pub total: Duration,
    /// Manifest work: loading the entry's records, and the LRU touch after it.
    pub manifest: Duration,
    /// How long verification and delivery held up the disk reads. Streamed: the time the
    /// reader waited for the calling thread (which hashes every extent and, for a sink
    /// without direct rows, copies it into the sink), plus the time from the last byte read
    /// to the last checksum checked; with direct rows, the checksum's cost not hidden behind
    /// I/O. Lent: the readers' waits for free buffers (hashed and copied out), summed, plus
    /// the time from the last byte read to the last checksum checked. Resident: there is no
    /// I/O to hide behind; all threads' hashing time divided by the number of threads, an
    /// estimate of the checksum's share of the wall time.
    pub io_stalled: Duration,
    /// Streamed: the reader thread's time in reads (the page cache or the disk), summed
    /// over its extents (lent: over its readers' too). Zero on the resident path.
    pub reading: Duration,
    /// Streamed: the calling thread's time on the extents it received (hashing them, and
    /// for a sink without direct rows, handing their rows over).
    pub delivering: Duration,
    /// Staged: of `delivering`, the time handing rows to the sink ([`crate::KvSink::write_rows`];
    /// the checksum runs beside it, on rayon's pool).
    pub handing_over: Duration,
    /// Streamed: the calling thread's time waiting for the reader's next extent.
    pub awaiting_reads: Duration,
    /// Lent: the hasher threads' time hashing, summed over them.
    pub hashing: Duration,
}

/// The SSD tier as the bank uses it.
pub trait ColdIndex: Send + Sync {
    /// The best stored states for a prompt, answered from the manifest only: no blob is
    /// opened, so ranking candidates costs no tensor decoding.
    fn lookup(&self, query: &ColdQuery<'_>) -> ColdLookup;

    /// Reads `candidate`'s blocks up to its restore point (and no further), verifies each
    /// checksum, and writes the rows into `sink` in the caller's own layout.
    fn restore(
        &self,
        candidate: &ColdCandidate,
        sink: &mut dyn KvSink,
    ) -> Result<RestoreReport, ReadError>;

    /// Queues an entry for the background writer (write-behind; never on a request's path).
    fn spill(&self, entry: SpillEntry) -> Result<SpillTicket, WriteError>;

    /// Whether a spill of `entry` would be written, as far as can be told before queueing
    /// it (free disk above the floor, the entry within the cap in force, room in the
    /// writer's backlog): the bank asks before an entry leaves RAM. A tier that can't tell
    /// says yes; the spill's own outcome is then the answer.
    fn check_room(&self, entry: &SpillEntry) -> Result<(), WriteError> {
        let _ = entry;
        Ok(())
    }
}

/// The cold tier when it is off: every lookup misses with `ssd_cache_off`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ColdOff;

impl ColdIndex for ColdOff {
    fn lookup(&self, _: &ColdQuery<'_>) -> ColdLookup {
        ColdLookup::miss(MissReason::CacheOff)
    }

    fn restore(&self, c: &ColdCandidate, _: &mut dyn KvSink) -> Result<RestoreReport, ReadError> {
        Err(ReadError::EntryGone(c.entry))
    }

    fn spill(&self, _: SpillEntry) -> Result<SpillTicket, WriteError> {
        Err(WriteError::Off)
    }
}
