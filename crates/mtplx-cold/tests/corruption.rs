//! Damaged blobs are detected on read, every time, and become named misses, whether the
//! blocks are streamed from disk or read from memory.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use mtplx_cold::codec::{BlobHeader, HEADER_LEN};
use mtplx_cold::storage::FaultyStorage;
use mtplx_cold::{ColdCandidate, ColdStore};
use proptest::prelude::*;

/// A store holding one hybrid entry of 600 tokens (3 KV blocks, 2 checkpoints, a tail),
/// and a candidate that reads every blob.
fn stored() -> (FaultyStorage, ColdStore, ColdCandidate, Vec<u32>) {
    let st = FaultyStorage::new();
    let store = open(&st, config());
    let t = tokens(600, 4);
    store.put(&hybrid_entry(&t, &[300, 600])).unwrap();
    let hit = lookup(&store, &t).exact.unwrap();
    assert_eq!(hit.restore_point, 600);
    (st, store, hit, t)
}

fn blobs(st: &FaultyStorage) -> Vec<(PathBuf, u64)> {
    st.files(Path::new("blobs"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_flipped_bit_anywhere_in_any_blob_is_detected(file in any::<prop::sample::Index>(), bit in any::<prop::sample::Index>(), resident in any::<bool>()) {
        let (st, store, hit, t) = stored();
        // Blobs in memory or not: the two ways a restore reads blocks.
        st.set_resident(resident);
        let files = blobs(&st);
        // The checkpoint at 300 is not read by a restore at 600: skip it.
        let readable: Vec<_> = files.into_iter().filter(|(p, _)| {
            let mut h = [0u8; HEADER_LEN];
            let f = mtplx_cold::storage::Storage::open(&st, p).unwrap();
            f.read_at(0, &mut h).unwrap();
            !matches!(BlobHeader::decode(&h).unwrap().0.descriptor,
                mtplx_cold::codec::Descriptor::State { position: 300, .. })
        }).collect();
        let (path, len) = file.get(&readable).clone();
        st.flip_bit(&path, bit.index(len as usize * 8) as u64).unwrap();
        let err = restore(&store, &hit).expect_err("a flipped bit must not restore");
        let reason = err.miss_reason().to_string();
        prop_assert!(reason.starts_with("ssd_"), "{reason}");
        // The damaged entry is dropped: the next lookup misses.
        prop_assert!(lookup(&store, &t).exact.is_err());
    }
}

#[test]
fn a_truncated_blob_is_a_named_miss_on_read_and_dropped_on_reopen() {
    let (st, store, hit, t) = stored();
    let (path, len) = blobs(&st)
        .into_iter()
        .find(|(p, _)| p.extension().unwrap() == "kv")
        .unwrap();
    let f = mtplx_cold::storage::Storage::open(&st, &path).unwrap();
    let mut bytes = vec![0; len as usize / 2];
    f.read_at(0, &mut bytes).unwrap();
    st.overwrite(&path, bytes).unwrap();
    let err = restore(&store, &hit).unwrap_err();
    assert_eq!(err.miss_reason().to_string(), "ssd_restore_error:truncated");
    drop(store);

    // A second copy of the damage, found by open rather than by a read.
    let (st, store, _, _) = stored();
    let path = &blobs(&st)[0].0;
    st.overwrite(path, vec![1, 2, 3]).unwrap();
    drop(store);
    let store = ColdStore::open(Arc::new(st.clone()), config()).unwrap();
    assert_eq!(store.report().entries_dropped, 1);
    assert_eq!(
        lookup(&store, &t).exact.unwrap_err().to_string(),
        "ssd_empty_lookup"
    );
    assert_eq!(
        blob_files(&st).0,
        0,
        "the dropped entry's blobs are removed"
    );
}

#[test]
fn a_foreign_file_in_place_of_a_blob_is_a_named_miss() {
    let (st, store, hit, _) = stored();
    let (path, len) = blobs(&st)[0].clone();
    st.overwrite(&path, vec![0x42; len as usize]).unwrap();
    let err = restore(&store, &hit).unwrap_err();
    assert_eq!(err.miss_reason().to_string(), "ssd_restore_error:foreign");
}

/// Version 1 (f32 rows, no element type recorded) and a newer one alike.
#[test]
fn a_blob_of_another_format_version_is_a_format_mismatch() {
    for version in [1, mtplx_cold::FORMAT_VERSION + 1] {
        let (st, store, hit, _) = stored();
        let (path, len) = blobs(&st)
            .into_iter()
            .find(|(p, _)| p.extension().unwrap() == "kv")
            .unwrap();
        let f = mtplx_cold::storage::Storage::open(&st, &path).unwrap();
        let mut bytes = vec![0; len as usize];
        f.read_at(0, &mut bytes).unwrap();
        bytes[8..12].copy_from_slice(&u32::to_le_bytes(version));
        st.overwrite(&path, bytes).unwrap();
        let err = restore(&store, &hit).unwrap_err();
        assert_eq!(
            err.miss_reason().to_string(),
            "ssd_format_mismatch",
            "{version}"
        );
    }
}

#[test]
fn a_missing_blob_is_a_payload_miss() {
    let (st, store, hit, _) = stored();
    for (p, _) in blobs(&st) {
        mtplx_cold::storage::Storage::remove(&st, &p).unwrap();
    }
    let err = restore(&store, &hit).unwrap_err();
    assert_eq!(err.miss_reason().to_string(), "ssd_payload_missing");
}

#[test]
fn a_foreign_manifest_is_set_aside_and_the_store_starts_empty() {
    let (st, store, _, t) = stored();
    drop(store);
    st.overwrite(
        Path::new("manifest.redb"),
        b"not a database at all".repeat(100),
    )
    .unwrap();
    let store = ColdStore::open(Arc::new(st.clone()), config()).unwrap();
    assert!(store.report().manifest_reset.is_some());
    assert!(store.report().orphans_removed > 0);
    assert_eq!(
        lookup(&store, &t).exact.unwrap_err().to_string(),
        "ssd_empty_lookup"
    );
}

/// With two damaged blocks, a restore names the first in file order, whether the blocks
/// are streamed in order or read by several threads (which may reach the second first).
#[test]
fn two_damaged_blocks_the_first_is_named_on_both_read_paths() {
    for resident in [false, true] {
        let st = FaultyStorage::new();
        let store = open(&st, config());
        let t = tokens(1100, 9);
        store.put(&entry(&t)).unwrap();
        let hit = lookup(&store, &t).exact.unwrap();
        let keys = mtplx_cold::block_keys(&identity().digest(), &t);
        let kv = |i: usize| Path::new("blobs").join(format!("{}.kv", keys[i]));
        // Block 1: a flipped payload bit; block 3: cut short (found from its length alone,
        // before any of its rows are read).
        let len = |p: &Path| {
            mtplx_cold::storage::Storage::open(&st, p)
                .unwrap()
                .size()
                .unwrap()
        };
        st.flip_bit(&kv(1), (len(&kv(1)) - 1) * 8).unwrap();
        st.overwrite(&kv(3), vec![0; HEADER_LEN + 8]).unwrap();
        st.set_resident(resident);
        let err = restore(&store, &hit).unwrap_err();
        assert_eq!(
            err.miss_reason().to_string(),
            "ssd_restore_error:checksum",
            "resident: {resident}"
        );
        assert!(err.to_string().contains(&keys[1].to_string()), "{err}");
    }
}
