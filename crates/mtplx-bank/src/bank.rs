//! [`Bank`]: the RAM session bank.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use mtplx_cold::{ColdIndex, ColdLookup, ColdQuery, Identity, MissReason as ColdMiss, SpillTicket};

use crate::admission::{decide, Admitted, Decision, MemoryEstimate, Refusal};
use crate::candidate::Handle;
use crate::clock::{Clock, SystemClock};
use crate::convert::spill_entry;
use crate::entry::Entry;
use crate::lookup::{gather, LookupQuery};
use crate::plan::Plan;
use crate::stats::{SessionInfo, Stats};
use crate::store::Store;
use crate::{BankConfig, BankError, Commit, SessionId};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The RAM session bank: committed conversation states, the lookup that picks the state
/// covering most of a prompt (RAM or SSD), eviction within budgets (spilling to the SSD
/// tier), and admission. Every method takes `&self`; share it behind an `Arc`.
pub struct Bank {
    config: BankConfig,
    clock: Arc<dyn Clock>,
    cold: Option<Arc<dyn ColdIndex>>,
    store: Mutex<Store>,
    stats: Arc<Mutex<Stats>>,
    spills: Mutex<Vec<SpillTicket>>,
}

/// What a commit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommitReport {
    /// Whether the committed state is in the bank afterwards (a state over the session's or
    /// the bank's byte budget on its own is spilled straight away).
    pub kept: bool,
    /// Entries evicted to make room (or expired), the new one included if not kept.
    pub evicted: usize,
    /// Of those, entries handed to the SSD tier's writer.
    pub spilled: usize,
}

/// Outcome of waiting for queued spills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpillsDone {
    pub written: usize,
    pub failed: usize,
}

impl Bank {
    /// An empty bank on the system clock, with no SSD tier.
    pub fn new(config: BankConfig) -> Bank {
        Bank {
            config,
            clock: Arc::new(SystemClock::new()),
            cold: None,
            store: Mutex::new(Store::default()),
            stats: Arc::new(Mutex::new(Stats::default())),
            spills: Mutex::new(Vec::new()),
        }
    }

