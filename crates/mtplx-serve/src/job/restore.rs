//! [`RestoreOutcome`]: what the restore stage found for a job.

use mtplx_bank::{Explanation, RestoreReport};
use mtplx_kv::Sequence;

/// What the cache path did for a job, for the engine, the request log and the metrics.
pub struct RestoreOutcome {
    /// The restored sequence (holding a prefix of the prompt), `None` to start empty.
    pub sequence: Option<Sequence>,
    /// The bank's account: restore mode, source, miss reason, refused candidates, …
    pub explanation: Explanation,
    /// Seconds spent finding and building the restored cache.
    pub restore_s: f64,
    /// What the SSD tier read and where its time went, for an SSD restore.
    pub ssd: Option<RestoreReport>,
}

impl std::fmt::Debug for RestoreOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestoreOutcome")
            .field("cached", &self.sequence.as_ref().map(Sequence::len))
            .field("mode", &self.explanation.mode)
            .field("miss", &self.explanation.miss)
            .finish_non_exhaustive()
    }
}
