//! The lock helper: a poisoned lock is taken, since every change to what the bank guards
//! completes before anything that could panic.

use std::sync::{Mutex, MutexGuard};

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
