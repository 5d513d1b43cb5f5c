//! An evicted entry whose spill has not committed stays a candidate (restored from the rows
//! still in memory, named `spill_queued`) and stays in the bank's byte accounting; a spill
//! that fails keeps its entry in RAM, and only memory pressure drops it, with the reason.
//! The writer is held at its first file creation by the fault-injecting storage.

mod common;

use std::time::Duration;

use common::*;
use mtplx_bank::{
    Bank, BankConfig, BankEvent, LogValue, MemoryEstimate, RestoreMode, SessionId, SpillOutcome,
};
use mtplx_cold::storage::Fault;
use mtplx_kv::CacheFactory;

/// Two conversations sharing a 600-token system prompt (the seeds' scenario).
fn conversations() -> (Vec<u32>, Vec<u32>) {
    let system = tokens(600, 1);
    (
        joined(&system, &tokens(300, 2)),
        joined(&system, &tokens(300, 3)),
    )
}

#[test]
fn an_entry_whose_spill_is_held_in_the_writer_is_restored_from_ram_and_still_counted() {
    let (cold, storage) = faulty_cold();
    let bank = Bank::new(BankConfig {
        max_entries: 1,
        ..roomy()
    })
    .with_cold(cold);
    let (a, b) = conversations();
    bank.commit(commit("a", &a)).unwrap();
    let a_bytes = bank.bytes();

    let hold = storage.hold_creates();
    let report = bank.commit(commit("b", &b)).unwrap();
    assert_eq!((report.evicted, report.spilled), (1, 1));
    hold.wait_for_waiters(1);

    // A is out of the budgets but its rows are still held, and counted.
    let stats = bank.stats();
    assert_eq!((stats.entries, stats.spilling), (1, 1));
    assert_eq!(bank.bytes(), stats.resident_bytes + a_bytes);
    assert!(!bank.contains(&identity(), &a), "no longer resident");

    // A's next turn: A itself, not B's 512-token share of the system prompt.
    let next = joined(&a, &tokens(40, 4));
    let id = identity();
    let plan = bank.lookup(&query(&id, &next));
    let e = plan.explanation().clone();
    assert_eq!(e.mode, RestoreMode::Clone, "{e:?}");
    assert_eq!(e.cached_tokens, a.len());
    assert!(e.spill_queued);
    assert!(e
        .log_fields()
        .contains(&("ram_entry_state", LogValue::Str("spill_queued".into()))));
    let restored = plan.restore(&CacheFactory::paged(), &dense()).unwrap();
    assert_rows(restored.sequence.kv(), &next, a.len());
    drop(restored);

    drop(hold);
    let done = bank.wait_for_spills();
    assert_eq!((done.written, done.failed), (1, 0));
    let stats = bank.stats();
    assert_eq!(stats.spilling, 0);
    assert_eq!(bank.bytes(), stats.resident_bytes, "A's memory is released");
    // Now A comes from the SSD tier.
    let plan = bank.lookup(&query(&id, &next));
    assert_eq!(plan.mode(), RestoreMode::SsdClone);
    assert_eq!(plan.cached_tokens(), a.len());
}

