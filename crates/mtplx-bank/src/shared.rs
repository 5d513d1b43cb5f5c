//! [`Bank`]'s fields and [`CommitReport`]: the struct every part of the bank works on
//! (its methods live with their jobs: `bank.rs` the API, `spill.rs` the SSD tier).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use mtplx_cold::{ColdIndex, ColdStore};

use crate::clock::Clock;
use crate::config::BankConfig;
use crate::durability::{Observer, SpillsDone};
use crate::stats::Stats;
use crate::store::Store;

/// The RAM session bank: committed conversation states, the lookup that picks the state
/// covering most of a prompt (RAM or SSD), eviction within budgets (spilling to the SSD
/// tier), writes behind of idle conversations ([`Bank::tick`]), the flush of a stopping
/// server ([`Bank::flush`]), and admission. Every method takes `&self`; share it behind an
/// `Arc`.
pub struct Bank {
    pub(crate) config: BankConfig,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) cold: Option<Arc<dyn ColdIndex>>,
    pub(crate) store: Mutex<Store>,
    pub(crate) stats: Arc<Mutex<Stats>>,
    /// Spills finished since [`Bank::wait_for_spills`] last returned them.
    pub(crate) done: Mutex<SpillsDone>,
    pub(crate) observer: Option<Observer>,
    /// The SSD tier the bank opened itself ([`Bank::open`]), for its reports.
    pub(crate) ssd: Option<SsdTier>,
}

/// What a commit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommitReport {
    /// Whether the committed state is in the bank afterwards (a state over the session's or
    /// the bank's byte budget on its own is spilled straight away).
    pub kept: bool,
    /// Entries evicted to make room (or expired), the new one included if not kept.
    pub evicted: usize,
    /// Of those, entries handed to the SSD tier's writer.
    pub spilled: usize,
}

/// How the bank uses its SSD tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SsdAccess {
    /// Evicted and idle states are written, and returning conversations restore from it.
    ReadWrite,
    /// Written, never restored from (to warm a cache, or to compare).
    WriteOnly,
}

/// The opened tier, as the bank keeps it for its reports.
pub(crate) struct SsdTier {
    pub(crate) dir: PathBuf,
    pub(crate) access: SsdAccess,
    pub(crate) store: Arc<ColdStore>,
}
