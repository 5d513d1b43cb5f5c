//! The store stays under its cap by evicting the least recently used entries, writes
//! nothing when the disk is nearly full, and skips writes over its hourly write budget.

mod common;

use common::*;
use mtplx_cold::storage::FaultyStorage;
use mtplx_cold::{ColdIndex, WriteError};

#[test]
fn least_recently_used_entries_go_first_and_their_blobs_with_them() {
    let st = FaultyStorage::new();
    let mut cfg = config();
    // Room for three 300-token entries, not four.
    let one = {
        let probe = FaultyStorage::new();
        let s = open(&probe, config());
        s.put(&entry(&tokens(300, 0))).unwrap();
        s.usage().unwrap().used_bytes
    };
    cfg.cap_bytes = 3 * one + one / 2;
    let store = open(&st, cfg);
    let ts: Vec<Vec<u32>> = (1..=4).map(|s| tokens(300, s * 1000)).collect();
    for t in &ts[..3] {
        store.put(&entry(t)).unwrap();
    }
    // Use the oldest: now the second is the least recently used.
    let hit = lookup(&store, &ts[0]).exact.unwrap();
    restore(&store, &hit).unwrap();
    store.put(&entry(&ts[3])).unwrap();

    let stored: Vec<bool> = ts.iter().map(|t| lookup(&store, t).exact.is_ok()).collect();
    assert_eq!(stored, [true, false, true, true]);
    let usage = store.usage().unwrap();
    assert_eq!(usage.entries, 3);
    assert!(usage.used_bytes <= 3 * one + one / 2);
    assert_eq!(
        blob_files(&st).1,
        usage.used_bytes,
        "the evicted entry's blobs are gone"
    );
}

#[test]
fn an_entry_larger_than_the_cap_is_refused() {
    let st = FaultyStorage::new();
    let mut cfg = config();
    cfg.cap_bytes = 100 * GEOMETRY.bytes_per_token();
    let store = open(&st, cfg);
    let err = store.put(&entry(&tokens(300, 0))).unwrap_err();
    assert!(matches!(err, WriteError::TooLarge { .. }), "{err}");
    assert_eq!(blob_files(&st).0, 0);
}

#[test]
fn the_cap_shrinks_to_a_quarter_of_free_disk() {
    let st = FaultyStorage::new();
    st.set_free_space(4 * 200 * GEOMETRY.bytes_per_token());
    let store = open(&st, config());
    let err = store.put(&entry(&tokens(300, 0))).unwrap_err();
    assert!(matches!(err, WriteError::TooLarge { .. }), "{err}");
    store.put(&entry(&tokens(150, 0))).unwrap();
}

#[test]
fn no_write_starts_below_the_free_disk_floor() {
    let st = FaultyStorage::new();
    let mut cfg = config();
    cfg.free_disk_floor = 10 << 30;
    let store = open(&st, cfg);
    st.set_free_space((10 << 30) - 1);
    let err = store.put(&entry(&tokens(300, 0))).unwrap_err();
    assert!(
        matches!(err, WriteError::BelowFreeDiskFloor { .. }),
        "{err}"
    );
    let err = store
        .spill(entry(&tokens(300, 0)))
        .unwrap()
        .wait()
        .unwrap_err();
    assert!(
        matches!(err, WriteError::BelowFreeDiskFloor { .. }),
        "{err}"
    );
    assert_eq!(blob_files(&st).0, 0);
    assert!(st.files(std::path::Path::new("tmp")).is_empty());

    st.set_free_space(10 << 30);
    store.put(&entry(&tokens(300, 0))).unwrap();
}

#[test]
fn writes_over_the_hourly_budget_are_skipped_and_counted() {
    let st = FaultyStorage::new();
    let t1 = tokens(300, 1);
    let one = entry(&t1);
    // Room for one entry's blobs, not two.
    let mut cfg = config();
    cfg.write_budget_per_hour = one.estimated_bytes() * 3 / 2;
    let store = open(&st, cfg);
    store.put(&one).unwrap();
    let written = store.write_stats().written_last_hour;
    assert!(written > 0);

    let t2 = tokens(300, 2);
    let err = store.put(&entry(&t2)).unwrap_err();
    assert!(
        matches!(err, WriteError::OverWriteBudget { written_last_hour, .. } if written_last_hour == written),
        "{err}"
    );
    assert!(err.to_string().starts_with("ssd_write_budget"));
    let stats = store.write_stats();
    assert_eq!(stats.skipped_over_budget, 1);
    assert!(stats.skipped_bytes > 0);
    assert_eq!(stats.written_last_hour, written);
    // Nothing of the skipped entry was written.
    assert!(lookup(&store, &t2).exact.is_err());

    // Re-storing what is already there writes no new blob, so it is not refused.
    store.put(&one).unwrap();
    assert_eq!(store.write_stats().skipped_over_budget, 1);
}
