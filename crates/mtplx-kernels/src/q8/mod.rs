//! 8-bit activations: the products of [`Activations::Q8`] matrices.
//!
//! Each row of `x` is rounded once per product, per block of inputs, as ggml's x86
//! quantizers do: `amax` the block's largest magnitude, scale `d = amax / 127` (stored as
//! an f16 for the 32-input formats, Q8_0's activations; as an `f32` for the K-quants, Q8_K's),
//! `q = round-half-even(x × (127 / amax))` (0 where `amax` is 0). The weights' integers are
//! multiplied by those `q` in exact integer arithmetic (`vpdpbusd` on AVX-512 VNNI), and
//! each GGUF block adds `float(Σ) × (d_w × d_x)` to the output with one fused multiply-add
//! (the K-quants' mins a second one), in input order.
//!
//! So a row's result is the same bits whatever rows share the product, however the tiles
//! are split over threads and on every instruction set (integer sums are exact; the `f32`
//! steps are one fixed sequence per output): batch invariance holds as for the `f32`
//! products. What changes is the arithmetic: the activations are rounded (a relative error
//! of up to 1/254 of the block's largest value per input), as llama.cpp's CPU backend rounds
//! them for every quantized format.

mod kernel;
mod ops;
pub(crate) mod pack;
#[cfg(test)]
mod tests;

use std::cell::UnsafeCell;
use std::ops::Range;

pub(crate) use kernel::Job8;

use crate::format::QuantFormat;
use crate::isa::Isa;
use crate::pool::Pool;
use crate::simd::scalar::Scalar;
#[cfg(target_arch = "x86_64")]
use crate::simd::x86::{Avx2, Avx512};

/// What a matrix's products do with their activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Activations {
    /// Used as they are, `f32`: the crate's numerics contract.
    #[default]
    F32,
    /// Rounded to 8 bits per block and multiplied with the weights' integers exactly (see
    /// the [module docs](self)). Only Q8_0, Q5_0, Q4_0, Q4_1, Q4_K and Q6_K have such
    /// kernels; a matrix of another format keeps [`Activations::F32`].
    Q8,
}

impl Activations {
    /// The activations a matrix of `format` gets when `self` is asked for.
    pub fn for_format(self, format: QuantFormat) -> Activations {
        match self {
            Activations::Q8 if pack::tile_block_bytes(format).is_some() => Activations::Q8,
            _ => Activations::F32,
        }
    }
}

/// A kernel: the product over a range of output tiles.
pub(crate) type Kernel8 = unsafe fn(&Job8, Range<usize>);

