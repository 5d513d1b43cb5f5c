//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use mtplx_cold::storage::{FaultyStorage, Storage};
use mtplx_cold::{
    ColdCandidate, ColdConfig, ColdIndex, ColdLookup, ColdQuery, ColdStore, F32Buffer, Identity,
    KvDtype, KvGeometry, KvRows, Mtp, NamedBytes, Recurrent, RecurrentCheckpoint, SpillEntry,
    TailState, GIB,
};

pub const GEOMETRY: KvGeometry = KvGeometry {
    layers: 3,
    kv_heads: 2,
    head_dim: 4,
    dtype: KvDtype::F32,
};

pub fn identity() -> Identity {
    Identity {
        model: "tiny-llama".into(),
        chat_template: "tmpl-hash".into(),
        mtp: Mtp::Off,
        policy: "default".into(),
        kv_dtype: KvDtype::F32,
    }
}

/// [`identity`] with rows of `kv_dtype`.
pub fn identity_of(kv_dtype: KvDtype) -> Identity {
    Identity {
        kv_dtype,
        ..identity()
    }
}

/// Unlimited cap, no free-disk floor.
pub fn config() -> ColdConfig {
    ColdConfig {
        cap_bytes: 100 * GIB,
        free_disk_floor: 0,
        backlog_cap_bytes: GIB,
        write_budget_per_hour: u64::MAX,
    }
}

/// Tokens `0..n` offset by `salt` (different salts diverge at token 0).
pub fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| i.wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// K/V rows that depend on the layer, the position and the token there, so equal prefixes
/// have equal rows.
pub fn rows(tokens: &[u32]) -> KvRows {
    rows_of(GEOMETRY, tokens)
}

/// [`GEOMETRY`] storing `dtype`: heads of one group of a quantized type (32 values), else
/// [`GEOMETRY`]'s.
pub fn geometry_of(dtype: KvDtype) -> KvGeometry {
    KvGeometry {
        dtype,
        head_dim: GEOMETRY.head_dim.max(dtype.group() as u32),
        ..GEOMETRY
    }
}

/// [`rows`] in another geometry (or element type). Rows of a quantized type are bytes made
/// from the same inputs (the cold tier never reads them as values).
pub fn rows_of(geometry: KvGeometry, tokens: &[u32]) -> KvRows {
    if geometry.dtype.group() > 1 {
        let row = geometry.row_bytes();
        return KvRows::from_bytes_fn(geometry, tokens.len(), |l, i, v| {
            (tokens[i / row] as usize * 7 + l * 31 + i % row + usize::from(v)) as u8
        });
    }
    KvRows::from_fn(geometry, tokens.len(), |l, p, i, v| {
        let t = tokens[p] as f32;
        t * 0.001 + l as f32 * 10.0 + i as f32 * 0.01 + if v { 0.5 } else { -0.5 } + p as f32
    })
}

pub fn checkpoint(position: u32) -> RecurrentCheckpoint {
    RecurrentCheckpoint {
        position,
        buffers: vec![F32Buffer {
            name: "gdn.0".into(),
            shape: vec![2, 3],
            data: (0..6).map(|i| position as f32 + i as f32).collect(),
        }],
    }
}

pub fn tail(n: usize) -> TailState {
    TailState {
        last: vec![F32Buffer {
            name: "logits".into(),
            shape: vec![5],
            data: (0..5).map(|i| n as f32 * 0.25 + i as f32).collect(),
        }],
        extra: vec![NamedBytes {
            name: "mtp".into(),
            bytes: vec![n as u8, 1, 2, 3],
        }],
    }
}

pub fn entry(tokens: &[u32]) -> SpillEntry {
    SpillEntry {
        identity: identity(),
        tokens: tokens.to_vec(),
        geometry: GEOMETRY,
        kv: Box::new(rows(tokens)),
        recurrent: Recurrent::None,
        tail: Some(tail(tokens.len())),
    }
}

/// [`entry`] with rows of `dtype`, written under [`identity_of`] `dtype`.
pub fn entry_of(dtype: KvDtype, tokens: &[u32]) -> SpillEntry {
    let geometry = geometry_of(dtype);
    SpillEntry {
        identity: identity_of(dtype),
        geometry,
        kv: Box::new(rows_of(geometry, tokens)),
        ..entry(tokens)
    }
}

pub fn hybrid_entry(tokens: &[u32], checkpoints: &[u32]) -> SpillEntry {
    SpillEntry {
        recurrent: Recurrent::Checkpoints(checkpoints.iter().map(|&p| checkpoint(p)).collect()),
        ..entry(tokens)
    }
}

pub fn open(storage: &FaultyStorage, config: ColdConfig) -> ColdStore {
    ColdStore::open(Arc::new(storage.clone()), config).expect("open")
}

pub fn lookup(store: &dyn ColdIndex, prompt: &[u32]) -> ColdLookup {
    lookup_as(store, &identity(), prompt)
}

pub fn lookup_as(store: &dyn ColdIndex, identity: &Identity, prompt: &[u32]) -> ColdLookup {
    store.lookup(&ColdQuery {
        identity,
        prompt,
        floor: 0,
    })
}

/// Restores `c` into a fresh [`KvRows`].
pub fn restore(store: &dyn ColdIndex, c: &ColdCandidate) -> Result<KvRows, mtplx_cold::ReadError> {
    let mut sink = KvRows::default();
    store.restore(c, &mut sink)?;
    Ok(sink)
}

/// What a restore of `tokens` at `point` must deliver.
pub fn expected(tokens: &[u32], point: usize) -> KvRows {
    rows(tokens).truncated(point)
}

/// Blob files and their total bytes.
pub fn blob_files(storage: &FaultyStorage) -> (usize, u64) {
    let f = storage.files(Path::new("blobs"));
    (f.len(), f.iter().map(|x| x.1).sum())
}

pub fn only_blob(storage: &FaultyStorage, ext: &str) -> Vec<std::path::PathBuf> {
    storage
        .files(Path::new("blobs"))
        .into_iter()
        .map(|f| f.0)
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect()
}

pub fn list_dir(storage: &dyn Storage, dir: &str) -> Vec<(String, u64)> {
    storage.list(Path::new(dir)).unwrap_or_default()
}
