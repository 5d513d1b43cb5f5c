//! One error enum per operation, folding into [`Error`].

use std::io;
use std::path::PathBuf;

use crate::dtype::KvDtype;
use crate::id::EntryId;
use crate::miss::{MissReason, RestoreErrorKind};
use crate::payload::BoxError;

/// Why [`crate::ColdStore::open`] failed. A damaged manifest is not an error: it is set
/// aside and the store starts empty (see [`crate::OpenReport`]).
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cold store: {op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("cold store directory {path} is in use by another process")]
    Locked { path: PathBuf },
    #[error("cold store manifest: {0}")]
    Manifest(#[from] ManifestError),
}

/// Why a restore failed. Each maps to a named miss through [`ReadError::miss_reason`].
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("entry {0:?} is no longer stored")]
    EntryGone(EntryId),
    #[error("entry {0:?} belongs to another identity")]
    IdentityMismatch(EntryId),
    #[error("entry {entry:?} can't be restored at position {point}: {why}")]
    NotRestorable {
        entry: EntryId,
        point: usize,
        why: &'static str,
    },
    #[error("blob {blob} is missing")]
    Missing { blob: String },
    #[error("blob {blob} is truncated: {actual} bytes, expected {expected}")]
    Truncated {
        blob: String,
        expected: u64,
        actual: u64,
    },
    #[error("blob {blob} is not an mtplx-cold blob")]
    Foreign { blob: String },
    #[error("blob {blob} has format version {found}, expected {expected}")]
    FormatMismatch {
        blob: String,
        found: u32,
        expected: u32,
    },
    #[error("blob {blob} fails its checksum")]
    Checksum { blob: String },
    #[error("blob {blob} has a bad header: {what}")]
    Header { blob: String, what: &'static str },
    /// A block's header names another element type than its entry's (`found` is the
    /// header's code, maybe one this build does not know): its rows are never delivered.
    #[error("blob {blob} holds K/V rows of element type code {found}, its entry's are {expected}")]
    KvDtype {
        blob: String,
        found: u8,
        expected: KvDtype,
    },
    #[error("blob {blob} payload: {what}")]
    Decode { blob: String, what: &'static str },
    #[error("blob {blob}: {source}")]
    Io { blob: String, source: io::Error },
    #[error("cold store manifest: {0}")]
    Manifest(#[from] ManifestError),
    #[error("restore sink: {0}")]
    Sink(BoxError),
    #[error("reading the free disk space: {0}")]
    FreeSpace(io::Error),
}

impl ReadError {
    /// The miss this failure is reported as.
    pub fn miss_reason(&self) -> MissReason {
        use RestoreErrorKind as K;
        let kind = match self {
            ReadError::EntryGone(_) | ReadError::Missing { .. } => {
                return MissReason::PayloadMissing
            }
            ReadError::FormatMismatch { .. } => return MissReason::FormatMismatch,
            ReadError::IdentityMismatch(_) => K::Identity,
            ReadError::NotRestorable { .. } => K::NotRestorable,
            ReadError::Truncated { .. } => K::Truncated,
            ReadError::Foreign { .. } => K::Foreign,
            ReadError::Checksum { .. } => K::Checksum,
            ReadError::Header { .. } => K::Header,
            ReadError::KvDtype { .. } => K::KvDtype,
            ReadError::Decode { .. } => K::Decode,
            ReadError::Io { .. } | ReadError::FreeSpace(_) => K::Io,
            ReadError::Manifest(_) => K::Manifest,
            ReadError::Sink(_) => K::Sink,
        };
        MissReason::RestoreError(kind)
    }

    /// Whether the failure says the stored bytes are bad (the entry is then dropped).
    pub(crate) fn is_damage(&self) -> bool {
        matches!(
            self,
            ReadError::Missing { .. }
                | ReadError::Truncated { .. }
                | ReadError::Foreign { .. }
                | ReadError::FormatMismatch { .. }
                | ReadError::Checksum { .. }
                | ReadError::Header { .. }
                | ReadError::KvDtype { .. }
                | ReadError::Decode { .. }
        )
    }
}

/// Why a write (a spill or a direct put) was refused or failed. A failed write leaves the
/// store as it was: the entry is simply not stored.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("invalid entry: {0}")]
    Invalid(String),
    /// The entry's rows are of another element type than its identity says the server
    /// keeps: stored, they would be offered to servers of the wrong type.
    #[error("entry rows are {geometry}, its identity's kv_dtype is {identity}")]
    KvDtypeMismatch {
        identity: KvDtype,
        geometry: KvDtype,
    },
    #[error("free disk space {free} B is below the floor of {floor} B")]
    BelowFreeDiskFloor { free: u64, floor: u64 },
    #[error("entry needs {bytes} B, over the cold tier's cap of {cap} B")]
    TooLarge { bytes: u64, cap: u64 },
    #[error(
        "ssd_write_budget: {written_last_hour} B written in the last hour + {bytes} B > {budget} B an hour"
    )]
    OverWriteBudget {
        written_last_hour: u64,
        bytes: u64,
        budget: u64,
    },
    #[error("writer backlog full: {backlog} B queued + {bytes} B > {cap} B")]
    BacklogFull { backlog: u64, bytes: u64, cap: u64 },
    #[error("reading rows to spill: {0}")]
    Source(BoxError),
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("cold store manifest: {0}")]
    Manifest(#[from] ManifestError),
    #[error("the cold store's writer has stopped")]
    Shutdown,
    #[error("the cold tier is off")]
    Off,
}

impl WriteError {
    /// A short name for the failure, for counters and logs (`too_large`, `no_space`, …).
    pub fn reason(&self) -> &'static str {
        match self {
            WriteError::Invalid(_) => "invalid",
            WriteError::KvDtypeMismatch { .. } => "kv_dtype_mismatch",
            WriteError::BelowFreeDiskFloor { .. } => "below_free_disk_floor",
            WriteError::TooLarge { .. } => "too_large",
            WriteError::OverWriteBudget { .. } => "over_write_budget",
            WriteError::BacklogFull { .. } => "backlog_full",
            WriteError::Source(_) => "source",
            WriteError::Io { source, .. } if source.raw_os_error() == Some(libc::ENOSPC) => {
                "no_space"
            }
            WriteError::Io { .. } => "io",
            WriteError::Manifest(_) => "manifest",
            WriteError::Shutdown => "shutdown",
            WriteError::Off => "off",
        }
    }
}

/// Every way the cold tier can fail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Open(#[from] OpenError),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// A failure of the manifest database (redb), boxed: redb's error is large.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct ManifestError(#[from] pub Box<redb::Error>);

impl ManifestError {
    /// Whether the file system failed (rather than the data being damaged).
    pub fn is_io(&self) -> bool {
        matches!(*self.0, redb::Error::Io(_) | redb::Error::PreviousIo)
    }
}

/// redb's per-call error types, folded into a [`ManifestError`] at the `?`.
pub(crate) fn db<E: Into<redb::Error>>(e: E) -> ManifestError {
    ManifestError(Box::new(e.into()))
}
