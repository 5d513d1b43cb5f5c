//! mtplx-spec: speculative decoding whose output is exactly the model's own.
//!
//! A [`Proposer`] guesses the next few tokens (prompt lookup, a draft model, the trunk's
//! own MTP head fed with its hidden states); [`SpecDecoder`] runs the newest token and the
//! draft through the model in one forward pass (k + 1 rows), keeps the longest acceptable prefix plus one token of the
//! model's own, and trims the KV cache back to what was kept. A [`DepthPolicy`] decides how
//! far to draft. [`drive`] is the one generation loop (chunked, cancellable prefill feeding
//! the proposer; plain or speculative steps; stops; timing) the server, the examples and
//! the benches run.
//!
//! This crate must not know HTTP, sessions, the bank or the SSD tier.
//!
//! ```
//! use mtplx_spec::{Proposer, DraftContext, PromptLookup};
//!
//! // "… the cat sat … the cat" drafts "sat".
//! let mut lookup = PromptLookup::default();
//! let tokens = [5, 6, 7, 9, 5, 6];
//! let draft = lookup.propose(&DraftContext { tokens: &tokens, max_len: 1 }).unwrap();
//! assert_eq!(draft.tokens, [7]);
//! ```

mod decoder;
mod draft_model;
mod driver;
mod error;
mod lookup;
mod mtp;
mod policy;
mod proposer;
mod stats;

pub use decoder::{generate, PromptHidden, SpecDecoder, StepOutcome};
pub use draft_model::{DraftModel, DraftSampling};
pub use driver::{
    drive, Collect, Decode, End, Observer, Report, Request, SpecReport, TAIL_GRID, TAIL_SPAN,
};
pub use error::{Result, SpecError};
pub use lookup::PromptLookup;
pub use mtp::{LookupThenMtp, MtpProposer};
pub use policy::{Acceptance, DepthPolicy};
pub use proposer::{Draft, DraftContext, DraftSource, Proposer, TrunkRows};
pub use stats::SpecStats;
