//! The bank's one error type.

use mtplx_kv::{KvError, KvShape};

/// Everything that can go wrong in the bank. SSD read failures are not errors: a restore
/// that fails falls back to a cold start and names the miss (see
/// [`crate::Explanation`]).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BankError {
    /// A commit with no tokens.
    #[error("a committed state must hold at least one token")]
    EmptyTokens,
    /// A commit whose KV view does not hold exactly its tokens.
    #[error("the KV view holds {kv} positions but the commit has {tokens} tokens")]
    LengthMismatch { tokens: usize, kv: usize },
    /// Recurrent checkpoints out of order, at position 0, or past the tokens.
    #[error("recurrent checkpoints must ascend, be above 0 and lie within the {tokens} tokens (found position {position})")]
    BadCheckpoints { tokens: usize, position: usize },
    /// The caller's shape differs from the stored state's.
    #[error("restore asked for shape {asked:?} but the stored state has {stored:?}")]
    ShapeMismatch { asked: KvShape, stored: KvShape },
    /// A KV layout failed while building the restored cache.
    #[error("building the restored cache: {0}")]
    Kv(#[from] KvError),
}
