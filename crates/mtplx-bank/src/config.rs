//! Budgets and matching thresholds.

use std::time::Duration;

const GIB: u64 = 1 << 30;

/// How long a session is idle before its newest entry is written to the SSD tier.
pub const DEFAULT_IDLE_WRITE: Duration = Duration::from_secs(3);

/// How much the bank may hold, how it matches prompts, and the memory limit admission
/// checks against. [`BankConfig::for_machine`] sizes it from the machine's RAM; the server
/// maps its `--session-bank-*` flags (and `MTPLX_*` variables) onto these fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BankConfig {
    /// Most bytes all entries hold together (shared buffers counted once).
    pub max_bytes: u64,
    /// Most bytes one session's entries hold together.
    pub max_session_bytes: u64,
    /// Most entries in the bank.
    pub max_entries: usize,
    /// Most entries one session keeps: its newest ones.
    pub max_entries_per_session: usize,
    /// An entry not used for this long is evicted (spilled).
    pub idle_ttl: Duration,
    /// An entry whose session has not been used for this long is written behind to the
    /// SSD tier by [`crate::Bank::tick`], so a crash loses no conversation that was idle
    /// this long; zero writes every turn at its commit; `None` writes only on eviction.
    pub idle_write: Option<Duration>,
    /// A session used within this window is active: its entries are evicted after every
    /// idle session's.
    pub active_window: Duration,
    /// Peak memory admission allows: weights, the bank, requests in flight and the new
    /// request together.
    pub memory_limit_bytes: u64,
    /// Matching thresholds.
    pub matching: Matching,
}

/// When a stored entry that is not an exact prefix of the prompt may still serve it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Matching {
    /// Near prefix: the entry extends the prompt by at most this many tokens.
    pub near_max_extension: usize,
    /// Near prefix: the prompt (the match) is at least this long.
    pub near_min_match: usize,
    /// Block prefix: the common prefix is cut down to a multiple of this.
    pub block_tokens: usize,
    /// Block prefix: the cut match is at least this long (RAM and SSD alike).
    pub block_min_match: usize,
}

impl Default for Matching {
    /// The original's thresholds: ≤ 8 extra tokens with a match ≥ 64; 256-token blocks with
    /// a match ≥ 512.
    fn default() -> Self {
        Matching {
            near_max_extension: 8,
            near_min_match: 64,
            block_tokens: 256,
            block_min_match: 512,
        }
    }
}

impl BankConfig {
    /// Defaults for a machine with `total_ram_bytes` of memory: the original's limits
    /// (24 GiB, 8 GiB per session, 24 entries, newest 3 per session, 1 h TTL, 600 s active
    /// window), idle sessions written to the SSD tier after 3 s, with the bank capped at a quarter of RAM and a session at a third of the
    /// bank; admission allows 85% of RAM (the rest is the system's).
    pub fn for_machine(total_ram_bytes: u64) -> BankConfig {
        let max_bytes = (24 * GIB).min(total_ram_bytes / 4);
        BankConfig {
            max_bytes,
            max_session_bytes: (8 * GIB).min(max_bytes / 3),
            max_entries: 24,
            max_entries_per_session: 3,
            idle_ttl: Duration::from_secs(3600),
            idle_write: Some(DEFAULT_IDLE_WRITE),
            active_window: Duration::from_secs(600),
            memory_limit_bytes: total_ram_bytes / 100 * 85,
            matching: Matching::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_machines_get_the_originals_limits() {
        let c = BankConfig::for_machine(128 * GIB);
        assert_eq!(c.max_bytes, 24 * GIB);
        assert_eq!(c.max_session_bytes, 8 * GIB);
        assert_eq!((c.max_entries, c.max_entries_per_session), (24, 3));
        assert_eq!(c.idle_ttl, Duration::from_secs(3600));
        assert!(c.memory_limit_bytes > 100 * GIB && c.memory_limit_bytes < 128 * GIB);
    }

    #[test]
    fn small_machines_keep_the_bank_to_a_quarter_of_ram() {
        let c = BankConfig::for_machine(16 * GIB);
        assert_eq!(c.max_bytes, 4 * GIB);
        assert!(c.max_session_bytes <= c.max_bytes);
        assert!(c.max_session_bytes >= GIB);
        assert!(c.memory_limit_bytes < 16 * GIB);
    }
}
