//! The manifest: a redb database (`manifest.redb`) of entries, blob reference counts and
//! the indexes lookups use. Tables are listed in `docs/cold-format.md`.

mod backend;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use redb::{
    Database, MultimapTableDefinition, ReadableMultimapTable, ReadableTable, ReadableTableMetadata,
    TableDefinition, WriteTransaction,
};

use crate::codec::{blob::HEADER_LEN, BlobKind, EntryBody, EntryHead};
use crate::error::{db, ManifestError, OpenError};
use crate::id::EntryId;
use crate::key::{BLOCK_TOKENS, FORMAT_VERSION};
use crate::storage::Storage;

pub(crate) const FILE: &str = "manifest.redb";

/// `format_version`, `next_entry`, `tick` (the LRU clock), `used_bytes` (sum of live blob
/// file lengths).
pub(crate) const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
/// entry id → encoded [`EntryHead`].
pub(crate) const HEADS: TableDefinition<u64, &[u8]> = TableDefinition::new("heads");
/// entry id → encoded [`EntryBody`].
pub(crate) const BODIES: TableDefinition<u64, &[u8]> = TableDefinition::new("bodies");
/// entry id → (LRU tick, last access unix seconds, hits).
pub(crate) const STATS: TableDefinition<u64, (u64, u64, u64)> = TableDefinition::new("stats");
/// (LRU tick, entry id) → (): eviction order.
pub(crate) const LRU: TableDefinition<(u64, u64), ()> = TableDefinition::new("lru");
/// token hash → entry id.
pub(crate) const BY_HASH: TableDefinition<[u8; 32], u64> = TableDefinition::new("by_hash");
/// (identity digest, entry length) → number of entries of that length.
pub(crate) const LENGTHS: TableDefinition<([u8; 32], u32), u64> = TableDefinition::new("lengths");
/// block key → ids of the entries that contain the block.
pub(crate) const BLOCK_ENTRIES: MultimapTableDefinition<[u8; 32], u64> =
    MultimapTableDefinition::new("block_entries");
/// blob key → (kind code, file length, reference count), for every live blob.
pub(crate) const BLOBS: TableDefinition<[u8; 32], (u32, u64, u64)> = TableDefinition::new("blobs");

pub(crate) struct Manifest {
    pub(crate) db: Database,
    /// The storage the database lives in, dropped after it (fields drop in order): the
    /// directory's lock is released only once redb has closed its file, so a process that
    /// reopens the directory the moment the lock is free never finds a half-closed database.
    _storage: Arc<dyn Storage>,
}

/// A blob no entry references any more: its file can go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Released {
    pub kind: BlobKind,
    pub key: [u8; 32],
}

/// An I/O failure (worth reporting) rather than a damaged or foreign file (worth setting
/// aside). redb reports a file that is not a database as `InvalidData`.
fn is_io(e: &redb::DatabaseError) -> bool {
    match e {
        redb::DatabaseError::Storage(redb::StorageError::Io(e)) => {
            e.kind() != std::io::ErrorKind::InvalidData
        }
        redb::DatabaseError::Storage(redb::StorageError::PreviousIo) => true,
        _ => false,
    }
}

