//! Why a lookup restored what it did: the names the request log and metrics use.

use std::fmt;

use mtplx_cold::MissReason as ColdMiss;

/// How a request's cache was built; `Display` gives the original's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RestoreMode {
    /// Nothing reused: the whole prompt is prefilled.
    Cold,
    /// A RAM entry that is a prefix of the prompt.
    Clone,
    /// A RAM entry that extends the prompt by a few tokens.
    NearPrefixClone,
    /// A RAM entry sharing the prompt's first blocks.
    BlockPrefixBoundaryClone,
    /// An SSD entry that is a prefix of the prompt.
    SsdClone,
    /// An SSD entry sharing the prompt's first blocks.
    SsdBlockPrefixBoundaryClone,
}

impl RestoreMode {
    /// The name in the request log (`session_restore_mode`).
    pub fn as_str(self) -> &'static str {
        match self {
            RestoreMode::Cold => "cold",
            RestoreMode::Clone => "clone",
            RestoreMode::NearPrefixClone => "near_prefix_clone",
            RestoreMode::BlockPrefixBoundaryClone => "block_prefix_boundary_clone",
            RestoreMode::SsdClone => "ssd_clone",
            RestoreMode::SsdBlockPrefixBoundaryClone => "ssd_block_prefix_boundary_clone",
        }
    }

    /// Where the state came from.
    pub fn source(self) -> Source {
        match self {
            RestoreMode::Cold => Source::None,
            RestoreMode::Clone
            | RestoreMode::NearPrefixClone
            | RestoreMode::BlockPrefixBoundaryClone => Source::Ram,
            RestoreMode::SsdClone | RestoreMode::SsdBlockPrefixBoundaryClone => Source::Ssd,
        }
    }
}

