//! Restores: read the blocks up to the restore point, verify, hand rows to the sink.

use std::time::Instant;

use super::blob::{blob_name, check_header, open_blob};
use super::blocks::read_blocks;
use super::inner::{now_s, Inner};
use super::rows::Failed;
use crate::codec::blob::{CHECKSUM_AT, HEADER_LEN};
use crate::codec::{
    BlobKind, DecodeError, Descriptor, EntryBody, EntryHead, StateBundle, StateRef, StateRole,
};
use crate::error::{db, ManifestError, ReadError};
use crate::id::EntryId;
use crate::index::{ColdCandidate, RestoreReport, RestoreTimings};
use crate::manifest;
use crate::payload::{KvSink, RecurrentCheckpoint, TailState};
use crate::storage::StorageFile;
use crate::sync::lock;

pub(crate) fn restore(
    inner: &Inner,
    candidate: &ColdCandidate,
    sink: &mut dyn KvSink,
) -> Result<RestoreReport, ReadError> {
    let started = Instant::now();
    let mut result = {
        let _gc = inner.gc.read().unwrap_or_else(|p| p.into_inner());
        restore_locked(inner, candidate, sink)
    };
    match &mut result {
        Ok(report) => {
            // The LRU clock; a failure here costs only recency.
            let t = Instant::now();
            let _ = touch(inner, candidate.entry);
            report.timings.manifest += t.elapsed();
            report.timings.total = started.elapsed();
        }
        Err((e, Some(blob))) if e.is_damage() => {
            lock(&inner.damaged).push(*blob);
            if let Ok(_m) = inner.mutate.try_lock() {
                let _ = inner.drop_damaged();
            }
        }
        Err(_) => {}
    }
    result.map_err(|(e, _)| e)
}

/// Bytes of a state blob read (and hashed) per call.
const READ_CHUNK: usize = 1 << 20;

fn load(inner: &Inner, id: EntryId) -> Result<(EntryHead, EntryBody), ReadError> {
    let r = inner.manifest().db.begin_read().map_err(db)?;
    let get = |t: redb::TableDefinition<u64, &[u8]>| -> Result<Option<Vec<u8>>, ReadError> {
        let t = r.open_table(t).map_err(db)?;
        let v = t.get(id.0).map_err(db)?.map(|v| v.value().to_vec());
        Ok(v)
    };
    let (Some(head), Some(body)) = (get(manifest::HEADS)?, get(manifest::BODIES)?) else {
        return Err(ReadError::EntryGone(id));
    };
    let bad = |e: DecodeError| match e {
        DecodeError::Version(found) => ReadError::FormatMismatch {
            blob: format!("entry {}", id.0),
            found,
            expected: crate::FORMAT_VERSION,
        },
        _ => ReadError::Decode {
            blob: format!("entry {}", id.0),
            what: "manifest record",
        },
    };
    Ok((
        EntryHead::decode(&head).map_err(bad)?,
        EntryBody::decode(&body).map_err(bad)?,
    ))
}

fn restore_locked(
    inner: &Inner,
    c: &ColdCandidate,
    sink: &mut dyn KvSink,
) -> Result<RestoreReport, Failed> {
    let t = Instant::now();
    let (head, body) = load(inner, c.entry).map_err(|e| (e, None))?;
    let manifest = t.elapsed();
    if head.identity != c.identity {
        return Err((ReadError::IdentityMismatch(c.entry), None));
    }
    let point = c.restore_point;
    let not = |why| {
        (
            ReadError::NotRestorable {
                entry: c.entry,
                point,
                why,
            },
            None,
        )
    };
    if point == 0 || point > head.n_tokens as usize {
        return Err(not("outside the entry"));
    }
    let checkpoint = match &head.checkpoints {
        None => None,
        Some(cps) => match cps.iter().find(|cp| cp.position as usize == point) {
            Some(cp) => Some(*cp),
            None => return Err(not("no recurrent checkpoint there")),
        },
    };

    sink.begin(head.geometry, point)
        .map_err(|e| (ReadError::Sink(e), None))?;
    let delivered = deliver(inner, &head, &body, point, checkpoint, sink);
    if delivered.is_err() {
        // Rows of a block may have reached the sink before its checksum failed.
        sink.discard();
    }
    let mut report = delivered?;
    report.timings.manifest = manifest;
    Ok(report)
}

