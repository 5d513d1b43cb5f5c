//! A candidate state for a prompt: a handle to what a restore would read, plus how much
//! of the prompt it serves.

use std::sync::{Arc, Weak};

use mtplx_cold::ColdCandidate;

use crate::entry::Entry;
use crate::explain::RestoreMode;
use crate::matching::Point;

/// What a restore of a candidate reads.
pub(crate) enum Handle {
    /// A RAM entry (kept alive by this handle, even if the bank evicts it meanwhile).
    Ram(Arc<Entry>),
    /// An SSD entry, described by the manifest (nothing read yet).
    Ssd(ColdCandidate),
}

/// A candidate that can serve the prompt.
pub(crate) struct Candidate {
    pub(crate) mode: RestoreMode,
    /// Prompt tokens it matches.
    pub(crate) covered: usize,
    pub(crate) point: Point,
    pub(crate) entry_tokens: usize,
    /// A RAM entry evicted to the SSD tier, its spill not yet committed.
    pub(crate) spill_queued: bool,
    pub(crate) handle: Handle,
}

impl Candidate {
    /// The ranking: most prompt tokens restored, then RAM before SSD, then exact before
    /// near before block, then the newest RAM entry.
    pub(crate) fn rank(&self) -> (usize, bool, u8, u64) {
        let kind = match self.mode {
            RestoreMode::Clone | RestoreMode::SsdClone => 2,
            RestoreMode::NearPrefixClone => 1,
            _ => 0,
        };
        let (ram, id) = match &self.handle {
            Handle::Ram(e) => (true, e.id),
            Handle::Ssd(_) => (false, 0),
        };
        (self.point.at, ram, kind, id)
    }
}

/// Weak references to every candidate a lookup found valid (served or not): how tests
/// and diagnostics check that a plan holds only what it serves, and nothing once restored.
#[derive(Clone, Default)]
pub struct CandidateWatch(pub(crate) Vec<Weak<Candidate>>);

impl CandidateWatch {
    /// Candidates the lookup found valid.
    pub fn considered(&self) -> usize {
        self.0.len()
    }

    /// Candidates still held by anyone.
    pub fn alive(&self) -> usize {
        self.0.iter().filter(|w| w.upgrade().is_some()).count()
    }
}

impl std::fmt::Debug for CandidateWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CandidateWatch")
            .field("considered", &self.considered())
            .field("alive", &self.alive())
            .finish()
    }
}
