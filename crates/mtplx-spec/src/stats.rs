//! What speculation did, per request.

/// Counters for one generation, for the request log and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// `drafted_by_depth[i]`: draft tokens offered at depth `i + 1`.
    pub drafted_by_depth: Vec<u64>,
    /// `accepted_by_depth[i]`: draft tokens accepted at depth `i + 1`.
    pub accepted_by_depth: Vec<u64>,
    /// Forward passes over a draft (k + 1 rows).
    pub verify_calls: u64,
    /// Steps that drafted nothing and decoded one token.
    pub plain_steps: u64,
    /// Tokens sampled after a fully accepted draft.
    pub bonus_tokens: u64,
    /// Tokens sampled in place of a rejected draft token.
    pub correction_tokens: u64,
}

impl SpecStats {
    pub(crate) fn record(&mut self, drafted: usize, accepted: usize) {
        if self.drafted_by_depth.len() < drafted {
            self.drafted_by_depth.resize(drafted, 0);
            self.accepted_by_depth.resize(drafted, 0);
        }
        for d in 0..drafted {
            self.drafted_by_depth[d] += 1;
        }
        for d in 0..accepted {
            self.accepted_by_depth[d] += 1;
        }
    }

    /// Adds `other`'s counts (several generations' totals).
    pub fn merge(&mut self, other: &SpecStats) {
        let depth = self
            .drafted_by_depth
            .len()
            .max(other.drafted_by_depth.len());
        self.drafted_by_depth.resize(depth, 0);
        self.accepted_by_depth.resize(depth, 0);
        for (i, (d, a)) in other
            .drafted_by_depth
            .iter()
            .zip(&other.accepted_by_depth)
            .enumerate()
        {
            self.drafted_by_depth[i] += d;
            self.accepted_by_depth[i] += a;
        }
        self.verify_calls += other.verify_calls;
        self.plain_steps += other.plain_steps;
        self.bonus_tokens += other.bonus_tokens;
        self.correction_tokens += other.correction_tokens;
    }

    /// Mean tokens produced per verify call (accepted drafts + the sampled token).
    pub fn mean_acceptance_length(&self) -> f64 {
        if self.verify_calls == 0 {
            return 0.0;
        }
        let accepted: u64 = self.accepted_by_depth.iter().sum();
        (accepted + self.verify_calls) as f64 / self.verify_calls as f64
    }
}
