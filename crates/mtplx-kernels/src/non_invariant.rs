//! For measuring the cost of invariance only (`benches/invariance_cost.rs`); nothing in
//! the product calls it.
//!
//! The product kernels reduce every output as one fused multiply-add chain in input order
//! (see the numerics contract in [`super`]). The variant here splits that chain into `P`
//! independent partial chains (input `i` goes to chain `i mod P`) and adds them pairwise at
//! the end: twice or four times the independent accumulators, so the FMA latency hides
//! behind fewer output tiles. Its bits differ from the invariant kernel's, so a decode step
//! and a prefill chunk could each pick their fastest `P` only by giving up invariance.
//!
//! [`matmul_wide_rows`] is the control: the product's own order (same bits) and blocking at
//! one row (8 tiles per pass; the product took 4 when it was written), through this
//! module's code.

use std::cell::UnsafeCell;
use std::ops::Range;

use crate::format::{QuantFormat, TILE};
use crate::isa::Kernel;
use crate::kernel::Job;
use crate::layout::{self, Layout, Sink};
use crate::pool::Pool;
use crate::simd::scalar::Scalar;
#[cfg(target_arch = "x86_64")]
use crate::simd::x86::{Avx2, Avx512};
use crate::simd::Simd;
use crate::QuantMatrix;

/// `out[n, rows] = x[n, cols] · Wᵀ` with `chains` (2 or 4) partial chains per output, on
/// the global pool and the fastest instruction set. Q4_0, Q4_1 and Q8_0 only.
///
/// NOT batch-invariant in the sense of the product: its bits differ from
/// [`QuantMatrix::matmul`]'s.
///
/// # Panics
/// If the shapes are wrong, `chains` is not 2 or 4, or the format is not supported.
pub fn matmul_split_chains(m: &QuantMatrix, chains: usize, x: &[f32], n: usize, out: &mut [f32]) {
    assert_eq!(x.len(), n * m.cols(), "x must be n × cols");
    assert_eq!(out.len(), n * m.rows(), "out must be n × rows");
    if n == 0 {
        return;
    }
    let kernel = split_kernel(m.format(), chains)
        .unwrap_or_else(|| panic!("no split kernel for {:?} × {chains}", m.format()));
    // SAFETY: `split_kernel` picked the format's layout and an instruction set this CPU has.
    unsafe { m.run_kernel(Pool::global(), kernel, x, n, out) }
}

/// [`QuantMatrix::matmul`]'s own order (one chain per output, so the same bits), with 8
/// output tiles per pass over a single row of `x`: as many independent accumulators as two
/// chains give, without changing any reduction. Q4_0, Q4_1 and Q8_0.
///
/// # Panics
/// If the shapes are wrong or the format is not supported.
pub fn matmul_wide_rows(m: &QuantMatrix, x: &[f32], n: usize, out: &mut [f32]) {
    assert_eq!(x.len(), n * m.cols(), "x must be n × cols");
    assert_eq!(out.len(), n * m.rows(), "out must be n × rows");
    if n == 0 {
        return;
    }
    let kernel = split_kernel(m.format(), 1)
        .unwrap_or_else(|| panic!("no wide kernel for {:?}", m.format()));
    // SAFETY: `split_kernel` picked the format's layout and an instruction set this CPU has.
    unsafe { m.run_kernel(Pool::global(), kernel, x, n, out) }
}

fn split_kernel(format: QuantFormat, chains: usize) -> Option<Kernel> {
    macro_rules! pick {
        ($L:ty, $P:literal) => {{
            #[cfg(target_arch = "x86_64")]
            {
                if is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
                {
                    return Some(avx512::<$L, $P> as Kernel);
                }
                if is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
                {
                    return Some(avx2::<$L, $P> as Kernel);
                }
            }
            Some(portable::<$L, $P> as Kernel)
        }};
    }
    match (format, chains) {
        (QuantFormat::Q4_0, 1) => pick!(layout::Q4_0, 1),
        (QuantFormat::Q4_1, 1) => pick!(layout::Q4_1, 1),
        (QuantFormat::Q8_0, 1) => pick!(layout::Q8_0, 1),
        (QuantFormat::Q4_0, 2) => pick!(layout::Q4_0, 2),
        (QuantFormat::Q4_0, 4) => pick!(layout::Q4_0, 4),
        (QuantFormat::Q4_1, 2) => pick!(layout::Q4_1, 2),
        (QuantFormat::Q4_1, 4) => pick!(layout::Q4_1, 4),
        (QuantFormat::Q8_0, 2) => pick!(layout::Q8_0, 2),
        (QuantFormat::Q8_0, 4) => pick!(layout::Q8_0, 4),
        _ => None,
    }
}

