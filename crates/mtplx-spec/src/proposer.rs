//! The proposer trait: anything that guesses the next few tokens.

use mtplx_model::sampling::Distribution;

use crate::error::Result;

/// What a proposer sees.
pub struct DraftContext<'a> {
    /// Every token so far: prompt, generated, and the newest token (not yet verified by the
    /// model: the first draft continues after it).
    pub tokens: &'a [u32],
    /// At most this many tokens may be drafted.
    pub max_len: usize,
}

/// Guessed tokens, and how they were guessed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Draft {
    pub tokens: Vec<u32>,
    /// For a stochastic proposer, the distribution each token was drawn from (`q`), one per
    /// token. `None` for deterministic drafts (prompt lookup, greedy drafting), which are
    /// verified by sampling the model's own token and comparing.
    pub dists: Option<Vec<Distribution>>,
}

impl Draft {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// Where a draft comes from. Depth policies can keep statistics per source
/// ([`crate::DepthPolicy::by_source`]): a copy found in the context and a model's guess
/// differ in how often they are accepted and in what drafting them costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DraftSource {
    /// A continuation copied from the context (prompt lookup): free to draft.
    Lookup,
    /// A model's guess (an MTP head, a draft model): each token costs a forward pass.
    Model,
}

/// Rows of the trunk's last hidden state (before the final norm) that the decoder kept:
/// what an MTP head drafts from.
pub struct TrunkRows<'a> {
    /// Position of the first row.
    pub pos: usize,
    /// `[n, hidden]`: row `r` is the trunk's state at position `pos + r`.
    pub hidden: &'a [f32],
    /// `next[r]`: the token at position `pos + r + 1` (what row `r` predicted and the
    /// decoder kept); the last one is the context's newest token.
    pub next: &'a [u32],
}

/// Guesses continuations for the verifier to check.
pub trait Proposer {
    /// A short name for stats and logs (`mtp`, `lookup`, `draft_model`).
    fn name(&self) -> &'static str;

    /// Sees the trunk's hidden rows the decoder kept (after the prefill and after every
    /// verify), before the next [`Proposer::propose`]. Most proposers ignore them.
    fn observe(&mut self, rows: &TrunkRows<'_>) -> Result<()> {
        let _ = rows;
        Ok(())
    }

    /// Whether [`Proposer::observe`] uses the rows: a caller that prefills on its own asks
    /// the model for the prompt's hidden rows (`Want::Hidden`) only then.
    fn wants_hidden(&self) -> bool {
        false
    }

    /// Where the next draft of up to `ctx.max_len` tokens would come from, asked before the
    /// depth is chosen. The default: a model's guess.
    fn next_source(&mut self, ctx: &DraftContext<'_>) -> DraftSource {
        let _ = ctx;
        DraftSource::Model
    }

    /// Drafts up to `ctx.max_len` tokens after `ctx.tokens` (fewer, or none, is fine).
    fn propose(&mut self, ctx: &DraftContext<'_>) -> Result<Draft>;
}
