//! [`ColdStore`]: the cold tier over a [`Storage`].

mod blocks;
mod lookup;
mod open;
mod read;
mod resident;
mod write;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use redb::ReadableTableMetadata;

use crate::budget::ColdConfig;
use crate::codec::BlobKind;
use crate::error::{db, ManifestError, OpenError, ReadError, WriteError};
use crate::index::{ColdCandidate, ColdIndex, ColdLookup, ColdQuery, EntryId, RestoreReport};
use crate::key::hex;
use crate::manifest::{self, Manifest};
use crate::payload::KvSink;
use crate::storage::{FsStorage, Storage};
use crate::write_budget::{WriteStats, WriteWindow};
use crate::writer::{ForegroundGuard, SpillTicket, Writer};
use crate::SpillEntry;

pub(crate) const BLOBS_DIR: &str = "blobs";
pub(crate) const TMP_DIR: &str = "tmp";

/// What [`ColdStore::open`] found and repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Why the manifest was set aside and the store started empty, if it was.
    pub manifest_reset: Option<String>,
    /// Temporary files of interrupted writes, removed.
    pub temp_removed: usize,
    /// Blob files no entry referenced, removed.
    pub orphans_removed: usize,
    /// Entries dropped because a blob was missing or damaged.
    pub entries_dropped: usize,
    /// Entries evicted because the store was over its cap.
    pub entries_evicted: usize,
    /// Entries kept.
    pub entries: u64,
}

/// How much the store holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub entries: u64,
    /// Bytes of live blob files.
    pub used_bytes: u64,
}

/// The store's room on its disk, read now ([`ColdStore::space`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    pub usage: Usage,
    /// Bytes free on the file system.
    pub free_bytes: u64,
    /// The configured cap ([`ColdConfig::cap_bytes`]).
    pub configured_cap_bytes: u64,
    /// The cap in force: the configured one or a quarter of the disk the store may use
    /// (free plus its own), whichever is smaller. It falls as the disk fills.
    pub cap_bytes: u64,
    /// No write starts below this much free disk.
    pub free_disk_floor: u64,
}

impl Space {
    /// Whether a write of `bytes` would start: free disk above the floor and `bytes`
    /// within the cap in force.
    pub fn admits(&self, bytes: u64) -> Result<(), WriteError> {
        if self.free_bytes < self.free_disk_floor {
            return Err(WriteError::BelowFreeDiskFloor {
                free: self.free_bytes,
                floor: self.free_disk_floor,
            });
        }
        if bytes > self.cap_bytes {
            return Err(WriteError::TooLarge {
                bytes,
                cap: self.cap_bytes,
            });
        }
        Ok(())
    }
}

pub(crate) struct Inner {
    pub(crate) storage: Arc<dyn Storage>,
    /// Replaced (reopened) after an I/O failure: redb refuses every later transaction of
    /// a database whose write failed.
    pub(crate) manifest: RwLock<Arc<Manifest>>,
    pub(crate) config: ColdConfig,
    /// Held by every change to the manifest's entries and by blob writes.
    pub(crate) mutate: Mutex<()>,
    /// Read by restores, written while blob files are deleted.
    pub(crate) gc: RwLock<()>,
    /// Blobs a restore found damaged, whose entries are dropped at the next chance.
    pub(crate) damaged: Mutex<Vec<(BlobKind, [u8; 32])>>,
    /// New blob bytes written in the last hour, against the write budget.
    pub(crate) written: Mutex<WriteWindow>,
}

/// The SSD cold tier. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct ColdStore {
    inner: Arc<Inner>,
    writer: Writer,
    report: OpenReport,
}

pub(crate) fn blob_path(kind: BlobKind, key: &[u8; 32]) -> PathBuf {
    Path::new(BLOBS_DIR).join(format!("{}.{}", hex(key), kind.extension()))
}

pub(crate) fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