impl Manifest {
    /// Opens (or creates) the manifest. A manifest that is damaged beyond redb's repair, or
    /// of another format version, is renamed to `manifest.redb.bad` and replaced by an empty
    /// one; the reason is returned.
    pub(crate) fn open(
        storage: &Arc<dyn Storage>,
    ) -> Result<(Manifest, Option<String>), OpenError> {
        let path = Path::new(FILE);
        let io = |op, source| OpenError::Io {
            op,
            path: path.to_path_buf(),
            source,
        };
        let exists = storage
            .list(Path::new(""))
            .map_err(|e| io("list", e))?
            .iter()
            .any(|(n, _)| n == FILE);
        let mut reset = None;
        if exists {
            let file = storage.open(path).map_err(|e| io("open", e))?;
            match Manifest::builder().create_with_backend(backend::Backend(file)) {
                Ok(db) => {
                    let m = Manifest {
                        db,
                        _storage: storage.clone(),
                    };
                    match m.format_version() {
                        Ok(Some(v)) if v == FORMAT_VERSION as u64 => return Ok((m, None)),
                        Ok(v) => reset = Some(format!("manifest format version {v:?}")),
                        Err(e) => reset = Some(format!("manifest unreadable: {e}")),
                    }
                }
                Err(e) if is_io(&e) => return Err(OpenError::Manifest(db(e))),
                Err(e) => reset = Some(format!("manifest damaged: {e}")),
            }
            storage
                .rename(path, Path::new("manifest.redb.bad"))
                .map_err(|e| io("set aside", e))?;
        }
        let file = storage.create(path).map_err(|e| io("create", e))?;
        let db = Manifest::builder()
            .create_with_backend(backend::Backend(file))
            .map_err(|e| OpenError::Manifest(db(e)))?;
        storage
            .sync_dir(Path::new(""))
            .map_err(|e| io("sync directory", e))?;
        let m = Manifest {
            db,
            _storage: storage.clone(),
        };
        m.init().map_err(OpenError::Manifest)?;
        Ok((m, reset))
    }

    fn builder() -> redb::Builder {
        let mut b = Database::builder();
        b.set_cache_size(16 << 20);
        b
    }

    fn format_version(&self) -> Result<Option<u64>, ManifestError> {
        let r = self.db.begin_read().map_err(db)?;
        let t = match r.open_table(META) {
            Ok(t) => t,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
            Err(e) => return Err(db(e)),
        };
        Ok(t.get("format_version").map_err(db)?.map(|v| v.value()))
    }

    /// Creates every table and stamps the format version.
    fn init(&self) -> Result<(), ManifestError> {
        let w = self.begin_write()?;
        {
            let mut meta = w.open_table(META).map_err(db)?;
            meta.insert("format_version", FORMAT_VERSION as u64)
                .map_err(db)?;
            w.open_table(HEADS).map_err(db)?;
            w.open_table(BODIES).map_err(db)?;
            w.open_table(STATS).map_err(db)?;
            w.open_table(LRU).map_err(db)?;
            w.open_table(BY_HASH).map_err(db)?;
            w.open_table(LENGTHS).map_err(db)?;
            w.open_multimap_table(BLOCK_ENTRIES).map_err(db)?;
            w.open_table(BLOBS).map_err(db)?;
        }
        w.commit().map_err(db)
    }

    /// A durable write transaction (two-phase commit, fsync before it returns).
    pub(crate) fn begin_write(&self) -> Result<WriteTransaction, ManifestError> {
        let mut w = self.db.begin_write().map_err(db)?;
        w.set_two_phase_commit(true);
        Ok(w)
    }
}

pub(crate) fn meta_get(w: &WriteTransaction, key: &str) -> Result<u64, ManifestError> {
    let t = w.open_table(META).map_err(db)?;
    let v = t.get(key).map_err(db)?.map(|v| v.value()).unwrap_or(0);
    Ok(v)
}

pub(crate) fn meta_set(w: &WriteTransaction, key: &str, value: u64) -> Result<(), ManifestError> {
    w.open_table(META)
        .map_err(db)?
        .insert(key, value)
        .map_err(db)?;
    Ok(())
}

/// Advances and returns the LRU clock.
pub(crate) fn next_tick(w: &WriteTransaction) -> Result<u64, ManifestError> {
    let t = meta_get(w, "tick")? + 1;
    meta_set(w, "tick", t)?;
    Ok(t)
}

/// File length of block `index` of an entry of `n_tokens` tokens.
pub(crate) fn block_file_len(head: &EntryHead, index: usize) -> u64 {
    let start = index * BLOCK_TOKENS;
    let n = (head.n_tokens as usize - start).min(BLOCK_TOKENS);
    HEADER_LEN as u64 + n as u64 * head.geometry.bytes_per_token()
}

