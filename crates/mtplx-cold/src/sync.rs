//! Locks that survive a panic in another thread: the data they guard stays consistent
//! (every writer finishes its change before it can panic), so a poisoned lock is taken.

use std::sync::{Mutex, MutexGuard};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
