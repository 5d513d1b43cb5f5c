//! A hybrid state whose newest recurrent checkpoint at or below the match lies below the
//! caller's floor is refused from metadata, with a named reason, before any blob is read
//! (seed 000).

mod common;

use common::*;
use mtplx_bank::{Bank, BankConfig, MissReason, RefusalReason, RestoreMode};
use mtplx_cold::MissReason as ColdMiss;
use mtplx_kv::CacheFactory;

/// A hybrid conversation of 1000 tokens (checkpoints at 100 and 1000) spilled to SSD, and
/// a prompt sharing only its first 800 tokens (a 768-token block match).
fn setup(dir: &std::path::Path) -> (Bank, std::sync::Arc<Counting>, Vec<u32>) {
    let counting = Counting::new(cold_store(dir));
    let bank = Bank::new(BankConfig {
        max_entries: 1,
        ..roomy()
    })
    .with_cold(counting.clone());
    let t = tokens(1000, 1);
    bank.commit(hybrid_commit("a", &t, &[100, 1000])).unwrap();
    bank.commit(commit("b", &tokens(10, 2))).unwrap(); // spills the hybrid one
    assert_eq!(bank.wait_for_spills().written, 1);
    let mut prompt = t[..800].to_vec();
    prompt.extend(tokens(40, 3));
    (bank, counting, prompt)
}

#[test]
fn ssd_hybrid_below_the_floor_is_refused_without_reading_a_blob() {
    let dir = tempfile::tempdir().unwrap();
    let (bank, counting, prompt) = setup(dir.path());
    let id = identity();
    let plan = bank.lookup(&mtplx_bank::LookupQuery {
        floor: 500,
        ..query(&id, &prompt)
    });
    let e = plan.explanation().clone();
    assert_eq!(e.mode, RestoreMode::Cold);
    assert_eq!(e.miss, Some(MissReason::Ssd(ColdMiss::BoundaryBelowFloor)));
    assert_eq!(e.miss.unwrap().name(), "ssd_prefix_boundary_below_floor");
    assert!(e
        .refused
        .iter()
        .any(|r| r.reason == RefusalReason::Ssd(ColdMiss::BoundaryBelowFloor)));
    let restored = plan
        .restore(&CacheFactory::contiguous(), &hybrid())
        .unwrap();
    assert_eq!(restored.prefix_len(), 0);
    assert_eq!(counting.restores(), 0, "no blob was read");
}

#[test]
fn ssd_hybrid_at_or_above_the_floor_restores_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (bank, counting, prompt) = setup(dir.path());
    let id = identity();
    let plan = bank.lookup(&mtplx_bank::LookupQuery {
        floor: 100,
        ..query(&id, &prompt)
    });
    assert_eq!(plan.mode(), RestoreMode::SsdBlockPrefixBoundaryClone);
    assert_eq!(plan.cached_tokens(), 100);
    let restored = plan
        .restore(&CacheFactory::contiguous(), &hybrid())
        .unwrap();
    assert_eq!(counting.restores(), 1);
    assert_rows(restored.sequence.kv(), &prompt, 100);
    let state = restored
        .sequence
        .recurrent()
        .cloned()
        .expect("the checkpoint's recurrent state");
    assert_eq!(state.tokens(), 100);
    assert_eq!(state.conv(0).unwrap(), recurrent_at(100).conv(0).unwrap());
}

#[test]
fn ram_hybrid_below_the_floor_is_refused_with_the_ram_name() {
    let bank = Bank::new(roomy());
    let t = tokens(1000, 1);
    bank.commit(hybrid_commit("a", &t, &[100, 1000])).unwrap();
    let mut prompt = t[..800].to_vec();
    prompt.extend(tokens(40, 3));
    let id = identity();
    let plan = bank.lookup(&mtplx_bank::LookupQuery {
        floor: 500,
        ..query(&id, &prompt)
    });
    assert_eq!(plan.mode(), RestoreMode::Cold);
    assert_eq!(
        plan.explanation().miss.map(|m| m.name()),
        Some("prefix_boundary_below_floor".into())
    );
    let plan = bank.lookup(&query(&id, &prompt));
    assert_eq!(plan.mode(), RestoreMode::BlockPrefixBoundaryClone);
    assert_eq!(plan.cached_tokens(), 100);
}

#[test]
fn hybrid_without_a_checkpoint_under_the_match_is_no_snapshot_coverage() {
    let bank = Bank::new(roomy());
    let t = tokens(1000, 1);
    bank.commit(hybrid_commit("a", &t, &[1000])).unwrap();
    let mut prompt = t[..800].to_vec();
    prompt.extend(tokens(40, 3));
    let id = identity();
    let plan = bank.lookup(&query(&id, &prompt));
    assert_eq!(
        plan.explanation().miss,
        Some(MissReason::NoSnapshotCoverage)
    );
}
