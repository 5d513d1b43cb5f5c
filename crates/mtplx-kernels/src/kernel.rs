//! The matrix product over a range of tiles, generic over the instruction set and layout.
//!
//! Each output `y[r][o]` has its own accumulator, and every kernel shape runs the same
//! sequence on it: `acc = 0; for i in 0..cols { acc = fma(w[o][i], x[r][i], acc) }`. The
//! blocking below (how many rows of `x` and how many tiles share a pass over the weights)
//! only decides which accumulators live in registers together, never the order of any one
//! reduction: a row's result is the same bits at any `n`, thread split or instruction set.

use std::cell::UnsafeCell;
use std::ops::Range;

use crate::format::TILE;
use crate::layout::{self, Layout, Sink};
use crate::simd::Simd;

/// One product `out[n, rows] = x[n, cols] · W[rows, cols]ᵀ` over packed tiles.
pub(crate) struct Job {
    pub data: *const u8,
    /// Bytes per tile.
    pub tile_stride: usize,
    pub rows: usize,
    pub cols: usize,
    pub x: *const f32,
    pub n: usize,
    pub out: *mut f32,
}

// SAFETY: a `Job` is shared by the threads of one product; each writes only the output
// columns of its own tiles, and `matmul` keeps the buffers alive until all have finished.
unsafe impl Sync for Job {}

/// The accumulators of `C` tiles × `R` rows of `x`.
struct Acc<S: Simd, const C: usize, const R: usize> {
    acc: [[S::V; R]; C],
    /// `x` from the current tile-block on, interleaved: `x[i R + r]` is row `r`, input `i`
    /// (one pointer and constant offsets, however many rows).
    x: *const f32,
}

impl<S: Simd, const C: usize, const R: usize> Sink<S, C> for Acc<S, C, R> {
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn take(&mut self, i: usize, w: &[S::V; C]) {
        for r in 0..R {
            let xv = S::splat(*self.x.add(i * R + r));
            for c in 0..C {
                self.acc[c][r] = S::fma(w[c], xv, self.acc[c][r]);
            }
        }
    }
}

/// `C` tiles from `tile0` × `R` rows of `x` from `row0` (`xr`: those rows interleaved, see
/// [`Acc`]): one pass over the tiles' weights, which start at `w0` (tile `tile0`'s first
/// byte), `stride` bytes a tile, in `L`'s layout.
#[inline(always)]
#[allow(clippy::needless_range_loop, clippy::too_many_arguments)]
unsafe fn group<S: Simd, L: Layout, const C: usize, const R: usize>(
    job: &Job,
    k: S::Consts,
    w0: *const u8,
    stride: usize,
    tile0: usize,
    row0: usize,
    xr: *const f32,
) {
    let mut t = [w0; C];
    for c in 0..C {
        t[c] = w0.add(c * stride);
    }
    let mut a = Acc::<S, C, R> {
        acc: [[S::zero(); R]; C],
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
            let dst = job.out.add((row0 + r) * job.rows + o);
            if o + TILE <= job.rows {
                S::store(a.acc[c][r], dst);
            } else {
                let mut tmp = [0f32; TILE];
                S::store(a.acc[c][r], tmp.as_mut_ptr());
                std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, job.rows - o);
            }
        }
    }
}

/// Rows of `x` per pass, given `left` rows to go.
#[inline(always)]
fn rows_per_pass<S: Simd>(left: usize) -> usize {
    if S::WIDE {
        match left {
            16.. => 16,
            8..=15 => 8,
            l => l,
        }
    } else {
        left.min(4)
    }
}

/// Tiles per pass for `r` rows: enough independent accumulators to hide the FMA latency,
/// few enough to stay in registers. One row takes 8 tiles: with 4, a decode step's products
/// took 5.8 ms instead of 4.2 (`benches/kernels.rs`, `step`; see ARCHITECTURE.md).
#[inline(always)]
fn tiles_per_pass<S: Simd>(r: usize) -> usize {
    match (S::WIDE, r) {
        (true, 1) => 8,
        (true, 2..=4) => 4,
        (true, 5..=8) => 2,
        (false, 1) => 4,
        (false, 2) => 2,
        _ => 1,
    }
}

/// Rows of `x` from which a product dequantizes each tile once into an `f32` panel and runs
/// the passes over the panel ([`panels`]); fewer rows (a decode step, a verify block)
/// dequantize inside the passes ([`direct`]). A speed knob only: both feed every
/// accumulator the same weights in the same order.
const PANEL_MIN_ROWS: usize = 8;

/// Rows of `x` one panel serves before the next tile's is built: the dequantization is
/// paid once per tile per this many rows, instead of once per pass of a few rows.
const PANEL_ROWS: usize = 64;

/// Rows of `x` per pass over a panel, given `left` rows to go: a dense `f32` panel costs a
/// load per input, so a pass takes as many rows as the registers hold accumulators for.
#[inline(always)]
fn panel_rows_per_pass<S: Simd>(left: usize) -> usize {
    if S::WIDE {
        rows_per_pass::<S>(left)
    } else {
        left.min(6)
    }
}

thread_local! {
    /// Each thread's copy of the rows of `x` of one pass, interleaved. Grows to the largest
    /// `rows × cols` seen, then is reused: products allocate nothing in steady state.
    static INTERLEAVED: UnsafeCell<Vec<f32>> = const { UnsafeCell::new(Vec::new()) };
    /// Each thread's panel: one tile's weights dequantized, in [`layout::F32`]'s tile
    /// layout (16 `f32`s an input). Grows like [`INTERLEAVED`].
    static PANEL: UnsafeCell<Vec<f32>> = const { UnsafeCell::new(Vec::new()) };
}

