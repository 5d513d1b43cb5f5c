//! [`MissReason`]: why the SSD tier has nothing to offer, with the names the original's
//! users know, and [`RestoreErrorKind`], the `<kind>` of `ssd_restore_error:<kind>`.

use std::fmt;

/// Why the cold tier has nothing to offer; `Display` gives the names the original's users
/// know (`ssd_prefix_miss`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MissReason {
    /// No cold tier configured.
    CacheOff,
    /// Nothing stored under this identity (or an empty prompt).
    EmptyLookup,
    /// Entries exist under this identity, none is a prefix of the prompt.
    PrefixMiss,
    /// The matching entry was written by another format version or geometry.
    FormatMismatch,
    /// The entry or one of its blobs is gone.
    PayloadMissing,
    /// Reading the entry failed.
    RestoreError(RestoreErrorKind),
    /// A hybrid entry matches, but its newest checkpoint at or below the match lies below
    /// the caller's floor.
    BoundaryBelowFloor,
    /// Nothing matches under this identity, but the prompt's exact prefix or one of its
    /// blocks is stored under the same identity with another K/V element type
    /// ([`crate::Identity::kv_dtype`]): the server's `--kv-dtype` changed.
    KvFormatMismatch,
}

impl MissReason {
    /// How informative a reason is, to report the better of two misses.
    pub(crate) fn rank(self) -> u8 {
        match self {
            MissReason::CacheOff => 0,
            MissReason::EmptyLookup => 1,
            MissReason::PrefixMiss => 2,
            MissReason::FormatMismatch => 3,
            MissReason::PayloadMissing => 4,
            MissReason::RestoreError(_) => 5,
            MissReason::BoundaryBelowFloor => 6,
            MissReason::KvFormatMismatch => 7,
        }
    }
}

impl fmt::Display for MissReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MissReason::CacheOff => f.write_str("ssd_cache_off"),
            MissReason::EmptyLookup => f.write_str("ssd_empty_lookup"),
            MissReason::PrefixMiss => f.write_str("ssd_prefix_miss"),
            MissReason::FormatMismatch => f.write_str("ssd_format_mismatch"),
            MissReason::PayloadMissing => f.write_str("ssd_payload_missing"),
            MissReason::RestoreError(kind) => write!(f, "ssd_restore_error:{}", kind.as_str()),
            MissReason::BoundaryBelowFloor => f.write_str("ssd_prefix_boundary_below_floor"),
            MissReason::KvFormatMismatch => f.write_str("ssd_kv_format_mismatch"),
        }
    }
}

/// The `<kind>` of an `ssd_restore_error:<kind>` miss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RestoreErrorKind {
    Identity,
    NotRestorable,
    Truncated,
    Foreign,
    Checksum,
    Header,
    /// A block's header names another K/V element type than its entry (or one this build
    /// does not know).
    KvDtype,
    Decode,
    Io,
    Manifest,
    Sink,
}

impl RestoreErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RestoreErrorKind::Identity => "identity",
            RestoreErrorKind::NotRestorable => "not_restorable",
            RestoreErrorKind::Truncated => "truncated",
            RestoreErrorKind::Foreign => "foreign",
            RestoreErrorKind::Checksum => "checksum",
            RestoreErrorKind::Header => "header",
            RestoreErrorKind::KvDtype => "kv_dtype",
            RestoreErrorKind::Decode => "decode",
            RestoreErrorKind::Io => "io",
            RestoreErrorKind::Manifest => "manifest",
            RestoreErrorKind::Sink => "sink",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn miss_names_are_the_originals() {
        let names: Vec<String> = [
            MissReason::CacheOff,
            MissReason::EmptyLookup,
            MissReason::PrefixMiss,
            MissReason::FormatMismatch,
            MissReason::PayloadMissing,
            MissReason::RestoreError(RestoreErrorKind::Checksum),
            MissReason::BoundaryBelowFloor,
            MissReason::KvFormatMismatch,
            MissReason::RestoreError(RestoreErrorKind::KvDtype),
        ]
        .iter()
        .map(|r| r.to_string())
        .collect();
        assert_eq!(
            names,
            [
                "ssd_cache_off",
                "ssd_empty_lookup",
                "ssd_prefix_miss",
                "ssd_format_mismatch",
                "ssd_payload_missing",
                "ssd_restore_error:checksum",
                "ssd_prefix_boundary_below_floor",
                "ssd_kv_format_mismatch",
                "ssd_restore_error:kv_dtype",
            ]
        );
    }

    #[test]
    fn codes_are_kept_and_the_new_reason_takes_the_next() {
        let ranks: Vec<u8> = [
            MissReason::CacheOff,
            MissReason::EmptyLookup,
            MissReason::PrefixMiss,
            MissReason::FormatMismatch,
            MissReason::PayloadMissing,
            MissReason::RestoreError(RestoreErrorKind::Io),
            MissReason::BoundaryBelowFloor,
            MissReason::KvFormatMismatch,
        ]
        .iter()
        .map(|r| r.rank())
        .collect();
        assert_eq!(ranks, [0, 1, 2, 3, 4, 5, 6, 7]);
    }
}
