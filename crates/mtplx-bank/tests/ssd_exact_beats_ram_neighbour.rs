//! An evicted conversation whose exact prefix is on SSD is restored from SSD (`ssd_clone`),
//! not from a neighbour's shared system prompt still in RAM (seed 000).

mod common;

use common::*;
use mtplx_bank::{Bank, BankConfig, RefusalReason, RestoreMode};
use mtplx_kv::CacheFactory;

#[test]
fn evicted_conversation_comes_back_from_ssd_not_from_the_neighbours_system_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let store = cold_store(dir.path());
    let bank = Bank::new(BankConfig {
        max_entries: 2,
        ..roomy()
    })
    .with_cold(store.clone());

    // Two agent conversations share a 600-token system prompt.
    let system = tokens(600, 1);
    let a: Vec<u32> = system.iter().copied().chain(tokens(1400, 2)).collect();
    let b: Vec<u32> = system.iter().copied().chain(tokens(400, 3)).collect();
    bank.commit(commit("a", &a)).unwrap();
    bank.commit(commit("b", &b)).unwrap();
    // A third conversation pushes the least recently used one (a) out: it spills to SSD.
    let report = bank.commit(commit("c", &tokens(300, 4))).unwrap();
    assert_eq!((report.evicted, report.spilled), (1, 1));
    assert_eq!(bank.wait_for_spills().written, 1);
    assert!(!bank.contains(&identity(), &a));

    // a's next turn.
    let prompt: Vec<u32> = a.iter().copied().chain(tokens(50, 5)).collect();
    let id = identity();
    let plan = bank.lookup(&query(&id, &prompt));
    let e = plan.explanation().clone();
    assert_eq!(e.mode, RestoreMode::SsdClone, "{e:?}");
    assert_eq!(e.cached_tokens, a.len());
    // The neighbour's system prompt was a candidate (512 tokens) and lost on coverage.
    assert!(
        e.refused
            .iter()
            .any(|r| r.mode == RestoreMode::BlockPrefixBoundaryClone
                && r.restore_point == Some(512)
                && r.reason == RefusalReason::LowerCoverage),
        "{e:?}"
    );

    let restored = plan.restore(&CacheFactory::contiguous(), &dense()).unwrap();
    assert_rows(restored.sequence.kv(), &prompt, a.len());
    assert_eq!(restored.explanation.mode, RestoreMode::SsdClone);
    assert!(restored.ssd_report.is_some_and(|r| r.rows == a.len()));
    // Not the whole prompt: the caller prefills the 50 new tokens, no continuation needed.
    assert!(restored.continuation.is_none());
    let stats = bank.stats();
    assert_eq!(stats.restores.get(&RestoreMode::SsdClone), Some(&1));
}

#[test]
fn a_longer_ram_prefix_still_beats_a_shorter_ssd_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let store = cold_store(dir.path());
    let bank = Bank::new(BankConfig {
        max_entries: 1,
        ..roomy()
    })
    .with_cold(store);
    let t = tokens(1000, 1);
    bank.commit(commit("a", &t[..600])).unwrap();
    bank.commit(commit("a", &t[..900])).unwrap(); // evicts and spills the 600-token turn
    bank.wait_for_spills();
    let id = identity();
    let plan = bank.lookup(&query(&id, &t));
    assert_eq!(plan.mode(), RestoreMode::Clone);
    assert_eq!(plan.cached_tokens(), 900);
    assert!(plan
        .explanation()
        .refused
        .iter()
        .any(|r| r.mode == RestoreMode::SsdClone && r.reason == RefusalReason::LowerCoverage));
}
