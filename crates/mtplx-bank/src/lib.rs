//! mtplx-bank: the RAM session bank.
//!
//! Keeps committed conversation states (a KV snapshot, the [`Continuation`] to decode on
//! from, recurrent [`Checkpoint`]s for hybrid models) keyed by their exact tokens and an
//! [`Identity`] (model, chat template, MTP, policy), so a state is never reused under
//! another identity. [`Bank::lookup`] gathers candidates from every source (RAM exact,
//! near and block prefixes; the SSD tier's exact and block prefixes through
//! [`mtplx_cold::ColdIndex`], from its manifest) and picks the one that restores the most
//! prompt tokens before any tensor is read: ties go to RAM, then to exact matches. The
//! [`Plan`] it returns owns only the winner; [`Plan::restore`] consumes it and builds the
//! request's cache through the caller's [`CacheFactory`](mtplx_kv::CacheFactory), RAM and
//! SSD alike. Every lookup has an [`Explanation`] with the original's names (`clone`,
//! `ssd_clone`, `new_session`, `ssd_prefix_boundary_below_floor`, …).
//!
//! Budgets ([`BankConfig`]): bytes in total and per session, entries in total and per
//! session, idle TTL. Eviction takes entries superseded by a longer entry of their session
//! first, then the least recently used, idle sessions before active ones, and spills each
//! to the SSD tier (write-behind). [`Bank::admit`] sheds entries before refusing a request
//! that does not fit the memory limit, and refuses without shedding when shedding can't
//! help.
//!
//! A restore never covers the whole prompt unless it also hands back the stored
//! continuation (the logits at the prompt's last token); otherwise it stops one token (or
//! one checkpoint) short, so the prefill produces the logits.
//!
//! It knows nothing of HTTP, tokio, the model, or how the SSD tier lays out its files.
//!
//! ```
//! use std::sync::Arc;
//! use mtplx_bank::{Bank, BankConfig, Commit, Continuation, LookupQuery, SessionId};
//! use mtplx_cold::{Identity, Mtp};
//! use mtplx_kv::{CacheFactory, KvDtype, KvShape, StateShape};
//!
//! let shape = KvShape { layers: 1, kv_heads: 1, head_dim: 2 };
//! let identity = Identity {
//!     model: "m".into(), chat_template: "t".into(), mtp: Mtp::Off, policy: "p".into(),
//!     kv_dtype: mtplx_bank::cold_dtype(KvDtype::F32),
//! };
//! // A finished turn: 3 tokens in a cache.
//! let mut cache = CacheFactory::contiguous().new_cache(shape);
//! cache.append(0, &[0.0; 6], &[1.0; 6]).unwrap();
//! let bank = Bank::new(BankConfig::for_machine(16 << 30));
//! bank.commit(Commit {
//!     session: SessionId::new("chat-1"),
//!     identity: identity.clone(),
//!     tokens: vec![7, 8, 9],
//!     kv: cache.snapshot(),
//!     continuation: Some(Continuation { logits: vec![0.1, 0.9], ..Default::default() }),
//!     checkpoints: None,
//! }).unwrap();
//!
//! // The next turn's prompt extends it: restore 3 tokens, prefill the other 2.
//! let prompt = [7, 8, 9, 10, 11];
//! let plan = bank.lookup(&LookupQuery {
//!     identity: &identity, prompt: &prompt, session: None, floor: 0,
//! });
//! assert_eq!(plan.mode().as_str(), "clone");
//! let restored = plan.restore(&CacheFactory::paged(), &StateShape::attention_only(shape)).unwrap();
//! assert_eq!(restored.prefix_len(), 3);
//! assert_eq!(restored.sequence.kv().layout(), mtplx_kv::LayoutKind::Paged);
//! ```

mod admission;
mod bank;
mod candidate;
mod checkpoints;
mod clock;
mod config;
mod convert;
mod durability;
mod entry;
mod error;
mod explain;
mod lookup;
mod matching;
mod plan;
mod session;
mod shared;
mod sink;
mod spill;
mod ssd;
mod state;
mod stats;
mod store;
mod sync;

pub use admission::{Admitted, MemoryEstimate, Refusal, RefusalKind, RetryWhen};
pub use candidate::CandidateWatch;
pub use checkpoints::{thin as thin_checkpoints, MAX_CHECKPOINTS};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{BankConfig, Matching, DEFAULT_IDLE_WRITE};
pub use convert::cold_dtype;
pub use durability::{BankEvent, FlushReport, Observer, SpillFailure, SpillOutcome, SpillsDone};
pub use error::BankError;
pub use explain::{Explanation, LogValue, MissReason, RefusalReason, Refused, RestoreMode, Source};
pub use lookup::LookupQuery;
pub use mtplx_cold::{
    physical_ram, ColdConfig, Identity, Mtp, ReadPath, RestoreReport, Space, Usage, WriteStats,
};
pub use plan::{Plan, Restored};
pub use session::SessionId;
pub use shared::{Bank, CommitReport, SsdAccess};
pub use ssd::{SsdError, SsdSetup, SsdStatus};
pub use state::{Checkpoint, Commit, Continuation};
pub use stats::{SessionInfo, Stats};
