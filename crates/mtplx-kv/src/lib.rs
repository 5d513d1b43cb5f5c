//! KV-cache layouts for mtplx, behind one narrow trait.
//!
//! A model's attention writes keys and values through [`KvCache`] and asks the cache to
//! attend for a block of queries: the layout owns the attention over its own storage, so a
//! model never knows (or copies) how rows are laid out. A [`CacheFactory`] is how a caller
//! says which layout it wants; restores and conversions build through it, never through a
//! default.
//!
//! | layout | storage | snapshot / fork | use for |
//! | --- | --- | --- | --- |
//! | [`Contiguous`] | one growing buffer per layer | copies the rows | prefill, one sequence |
//! | [`Paged`] | fixed blocks from a shared [`BlockPool`] | shares blocks, copy-on-write | many sequences sharing prefixes |
//! | [`Segmented`] | shared immutable segments + a tail | shares segments, O(segments) | snapshot every turn |
//!
//! Every layout runs the one kernel in [`mtplx_kernels::attention`], which reduces keys in blocks aligned
//! to absolute positions: the output for a query is bit-identical whichever layout holds the
//! rows and however many queries are computed together. [`RecurrentState`] holds the
//! convolution and SSM state of hybrid models, with the same cheap snapshots; a [`Sequence`]
//! is what a model runs on: K/V in the caller's layout plus that state and its checkpoints
//! (none for an attention-only model).
//!
//! This crate must not know about models, tensor libraries, files or HTTP, and does no I/O:
//! it stores rows in the element type the caller chose ([`KvDtype`]: `f32`, `f16` or
//! `bf16`, rounded once when a row is appended) and does arithmetic on them.
//!
//! ```
//! use mtplx_kv::{CacheFactory, KvCache, KvShape, KvView};
//!
//! let shape = KvShape { layers: 1, kv_heads: 1, head_dim: 4 };
//! let mut cache = CacheFactory::contiguous().new_cache(shape);
//! // Two positions of one layer: K and V rows of `kv_heads * head_dim` values each.
//! let k = [1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0];
//! let v = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
//! cache.append(0, &k, &v).unwrap();
//! // One query (at the newest position) with one head.
//! let mut out = [0.0; 4];
//! cache.attend(0, &[0.0; 4], 1, 1.0, &mut out).unwrap();
//! assert_eq!(out, [3.0, 4.0, 5.0, 6.0]); // equal scores: the mean of the two values
//! assert_eq!(cache.len(), 2);
//!
//! // Convert to the segmented layout: same rows, same attention bits.
//! let segmented = CacheFactory::segmented();
//! let mut turn = segmented.restore(&*cache, cache.len()).unwrap();
//! let mut again = [0.0; 4];
//! turn.attend(0, &[0.0; 4], 1, 1.0, &mut again).unwrap();
//! assert_eq!(again, out);
//!
//! // A snapshot shares the segments; the cache keeps growing without touching it.
//! let snap = turn.snapshot();
//! turn.append(0, &[0.0; 4], &[0.0; 4]).unwrap();
//! assert_eq!((snap.len(), turn.len()), (2, 3));
//! // Restoring the snapshot in the same layout copies no rows.
//! let resumed = segmented.restore(&*snap, snap.len()).unwrap();
//! assert_eq!(resumed.unique_bytes(), 0);
//! ```

mod bytes;
mod cache;
mod check;
mod contiguous;
mod error;
mod factory;
mod lend;
mod paged;
mod recurrent;
mod segmented;
mod sequence;
mod shape;
mod share;

pub use bytes::BufferId;
pub use cache::{footprint, KvCache, KvView};
pub use contiguous::Contiguous;
pub use error::KvError;
pub use factory::{CacheFactory, DeviceCaches, Layout, MakeDeviceCache};
pub use lend::{staged_part, LentLayer, LentPiece, StagingBuffer};
pub use paged::{BlockPool, Paged, PoolStats};
pub use recurrent::{RecurrentLayerShape, RecurrentSnapshot, RecurrentState};
pub use segmented::Segmented;
pub use sequence::{
    retain_thinned, thin as thin_checkpoints, Checkpoint, CheckpointPolicy, Sequence, StateShape,
    MAX_CHECKPOINTS,
};
pub use shape::{KvShape, LayoutKind};
pub use share::ShareTarget;

/// The 16-bit element types (from the `half` crate), as stored.
pub use half::{bf16, f16};
pub use mtplx_kernels::elem::{KvDtype, KvElem, UnknownDtype};