#[test]
fn admission_waits_for_the_spills_of_what_it_shed_before_it_counts_their_memory_free() {
    let (cold, storage) = faulty_cold();
    let bank = std::sync::Arc::new(Bank::new(roomy()).with_cold(cold));
    let (a, b) = conversations();
    bank.commit(commit("a", &a)).unwrap();
    bank.commit(commit("b", &b)).unwrap();
    let held = bank.bytes();
    // Room for everything but the bank: both entries must go.
    let limit = bank.config().memory_limit_bytes;
    let estimate = MemoryEstimate {
        weights_bytes: 0,
        in_flight_bytes: 0,
        kv_bytes: limit - held / 4,
        activation_bytes: 0,
    };

    let hold = storage.hold_creates();
    let b2 = bank.clone();
    let admission = std::thread::spawn(move || b2.admit(&estimate, None));
    hold.wait_for_waiters(1);
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !admission.is_finished(),
        "admitted while the shed entries' rows were still in memory"
    );
    assert_eq!(
        bank.bytes(),
        held,
        "shed but unwritten entries are still counted"
    );
    assert_eq!(bank.stats().spilling, 2);

    drop(hold);
    let admitted = admission.join().unwrap().expect("admitted once written");
    assert_eq!(admitted.shed_entries, 2);
    assert_eq!(admitted.shed_bytes, held);
    assert_eq!(bank.bytes(), 0);
    let id = identity();
    let plan = bank.lookup(&query(&id, &joined(&a, &[9])));
    assert_eq!(
        plan.mode(),
        RestoreMode::SsdClone,
        "shed is spilled, not lost"
    );
}

#[test]
fn a_failed_spill_keeps_its_entry_in_ram_until_memory_must_be_freed() {
    let (cold, storage) = faulty_cold();
    let (observer, events) = recorder();
    let bank = Bank::new(BankConfig {
        max_entries: 1,
        ..roomy()
    })
    .with_cold(cold)
    .with_observer(observer);
    let (a, b) = conversations();
    bank.commit(commit("a", &a)).unwrap();
    let a_bytes = bank.bytes();

    let hold = storage.hold_creates();
    bank.commit(commit("b", &b)).unwrap();
    hold.wait_for_waiters(1);
    // The disk fills up under the writer: its first file creation fails with ENOSPC.
    storage.fail_next(Fault::NoSpace);
    drop(hold);
    let done = bank.wait_for_spills();
    assert_eq!((done.written, done.failed), (0, 1));

    // A is back: resident (over the one-entry limit, since it could not leave), restored
    // from RAM, and the failure is counted and reported.
    let stats = bank.stats();
    assert_eq!((stats.entries, stats.spilling, stats.unwritten), (2, 0, 2));
    assert_eq!(stats.spill_failures.get("no_space"), Some(&1));
    assert!(bank.contains(&identity(), &a));
    let id = identity();
    let next = joined(&a, &tokens(40, 4));
    let plan = bank.lookup(&query(&id, &next));
    assert_eq!(plan.mode(), RestoreMode::Clone);
    assert_eq!(plan.cached_tokens(), a.len());
    assert!(!plan.explanation().spill_queued);
    drop(plan);
    {
        let events = events.lock().unwrap();
        assert_eq!(events.len(), 1, "{events:?}");
        let BankEvent::SpillFailed {
            session,
            tokens,
            bytes,
            failure,
            outcome,
        } = &events[0];
        assert_eq!(session, &SessionId::new("a"));
        assert_eq!((*tokens, *bytes), (a.len(), a_bytes));
        assert_eq!(failure.reason, "no_space");
        assert_eq!(*outcome, SpillOutcome::KeptInRam);
    }

    // Memory must be freed (admission, b protected): A can't be written, so it is dropped,
    // with the reason, and counted as lost.
    let held = bank.bytes();
    let limit = bank.config().memory_limit_bytes;
    let estimate = MemoryEstimate {
        weights_bytes: 0,
        in_flight_bytes: 0,
        kv_bytes: limit - (held - a_bytes),
        activation_bytes: 0,
    };
    let admitted = bank
        .admit(&estimate, Some(&SessionId::new("b")))
        .expect("admitted");
    assert_eq!(admitted.shed_entries, 1);
    assert!(!bank.contains(&identity(), &a));
    assert!(bank.contains(&identity(), &b));
    assert_eq!(bank.stats().entries_lost, 1);
    let events = events.lock().unwrap();
    assert_eq!(events.len(), 2, "{events:?}");
    let BankEvent::SpillFailed { outcome, .. } = &events[1];
    assert_eq!(*outcome, SpillOutcome::Dropped);
}
