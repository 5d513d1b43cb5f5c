//! [`EntryId`]: a stored entry's id in the manifest.

/// A stored entry's id in the manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryId(pub u64);
