//! How many tokens to draft next.

use crate::proposer::DraftSource;

/// A depth policy: asked before each verify step, told what happened after it.
#[derive(Debug, Clone)]
pub enum DepthPolicy {
    /// Always draft this many.
    Fixed(usize),
    /// Grow by one after a fully accepted draft, fall back to just past the first rejection.
    Streak { depth: usize, max: usize },
    /// Maximise expected tokens per step, `1 + p1 + p1·p2 + …`, minus a fixed cost per drafted
    /// token, with per-depth acceptance rates tracked as moving averages.
    ExpectedValue(Acceptance),
    /// Maximise expected tokens per unit of measured step time, with EMAs of step time per
    /// depth.
    Cost {
        accept: Acceptance,
        step_secs: Vec<Option<f64>>,
    },
    /// One policy per [`DraftSource`], each learning from its own steps: prompt lookup's
    /// copies are free to draft and often long, a model's guesses cost a pass each and are
    /// accepted less, and one set of statistics for both drafts too deep for one and too
    /// shallow for the other. [`DepthPolicy::depth`] and [`DepthPolicy::observe`] use the
    /// model's.
    BySource {
        lookup: Box<DepthPolicy>,
        model: Box<DepthPolicy>,
    },
}

/// Moving averages of the acceptance rate at each depth (given the previous was accepted).
#[derive(Debug, Clone)]
pub struct Acceptance {
    rates: Vec<f64>,
    alpha: f64,
}

impl Acceptance {
    /// Priors from the original: 0.92, 0.64, 0.32, then halving.
    pub fn with_priors(max_depth: usize) -> Self {
        let mut rates = vec![0.92, 0.64, 0.32];
        while rates.len() < max_depth {
            let last = *rates.last().expect("non-empty");
            rates.push(last / 2.0);
        }
        rates.truncate(max_depth.max(1));
        Acceptance { rates, alpha: 0.1 }
    }

    pub fn max_depth(&self) -> usize {
        self.rates.len()
    }

    /// Expected tokens from one step at `depth`: `1 + p1 + p1·p2 + …`.
    pub fn expected_tokens(&self, depth: usize) -> f64 {
        let mut reach = 1.0;
        let mut total = 1.0;
        for r in self.rates.iter().take(depth) {
            reach *= r;
            total += reach;
        }
        total
    }

    /// Records a step that drafted `drafted` tokens and accepted the first `accepted`.
    pub fn observe(&mut self, drafted: usize, accepted: usize) {
        for (i, r) in self.rates.iter_mut().enumerate().take(drafted) {
            if i > accepted {
                break; // never reached
            }
            let hit = if i < accepted { 1.0 } else { 0.0 };
            *r += self.alpha * (hit - *r);
        }
    }
}

/// A draft token costs this fraction of a decode step when time is not measured.
const DRAFT_COST: f64 = 0.15;

impl DepthPolicy {
    pub fn fixed(depth: usize) -> Self {
        DepthPolicy::Fixed(depth)
    }

    /// The depth to draft next.
    pub fn depth(&self) -> usize {
        match self {
            DepthPolicy::Fixed(d) => *d,
            DepthPolicy::Streak { depth, .. } => *depth,
            DepthPolicy::ExpectedValue(a) => {
                (0..=a.max_depth())
                    .map(|d| (d, a.expected_tokens(d) / (1.0 + DRAFT_COST * d as f64)))
                    .fold((0, f64::MIN), |b, x| if x.1 > b.1 { x } else { b })
                    .0
            }
            DepthPolicy::BySource { model, .. } => model.depth(),
            DepthPolicy::Cost { accept, step_secs } => {
                // Explore any depth never timed; then pick the best tokens per second.
                if let Some(d) = step_secs.iter().position(Option::is_none) {
                    return d;
                }
                (0..step_secs.len())
                    .map(|d| {
                        let t = step_secs[d].expect("all timed");
                        (d, accept.expected_tokens(d) / t.max(1e-9))
                    })
                    .fold((0, f64::MIN), |b, x| if x.1 > b.1 { x } else { b })
                    .0
            }
        }
    }

    /// Records the outcome of a step at `drafted` depth that took `secs`.
    pub fn observe(&mut self, drafted: usize, accepted: usize, secs: f64) {
        match self {
            DepthPolicy::Fixed(_) => {}
            DepthPolicy::Streak { depth, max } => {
                *depth = if drafted > 0 && accepted == drafted {
                    (*depth + 1).min(*max)
                } else {
                    (accepted + 1).min(*max)
                };
            }
            DepthPolicy::ExpectedValue(a) => a.observe(drafted, accepted),
            DepthPolicy::BySource { model, .. } => model.observe(drafted, accepted, secs),
            DepthPolicy::Cost { accept, step_secs } => {
                accept.observe(drafted, accepted);
                if let Some(slot) = step_secs.get_mut(drafted) {
                    *slot = Some(match *slot {
                        Some(prev) => prev + 0.2 * (secs - prev),
                        None => secs,
                    });
                }
            }
        }
    }