/// Every blob an entry references: (kind, key, file length).
pub(crate) fn entry_blobs(head: &EntryHead, body: &EntryBody) -> Vec<(BlobKind, [u8; 32], u64)> {
    let blocks = body
        .blocks
        .iter()
        .enumerate()
        .map(|(i, k)| (BlobKind::KvBlock, k.0, block_file_len(head, i)));
    let states = head
        .states()
        .map(|s| (BlobKind::State, s.key.0, s.file_len));
    blocks.chain(states).collect()
}

/// Inserts an entry and takes a reference on each of its blobs.
pub(crate) fn insert_entry(
    w: &WriteTransaction,
    id: EntryId,
    head: &EntryHead,
    body: &EntryBody,
    now_s: u64,
) -> Result<(), ManifestError> {
    let mut used = meta_get(w, "used_bytes")?;
    {
        let mut blobs = w.open_table(BLOBS).map_err(db)?;
        for (kind, key, len) in entry_blobs(head, body) {
            let row = blobs.get(key).map_err(db)?.map(|v| v.value());
            let row = match row {
                Some((k, l, refs)) => (k, l, refs + 1),
                None => {
                    used += len;
                    (kind.code(), len, 1)
                }
            };
            blobs.insert(key, row).map_err(db)?;
        }
        let mut be = w.open_multimap_table(BLOCK_ENTRIES).map_err(db)?;
        for k in &body.blocks {
            be.insert(k.0, id.0).map_err(db)?;
        }
    }
    meta_set(w, "used_bytes", used)?;
    w.open_table(HEADS)
        .map_err(db)?
        .insert(id.0, head.encode().as_slice())
        .map_err(db)?;
    w.open_table(BODIES)
        .map_err(db)?
        .insert(id.0, body.encode().as_slice())
        .map_err(db)?;
    w.open_table(BY_HASH)
        .map_err(db)?
        .insert(head.token_hash.0, id.0)
        .map_err(db)?;
    {
        let mut lengths = w.open_table(LENGTHS).map_err(db)?;
        let k = (head.identity.0, head.n_tokens);
        let n = lengths.get(k).map_err(db)?.map_or(0, |v| v.value());
        lengths.insert(k, n + 1).map_err(db)?;
    }
    let tick = next_tick(w)?;
    w.open_table(STATS)
        .map_err(db)?
        .insert(id.0, (tick, now_s, 0))
        .map_err(db)?;
    w.open_table(LRU)
        .map_err(db)?
        .insert((tick, id.0), ())
        .map_err(db)?;
    Ok(())
}

