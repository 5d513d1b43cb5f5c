//! A block whose header names another element type than its entry (or one this build does
//! not know) is a named restore miss on every read path: its rows are never delivered as
//! the entry's type, and the entry is dropped.

mod common;

use std::path::PathBuf;

use common::*;
use mtplx_cold::codec::blob::KV_DTYPE_AT;
use mtplx_cold::storage::{FaultyStorage, Storage};
use mtplx_cold::{block_keys, ColdIndex, KvDtype, KvRows};

/// Sinks of both kinds: `KvRows` lends its rows, a staged sink doesn't.
struct Staged(KvRows);

impl mtplx_cold::KvSink for Staged {
    fn begin(&mut self, g: mtplx_cold::KvGeometry, n: usize) -> Result<(), mtplx_cold::BoxError> {
        self.0.begin(g, n)
    }

    fn write_rows(
        &mut self,
        l: usize,
        start: usize,
        k: &[u8],
        v: &[u8],
    ) -> Result<(), mtplx_cold::BoxError> {
        self.0.write_rows(l, start, k, v)
    }
}

#[test]
fn a_block_header_rewritten_to_another_element_type_is_a_kv_dtype_miss() {
    // (the entry's type, the code written into the second block's header)
    let mut cases: Vec<(KvDtype, u8)> = Vec::new();
    for stored in KvDtype::ALL {
        for other in KvDtype::ALL.into_iter().filter(|&d| d != stored) {
            cases.push((stored, other.code()));
        }
        cases.push((stored, 5)); // unknown
    }
    for (stored, code) in cases {
        for (staged, resident) in [(false, false), (true, false), (false, true)] {
            let case =
                format!("{stored} rewritten to {code}, staged {staged}, resident {resident}");
            let st = FaultyStorage::new();
            let store = open(&st, config());
            let t = tokens(600, 2);
            store.put(&entry_of(stored, &t)).unwrap();
            let id = identity_of(stored);
            let hit = lookup_as(&store, &id, &t).exact.unwrap();

            let key = block_keys(&id.digest(), &t)[1];
            let path = PathBuf::from(format!("blobs/{key}.kv"));
            let len = st.open(&path).unwrap().size().unwrap();
            let mut bytes = vec![0u8; len as usize];
            st.open(&path).unwrap().read_at(0, &mut bytes).unwrap();
            assert_eq!(bytes[KV_DTYPE_AT], stored.code(), "{case}");
            bytes[KV_DTYPE_AT] = code;
            st.overwrite(&path, bytes).unwrap();
            st.set_resident(resident);

            let err = match staged {
                true => store.restore(&hit, &mut Staged(KvRows::default())),
                false => store.restore(&hit, &mut KvRows::default()),
            }
            .unwrap_err();
            assert_eq!(
                err.miss_reason().to_string(),
                "ssd_restore_error:kv_dtype",
                "{case}: {err}"
            );
            assert!(err.to_string().contains(&key.to_string()), "{case}: {err}");
            // The damaged entry is dropped: nothing is offered any more.
            assert!(lookup_as(&store, &id, &t).exact.is_err(), "{case}");
        }
    }
}
