//! A smaller model that shares the tokenizer drafts for the bigger one.

use mtplx_kv::{CacheFactory, Sequence};
use mtplx_model::sampling::{argmax, Distribution, RandomSampling, Rng};
use mtplx_model::{LanguageModel, Want};

use crate::error::Result;
use crate::proposer::{Draft, DraftContext, Proposer};

/// How the draft model picks its tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DraftSampling {
    /// Its argmax: a deterministic draft, verified by sample-and-compare.
    Greedy,
    /// Draws from its own distribution: verified by the `min(1, p/q)` ratio test.
    Random(RandomSampling),
}

/// Drafts with its own model and its own sequence, kept in step with the context: only the
/// tokens it has not seen are run through it (a hybrid draft model rewinds to a checkpoint
/// and runs the rest again).
pub struct DraftModel<M: LanguageModel> {
    model: M,
    seq: Sequence,
    /// The tokens the sequence holds.
    seen: Vec<u32>,
    sampling: DraftSampling,
    rng: Rng,
}

impl<M: LanguageModel> DraftModel<M> {
    pub fn new(model: M, factory: &CacheFactory, sampling: DraftSampling) -> Self {
        let seq = model.new_sequence(factory);
        let seed = match sampling {
            DraftSampling::Random(r) => r.seed,
            DraftSampling::Greedy => 0,
        };
        DraftModel {
            model,
            seq,
            seen: Vec::new(),
            sampling,
            rng: Rng::new(seed),
        }
    }

    /// Brings the sequence to `tokens[..len-1]` and returns the logits after `tokens`.
    fn sync(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let common = self
            .seen
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len() - 1);
        let common = self.seq.rewind(common)?;
        // Where the next sync rewinds to (a hybrid draft model's; none for attention only).
        if self.seq.checkpoint() {
            self.seq.thin(mtplx_kv::MAX_CHECKPOINTS);
        }
        self.seen.truncate(common);
        let out = self
            .model
            .forward(&tokens[common..], &mut self.seq, Want::Last)?;
        self.seen.extend_from_slice(&tokens[common..]);
        Ok(out.last_logits().to_vec())
    }
}

impl<M: LanguageModel> Proposer for DraftModel<M> {
    fn name(&self) -> &'static str {
        "draft_model"
    }

    fn propose(&mut self, ctx: &DraftContext<'_>) -> Result<Draft> {
        if ctx.tokens.is_empty() || ctx.max_len == 0 {
            return Ok(Draft::default());
        }
        let room = self
            .model
            .dims()
            .context_length
            .saturating_sub(ctx.tokens.len());
        let k = ctx.max_len.min(room);
        let mut logits = self.sync(ctx.tokens)?;
        let mut draft = Draft {
            tokens: Vec::with_capacity(k),
            dists: matches!(self.sampling, DraftSampling::Random(_)).then(Vec::new),
        };
        for i in 0..k {
            let t = match self.sampling {
                DraftSampling::Greedy => argmax(&logits),
                DraftSampling::Random(r) => {
                    let q: Distribution = r.distribution(&logits);
                    let t = self.rng.draw(&q);
                    draft.dists.as_mut().expect("random drafts carry q").push(q);
                    t
                }
            };
            draft.tokens.push(t);
            if i + 1 < k {
                let out = self.model.forward(&[t], &mut self.seq, Want::Last)?;
                self.seen.push(t);
                logits = out.last_logits().to_vec();
            }
        }
        Ok(draft)
    }
}
