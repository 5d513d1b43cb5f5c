//! The bank and the SSD tier: evictions that spill, idle entries written behind, failed
//! writes that keep their entry in RAM, and the flush a stopping server asks for.
//!
//! An entry is never invisible while its rows are in memory: an evicted entry whose spill
//! has not committed is *leaving* (still a candidate, still counted); a spill the tier
//! refuses or fails keeps the entry resident while the byte budget allows, and drops it,
//! with the reason, only when memory must be freed.

use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

use crate::convert::spill_entry;
use crate::durability::{BankEvent, Durability, SpillFailure, SpillOutcome};
use crate::durability::{FlushReport, SpillsDone};
use crate::entry::Entry;
use crate::shared::{Bank, CommitReport};
use crate::store::{Departure, Store};
use crate::sync::lock;

/// Why an entry is evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    Ttl,
    SessionEntries,
    SessionBytes,
    Entries,
    Bytes,
    Shed,
}

impl Cause {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Cause::Ttl => "ttl",
            Cause::SessionEntries => "session_entries",
            Cause::SessionBytes => "session_bytes",
            Cause::Entries => "entries",
            Cause::Bytes => "bytes",
            Cause::Shed => "shed",
        }
    }

    /// Whether the eviction frees memory (an entry the SSD tier can't take is then
    /// dropped) rather than keeping to a count or an age (it then stays).
    fn frees_memory(self) -> bool {
        matches!(self, Cause::SessionBytes | Cause::Bytes | Cause::Shed)
    }
}

impl Bank {
    /// Evicts a resident entry for `cause`. One on the SSD tier (or any, without a tier)
    /// simply leaves; any other is written, and leaves as it is being written (it stays a
    /// candidate until the write commits). One the tier does not take stays, unless `cause`
    /// frees memory: then it is dropped, with the reason. Returns whether it left.
    pub(crate) fn evict(
        &self,
        store: &mut Store,
        id: u64,
        cause: Cause,
        now: Duration,
        r: &mut CommitReport,
    ) -> bool {
        let Some(slot) = store.slots.get(&id) else {
            return false;
        };
        if self.cold.is_some() && slot.durability.may_write(now) {
            self.write(store, id, now);
        }
        let durability = &mut store.slots.get_mut(&id).expect("resident").durability;
        match std::mem::replace(durability, Durability::Unwritten) {
            Durability::Writing(ticket) => {
                store.depart(id, now, ticket);
                r.spilled += 1;
            }
            kept @ Durability::Failed { .. } if !cause.frees_memory() => {
                *durability = kept;
                return false;
            }
            Durability::Failed { failure, .. } => {
                let slot = store.remove(id, now, Departure::Evicted).expect("resident");
                lock(&self.stats).entries_lost += 1;
                self.emit_failure(&slot.entry, failure, SpillOutcome::Dropped);
            }
            // Written, or (without a tier) unwritten: nothing to write.
            Durability::Written | Durability::Unwritten => {
                store.remove(id, now, Departure::Evicted);
            }
        }
        self.left(cause, r);
        true
    }

    fn left(&self, cause: Cause, r: &mut CommitReport) {
        r.evicted += 1;
        self.count_eviction(cause.as_str());
    }

    /// Queues a write of resident entry `id` (checking the tier's room first): it becomes
    /// `Writing`, or `Failed` with the reason.
    pub(crate) fn write(&self, store: &mut Store, id: u64, now: Duration) {
        let Some(cold) = &self.cold else {
            return;
        };
        let Some(slot) = store.slots.get_mut(&id) else {
            return;
        };
        let spill = spill_entry(&slot.entry);
        match cold.check_room(&spill).and_then(|()| cold.spill(spill)) {
            Ok(ticket) => {
                slot.durability = Durability::Writing(ticket);
                lock(&self.stats).spills_queued += 1;
            }
            Err(e) => {
                let failure = SpillFailure::of(&e);
                self.count_failure(&failure);
                let changed = !matches!(&slot.durability,
                    Durability::Failed { failure: f, .. } if f.reason == failure.reason);
                slot.durability = Durability::Failed {
                    failure: failure.clone(),
                    at: now,
                };
                if changed {
                    let entry = slot.entry.clone();
                    self.emit_failure(&entry, failure, SpillOutcome::KeptInRam);
                }
            }
        }
    }

    /// Takes in the outcome of every finished write: an idle write's entry is `Written` or
    /// `Failed`; a leaving entry is gone, or back in RAM if its write failed and the byte
    /// budgets have room for it (dropped, with the reason, if not).
    pub(crate) fn reap_locked(&self, store: &mut Store, now: Duration) {
        let mut done = SpillsDone::default();
        let mut failed = Vec::new();
        for slot in store.slots.values_mut() {
            let Durability::Writing(ticket) = &slot.durability else {
                continue;
            };
            match ticket.try_result() {
                None => {}
                Some(Ok(_)) => {
                    slot.durability = Durability::Written;
                    done.written += 1;
                }
                Some(Err(e)) => {
                    let failure = SpillFailure::of(&e);
                    slot.durability = Durability::Failed {
                        failure: failure.clone(),
                        at: now,
                    };
                    done.failed += 1;
                    failed.push((slot.entry.clone(), failure));
                }
            }
        }
        for (entry, failure) in failed {
            self.count_failure(&failure);
            self.emit_failure(&entry, failure, SpillOutcome::KeptInRam);
        }

        let finished: Vec<_> = store
            .leaving
            .iter()
            .filter_map(|(&id, l)| l.ticket.try_result().map(|r| (id, r)))
            .collect();
        for (id, result) in finished {
            match result {
                Ok(_) => {
                    store.arrive(id);
                    done.written += 1;
                }
                Err(e) => {
                    done.failed += 1;
                    let failure = SpillFailure::of(&e);
                    self.count_failure(&failure);
                    let entry = store.leaving[&id].entry.clone();
                    if self.has_room_for(store, &entry) {
                        store.come_back(
                            id,
                            Durability::Failed {
                                failure: failure.clone(),
                                at: now,
                            },
                        );
                        self.emit_failure(&entry, failure, SpillOutcome::KeptInRam);
                    } else {
                        store.arrive(id);
                        lock(&self.stats).entries_lost += 1;
                        self.emit_failure(&entry, failure, SpillOutcome::Dropped);
                    }
                }
            }
        }
        let mut stats = lock(&self.stats);
        stats.spills_written += done.written as u64;
        stats.spills_failed += done.failed as u64;
        drop(stats);
        let mut t = lock(&self.done);
        t.written += done.written;
        t.failed += done.failed;
    }

