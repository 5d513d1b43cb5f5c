//! Byte encodings of everything stored: blob headers, state payloads and manifest records.
//! Every decoder takes untrusted bytes and returns an error, never panics (fuzzed in
//! `fuzz/` and by `tests/decode_garbage.rs`). The layouts are in `docs/cold-format.md`.

pub mod blob;
mod bytes;
mod error;
pub mod record;
pub mod state;

pub use blob::{BlobHeader, BlobKind, Descriptor, StateRole, HEADER_LEN, MAGIC};
pub(crate) use bytes::{put_str, put_u32, put_u64, Reader};
pub use error::DecodeError;
pub use record::{CheckpointRef, EntryBody, EntryHead, StateRef};
pub use state::StateBundle;
