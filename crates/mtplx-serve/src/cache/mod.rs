//! The cache path in front of the engine: session resolution, admission, restore. Each is
//! a tower layer over [`Job`]s, so a tier can be reused, reordered or
//! tested alone; [`Pipeline`] stacks them around the [`Engine`](crate::engine::Engine):
//!
//! ```text
//! handler ─ Job ─▶ SessionStep ─▶ AdmissionStep ─▶ RestoreStep ─▶ Engine ─▶ events
//! ```
//!
//! - [`session`]: names the conversation (header, body, longest prefix match, or a new
//!   `anon-…` id) and holds that session's lock until its job is done, so one session's
//!   requests run one at a time, in order, each seeing the previous one's commit.
//! - [`admission`]: estimates the request's peak memory and asks the bank to shed entries
//!   before refusing with HTTP 507 (`refusal_reason`, `retry_when`).
//! - [`restore`]: asks the bank for the state that covers most of the prompt (RAM or SSD,
//!   ranked from metadata) and builds it into a cache in the engine's layout, off the
//!   engine thread.
//!
//! After the generation the engine commits the conversation (prompt and answer) to the
//! bank under the session, cancelled or not.

pub mod admission;
pub mod restore;
pub mod session;
pub mod stage;
pub mod tier;

pub use tier::{CacheTier, SsdMode, TierConfig, DEFAULT_MIN_PREFIX_TOKENS};

use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceBuilder};

use crate::error::ApiError;
use crate::job::{EngineReply, Job};

/// The whole cache path around the engine, as one cloneable service.
pub type Pipeline = BoxCloneSyncService<Job, EngineReply, ApiError>;

/// Stacks session → admission → restore around `engine` (the service that runs a job).
pub fn pipeline<E>(tier: &CacheTier, engine: E) -> Pipeline
where
    E: Service<Job, Response = EngineReply, Error = ApiError> + Clone + Send + Sync + 'static,
    E::Future: Send + 'static,
{
    BoxCloneSyncService::new(
        ServiceBuilder::new()
            .layer(session::SessionStep::layer(tier.clone()))
            .layer(admission::AdmissionStep::layer(tier.clone()))
            .layer(restore::RestoreStep::layer(tier.clone()))
            .service(engine),
    )
}
