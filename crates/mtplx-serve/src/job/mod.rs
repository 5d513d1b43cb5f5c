//! The job and what travels with it: the leaf every stage of the cache path, the engine,
//! the metrics and the request log stand on (it imports none of them).
//!
//! A handler builds a [`Job`]; the session stage attaches its [`Resolved`] session, the
//! admission stage its [`Reservation`], the restore stage its [`RestoreOutcome`]; the
//! engine answers with [`Event`]s ending in a [`Summary`].

mod outcome;
mod request;
mod reservation;
mod restore;

pub use outcome::{prompt_hash, CacheSummary, EngineReply, Event, Finish, SpecSummary, Summary};
pub use request::{GenerationMode, Job, Resolved};
pub use reservation::Reservation;
pub use restore::RestoreOutcome;
