//! [`Inner`]: what every part of the store shares (the storage, the manifest, the config,
//! the locks), and the file names of its blobs.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use redb::ReadableTableMetadata;

use super::space::{Space, Usage};
use crate::budget::ColdConfig;
use crate::codec::BlobKind;
use crate::error::{db, ManifestError, WriteError};
use crate::hex::hex;
use crate::manifest::{self, Manifest};
use crate::storage::Storage;
use crate::sync::lock;
use crate::write_budget::WriteWindow;

pub(crate) const BLOBS_DIR: &str = "blobs";
pub(crate) const TMP_DIR: &str = "tmp";

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

pub(crate) fn blob_path(kind: BlobKind, key: &[u8; 32]) -> PathBuf {
    Path::new(BLOBS_DIR).join(format!("{}.{}", hex(key), kind.extension()))
}

pub(crate) fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
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
        if let Ok((m, _)) = Manifest::open(&self.storage) {
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
        let ids = manifest::entries_referencing(&w, &keys)?;
        let mut released = Vec::new();
        for id in ids {
            released.extend(manifest::remove_entry(&w, id)?.unwrap_or_default());
        }
        w.commit().map_err(db)?;
        self.delete_blobs(&released);
        Ok(())
    }
}
