//! One token source for the worker, plain or speculative: both prefill the part of the
//! prompt the cache lacks, then hand out tokens in order. Speculation only changes how many
//! arrive per model step, never which (mtplx-spec verifies every draft against the model).

use std::path::PathBuf;
use std::sync::Arc;

use mtplx_kv::{CacheFactory, KvCache};
use mtplx_model::mtp::MtpHead;
use mtplx_model::sampling::Sampler;
use mtplx_model::{Generator, LanguageModel};
use mtplx_spec::{
    DepthPolicy, DraftSampling, LookupThenMtp, MtpProposer, PromptLookup, Proposer, SpecDecoder,
    SpecStats,
};

use super::error::EngineError;
use crate::job::GenerationMode;

/// How the engine speculates when a request asks for `generation_mode: "mtp"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Speculation {
    /// Most draft tokens per verify step; 0 turns speculation off for every request.
    pub depth: usize,
    pub policy: PolicyKind,
    /// The MTP head drafting for the model (`--mtp-head`): with one, requests draft by
    /// prompt lookup when the context repeats itself and by the head otherwise; without,
    /// by prompt lookup alone.
    pub head: Option<PathBuf>,
}

impl Default for Speculation {
    fn default() -> Self {
        Speculation {
            depth: 3,
            policy: PolicyKind::None,
            head: None,
        }
    }
}

/// The drafting proposer of one generation, or `None` for plain decoding.
pub(super) fn proposer<'a>(
    model: &'a dyn LanguageModel,
    head: Option<&Arc<MtpHead>>,
    mode: GenerationMode,
    spec: &Speculation,
) -> Option<Box<dyn Proposer + 'a>> {
    if mode == GenerationMode::Ar || spec.depth == 0 {
        return None;
    }
    Some(match head {
        // Greedy drafts: at any temperature the model's own token is drawn as plain
        // decoding would draw it, so a seeded request gives the same tokens either way.
        Some(head) => Box::new(LookupThenMtp::new(MtpProposer::new(
            model,
            head.clone(),
            &CacheFactory::contiguous(),
            DraftSampling::Greedy,
        ))),
        None => Box::new(PromptLookup::default()),
    })
}

/// The adaptive depth policy (`--adaptive-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PolicyKind {
    /// Always draft `depth` tokens.
    #[default]
    None,
    Streak,
    ExpectedValue,
    Cost,
}

impl PolicyKind {
    fn build(self, depth: usize) -> DepthPolicy {
        match self {
            PolicyKind::None => DepthPolicy::fixed(depth),
            // Adaptive policies learn per draft source: prompt lookup's copies and the MTP
            // head's guesses differ in acceptance and in cost.
            PolicyKind::Streak => DepthPolicy::by_source(DepthPolicy::Streak { depth, max: depth }),
            PolicyKind::ExpectedValue => DepthPolicy::by_source(DepthPolicy::ExpectedValue(
                mtplx_spec::Acceptance::with_priors(depth),
            )),
            PolicyKind::Cost => DepthPolicy::by_source(DepthPolicy::cost(depth)),
        }
    }
}

/// A generation in progress.
pub(super) enum Decoding<'a> {
    Plain(Generator<'a>),
    Spec {
        decoder: SpecDecoder<'a>,
        proposer: Box<dyn Proposer + 'a>,
        policy: DepthPolicy,
        /// Generated tokens already handed out.
        taken: usize,
    },
}

impl<'a> Decoding<'a> {
    /// Prefills what `cache` lacks of `prompt` (the cache must hold a prefix of it), then
    /// decodes plainly, or speculates with `proposer` (from [`proposer`]).
    pub fn start(
        model: &'a dyn LanguageModel,
        cache: &'a mut dyn KvCache,
        prompt: &[u32],
        sampler: Sampler,
        chunk: usize,
        proposer: Option<Box<dyn Proposer + 'a>>,
        spec: &Speculation,
    ) -> Result<Self, EngineError> {
        let Some(proposer) = proposer else {
            return Ok(Decoding::Plain(Generator::new(
                model, cache, prompt, sampler, chunk,
            )?));
        };
        Ok(Decoding::Spec {
            decoder: SpecDecoder::new(model, cache, prompt, sampler, chunk)?,
            proposer,
            policy: spec.policy.build(spec.depth),
            taken: 0,
        })
    }

    /// The next tokens (none only when the context is full; at most `max` of them,
    /// cut after the first for which `is_stop` holds).
    pub fn next(
        &mut self,
        max: usize,
        is_stop: &dyn Fn(u32) -> bool,
    ) -> Result<Vec<u32>, EngineError> {
        match self {
            Decoding::Plain(g) => Ok(vec![g.step()?]),
            Decoding::Spec {
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
    pub fn has_room(&self) -> bool {
        match self {
            Decoding::Plain(g) => g.has_room(),
            // The decoder checks its own room: a full context yields no tokens.
            Decoding::Spec { .. } => true,
        }
    }

    /// Prompt and generated tokens so far.
    pub fn tokens(&self) -> &[u32] {
        match self {
            Decoding::Plain(g) => g.tokens(),
            Decoding::Spec { decoder, .. } => decoder.tokens(),
        }
    }

    /// What speculation did (`None` for plain decoding).
    pub fn stats(&self) -> Option<(&'static str, &SpecStats)> {
        match self {
            Decoding::Plain(_) => None,
            Decoding::Spec {
                decoder, proposer, ..
            } => Some((proposer.name(), &decoder.stats)),
        }
    }
}