unsafe fn portable<F: kernel::Fmt8>(job: &Job8, tiles: Range<usize>) {
    kernel::run::<Scalar, F>(job, tiles)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2<F: kernel::Fmt8>(job: &Job8, tiles: Range<usize>) {
    kernel::run::<Avx2, F>(job, tiles)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn avx512<F: kernel::Fmt8>(job: &Job8, tiles: Range<usize>) {
    kernel::run::<Avx512, F>(job, tiles)
}

/// Whether the AVX-512 8-bit kernels run here (they need BW and VNNI besides F).
#[cfg(target_arch = "x86_64")]
fn vnni() -> bool {
    is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vnni")
}

/// The kernel for `format` on `isa` (AVX-512 without VNNI runs the AVX2 one; NEON the
/// portable one), or `None` if this CPU lacks `isa` or `format` has no 8-bit kernel.
pub(crate) fn kernel(isa: Isa, format: QuantFormat) -> Option<Kernel8> {
    macro_rules! by_format {
        ($entry:ident) => {
            match format {
                QuantFormat::Q8_0 => $entry::<kernel::Q8_0> as Kernel8,
                QuantFormat::Q5_0 => $entry::<kernel::Q5_0>,
                QuantFormat::Q4_0 => $entry::<kernel::Q4_0>,
                QuantFormat::Q4_1 => $entry::<kernel::Q4_1>,
                QuantFormat::Q4K => $entry::<kernel::Q4K>,
                QuantFormat::Q6K => $entry::<kernel::Q6K>,
                _ => return None,
            }
        };
    }
    if !isa.runs_here() {
        return None;
    }
    Some(match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 if vnni() => by_format!(avx512),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512 => by_format!(avx2),
        _ => by_format!(portable),
    })
}

/// `x` rounded for one product (see [`Job8`]).
#[derive(Default)]
pub(crate) struct Rounded {
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    pub s16: Vec<i32>,
}

thread_local! {
    /// The calling thread's rounded activations, reused across products.
    static ROUNDED: UnsafeCell<Rounded> = UnsafeCell::new(Rounded::default());
}

/// Rounds `x` (`n × cols`) in blocks of `xblock` into the calling thread's buffer and calls
/// `f` with it. `f16` rounds each scale to an f16 (Q8_0's activations). Many rows are split
/// over `pool` by rows; each row is rounded on its own, so the split changes nothing.
pub(crate) fn with_rounded<T>(
    pool: &Pool,
    x: &[f32],
    cols: usize,
    xblock: usize,
    f16: bool,
    f: impl FnOnce(&Rounded) -> T,
) -> T {
    ROUNDED.with(|cell| {
        // SAFETY: only this thread touches its buffer, and `f` cannot reach it.
        let buf = unsafe { &mut *cell.get() };
        let n = x.len() / cols;
        buf.qs.resize(x.len(), 0);
        buf.d.resize(n * (cols / xblock), 0.0);
        buf.s16.resize(x.len() / 16, 0);
        // Below this many values a second thread costs more to wake than it saves.
        const MIN_VALUES_PER_PART: usize = 1 << 15;
        let parts = pool
            .threads()
            .min(n)
            .min(x.len() / MIN_VALUES_PER_PART)
            .max(1);
        if parts == 1 {
            round(x, xblock, f16, &mut buf.qs, &mut buf.d, &mut buf.s16);
        } else {
            let out = Parts {
                qs: buf.qs.as_mut_ptr(),
                d: buf.d.as_mut_ptr(),
                s16: buf.s16.as_mut_ptr(),
            };
            let (dn, sn) = (cols / xblock, cols / 16);
            // The whole `Parts` (which is `Sync`) is captured, not its pointer fields.
            let out = &out;
            pool.run(parts, &|p| {
                let rows = n * p / parts..n * (p + 1) / parts;
                let len = rows.len();
                // SAFETY: the parts' row ranges are disjoint, so are their slices of the
                // buffers, which outlive `run`.
                unsafe {
                    round(
                        &x[rows.start * cols..rows.end * cols],
                        xblock,
                        f16,
                        std::slice::from_raw_parts_mut(out.qs.add(rows.start * cols), len * cols),
                        std::slice::from_raw_parts_mut(out.d.add(rows.start * dn), len * dn),
                        std::slice::from_raw_parts_mut(out.s16.add(rows.start * sn), len * sn),
                    )
                }
            });
        }
        f(buf)
    })
}

/// The buffers of [`Rounded`], shared by the parts of one rounding.
struct Parts {
    qs: *mut i8,
    d: *mut f32,
    s16: *mut i32,
}

// SAFETY: each part writes only its own rows (see `with_rounded`).
unsafe impl Sync for Parts {}

/// [`round_rows`] compiled for the best instruction set here (the same operations, so the
/// same bits, on each).
fn round(x: &[f32], xblock: usize, f16: bool, qs: &mut [i8], d: &mut [f32], s16: &mut [i32]) {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
        unsafe fn avx512(x: &[f32], b: usize, h: bool, q: &mut [i8], d: &mut [f32], s: &mut [i32]) {
            round_rows(x, b, h, q, d, s)
        }
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn avx2(x: &[f32], b: usize, h: bool, q: &mut [i8], d: &mut [f32], s: &mut [i32]) {
            round_rows(x, b, h, q, d, s)
        }
        match Isa::detect() {
            // SAFETY: the CPU has the features each entry enables.
            Isa::Avx512 if is_x86_feature_detected!("avx512bw") => unsafe {
                return avx512(x, xblock, f16, qs, d, s16);
            },
            Isa::Avx512 | Isa::Avx2 => unsafe { return avx2(x, xblock, f16, qs, d, s16) },
            _ => {}
        }
    }
    round_rows(x, xblock, f16, qs, d, s16)
}

/// The rounding of the [module docs](self), block by block.
#[inline(always)]
fn round_rows(x: &[f32], xblock: usize, f16: bool, qs: &mut [i8], d: &mut [f32], s16: &mut [i32]) {
    for (b, (xs, qs)) in x
        .chunks_exact(xblock)
        .zip(qs.chunks_exact_mut(xblock))
        .enumerate()
    {
        // The largest magnitude as bits: non-negative floats order as their bits do.
        let amax = f32::from_bits(xs.iter().fold(0, |m, v| m.max(v.to_bits() & 0x7FFF_FFFF)));
        let (scale, id) = if amax == 0.0 {
            (0.0, 0.0)
        } else {
            let scale = amax / 127.0;
            let scale = if f16 {
                half::f16::from_f32(scale).to_f32()
            } else {
                scale
            };
            (scale, 127.0 / amax)
        };
        d[b] = scale;
        for (q, v) in qs.iter_mut().zip(xs) {
            *q = (v * id).round_ties_even() as i8;
        }
        for (s, q16) in s16[b * xblock / 16..].iter_mut().zip(qs.chunks_exact(16)) {
            *s = q16.iter().map(|&q| i32::from(q)).sum();
        }
    }
}
