//! The RAM store behind the bank's lock: entries, their byte accounting per session and
//! in total, and the eviction order.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::entry::{Entry, Footprint, Slot};
use crate::SessionId;

/// Sessions remembered as evicted (for the `evicted` miss) at most.
const EVICTED_MEMORY: usize = 4096;

#[derive(Default)]
pub(crate) struct Session {
    pub(crate) footprint: Footprint,
    pub(crate) entries: usize,
    pub(crate) last_access: Duration,
}

#[derive(Default)]
pub(crate) struct Store {
    pub(crate) slots: BTreeMap<u64, Slot>,
    pub(crate) next_id: u64,
    pub(crate) total: Footprint,
    pub(crate) sessions: HashMap<SessionId, Session>,
    /// Sessions whose last entry was evicted, and when.
    pub(crate) evicted: HashMap<SessionId, Duration>,
}

impl Store {
    pub(crate) fn insert(&mut self, entry: Arc<Entry>, now: Duration) {
        self.total.add(&entry);
        let s = self.sessions.entry(entry.session.clone()).or_default();
        s.footprint.add(&entry);
        s.entries += 1;
        s.last_access = s.last_access.max(now);
        self.evicted.remove(&entry.session);
        self.slots.insert(
            entry.id,
            Slot {
                entry,
                created: now,
                last_access: now,
            },
        );
    }

    /// Removes an entry; `evicted` remembers its session if it was the last one.
    pub(crate) fn remove(&mut self, id: u64, now: Duration, evicted: bool) -> Option<Arc<Entry>> {
        let slot = self.slots.remove(&id)?;
        let e = slot.entry;
        self.total.remove(&e);
        if let Some(s) = self.sessions.get_mut(&e.session) {
            s.footprint.remove(&e);
            s.entries -= 1;
            if s.entries == 0 {
                self.sessions.remove(&e.session);
                if evicted {
                    if self.evicted.len() >= EVICTED_MEMORY {
                        let oldest = self
                            .evicted
                            .iter()
                            .min_by_key(|(_, t)| **t)
                            .map(|(k, _)| k.clone());
                        oldest.map(|k| self.evicted.remove(&k));
                    }
                    self.evicted.insert(e.session.clone(), now);
                }
            }
        }
        Some(e)
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

    /// Whether another entry of the same session and identity strictly extends `e`.
    fn superseded(&self, e: &Entry) -> bool {
        self.slots.values().any(|o| {
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
        scope: impl Fn(&Entry) -> bool,
        protect: Option<&SessionId>,
    ) -> Vec<u64> {
        let mut order: Vec<_> = self
            .slots
            .values()
            .filter(|s| scope(&s.entry))
            .map(|s| {
                let e = &s.entry;
                let session_last = self
                    .sessions
                    .get(&e.session)
                    .map_or(Duration::ZERO, |x| x.last_access);
                let active = now.saturating_sub(session_last) < active_window;
                let key = (
                    protect == Some(&e.session),
                    !self.superseded(e),
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

    /// Ids of `session`'s entries, oldest first (by commit time).
    pub(crate) fn session_entries_oldest_first(&self, session: &SessionId) -> Vec<u64> {
        let mut v: Vec<(Duration, u64)> = self
            .slots
            .values()
            .filter(|s| &s.entry.session == session)
            .map(|s| (s.created, s.entry.id))
            .collect();
        v.sort();
        v.into_iter().map(|x| x.1).collect()
    }
}
