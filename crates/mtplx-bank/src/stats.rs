//! Counters for `/metrics` and the admin views.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::explain::{Explanation, RestoreMode};
use crate::SessionId;

/// What the bank has done since it started, and what it holds now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes the bank holds: resident entries and evicted ones on their way to the SSD
    /// tier (shared buffers counted once).
    pub bytes: u64,
    /// Bytes of the resident entries alone (what the byte budgets bound).
    pub resident_bytes: u64,
    /// Of `resident_bytes`, those of hybrid entries' recurrent checkpoints (shared buffers
    /// once).
    pub checkpoint_bytes: u64,
    /// Resident entries.
    pub entries: usize,
    pub sessions: usize,
    /// Evicted entries whose spill has not committed yet (still candidates).
    pub spilling: usize,
    /// Resident entries not (yet) on the SSD tier.
    pub unwritten: usize,
    /// Restores by mode (`cold` included).
    pub restores: BTreeMap<RestoreMode, u64>,
    /// Misses by reason name.
    pub misses: BTreeMap<String, u64>,
    /// Prompt tokens served from a stored state.
    pub cached_tokens: u64,
    /// Evictions by the budget that caused them (`ttl`, `session_entries`,
    /// `session_bytes`, `entries`, `bytes`, `shed`, `replaced`).
    pub evictions: BTreeMap<&'static str, u64>,
    /// Writes handed to the SSD tier's writer: evictions, idle writes, flushes.
    pub spills_queued: u64,
    /// Of those, the ones committed.
    pub spills_written: u64,
    /// Of those, the ones that failed.
    pub spills_failed: u64,
    /// Writes the SSD tier refused before they were queued, or failed, by reason
    /// (`too_large`, `no_space`, `below_free_disk_floor`, …).
    pub spill_failures: BTreeMap<&'static str, u64>,
    /// Idle writes queued ([`crate::Bank::tick`]).
    pub idle_writes: u64,
    /// Entries dropped unwritten because memory had to be freed and the SSD tier could not
    /// take them: the conversations lost.
    pub entries_lost: u64,
    /// Chosen SSD candidates whose restore failed (served cold instead).
    pub ssd_restore_failures: u64,
    pub admitted: u64,
    pub refused: u64,
    /// Entries shed by admission.
    pub shed_entries: u64,
}

impl Stats {
    pub(crate) fn record(&mut self, e: &Explanation) {
        *self.restores.entry(e.mode).or_default() += 1;
        if let Some(m) = &e.miss {
            *self.misses.entry(m.name()).or_default() += 1;
        }
        self.cached_tokens += e.cached_tokens as u64;
    }

    /// Hits: restores that reused a stored state.
    pub fn hits(&self) -> u64 {
        self.restores
            .iter()
            .filter(|(m, _)| **m != RestoreMode::Cold)
            .map(|(_, n)| n)
            .sum()
    }
}

/// One session as the admin view lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    pub id: SessionId,
    pub entries: usize,
    /// Bytes its entries hold together.
    pub bytes: u64,
    /// Tokens of its longest entry.
    pub longest_tokens: usize,
    /// Positions of the recurrent checkpoints of its longest entry (empty for an
    /// attention-only model).
    pub checkpoints: Vec<usize>,
    /// Bytes the recurrent checkpoints of its entries hold (shared buffers once); they are
    /// part of `bytes`.
    pub checkpoint_bytes: u64,
    /// Time since it was last used, on the bank's clock.
    pub idle_for: Duration,
}