    /// The same bank measuring time on `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Bank {
        self.clock = clock;
        self
    }

    /// The same bank with an SSD tier: lookups ask it, evictions spill to it.
    pub fn with_cold(mut self, cold: Arc<dyn ColdIndex>) -> Bank {
        self.cold = Some(cold);
        self
    }

    pub fn config(&self) -> &BankConfig {
        &self.config
    }

    /// Keeps a committed state, replacing one with the same identity and tokens, then
    /// evicts within the budgets: expired entries, the session's oldest entries beyond its
    /// newest `max_entries_per_session`, then (in eviction order) the session's entries over
    /// its byte budget, and the bank's over its entry and byte budgets. Evicted entries are
    /// queued for the SSD tier's writer (write-behind: this never waits for a disk).
    pub fn commit(&self, c: Commit) -> Result<CommitReport, BankError> {
        validate(&c)?;
        let mut store = lock(&self.store);
        let now = self.clock.now();
        let mut report = CommitReport::default();
        self.expire_locked(&mut store, now, &mut report);
        let digest = c.identity.digest();
        let same: Vec<u64> = store
            .slots
            .values()
            .filter(|s| s.entry.digest == digest && s.entry.tokens == c.tokens)
            .map(|s| s.entry.id)
            .collect();
        for id in same {
            store.remove(id, now, false);
            self.count_eviction("replaced");
        }
        let id = store.next_id;
        store.next_id += 1;
        let session = c.session.clone();
        store.insert(
            Arc::new(Entry {
                id,
                session: c.session,
                identity: c.identity,
                digest,
                tokens: c.tokens,
                kv: c.kv,
                continuation: c.continuation,
                checkpoints: c.checkpoints,
            }),
            now,
        );
        self.enforce(&mut store, &session, now, &mut report);
        report.kept = store.slots.contains_key(&id);
        Ok(report)
    }

    /// Finds the stored state that covers most of the prompt, from RAM entries and the SSD
    /// tier's manifest, without reading any tensor. The returned plan holds only the
    /// winner; [`Plan::restore`] builds the cache.
    pub fn lookup(&self, q: &LookupQuery<'_>) -> Plan {
        let cold = match &self.cold {
            Some(c) => c.lookup(&ColdQuery {
                identity: q.identity,
                prompt: q.prompt,
                floor: q.floor,
            }),
            None => ColdLookup::miss(ColdMiss::CacheOff),
        };
        let mut store = lock(&self.store);
        let now = self.clock.now();
        self.expire_locked(&mut store, now, &mut CommitReport::default());
        let evicted = q
            .session
            .is_some_and(|s| store.evicted.contains_key(s) && !store.sessions.contains_key(s));
        let g = gather(
            store.slots.values().map(|s| &s.entry),
            q,
            &self.config.matching,
            cold,
            evicted,
        );
        if let Some(Handle::Ram(e)) = g.chosen.as_ref().map(|c| &c.handle) {
            store.touch(e.id, now);
        }
        if let Some(s) = q.session.and_then(|s| store.sessions.get_mut(s)) {
            s.last_access = now;
        }
        Plan {
            chosen: g.chosen,
            explanation: g.explanation,
            watch: g.watch,
            cold: self.cold.clone(),
            stats: self.stats.clone(),
        }
    }

    /// Admits a request whose peak is `estimate` against the memory limit, shedding bank
    /// entries (in eviction order, `protect`'s last; spilled to the SSD tier) when that
    /// makes it fit. When even an empty bank would not make it fit, refuses without
    /// shedding anything: nothing committed is lost.
    pub fn admit(
        &self,
        estimate: &MemoryEstimate,
        protect: Option<&SessionId>,
    ) -> Result<Admitted, Refusal> {
        let mut store = lock(&self.store);
        let now = self.clock.now();
        self.expire_locked(&mut store, now, &mut CommitReport::default());
        let limit = self.config.memory_limit_bytes;
        let before = store.total.bytes();
        let admitted = match decide(estimate, before, limit) {
            Decision::Fits { headroom } => Admitted {
                shed_entries: 0,
                shed_bytes: 0,
                headroom,
            },
            Decision::ShedTo(target) => {
                let mut shed = 0;
                for id in store.victims(now, self.config.active_window, |_| true, protect) {
                    if store.total.bytes() <= target {
                        break;
                    }
                    self.evict(&mut store, id, "shed", now, &mut CommitReport::default());
                    shed += 1;
                }
                let after = store.total.bytes();
                lock(&self.stats).shed_entries += shed as u64;
                Admitted {
                    shed_entries: shed,
                    shed_bytes: before - after,
                    headroom: target.saturating_sub(after),
                }
            }
            Decision::Refuse(r) => {
                lock(&self.stats).refused += 1;
                return Err(r);
            }
        };
        lock(&self.stats).admitted += 1;
        Ok(admitted)
    }

    /// Evicts (and spills) every entry idle for longer than the TTL; returns how many.
    pub fn expire(&self) -> usize {
        let mut store = lock(&self.store);
        let now = self.clock.now();
        let mut report = CommitReport::default();
        self.expire_locked(&mut store, now, &mut report);
        report.evicted
    }

    /// The sessions held, most recently used first.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        let store = lock(&self.store);
        let now = self.clock.now();
        let mut out: Vec<SessionInfo> = store
            .sessions
            .iter()
            .map(|(id, s)| SessionInfo {
                id: id.clone(),
                entries: s.entries,
                bytes: s.footprint.bytes(),
                longest_tokens: store
                    .slots
                    .values()
                    .filter(|x| &x.entry.session == id)
                    .map(|x| x.entry.tokens.len())
                    .max()
                    .unwrap_or(0),
                idle_for: now.saturating_sub(s.last_access),
            })
            .collect();
        out.sort_by(|a, b| a.idle_for.cmp(&b.idle_for).then_with(|| a.id.cmp(&b.id)));
        out
    }

    /// Forgets every entry (no spill: clearing is asked for); returns how many.
    pub fn clear(&self) -> usize {
        let mut store = lock(&self.store);
        let now = self.clock.now();
        let ids: Vec<u64> = store.slots.keys().copied().collect();
        ids.iter().for_each(|&id| {
            store.remove(id, now, false);
        });
        ids.len()
    }

    /// Forgets one session's entries (no spill); returns how many.
    pub fn clear_session(&self, session: &SessionId) -> usize {
        let mut store = lock(&self.store);
        let now = self.clock.now();
        let ids = store.session_entries_oldest_first(session);
        ids.iter().for_each(|&id| {
            store.remove(id, now, false);
        });
        ids.len()
    }

    /// Counters and current holdings.
    pub fn stats(&self) -> Stats {
        self.reap_spills(false);
        let store = lock(&self.store);
        let mut s = lock(&self.stats).clone();
        s.bytes = store.total.bytes();
        s.entries = store.slots.len();
        s.sessions = store.sessions.len();
        s
    }

    /// Bytes all entries hold together, each shared buffer counted once.
    pub fn bytes(&self) -> u64 {
        lock(&self.store).total.bytes()
    }

    /// Whether a state with exactly these tokens is held under `identity`.
    pub fn contains(&self, identity: &Identity, tokens: &[u32]) -> bool {
        let digest = identity.digest();
        lock(&self.store)
            .slots
            .values()
            .any(|s| s.entry.digest == digest && s.entry.tokens == tokens)
    }

    /// Blocks until every queued spill is written or has failed (tests, shutdown).
    pub fn wait_for_spills(&self) -> SpillsDone {
        self.reap_spills(true)
    }

    /// The session whose stored conversation the prompt continues: the entry under
    /// `identity` sharing the longest token prefix with `prompt`, when that prefix covers at
    /// least 90% of the entry (and 16 tokens) — a returning conversation re-renders its
    /// earlier turns, so only the last few tokens of the stored answer may differ. For
    /// clients that name no session.
    pub fn session_by_prefix(&self, identity: &Identity, prompt: &[u32]) -> Option<SessionId> {
        let digest = identity.digest();
        let store = lock(&self.store);
        store
            .slots
            .values()
            .filter(|s| s.entry.digest == digest)
            .filter_map(|s| {
                let lcp = s
                    .entry
                    .tokens
                    .iter()
                    .zip(prompt)
                    .take_while(|(a, b)| a == b)
                    .count();
                (lcp >= 16 && lcp * 10 >= s.entry.tokens.len() * 9)
                    .then(|| (lcp, s.entry.session.clone()))
            })
            .max_by_key(|(lcp, _)| *lcp)
            .map(|(_, session)| session)
    }

    fn reap_spills(&self, wait: bool) -> SpillsDone {
        let tickets = std::mem::take(&mut *lock(&self.spills));
        let mut done = SpillsDone::default();
        let mut pending = Vec::new();
        for t in tickets {
            let outcome = if wait {
                t.wait()
            } else {
                match t.try_result() {
                    Some(r) => r,
                    None => {
                        pending.push(t);
                        continue;
                    }
                }
            };
            match outcome {
                Ok(_) => done.written += 1,
                Err(_) => done.failed += 1,
            }
        }
        lock(&self.spills).extend(pending);
        lock(&self.stats).spills_failed += done.failed as u64;
        done
    }

    fn expire_locked(&self, store: &mut Store, now: Duration, report: &mut CommitReport) {
        let ttl = self.config.idle_ttl;
        let old: Vec<u64> = store
            .slots
            .values()
            .filter(|s| now.saturating_sub(s.last_access) > ttl)
            .map(|s| s.entry.id)
            .collect();
        for id in old {
            self.evict(store, id, "ttl", now, report);
        }
    }

    fn enforce(&self, store: &mut Store, session: &SessionId, now: Duration, r: &mut CommitReport) {
        let cfg = &self.config;
        let ids = store.session_entries_oldest_first(session);
        let over = ids.len().saturating_sub(cfg.max_entries_per_session);
        for &id in &ids[..over] {
            self.evict(store, id, "session_entries", now, r);
        }
        let session_bytes = |s: &Store| s.sessions.get(session).map_or(0, |x| x.footprint.bytes());
        if session_bytes(store) > cfg.max_session_bytes {
            let order = store.victims(now, cfg.active_window, |e| &e.session == session, None);
            for id in order {
                if session_bytes(store) <= cfg.max_session_bytes {
                    break;
                }
                self.evict(store, id, "session_bytes", now, r);
            }
        }
        if store.slots.len() > cfg.max_entries || store.total.bytes() > cfg.max_bytes {
            for id in store.victims(now, cfg.active_window, |_| true, None) {
                let cause = if store.slots.len() > cfg.max_entries {
                    "entries"
                } else if store.total.bytes() > cfg.max_bytes {
                    "bytes"
                } else {
                    break;
                };
                self.evict(store, id, cause, now, r);
            }
        }
    }

    /// Removes an entry and queues it for the SSD tier, if one is attached.
    fn evict(
        &self,
        store: &mut Store,
        id: u64,
        cause: &'static str,
        now: Duration,
        r: &mut CommitReport,
    ) {
        let Some(entry) = store.remove(id, now, true) else {
            return;
        };
        r.evicted += 1;
        self.count_eviction(cause);
        let Some(cold) = &self.cold else {
            return;
        };
        match cold.spill(spill_entry(&entry)) {
            Ok(ticket) => {
                r.spilled += 1;
                lock(&self.spills).push(ticket);
                lock(&self.stats).spills_queued += 1;
            }
            Err(_) => lock(&self.stats).spills_failed += 1,
        }
    }

    fn count_eviction(&self, cause: &'static str) {
        *lock(&self.stats).evictions.entry(cause).or_default() += 1;
    }
}

fn validate(c: &Commit) -> Result<(), BankError> {
    let n = c.tokens.len();
    if n == 0 {
        return Err(BankError::EmptyTokens);
    }
    if c.kv.len() != n {
        return Err(BankError::LengthMismatch {
            tokens: n,
            kv: c.kv.len(),
        });
    }
    let mut last = 0;
    for cp in c.checkpoints.iter().flatten() {
        if cp.position <= last || cp.position > n {
            return Err(BankError::BadCheckpoints {
                tokens: n,
                position: cp.position,
            });
        }
        last = cp.position;
    }
    Ok(())
}
