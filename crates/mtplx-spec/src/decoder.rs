//! The speculative decoding loop: draft, verify in one forward pass, accept, roll back.

use std::time::Instant;

use mtplx_kv::Sequence;
use mtplx_model::sampling::{Distribution, Sampler, Target};
use mtplx_model::{prefill, ForwardOutput, LanguageModel, ModelError, Want};

use crate::error::Result;
use crate::policy::DepthPolicy;
use crate::proposer::{Draft, DraftContext, Proposer, TrunkRows};
use crate::stats::SpecStats;

/// A generation in progress with speculation.
///
/// The sequence always holds every token but the newest, which is run through the model at
/// the start of the next verify block (`[newest, d1 … dk]`, k + 1 rows). After the verify
/// it keeps what was accepted: K/V rows are trimmed; a hybrid model's recurrent state,
/// which cannot be trimmed, comes back from a checkpoint taken before the block and the
/// accepted tokens are run again (the same calls for both: [`Sequence::rewind`]).
///
/// Acceptance keeps the output exactly the model's own:
/// - greedy: a draft token is accepted while it equals the model's argmax;
/// - sampling with a deterministic draft: the model's own token is drawn with the same
///   single uniform plain decoding would use, and the draft is accepted when it matches, so
///   the tokens are identical to plain sampling with the same seed;
/// - sampling with a random draft (`q` known): accepted with probability `min(1, p/q)`, on
///   rejection a token is drawn from the normalised `(p − q)+`; lossless in distribution.
pub struct SpecDecoder<'a> {
    model: &'a dyn LanguageModel,
    seq: &'a mut Sequence,
    sampler: Sampler,
    prompt_len: usize,
    tokens: Vec<u32>,
    /// Trunk hidden rows not yet shown to the proposer: `(first position, [n, hidden])`,
    /// for positions whose next token is in `tokens`.
    unseen: Option<(usize, Vec<f32>)>,
    /// The verify pass's output, reused: a step allocates no logits once it has grown.
    out: ForwardOutput,
    /// The output of re-running accepted tokens after a rewind (read by no one).
    redo: ForwardOutput,
    pub stats: SpecStats,
}

/// Which trunk hidden states of the prompt the prefill keeps for the proposer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PromptHidden {
    /// The last row only (what sampling needs anyway): an MTP head starts at the answer.
    #[default]
    Last,
    /// Every prefilled row, so an MTP head attends over the prompt. Costs the output head
    /// on every prompt row.
    All,
}

impl<'a> SpecDecoder<'a> {
    /// Prefills `prompt` (the part the sequence does not hold) and samples the first token.
    pub fn new(
        model: &'a dyn LanguageModel,
        seq: &'a mut Sequence,
        prompt: &[u32],
        sampler: Sampler,
        chunk: usize,
    ) -> Result<Self> {
        Self::with_prompt_hidden(model, seq, prompt, sampler, chunk, PromptHidden::Last)
    }

    /// [`SpecDecoder::new`], keeping the prompt's trunk hidden states as `hidden` says.
    pub fn with_prompt_hidden(
        model: &'a dyn LanguageModel,
        seq: &'a mut Sequence,
        prompt: &[u32],
        mut sampler: Sampler,
        chunk: usize,
        hidden: PromptHidden,
    ) -> Result<Self> {
        if prompt.is_empty() {
            return Err(ModelError::EmptyInput.into());
        }
        let reuse = seq.rewind(seq.len().min(prompt.len() - 1))?;
        let out = match hidden {
            PromptHidden::Last => prefill(model, &prompt[reuse..], seq, chunk)?,
            PromptHidden::All => {
                // The last piece's logits (only its last row is read) and every row's hidden.
                let mut hidden = Vec::new();
                let mut last = ForwardOutput::default();
                for piece in prompt[reuse..].chunks(chunk.max(1)) {
                    last = model.forward(piece, seq, Want::All)?;
                    seq.checkpoint();
                    hidden.extend_from_slice(&last.hidden);
                }
                ForwardOutput { hidden, ..last }
            }
        };
        let first = sampler.sample(out.last_logits(), prompt, &[]);
        let h = model.dims().hidden_size;
        let first_pos = prompt.len() - out.hidden.len() / h;
        let mut tokens = prompt.to_vec();
        tokens.push(first);
        Ok(SpecDecoder {
            model,
            seq,
            sampler,
            prompt_len: prompt.len(),
            tokens,
            unseen: Some((first_pos, out.hidden)),
            out: ForwardOutput::default(),
            redo: ForwardOutput::default(),
            stats: SpecStats::default(),
        })
    }

