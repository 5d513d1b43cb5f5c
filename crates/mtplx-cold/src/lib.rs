//! mtplx-cold: the SSD cold tier.
//!
//! Stores conversation states (K/V rows, recurrent checkpoints, last-position and MTP
//! state) on disk, content-addressed in 256-token blocks so a shared prefix is stored once,
//! and restores them at close to the disk's read bandwidth into whatever layout the caller
//! builds. It knows nothing of tensors, tokio, HTTP or the model: entries are plain
//! descriptors ([`SpillEntry`], [`KvSource`], [`KvSink`]), and K/V rows plain bytes.
//!
//! The bank uses it through [`ColdIndex`]: [`ColdIndex::lookup`] ranks candidates from the
//! manifest alone (no blob is read), [`ColdIndex::restore`] reads only the blocks up to
//! the restore point and checks every checksum, [`ColdIndex::spill`] queues a write for the
//! background writer.
//!
//! On disk (byte layouts in `docs/cold-format.md`): `blobs/` holds one file per KV block
//! or state blob, named by its blake3 key, each with a 256-byte header and a checksum;
//! `manifest.redb` (redb) holds the entries and indexes. A write is blobs first (temp file,
//! fsync, rename, fsync the directory), then one manifest transaction; open reconciles
//! whatever a crash left.
//!
//! # Invariants
//! - A restore that returns `Ok` delivered exactly the rows that were written; one that
//!   fails returns a named miss ([`MissReason`]) and calls [`KvSink::discard`]: rows may
//!   reach the sink before their block's checksum is checked (verification overlaps the
//!   reads), so nothing a sink received is accepted state until `restore` returns `Ok`.
//! - A lookup never opens a blob.
//! - A state is never offered under another [`Identity`]: every key derives from its digest.
//! - K/V rows are stored as the bytes of their own element type ([`KvDtype`], recorded in
//!   the entry and in every block) and never converted; the type is part of the identity,
//!   so rows of one type never reach a server keeping another.

mod budget;
pub mod codec;
mod dtype;
mod entry;
mod error;
mod hex;
mod id;
mod identity;
mod index;
mod key;
mod manifest;
mod miss;
mod payload;
pub mod storage;
mod store;
mod sync;
mod write_budget;
mod writer;

pub use budget::{default_cap, physical_ram, ColdConfig, DEFAULT_WRITE_BUDGET_PER_HOUR, GIB};
pub use dtype::KvDtype;
pub use entry::SpillEntry;
pub use error::{Error, ManifestError, OpenError, ReadError, WriteError};
pub use id::EntryId;
pub use identity::{Identity, IdentityDigest, Mtp};
pub use index::{
    ColdCandidate, ColdIndex, ColdLookup, ColdOff, ColdQuery, MatchKind, ReadPath, RestoreReport,
    RestoreTimings,
};
pub use key::{
    block_keys, blocks_for, full_block_keys, BlockKey, StateKey, TokenHash, BLOCK_TOKENS,
    FORMAT_VERSION,
};
pub use miss::{MissReason, RestoreErrorKind};
pub use payload::{
    BoxError, DirectLayer, DirectPiece, F32Buffer, KvGeometry, KvRows, KvSink, KvSource,
    NamedBytes, Recurrent, RecurrentCheckpoint, StagingBuffer, TailState,
};
pub use store::{ColdStore, OpenReport, Space, Usage};
pub use write_budget::WriteStats;
pub use writer::{ForegroundGuard, SpillTicket};
