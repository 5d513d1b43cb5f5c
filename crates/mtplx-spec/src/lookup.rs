//! Prompt lookup: draft what followed the last time the context's tail appeared.

use crate::error::Result;
use crate::proposer::{Draft, DraftContext, DraftSource, Proposer};

/// Finds the longest suffix of the context (between `min_ngram` and `max_ngram` tokens)
/// that occurred earlier, and drafts the tokens that followed its most recent earlier
/// occurrence. Agent and code-editing turns copy a lot, and this costs no model work.
#[derive(Debug, Clone)]
pub struct PromptLookup {
    pub min_ngram: usize,
    pub max_ngram: usize,
}

impl Default for PromptLookup {
    fn default() -> Self {
        PromptLookup {
            min_ngram: 2,
            max_ngram: 8,
        }
    }
}

impl PromptLookup {
    /// The continuation after the best earlier match of the context's tail.
    pub fn lookup(&self, tokens: &[u32], max_len: usize) -> Vec<u32> {
        let n = tokens.len();
        if max_len == 0 {
            return Vec::new();
        }
        for size in (self.min_ngram.max(1)..=self.max_ngram.min(n.saturating_sub(1))).rev() {
            let tail = &tokens[n - size..];
            // Most recent earlier occurrence whose continuation exists.
            let found = (0..n - size).rev().find(|&s| &tokens[s..s + size] == tail);
            if let Some(s) = found {
                let from = s + size;
                let to = (from + max_len).min(n);
                return tokens[from..to].to_vec();
            }
        }
        Vec::new()
    }
}

impl Proposer for PromptLookup {
    fn name(&self) -> &'static str {
        "lookup"
    }

    fn next_source(&mut self, _: &DraftContext<'_>) -> DraftSource {
        DraftSource::Lookup
    }

    fn propose(&mut self, ctx: &DraftContext<'_>) -> Result<Draft> {
        Ok(Draft {
            tokens: self.lookup(ctx.tokens, ctx.max_len),
            dists: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_the_continuation_of_the_longest_match() {
        let p = PromptLookup::default();
        // "1 2 3 4 5 ... 1 2 3" → "4 5"
        assert_eq!(p.lookup(&[1, 2, 3, 4, 5, 9, 1, 2, 3], 2), [4, 5]);
        // Prefers the longer match: "7 8 9" seen before "0", "8 9" before "5".
        assert_eq!(p.lookup(&[8, 9, 5, 7, 8, 9, 0, 1, 7, 8, 9], 2), [0, 1]);
        // The continuation stops at the context's end.
        assert_eq!(p.lookup(&[4, 4, 4], 5), [4]);
        assert!(p.lookup(&[1, 2, 3], 4).is_empty());
        assert!(p.lookup(&[], 4).is_empty());
    }
}
