//! ENOSPC, EIO and torn writes fail the write and leave the store as it was.

mod common;

use std::path::Path;

use common::*;
use mtplx_cold::storage::{Fault, FaultyStorage};
use mtplx_cold::WriteError;

#[test]
fn a_failed_step_anywhere_in_a_write_leaves_the_old_entries_intact() {
    let a = tokens(600, 1);
    let b = tokens(700, 2);
    let steps = {
        let st = FaultyStorage::new();
        let store = open(&st, config());
        store.put(&entry(&a)).unwrap();
        let before = st.steps();
        store.put(&entry(&b)).unwrap();
        st.steps() - before
    };
    for fault in [Fault::NoSpace, Fault::Io, Fault::Torn] {
        for step in 1..=steps {
            let st = FaultyStorage::new();
            let store = open(&st, config());
            store.put(&entry(&a)).unwrap();
            st.inject(st.steps() + step, fault);
            let r = store.put(&entry(&b));
            if let Err(e) = &r {
                assert!(
                    matches!(e, WriteError::Io { .. } | WriteError::Manifest(_)),
                    "{e}"
                );
            }
            // The old entry restores; the new one restores iff its write succeeded.
            let hit = lookup(&store, &a).exact.unwrap();
            assert_eq!(
                restore(&store, &hit).unwrap().truncated(600),
                expected(&a, 600)
            );
            match lookup(&store, &b).exact {
                // A commit whose last fsync failed may have landed: visible, and correct.
                Ok(hit) => {
                    assert_eq!(
                        restore(&store, &hit).unwrap().truncated(700),
                        expected(&b, 700)
                    );
                }
                Err(_) => assert!(
                    r.is_err(),
                    "{fault:?} at {step}: a written entry is missing"
                ),
            }
            assert!(
                st.files(Path::new("tmp")).is_empty(),
                "{fault:?} at {step}: temp left"
            );
            // A later write goes through, and a reopen finds a consistent store.
            store.put(&entry(&tokens(300, 3))).unwrap();
            drop(store);
            let store = open(&st, config());
            assert_eq!(blob_files(&st).1, store.usage().unwrap().used_bytes);
        }
    }
}
