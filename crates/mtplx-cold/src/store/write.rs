//! The write path and its commit protocol (docs/cold-format.md, "Commit protocol"):
//! 1. each new blob to `tmp/`, fsync, rename into `blobs/`;
//! 2. fsync `blobs/`;
//! 3. one manifest transaction inserts the entry and its references (durable on return);
//! 4. over the cap, least-recently-used entries are removed in a transaction, and only
//!    then are the blobs nobody references deleted.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use redb::ReadableTable;

use super::inner::{blob_path, now_s, Inner, BLOBS_DIR, TMP_DIR};
use crate::codec::blob::{seal, HEADER_LEN};
use crate::codec::{
    BlobHeader, BlobKind, CheckpointRef, Descriptor, EntryBody, EntryHead, StateBundle, StateRef,
    StateRole,
};
use crate::error::{db, WriteError};
use crate::hex::hex;
use crate::id::EntryId;
use crate::key::{block_keys, StateKey, TokenHash, BLOCK_TOKENS};
use crate::manifest::{self, Released};
use crate::payload::{Recurrent, TailState};
use crate::sync::lock;
use crate::SpillEntry;

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> WriteError + 'a {
    move |source| WriteError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// An encoded state blob waiting to be written.
struct PendingState {
    key: StateKey,
    role: StateRole,
    position: u32,
    payload: Vec<u8>,
}

impl PendingState {
    fn new(role: StateRole, position: u32, bundle: StateBundle) -> PendingState {
        let payload = bundle.encode();
        PendingState {
            key: StateKey::of(&payload),
            role,
            position,
            payload,
        }
    }

    fn state_ref(&self) -> StateRef {
        StateRef {
            key: self.key,
            file_len: (HEADER_LEN + self.payload.len()) as u64,
        }
    }
}

/// Stores `entry`; `pause` is called before each blob write (the writer waits there while
/// foreground work runs).
pub(crate) fn put(
    inner: &Inner,
    entry: &SpillEntry,
    pause: &dyn Fn(),
) -> Result<EntryId, WriteError> {
    entry.validate()?;
    let _m = lock(&inner.mutate);
    let r = put_locked(inner, entry, pause);
    if let Err(WriteError::Manifest(_)) = r {
        inner.recover_manifest();
    }
    r
}

fn put_locked(inner: &Inner, entry: &SpillEntry, pause: &dyn Fn()) -> Result<EntryId, WriteError> {
    inner.drop_damaged()?;
    let storage = inner.storage.as_ref();

    let free = inner.free_space()?;
    let identity = entry.identity.digest();
    let keys = block_keys(&identity, &entry.tokens);
    let checkpoints: Option<Vec<PendingState>> = match &entry.recurrent {
        Recurrent::None => None,
        Recurrent::Checkpoints(cps) => Some(
            cps.iter()
                .map(|c| {
                    let bundle = StateBundle {
                        buffers: c.buffers.clone(),
                        bytes: Vec::new(),
                    };
                    PendingState::new(StateRole::Checkpoint, c.position, bundle)
                })
                .collect(),
        ),
    };
    let tail = entry.tail.as_ref().map(|t: &TailState| {
        let bundle = StateBundle {
            buffers: t.last.clone(),
            bytes: t.extra.clone(),
        };
        PendingState::new(StateRole::Tail, entry.tokens.len() as u32, bundle)
    });

    let head = EntryHead {
        identity,
        geometry: entry.geometry,
        n_tokens: entry.tokens.len() as u32,
        token_hash: TokenHash::of(&identity, &entry.tokens),
        checkpoints: checkpoints.as_ref().map(|cps| {
            cps.iter()
                .map(|p| CheckpointRef {
                    position: p.position,
                    state: p.state_ref(),
                })
                .collect()
        }),
        tail: tail.as_ref().map(PendingState::state_ref),
        kv_bytes: 0,
        created_s: now_s(),
    };
    let body = EntryBody {
        tokens: entry.tokens.clone(),
        blocks: keys,
    };
    let head = EntryHead {
        kv_bytes: (0..body.blocks.len())
            .map(|i| manifest::block_file_len(&head, i))
            .sum(),
        ..head
    };
    let blobs = manifest::entry_blobs(&head, &body);

    // Which blobs are new, and does the entry fit?
    let (present, usage) = {
        let r = inner.manifest().db.begin_read().map_err(db)?;
        let t = r.open_table(manifest::BLOBS).map_err(db)?;
        let mut present = HashSet::new();
        for (_, key, _) in &blobs {
            if t.get(key).map_err(db)?.is_some() {
                present.insert(*key);
            }
        }
        (present, inner.usage()?)
    };
    let total: u64 = blobs.iter().map(|b| b.2).sum();
    let space = inner.space_with(free, usage);
    space.admits(total)?;
    let cap = space.cap_bytes;
    // Only blobs not stored yet cost the disk anything.
    let mut fresh = HashSet::new();
    let new_bytes: u64 = blobs
        .iter()
        .filter(|b| !present.contains(&b.1) && fresh.insert(b.1))
        .map(|b| b.2)
        .sum();
    let budget = inner.config.write_budget_per_hour;
    lock(&inner.written)
        .admit(std::time::Instant::now(), new_bytes, budget)
        .map_err(|written_last_hour| WriteError::OverWriteBudget {
            written_last_hour,
            bytes: new_bytes,
            budget,
        })?;

    let mut written: Vec<Released> = Vec::new();
    let result = (|| {
        let mut stage = Vec::new();
        for (i, key) in body.blocks.iter().enumerate() {
            if present.contains(&key.0) || written.iter().any(|w| w.key == key.0) {
                continue;
            }
            pause();
            write_kv_block(inner, entry, i, &key.0, &mut stage)?;
            written.push(Released {
                kind: BlobKind::KvBlock,
                key: key.0,
            });
        }
        for st in checkpoints.iter().flatten().chain(tail.iter()) {
            if present.contains(&st.key.0) || written.iter().any(|w| w.key == st.key.0) {
                continue;
            }
            pause();
            let header = BlobHeader {
                key: st.key.0,
                payload_len: st.payload.len() as u64,
                descriptor: Descriptor::State {
                    role: st.role,
                    position: st.position,
                },
            };
            write_blob(inner, BlobKind::State, &header, &st.payload)?;
            written.push(Released {
                kind: BlobKind::State,
                key: st.key.0,
            });
        }
        if !written.is_empty() {
            let dir = Path::new(BLOBS_DIR);
            storage.sync_dir(dir).map_err(io("sync directory", dir))?;
        }
        commit_entry(inner, &head, &body)
    })();
    let id = match result {
        Ok(id) => id,
        Err(e) => {
            // Nothing references what was written: remove it now. After a failed manifest
            // commit the outcome is unknown (the commit may have landed before its last
            // fsync failed): leave the blobs to the next open's reconciliation.
            if !matches!(e, WriteError::Manifest(_)) {
                for w in &written {
                    let _ = storage.remove(&blob_path(w.kind, &w.key));
                }
            }
            return Err(e);
        }
    };
    // The entry is committed; an eviction that fails is retried by the next write or open.
    if let Err(WriteError::Manifest(_)) = evict(inner, cap, Some(id)) {
        inner.recover_manifest();
    }
    Ok(id)
}

