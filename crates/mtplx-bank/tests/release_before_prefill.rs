//! Refused, untried and served candidates are released before the prefill: the plan owns
//! only what it serves, and nothing once the cache is built (seed 000).

mod common;

use std::sync::{Arc, Weak};

use common::*;
use mtplx_bank::{Bank, BankConfig, RestoreMode};
use mtplx_kv::{CacheFactory, KvView};

fn weak(c: &mtplx_bank::Commit) -> Weak<dyn KvView> {
    Arc::downgrade(&c.kv)
}

#[test]
fn unserved_ram_candidates_are_not_held_by_the_plan_and_the_served_one_goes_at_restore() {
    let bank = Bank::new(roomy());
    let t = tokens(2000, 1);
    let mut prompt = t.clone();
    prompt.extend(tokens(10, 2));

    let short = commit("a", &t[..300]); // exact, shorter
    let mut diverged_tokens = t[..1100].to_vec();
    diverged_tokens.extend(tokens(200, 3));
    let block = commit("b", &diverged_tokens); // block prefix at 1024
    let hybrid = hybrid_commit("c", &t[..1500], &[1500]); // exact, hybrid: restorable
    let best = commit("d", &t); // exact, the whole conversation
    let mut other_branch = t[..1100].to_vec();
    other_branch.extend(tokens(250, 4));
    let no_cover = hybrid_commit("e", &other_branch, &[1350]); // refused: no checkpoint ≤ 1024
    let weaks = [&short, &block, &hybrid, &best, &no_cover].map(weak);
    for c in [short, block, hybrid, best, no_cover] {
        bank.commit(c).unwrap();
    }

    let id = identity();
    let plan = bank.lookup(&query(&id, &prompt));
    assert_eq!(plan.mode(), RestoreMode::Clone);
    assert_eq!(plan.cached_tokens(), 2000);
    let watch = plan.watch();
    assert_eq!(
        watch.considered(),
        4,
        "short, block, hybrid and best were valid"
    );
    assert_eq!(watch.alive(), 1, "only the served candidate is held");

    // Drop the bank's own references: only the plan could keep a state alive now.
    bank.clear();
    let alive: Vec<bool> = weaks.iter().map(|w| w.upgrade().is_some()).collect();
    assert_eq!(alive, [false, false, false, true, false]);

    let restored = plan.restore(&CacheFactory::contiguous(), &dense()).unwrap();
    assert_eq!(watch.alive(), 0);
    assert!(
        weaks[3].upgrade().is_none(),
        "served state released once copied"
    );
    assert_rows(restored.sequence.kv(), &prompt, 2000);
}

#[test]
fn a_served_ssd_candidate_and_its_unserved_rivals_are_gone_after_the_restore() {
    let dir = tempfile::tempdir().unwrap();
    let store = cold_store(dir.path());
    let bank = Bank::new(BankConfig {
        max_entries: 1,
        ..roomy()
    })
    .with_cold(store);
    let t = tokens(1200, 1);
    let first = commit("a", &t);
    let first_weak = weak(&first);
    bank.commit(first).unwrap();
    let mut other = t[..700].to_vec();
    other.extend(tokens(100, 9));
    let neighbour = commit("b", &other);
    let neighbour_weak = weak(&neighbour);
    bank.commit(neighbour).unwrap(); // evicts the first conversation to SSD
    bank.wait_for_spills();
    assert!(
        first_weak.upgrade().is_none(),
        "spilled and written: not in RAM"
    );

    let mut prompt = t.clone();
    prompt.push(42);
    let id = identity();
    let plan = bank.lookup(&query(&id, &prompt));
    assert_eq!(plan.mode(), RestoreMode::SsdClone);
    let watch = plan.watch();
    // SSD exact, SSD block, and the RAM neighbour's block prefix.
    assert_eq!(watch.considered(), 3);
    assert_eq!(watch.alive(), 1);
    bank.clear();
    assert!(
        neighbour_weak.upgrade().is_none(),
        "the refused RAM rival is not held"
    );

    let restored = plan.restore(&CacheFactory::contiguous(), &dense()).unwrap();
    assert_eq!(
        watch.alive(),
        0,
        "the served SSD candidate is dropped once copied"
    );
    assert_rows(restored.sequence.kv(), &prompt, 1200);
    // The restored cache holds only its own rows.
    assert_eq!(
        restored.sequence.kv().logical_bytes(),
        1200 * SHAPE.bytes_per_token(mtplx_kv::KvDtype::F32)
    );
}
