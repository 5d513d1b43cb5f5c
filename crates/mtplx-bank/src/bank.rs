//! [`Bank`]: the RAM session bank.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mtplx_cold::{ColdIndex, ColdLookup, ColdQuery, Identity, MissReason as ColdMiss};

use crate::admission::{decide, spill_refusal, Admitted, Decision, MemoryEstimate, Refusal};
use crate::candidate::Handle;
use crate::checkpoints;
use crate::clock::{Clock, SystemClock};
use crate::durability::SpillsDone;
use crate::durability::{Durability, Observer};
use crate::entry::Entry;
use crate::lookup::{gather, LookupQuery, RamEntry};
use crate::plan::Plan;
use crate::shared::{Bank, CommitReport};
use crate::spill::Cause;
use crate::stats::{SessionInfo, Stats};
use crate::store::{Departure, Store};
use crate::sync::lock;
use crate::{BankConfig, BankError, Commit, SessionId};

/// Longest an admission waits for shed entries' spills to free their memory.
const SPILL_WAIT: Duration = Duration::from_secs(30);

impl Bank {
    /// An empty bank on the system clock, with no SSD tier.
    pub fn new(config: BankConfig) -> Bank {
        Bank {
            config,
            clock: Arc::new(SystemClock::new()),
            cold: None,
            store: Mutex::new(Store::default()),
            stats: Arc::new(Mutex::new(Stats::default())),
            done: Mutex::new(SpillsDone::default()),
            observer: None,
            ssd: None,
        }
    }

