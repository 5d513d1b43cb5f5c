//! The one path from a handler to the engine: check the prompt against the context window
//! and queue the job; its events come back to [`super::drive`].

use mtplx_model::sampling::Sampler;
use tokio::sync::mpsc;
use tower::ServiceExt;

use super::extras::RequestExtras;
use super::RequestCtx;
use crate::error::ApiError;
use crate::job::{Event, Job};
use crate::state::AppState;

/// A generation as an endpoint asks for it.
#[derive(Debug)]
pub struct Generation {
    pub prompt: Vec<u32>,
    pub sampler: Sampler,
    /// `None`: until the context window is full.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// `generation_mode` and the body's session hints.
    pub extras: RequestExtras,
}

/// Checks `g` and queues it. A prompt that leaves no room for one new token is a 400
/// `context_length_exceeded`; `max_tokens` beyond the room left is capped to it.
pub async fn submit(
    state: &AppState,
    ctx: &RequestCtx,
    endpoint: &'static str,
    g: Generation,
) -> Result<mpsc::Receiver<Event>, ApiError> {
    let context = state.context_window();
    if g.prompt.is_empty() {
        return Err(ApiError::bad_request("The prompt is empty."));
    }
    let vocab = state.bundle().tokenizer.vocab_size();
    if let Some(bad) = g.prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::invalid_param(
            "prompt",
            format!("Token id {bad} is outside the vocabulary of {vocab}."),
        ));
    }
    if g.prompt.len() >= context {
        return Err(ApiError::context_length_exceeded(g.prompt.len(), context));
    }
    let room = context - g.prompt.len();
    let mode = g.extras.mode()?;
    // A header names the session first; the body next; the engine matches the rest.
    let session = ctx.session.clone().or_else(|| g.extras.session());
    let job = Job {
        request_id: ctx.request_id.clone(),
        endpoint,
        prompt: g.prompt,
        sampler: g.sampler,
        max_tokens: g.max_tokens.map_or(room, |m| m.min(room)),
        stop: g.stop,
        ignore_eos: g.ignore_eos,
        mode,
        session,
        received: ctx.received,
        resolved: None,
        reservation: None,
        restore: None,
    };
    state.pipeline().oneshot(job).await
}
