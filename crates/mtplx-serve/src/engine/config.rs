//! What an engine is started with ([`EngineConfig`]) and the signal that stops its
//! generations ([`StopSignal`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::speculation::Speculation;

/// Engine settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Most positions (prompt plus generated) a generation may use.
    pub context_window: usize,
    /// Prompt tokens per prefill forward pass.
    pub prefill_chunk_tokens: usize,
    /// Jobs that may wait for the engine; one more is refused with a 503.
    pub queue_capacity: usize,
    /// Drafting for requests in `mtp` mode.
    pub speculation: Speculation,
}

/// Set when the server stops: the running generation and every later one end at their
/// next step (a prefill chunk or a decode step), commit what they have, and fail with
/// "the server is shutting down".
#[derive(Debug, Clone, Default)]
pub struct StopSignal(Arc<AtomicBool>);

impl StopSignal {
    pub fn stop(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_stopped(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}
