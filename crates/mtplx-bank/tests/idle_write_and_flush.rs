//! Idle conversations are written behind to the SSD tier (only the blocks a turn adds are
//! new), a tier without room is known before an entry leaves RAM, and a stopping server's
//! flush writes whatever is left within its deadline.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use mtplx_bank::{Bank, BankConfig, BankEvent, ManualClock, RestoreMode, SpillOutcome};
use mtplx_cold::BLOCK_TOKENS;

fn idle_bank(config: BankConfig) -> (Bank, ManualClock, mtplx_cold::storage::FaultyStorage) {
    let (cold, storage) = faulty_cold();
    let clock = ManualClock::new();
    let bank = Bank::new(config)
        .with_clock(Arc::new(clock.clone()))
        .with_cold(cold);
    (bank, clock, storage)
}

fn blob_files(storage: &mtplx_cold::storage::FaultyStorage) -> usize {
    storage.files(Path::new("blobs")).len()
}

#[test]
fn an_idle_session_is_written_behind_and_a_follow_up_turn_writes_only_its_new_blocks() {
    let (bank, clock, storage) = idle_bank(BankConfig {
        idle_write: Some(Duration::from_secs(3)),
        ..roomy()
    });
    let turn1 = tokens(900, 1);
    bank.commit(commit("a", &turn1)).unwrap();
    clock.advance(Duration::from_secs(1));
    bank.tick();
    assert_eq!(
        bank.stats().idle_writes,
        0,
        "written before the session was idle"
    );
    assert_eq!(blob_files(&storage), 0);

    clock.advance(Duration::from_secs(3));
    bank.tick();
    assert_eq!(bank.wait_for_spills().written, 1);
    let stats = bank.stats();
    assert_eq!((stats.idle_writes, stats.unwritten), (1, 0));
    // Four KV blocks (three full, one partial) and the tail state.
    assert_eq!(blob_files(&storage), 4 + 1);
    // Written once: another tick does not write it again.
    clock.advance(Duration::from_secs(10));
    bank.tick();
    assert_eq!(bank.stats().idle_writes, 1);

    // The next turn extends it: its three full blocks are already stored, so only blocks 4
    // and 5 (and the new tail) are new.
    let turn2 = joined(&turn1, &tokens(300, 2));
    assert_eq!(turn2.len().div_ceil(BLOCK_TOKENS), 5);
    bank.commit(commit("a", &turn2)).unwrap();
    clock.advance(Duration::from_secs(4));
    bank.tick();
    assert_eq!(bank.wait_for_spills().written, 1);
    assert_eq!(
        bank.stats().idle_writes,
        2,
        "turn 1, superseded by turn 2, is not written again"
    );
    assert_eq!(blob_files(&storage), 5 + 2 + 1);
}

#[test]
fn an_entry_already_written_leaves_ram_without_a_second_write() {
    let (bank, clock, _storage) = idle_bank(BankConfig {
        max_entries: 1,
        idle_write: Some(Duration::from_secs(3)),
        ..roomy()
    });
    let a = tokens(700, 1);
    bank.commit(commit("a", &a)).unwrap();
    clock.advance(Duration::from_secs(5));
    bank.tick();
    bank.wait_for_spills();
    let queued = bank.stats().spills_queued;
    let report = bank.commit(commit("b", &tokens(300, 2))).unwrap();
    assert_eq!((report.evicted, report.spilled), (1, 0));
    assert_eq!(bank.stats().spills_queued, queued);
    assert_eq!(bank.stats().spilling, 0);
    let id = identity();
    let plan = bank.lookup(&query(&id, &joined(&a, &[5])));
    assert_eq!(plan.mode(), RestoreMode::SsdClone);
    assert_eq!(plan.cached_tokens(), a.len());
}