/// Everything after [`KvSink::begin`]: the blocks, then the recurrent and tail state.
fn deliver(
    inner: &Inner,
    head: &EntryHead,
    body: &EntryBody,
    point: usize,
    checkpoint: Option<crate::codec::CheckpointRef>,
    sink: &mut dyn KvSink,
) -> Result<RestoreReport, Failed> {
    let blocks = read_blocks(inner, head, body, point, sink)?;
    let mut report = RestoreReport {
        rows: point,
        blocks_read: blocks.blocks,
        bytes_read: blocks.bytes,
        recurrent_at: None,
        tail: false,
        read_path: blocks.path,
        timings: RestoreTimings {
            io_stalled: blocks.io_stalled,
            reading: blocks.reading,
            delivering: blocks.delivering,
            handing_over: blocks.handing_over,
            awaiting_reads: blocks.awaiting_reads,
            hashing: blocks.hashing,
            ..RestoreTimings::default()
        },
    };
    if let Some(cp) = checkpoint {
        let (bundle, bytes) = read_state(inner, &cp.state, StateRole::Checkpoint, cp.position)?;
        report.bytes_read += bytes;
        sink.recurrent(RecurrentCheckpoint {
            position: cp.position,
            buffers: bundle.buffers,
        })
        .map_err(|e| (ReadError::Sink(e), None))?;
        report.recurrent_at = Some(cp.position);
    }
    if let (Some(tail), true) = (&head.tail, point == head.n_tokens as usize) {
        let (bundle, bytes) = read_state(inner, tail, StateRole::Tail, head.n_tokens)?;
        report.bytes_read += bytes;
        sink.tail(TailState {
            last: bundle.buffers,
            extra: bundle.bytes,
        })
        .map_err(|e| (ReadError::Sink(e), None))?;
        report.tail = true;
    }
    Ok(report)
}

/// Reads a blob whose payload is `out.len()` bytes into `out`, checking its length, its
/// header against what the manifest expects, and its checksum.
fn read_verified(
    file: &dyn StorageFile,
    key: &[u8; 32],
    expect: Descriptor,
    out: &mut [u8],
) -> Result<(), ReadError> {
    let (head, sum) = check_header(file, key, expect, out.len())?;
    let blob = || blob_name(BlobKind::State, key);
    // In chunks, hashing each as it arrives: with the file's read-ahead requested, the disk
    // fetches the next chunks while this one is hashed.
    file.will_need();
    let mut hasher = blake3::Hasher::new();
    hasher.update(&head[..CHECKSUM_AT]);
    let mut offset = HEADER_LEN as u64;
    for chunk in out.chunks_mut(READ_CHUNK) {
        file.read_at(offset, chunk)
            .map_err(|source| ReadError::Io {
                blob: blob(),
                source,
            })?;
        hasher.update(chunk);
        offset += chunk.len() as u64;
    }
    if *hasher.finalize().as_bytes() != sum {
        return Err(ReadError::Checksum { blob: blob() });
    }
    Ok(())
}

fn read_state(
    inner: &Inner,
    state: &StateRef,
    role: StateRole,
    position: u32,
) -> Result<(StateBundle, u64), Failed> {
    let blob = (BlobKind::State, state.key.0);
    let run = || -> Result<StateBundle, ReadError> {
        let file = open_blob(inner, BlobKind::State, &state.key.0)?;
        let len = state
            .file_len
            .checked_sub(HEADER_LEN as u64)
            .ok_or(ReadError::Decode {
                blob: blob_name(BlobKind::State, &state.key.0),
                what: "length",
            })?;
        let mut payload = vec![0u8; len as usize];
        read_verified(
            file.as_ref(),
            &state.key.0,
            Descriptor::State { role, position },
            &mut payload,
        )?;
        StateBundle::decode(&payload).map_err(|_| ReadError::Decode {
            blob: blob_name(BlobKind::State, &state.key.0),
            what: "state bundle",
        })
    };
    run()
        .map(|b| (b, state.file_len))
        .map_err(|e| (e, Some(blob)))
}

fn touch(inner: &Inner, id: EntryId) -> Result<(), ManifestError> {
    let mut w = inner.manifest().db.begin_write().map_err(db)?;
    // Recency is not worth an fsync on the read path: it becomes durable with the next
    // durable commit (or is lost in a crash, which only ages the entry).
    w.set_durability(redb::Durability::None);
    manifest::touch(&w, id, now_s())?;
    w.commit().map_err(db)
}