    /// Shows the proposer the trunk rows it has not seen.
    fn show(&mut self, proposer: &mut dyn Proposer) -> Result<()> {
        if let Some((pos, hidden)) = self.unseen.take() {
            let h = self.model.dims().hidden_size;
            let n = hidden.len() / h;
            if n > 0 {
                proposer.observe(&TrunkRows {
                    pos,
                    hidden: &hidden,
                    next: &self.tokens[pos + 1..pos + 1 + n],
                })?;
            }
        }
        Ok(())
    }

    /// Tokens generated so far (the first one is sampled by [`SpecDecoder::new`]).
    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Room left in the context window (tokens).
    fn room(&self) -> usize {
        self.model
            .dims()
            .context_length
            .saturating_sub(self.tokens.len())
    }

    /// One step: draft up to `depth` tokens, verify them, and append what is accepted plus
    /// one token from the model (at most `max_emit` tokens, cut after the first token for
    /// which `is_stop` holds).
    pub fn step(
        &mut self,
        proposer: &mut dyn Proposer,
        depth: usize,
        max_emit: usize,
        is_stop: &dyn Fn(u32) -> bool,
    ) -> Result<StepOutcome> {
        if max_emit == 0 || self.room() == 0 {
            return Ok(StepOutcome::default());
        }
        // Never draft past the context window or what the caller will take.
        let k = depth.min(self.room() - 1).min(max_emit - 1);
        self.show(proposer)?;
        let mut draft = if k > 0 {
            proposer.propose(&DraftContext {
                tokens: &self.tokens,
                max_len: k,
            })?
        } else {
            Draft::default()
        };
        draft.tokens.truncate(k);
        if let Some(d) = draft.dists.as_mut() {
            d.truncate(k);
        }
        let k = draft.len();

        let old_len = self.tokens.len();
        let mut input = Vec::with_capacity(k + 1);
        input.push(self.tokens[old_len - 1]);
        input.extend_from_slice(&draft.tokens);
        // Where a hybrid model's state comes back from if a draft is rejected (recorded only
        // for a block with drafts; none for an attention-only model).
        let block_start = old_len - 1;
        let marked = k > 0 && self.seq.checkpoint();
        self.model
            .forward_into(&input, self.seq, Want::All, &mut self.out)?;

        let mut emitted = Vec::with_capacity(k + 1);
        for i in 0..=k {
            let mut history = self.tokens[self.prompt_len..].to_vec();
            history.extend_from_slice(&emitted);
            let target = self.sampler.target(
                self.out.logits_row(i),
                &self.tokens[..self.prompt_len],
                &history,
            );
            if i == k {
                emitted.push(self.pick(target));
                if k > 0 {
                    self.stats.bonus_tokens += 1;
                }
                break;
            }
            let d = draft.tokens[i];
            let q = draft.dists.as_ref().map(|q| &q[i]);
            match self.judge(target, d, q) {
                Verdict::Accept => emitted.push(d),
                Verdict::Replace(t) => {
                    emitted.push(t);
                    self.stats.correction_tokens += 1;
                    break;
                }
            }
        }
        let accepted = emitted.len() - 1;
        if k > 0 {
            self.stats.verify_calls += 1;
            self.stats.record(k, accepted);
        } else {
            self.stats.plain_steps += 1;
        }

        let mut cut = emitted.len().min(max_emit);
        if let Some(s) = emitted[..cut].iter().position(|&t| is_stop(t)) {
            cut = s + 1;
        }
        // The sequence holds tokens[..old_len] and the k drafts; keep what precedes the
        // newest appended token, running again what a rewind to a checkpoint dropped.
        let keep = block_start + cut;
        let reached = self.seq.rewind(keep)?;
        if reached < keep {
            let redo = &input[reached - block_start..cut];
            self.model
                .forward_into(redo, self.seq, Want::Nothing, &mut self.redo)?;
        }
        if marked {
            self.seq.forget(block_start);
        }
        self.tokens.extend_from_slice(&emitted[..cut]);
        let h = self.model.dims().hidden_size;
        self.unseen = Some((old_len - 1, self.out.hidden[..cut * h].to_vec()));
        Ok(StepOutcome {
            appended: cut,
            drafted: k,
            accepted,
        })
    }