/// Step 3: the manifest transaction. An entry with the same identity and tokens is
/// replaced.
fn commit_entry(inner: &Inner, head: &EntryHead, body: &EntryBody) -> Result<EntryId, WriteError> {
    let w = inner.manifest().begin_write()?;
    let old = w
        .open_table(manifest::BY_HASH)
        .map_err(db)?
        .get(head.token_hash.0)
        .map_err(db)?
        .map(|v| EntryId(v.value()));
    let id = EntryId(manifest::meta_get(&w, "next_entry")?);
    manifest::meta_set(&w, "next_entry", id.0 + 1)?;
    // Insert first so blobs shared with the replaced entry keep a reference throughout.
    manifest::insert_entry(&w, id, head, body, now_s())?;
    let released = match old {
        Some(old) => manifest::remove_entry(&w, old)?.unwrap_or_default(),
        None => Vec::new(),
    };
    w.commit().map_err(db)?;
    inner.delete_blobs(&released);
    Ok(id)
}

/// Step 4: least-recently-used entries go until the store fits `cap` (never `keep`).
/// Returns how many went.
pub(crate) fn evict(inner: &Inner, cap: u64, keep: Option<EntryId>) -> Result<usize, WriteError> {
    if inner.usage()?.used_bytes <= cap {
        return Ok(0);
    }
    let mut evicted = 0;
    let w = inner.manifest().begin_write()?;
    let mut released = Vec::new();
    for id in manifest::lru_order(&w)? {
        if manifest::meta_get(&w, "used_bytes")? <= cap {
            break;
        }
        if Some(id) != keep {
            released.extend(manifest::remove_entry(&w, id)?.unwrap_or_default());
            evicted += 1;
        }
    }
    w.commit().map_err(db)?;
    inner.delete_blobs(&released);
    Ok(evicted)
}

/// Stages block `index` (all layers, K then V per layer, positions outermost: the rows'
/// bytes as the source holds them) and writes it.
fn write_kv_block(
    inner: &Inner,
    entry: &SpillEntry,
    index: usize,
    key: &[u8; 32],
    stage: &mut Vec<u8>,
) -> Result<(), WriteError> {
    let g = entry.geometry;
    let start = index * BLOCK_TOKENS;
    let n = (entry.tokens.len() - start).min(BLOCK_TOKENS);
    let span = n * g.row_bytes();
    stage.clear();
    stage.resize(2 * g.layers as usize * span, 0);
    for (layer, kv) in stage.chunks_exact_mut(2 * span).enumerate() {
        let (k, v) = kv.split_at_mut(span);
        entry
            .kv
            .read_rows(layer, start..start + n, k, v)
            .map_err(WriteError::Source)?;
    }
    let header = BlobHeader {
        key: *key,
        payload_len: stage.len() as u64,
        descriptor: Descriptor::Kv {
            geometry: g,
            n_tokens: n as u32,
            first_position: start as u32,
        },
    };
    write_blob(inner, BlobKind::KvBlock, &header, stage)
}

/// Step 1 for one blob: temp file, fsync, rename.
fn write_blob(
    inner: &Inner,
    kind: BlobKind,
    header: &BlobHeader,
    payload: &[u8],
) -> Result<(), WriteError> {
    let storage = inner.storage.as_ref();
    let tmp: PathBuf =
        Path::new(TMP_DIR).join(format!("{}.{}.tmp", hex(&header.key), kind.extension()));
    let mut head = header.encode();
    seal(&mut head, payload);
    let written = (|| {
        let f = storage.create(&tmp).map_err(io("create", &tmp))?;
        f.write_at(0, &head).map_err(io("write", &tmp))?;
        f.write_at(HEADER_LEN as u64, payload)
            .map_err(io("write", &tmp))?;
        f.sync().map_err(io("fsync", &tmp))?;
        let dest = blob_path(kind, &header.key);
        storage.rename(&tmp, &dest).map_err(io("rename", &dest))
    })();
    if written.is_err() {
        let _ = storage.remove(&tmp);
    }
    written
}
