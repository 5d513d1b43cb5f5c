//! Plain autoregressive generation: chunked prefill, then one token per step.

use mtplx_kv::Sequence;

use crate::error::Result;
use crate::model::{ForwardOutput, LanguageModel, Want};
use crate::sampling::Sampler;

/// Runs `tokens` through the model in chunks of at most `chunk` tokens, folding them into
/// `seq` and recording a checkpoint at each chunk's end (a hybrid model's restore points;
/// an attention-only sequence records none), and returns the last row's logits and hidden
/// state.
pub fn prefill(
    model: &dyn LanguageModel,
    tokens: &[u32],
    seq: &mut Sequence,
    chunk: usize,
) -> Result<ForwardOutput> {
    let mut out = ForwardOutput::default();
    let pieces = tokens.chunks(chunk.max(1));
    let last = pieces.len().saturating_sub(1);
    for (i, piece) in pieces.enumerate() {
        let want = if i == last { Want::Last } else { Want::Nothing };
        model.forward_into(piece, seq, want, &mut out)?;
        seq.checkpoint();
    }
    Ok(out)
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// A stop token or stop sequence.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The context window is full.
    ContextFull,
    /// The client went away.
    Cancelled,
}

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn as_openai(self) -> &'static str {
        match self {
            FinishReason::Stop | FinishReason::Cancelled => "stop",
            FinishReason::Length | FinishReason::ContextFull => "length",
        }
    }
}

/// One generation in progress: owns the sampler and the token history, borrows the cache.
///
/// The last sampled token is forwarded lazily, at the next step, so a generation that stops
/// never pays for a forward pass whose logits nobody reads.
pub struct Generator<'a> {
    model: &'a dyn LanguageModel,
    seq: &'a mut Sequence,
    sampler: Sampler,
    prompt_len: usize,
    tokens: Vec<u32>,
    /// The newest forward pass; its last row's logits are sampled next.
    out: ForwardOutput,
    /// Whether the newest token still has to be run through the model.
    pending: bool,
}

impl<'a> Generator<'a> {
    /// Prefills whatever part of `prompt` the sequence does not already hold (it must hold
    /// a prefix of `prompt`; at least one token is always recomputed so there are logits to
    /// sample from, and a hybrid sequence rewinds to a checkpoint for that).
    pub fn new(
        model: &'a dyn LanguageModel,
        seq: &'a mut Sequence,
        prompt: &[u32],
        sampler: Sampler,
        chunk: usize,
    ) -> Result<Self> {
        if prompt.is_empty() {
            return Err(crate::ModelError::EmptyInput);
        }
        let reuse = seq.rewind(seq.len().min(prompt.len() - 1))?;
        let out = prefill(model, &prompt[reuse..], seq, chunk)?;
        Ok(Generator {
            model,
            seq,
            sampler,
            prompt_len: prompt.len(),
            tokens: prompt.to_vec(),
            out,
            pending: false,
        })
    }

    /// Samples the next token (running the previous one through the model first).
    pub fn step(&mut self) -> Result<u32> {
        if self.pending {
            let last = *self.tokens.last().expect("pending implies a token");
            self.model
                .forward_into(&[last], self.seq, Want::Last, &mut self.out)?;
        }
        let (prompt, generated) = self.tokens.split_at(self.prompt_len);
        let t = self
            .sampler
            .sample(self.out.last_logits(), prompt, generated);
        self.tokens.push(t);
        self.pending = true;
        Ok(t)
    }

    /// Whether another step fits in the context window.
    pub fn has_room(&self) -> bool {
        self.tokens.len() < self.model.dims().context_length
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> &[u32] {
        &self.tokens[self.prompt_len..]
    }

    /// Prompt and generated tokens.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
}

/// Greedy generation of up to `max_new` tokens, stopping after any of `stop_ids`.
pub fn generate_greedy(
    model: &dyn LanguageModel,
    seq: &mut Sequence,
    prompt: &[u32],
    max_new: usize,
    stop_ids: &[u32],
    chunk: usize,
) -> Result<Vec<u32>> {
    let mut g = Generator::new(model, seq, prompt, Sampler::greedy(), chunk)?;
    for _ in 0..max_new {
        if !g.has_room() {
            break;
        }
        let t = g.step()?;
        if stop_ids.contains(&t) {
            break;
        }
    }
    Ok(g.generated().to_vec())
}