    fn pick(&mut self, target: Target) -> u32 {
        match target {
            Target::Token(t) => t,
            Target::Dist(p) => self.sampler.rng().draw(&p),
        }
    }

    fn judge(&mut self, target: Target, draft: u32, q: Option<&Distribution>) -> Verdict {
        match (target, q) {
            (Target::Token(t), _) => accept_if(t, draft),
            (Target::Dist(p), None) => accept_if(self.sampler.rng().draw(&p), draft),
            (Target::Dist(p), Some(q)) => {
                let (pd, qd) = (p.prob(draft) as f64, q.prob(draft) as f64);
                let r = self.sampler.rng().uniform();
                if qd > 0.0 && r < (pd / qd).min(1.0) {
                    return Verdict::Accept;
                }
                Verdict::Replace(self.sampler.rng().draw(&residual(&p, q)))
            }
        }
    }
}

/// What one step did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepOutcome {
    /// Tokens appended to the generation.
    pub appended: usize,
    /// Draft tokens verified.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
}

enum Verdict {
    Accept,
    Replace(u32),
}

fn accept_if(model_token: u32, draft: u32) -> Verdict {
    if model_token == draft {
        Verdict::Accept
    } else {
        Verdict::Replace(model_token)
    }
}

/// The normalised positive part of `p − q` (over `p`'s support; `p` itself if empty).
fn residual(p: &Distribution, q: &Distribution) -> Distribution {
    let mut tokens = Vec::new();
    let mut probs = Vec::new();
    for (&t, &pt) in p.tokens.iter().zip(&p.probs) {
        let r = pt - q.prob(t);
        if r > 0.0 {
            tokens.push(t);
            probs.push(r);
        }
    }
    let z: f32 = probs.iter().sum();
    if tokens.is_empty() || z <= 0.0 {
        return p.clone();
    }
    probs.iter_mut().for_each(|v| *v /= z);
    Distribution { tokens, probs }
}

impl SpecDecoder<'_> {
    /// One [`step`](Self::step) at the depth `policy` picks for where the draft will come
    /// from ([`Proposer::next_source`]), timed and reported back to the policy.
    pub fn step_with_policy(
        &mut self,
        proposer: &mut dyn Proposer,
        policy: &mut DepthPolicy,
        max_emit: usize,
        is_stop: &dyn Fn(u32) -> bool,
    ) -> Result<StepOutcome> {
        let start = Instant::now();
        let source = proposer.next_source(&DraftContext {
            tokens: &self.tokens,
            max_len: policy.max_depth(),
        });
        let step = self.step(proposer, policy.depth_for(source), max_emit, is_stop)?;
        if step.appended > 0 {
            policy.observe_for(
                source,
                step.drafted,
                step.accepted,
                start.elapsed().as_secs_f64(),
            );
        }
        Ok(step)
    }
}

/// Runs speculative generation to `max_new` tokens or a stop token, with a depth policy.
pub fn generate(
    decoder: &mut SpecDecoder<'_>,
    proposer: &mut dyn Proposer,
    policy: &mut DepthPolicy,
    max_new: usize,
    is_stop: &dyn Fn(u32) -> bool,
) -> Result<()> {
    while decoder.generated().len() < max_new {
        if decoder.generated().last().is_some_and(|&t| is_stop(t)) {
            break;
        }
        let left = max_new - decoder.generated().len();
        if decoder
            .step_with_policy(proposer, policy, left, is_stop)?
            .appended
            == 0
        {
            break;
        }
    }
    Ok(())
}
