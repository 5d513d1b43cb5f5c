//! The generation driver: the one loop from a cache holding a prefix of the prompt to the
//! last token, used by the server's engine, the examples and the benches.
//!
//! [`drive`] prefills what the sequence lacks in chunks (checking for cancellation before
//! each one and showing an MTP proposer the prompt's hidden rows as they are computed, and
//! recording a hybrid model's checkpoints at every chunk's end and on a grid of
//! [`TAIL_GRID`] tokens over the prompt's last [`TAIL_SPAN`], thinned to
//! [`mtplx_kv::MAX_CHECKPOINTS`] as it goes), then
//! decodes plainly ([`Generator`]) or speculatively ([`SpecDecoder`]) until a stop token,
//! `max_tokens`, the context window, a cancellation or its caller says stop. It times the
//! prefill and every token. What the tokens mean (text, stop strings, a client) is the
//! caller's [`Observer`].
//!
//! ```
//! # fn demo(model: &dyn mtplx_model::LanguageModel) -> mtplx_spec::Result<()> {
//! use mtplx_kv::CacheFactory;
//! use mtplx_model::sampling::Sampler;
//! use mtplx_spec::{drive, Collect, Decode, End, Request};
//!
//! let prompt = [1, 2, 3];
//! let mut seq = model.new_sequence(&CacheFactory::contiguous());
//! let request = Request::new(&prompt, Sampler::greedy(), 16, &|t| t == 2);
//! let report = drive(model, &mut seq, &request, Decode::Plain, &mut Collect::default())?;
//! assert!(report.completion_tokens <= 16);
//! assert!(matches!(report.end, End::StopToken | End::Length | End::ContextFull));
//! # Ok(()) }
//! ```

use std::ops::ControlFlow;
use std::time::Instant;

use mtplx_kv::{Sequence, MAX_CHECKPOINTS};
use mtplx_model::sampling::Sampler;
use mtplx_model::{Generator, LanguageModel, ModelError, Want};

use crate::decoder::SpecDecoder;
use crate::error::Result;
use crate::policy::DepthPolicy;
use crate::proposer::{Proposer, TrunkRows};
use crate::stats::SpecStats;

/// Spacing of the checkpoints the prefill records near the prompt's end (besides those at
/// chunk ends): a retry or an edit of the last message restores close to where it diverges.
pub const TAIL_GRID: usize = 256;

/// How far back from the prompt's end the [`TAIL_GRID`] reaches.
pub const TAIL_SPAN: usize = 1024;

/// What to generate.
pub struct Request<'r> {
    /// The whole prompt; the sequence passed to [`drive`] holds a prefix of it (maybe empty).
    pub prompt: &'r [u32],
    pub sampler: Sampler,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Positions prompt and answer may fill together (the model's own window caps it too).
    pub context_window: usize,
    /// Most tokens per prefill forward pass.
    pub chunk: usize,
    /// Whether a token ends the generation (it is counted, not shown to the observer).
    pub is_stop: &'r dyn Fn(u32) -> bool,
}

impl<'r> Request<'r> {
    /// A request with the model's whole window and 512-token prefill chunks.
    pub fn new(
        prompt: &'r [u32],
        sampler: Sampler,
        max_tokens: usize,
        is_stop: &'r dyn Fn(u32) -> bool,
    ) -> Self {
        Request {
            prompt,
            sampler,
            max_tokens,
            context_window: usize::MAX,
            chunk: 512,
            is_stop,
        }
    }
}

/// How to decode.
pub enum Decode<'a> {
    /// One token per forward pass.
    Plain,
    /// Drafts from `proposer`, verified by the model, at the depth `policy` picks.
    Speculative {
        proposer: Box<dyn Proposer + 'a>,
        policy: DepthPolicy,
    },
}

/// The driver's caller: told each token, asked whether to go on.
pub trait Observer {
    /// Checked before every prefill chunk and every decode step: `true` ends the generation
    /// ([`End::Cancelled`]).
    fn cancelled(&self) -> bool {
        false
    }

    /// The next generated token (stop tokens are not shown). `Break` ends the generation
    /// ([`End::Observer`]): a stop string, a client that went away.
    fn token(&mut self, token: u32) -> ControlFlow<()>;

    /// A decode step (plain or verify) ran.
    fn stepped(&mut self) {}
}

/// An observer that keeps every token and never stops the generation.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Collect(pub Vec<u32>);