/// Removes an entry and drops its blob references; returns the blobs nobody references
/// any more (their rows are gone; the caller deletes the files after the commit).
/// `Ok(None)` when the entry does not exist.
pub(crate) fn remove_entry(
    w: &WriteTransaction,
    id: EntryId,
) -> Result<Option<Vec<Released>>, ManifestError> {
    let head = {
        let mut t = w.open_table(HEADS).map_err(db)?;
        let v = t.remove(id.0).map_err(db)?.map(|v| v.value().to_vec());
        v
    };
    let Some(head) = head else {
        return Ok(None);
    };
    let body = {
        let mut t = w.open_table(BODIES).map_err(db)?;
        let v = t.remove(id.0).map_err(db)?.map(|v| v.value().to_vec());
        v.unwrap_or_default()
    };
    if let Some((tick, _, _)) = w
        .open_table(STATS)
        .map_err(db)?
        .remove(id.0)
        .map_err(db)?
        .map(|v| v.value())
    {
        w.open_table(LRU)
            .map_err(db)?
            .remove((tick, id.0))
            .map_err(db)?;
    }
    // A record that no longer decodes still had its rows removed; its blobs become
    // orphans, collected at the next open.
    let (Ok(head), Ok(body)) = (EntryHead::decode(&head), EntryBody::decode(&body)) else {
        return Ok(Some(Vec::new()));
    };
    {
        let mut by_hash = w.open_table(BY_HASH).map_err(db)?;
        let current = by_hash
            .get(head.token_hash.0)
            .map_err(db)?
            .map(|v| v.value());
        if current == Some(id.0) {
            by_hash.remove(head.token_hash.0).map_err(db)?;
        }
        let mut lengths = w.open_table(LENGTHS).map_err(db)?;
        let k = (head.identity.0, head.n_tokens);
        let n = lengths.get(k).map_err(db)?.map_or(0, |v| v.value());
        if n <= 1 {
            lengths.remove(k).map_err(db)?;
        } else {
            lengths.insert(k, n - 1).map_err(db)?;
        }
    }
    let mut released = Vec::new();
    let mut used = meta_get(w, "used_bytes")?;
    {
        let mut be = w.open_multimap_table(BLOCK_ENTRIES).map_err(db)?;
        for k in &body.blocks {
            be.remove(k.0, id.0).map_err(db)?;
        }
        let mut blobs = w.open_table(BLOBS).map_err(db)?;
        for (kind, key, _) in entry_blobs(&head, &body) {
            let row = blobs.get(key).map_err(db)?.map(|v| v.value());
            match row {
                Some((code, len, refs)) if refs > 1 => {
                    blobs.insert(key, (code, len, refs - 1)).map_err(db)?;
                }
                Some((_, len, _)) => {
                    blobs.remove(key).map_err(db)?;
                    used = used.saturating_sub(len);
                    released.push(Released { kind, key });
                }
                None => {}
            }
        }
    }
    meta_set(w, "used_bytes", used)?;
    Ok(Some(released))
}

/// Entries in least-recently-used order.
/// Ids of the entries that reference any of `keys` (as a block or a state).
pub(crate) fn entries_referencing(
    w: &WriteTransaction,
    keys: &HashSet<[u8; 32]>,
) -> Result<Vec<EntryId>, ManifestError> {
    let mut ids = HashSet::new();
    let be = w.open_multimap_table(BLOCK_ENTRIES).map_err(db)?;
    for key in keys {
        for id in be.get(key).map_err(db)? {
            ids.insert(id.map_err(db)?.value());
        }
    }
    let heads = w.open_table(HEADS).map_err(db)?;
    if heads.len().map_err(db)? > 0 {
        for row in heads.iter().map_err(db)? {
            let (id, head) = row.map_err(db)?;
            match EntryHead::decode(head.value()) {
                Ok(h) if h.states().any(|s| keys.contains(&s.key.0)) => {
                    ids.insert(id.value());
                }
                Ok(_) => {}
                // An undecodable record can't be restored: drop it too.
                Err(_) => {
                    ids.insert(id.value());
                }
            }
        }
    }
    let mut ids: Vec<EntryId> = ids.into_iter().map(EntryId).collect();
    ids.sort();
    Ok(ids)
}

pub(crate) fn lru_order(w: &WriteTransaction) -> Result<Vec<EntryId>, ManifestError> {
    let t = w.open_table(LRU).map_err(db)?;
    let mut out = Vec::with_capacity(t.len().map_err(db)? as usize);
    for row in t.iter().map_err(db)? {
        let (k, _) = row.map_err(db)?;
        out.push(EntryId(k.value().1));
    }
    Ok(out)
}

/// Moves an entry to the most-recently-used end and counts a hit.
pub(crate) fn touch(w: &WriteTransaction, id: EntryId, now_s: u64) -> Result<(), ManifestError> {
    let old = w
        .open_table(STATS)
        .map_err(db)?
        .get(id.0)
        .map_err(db)?
        .map(|v| v.value());
    let Some((tick, _, hits)) = old else {
        return Ok(());
    };
    let new = next_tick(w)?;
    let mut lru = w.open_table(LRU).map_err(db)?;
    lru.remove((tick, id.0)).map_err(db)?;
    lru.insert((new, id.0), ()).map_err(db)?;
    w.open_table(STATS)
        .map_err(db)?
        .insert(id.0, (new, now_s, hits + 1))
        .map_err(db)?;
    Ok(())
}
