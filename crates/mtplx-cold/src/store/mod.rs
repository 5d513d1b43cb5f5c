//! [`ColdStore`]: the cold tier over a [`Storage`].

mod blob;
mod blocks;
mod inner;
mod lent;
mod lookup;
mod open;
mod read;
mod resident;
mod rows;
mod space;
mod write;

pub use open::OpenReport;
pub use space::{Space, Usage};

use std::path::Path;
use std::sync::Arc;

use inner::Inner;

use crate::budget::ColdConfig;
use crate::error::{db, OpenError, ReadError, WriteError};
use crate::id::EntryId;
use crate::index::{ColdCandidate, ColdIndex, ColdLookup, ColdQuery, RestoreReport};
use crate::manifest;
use crate::payload::KvSink;
use crate::storage::{FsStorage, Storage};
use crate::sync::lock;
use crate::write_budget::WriteStats;
use crate::writer::{ForegroundGuard, SpillTicket, Writer};
use crate::SpillEntry;

/// The SSD cold tier. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct ColdStore {
    inner: Arc<Inner>,
    writer: Writer,
    report: OpenReport,
}

impl ColdStore {
    /// Opens the store in `storage`, reconciling it with what a crash may have left (see
    /// `docs/cold-format.md`), and starts the background writer.
    pub fn open(storage: Arc<dyn Storage>, config: ColdConfig) -> Result<ColdStore, OpenError> {
        let (inner, report) = open::open(storage, config)?;
        let inner = Arc::new(inner);
        let writer_inner = inner.clone();
        let writer = Writer::start(
            inner.config.backlog_cap_bytes,
            Box::new(move |entry, pause| write::put(&writer_inner, entry, pause)),
        );
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
        entry.validate()?;
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
