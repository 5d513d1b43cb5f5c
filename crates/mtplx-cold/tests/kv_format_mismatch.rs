//! Rows of one element type never reach a server keeping another: a lookup under another
//! `kv_dtype` misses, and says why (`ssd_kv_format_mismatch`) from the manifest alone; an
//! entry whose rows are not its identity's type is not written.

mod common;

use common::*;
use mtplx_cold::storage::FaultyStorage;
use mtplx_cold::{ColdIndex, KvDtype, MissReason, WriteError};

fn reason<T>(r: Result<T, MissReason>) -> String {
    r.err()
        .map(|m| m.to_string())
        .unwrap_or_else(|| "hit".into())
}

#[test]
fn a_prompt_stored_as_another_element_type_is_a_named_miss_without_reading_a_blob() {
    let st = FaultyStorage::new();
    let store = open(&st, config());
    let t = tokens(600, 4);
    store.put(&entry_of(KvDtype::F32, &t)).unwrap();
    let f16 = identity_of(KvDtype::F16);

    st.reset_read_stats();
    // The exact prefix is stored, as f32.
    let mut longer = t.clone();
    longer.extend([1, 2, 3]);
    let l = lookup_as(&store, &f16, &longer);
    assert_eq!(l.exact, Err(MissReason::KvFormatMismatch));
    assert_eq!(l.block, Err(MissReason::KvFormatMismatch));
    assert_eq!(reason(l.best()), "ssd_kv_format_mismatch");
    // Only a block of the prompt's chain is stored, as f32.
    let mut diverging = t[..300].to_vec();
    diverging.extend(tokens(100, 999));
    let l = lookup_as(&store, &f16, &diverging);
    assert_eq!(reason(l.best()), "ssd_kv_format_mismatch");
    // Nothing of the prompt is stored in any type: the plain miss.
    let l = lookup_as(&store, &f16, &tokens(600, 5));
    assert_eq!(reason(l.best()), "ssd_empty_lookup");
    assert!(
        st.reads().keys().all(|p| !p.starts_with("blobs")),
        "no blob read: {:?}",
        st.reads().keys().collect::<Vec<_>>()
    );

    // With entries of its own type that don't match, the reason is the same.
    store.put(&entry_of(KvDtype::F16, &tokens(300, 6))).unwrap();
    assert_eq!(
        reason(lookup_as(&store, &f16, &longer).best()),
        "ssd_kv_format_mismatch"
    );
    assert_eq!(
        reason(lookup_as(&store, &f16, &tokens(600, 5)).best()),
        "ssd_prefix_miss"
    );
    // bf16 sees the f32 entry the same way; f32 itself hits.
    assert_eq!(
        reason(lookup_as(&store, &identity_of(KvDtype::Bf16), &longer).best()),
        "ssd_kv_format_mismatch"
    );
    let hit = lookup_as(&store, &identity_of(KvDtype::F32), &longer)
        .exact
        .unwrap();
    assert_eq!(hit.covered, 600);
}

#[test]
fn an_entry_whose_rows_are_not_its_identitys_type_is_not_written() {
    let st = FaultyStorage::new();
    let store = open(&st, config());
    let t = tokens(300, 1);
    // f32 rows under an identity that says the server keeps f16.
    let bad = || mtplx_cold::SpillEntry {
        identity: identity_of(KvDtype::F16),
        ..entry_of(KvDtype::F32, &t)
    };
    let refused = |e: WriteError| {
        assert_eq!(e.reason(), "kv_dtype_mismatch", "{e}");
        let types = WriteError::KvDtypeMismatch {
            identity: KvDtype::F16,
            geometry: KvDtype::F32,
        };
        assert_eq!(e.to_string(), types.to_string());
    };
    refused(store.put(&bad()).unwrap_err());
    refused(store.check_room(&bad()).unwrap_err());
    refused(store.spill(bad()).unwrap_err());
    assert_eq!(store.usage().unwrap().entries, 0);
    assert_eq!(blob_files(&st).0, 0);
    // The same rows under their own type are written.
    let good = entry_of(KvDtype::F32, &t);
    assert_eq!(good.geometry.dtype, good.identity.kv_dtype);
    store.check_room(&good).unwrap();
    store.put(&good).unwrap();
    assert_eq!(store.usage().unwrap().entries, 1);
}
