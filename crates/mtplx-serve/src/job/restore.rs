//! [`RestoreOutcome`]: what the restore stage found for a job.

use mtplx_bank::LogValue;
use mtplx_kv::KvCache;

/// What the cache path did for a job, for the engine, the request log and the metrics.
#[derive(Default)]
pub struct RestoreOutcome {
    /// The restored cache (holding a prefix of the prompt), `None` to start empty.
    pub cache: Option<Box<dyn KvCache>>,
    /// `session_restore_mode`: `cold`, `clone`, `ssd_clone`, …
    pub mode: String,
    /// `cache_source`: `ram`, `ssd`, `none`.
    pub source: String,
    /// `cache_miss_reason`, for a miss or a failed restore.
    pub miss_reason: Option<String>,
    /// The rest of the explanation (`entry_prefix_len`, `refused_candidates`, …).
    pub fields: Vec<(&'static str, LogValue)>,
    pub restore_s: f64,
}

impl std::fmt::Debug for RestoreOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RestoreOutcome")
            .field("cached", &self.cache.as_ref().map(|c| c.len()))
            .field("mode", &self.mode)
            .field("miss_reason", &self.miss_reason)
            .finish_non_exhaustive()
    }
}