impl Observer for Collect {
    fn token(&mut self, token: u32) -> ControlFlow<()> {
        self.0.push(token);
        ControlFlow::Continue(())
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// A stop token ([`Request::is_stop`]).
    StopToken,
    /// `max_tokens` generated.
    Length,
    /// The context window is full.
    ContextFull,
    /// [`Observer::cancelled`] said so (during the prefill or between steps).
    Cancelled,
    /// [`Observer::token`] returned `Break`.
    Observer,
}

/// What speculation did.
#[derive(Debug, Clone)]
pub struct SpecReport {
    /// The proposer's name ([`Proposer::name`]).
    pub proposer: &'static str,
    pub stats: SpecStats,
    /// The depth policy as the generation left it (what it learned, for the next one).
    pub policy: DepthPolicy,
}

/// What a generation did.
#[derive(Debug, Clone)]
pub struct Report {
    pub end: End,
    /// Prompt tokens the cache already held (never the last one: it is run for logits).
    pub cached_tokens: usize,
    /// Prompt tokens run through the model.
    pub new_prefill_tokens: usize,
    /// Tokens generated, stop token included.
    pub completion_tokens: usize,
    pub prefill_s: f64,
    /// When the first and the newest token were ready.
    pub first_token_at: Option<Instant>,
    pub last_token_at: Option<Instant>,
    /// Decode forward passes (plain steps and verifies).
    pub decode_steps: u64,
    /// `None` for plain decoding.
    pub speculation: Option<SpecReport>,
    /// Prompt and generated tokens: every token the sequence may hold.
    pub tokens: Vec<u32>,
}

impl Report {
    /// Seconds from the first token to the newest.
    pub fn decode_s(&self) -> f64 {
        match (self.first_token_at, self.last_token_at) {
            (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
            _ => 0.0,
        }
    }
}

/// Generates into `seq` (which holds a prefix of `request.prompt`, maybe empty).
pub fn drive<'a>(
    model: &'a dyn LanguageModel,
    seq: &'a mut Sequence,
    request: &Request<'_>,
    mut decode: Decode<'a>,
    observer: &mut dyn Observer,
) -> Result<Report> {
    let prompt = request.prompt;
    if prompt.is_empty() {
        return Err(ModelError::EmptyInput.into());
    }
    let chunk = request.chunk.max(1);
    let is_stop = request.is_stop;
    // The restored prefix, always short of the whole prompt: the last token is run to get
    // logits (a hybrid sequence rewinds to a checkpoint for that).
    let reused = seq.rewind(seq.len().min(prompt.len() - 1))?;
    let mut report = Report {
        end: End::Cancelled,
        cached_tokens: reused,
        new_prefill_tokens: 0,
        completion_tokens: 0,
        prefill_s: 0.0,
        first_token_at: None,
        last_token_at: None,
        decode_steps: 0,
        speculation: None,
        tokens: prompt.to_vec(),
    };

    // The rest but the last prompt token, chunk by chunk, so a cancellation during a long
    // prefill stops it within one chunk.
    let prefill_start = Instant::now();
    // An MTP head drafts from the trunk's hidden rows: it sees the prompt's as they are
    // computed (the restored prefix has none; the head's context starts after it).
    let hidden = matches!(&decode, Decode::Speculative { proposer, .. } if proposer.wants_hidden());
    let want = if hidden { Want::Hidden } else { Want::Nothing };
    for (start, end) in pieces(reused, prompt.len() - 1, chunk) {
        let piece = &prompt[start..end];
        if observer.cancelled() {
            report.prefill_s = prefill_start.elapsed().as_secs_f64();
            return Ok(report);
        }
        let out = model.forward(piece, seq, want)?;
        if seq.checkpoint() {
            seq.thin(MAX_CHECKPOINTS);
        }
        let pos = start;
        if let Decode::Speculative { proposer, .. } = &mut decode {
            if hidden {
                proposer.observe(&TrunkRows {
                    pos,
                    hidden: &out.hidden,
                    next: &prompt[pos + 1..pos + 1 + piece.len()],
                })?;
            }
        }
        report.new_prefill_tokens += piece.len();
    }
    let mut stepper = Stepper::start(
        model,
        &mut *seq,
        prompt,
        request.sampler.clone(),
        chunk,
        decode,
    )?;
    report.new_prefill_tokens += 1;
    report.prefill_s = prefill_start.elapsed().as_secs_f64();

    let max = request.max_tokens;
    report.end = 'outer: loop {
        let done = report.completion_tokens;
        if done >= max {
            break End::Length;
        }
        let room = request.context_window.saturating_sub(prompt.len() + done);
        if room == 0 || !stepper.has_room() {
            break End::ContextFull;
        }
        if observer.cancelled() {
            break End::Cancelled;
        }
        let tokens = stepper.next((max - done).min(room), is_stop)?;
        if tokens.is_empty() {
            break End::ContextFull;
        }
        report.decode_steps += 1;
        observer.stepped();
        for token in tokens {
            report.completion_tokens += 1;
            let now = Instant::now();
            report.first_token_at.get_or_insert(now);
            report.last_token_at = Some(now);
            if is_stop(token) {
                break 'outer End::StopToken;
            }
            if observer.token(token).is_break() {
                break 'outer End::Observer;
            }
        }
    };
    report.tokens = stepper.tokens().to_vec();
    report.speculation = stepper.into_speculation();
    // The prompt's end (recorded when its last token ran) joins the kept ones.
    seq.thin(MAX_CHECKPOINTS);
    Ok(report)
}

