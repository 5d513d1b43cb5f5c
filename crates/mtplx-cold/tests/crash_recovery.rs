//! A crash at any step of a write (blobs, manifest commit, eviction) leaves a store that
//! opens to the old or the new state, and restores exactly what was written.

mod common;

use std::path::Path;

use common::*;
use mtplx_cold::storage::FaultyStorage;
use mtplx_cold::{ColdConfig, ColdStore, WriteError};
use proptest::prelude::*;

struct Scenario {
    a: Vec<u32>,
    b: Vec<u32>,
    config: ColdConfig,
}

fn scenario(shared_prefix: bool, evict: bool) -> Scenario {
    let a = tokens(600, 1);
    let b = if shared_prefix {
        let mut b = a[..512].to_vec();
        b.extend(tokens(300, 50_000));
        b
    } else {
        tokens(700, 2)
    };
    let mut config = config();
    if evict {
        // Room for B but not for A and B together.
        config.cap_bytes = 900 * GEOMETRY.bytes_per_token();
    }
    Scenario { a, b, config }
}

/// Writes A, then B with a crash armed at `crash` steps into B's write (None: no crash).
/// Returns the storage, B's write outcome and how many steps B's write took.
fn run(s: &Scenario, crash: Option<u64>) -> (FaultyStorage, Result<(), WriteError>, u64) {
    let st = FaultyStorage::new();
    let store = open(&st, s.config.clone());
    store.put(&entry(&s.a)).unwrap();
    // A restore's LRU touch is a non-durable commit: the crash may lose it, never A.
    let hit = lookup(&store, &s.a).exact.unwrap();
    restore(&store, &hit).unwrap();
    let before = st.steps();
    if let Some(c) = crash {
        st.crash_at(before + c);
    }
    let r = store.put(&entry(&s.b)).map(|_| ());
    let steps = st.steps() - before;
    drop(store);
    (st, r, steps)
}

/// Whether `t` is stored, checking that a stored entry restores exactly.
fn present(store: &ColdStore, t: &[u32]) -> bool {
    match lookup(store, t).exact {
        Ok(hit) => {
            assert_eq!(hit.covered, t.len());
            let got = restore(store, &hit).expect("a stored entry restores");
            let mut want = expected(t, t.len());
            want.tail = Some(tail(t.len()));
            assert_eq!(got, want);
            true
        }
        Err(reason) => {
            assert!(
                ["ssd_prefix_miss", "ssd_empty_lookup"].contains(&reason.to_string().as_str()),
                "{reason}"
            );
            false
        }
    }
}

fn check(s: &Scenario, evict: bool, crash: u64, seed: u64) -> Result<(), TestCaseError> {
    let (st, r, _) = run(s, Some(crash));
    let image = st.crash_image(seed);
    let store = ColdStore::open(std::sync::Arc::new(image.clone()), s.config.clone())
        .map_err(|e| TestCaseError::fail(format!("reopen failed: {e}")))?;
    let (has_a, has_b) = (present(&store, &s.a), present(&store, &s.b));
    if r.is_ok() {
        prop_assert!(has_b, "a committed write survives the crash");
    }
    let old = has_a && !has_b;
    // Open finishes an eviction the crash interrupted.
    let new = has_b && (has_a != evict);
    prop_assert!(old || new, "neither old nor new: a={has_a} b={has_b}");
    // Nothing left over: no temp files, no unreferenced blobs, accounting exact.
    prop_assert!(image.files(Path::new("tmp")).is_empty());
    let (_, bytes) = blob_files(&image);
    prop_assert_eq!(store.usage().unwrap().used_bytes, bytes);
    Ok(())
}

#[test]
fn the_scenario_has_enough_steps_to_crash_in() {
    for (shared, evict) in [(false, false), (true, false), (false, true), (true, true)] {
        let s = scenario(shared, evict);
        let (_, r, steps) = run(&s, None);
        r.unwrap();
        assert!(steps > 10, "{steps} steps");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn a_crash_at_any_step_yields_the_old_or_the_new_entry(
        shared in any::<bool>(),
        evict in any::<bool>(),
        frac in 0.0f64..1.0,
        seed in any::<u64>(),
    ) {
        let s = scenario(shared, evict);
        let (_, _, steps) = run(&s, None);
        let crash = 1 + (frac * steps as f64) as u64;
        check(&s, evict, crash, seed)?;
    }
}

/// Every step, not just sampled ones, for one scenario and a few seeds.
#[test]
fn a_crash_at_every_step_of_an_evicting_write() {
    let s = scenario(true, true);
    let (_, _, steps) = run(&s, None);
    for crash in 1..=steps {
        for seed in 0..3 {
            check(&s, true, crash, seed * 7919 + crash).unwrap();
        }
    }
}