#[test]
fn zero_idle_time_writes_every_turn_at_its_commit() {
    let (bank, _clock, _storage) = idle_bank(BankConfig {
        idle_write: Some(Duration::ZERO),
        ..roomy()
    });
    bank.commit(commit("a", &tokens(300, 1))).unwrap();
    assert_eq!(bank.wait_for_spills().written, 1);
    assert_eq!(bank.stats().unwritten, 0);
}

#[test]
fn a_tier_without_room_is_known_before_the_entry_leaves_and_it_is_written_once_there_is() {
    let (cold, storage) = faulty_cold();
    let clock = ManualClock::new();
    let (observer, events) = recorder();
    let bank = Bank::new(BankConfig {
        max_entries: 1,
        idle_write: Some(Duration::from_secs(3)),
        ..roomy()
    })
    .with_clock(Arc::new(clock.clone()))
    .with_cold(cold.clone())
    .with_observer(observer);
    // A quarter of 64 KiB of disk: no room for a 600-token entry.
    storage.set_free_space(64 << 10);
    let a = tokens(600, 1);
    bank.commit(commit("a", &a)).unwrap();
    let steps = storage.steps();
    bank.commit(commit("b", &tokens(100, 2))).unwrap();
    assert_eq!(storage.steps(), steps, "nothing was queued for the writer");
    let stats = bank.stats();
    assert_eq!((stats.entries, stats.spilling), (2, 0), "A stays in RAM");
    assert_eq!(stats.spill_failures.get("too_large"), Some(&1));
    let id = identity();
    assert_eq!(
        bank.lookup(&query(&id, &joined(&a, &[3]))).mode(),
        RestoreMode::Clone
    );
    {
        let events = events.lock().unwrap();
        let BankEvent::SpillFailed {
            failure, outcome, ..
        } = &events[0];
        assert_eq!(
            (failure.reason, *outcome),
            ("too_large", SpillOutcome::KeptInRam)
        );
    }

    // The disk is freed; after the retry delay the idle write takes A (and B).
    storage.set_free_space(1 << 40);
    clock.advance(Duration::from_secs(31));
    bank.tick();
    assert_eq!(bank.wait_for_spills().written, 2);
    assert_eq!(bank.stats().unwritten, 0);
    assert_eq!(cold.usage().unwrap().entries, 2);
}

#[test]
fn a_flush_writes_every_unwritten_entry_and_reports_what_it_could_not() {
    let (bank, _clock, storage) = idle_bank(BankConfig {
        idle_write: None,
        ..roomy()
    });
    for s in 0..3 {
        bank.commit(commit(&format!("s{s}"), &tokens(300, s + 1)))
            .unwrap();
    }
    let report = bank.flush(Duration::from_secs(60));
    assert_eq!((report.written, report.pending), (3, 0));
    assert!(report.failed.is_empty());
    assert_eq!(bank.stats().unwritten, 0);

    // A second flush has nothing left to do.
    let again = bank.flush(Duration::from_secs(60));
    assert_eq!((again.already_written, again.written), (3, 0));

    // No room: the flush names what it could not write.
    bank.commit(commit("big", &tokens(900, 7))).unwrap();
    storage.set_free_space(64 << 10);
    let report = bank.flush(Duration::from_secs(60));
    assert_eq!(report.written, 0);
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].1, 900);
    assert_eq!(report.failed[0].2.reason, "too_large");
}

#[test]
fn a_flush_stops_at_its_deadline_and_counts_the_writes_still_running() {
    let (bank, _clock, storage) = idle_bank(BankConfig {
        idle_write: None,
        ..roomy()
    });
    bank.commit(commit("a", &tokens(300, 1))).unwrap();
    let hold = storage.hold_creates();
    let report = bank.flush(Duration::from_millis(200));
    assert_eq!((report.written, report.pending), (0, 1));
    drop(hold);
    assert_eq!(
        bank.wait_for_spills().written,
        1,
        "the write went on after the deadline"
    );
    let report = bank.flush(Duration::from_secs(60));
    assert_eq!(report.pending, 0);
    assert_eq!(bank.stats().unwritten, 0);
}
