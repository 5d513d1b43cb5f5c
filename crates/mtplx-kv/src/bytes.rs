//! Identities of live buffers, so shared storage is counted once.

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
