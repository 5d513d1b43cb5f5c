//! [`Usage`] and [`Space`]: what the store holds, and its room on its disk.

use crate::error::WriteError;

/// How much the store holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub entries: u64,
    /// Bytes of live blob files.
    pub used_bytes: u64,
}

/// The store's room on its disk, read now ([`crate::ColdStore::space`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    pub usage: Usage,
    /// Bytes free on the file system.
    pub free_bytes: u64,
    /// The configured cap ([`crate::ColdConfig::cap_bytes`]).
    pub configured_cap_bytes: u64,
    /// The cap in force: the configured one or a quarter of the disk the store may use
    /// (free plus its own), whichever is smaller. It falls as the disk fills.
    pub cap_bytes: u64,
    /// No write starts below this much free disk.
    pub free_disk_floor: u64,
}

impl Space {
    /// Whether a write of `bytes` would start: free disk above the floor and `bytes`
    /// within the cap in force.
    pub fn admits(&self, bytes: u64) -> Result<(), WriteError> {
        if self.free_bytes < self.free_disk_floor {
            return Err(WriteError::BelowFreeDiskFloor {
                free: self.free_bytes,
                floor: self.free_disk_floor,
            });
        }
        if bytes > self.cap_bytes {
            return Err(WriteError::TooLarge {
                bytes,
                cap: self.cap_bytes,
            });
        }
        Ok(())
    }
}