    /// Whether a leaving entry may become resident again: the byte budgets have room for
    /// it, and no resident entry holds the same state.
    fn has_room_for(&self, store: &Store, entry: &Entry) -> bool {
        let bytes = entry.bytes();
        let session = store
            .sessions
            .get(&entry.session)
            .map_or(0, |s| s.footprint.bytes());
        let duplicate = store
            .slots
            .values()
            .any(|s| s.entry.digest == entry.digest && s.entry.tokens == entry.tokens);
        !duplicate
            && store.total.bytes() + bytes <= self.config.max_bytes
            && session + bytes <= self.config.max_session_bytes
    }

    /// Background upkeep, called every fraction of a second by the owner (the server):
    /// takes in finished writes, evicts expired entries, and writes behind every entry
    /// whose session has been idle for [`crate::BankConfig::idle_write`] (those the tier
    /// refused are tried again after a while). Entries a longer entry of their session
    /// extends are not written: that one covers them.
    pub fn tick(&self) {
        let mut store = lock(&self.store);
        let now = self.clock.now();
        self.reap_locked(&mut store, now);
        self.expire_locked(&mut store, now, &mut CommitReport::default());
        let Some(after) = self.config.idle_write else {
            return;
        };
        let due: Vec<u64> = store
            .slots
            .values()
            .filter(|s| s.durability.may_write(now))
            .filter(|s| store.session_idle(&s.entry.session, now) >= after)
            .filter(|s| store.superseded_by(&s.entry).is_none())
            .map(|s| s.entry.id)
            .collect();
        for id in due {
            self.write(&mut store, id, now);
            lock(&self.stats).idle_writes += 1;
        }
    }

    /// Writes every resident entry not yet on the SSD tier and waits, until `timeout`, for
    /// those writes and every spill in flight: what a stopping server does so that no
    /// conversation it answered is lost.
    pub fn flush(&self, timeout: Duration) -> FlushReport {
        let mut report = FlushReport::default();
        let before = lock(&self.stats).spills_written;
        {
            let mut store = lock(&self.store);
            let now = self.clock.now();
            self.reap_locked(&mut store, now);
            report.already_written = store
                .slots
                .values()
                .filter(|s| matches!(s.durability, Durability::Written))
                .count();
            let ids: Vec<u64> = store
                .slots
                .values()
                .filter(|s| {
                    matches!(
                        s.durability,
                        Durability::Unwritten | Durability::Failed { .. }
                    )
                })
                .map(|s| s.entry.id)
                .collect();
            for id in ids {
                // At a stop, the tier is asked again whatever it said last.
                if let Some(s) = store.slots.get_mut(&id) {
                    s.durability = Durability::Unwritten;
                }
                self.write(&mut store, id, now);
            }
        }
        let store = self.wait_while(lock(&self.store), timeout, |s| s.writes_in_flight() > 0);
        report.pending = store.writes_in_flight();
        report.failed = store
            .slots
            .values()
            .filter_map(|s| match &s.durability {
                Durability::Failed { failure, .. } => Some((
                    s.entry.session.clone(),
                    s.entry.tokens.len(),
                    failure.clone(),
                )),
                _ => None,
            })
            .collect();
        drop(store);
        report.written = (lock(&self.stats).spills_written - before) as usize;
        report
    }

    /// Waits, until `timeout`, while `cond` holds of the store (taking in finished writes
    /// as they come); returns the store locked again.
    pub(crate) fn wait_while<'a>(
        &'a self,
        mut store: MutexGuard<'a, Store>,
        timeout: Duration,
        cond: impl Fn(&Store) -> bool,
    ) -> MutexGuard<'a, Store> {
        let start = Instant::now();
        loop {
            self.reap_locked(&mut store, self.clock.now());
            if !cond(&store) || start.elapsed() >= timeout {
                return store;
            }
            drop(store);
            std::thread::sleep(Duration::from_millis(2));
            store = lock(&self.store);
        }
    }

    fn count_failure(&self, failure: &SpillFailure) {
        *lock(&self.stats)
            .spill_failures
            .entry(failure.reason)
            .or_default() += 1;
    }

    fn emit_failure(&self, entry: &Arc<Entry>, failure: SpillFailure, outcome: SpillOutcome) {
        if let Some(observe) = &self.observer {
            observe(&BankEvent::SpillFailed {
                session: entry.session.clone(),
                tokens: entry.tokens.len(),
                bytes: entry.bytes(),
                failure,
                outcome,
            });
        }
    }
}
