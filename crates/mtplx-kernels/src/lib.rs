//! mtplx-kernels: the CPU kernels every layout and model runs on, on one thread [`Pool`]
//! (`MTPLX_THREADS`), so matrix products and attention never compete for cores:
//! - [`attention`]: causal attention over rows any KV layout supplies ([`attention::RowSource`]),
//!   reduced in blocks aligned to absolute positions, so its bits do not depend on the layout,
//!   the number of queries computed together or the thread count;
//! - the matrix kernels ([`QuantMatrix`]), below.
//!
//! It knows nothing of models, tensor libraries, files or HTTP.
//!
//! # Matrix kernels
//! CPU matrix kernels over weights kept in their GGUF format: `y = x Wᵀ` for `W` in Q4_0,
//! Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16 or F32, with `f32` activations; and
//! for Q8_0, Q5_0, Q4_0, Q4_1, Q4_K and Q6_K also with activations rounded to 8 bits
//! ([`Activations::Q8`], the `q8` module: integer dot products, `vpdpbusd` on AVX-512 VNNI),
//! a choice made when the matrix is built.
//!
//! # Numerics contract
//! Every output is one sequential fused multiply-add chain over the inputs, in input order:
//!
//! ```text
//! y[r][o] = fma(w[o][cols-1], x[r][cols-1], … fma(w[o][1], x[r][1], fma(w[o][0], x[r][0], 0.0)))
//! ```
//!
//! where `w` is the weight exactly as ggml dequantizes it (bit for bit, see `layout.rs`). So:
//! - a row's result does not depend on how many rows are computed with it (a decode step of
//!   1, a verify block of k+1, a prefill chunk of any size), nor on the thread split, nor on
//!   the instruction set (AVX-512, AVX2, NEON and the portable code all fuse the
//!   multiply-add): the same bits on every path of one machine, and across x86 machines
//!   (NEON is compile-checked only so far);
//! - a quantized matrix and the dense `f32` matrix of its dequantized weights
//!   ([`QuantMatrix::from_f32`]) give the same bits;
//! - the error against exact arithmetic is that of an `f32` dot product: at most about
//!   `cols × 2⁻²⁴ × Σ|w x|`. Activations are not quantized (ggml rounds them to 8 bits,
//!   which moved this project's default model's logits by up to 1.4).
//!
//! An [`Activations::Q8`] matrix has its own contract (the `q8` module's docs): each row
//! of `x` rounded per block, integer sums (exact, so in any order), one `f32` step per block
//! in input order. Its rows are batch-invariant and the same bits on every instruction set
//! as above; its numbers are those of the rounded activations.
//!
//! # Layout and speed
//! Weights are repacked at load into tiles of 16 output rows (`layout.rs`): one vector holds
//! one input's weight for 16 rows, so a kernel broadcasts `x[r][i]` and accumulates 16
//! outputs per fused multiply-add, with no horizontal sums and no rounding order to choose.
//! The stored size equals the file's (Q4_K: +2.8%, its 6-bit scales unpacked to bytes).
//!
//! Decode (`n = 1`) streams each weight once; prefill passes over a tile's weights once per
//! 16 rows of `x` (dequantizing in registers; the 16 rows are interleaved into a per-thread
//! buffer first), so it is bound by the fused multiply-adds, not by memory. Work is split
//! over threads by output tiles on a persistent [`Pool`]. A product allocates nothing once
//! each thread's buffer has grown to 16 rows.

pub mod attention;
pub mod elem;
mod format;
mod isa;
mod kernel;
mod layout;
mod matrix;
/// Bench-only kernels that give up batch invariance (see `benches/invariance_cost.rs` in
/// `mtplx-model`); compiled only with the `bench` feature.
#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod non_invariant;
pub mod pool;
mod q8;
mod simd;

pub use elem::{KvDtype, KvElem};
pub use format::{QuantFormat, TILE};
pub use isa::Isa;
pub use matrix::{QuantMatrix, QuantMatrixError};
pub use pool::{Pool, DEFAULT_SPIN};
pub use q8::Activations;
