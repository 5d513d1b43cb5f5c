//! The 8-bit product over a range of tiles: each format's tile-block as integer dot products
//! of its weights with the rounded activations, then one `f32` step per block.
//!
//! Each output `y[r][o]` is one `f32` accumulator, `acc = 0`, updated once per GGUF block of
//! inputs in input order by the format's `combine` (a fused multiply-add or two of exact
//! integer sums, converted to `f32`, by a scale product). The integer sums are exact in any
//! order, so the blocking below (rows and tiles per pass, threads) never changes a bit.

// `for c in 0..C` / `for r in 0..R` name the register blocking: tile `c`, row `r`.
#![allow(clippy::needless_range_loop)]

use std::ops::Range;

use super::ops::Dot;
use super::pack::{
    Q4K_BYTES, Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q5_0_HIGH, Q5_0_OPS, Q6K_BYTES, Q6K_HIGH,
    Q8_0_BYTES,
};
use crate::format::TILE;

/// One product `out[n, rows] = x[n, cols] · W[rows, cols]ᵀ` with `x` rounded to 8 bits.
pub(crate) struct Job8 {
    pub data: *const u8,
    /// Bytes per tile.
    pub tile_stride: usize,
    pub rows: usize,
    pub cols: usize,
    pub n: usize,
    /// `x` rounded: `n × cols` values, a scale per GGUF block of inputs of a row (the
    /// format's `Fmt8::BLOCK`), and the sum of each 16 consecutive values.
    pub qs: *const i8,
    pub d: *const f32,
    pub s16: *const i32,
    pub out: *mut f32,
}

// SAFETY: as `Job`: each thread writes only its own tiles' output columns.
unsafe impl Sync for Job8 {}

/// `R` rows of the rounded activations.
pub(crate) struct Rows<const R: usize> {
    qs: [*const i8; R],
    d: [*const f32; R],
    s16: [*const i32; R],
}

impl<const R: usize> Rows<R> {
    /// Inputs `i..i + 4` of row `r`, as the four bytes of an `i32`.
    #[inline(always)]
    unsafe fn x4(&self, r: usize, i: usize) -> i32 {
        self.qs[r].add(i).cast::<i32>().read_unaligned()
    }

    #[inline(always)]
    unsafe fn x4s(&self, i: usize) -> [i32; R] {
        let mut a = [0; R];
        for (r, v) in a.iter_mut().enumerate() {
            *v = self.x4(r, i);
        }
        a
    }

    /// Row `r`'s scale of activation block `b`.
    #[inline(always)]
    unsafe fn d(&self, r: usize, b: usize) -> f32 {
        *self.d[r].add(b)
    }

    /// Row `r`'s sum of inputs `16 k..16 k + 16`.
    #[inline(always)]
    unsafe fn s16(&self, r: usize, k: usize) -> i32 {
        *self.s16[r].add(k)
    }

    /// Row `r`'s sum of inputs `32 k..32 k + 32`.
    #[inline(always)]
    unsafe fn s32(&self, r: usize, k: usize) -> i32 {
        self.s16(r, 2 * k) + self.s16(r, 2 * k + 1)
    }
}

/// One format's tile-block, fed to `acc`.
pub(crate) trait Fmt8 {
    /// Inputs per tile-block (the GGUF block).
    const BLOCK: usize;
    /// Bytes per tile-block.
    const BYTES: usize;
    /// Tile-blocks ahead whose lines a decode step's product prefetches (0: none). Q5_0's
    /// blocks carry few bytes for their instructions (a fifth bit to merge, a block scale
    /// every 32 inputs), so the out-of-order window alone keeps too few lines in flight: on
    /// a Zen 5, two threads streamed Q5_0 at 54-61% of a plain read's bandwidth, 76-93%
    /// with two blocks ahead; the other formats stayed level or lost (Q4_K, 37 prefetches
    /// a block: 56-73% -> 47-64%) and take none.
    const AHEAD: usize = 0;

    /// Tile-block `b` (inputs `b BLOCK..`) of `C` tiles (`t[c]`) against `R` rows.
    ///
    /// # Safety
    /// `t[c]` points at a tile-block of this layout, `x` at rows of `cols ≥ (b + 1) BLOCK`
    /// inputs rounded in blocks of `BLOCK`; the CPU has `D`'s instruction set.
    unsafe fn block<D: Dot, const C: usize, const R: usize>(
        t: &[*const u8; C],
        x: &Rows<R>,
        b: usize,
        acc: &mut [[D::V; R]; C],
    );
}

/// `[[expr; R]; C]` of `izero`s.
macro_rules! izeros {
    ($D:ty) => {
        [[<$D>::izero(); R]; C]
    };
}

