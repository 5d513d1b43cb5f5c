//! Opening a store: reconcile the blob directory with the manifest.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use redb::ReadableTable;

use super::inner::{blob_path, Inner, BLOBS_DIR, TMP_DIR};
use crate::budget::ColdConfig;
use crate::codec::{blob::HEADER_LEN, BlobHeader, BlobKind};
use crate::error::{db, OpenError};
use crate::hex::hex;
use crate::manifest::{self, Manifest};
use crate::storage::Storage;

/// What [`crate::ColdStore::open`] found and repaired.
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

fn io<'a>(op: &'static str, path: &'a str) -> impl FnOnce(std::io::Error) -> OpenError + 'a {
    move |source| OpenError::Io {
        op,
        path: path.into(),
        source,
    }
}

pub(crate) fn open(
    storage: Arc<dyn Storage>,
    config: ColdConfig,
) -> Result<(Inner, OpenReport), OpenError> {
    let mut report = OpenReport::default();
    for dir in [BLOBS_DIR, TMP_DIR] {
        storage
            .create_dir(Path::new(dir))
            .map_err(io("create", dir))?;
    }
    // 1. Interrupted writes: every temp file goes.
    for (name, _) in storage
        .list(Path::new(TMP_DIR))
        .map_err(io("list", TMP_DIR))?
    {
        storage
            .remove(&Path::new(TMP_DIR).join(&name))
            .map_err(io("remove", TMP_DIR))?;
        report.temp_removed += 1;
    }
    let (manifest, reset) = Manifest::open(&storage)?;
    report.manifest_reset = reset;
    let inner = Inner {
        storage,
        manifest: RwLock::new(Arc::new(manifest)),
        config,
        mutate: Mutex::new(()),
        gc: RwLock::new(()),
        damaged: Mutex::new(Vec::new()),
        written: Mutex::new(Default::default()),
    };
    reconcile(&inner, &mut report)?;
    // 4. A crash between a write's commit and its eviction, or a lower cap, leaves the
    // store over its cap: evict now.
    if let Ok(free) = inner.storage.free_space() {
        let cap = inner.config.effective_cap(free, inner.usage()?.used_bytes);
        report.entries_evicted = super::write::evict(&inner, cap, None).map_err(|e| match e {
            crate::WriteError::Manifest(e) => OpenError::Manifest(e),
            other => OpenError::Io {
                op: "evict",
                path: BLOBS_DIR.into(),
                source: std::io::Error::other(other.to_string()),
            },
        })?;
    }
    report.entries = inner.usage()?.entries;
    Ok((inner, report))
}

/// Drops the entries whose blobs are missing or damaged (step 2), then removes the blob
/// files no entry references (step 3).
fn reconcile(inner: &Inner, report: &mut OpenReport) -> Result<(), OpenError> {
    let storage = inner.storage.as_ref();
    let files: HashMap<String, u64> = storage
        .list(Path::new(BLOBS_DIR))
        .map_err(io("list", BLOBS_DIR))?
        .into_iter()
        .collect();

    let mut bad = HashSet::new();
    let mut live = HashSet::new();
    {
        let r = inner.manifest().db.begin_read().map_err(db)?;
        let blobs = r.open_table(manifest::BLOBS).map_err(db)?;
        for row in blobs.iter().map_err(db)? {
            let (key, v) = row.map_err(db)?;
            let (key, (code, len, _)) = (key.value(), v.value());
            let Some(kind) = BlobKind::from_code(code) else {
                bad.insert(key);
                continue;
            };
            let name = format!("{}.{}", hex(&key), kind.extension());
            if files.get(&name) != Some(&len) || !header_ok(storage, kind, &key, len) {
                bad.insert(key);
            } else {
                live.insert(name);
            }
        }
    }

    if !bad.is_empty() {
        let w = inner.manifest().begin_write()?;
        let mut released = Vec::new();
        for id in manifest::entries_referencing(&w, &bad)? {
            released.extend(manifest::remove_entry(&w, id)?.unwrap_or_default());
            report.entries_dropped += 1;
        }
        w.commit().map_err(db)?;
        for r in released {
            live.remove(&format!("{}.{}", hex(&r.key), r.kind.extension()));
        }
    }

    for name in files.keys() {
        if !live.contains(name) {
            storage
                .remove(&Path::new(BLOBS_DIR).join(name))
                .map_err(io("remove", BLOBS_DIR))?;
            report.orphans_removed += 1;
        }
    }
    Ok(())
}

/// Whether a blob's header says what the manifest says (the checksum is verified on read).
fn header_ok(storage: &dyn Storage, kind: BlobKind, key: &[u8; 32], len: u64) -> bool {
    let Ok(f) = storage.open(&blob_path(kind, key)) else {
        return false;
    };
    let mut buf = [0u8; HEADER_LEN];
    if f.read_at(0, &mut buf).is_err() {
        return false;
    }
    match BlobHeader::decode(&buf) {
        Ok((h, _)) => h.kind() == kind && h.key == *key && h.payload_len + HEADER_LEN as u64 == len,
        Err(_) => false,
    }
}
