//! A stored entry and the byte accounting of a set of entries.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use mtplx_cold::{Identity, IdentityDigest};
use mtplx_kv::{BufferId, KvView};

use crate::durability::Durability;
use crate::{Checkpoint, Continuation, SessionId};

/// One committed state, immutable once stored; shared (`Arc`) between the bank and the
/// plans that may restore it.
pub(crate) struct Entry {
    pub(crate) id: u64,
    pub(crate) session: SessionId,
    pub(crate) identity: Identity,
    pub(crate) digest: IdentityDigest,
    pub(crate) tokens: Vec<u32>,
    pub(crate) kv: Arc<dyn KvView>,
    pub(crate) continuation: Option<Continuation>,
    pub(crate) checkpoints: Option<Vec<Checkpoint>>,
}

impl Entry {
    /// Checkpoint positions, `None` for an attention-only entry.
    pub(crate) fn checkpoint_positions(&self) -> Option<Vec<usize>> {
        self.checkpoints
            .as_ref()
            .map(|c| c.iter().map(|c| c.position).collect())
    }

    /// Calls `visit` once per buffer this entry holds: its KV buffers, its recurrent
    /// buffers, its tokens and its continuation.
    pub(crate) fn visit_buffers(&self, visit: &mut dyn FnMut(BufferId, usize)) {
        self.kv.visit_buffers(visit);
        for cp in self.checkpoints.iter().flatten() {
            cp.state.visit_buffers(visit);
        }
        visit(
            BufferId::of(&self.tokens[..]),
            std::mem::size_of_val(&self.tokens[..]),
        );
        if let Some(c) = &self.continuation {
            visit(BufferId::of(c), c.bytes());
        }
    }
}

impl Entry {
    /// Bytes of the recurrent checkpoints' buffers not yet in `seen` (which gains them).
    pub(crate) fn checkpoint_bytes(&self, seen: &mut std::collections::HashSet<BufferId>) -> u64 {
        let mut n = 0u64;
        for cp in self.checkpoints.iter().flatten() {
            cp.state.visit_buffers(&mut |id, bytes| {
                if seen.insert(id) {
                    n += bytes as u64;
                }
            });
        }
        n
    }

    /// Bytes the entry holds on its own (shared buffers counted in full).
    pub(crate) fn bytes(&self) -> u64 {
        let mut n = 0u64;
        self.visit_buffers(&mut |_, bytes| n += bytes as u64);
        n
    }
}

/// Mutable bookkeeping of a stored entry.
pub(crate) struct Slot {
    pub(crate) entry: Arc<Entry>,
    pub(crate) created: Duration,
    pub(crate) last_access: Duration,
    pub(crate) durability: Durability,
}

/// Bytes held by a set of entries, each shared buffer counted once, kept up to date as
/// entries come and go.
#[derive(Debug, Default)]
pub(crate) struct Footprint {
    /// Holders and size of each buffer.
    buffers: HashMap<BufferId, (usize, usize)>,
    bytes: u64,
}

impl Footprint {
    pub(crate) fn add(&mut self, entry: &Entry) {
        entry.visit_buffers(&mut |id, bytes| {
            let slot = self.buffers.entry(id).or_insert((0, bytes));
            if slot.0 == 0 {
                self.bytes += bytes as u64;
            }
            slot.0 += 1;
        });
    }

    pub(crate) fn remove(&mut self, entry: &Entry) {
        entry.visit_buffers(&mut |id, _| {
            if let Some(slot) = self.buffers.get_mut(&id) {
                slot.0 -= 1;
                if slot.0 == 0 {
                    self.bytes -= slot.1 as u64;
                    self.buffers.remove(&id);
                }
            }
        });
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}
