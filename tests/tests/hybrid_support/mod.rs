//! Shared by the hybrid bank tests and the hybrid restore bench: a bank that keeps
//! everything it is given (up to `max_entries`), an SSD tier with no disk floor, an
//! identity for the synthetic model, and reproducible token streams.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use mtplx_bank::{BankConfig, Matching};
use mtplx_cold::{ColdConfig, ColdStore, Identity, Mtp, GIB};

/// The identity states of the synthetic model `name` are stored under.
pub fn identity(name: &str) -> Identity {
    Identity {
        model: name.into(),
        chat_template: "none".into(),
        mtp: Mtp::Off,
        policy: "default".into(),
        kv_dtype: mtplx_bank::cold_dtype(mtplx_kv::KvDtype::F32),
    }
}

/// Budgets no test reaches but `max_entries`; no expiry, no write-behind.
pub fn bank_config(max_entries: usize) -> BankConfig {
    BankConfig {
        max_bytes: 1 << 40,
        max_session_bytes: 1 << 40,
        max_entries,
        max_entries_per_session: 1000,
        idle_ttl: Duration::from_secs(1 << 30),
        idle_write: None,
        active_window: Duration::from_secs(600),
        memory_limit_bytes: 1 << 40,
        matching: Matching::default(),
    }
}

/// An SSD tier at `dir` that writes whatever the test's disk has room for.
pub fn cold_store(dir: &Path) -> Arc<ColdStore> {
    let config = ColdConfig {
        cap_bytes: 100 * GIB,
        free_disk_floor: 0,
        backlog_cap_bytes: GIB,
        ..ColdConfig::for_ram(128 * GIB)
    };
    Arc::new(ColdStore::open_dir(dir, config).expect("open the SSD tier"))
}

/// `n` tokens below `vocab` from a xorshift stream seeded by `seed`.
pub fn xorshift_tokens(n: usize, mut seed: u64, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % vocab as u64) as u32
        })
        .collect()
}
