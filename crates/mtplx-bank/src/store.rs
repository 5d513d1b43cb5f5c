//! The RAM store behind the bank's lock: resident entries, entries leaving for the SSD
//! tier, their byte accounting per session and in total, and the eviction order.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use mtplx_cold::SpillTicket;

use crate::durability::Durability;
use crate::entry::{Entry, Footprint, Slot};
use crate::SessionId;

/// Why an entry leaves the resident accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Departure {
    /// Made room: its session is remembered as evicted (a later turn's miss says so).
    Evicted,
    /// Replaced by the same state, or cleared: nothing to remember.
    Dropped,
}
/// Sessions remembered as evicted (for the `evicted` miss) at most.
const EVICTED_MEMORY: usize = 4096;

/// An entry evicted from the bank whose spill has not committed: its rows are still in
/// memory (the writer reads them), so it is still a lookup candidate and its bytes still
/// count in what the bank holds.
pub(crate) struct Leaving {
    pub(crate) entry: Arc<Entry>,
    pub(crate) ticket: SpillTicket,
    pub(crate) created: Duration,
    pub(crate) last_access: Duration,
}

#[derive(Default)]
pub(crate) struct Session {
    pub(crate) footprint: Footprint,
    pub(crate) entries: usize,
    pub(crate) last_access: Duration,
}

#[derive(Default)]
pub(crate) struct Store {
    /// Resident entries.
    pub(crate) slots: BTreeMap<u64, Slot>,
    /// Evicted entries whose spill has not committed yet.
    pub(crate) leaving: BTreeMap<u64, Leaving>,
    pub(crate) next_id: u64,
    /// Bytes of the resident entries: what the byte budgets bound.
    pub(crate) total: Footprint,
    /// Bytes of the resident and the leaving entries: the memory the bank holds.
    pub(crate) held: Footprint,
    /// Resident entries by session.
    pub(crate) sessions: HashMap<SessionId, Session>,
    /// Sessions whose last resident entry was evicted, and when.
    pub(crate) evicted: HashMap<SessionId, Duration>,
}

impl Store {
    pub(crate) fn insert(&mut self, entry: Arc<Entry>, now: Duration, durability: Durability) {
        self.place(entry, now, now, durability);
    }

    fn place(
        &mut self,
        entry: Arc<Entry>,
        created: Duration,
        last_access: Duration,
        durability: Durability,
    ) {
        self.total.add(&entry);
        self.held.add(&entry);
        let s = self.sessions.entry(entry.session.clone()).or_default();
        s.footprint.add(&entry);
        s.entries += 1;
        s.last_access = s.last_access.max(last_access);
        self.evicted.remove(&entry.session);
        self.slots.insert(
            entry.id,
            Slot {
                entry,
                created,
                last_access,
                durability,
            },
        );
    }

    /// Takes a resident entry out of the resident accounting; an eviction remembers its
    /// session if it was the last one. The caller decides whether the bank still holds it.
    fn unplace(&mut self, id: u64, now: Duration, why: Departure) -> Option<Slot> {
        let slot = self.slots.remove(&id)?;
        let e = &slot.entry;
        self.total.remove(e);
        if let Some(s) = self.sessions.get_mut(&e.session) {
            s.footprint.remove(e);
            s.entries -= 1;
            if s.entries == 0 {
                self.sessions.remove(&e.session);
                if why == Departure::Evicted {
                    self.remember_evicted(&e.session.clone(), now);
                }
            }
        }
        Some(slot)
    }

    fn remember_evicted(&mut self, session: &SessionId, now: Duration) {
        if self.evicted.len() >= EVICTED_MEMORY {
            let oldest = self
                .evicted
                .iter()
                .min_by_key(|(_, t)| **t)
                .map(|(k, _)| k.clone());
            oldest.map(|k| self.evicted.remove(&k));
        }
        self.evicted.insert(session.clone(), now);
    }

    /// Drops a resident entry from the bank (it holds it no more).
    pub(crate) fn remove(&mut self, id: u64, now: Duration, why: Departure) -> Option<Slot> {
        let slot = self.unplace(id, now, why)?;
        self.held.remove(&slot.entry);
        Some(slot)
    }

