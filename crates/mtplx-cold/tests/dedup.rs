//! A prefix shared by two entries is stored once.

mod common;

use common::*;
use mtplx_cold::storage::FsStorage;
use mtplx_cold::ColdStore;
use std::sync::Arc;

fn blob_bytes(dir: &std::path::Path) -> (usize, u64) {
    let files: Vec<u64> = std::fs::read_dir(dir.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .collect();
    (files.len(), files.iter().sum())
}

#[test]
fn two_entries_sharing_512_tokens_store_those_blocks_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = ColdStore::open(Arc::new(FsStorage::open(dir.path()).unwrap()), config()).unwrap();
    let a = tokens(768, 1);
    let mut b = a[..512].to_vec();
    b.extend(tokens(256, 9_999));

    store.put(&entry(&a)).unwrap();
    let (files_a, bytes_a) = blob_bytes(dir.path());
    store.put(&entry(&b)).unwrap();
    let (files_ab, bytes_ab) = blob_bytes(dir.path());

    let block = 256 + 256 * GEOMETRY.bytes_per_token();
    // A: 3 blocks + its tail. B adds only its own third block: its tail state has the
    // same bytes as A's (the test's tail depends on the length only), so it is shared too.
    assert_eq!(files_a, 4);
    assert_eq!(files_ab, 5);
    assert_eq!(bytes_ab - bytes_a, block);
    assert_eq!(store.usage().unwrap().used_bytes, bytes_ab);

    // Both restore in full.
    for t in [&a, &b] {
        let hit = lookup(&store, t).exact.unwrap();
        assert_eq!(
            restore(&store, &hit).unwrap().truncated(768),
            expected(t, 768)
        );
    }

    // Removing A keeps the shared blocks B still references.
    let a_id = lookup(&store, &a).exact.unwrap().entry;
    assert!(store.remove(a_id).unwrap());
    let (files_b, bytes_b) = blob_bytes(dir.path());
    assert_eq!(files_b, 4);
    assert_eq!(bytes_b, bytes_ab - block);
    let hit = lookup(&store, &b).exact.unwrap();
    assert_eq!(
        restore(&store, &hit).unwrap().truncated(768),
        expected(&b, 768)
    );
}

#[test]
fn files_are_private_to_the_user() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("bank");
    let store = ColdStore::open_dir(&root, config()).unwrap();
    store.put(&entry(&tokens(300, 1))).unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&root), 0o700);
    assert_eq!(mode(&root.join("blobs")), 0o700);
    assert_eq!(mode(&root.join("manifest.redb")), 0o600);
    for e in std::fs::read_dir(root.join("blobs")).unwrap() {
        assert_eq!(mode(&e.unwrap().path()), 0o600);
    }
}
