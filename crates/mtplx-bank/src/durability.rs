//! Where an entry stands with the SSD tier: written or not, on its way, or refused. An
//! entry's state survives the bank's memory only once it is written; until then the bank
//! keeps it a candidate, counts its bytes, and says when it can't be written.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use mtplx_cold::{SpillTicket, WriteError};

use crate::SessionId;

/// How long an entry the SSD tier refused waits before it is tried again.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(30);

/// A resident entry's standing with the SSD tier.
#[derive(Debug)]
pub(crate) enum Durability {
    /// In RAM only.
    Unwritten,
    /// A write of it is queued or running (it stays an ordinary entry meanwhile).
    Writing(SpillTicket),
    /// Its state is committed to the SSD tier: it can leave RAM without a write.
    Written,
    /// The SSD tier did not take it: it stays while the byte budget allows, is tried again
    /// [`RETRY_AFTER`] after `at`, and does not count against the entry limits.
    Failed { failure: SpillFailure, at: Duration },
}

impl Durability {
    /// Whether a write of the entry may be tried at `now`.
    pub(crate) fn may_write(&self, now: Duration) -> bool {
        match self {
            Durability::Unwritten => true,
            Durability::Failed { at, .. } => now.saturating_sub(*at) >= RETRY_AFTER,
            Durability::Writing(_) | Durability::Written => false,
        }
    }

    pub(crate) fn failed(&self) -> bool {
        matches!(self, Durability::Failed { .. })
    }
}

/// Why the SSD tier did not take an entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpillFailure {
    /// A short name: the cold tier's [`WriteError::reason`] (`too_large`, `no_space`,
    /// `below_free_disk_floor`, `over_write_budget`, `io`, …).
    pub reason: &'static str,
    /// The error's own words.
    pub detail: String,
}

impl SpillFailure {
    pub(crate) fn of(e: &WriteError) -> SpillFailure {
        SpillFailure {
            reason: e.reason(),
            detail: e.to_string(),
        }
    }
}

impl fmt::Display for SpillFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.reason, self.detail)
    }
}

/// What became of an entry the SSD tier did not take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpillOutcome {
    /// It stays in RAM (tried again later).
    KeptInRam,
    /// Memory had to be freed and it could not be written: the state is gone.
    Dropped,
}

impl SpillOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            SpillOutcome::KeptInRam => "kept_in_ram",
            SpillOutcome::Dropped => "dropped",
        }
    }
}

/// Something the bank did with the SSD tier that an operator should hear of, handed to
/// the observer ([`crate::Bank::with_observer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BankEvent {
    /// The SSD tier could not take an entry: refused before it was queued (no room) or its
    /// write failed.
    SpillFailed {
        session: SessionId,
        tokens: usize,
        /// What the entry holds in memory.
        bytes: u64,
        failure: SpillFailure,
        outcome: SpillOutcome,
    },
}

/// Called with every [`BankEvent`], with the bank's lock held: it must not call the bank.
pub type Observer = Arc<dyn Fn(&BankEvent) + Send + Sync>;

/// Spills that finished since they were last asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpillsDone {
    pub written: usize,
    pub failed: usize,
}

/// What a flush ([`crate::Bank::flush`]) wrote and what it could not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlushReport {
    /// Resident entries already on the SSD tier when the flush started.
    pub already_written: usize,
    /// Entries written during the flush.
    pub written: usize,
    /// Entries the SSD tier could not take, with why.
    pub failed: Vec<(SessionId, usize, SpillFailure)>,
    /// Writes still running at the deadline (they may or may not land).
    pub pending: usize,
}