    /// Moves a resident entry to the leaving ones until `ticket` says its spill is done:
    /// it leaves the budgets' accounting but stays held.
    pub(crate) fn depart(&mut self, id: u64, now: Duration, ticket: SpillTicket) {
        if let Some(slot) = self.unplace(id, now, Departure::Evicted) {
            self.leaving.insert(
                id,
                Leaving {
                    entry: slot.entry,
                    ticket,
                    created: slot.created,
                    last_access: slot.last_access,
                },
            );
        }
    }

    /// A leaving entry is gone (written, or dropped): the bank holds it no more.
    pub(crate) fn arrive(&mut self, id: u64) -> Option<Arc<Entry>> {
        let l = self.leaving.remove(&id)?;
        self.held.remove(&l.entry);
        Some(l.entry)
    }

    /// A leaving entry whose spill failed becomes resident again.
    pub(crate) fn come_back(&mut self, id: u64, durability: Durability) {
        if let Some(l) = self.leaving.remove(&id) {
            self.held.remove(&l.entry);
            self.place(l.entry, l.created, l.last_access, durability);
        }
    }

    /// Marks an entry (and its session) used now.
    pub(crate) fn touch(&mut self, id: u64, now: Duration) {
        if let Some(slot) = self.slots.get_mut(&id) {
            slot.last_access = now;
            if let Some(s) = self.sessions.get_mut(&slot.entry.session) {
                s.last_access = now;
            }
        }
    }

    /// Another resident entry of the same session and identity that strictly extends `e`,
    /// if any (its id).
    pub(crate) fn superseded_by(&self, e: &Entry) -> Option<&Slot> {
        self.slots.values().find(|o| {
            let o = &o.entry;
            o.id != e.id
                && o.session == e.session
                && o.digest == e.digest
                && o.tokens.len() > e.tokens.len()
                && o.tokens.starts_with(&e.tokens)
        })
    }

    /// Entry ids in eviction order, among those `scope` accepts: entries superseded by a
    /// longer compatible entry of their session first; then least recently used, idle
    /// sessions (not used within `active_window`) before active ones; `protect`'s entries
    /// after everything else.
    pub(crate) fn victims(
        &self,
        now: Duration,
        active_window: Duration,
        scope: impl Fn(&Slot) -> bool,
        protect: Option<&SessionId>,
    ) -> Vec<u64> {
        let mut order: Vec<_> = self
            .slots
            .values()
            .filter(|s| scope(s))
            .map(|s| {
                let e = &s.entry;
                let active = self.session_idle(&e.session, now) < active_window;
                let key = (
                    protect == Some(&e.session),
                    self.superseded_by(e).is_none(),
                    active,
                    s.last_access,
                    e.id,
                );
                (key, e.id)
            })
            .collect();
        order.sort();
        order.into_iter().map(|(_, id)| id).collect()
    }

    /// How long `session` has not been used (since its start of time if unknown).
    pub(crate) fn session_idle(&self, session: &SessionId, now: Duration) -> Duration {
        let last = self
            .sessions
            .get(session)
            .map_or(Duration::ZERO, |x| x.last_access);
        now.saturating_sub(last)
    }

    /// Ids of `session`'s entries that count against the entry limits (not those the SSD
    /// tier refused), oldest first (by commit time).
    pub(crate) fn session_entries_oldest_first(&self, session: &SessionId) -> Vec<u64> {
        let mut v: Vec<(Duration, u64)> = self
            .slots
            .values()
            .filter(|s| &s.entry.session == session && !s.durability.failed())
            .map(|s| (s.created, s.entry.id))
            .collect();
        v.sort();
        v.into_iter().map(|x| x.1).collect()
    }

    /// Writes not finished: idle writes of resident entries and spills of leaving ones.
    pub(crate) fn writes_in_flight(&self) -> usize {
        let writing = self
            .slots
            .values()
            .filter(|s| matches!(s.durability, Durability::Writing(_)))
            .count();
        writing + self.leaving.len()
    }

    /// Resident entries that count against the entry limits.
    pub(crate) fn counted_entries(&self) -> usize {
        self.slots
            .values()
            .filter(|s| !s.durability.failed())
            .count()
    }
}