/// `acc[c][r] = fma(float(s[c][r]), scale[c] × dx[r], acc[c][r])`.
#[inline(always)]
unsafe fn combine<D: Dot, const C: usize, const R: usize>(
    acc: &mut [[D::V; R]; C],
    s: &[[D::I; R]; C],
    scale: &[D::V; C],
    dx: &[f32; R],
) {
    for c in 0..C {
        for r in 0..R {
            let k = D::mul(scale[c], D::splat(dx[r]));
            acc[c][r] = D::fma(D::to_f32(s[c][r]), k, acc[c][r]);
        }
    }
}

#[inline(always)]
unsafe fn f16s<D: Dot, const C: usize>(t: &[*const u8; C], at: usize) -> [D::V; C] {
    let mut a = [D::zero(); C];
    for c in 0..C {
        a[c] = D::load_f16(t[c].add(at));
    }
    a
}

/// `s[c][r] += Σ q x` over the nibble-pair operands `pairs` of the tiles (at `at + 64 p`),
/// against inputs `i0 + 8 p..i0 + 8 p + 8` of each row.
#[inline(always)]
unsafe fn nibble_pairs<D: Dot, const C: usize, const R: usize>(
    t: &[*const u8; C],
    at: usize,
    pairs: Range<usize>,
    x: &Rows<R>,
    i0: usize,
    s: &mut [[D::I; R]; C],
) {
    for p in pairs {
        let (xa, xb) = (x.x4s(i0 + 8 * p), x.x4s(i0 + 8 * p + 4));
        for c in 0..C {
            let v = D::load_w(t[c].add(at + 64 * p));
            let (w0, w1) = (D::lo4(v), D::hi4(v));
            for r in 0..R {
                s[c][r] = D::dot_u(D::dot_u(s[c][r], w0, xa[r]), w1, xb[r]);
            }
        }
    }
}

/// `s[c][r] −= zero × Σ x` of 32-input block `b`: weights stored as `q` for `q − zero`.
#[inline(always)]
unsafe fn less_zero<D: Dot, const C: usize, const R: usize>(
    s: &mut [[D::I; R]; C],
    x: &Rows<R>,
    b: usize,
    zero: i32,
) {
    for r in 0..R {
        let off = D::isplat(-zero * x.s32(r, b));
        for c in 0..C {
            s[c][r] = D::iadd(s[c][r], off);
        }
    }
}

pub(crate) struct Q8_0;
pub(crate) struct Q5_0;
pub(crate) struct Q4_0;
pub(crate) struct Q4_1;
pub(crate) struct Q4K;
pub(crate) struct Q6K;

impl Fmt8 for Q8_0 {
    const BLOCK: usize = 32;
    const BYTES: usize = Q8_0_BYTES;

    #[inline(always)]
    unsafe fn block<D: Dot, const C: usize, const R: usize>(
        t: &[*const u8; C],
        x: &Rows<R>,
        b: usize,
        acc: &mut [[D::V; R]; C],
    ) {
        let i0 = 32 * b;
        let mut s = izeros!(D);
        for g in 0..8 {
            let xg = x.x4s(i0 + 4 * g);
            for c in 0..C {
                let w = D::load_w(t[c].add(32 + 64 * g));
                for r in 0..R {
                    s[c][r] = D::dot_s(s[c][r], w, xg[r]);
                }
            }
        }
        let dx: [f32; R] = std::array::from_fn(|r| x.d(r, b));
        combine::<D, C, R>(acc, &s, &f16s::<D, C>(t, 0), &dx);
    }
}

impl Fmt8 for Q5_0 {
    const BLOCK: usize = 32;
    const BYTES: usize = Q5_0_BYTES;
    const AHEAD: usize = 2;

    #[inline(always)]
    unsafe fn block<D: Dot, const C: usize, const R: usize>(
        t: &[*const u8; C],
        x: &Rows<R>,
        b: usize,
        acc: &mut [[D::V; R]; C],
    ) {
        let i0 = 32 * b;
        let mut s = izeros!(D);
        for p in 0..4 {
            let (xa, xb) = (x.x4s(i0 + 8 * p), x.x4s(i0 + 8 * p + 4));
            for c in 0..C {
                let v = D::load_w(t[c].add(Q5_0_OPS + 64 * p));
                let hb = t[c].add(Q5_0_HIGH + 16 * p);
                let w0 = D::or_bit4(D::lo4(v), hb);
                let w1 = D::or_bit4(D::hi4(v), hb.add(8));
                for r in 0..R {
                    s[c][r] = D::dot_u(D::dot_u(s[c][r], w0, xa[r]), w1, xb[r]);
                }
            }
        }
        // w = q − 16.
        less_zero::<D, C, R>(&mut s, x, b, 16);
        let dx: [f32; R] = std::array::from_fn(|r| x.d(r, b));
        combine::<D, C, R>(acc, &s, &f16s::<D, C>(t, 0), &dx);
    }
}

