//! [`Reservation`]: memory held for an admitted request until its job is dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Memory held for an admitted request; released when the job is dropped.
#[derive(Debug)]
pub struct Reservation {
    total: Arc<AtomicU64>,
    bytes: u64,
}

impl Reservation {
    /// Adds `bytes` to `total` until the reservation is dropped.
    pub fn new(total: Arc<AtomicU64>, bytes: u64) -> Reservation {
        total.fetch_add(bytes, Ordering::Relaxed);
        Reservation { total, bytes }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.total.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}
