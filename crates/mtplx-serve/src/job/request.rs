//! [`Job`]: one generation to run, and what the cache path's stages attach to it.

use std::time::Instant;

use mtplx_bank::SessionId;
use mtplx_model::sampling::Sampler;

use super::reservation::Reservation;
use super::restore::RestoreOutcome;
use crate::session::locks::SessionGuard;
use crate::session::{SessionHint, SessionSource};

/// How a request wants its tokens produced (`generation_mode`); the tokens are the same
/// either way, only the speed differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GenerationMode {
    /// Speculative: draft, then verify in one forward pass (the default).
    #[default]
    Mtp,
    /// Plain autoregressive decoding, one token per forward pass.
    Ar,
}

impl GenerationMode {
    pub fn as_str(self) -> &'static str {
        match self {
            GenerationMode::Mtp => "mtp",
            GenerationMode::Ar => "ar",
        }
    }
}

/// One generation to run.
#[derive(Debug)]
pub struct Job {
    /// For the request log.
    pub request_id: String,
    /// The route that asked (`/v1/chat/completions`, ...), for the request log.
    pub endpoint: &'static str,
    /// Prompt token ids (never empty; the handler checked that they fit the context).
    pub prompt: Vec<u32>,
    pub sampler: Sampler,
    /// Most tokens to generate (at least 1).
    pub max_tokens: usize,
    /// Stop strings; the text before the first one is returned.
    pub stop: Vec<String>,
    /// Keep going past the model's end-of-turn tokens (benchmarks).
    pub ignore_eos: bool,
    pub mode: GenerationMode,
    /// The session the client named (header or body); `None` lets the cache path match one.
    pub session: Option<SessionHint>,
    /// Set by the session stage: the session this job runs and commits under.
    pub resolved: Option<Resolved>,
    /// Set by admission: memory held until the job is dropped.
    pub reservation: Option<Reservation>,
    /// Set by the restore stage: the restored cache and how it was found.
    pub restore: Option<RestoreOutcome>,
    /// When the request arrived: time to first token counts from here.
    pub received: Instant,
}

/// The session a job runs under, and its turn.
#[derive(Debug)]
pub struct Resolved {
    pub id: SessionId,
    pub source: SessionSource,
    /// Held until the job is dropped (after its commit).
    pub guard: SessionGuard,
}
