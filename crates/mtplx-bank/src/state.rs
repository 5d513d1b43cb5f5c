//! What a committed conversation state holds, in model-agnostic types.

use std::sync::Arc;

use mtplx_cold::Identity;
use mtplx_kv::KvView;

use crate::SessionId;

/// What continuing to decode right after the state's last token needs, beyond the KV rows:
/// a restore that covers the whole prompt hands this back instead of re-reading a token.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Continuation {
    /// Logits at the last position.
    pub logits: Vec<f32>,
    /// The last position's final hidden row (the MTP head's input); may be empty.
    pub hidden: Vec<f32>,
    /// The MTP head's own state, opaque to the bank.
    pub mtp: Option<Vec<u8>>,
}

impl Continuation {
    /// Bytes this continuation holds.
    pub fn bytes(&self) -> usize {
        (self.logits.len() + self.hidden.len()) * std::mem::size_of::<f32>()
            + self.mtp.as_ref().map_or(0, Vec::len)
    }
}

/// A hybrid model's recurrent state after `position` tokens (1 ..= the entry's length). A
/// hybrid state can be restored only at a checkpoint: recurrent state cannot be trimmed like
/// KV.
pub use mtplx_kv::Checkpoint;

/// A conversation state to keep: handed to [`crate::Bank::commit`] after a turn.
#[derive(Clone)]
pub struct Commit {
    pub session: SessionId,
    pub identity: Identity,
    /// The exact tokens whose K/V rows `kv` holds (`kv.len() == tokens.len()`).
    pub tokens: Vec<u32>,
    /// A frozen snapshot ([`mtplx_kv::KvCache::snapshot`]); the bank never writes to it.
    pub kv: Arc<dyn KvView>,
    /// State for continuing right after the last token, if the caller has it.
    pub continuation: Option<Continuation>,
    /// `None` for an attention-only model; for a hybrid one, its checkpoints in ascending
    /// order (include one at `tokens.len()` so the whole state can be restored).
    pub checkpoints: Option<Vec<Checkpoint>>,
}

impl std::fmt::Debug for Commit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Commit")
            .field("session", &self.session)
            .field("identity", &self.identity)
            .field("tokens", &self.tokens.len())
            .field("kv_layout", &self.kv.layout())
            .field("continuation", &self.continuation.is_some())
            .field(
                "checkpoints",
                &self
                    .checkpoints
                    .as_ref()
                    .map(|c| c.iter().map(|c| c.position).collect::<Vec<_>>()),
            )
            .finish()
    }
}