impl fmt::Display for RestoreMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which tier a candidate or a restore came from (`cache_source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    Ram,
    Ssd,
    None,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Ram => "ram",
            Source::Ssd => "ssd",
            Source::None => "none",
        }
    }
}

/// Why a candidate was not served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RefusalReason {
    /// Valid, but another candidate covers more of the prompt (or ties and ranks first).
    LowerCoverage,
    /// A block match shorter than the minimum.
    BelowMinMatch,
    /// A hybrid entry with no recurrent checkpoint at or below the match.
    NoSnapshotCoverage,
    /// A RAM hybrid entry whose newest checkpoint at or below the match lies below the
    /// caller's floor (the SSD tier's is `Ssd(BoundaryBelowFloor)`).
    PrefixBoundaryBelowFloor,
    /// The match would leave no prompt token to prefill and the entry has no continuation
    /// there, and no earlier restore point exists.
    NothingToPrefill,
    /// The SSD tier refused it, or its restore failed.
    Ssd(ColdMiss),
}

impl fmt::Display for RefusalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RefusalReason::LowerCoverage => f.write_str("lower_coverage"),
            RefusalReason::BelowMinMatch => f.write_str("below_min_match"),
            RefusalReason::NoSnapshotCoverage => f.write_str("no_snapshot_coverage"),
            RefusalReason::PrefixBoundaryBelowFloor => f.write_str("prefix_boundary_below_floor"),
            RefusalReason::NothingToPrefill => f.write_str("nothing_to_prefill"),
            RefusalReason::Ssd(m) => m.fmt(f),
        }
    }
}

/// A candidate that was considered and not served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The mode it would have restored with.
    pub mode: RestoreMode,
    /// Prompt tokens it matches (unknown when the SSD tier refused it from its manifest).
    pub covered: Option<usize>,
    /// Tokens it would have restored.
    pub restore_point: Option<usize>,
    pub reason: RefusalReason,
}

/// Why nothing was reused; `name()` gives the original's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MissReason {
    /// Nothing stored shares a token with the prompt.
    NewSession,
    /// Stored entries under this identity share only the first `n` tokens (too few to
    /// reuse): the conversation's history changed at token `n`.
    PrefixDivergenceAtToken(usize),
    /// A matching state exists under another model.
    ModelMismatch,
    /// A matching state exists under another chat template.
    TemplateMismatch,
    /// A matching state exists under another MTP setting or policy.
    PolicyMismatch,
    /// A matching state exists with K/V rows of another element type (`--kv-dtype`).
    KvFormatMismatch,
    /// The session's entries were evicted (and no tier could serve it).
    Evicted,
    /// A hybrid match has no recurrent checkpoint at or below it.
    NoSnapshotCoverage,
    /// A RAM hybrid match's restore point lies below the caller's floor.
    PrefixBoundaryBelowFloor,
    /// What the SSD tier said (`ssd_*`).
    Ssd(ColdMiss),
    /// The chosen state could not be built into the caller's cache (its shape differs:
    /// a bug, not bad input); the prompt is computed cold (`restore_error`).
    RestoreFailed,
}

impl MissReason {
    /// The name in the request log (`cache_miss_reason`); the divergence token is a
    /// separate field.
    pub fn name(&self) -> String {
        match self {
            MissReason::NewSession => "new_session".into(),
            MissReason::PrefixDivergenceAtToken(_) => "prefix_divergence_at_token".into(),
            MissReason::ModelMismatch => "model_mismatch".into(),
            MissReason::TemplateMismatch => "template_mismatch".into(),
            MissReason::PolicyMismatch => "policy_mismatch".into(),
            MissReason::KvFormatMismatch => "kv_format_mismatch".into(),
            MissReason::Evicted => "evicted".into(),
            MissReason::NoSnapshotCoverage => "no_snapshot_coverage".into(),
            MissReason::PrefixBoundaryBelowFloor => "prefix_boundary_below_floor".into(),
            MissReason::Ssd(m) => m.to_string(),
            MissReason::RestoreFailed => "restore_error".into(),
        }
    }

    /// The token where the history diverged, for [`MissReason::PrefixDivergenceAtToken`].
    pub fn divergence_token(&self) -> Option<usize> {
        match self {
            MissReason::PrefixDivergenceAtToken(n) => Some(*n),
            _ => None,
        }
    }
}

impl fmt::Display for MissReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The account of one lookup (and its restore): what was served, what was refused and why,
/// and for a miss one reason. Plain data; [`Explanation::log_fields`] flattens it for the
/// request log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    pub mode: RestoreMode,
    pub prompt_tokens: usize,
    /// Prompt tokens the served state matched.
    pub covered_tokens: usize,
    /// Prompt tokens restored (not prefilled): the served state's restore point.
    pub cached_tokens: usize,
    /// Length of the served entry.
    pub entry_tokens: Option<usize>,
    /// Whether the restore hands back a continuation instead of leaving a token to prefill.
    pub continuation: bool,
    /// Whether the served RAM entry had been evicted and was on its way to the SSD tier
    /// (its rows were still in memory): `ram_entry_state: spill_queued` in the log.
    pub spill_queued: bool,
    /// Every candidate considered and not served.
    pub refused: Vec<Refused>,
    /// Set exactly when nothing was served.
    pub miss: Option<MissReason>,
    /// What the SSD tier answered when it offered no candidate (`ssd_cache_off`, …).
    pub ssd: Option<ColdMiss>,
}

/// A value of a request-log field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogValue {
    Str(String),
    Num(u64),
}

impl Explanation {
    /// The account of a prompt of `prompt_tokens` computed cold, for `miss` (or for no
    /// lookup at all).
    pub fn cold(prompt_tokens: usize, miss: Option<MissReason>) -> Explanation {
        Explanation {
            mode: RestoreMode::Cold,
            prompt_tokens,
            covered_tokens: 0,
            cached_tokens: 0,
            entry_tokens: None,
            continuation: false,
            spill_queued: false,
            refused: Vec::new(),
            miss,
            ssd: None,
        }
    }

    /// Where the served state came from.
    pub fn source(&self) -> Source {
        self.mode.source()
    }

    /// The request-log fields: `session_restore_mode`, `cache_source`, `cached_tokens`,
    /// `ssd_cached_tokens`, `entry_prefix_len`, `ram_entry_state`, `cache_miss_reason`,
    /// `prefix_divergence_token`, `refused_candidates` (`mode:reason` joined by `,`).
    pub fn log_fields(&self) -> Vec<(&'static str, LogValue)> {
        let mut out = vec![
            ("session_restore_mode", LogValue::Str(self.mode.to_string())),
            ("cache_source", LogValue::Str(self.source().as_str().into())),
            ("cached_tokens", LogValue::Num(self.cached_tokens as u64)),
        ];
        if self.source() == Source::Ssd {
            out.push((
                "ssd_cached_tokens",
                LogValue::Num(self.cached_tokens as u64),
            ));
        }
        if let Some(n) = self.entry_tokens {
            out.push(("entry_prefix_len", LogValue::Num(n as u64)));
        }
        if self.spill_queued {
            out.push(("ram_entry_state", LogValue::Str("spill_queued".into())));
        }
        if let Some(m) = &self.miss {
            out.push(("cache_miss_reason", LogValue::Str(m.name())));
            if let Some(t) = m.divergence_token() {
                out.push(("prefix_divergence_token", LogValue::Num(t as u64)));
            }
        }
        if !self.refused.is_empty() {
            let list: Vec<String> = self
                .refused
                .iter()
                .map(|r| format!("{}:{}", r.mode, r.reason))
                .collect();
            out.push(("refused_candidates", LogValue::Str(list.join(","))));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_originals() {
        let modes = [
            RestoreMode::Cold,
            RestoreMode::Clone,
            RestoreMode::SsdClone,
            RestoreMode::NearPrefixClone,
            RestoreMode::BlockPrefixBoundaryClone,
            RestoreMode::SsdBlockPrefixBoundaryClone,
        ];
        let names: Vec<&str> = modes.iter().map(|m| m.as_str()).collect();
        assert_eq!(
            names,
            [
                "cold",
                "clone",
                "ssd_clone",
                "near_prefix_clone",
                "block_prefix_boundary_clone",
                "ssd_block_prefix_boundary_clone"
            ]
        );
        assert_eq!(
            MissReason::Ssd(ColdMiss::BoundaryBelowFloor).name(),
            "ssd_prefix_boundary_below_floor"
        );
        assert_eq!(
            RefusalReason::Ssd(ColdMiss::BoundaryBelowFloor).to_string(),
            "ssd_prefix_boundary_below_floor"
        );
        assert_eq!(
            MissReason::PrefixDivergenceAtToken(7).name(),
            "prefix_divergence_at_token"
        );
    }

    #[test]
    fn log_fields_carry_the_miss_and_its_token() {
        let e = Explanation {
            mode: RestoreMode::Cold,
            prompt_tokens: 10,
            covered_tokens: 0,
            cached_tokens: 0,
            entry_tokens: None,
            continuation: false,
            spill_queued: false,
            refused: vec![Refused {
                mode: RestoreMode::SsdClone,
                covered: None,
                restore_point: None,
                reason: RefusalReason::Ssd(ColdMiss::PayloadMissing),
            }],
            miss: Some(MissReason::PrefixDivergenceAtToken(42)),
            ssd: None,
        };
        let f = e.log_fields();
        assert!(f.contains(&(
            "cache_miss_reason",
            LogValue::Str("prefix_divergence_at_token".into())
        )));
        assert!(f.contains(&("prefix_divergence_token", LogValue::Num(42))));
        assert!(f.contains(&(
            "refused_candidates",
            LogValue::Str("ssd_clone:ssd_payload_missing".into())
        )));
        assert!(f.contains(&("cache_source", LogValue::Str("none".into()))));
    }
}
