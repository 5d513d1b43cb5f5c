//! Lookups rank from the manifest alone and name every miss.

mod common;

use common::*;
use mtplx_cold::storage::FaultyStorage;
use mtplx_cold::{ColdIndex, ColdOff, ColdQuery, Identity, MatchKind, Mtp};

fn reason<T>(r: Result<T, mtplx_cold::MissReason>) -> String {
    r.err()
        .map(|m| m.to_string())
        .unwrap_or_else(|| "hit".into())
}

#[test]
fn misses_are_named() {
    let st = FaultyStorage::new();
    let store = open(&st, config());
    assert_eq!(
        reason(
            ColdOff
                .lookup(&ColdQuery {
                    identity: &identity(),
                    prompt: &[1],
                    floor: 0
                })
                .best()
        ),
        "ssd_cache_off"
    );
    assert_eq!(
        reason(lookup(&store, &tokens(300, 0)).best()),
        "ssd_empty_lookup"
    );
    assert_eq!(reason(lookup(&store, &[]).best()), "ssd_empty_lookup");

    store.put(&entry(&tokens(300, 0))).unwrap();
    assert_eq!(
        reason(lookup(&store, &tokens(300, 1)).best()),
        "ssd_prefix_miss"
    );
    // Another identity sees nothing.
    let other = Identity {
        mtp: Mtp::On,
        ..identity()
    };
    let l = store.lookup(&ColdQuery {
        identity: &other,
        prompt: &tokens(300, 0),
        floor: 0,
    });
    assert_eq!(reason(l.best()), "ssd_empty_lookup");
    // A shorter prompt than the entry: no exact prefix, but the shared block.
    let l = lookup(&store, &tokens(300, 0)[..280]);
    assert_eq!(reason(l.exact), "ssd_prefix_miss");
    assert_eq!(l.block.unwrap().covered, 256);
}

#[test]
fn the_longest_exact_prefix_wins_and_lookups_read_no_blob() {
    let st = FaultyStorage::new();
    let store = open(&st, config());
    let long = tokens(900, 2);
    for n in [100, 256, 600, 900] {
        store.put(&entry(&long[..n])).unwrap();
    }
    let mut prompt = long.clone();
    prompt.extend([7, 7, 7]);
    st.reset_read_stats();
    let l = lookup(&store, &prompt);
    let blob_reads = st.reads().keys().filter(|p| p.starts_with("blobs")).count();
    assert_eq!(blob_reads, 0, "a lookup opens no blob");
    let exact = l.exact.unwrap();
    assert_eq!(
        (exact.kind, exact.covered, exact.entry_tokens),
        (MatchKind::ExactPrefix, 900, 900)
    );
    assert_eq!(l.block.unwrap().covered, 768);
    // read_bytes is what the restore then reads.
    st.reset_read_stats();
    let report = store
        .restore(&exact, &mut mtplx_cold::KvRows::default())
        .unwrap();
    assert_eq!(exact.read_bytes, report.bytes_read);
    let blob_bytes: u64 = st.bytes_read();
    assert!(blob_bytes >= report.bytes_read);

    let l = lookup(&store, &long[..700]);
    assert_eq!(l.exact.unwrap().covered, 600);
}

#[test]
fn a_hybrid_row_below_the_floor_is_refused_before_reading_tensors() {
    let st = FaultyStorage::new();
    let store = open(&st, config());
    let t = tokens(1024, 3);
    store.put(&hybrid_entry(&t, &[256, 1024])).unwrap();
    let mut prompt = t[..900].to_vec();
    prompt.push(1);
    st.reset_read_stats();
    let q = |floor| {
        store.lookup(&ColdQuery {
            identity: &identity(),
            prompt: &prompt,
            floor,
        })
    };
    // The prompt shares 768 tokens (3 blocks); the newest checkpoint at or below is 256.
    let ok = q(0).block.unwrap();
    assert_eq!((ok.covered, ok.restore_point), (768, 256));
    assert_eq!(reason(q(512).best()), "ssd_prefix_boundary_below_floor");
    assert_eq!(
        st.bytes_read() > 0,
        st.reads().keys().any(|p| !p.starts_with("blobs"))
    );
    assert!(
        st.reads().keys().all(|p| !p.starts_with("blobs")),
        "no blob read"
    );

    // The same entry as an exact prefix restores at its full length.
    let mut longer = t.clone();
    longer.push(5);
    let exact = store
        .lookup(&ColdQuery {
            identity: &identity(),
            prompt: &longer,
            floor: 1000,
        })
        .exact
        .unwrap();
    assert_eq!(exact.restore_point, 1024);
}

#[test]
fn an_exact_prefix_on_ssd_covers_more_than_a_shared_system_prompt_block() {
    // The seed failure: a neighbour sharing only the system prompt must not win over the
    // conversation's own exact prefix.
    let st = FaultyStorage::new();
    let store = open(&st, config());
    let system = tokens(512, 11);
    let mut neighbour = system.clone();
    neighbour.extend(tokens(400, 22));
    let mut own = system.clone();
    own.extend(tokens(4000, 33));
    store.put(&entry(&neighbour)).unwrap();
    store.put(&entry(&own)).unwrap();
    let mut prompt = own.clone();
    prompt.extend(tokens(50, 44));
    let l = lookup(&store, &prompt);
    let best = l.best().unwrap();
    assert_eq!(
        (best.kind, best.covered),
        (MatchKind::ExactPrefix, own.len())
    );
    assert_eq!(
        restore(&store, best).unwrap().truncated(own.len()),
        expected(&own, own.len())
    );
}
