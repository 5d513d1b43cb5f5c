//! Small helpers every layer may use: the time, random ids.

use std::hash::{BuildHasher, Hasher};
use std::time::{SystemTime, UNIX_EPOCH};

/// Unix seconds now.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// 24 random hex digits, for response ids and unseeded samplers.
pub fn random_hex() -> String {
    format!("{:016x}{:08x}", random_u64(), random_u64() as u32)
}

/// A random number from the standard library's per-process hash keys (not for secrets).
pub fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}