pub(crate) fn put_entry(
    inner: &Inner,
    entry: &SpillEntry,
    pause: &dyn Fn(),
) -> Result<EntryId, WriteError> {
    write::put(inner, entry, pause)
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ColdStore {
    /// Opens the store in `storage`, reconciling it with what a crash may have left (see
    /// `docs/cold-format.md`), and starts the background writer.
    pub fn open(storage: Arc<dyn Storage>, config: ColdConfig) -> Result<ColdStore, OpenError> {
        let (inner, report) = open::open(storage, config)?;
        let inner = Arc::new(inner);
        let writer = Writer::start(inner.clone());
        Ok(ColdStore {
            inner,
            writer,
            report,
        })
    }

    /// Opens (creating) the store in directory `root` on the real file system.
    pub fn open_dir(root: &Path, config: ColdConfig) -> Result<ColdStore, OpenError> {
        ColdStore::open(Arc::new(FsStorage::open(root)?), config)
    }

    pub fn report(&self) -> &OpenReport {
        &self.report
    }

    pub fn config(&self) -> &ColdConfig {
        &self.inner.config
    }

    /// Writes an entry now, on the calling thread (the writer thread uses the same path).
    pub fn put(&self, entry: &SpillEntry) -> Result<EntryId, WriteError> {
        write::put(&self.inner, entry, &|| {})
    }

    /// Pauses the background writer (between blocks) until every guard is dropped: hold
    /// one while foreground work (a prefill, a decode) runs.
    pub fn foreground(&self) -> ForegroundGuard {
        self.writer.foreground()
    }

    /// Bytes queued for the background writer.
    pub fn backlog_bytes(&self) -> u64 {
        self.writer.backlog_bytes()
    }

    /// Removes an entry; `false` if it was not stored.
    pub fn remove(&self, id: EntryId) -> Result<bool, WriteError> {
        let _m = lock(&self.inner.mutate);
        let w = self.inner.manifest().begin_write()?;
        let released = manifest::remove_entry(&w, id)?;
        w.commit().map_err(db)?;
        let found = released.is_some();
        self.inner.delete_blobs(&released.unwrap_or_default());
        Ok(found)
    }

    /// What the hourly write budget let through and skipped.
    pub fn write_stats(&self) -> WriteStats {
        lock(&self.inner.written).stats(std::time::Instant::now())
    }

    pub fn usage(&self) -> Result<Usage, ReadError> {
        self.inner.usage().map_err(ReadError::Manifest)
    }

    /// The store's room on its disk, read now (the free space is asked of the file system
    /// at each call).
    pub fn space(&self) -> Result<Space, ReadError> {
        let free = self
            .inner
            .storage
            .free_space()
            .map_err(ReadError::FreeSpace)?;
        Ok(self.inner.space_with(free, self.usage()?))
    }

    /// Entries from least to most recently used.
    pub fn entries_lru(&self) -> Result<Vec<EntryId>, ReadError> {
        let w = self.inner.manifest().begin_write()?;
        let ids = manifest::lru_order(&w)?;
        w.abort().map_err(db)?;
        Ok(ids)
    }

    /// Waits for every queued spill, then stops the writer.
    pub fn close(mut self) {
        self.writer.close();
    }
}

impl Inner {
    pub(crate) fn manifest(&self) -> Arc<Manifest> {
        self.manifest
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Reopens the manifest after a failed transaction (redb repairs it to its last
    /// commit). Called with `mutate` held. If it can't be reopened, the old handle stays
    /// and keeps failing until the process restarts.
    pub(crate) fn recover_manifest(&self) {
        if let Ok((m, _)) = Manifest::open(self.storage.as_ref()) {
            *self.manifest.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(m);
        }
    }

    /// Free bytes on the store's file system, as a write sees them.
    pub(crate) fn free_space(&self) -> Result<u64, WriteError> {
        self.storage.free_space().map_err(|source| WriteError::Io {
            op: "free space",
            path: PathBuf::new(),
            source,
        })
    }

    /// The room a store holding `usage` has with `free` bytes free.
    pub(crate) fn space_with(&self, free: u64, usage: Usage) -> Space {
        Space {
            usage,
            free_bytes: free,
            configured_cap_bytes: self.config.cap_bytes,
            cap_bytes: self.config.effective_cap(free, usage.used_bytes),
            free_disk_floor: self.config.free_disk_floor,
        }
    }

    pub(crate) fn usage(&self) -> Result<Usage, ManifestError> {
        let r = self.manifest().db.begin_read().map_err(db)?;
        let entries = r
            .open_table(manifest::HEADS)
            .map_err(db)?
            .len()
            .map_err(db)?;
        let used_bytes = r
            .open_table(manifest::META)
            .map_err(db)?
            .get("used_bytes")
            .map_err(db)?
            .map_or(0, |v| v.value());
        Ok(Usage {
            entries,
            used_bytes,
        })
    }

    /// Deletes released blob files (after the transaction that released them committed).
    /// A failure leaves an orphan that the next open removes.
    pub(crate) fn delete_blobs(&self, released: &[manifest::Released]) {
        if released.is_empty() {
            return;
        }
        let _gc = self.gc.write().unwrap_or_else(|p| p.into_inner());
        for r in released {
            let _ = self.storage.remove(&blob_path(r.kind, &r.key));
        }
    }

    /// Drops every entry that references a damaged blob. Called with `mutate` held.
    pub(crate) fn drop_damaged(&self) -> Result<(), ManifestError> {
        let damaged = std::mem::take(&mut *lock(&self.damaged));
        if damaged.is_empty() {
            return Ok(());
        }
        let keys: std::collections::HashSet<[u8; 32]> = damaged.iter().map(|d| d.1).collect();
        let w = self.manifest().begin_write()?;
        let ids = open::entries_referencing(&w, &keys)?;
        let mut released = Vec::new();
        for id in ids {
            released.extend(manifest::remove_entry(&w, id)?.unwrap_or_default());
        }
        w.commit().map_err(db)?;
        self.delete_blobs(&released);
        Ok(())
    }
}

impl ColdIndex for ColdStore {
    fn lookup(&self, query: &ColdQuery<'_>) -> ColdLookup {
        lookup::lookup(&self.inner, query)
    }

    fn restore(
        &self,
        candidate: &ColdCandidate,
        sink: &mut dyn KvSink,
    ) -> Result<RestoreReport, ReadError> {
        read::restore(&self.inner, candidate, sink)
    }

    fn spill(&self, entry: SpillEntry) -> Result<SpillTicket, WriteError> {
        self.writer.spill(entry)
    }

    fn check_room(&self, entry: &SpillEntry) -> Result<(), WriteError> {
        let free = self.inner.free_space()?;
        let space = self.inner.space_with(free, self.inner.usage()?);
        let bytes = entry.estimated_bytes();
        space.admits(bytes)?;
        self.writer.check_backlog(bytes)
    }
}

impl std::fmt::Debug for ColdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ColdStore")
            .field("storage", &self.inner.storage)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}