impl Fmt8 for Q4_0 {
    const BLOCK: usize = 32;
    const BYTES: usize = Q4_0_BYTES;
    // As Q4_1 (the same operands less the minimum; not measured on its own).
    const AHEAD: usize = 2;

    #[inline(always)]
    unsafe fn block<D: Dot, const C: usize, const R: usize>(
        t: &[*const u8; C],
        x: &Rows<R>,
        b: usize,
        acc: &mut [[D::V; R]; C],
    ) {
        let mut s = izeros!(D);
        nibble_pairs::<D, C, R>(t, 32, 0..4, x, 32 * b, &mut s);
        // w = q − 8.
        less_zero::<D, C, R>(&mut s, x, b, 8);
        let dx: [f32; R] = std::array::from_fn(|r| x.d(r, b));
        combine::<D, C, R>(acc, &s, &f16s::<D, C>(t, 0), &dx);
    }
}

impl Fmt8 for Q4_1 {
    const BLOCK: usize = 32;
    const BYTES: usize = Q4_1_BYTES;
    // As Q5_0 (few instructions a byte): SmolLM2's gate/up products from memory at 62-67% of
    // a plain read without, 68-72% with two blocks ahead (`stream_formats`, Zen 5).
    const AHEAD: usize = 2;

    #[inline(always)]
    unsafe fn block<D: Dot, const C: usize, const R: usize>(
        t: &[*const u8; C],
        x: &Rows<R>,
        b: usize,
        acc: &mut [[D::V; R]; C],
    ) {
        let mut s = izeros!(D);
        nibble_pairs::<D, C, R>(t, 64, 0..4, x, 32 * b, &mut s);
        // Σ (d q + m) dx x = d dx Σ q x + m dx Σ x.
        let sx: [[D::I; R]; C] = [std::array::from_fn(|r| D::isplat(x.s32(r, b))); C];
        let dx: [f32; R] = std::array::from_fn(|r| x.d(r, b));
        combine::<D, C, R>(acc, &s, &f16s::<D, C>(t, 0), &dx);
        combine::<D, C, R>(acc, &sx, &f16s::<D, C>(t, 32), &dx);
    }
}

impl Fmt8 for Q4K {
    const BLOCK: usize = 256;
    const BYTES: usize = Q4K_BYTES;

    #[inline(always)]
    unsafe fn block<D: Dot, const C: usize, const R: usize>(
        t: &[*const u8; C],
        x: &Rows<R>,
        b: usize,
        acc: &mut [[D::V; R]; C],
    ) {
        let i0 = 256 * b;
        let mut tot = izeros!(D);
        let mut mins = izeros!(D);
        for s in 0..8 {
            let mut dot = izeros!(D);
            nibble_pairs::<D, C, R>(t, 320, 4 * s..4 * s + 4, x, i0, &mut dot);
            let bs: [i32; R] = std::array::from_fn(|r| x.s32(r, i0 / 32 + s));
            for c in 0..C {
                let sc = D::load_u8_i(t[c].add(64 + TILE * s));
                let mn = D::load_u8_i(t[c].add(192 + TILE * s));
                for r in 0..R {
                    tot[c][r] = D::iadd(tot[c][r], D::imul(sc, dot[c][r]));
                    mins[c][r] = D::iadd(mins[c][r], D::imul(mn, D::isplat(bs[r])));
                }
            }
        }
        // Σ (d sc q − dmin min) dx x = d dx Σ sc Σ q x − dmin dx Σ min Σ x.
        let dx: [f32; R] = std::array::from_fn(|r| x.d(r, b));
        let ndx: [f32; R] = std::array::from_fn(|r| -dx[r]);
        combine::<D, C, R>(acc, &tot, &f16s::<D, C>(t, 0), &dx);
        combine::<D, C, R>(acc, &mins, &f16s::<D, C>(t, 32), &ndx);
    }
}

impl Fmt8 for Q6K {
    const BLOCK: usize = 256;
    const BYTES: usize = Q6K_BYTES;

