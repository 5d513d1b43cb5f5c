//! The file operations the cold tier uses, behind a trait so tests can inject torn writes,
//! ENOSPC, EIO and crashes ([`FaultyStorage`]); [`FsStorage`] is the real one.
//!
//! Paths are relative to the store's root. Directories are `blobs/` and `tmp/` below it.

mod faulty;
mod fs;
mod traits;

pub use faulty::{CreateHold, Fault, FaultyStorage};
pub use fs::{drop_page_cache, FsStorage};
pub use traits::{Storage, StorageFile};