    /// The same bank telling `observer` what the SSD tier could not take.
    pub fn with_observer(mut self, observer: Observer) -> Bank {
        self.observer = Some(observer);
        self
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

    /// Keeps a committed state (a hybrid one with the checkpoints of the turn it continues,
    /// at most [`crate::MAX_CHECKPOINTS`]), replacing one with the same identity and tokens, then
    /// evicts within the budgets: expired entries, the session's oldest entries beyond its
    /// newest `max_entries_per_session`, then (in eviction order) the session's entries over
    /// its byte budget, and the bank's over its entry and byte budgets. Evicted entries are
    /// queued for the SSD tier's writer (write-behind: this never waits for a disk) and stay
    /// candidates until written; with `idle_write` zero the new entry is queued too.
    pub fn commit(&self, c: Commit) -> Result<CommitReport, BankError> {
        validate(&c)?;
        let mut store = lock(&self.store);
        let now = self.clock.now();
        let mut report = CommitReport::default();
        self.reap_locked(&mut store, now);
        self.expire_locked(&mut store, now, &mut report);
        let digest = c.identity.digest();
        let same: Vec<u64> = store
            .slots
            .values()
            .filter(|s| s.entry.digest == digest && s.entry.tokens == c.tokens)
            .map(|s| s.entry.id)
            .collect();
        // The same tokens under the same identity are the same state: one already on the
        // SSD tier needs no second write.
        let mut durability = Durability::Unwritten;
        for id in same {
            if let Some(slot) = store.remove(id, now, Departure::Dropped) {
                if matches!(slot.durability, Durability::Written) {
                    durability = Durability::Written;
                }
            }
            self.count_eviction("replaced");
        }
        // A hybrid turn inherits the checkpoints of the turn it continues (its tokens a
        // prefix of this one's), then keeps at most MAX_CHECKPOINTS.
        let checkpoints = c.checkpoints.map(|own| {
            let parent = store
                .slots
                .values()
                .filter(|s| {
                    s.entry.session == c.session
                        && s.entry.digest == digest
                        && c.tokens.starts_with(&s.entry.tokens)
                })
                .max_by_key(|s| s.entry.tokens.len())
                .and_then(|s| s.entry.checkpoints.clone());
            checkpoints::inherit(own, parent.as_deref())
        });
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
                checkpoints,
            }),
            now,
            durability,
        );
        self.enforce(&mut store, &session, now, &mut report);
        report.kept = store.slots.contains_key(&id);
        if report.kept && self.config.idle_write == Some(Duration::ZERO) {
            if let Some(Durability::Unwritten) = store.slots.get(&id).map(|s| &s.durability) {
                self.write(&mut store, id, now);
            }
        }
        Ok(report)
    }

    /// Finds the stored state that covers most of the prompt, from RAM entries (resident
    /// ones and evicted ones whose spill has not committed) and the SSD tier's manifest,
    /// without reading any tensor. The returned plan holds only the winner;
    /// [`Plan::restore`] builds the cache.
    pub fn lookup(&self, q: &LookupQuery<'_>) -> Plan {
        // RAM first, then the SSD manifest: an entry that leaves RAM between the two has
        // committed its spill before the manifest is asked, so nothing falls in between.
        let (ram, evicted) = {
            let mut store = lock(&self.store);
            let now = self.clock.now();
            self.reap_locked(&mut store, now);
            self.expire_locked(&mut store, now, &mut CommitReport::default());
            let evicted = q
                .session
                .is_some_and(|s| store.evicted.contains_key(s) && !store.sessions.contains_key(s));
            let resident = store.slots.values().map(|s| RamEntry {
                entry: s.entry.clone(),
                spill_queued: false,
            });
            let leaving = store.leaving.values().map(|l| RamEntry {
                entry: l.entry.clone(),
                spill_queued: true,
            });
            (resident.chain(leaving).collect::<Vec<_>>(), evicted)
        };
        let cold = match &self.cold {
            Some(c) => c.lookup(&ColdQuery {
                identity: q.identity,
                prompt: q.prompt,
                floor: q.floor,
            }),
            None => ColdLookup::miss(ColdMiss::CacheOff),
        };
        let g = gather(&ram, q, &self.config.matching, cold, evicted);
        drop(ram);
        let mut store = lock(&self.store);
        let now = self.clock.now();
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
    /// makes it fit. A shed entry's memory is free once its spill commits, so admission
    /// waits for those spills (30 s at most; then it refuses, `after_spills`). When even an
    /// empty bank would not make it fit, refuses without shedding anything: nothing
    /// committed is lost.
    pub fn admit(
        &self,
        estimate: &MemoryEstimate,
        protect: Option<&SessionId>,
    ) -> Result<Admitted, Refusal> {
        let mut store = lock(&self.store);
        let now = self.clock.now();
        self.reap_locked(&mut store, now);
        self.expire_locked(&mut store, now, &mut CommitReport::default());
        let limit = self.config.memory_limit_bytes;
        let before = store.held.bytes();
        let admitted = match decide(estimate, before, limit) {
            Decision::Fits { headroom } => Admitted {
                shed_entries: 0,
                shed_bytes: 0,
                headroom,
            },
            Decision::ShedTo(target) => {
                let mut shed = 0;
                let mut r = CommitReport::default();
                for id in store.victims(now, self.config.active_window, |_| true, protect) {
                    if store.total.bytes() <= target {
                        break;
                    }
                    shed += usize::from(self.evict(&mut store, id, Cause::Shed, now, &mut r));
                }
                store = self.wait_while(store, SPILL_WAIT, |s| {
                    s.held.bytes() > target && !s.leaving.is_empty()
                });
                let after = store.held.bytes();
                lock(&self.stats).shed_entries += shed as u64;
                if after > target {
                    lock(&self.stats).refused += 1;
                    return Err(spill_refusal(estimate, limit));
                }
                Admitted {
                    shed_entries: shed,
                    shed_bytes: before.saturating_sub(after),
                    headroom: target - after,
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
            .map(|(id, s)| {
                let entries: Vec<&Entry> = store
                    .slots
                    .values()
                    .map(|x| x.entry.as_ref())
                    .filter(|e| &e.session == id)
                    .collect();
                let longest = entries.iter().max_by_key(|e| e.tokens.len());
                let mut seen = std::collections::HashSet::new();
                SessionInfo {
                    id: id.clone(),
                    entries: s.entries,
                    bytes: s.footprint.bytes(),
                    longest_tokens: longest.map_or(0, |e| e.tokens.len()),
                    checkpoints: longest
                        .and_then(|e| e.checkpoint_positions())
                        .unwrap_or_default(),
                    checkpoint_bytes: entries.iter().map(|e| e.checkpoint_bytes(&mut seen)).sum(),
                    idle_for: now.saturating_sub(s.last_access),
                }
            })
            .collect();
        out.sort_by(|a, b| a.idle_for.cmp(&b.idle_for).then_with(|| a.id.cmp(&b.id)));
        out
    }

    /// Forgets every resident entry (no spill: clearing is asked for; spills already under
    /// way finish); returns how many.
    pub fn clear(&self) -> usize {
        let mut store = lock(&self.store);
        let now = self.clock.now();
        let ids: Vec<u64> = store.slots.keys().copied().collect();
        ids.iter().for_each(|&id| {
            store.remove(id, now, Departure::Dropped);
        });
        ids.len()
    }

    /// Forgets one session's resident entries (no spill); returns how many.
    pub fn clear_session(&self, session: &SessionId) -> usize {
        let mut store = lock(&self.store);
        let now = self.clock.now();
        let ids: Vec<u64> = store
            .slots
            .values()
            .filter(|s| &s.entry.session == session)
            .map(|s| s.entry.id)
            .collect();
        ids.iter().for_each(|&id| {
            store.remove(id, now, Departure::Dropped);
        });
        ids.len()
    }

    /// Counters and current holdings.
    pub fn stats(&self) -> Stats {
        let mut store = lock(&self.store);
        self.reap_locked(&mut store, self.clock.now());
        let mut s = lock(&self.stats).clone();
        s.bytes = store.held.bytes();
        s.resident_bytes = store.total.bytes();
        let mut seen = std::collections::HashSet::new();
        s.checkpoint_bytes = store
            .slots
            .values()
            .map(|x| x.entry.checkpoint_bytes(&mut seen))
            .sum();
        s.entries = store.slots.len();
        s.sessions = store.sessions.len();
        s.spilling = store.leaving.len();
        s.unwritten = store
            .slots
            .values()
            .filter(|x| !matches!(x.durability, Durability::Written))
            .count();
        s
    }

    /// Bytes the bank holds: its resident entries and the evicted ones whose spill has not
    /// committed, each shared buffer counted once.
    pub fn bytes(&self) -> u64 {
        lock(&self.store).held.bytes()
    }

    /// Whether a state with exactly these tokens is held under `identity`.
    pub fn contains(&self, identity: &Identity, tokens: &[u32]) -> bool {
        let digest = identity.digest();
        lock(&self.store)
            .slots
            .values()
            .any(|s| s.entry.digest == digest && s.entry.tokens == tokens)
    }

    /// Blocks until every write queued (evicted entries' spills, idle writes) is written or
    /// has failed, and returns the writes finished since the last call.
    pub fn wait_for_spills(&self) -> SpillsDone {
        let store = self.wait_while(lock(&self.store), Duration::MAX, |s| {
            s.writes_in_flight() > 0
        });
        drop(store);
        std::mem::take(&mut *lock(&self.done))
    }

    /// The session whose stored conversation the prompt continues: the entry under
    /// `identity` sharing the longest token prefix with `prompt`, when that prefix covers at
    /// least 90% of the entry (and 16 tokens) — a returning conversation re-renders its
    /// earlier turns, so only the last few tokens of the stored answer may differ. For
    /// clients that name no session.
    pub fn session_by_prefix(&self, identity: &Identity, prompt: &[u32]) -> Option<SessionId> {
        let digest = identity.digest();
        let store = lock(&self.store);
        let resident = store.slots.values().map(|s| &s.entry);
        resident
            .chain(store.leaving.values().map(|l| &l.entry))
            .filter(|e| e.digest == digest)
            .filter_map(|e| {
                let lcp = e
                    .tokens
                    .iter()
                    .zip(prompt)
                    .take_while(|(a, b)| a == b)
                    .count();
                (lcp >= 16 && lcp * 10 >= e.tokens.len() * 9).then(|| (lcp, e.session.clone()))
            })
            .max_by_key(|(lcp, _)| *lcp)
            .map(|(_, session)| session)
    }

    pub(crate) fn expire_locked(&self, store: &mut Store, now: Duration, r: &mut CommitReport) {
        let ttl = self.config.idle_ttl;
        let old: Vec<u64> = store
            .slots
            .values()
            .filter(|s| now.saturating_sub(s.last_access) > ttl)
            .map(|s| s.entry.id)
            .collect();
        for id in old {
            self.evict(store, id, Cause::Ttl, now, r);
        }
    }

    fn enforce(&self, store: &mut Store, session: &SessionId, now: Duration, r: &mut CommitReport) {
        let cfg = &self.config;
        let window = cfg.active_window;
        // Entries the SSD tier refused stay (while the bytes allow) and are not counted.
        let counted = |s: &crate::entry::Slot| !s.durability.failed();
        let ids = store.session_entries_oldest_first(session);
        let over = ids.len().saturating_sub(cfg.max_entries_per_session);
        for &id in &ids[..over] {
            self.evict(store, id, Cause::SessionEntries, now, r);
        }
        let session_bytes = |s: &Store| s.sessions.get(session).map_or(0, |x| x.footprint.bytes());
        if session_bytes(store) > cfg.max_session_bytes {
            let order = store.victims(now, window, |s| &s.entry.session == session, None);
            for id in order {
                if session_bytes(store) <= cfg.max_session_bytes {
                    break;
                }
                self.evict(store, id, Cause::SessionBytes, now, r);
            }
        }
        if store.counted_entries() > cfg.max_entries {
            for id in store.victims(now, window, counted, None) {
                if store.counted_entries() <= cfg.max_entries {
                    break;
                }
                self.evict(store, id, Cause::Entries, now, r);
            }
        }
        if store.total.bytes() > cfg.max_bytes {
            for id in store.victims(now, window, |_| true, None) {
                if store.total.bytes() <= cfg.max_bytes {
                    break;
                }
                self.evict(store, id, Cause::Bytes, now, r);
            }
        }
    }

    pub(crate) fn count_eviction(&self, cause: &'static str) {
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