/// The prefill's pieces of `from..to`: at most `chunk` tokens each, also ending on every
/// multiple of [`TAIL_GRID`] within [`TAIL_SPAN`] of `to` (where checkpoints are recorded).
fn pieces(from: usize, to: usize, chunk: usize) -> Vec<(usize, usize)> {
    let grid_from = to.saturating_sub(TAIL_SPAN).max(from);
    let mut out = Vec::new();
    let mut start = from;
    while start < to {
        let mut end = (start + chunk).min(to);
        let next_grid = (start / TAIL_GRID + 1) * TAIL_GRID;
        if next_grid < end && next_grid >= grid_from {
            end = next_grid;
        }
        out.push((start, end));
        start = end;
    }
    out
}

/// The decode steps of one generation, plain or speculative: both hand out tokens in order;
/// speculation only changes how many arrive per model step, never which. (One per
/// generation: the size difference of its variants costs nothing.)
#[allow(clippy::large_enum_variant)]
enum Stepper<'a> {
    Plain(Generator<'a>),
    Spec {
        decoder: SpecDecoder<'a>,
        proposer: Box<dyn Proposer + 'a>,
        policy: DepthPolicy,
        /// Generated tokens already handed out.
        taken: usize,
    },
}

impl<'a> Stepper<'a> {
    /// Runs what `seq` lacks of `prompt` (its last token, after the driver's prefill) and
    /// gets ready to decode.
    fn start(
        model: &'a dyn LanguageModel,
        seq: &'a mut Sequence,
        prompt: &[u32],
        sampler: Sampler,
        chunk: usize,
        decode: Decode<'a>,
    ) -> Result<Self> {
        Ok(match decode {
            Decode::Plain => Stepper::Plain(Generator::new(model, seq, prompt, sampler, chunk)?),
            Decode::Speculative { proposer, policy } => Stepper::Spec {
                decoder: SpecDecoder::new(model, seq, prompt, sampler, chunk)?,
                proposer,
                policy,
                taken: 0,
            },
        })
    }

    /// The next tokens (none only when the context is full; at most `max` of them, cut after
    /// the first for which `is_stop` holds).
    fn next(&mut self, max: usize, is_stop: &dyn Fn(u32) -> bool) -> Result<Vec<u32>> {
        match self {
            Stepper::Plain(g) => Ok(vec![g.step()?]),
            Stepper::Spec {
                decoder,
                proposer,
                policy,
                taken,
            } => {
                if *taken == decoder.generated().len() {
                    decoder.step_with_policy(proposer.as_mut(), policy, max, is_stop)?;
                }
                let fresh = &decoder.generated()[*taken..];
                let n = fresh.len().min(max);
                let out = fresh[..n].to_vec();
                *taken += n;
                Ok(out)
            }
        }
    }

    /// Whether another token fits in the model's context.
    fn has_room(&self) -> bool {
        match self {
            Stepper::Plain(g) => g.has_room(),
            // The decoder checks its own room: a full context yields no tokens.
            Stepper::Spec { .. } => true,
        }
    }

    fn tokens(&self) -> &[u32] {
        match self {
            Stepper::Plain(g) => g.tokens(),
            Stepper::Spec { decoder, .. } => decoder.tokens(),
        }
    }

    fn into_speculation(self) -> Option<SpecReport> {
        match self {
            Stepper::Plain(_) => None,
            Stepper::Spec {
                decoder,
                proposer,
                policy,
                ..
            } => Some(SpecReport {
                proposer: proposer.name(),
                stats: decoder.stats,
                policy,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_chunks_that_also_end_on_the_tail_grid() {
        // 3,000 tokens in chunks of 512: the grid reaches back to 1,976, so it adds the
        // edges at 2,048, 2,304, 2,560 and 2,816 (2,048 and 2,560 are chunk edges already).
        let ends: Vec<usize> = pieces(0, 3000, 512).iter().map(|p| p.1).collect();
        assert_eq!(ends, [512, 1024, 1536, 2048, 2304, 2560, 2816, 3000]);
        // Contiguous from the restored prefix on, each at most a chunk.
        let p = pieces(700, 3000, 512);
        assert_eq!(p[0].0, 700);
        assert!(p.windows(2).all(|w| w[0].1 == w[1].0));
        assert!(p.iter().all(|(a, b)| b - a <= 512 && a < b));
        assert_eq!(p.last().unwrap().1, 3000);
        // A short prompt: the grid inside it, nothing else.
        let ends: Vec<usize> = pieces(0, 600, 512).iter().map(|p| p.1).collect();
        assert_eq!(ends, [256, 512, 600]);
        assert!(pieces(5, 5, 512).is_empty());
    }
}