/// The product for output tiles `tiles`, all rows of `x`.
///
/// # Safety
/// `job` describes valid buffers in `L`'s layout; the CPU has `S`'s instruction set.
#[inline(always)]
pub(crate) unsafe fn run<S: Simd, L: Layout>(job: &Job, tiles: Range<usize>) {
    // Not `with(|buf| …)` around the work: an outlined closure would lose the caller's
    // `#[target_feature]`s (see `Sink`).
    // SAFETY: only this thread touches its buffers, and `run` does not re-enter itself.
    let buf = &mut *INTERLEAVED.with(UnsafeCell::get);
    if L::PANEL && job.n >= PANEL_MIN_ROWS {
        let panel = &mut *PANEL.with(UnsafeCell::get);
        panels::<S, L>(job, tiles, buf, panel)
    } else {
        direct::<S, L>(job, tiles, buf)
    }
}

/// Dequantizing inside the passes: each pass of a few rows reads the tiles' packed weights.
#[inline(always)]
unsafe fn direct<S: Simd, L: Layout>(job: &Job, tiles: Range<usize>, buf: &mut Vec<f32>) {
    let k = S::consts();
    let w0 = job.data.add(tiles.start * job.tile_stride);
    let mut row = 0;
    while row < job.n {
        let r = rows_per_pass::<S>(job.n - row);
        let xr = interleave(job, row, r, buf, 0);
        pass::<S, L>(job, k, w0, job.tile_stride, tiles.clone(), row, r, xr);
        row += r;
    }
}

/// Dequantizing once per tile and block of [`PANEL_ROWS`] rows into `panel`, then running
/// the block's passes over the panel as a dense [`layout::F32`] tile.
#[inline(always)]
unsafe fn panels<S: Simd, L: Layout>(
    job: &Job,
    tiles: Range<usize>,
    buf: &mut Vec<f32>,
    panel: &mut Vec<f32>,
) {
    /// Stores each input's 16 weights at their place in the panel.
    struct Store(*mut f32);
    impl<S: Simd> Sink<S, 1> for Store {
        #[inline(always)]
        unsafe fn take(&mut self, i: usize, w: &[S::V; 1]) {
            S::store(w[0], self.0.add(i * TILE));
        }
    }
    let k = S::consts();
    if panel.len() < job.cols * TILE {
        panel.resize(job.cols * TILE, 0.0);
    }
    let mut row0 = 0;
    while row0 < job.n {
        let end = job.n.min(row0 + PANEL_ROWS);
        // The block's passes interleaved once, each at its first row's offset.
        let mut row = row0;
        while row < end {
            let r = panel_rows_per_pass::<S>(end - row);
            interleave(job, row, r, buf, (row - row0) * job.cols);
            row += r;
        }
        for t in tiles.clone() {
            let w = job.data.add(t * job.tile_stride);
            for b in 0..job.cols / L::BLOCK {
                let mut sink = Store(panel.as_mut_ptr().add(b * L::BLOCK * TILE));
                L::visit::<S, 1>(&[w.add(b * L::BYTES)], k, &mut sink);
            }
            let p = panel.as_ptr().cast::<u8>();
            let mut row = row0;
            while row < end {
                let r = panel_rows_per_pass::<S>(end - row);
                let xr = if r == 1 {
                    job.x.add(row * job.cols)
                } else {
                    buf.as_ptr().add((row - row0) * job.cols)
                };
                pass::<S, layout::F32>(job, k, p, 0, t..t + 1, row, r, xr);
                row += r;
            }
        }
        row0 = end;
    }
}

/// Rows `row..row + r` of `x` interleaved into `buf` from `at` (see [`Acc`]); one row is
/// read where it is.
#[inline(always)]
unsafe fn interleave(job: &Job, row: usize, r: usize, buf: &mut Vec<f32>, at: usize) -> *const f32 {
    if r == 1 {
        return job.x.add(row * job.cols);
    }
    let len = at + r * job.cols;
    if buf.len() < len {
        buf.resize(len, 0.0);
    }
    for rr in 0..r {
        let src = std::slice::from_raw_parts(job.x.add((row + rr) * job.cols), job.cols);
        for (i, v) in src.iter().enumerate() {
            *buf.get_unchecked_mut(at + i * r + rr) = *v;
        }
    }
    buf.as_ptr().add(at)
}

/// One pass of `r` rows from `row` (`xr`, interleaved) over `tiles`, whose weights start at
/// `w0`, `stride` bytes a tile, in `L`'s layout.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pass<S: Simd, L: Layout>(
    job: &Job,
    k: S::Consts,
    w0: *const u8,
    stride: usize,
    tiles: Range<usize>,
    row: usize,
    r: usize,
    xr: *const f32,
) {
    let c = tiles_per_pass::<S>(r);
    let mut t = tiles.start;
    while t < tiles.end {
        let left = tiles.end - t;
        let c = if left >= c {
            c
        } else if c > 4 && left >= 4 {
            4
        } else {
            1
        };
        let w = w0.add((t - tiles.start) * stride);
        macro_rules! shapes {
            ($(($cc:literal, $rr:literal)),*) => {
                match (c, r) {
                    $(($cc, $rr) => group::<S, L, $cc, $rr>(job, k, w, stride, t, row, xr),)*
                    _ => unreachable!("no kernel shape {c}×{r}"),
                }
            };
        }
        shapes!(
            (8, 1),
            (4, 1),
            (4, 2),
            (4, 3),
            (4, 4),
            (2, 2),
            (2, 5),
            (2, 6),
            (2, 7),
            (2, 8),
            (1, 1),
            (1, 2),
            (1, 3),
            (1, 4),
            (1, 5),
            (1, 6),
            (1, 7),
            (1, 8),
            (1, 16)
        );
        t += c;
    }
}
