//! An entry spilled by one store is found and restored by the next one over the same
//! directory; two live stores never share a directory.

mod common;

use common::*;
use mtplx_cold::{ColdIndex, ColdStore, OpenError};

#[test]
fn a_fresh_store_restores_what_the_last_one_spilled() {
    let dir = tempfile::tempdir().unwrap();
    let t = tokens(1000, 6);
    {
        let store = ColdStore::open_dir(dir.path(), config()).unwrap();
        let ticket = store.spill(hybrid_entry(&t, &[512, 1000])).unwrap();
        ticket.wait().unwrap();
    }
    let store = ColdStore::open_dir(dir.path(), config()).unwrap();
    assert_eq!(store.report().entries, 1);
    assert_eq!(store.report().orphans_removed, 0);
    let hit = lookup(&store, &t).exact.unwrap();
    let got = restore(&store, &hit).unwrap();
    assert_eq!(got.truncated(1000), expected(&t, 1000));
    assert_eq!(got.recurrent, Some(checkpoint(1000)));
    assert_eq!(got.tail, Some(tail(1000)));
}

#[test]
fn a_second_store_on_a_live_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _first = ColdStore::open_dir(dir.path(), config()).unwrap();
    let second = ColdStore::open_dir(dir.path(), config());
    assert!(
        matches!(second, Err(OpenError::Locked { .. })),
        "{second:?}"
    );
}

#[test]
fn in_use_says_whether_a_live_store_holds_the_directory() {
    use mtplx_cold::storage::FsStorage;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ssd");
    assert!(!FsStorage::in_use(&root).unwrap(), "no directory yet");
    let store = ColdStore::open_dir(&root, config()).unwrap();
    assert!(FsStorage::in_use(&root).unwrap());
    // Asking does not take the lock from the store, nor keep it once answered.
    assert!(FsStorage::in_use(&root).unwrap());
    drop(store);
    assert!(!FsStorage::in_use(&root).unwrap());
    let _again = ColdStore::open_dir(&root, config()).unwrap();
    assert!(FsStorage::in_use(&root).unwrap());
}
