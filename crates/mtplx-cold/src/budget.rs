//! How much disk the cold tier may use.

/// Settings of a cold store. [`ColdConfig::detect`] sizes them from the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColdConfig {
    /// Most bytes of blobs kept; the effective cap at a write is
    /// `min(cap_bytes, (free disk + bytes already used) / 4)`.
    pub cap_bytes: u64,
    /// No write starts while the disk has less free space than this.
    pub free_disk_floor: u64,
    /// Most bytes of spills queued for the background writer.
    pub backlog_cap_bytes: u64,
    /// Most bytes of new blobs written in any sliding hour, to spare the SSD's endurance;
    /// a write over it is skipped (`WriteError::OverWriteBudget`) and counted. `u64::MAX`:
    /// no budget.
    pub write_budget_per_hour: u64,
}

pub const GIB: u64 = 1 << 30;

/// 8 GiB an hour: around the clock, 70 TiB a year, a fifth of a 600 TBW consumer drive's
/// rated endurance over five years at the very worst; real use writes far less.
pub const DEFAULT_WRITE_BUDGET_PER_HOUR: u64 = 8 * GIB;

/// The original's cap by RAM size: ≤ 16 GiB → 16 GiB, ≤ 32 → 24, ≤ 64 → 32, else 100.
pub fn default_cap(ram_bytes: u64) -> u64 {
    match ram_bytes.div_ceil(GIB) {
        0..=16 => 16 * GIB,
        17..=32 => 24 * GIB,
        33..=64 => 32 * GIB,
        _ => 100 * GIB,
    }
}

/// Physical memory, from `sysconf`.
pub fn physical_ram() -> Option<u64> {
    // SAFETY: sysconf reads process-independent constants.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages > 0 && page > 0).then(|| pages as u64 * page as u64)
}

impl ColdConfig {
    pub fn for_ram(ram_bytes: u64) -> ColdConfig {
        ColdConfig {
            cap_bytes: default_cap(ram_bytes),
            free_disk_floor: 10 * GIB,
            backlog_cap_bytes: 4 * GIB,
            write_budget_per_hour: DEFAULT_WRITE_BUDGET_PER_HOUR,
        }
    }

    /// Defaults for this machine (16 GiB of RAM assumed when it can't be read).
    pub fn detect() -> ColdConfig {
        ColdConfig::for_ram(physical_ram().unwrap_or(16 * GIB))
    }

    /// The cap in force when the disk has `free` bytes free and the store uses `used`.
    pub fn effective_cap(&self, free: u64, used: u64) -> u64 {
        self.cap_bytes.min(free.saturating_add(used) / 4)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_follows_the_originals_ram_steps() {
        assert_eq!(default_cap(8 * GIB), 16 * GIB);
        assert_eq!(default_cap(16 * GIB), 16 * GIB);
        assert_eq!(default_cap(24 * GIB), 24 * GIB);
        assert_eq!(default_cap(32 * GIB), 24 * GIB);
        assert_eq!(default_cap(64 * GIB), 32 * GIB);
        assert_eq!(default_cap(128 * GIB), 100 * GIB);
    }

    #[test]
    fn effective_cap_is_a_quarter_of_free_disk_at_most() {
        let c = ColdConfig::for_ram(128 * GIB);
        assert_eq!(c.effective_cap(1000 * GIB, 0), 100 * GIB);
        assert_eq!(c.effective_cap(40 * GIB, 0), 10 * GIB);
        // Bytes the store already holds count as available to it.
        assert_eq!(c.effective_cap(36 * GIB, 4 * GIB), 10 * GIB);
    }
}
