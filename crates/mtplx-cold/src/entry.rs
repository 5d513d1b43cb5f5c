//! What a spill hands the cold tier.

use std::fmt;

use crate::codec::blob::HEADER_LEN;
use crate::error::WriteError;
use crate::identity::Identity;
use crate::payload::{F32Buffer, KvGeometry, KvSource, Recurrent, TailState};

/// One conversation state to store: its identity, exact tokens, K/V rows for every
/// position, and, for a hybrid model, its recurrent checkpoints.
pub struct SpillEntry {
    pub identity: Identity,
    pub tokens: Vec<u32>,
    pub geometry: KvGeometry,
    /// Rows for positions `0..tokens.len()` of every layer.
    pub kv: Box<dyn KvSource>,
    pub recurrent: Recurrent,
    pub tail: Option<TailState>,
}

impl fmt::Debug for SpillEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpillEntry")
            .field("identity", &self.identity)
            .field("tokens", &self.tokens.len())
            .field("geometry", &self.geometry)
            .finish_non_exhaustive()
    }
}

fn buffers_ok(buffers: &[F32Buffer]) -> bool {
    buffers.iter().all(|b| {
        b.shape.len() <= 8
            && b.shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d as usize))
                == Some(b.data.len())
    })
}

impl SpillEntry {
    pub(crate) fn validate(&self) -> Result<(), WriteError> {
        let bad = |s: &str| Err(WriteError::Invalid(s.to_string()));
        if self.tokens.is_empty() {
            return bad("no tokens");
        }
        if self.tokens.len() > u32::MAX as usize / 2 {
            return bad("too many tokens");
        }
        if !self.geometry.is_valid() {
            return bad("zero-sized KV geometry");
        }
        if self.geometry.dtype != self.identity.kv_dtype {
            return Err(WriteError::KvDtypeMismatch {
                identity: self.identity.kv_dtype,
                geometry: self.geometry.dtype,
            });
        }
        if let Recurrent::Checkpoints(cps) = &self.recurrent {
            let sorted = cps.windows(2).all(|w| w[0].position < w[1].position);
            if !sorted
                || cps
                    .last()
                    .is_some_and(|c| c.position as usize > self.tokens.len())
            {
                return bad("checkpoint positions must ascend and lie within the tokens");
            }
            if !cps.iter().all(|c| buffers_ok(&c.buffers)) {
                return bad("a checkpoint buffer's shape does not match its data");
            }
        }
        if let Some(t) = &self.tail {
            if !buffers_ok(&t.last) {
                return bad("a tail buffer's shape does not match its data");
            }
        }
        Ok(())
    }

    /// About how many bytes the entry takes on disk (the writer's backlog counts this).
    pub fn estimated_bytes(&self) -> u64 {
        let kv = self.tokens.len() as u64 * self.geometry.bytes_per_token()
            + crate::key::blocks_for(self.tokens.len()) as u64 * HEADER_LEN as u64;
        let bufs = |b: &[F32Buffer]| b.iter().map(|b| b.data.len() as u64 * 4 + 64).sum::<u64>();
        let cps = match &self.recurrent {
            Recurrent::None => 0,
            Recurrent::Checkpoints(c) => c.iter().map(|c| bufs(&c.buffers)).sum(),
        };
        let tail = self.tail.as_ref().map_or(0, |t| {
            bufs(&t.last)
                + t.extra
                    .iter()
                    .map(|e| e.bytes.len() as u64 + 64)
                    .sum::<u64>()
        });
        kv + cps + tail
    }
}
