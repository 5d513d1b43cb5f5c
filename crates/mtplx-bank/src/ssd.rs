//! The SSD tier a bank opens for itself ([`Bank::open`]): where it lives, how the bank may
//! use it, and what it reports ([`Bank::ssd_status`]). Callers name it here and never see
//! the cold tier's own types beyond these.

use std::path::PathBuf;
use std::sync::Arc;

use mtplx_cold::{
    ColdCandidate, ColdConfig, ColdIndex, ColdLookup, ColdQuery, ColdStore, KvSink, MissReason,
    ReadError, RestoreReport, Space, SpillEntry, SpillTicket, WriteError, WriteStats,
};

use crate::shared::{Bank, SsdAccess, SsdTier};
use crate::BankConfig;

/// Why the SSD tier could not be opened or read.
#[derive(Debug, thiserror::Error)]
pub enum SsdError {
    /// The tier could not be opened in its directory.
    #[error("SSD session cache at {}: {source}", dir.display())]
    Open {
        dir: PathBuf,
        source: mtplx_cold::OpenError,
    },
    /// Its manifest or the free disk space could not be read.
    #[error("reading the SSD tier's room: {0}")]
    Status(#[from] ReadError),
}

/// An SSD tier to open.
#[derive(Debug, Clone, PartialEq)]
pub struct SsdSetup {
    pub dir: PathBuf,
    pub config: ColdConfig,
    pub access: SsdAccess,
}

/// What the SSD tier holds and has written, read now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SsdStatus {
    pub dir: PathBuf,
    pub access: SsdAccess,
    /// Entries, bytes, free disk and the cap in force (it follows the free disk).
    pub space: Space,
    /// What the hourly write budget let through and skipped.
    pub writes: WriteStats,
    /// Bytes queued for the writer.
    pub backlog_bytes: u64,
}

impl Bank {
    /// A bank with `ssd` opened in its directory (reconciling what a crash left there), or
    /// with no SSD tier.
    pub fn open(config: BankConfig, ssd: Option<SsdSetup>) -> Result<Bank, SsdError> {
        let bank = Bank::new(config);
        let Some(setup) = ssd else {
            return Ok(bank);
        };
        let store = ColdStore::open_dir(&setup.dir, setup.config.clone()).map_err(|source| {
            SsdError::Open {
                dir: setup.dir.clone(),
                source,
            }
        })?;
        let store = Arc::new(store);
        let index: Arc<dyn ColdIndex> = match setup.access {
            SsdAccess::ReadWrite => store.clone(),
            SsdAccess::WriteOnly => Arc::new(WriteOnly(store.clone())),
        };
        let mut bank = bank.with_cold(index);
        bank.ssd = Some(SsdTier {
            dir: setup.dir,
            access: setup.access,
            store,
        });
        Ok(bank)
    }

    /// The SSD tier's status, `None` when the bank opened none.
    pub fn ssd_status(&self) -> Option<Result<SsdStatus, SsdError>> {
        let tier = self.ssd.as_ref()?;
        Some(
            tier.store
                .space()
                .map(|space| SsdStatus {
                    dir: tier.dir.clone(),
                    access: tier.access,
                    space,
                    writes: tier.store.write_stats(),
                    backlog_bytes: tier.store.backlog_bytes(),
                })
                .map_err(SsdError::Status),
        )
    }
}

/// [`SsdAccess::WriteOnly`]: spills go through, lookups miss.
struct WriteOnly(Arc<ColdStore>);

impl ColdIndex for WriteOnly {
    fn lookup(&self, _: &ColdQuery<'_>) -> ColdLookup {
        ColdLookup::miss(MissReason::CacheOff)
    }

    fn restore(
        &self,
        candidate: &ColdCandidate,
        sink: &mut dyn KvSink,
    ) -> Result<RestoreReport, ReadError> {
        self.0.restore(candidate, sink)
    }

    fn spill(&self, entry: SpillEntry) -> Result<SpillTicket, WriteError> {
        self.0.spill(entry)
    }

    fn check_room(&self, entry: &SpillEntry) -> Result<(), WriteError> {
        self.0.check_room(entry)
    }
}