    /// `policy` once per [`DraftSource`] (see [`DepthPolicy::BySource`]).
    pub fn by_source(policy: DepthPolicy) -> Self {
        DepthPolicy::BySource {
            lookup: Box::new(policy.clone()),
            model: Box::new(policy),
        }
    }

    /// The deepest draft the policy may ask for.
    pub fn max_depth(&self) -> usize {
        match self {
            DepthPolicy::Fixed(d) => *d,
            DepthPolicy::Streak { max, .. } => *max,
            DepthPolicy::ExpectedValue(a) => a.max_depth(),
            DepthPolicy::Cost { step_secs, .. } => step_secs.len().saturating_sub(1),
            DepthPolicy::BySource { lookup, model } => lookup.max_depth().max(model.max_depth()),
        }
    }

    /// The depth to draft next when the draft will come from `source`.
    pub fn depth_for(&self, source: DraftSource) -> usize {
        match (self, source) {
            (DepthPolicy::BySource { lookup, .. }, DraftSource::Lookup) => lookup.depth(),
            _ => self.depth(),
        }
    }

    /// Records the outcome of a step whose draft came from `source`.
    pub fn observe_for(&mut self, source: DraftSource, drafted: usize, accepted: usize, secs: f64) {
        match (self, source) {
            (DepthPolicy::BySource { lookup, .. }, DraftSource::Lookup) => {
                lookup.observe(drafted, accepted, secs)
            }
            (p, _) => p.observe(drafted, accepted, secs),
        }
    }

    /// The cost policy up to `max_depth`.
    pub fn cost(max_depth: usize) -> Self {
        DepthPolicy::Cost {
            accept: Acceptance::with_priors(max_depth),
            step_secs: vec![None; max_depth + 1],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streak_grows_and_falls_back() {
        let mut p = DepthPolicy::Streak { depth: 2, max: 4 };
        p.observe(2, 2, 0.0);
        assert_eq!(p.depth(), 3);
        p.observe(3, 0, 0.0);
        assert_eq!(p.depth(), 1);
    }

    #[test]
    fn expected_value_backs_off_when_drafts_fail() {
        let mut p = DepthPolicy::ExpectedValue(Acceptance::with_priors(3));
        // With the priors, depth 2 gives the most tokens per unit of cost.
        assert_eq!(p.depth(), 2);
        for _ in 0..60 {
            p.observe(3, 0, 0.0);
        }
        assert_eq!(p.depth(), 0);
    }

    /// Lookup drafts that are always accepted and cheap, model drafts that never are: each
    /// source settles on its own depth, where one set of statistics would mix them.
    #[test]
    fn by_source_learns_each_source_apart() {
        let mut p = DepthPolicy::by_source(DepthPolicy::cost(3));
        for _ in 0..4 {
            for src in [DraftSource::Lookup, DraftSource::Model] {
                let d = p.depth_for(src);
                let (accepted, secs) = match src {
                    DraftSource::Lookup => (d, 1.0 + 0.05 * d as f64),
                    DraftSource::Model => (0, 1.0 + 0.3 * d as f64),
                };
                p.observe_for(src, d, accepted, secs);
            }
        }
        for _ in 0..40 {
            let d = p.depth_for(DraftSource::Lookup);
            p.observe_for(DraftSource::Lookup, d, d, 1.0 + 0.05 * d as f64);
            let d = p.depth_for(DraftSource::Model);
            p.observe_for(DraftSource::Model, d, 0, 1.0 + 0.3 * d as f64);
        }
        assert_eq!(p.depth_for(DraftSource::Lookup), 3);
        assert_eq!(p.depth_for(DraftSource::Model), 0);
        assert_eq!(p.max_depth(), 3);
        // One shared cost policy fed the same steps lands on a single depth for both.
        let mut shared = DepthPolicy::cost(3);
        for _ in 0..44 {
            let d = shared.depth();
            shared.observe(d, d, 1.0 + 0.05 * d as f64);
            let d = shared.depth();
            shared.observe(d, 0, 1.0 + 0.3 * d as f64);
        }
        assert_eq!(
            shared.depth_for(DraftSource::Lookup),
            shared.depth_for(DraftSource::Model)
        );
    }

    #[test]
    fn cost_explores_then_prefers_the_fastest_tokens_per_second() {
        let mut p = DepthPolicy::cost(2);
        for d in 0..3 {
            assert_eq!(p.depth(), d);
            // Depth 2 is as cheap as plain decoding and always accepted.
            p.observe(d, d, if d == 1 { 3.0 } else { 1.0 });
        }
        for _ in 0..20 {
            p.observe(2, 2, 1.0);
        }
        assert_eq!(p.depth(), 2);
    }
}
