//! Identities of live buffers, so shared storage is counted once.

use std::collections::HashMap;

use crate::KvView;

/// The identity of one live buffer (its address while it lives): two views that share a
/// block or segment report the same id for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferId(usize);

impl BufferId {
    /// The id of whatever `value` points at.
    pub fn of<T: ?Sized>(value: &T) -> Self {
        BufferId(value as *const T as *const () as usize)
    }
}

/// Bytes held by `views` together, each shared buffer counted once: the memory that dropping
/// all of them would free (if nothing else references those buffers).
pub fn footprint(views: &[&dyn KvView]) -> usize {
    let mut seen = HashMap::new();
    for view in views {
        view.visit_buffers(&mut |id, bytes| {
            seen.insert(id, bytes);
        });
    }
    seen.values().sum()
}