unsafe fn portable<L: Layout, const P: usize>(job: &Job, tiles: Range<usize>) {
    run::<Scalar, L, P>(job, tiles)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2<L: Layout, const P: usize>(job: &Job, tiles: Range<usize>) {
    run::<Avx2, L, P>(job, tiles)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn avx512<L: Layout, const P: usize>(job: &Job, tiles: Range<usize>) {
    run::<Avx512, L, P>(job, tiles)
}

/// `P` partial accumulators for each of `C` tiles × `R` rows.
struct Acc<S: Simd, const C: usize, const R: usize, const P: usize> {
    acc: [[[S::V; R]; C]; P],
    x: *const f32,
}

impl<S: Simd, const C: usize, const R: usize, const P: usize> Sink<S, C> for Acc<S, C, R, P> {
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn take(&mut self, i: usize, w: &[S::V; C]) {
        let p = i % P;
        for r in 0..R {
            let xv = S::splat(*self.x.add(i * R + r));
            for c in 0..C {
                self.acc[p][c][r] = S::fma(w[c], xv, self.acc[p][c][r]);
            }
        }
    }
}

#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn group<S: Simd, L: Layout, const C: usize, const R: usize, const P: usize>(
    job: &Job,
    k: S::Consts,
    tile0: usize,
    row0: usize,
    xr: *const f32,
) {
    let mut t = [job.data; C];
    for c in 0..C {
        t[c] = job.data.add((tile0 + c) * job.tile_stride);
    }
    let mut a = Acc::<S, C, R, P> {
        acc: [[[S::zero(); R]; C]; P],
        x: xr,
    };
    for _ in 0..job.cols / L::BLOCK {
        L::visit::<S, C>(&t, k, &mut a);
        for c in 0..C {
            t[c] = t[c].add(L::BYTES);
        }
        a.x = a.x.add(L::BLOCK * R);
    }
    for c in 0..C {
        let o = (tile0 + c) * TILE;
        for r in 0..R {
            // Pairwise: (c0 + c1) for 2 chains, (c0 + c1) + (c2 + c3) for 4.
            let mut v = a.acc[0][c][r];
            if P >= 2 {
                v = S::add(v, a.acc[1 % P][c][r]);
            }
            if P == 4 {
                v = S::add(v, S::add(a.acc[2 % P][c][r], a.acc[3 % P][c][r]));
            }
            let dst = job.out.add((row0 + r) * job.rows + o);
            if o + TILE <= job.rows {
                S::store(v, dst);
            } else {
                let mut tmp = [0f32; TILE];
                S::store(v, tmp.as_mut_ptr());
                std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, job.rows - o);
            }
        }
    }
}

thread_local! {
    static INTERLEAVED: UnsafeCell<Vec<f32>> = const { UnsafeCell::new(Vec::new()) };
}

/// Passes of `16 / P` rows (16 accumulators in registers), single rows for the rest (4
/// tiles at a time: `4 P` accumulators; 8 tiles for one chain).
#[inline(always)]
unsafe fn run<S: Simd, L: Layout, const P: usize>(job: &Job, tiles: Range<usize>) {
    let buf = &mut *INTERLEAVED.with(UnsafeCell::get);
    let k = S::consts();
    let wide = 16 / P;
    let mut row = 0;
    while row < job.n {
        let r = if job.n - row >= wide { wide } else { 1 };
        let xr = if r == 1 {
            job.x.add(row * job.cols)
        } else {
            let len = r * job.cols;
            if buf.len() < len {
                buf.resize(len, 0.0);
            }
            for rr in 0..r {
                let src = std::slice::from_raw_parts(job.x.add((row + rr) * job.cols), job.cols);
                for (i, v) in src.iter().enumerate() {
                    *buf.get_unchecked_mut(i * r + rr) = *v;
                }
            }
            buf.as_ptr()
        };
        let mut t = tiles.start;
        while t < tiles.end {
            let c = match (r, P) {
                (1, 1) if tiles.end - t >= 8 => 8,
                (1, _) if tiles.end - t >= 4 => 4,
                _ => 1,
            };
            match (c, r, P) {
                (8, 1, 1) => group::<S, L, 8, 1, P>(job, k, t, row, xr),
                (4, 1, _) => group::<S, L, 4, 1, P>(job, k, t, row, xr),
                (1, 16, 1) => group::<S, L, 1, 16, P>(job, k, t, row, xr),
                (1, 1, _) => group::<S, L, 1, 1, P>(job, k, t, row, xr),
                (1, 8, 2) => group::<S, L, 1, 8, P>(job, k, t, row, xr),
                (1, 4, 4) => group::<S, L, 1, 4, P>(job, k, t, row, xr),
                _ => unreachable!("no split shape {c}×{r}×{P}"),
            }
            t += c;
        }
        row += r;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `w` in GGUF's Q8_0 blocks: per 32 weights an f16 scale (the largest magnitude over
    /// 127), then the weights over the scale, rounded, as bytes.
    fn q8_0(w: &[f32]) -> Vec<u8> {
        let mut out = Vec::new();
        for block in w.chunks(32) {
            let amax = block.iter().fold(0f32, |m, x| m.max(x.abs()));
            let d = amax / 127.0;
            let inv = if d == 0.0 { 0.0 } else { 1.0 / d };
            out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
            out.extend(block.iter().map(|x| (x * inv).round() as i8 as u8));
        }
        out
    }

    /// The split chains compute the same product up to rounding (and, being another order,
    /// not always the same bits); the wide blocking gives the product's bits.
    #[test]
    fn split_chains_agree_with_the_product_up_to_rounding() {
        let (rows, cols) = (40, 96);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * 0.1)
            .collect();
        let q = QuantMatrix::from_gguf_bytes(QuantFormat::Q8_0, &q8_0(&w), rows, cols).unwrap();
        for n in [1, 3, 8, 21] {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| (i * 31 % 97) as f32 / 48.0 - 1.0)
                .collect();
            let mut want = vec![0f32; n * rows];
            q.matmul(&x, n, &mut want);
            let mut differ = 0;
            for chains in [2, 4] {
                let mut got = vec![0f32; n * rows];
                matmul_split_chains(&q, chains, &x, n, &mut got);
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{g} vs {w}");
                    differ += usize::from(g.to_bits() != w.to_bits());
                }
            }
            assert!(
                n < 8 || differ > 0,
                "n = {n}: no bit differed: not another order"
            );
        }
    }
}