    #[inline(always)]
    unsafe fn block<D: Dot, const C: usize, const R: usize>(
        t: &[*const u8; C],
        x: &Rows<R>,
        b: usize,
        acc: &mut [[D::V; R]; C],
    ) {
        let i0 = 256 * b;
        let mut tot = izeros!(D);
        for s in 0..16 {
            let i = i0 + 16 * s;
            let xg = [x.x4s(i), x.x4s(i + 4), x.x4s(i + 8), x.x4s(i + 12)];
            let mut dot = izeros!(D);
            for c in 0..C {
                let h = D::load_w(t[c].add(Q6K_HIGH + 64 * s));
                let v0 = D::load_w(t[c].add(288 + 64 * (2 * s)));
                let v1 = D::load_w(t[c].add(288 + 64 * (2 * s + 1)));
                let w = [
                    D::or_field(D::lo4(v0), h, 0),
                    D::or_field(D::hi4(v0), h, 1),
                    D::or_field(D::lo4(v1), h, 2),
                    D::or_field(D::hi4(v1), h, 3),
                ];
                for r in 0..R {
                    let mut a = dot[c][r];
                    for m in 0..4 {
                        a = D::dot_u(a, w[m], xg[m][r]);
                    }
                    dot[c][r] = a;
                }
            }
            // w = (q − 32) sc: subtract 32 Σ x of the sub-block, then scale.
            for c in 0..C {
                let sc = D::load_i8_i(t[c].add(32 + TILE * s));
                for r in 0..R {
                    let off = D::isplat(-32 * x.s16(r, i / 16));
                    tot[c][r] = D::iadd(tot[c][r], D::imul(sc, D::iadd(dot[c][r], off)));
                }
            }
        }
        let dx: [f32; R] = std::array::from_fn(|r| x.d(r, b));
        combine::<D, C, R>(acc, &tot, &f16s::<D, C>(t, 0), &dx);
    }
}

/// `C` tiles from `tile0` × `R` rows from `row0`: one pass over the tiles' weights.
#[inline(always)]
unsafe fn group<D: Dot, F: Fmt8, const C: usize, const R: usize>(
    job: &Job8,
    tile0: usize,
    row0: usize,
) {
    let mut t = [job.data; C];
    for (c, p) in t.iter_mut().enumerate() {
        *p = job.data.add((tile0 + c) * job.tile_stride);
    }
    let xblocks = job.cols / F::BLOCK;
    let x = Rows::<R> {
        qs: std::array::from_fn(|r| job.qs.add((row0 + r) * job.cols)),
        d: std::array::from_fn(|r| job.d.add((row0 + r) * xblocks)),
        s16: std::array::from_fn(|r| job.s16.add((row0 + r) * (job.cols / 16))),
    };
    let mut acc = [[D::zero(); R]; C];
    let blocks = job.cols / F::BLOCK;
    for b in 0..blocks {
        // A decode step's row streams the weights from memory: ask for a later block's
        // lines now, where the format says so (no bit depends on it).
        #[cfg(target_arch = "x86_64")]
        if F::AHEAD > 0 && R == 1 && b + F::AHEAD < blocks {
            for p in t.iter() {
                let ahead = p.add(F::AHEAD * F::BYTES);
                for line in (0..F::BYTES).step_by(64) {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        ahead.add(line).cast(),
                    );
                }
            }
        }
        F::block::<D, C, R>(&t, &x, b, &mut acc);
        for p in t.iter_mut() {
            *p = p.add(F::BYTES);
        }
    }
    for c in 0..C {
        let o = (tile0 + c) * TILE;
        for r in 0..R {
            let dst = job.out.add((row0 + r) * job.rows + o);
            if o + TILE <= job.rows {
                D::store(acc[c][r], dst);
            } else {
                let mut tmp = [0f32; TILE];
                D::store(acc[c][r], tmp.as_mut_ptr());
                std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, job.rows - o);
            }
        }
    }
}

/// The product for output tiles `tiles`, all rows.
///
/// # Safety
/// `job` describes valid buffers in `F`'s layout; the CPU has `D`'s instruction set.
#[inline(always)]
pub(crate) unsafe fn run<D: Dot, F: Fmt8>(job: &Job8, tiles: Range<usize>) {
    let mut row = 0;
    while row < job.n {
        let left = job.n - row;
        // Four rows share each weight operand's unpacking on every instruction set: with
        // two on AVX2, a Q5_0 prefill was slower than the f32 kernel's (0.83x); with four,
        // 1.08x (Q4_K 1.44x).
        let r = left.min(4);
        let mut t = tiles.start;
        while t < tiles.end {
            let left_t = tiles.end - t;
            let c = match (D::WIDE, r) {
                (true, 1 | 2) if left_t >= 4 => 4,
                (true, _) if left_t >= 2 => 2,
                (false, 1) if left_t >= 2 => 2,
                _ => 1,
            };
            macro_rules! shapes {
                ($(($cc:literal, $rr:literal)),*) => {
                    match (c, r) {
                        $(($cc, $rr) => group::<D, F, $cc, $rr>(job, t, row),)*
                        _ => unreachable!("no 8-bit kernel shape {c}×{r}"),
                    }
                };
            }
            shapes!(
                (4, 1),
                (4, 2),
                (2, 1),
                (2, 2),
                (2, 3),
                (2, 4),
                (1, 1),
                (1, 2),
                (1, 3),
                (1, 4)
            );
            t += c;
        }
        row += r;
    }
}
