//! Rows written are the rows restored, at any restore point, reading only the blocks below
//! it.

mod common;

use std::path::PathBuf;

use common::*;
use mtplx_cold::storage::FaultyStorage;
use mtplx_cold::{block_keys, ColdIndex, MatchKind};

fn blob_of(key: &mtplx_cold::BlockKey) -> PathBuf {
    PathBuf::from(format!("blobs/{key}.kv"))
}

#[test]
fn exact_restore_returns_every_row_and_the_tail() {
    let st = FaultyStorage::new();
    let store = open(&st, config());
    let t = tokens(700, 0);
    store.put(&entry(&t)).unwrap();

    let mut prompt = t.clone();
    prompt.extend([1, 2, 3]);
    let hit = lookup(&store, &prompt).exact.unwrap();
    assert_eq!(
        (hit.kind, hit.covered, hit.restore_point),
        (MatchKind::ExactPrefix, 700, 700)
    );
    assert!(hit.tail);
    let got = restore(&store, &hit).unwrap();
    let mut want = expected(&t, 700);
    want.tail = Some(tail(700));
    assert_eq!(got, want);
}

#[test]
fn a_restore_point_mid_block_reads_only_the_blocks_below_it() {
    let st = FaultyStorage::new();
    let store = open(&st, config());
    let t = tokens(1000, 3); // blocks of 256, 256, 256, 232
    store.put(&entry(&t)).unwrap();
    let keys = block_keys(&mtplx_cold::Identity::digest(&identity()), &t);

    let mut hit = lookup(&store, &t).exact.unwrap();
    for point in [1, 255, 256, 300, 511, 513, 999] {
        hit.restore_point = point;
        st.reset_read_stats();
        let got = store.restore(&hit, &mut mtplx_cold::KvRows::default());
        let report = got.unwrap();
        let reads = st.reads();
        let needed = point.div_ceil(256);
        assert_eq!(report.blocks_read, needed, "point {point}");
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(
                reads.contains_key(&blob_of(k)),
                i < needed,
                "point {point} block {i}"
            );
        }
        assert!(!report.tail, "the tail belongs to the full length only");
        assert_eq!(
            restore(&store, &hit).unwrap(),
            expected(&t, point),
            "point {point}"
        );
    }
}

#[test]
fn a_block_prefix_restores_the_shared_blocks_of_a_longer_entry() {
    let st = FaultyStorage::new();
    let store = open(&st, config());
    let stored = tokens(800, 5);
    store.put(&entry(&stored)).unwrap();
    // The prompt shares 600 tokens, then diverges.
    let mut prompt = stored[..600].to_vec();
    prompt.extend(tokens(100, 77_777));
    let l = lookup(&store, &prompt);
    assert_eq!(l.exact.unwrap_err().to_string(), "ssd_prefix_miss");
    let block = l.block.unwrap();
    assert_eq!(
        (block.kind, block.covered, block.restore_point),
        (MatchKind::BlockPrefix, 512, 512)
    );
    assert_eq!(restore(&store, &block).unwrap(), expected(&stored, 512));
}

#[test]
fn a_hybrid_entry_restores_at_its_checkpoint_with_the_recurrent_state() {
    let st = FaultyStorage::new();
    let store = open(&st, config());
    let t = tokens(900, 9);
    store.put(&hybrid_entry(&t, &[256, 640, 900])).unwrap();
    let mut prompt = t[..700].to_vec();
    prompt.push(424_242);
    let hit = lookup(&store, &prompt).block.unwrap();
    assert_eq!((hit.covered, hit.restore_point), (512, 256));
    assert_eq!(hit.checkpoints, Some(vec![256, 640, 900]));
    let got = restore(&store, &hit).unwrap();
    assert_eq!(got.recurrent, Some(checkpoint(256)));
    assert_eq!(got.truncated(256), expected(&t, 256));

    let full = lookup(&store, &t).exact.unwrap();
    assert_eq!(full.restore_point, 900);
    let got = restore(&store, &full).unwrap();
    assert_eq!(got.recurrent, Some(checkpoint(900)));
    assert_eq!(got.tail, Some(tail(900)));
}

/// A sink that refuses after `left` calls.
struct Refusing {
    left: usize,
}

impl mtplx_cold::KvSink for Refusing {
    fn begin(&mut self, _: mtplx_cold::KvGeometry, _: usize) -> Result<(), mtplx_cold::BoxError> {
        Ok(())
    }

    fn write_rows(
        &mut self,
        _: usize,
        _: usize,
        _: &[u8],
        _: &[u8],
    ) -> Result<(), mtplx_cold::BoxError> {
        if self.left == 0 {
            return Err("cache full".into());
        }
        self.left -= 1;
        Ok(())
    }
}

#[test]
fn a_sink_that_fails_mid_restore_ends_it_with_a_named_miss() {
    let st = FaultyStorage::new();
    let store = open(&st, config());
    let t = tokens(2000, 8);
    store.put(&entry(&t)).unwrap();
    let hit = lookup(&store, &t).exact.unwrap();
    for left in [0, 1, 3, 5, 20] {
        let err = store.restore(&hit, &mut Refusing { left }).unwrap_err();
        assert_eq!(err.miss_reason().to_string(), "ssd_restore_error:sink");
    }
    // The entry is not damaged by a sink's failure.
    assert_eq!(
        restore(&store, &hit).unwrap().truncated(2000),
        expected(&t, 2000)
    );
}
