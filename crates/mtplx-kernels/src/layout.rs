//! The packed tile layout of each format, both directions: [`Layout::pack`] rearranges the
//! GGUF blocks of 16 rows into one tile-block, and [`Layout::visit`] dequantizes a tile-block
//! one input at a time. `visit` is the only definition of dequantization: the kernels of every
//! instruction set and [`QuantMatrix::dequantize_row`](super::QuantMatrix::dequantize_row)
//! all go through it.
//!
//! A tile is 16 consecutive output rows; lane `j` of every vector is row `16 t + j`. A
//! tile-block covers the tile's rows over one GGUF block of inputs (1 input for the dense
//! formats). Scales come first, as 16-lane vectors; then one 16-byte *unit* per input (8-bit
//! formats) or per pair of inputs (4-bit formats: low nibble = the even input, high nibble =
//! the odd one), in input order.
//!
//! Every dequantized weight equals the one `candle`'s (and ggml's) `dequantize` gives, bit
//! for bit, signed zeros included: the products involved (`q × d`, `d × sc`, …) are exact
//! in `f32`, so computing `q d + m` as one fused multiply-add rounds exactly where ggml's
//! `q * d + m` does; `(q − 8) d` and `(q − 32) d sc` are computed in ggml's order because
//! `fma(q, d, −8 d)` would give +0 where ggml gives −0.

use crate::format::TILE;
use crate::simd::Simd;

/// One format's tile-block layout.
pub(crate) trait Layout {
    /// Inputs per tile-block.
    const BLOCK: usize;
    /// Bytes per tile-block.
    const BYTES: usize;
    /// Whether a product of many rows should dequantize a tile once into an `f32` panel
    /// first (`kernel.rs`): every format but `f32` itself.
    const PANEL: bool = true;

    /// Packs the GGUF blocks of the tile's 16 rows (`src[j]` is row `j`'s block) into `dst`
    /// (`Self::BYTES` long).
    fn pack(src: &[&[u8]; TILE], dst: &mut [u8]);

    /// Calls `f.take(i, w)` for each input `i` of the tile-block, in increasing order, with
    /// `w[c]` the 16 dequantized weights of tile `c` at input `i`.
    ///
    /// # Safety
    /// `t[c]` points at a tile-block of this layout; the CPU has `S`'s instruction set.
    unsafe fn visit<S: Simd, const C: usize>(
        t: &[*const u8; C],
        k: S::Consts,
        f: &mut impl Sink<S, C>,
    );
}

/// What [`Layout::visit`] feeds the weights to. A trait rather than a closure: closures
/// cannot be `#[inline(always)]`, and an outlined closure loses the caller's
/// `#[target_feature]`s, leaving every intrinsic a function call.
pub(crate) trait Sink<S: Simd, const C: usize> {
    /// # Safety
    /// The CPU has `S`'s instruction set.
    unsafe fn take(&mut self, i: usize, w: &[S::V; C]);
}

/// `[expr for c in 0..C]` without a closure (see [`Sink`]); `$init` fills the array first.
macro_rules! lanes {
    ($init:expr; $c:ident => $e:expr) => {{
        let mut a = [$init; C];
        for $c in 0..C {
            a[$c] = $e;
        }
        a
    }};
}

/// Copies the `width`-byte field at `src_off` of each row's block into consecutive lanes at
/// `dst_off`.
pub(crate) fn gather(
    src: &[&[u8]; TILE],
    src_off: usize,
    width: usize,
    dst: &mut [u8],
    dst_off: usize,
) {
    for (j, s) in src.iter().enumerate() {
        let d = dst_off + j * width;
        dst[d..d + width].copy_from_slice(&s[src_off..src_off + width]);
    }
}

/// Weight `i` of a 32-weight nibble block (`qs` 16 bytes): low nibbles are weights 0-15.
pub(crate) fn nib32(qs: &[u8], i: usize) -> u8 {
    if i < 16 {
        qs[i] & 0xF
    } else {
        qs[i - 16] >> 4
    }
}

/// Packs `q(j, i)` for 32 inputs as 16 nibble-pair units at `dst_off`.
fn pack_pairs(dst: &mut [u8], dst_off: usize, units: usize, q: impl Fn(usize, usize) -> u8) {
    for u in 0..units {
        for j in 0..TILE {
            dst[dst_off + TILE * u + j] = q(j, 2 * u) | (q(j, 2 * u + 1) << 4);
        }
    }
}

pub(crate) struct F32;
pub(crate) struct F16;
pub(crate) struct BF16;
pub(crate) struct Q4_0;
pub(crate) struct Q4_1;
pub(crate) struct Q8_0;
pub(crate) struct Q5_0;
pub(crate) struct Q5_1;
pub(crate) struct Q4K;
pub(crate) struct Q5K;
pub(crate) struct Q6K;

impl Layout for F32 {
    const BLOCK: usize = 1;
    const BYTES: usize = 64;
    const PANEL: bool = false;

    fn pack(src: &[&[u8]; TILE], dst: &mut [u8]) {
        gather(src, 0, 4, dst, 0);
    }

    #[inline(always)]
    unsafe fn visit<S: Simd, const C: usize>(
        t: &[*const u8; C],
        _: S::Consts,
        f: &mut impl Sink<S, C>,
    ) {
        f.take(0, &lanes!(S::zero(); c => S::load_f32(t[c])));
    }
}

impl Layout for F16 {
    const BLOCK: usize = 1;
    const BYTES: usize = 32;

    fn pack(src: &[&[u8]; TILE], dst: &mut [u8]) {
        gather(src, 0, 2, dst, 0);
    }

    #[inline(always)]
    unsafe fn visit<S: Simd, const C: usize>(
        t: &[*const u8; C],
        _: S::Consts,
        f: &mut impl Sink<S, C>,
    ) {
        f.take(0, &lanes!(S::zero(); c => S::load_f16(t[c])));
    }
}

impl Layout for BF16 {
    const BLOCK: usize = 1;
    const BYTES: usize = 32;

    fn pack(src: &[&[u8]; TILE], dst: &mut [u8]) {
        gather(src, 0, 2, dst, 0);
    }

    #[inline(always)]
    unsafe fn visit<S: Simd, const C: usize>(
        t: &[*const u8; C],
        _: S::Consts,
        f: &mut impl Sink<S, C>,
    ) {
        f.take(0, &lanes!(S::zero(); c => S::load_bf16(t[c])));
    }
}

/// `d[16]` f16 | 32 units of 16 `i8`. `w = q × d`.
impl Layout for Q8_0 {
    const BLOCK: usize = 32;
    const BYTES: usize = 544;

    fn pack(src: &[&[u8]; TILE], dst: &mut [u8]) {
        gather(src, 0, 2, dst, 0);
        for i in 0..32 {
            for (j, s) in src.iter().enumerate() {
                dst[32 + TILE * i + j] = s[2 + i];
            }
        }
    }

    #[inline(always)]
    unsafe fn visit<S: Simd, const C: usize>(
        t: &[*const u8; C],
        _: S::Consts,
        f: &mut impl Sink<S, C>,
    ) {
        let d: [S::V; C] = lanes!(S::zero(); c => S::load_f16(t[c]));
        for i in 0..32 {
            f.take(
                i,
                &lanes!(S::zero(); c => S::mul(S::load_i8(t[c].add(32 + TILE * i)), d[c])),
            );
        }
    }
}

/// `d[16]` f16 | 16 nibble-pair units. `w = (q − 8) × d`.
impl Layout for Q4_0 {
    const BLOCK: usize = 32;
    const BYTES: usize = 288;

    fn pack(src: &[&[u8]; TILE], dst: &mut [u8]) {
        gather(src, 0, 2, dst, 0);
        pack_pairs(dst, 32, 16, |j, i| nib32(&src[j][2..18], i));
    }

    #[inline(always)]
    unsafe fn visit<S: Simd, const C: usize>(
        t: &[*const u8; C],
        k: S::Consts,
        f: &mut impl Sink<S, C>,
    ) {
        let d: [S::V; C] = lanes!(S::zero(); c => S::load_f16(t[c]));
        for u in 0..16 {
            let q: [(S::V, S::V); C] =
                lanes!((S::zero(), S::zero()); c => S::nibbles_m8(k, t[c].add(32 + TILE * u)));
            f.take(2 * u, &lanes!(S::zero(); c => S::mul(q[c].0, d[c])));
            f.take(2 * u + 1, &lanes!(S::zero(); c => S::mul(q[c].1, d[c])));
        }
    }
}

/// `d[16]` f16 | `m[16]` f16 | 16 nibble-pair units. `w = fma(q, d, m)`.
impl Layout for Q4_1 {
    const BLOCK: usize = 32;
    const BYTES: usize = 320;

    fn pack(src: &[&[u8]; TILE], dst: &mut [u8]) {
        gather(src, 0, 2, dst, 0);
        gather(src, 2, 2, dst, 32);
        pack_pairs(dst, 64, 16, |j, i| nib32(&src[j][4..20], i));
    }

    #[inline(always)]
    unsafe fn visit<S: Simd, const C: usize>(
        t: &[*const u8; C],
        k: S::Consts,
        f: &mut impl Sink<S, C>,
    ) {
        let d: [S::V; C] = lanes!(S::zero(); c => S::load_f16(t[c]));
        let m: [S::V; C] = lanes!(S::zero(); c => S::load_f16(t[c].add(32)));
        for u in 0..16 {
            let q: [(S::V, S::V); C] =
                lanes!((S::zero(), S::zero()); c => S::nibbles(k, t[c].add(64 + TILE * u)));
            f.take(2 * u, &lanes!(S::zero(); c => S::fma(q[c].0, d[c], m[c])));
            f.take(
                2 * u + 1,
                &lanes!(S::zero(); c => S::fma(q[c].1, d[c], m[c])),
            );
        }
    }
}

/// Packs the 2-bit fields `c(j, i)` of `inputs` inputs, four per byte (bits `2k..2k+2` =
/// input `4v + k` of unit `v`), as `inputs / 4` units at `dst_off`: what
/// [`Simd::high6`] reads back as `16 c − 32`.
fn pack_fields(dst: &mut [u8], dst_off: usize, inputs: usize, c: impl Fn(usize, usize) -> u8) {
    for v in 0..inputs / 4 {
        for j in 0..TILE {
            dst[dst_off + TILE * v + j] = (0..4).fold(0, |acc, k| acc | c(j, 4 * v + k) << (2 * k));
        }
    }
}

/// Bit `i` of a 5-bit block's little-endian `u32` of high bits.
pub(crate) fn high_bit(qh: &[u8], i: usize) -> u8 {
    (qh[i / 8] >> (i % 8)) & 1
}

/// For each input `$i` of the `$groups` groups of four from group `$g0` of a tile-block
/// whose weights are a nibble plus a 2-bit field (the 5-bit formats and Q6_K), binds `$q`
/// to the 16-lane values `lo + hi` (`lo` from the nibble-pair units at `$nib`, `hi = 16 c −
/// 32` from the 2-bit field units at `$high`: [`Simd::nibble_fields`]) and runs `$body`. A
/// macro, not a function taking a closure (see [`Sink`]).
macro_rules! nibble_field_groups {
    ($S:ty, $t:expr, $k:expr, $nib:expr, $high:expr, $g0:expr, $groups:expr, |$i:ident, $q:ident| $body:expr) => {
        for v in $g0..$g0 + $groups {
            let q4: [[<$S as Simd>::V; 4]; C] = lanes!([<$S>::zero(); 4]; c => <$S>::nibble_fields(
                $k,
                $t[c].add($nib + TILE * 2 * v),
                $t[c].add($nib + TILE * (2 * v + 1)),
                $t[c].add($high + TILE * v),
            ));
            for k4 in 0..4 {
                let ($i, $q) = (4 * v + k4, lanes!(<$S>::zero(); c => q4[c][k4]));
                $body;
            }
        }
    };
}

/// `d[16]` f16 | 16 nibble-pair units of the low 4 bits | 8 units of 2-bit fields `h + 1`
/// (the fifth bit `h`, so that [`Simd::high6`] gives `16 h − 16`). `w = (q − 16) × d`, `q`
/// the 5-bit value: ggml's `x0 * d` with `x0 = q − 16`.
impl Layout for Q5_0 {
    const BLOCK: usize = 32;
    const BYTES: usize = 416;

    fn pack(src: &[&[u8]; TILE], dst: &mut [u8]) {
        gather(src, 0, 2, dst, 0);
        pack_pairs(dst, 32, 16, |j, i| nib32(&src[j][6..22], i));
        pack_fields(dst, 288, 32, |j, i| high_bit(&src[j][2..6], i) + 1);
    }

    #[inline(always)]
    unsafe fn visit<S: Simd, const C: usize>(
        t: &[*const u8; C],
        k: S::Consts,
        f: &mut impl Sink<S, C>,
    ) {
        let d: [S::V; C] = lanes!(S::zero(); c => S::load_f16(t[c]));
        nibble_field_groups!(S, t, k, 32, 288, 0, 8, |i, q| f
            .take(i, &lanes!(S::zero(); c => S::mul(q[c], d[c]))));
    }
}

/// `d[16]` f16 | `m[16]` f16 | 16 nibble-pair units | 8 units of 2-bit fields `h + 2`
/// ([`Simd::high6`] gives `16 h`). `w = fma(q, d, m)`: `q d` is exact (5 × 11 bits), so
/// this rounds where ggml's `x0 * d + m` does.
impl Layout for Q5_1 {
    const BLOCK: usize = 32;
    const BYTES: usize = 448;

    fn pack(src: &[&[u8]; TILE], dst: &mut [u8]) {
        gather(src, 0, 2, dst, 0);
        gather(src, 2, 2, dst, 32);
        pack_pairs(dst, 64, 16, |j, i| nib32(&src[j][8..24], i));
        pack_fields(dst, 320, 32, |j, i| high_bit(&src[j][4..8], i) + 2);
    }

    #[inline(always)]
    unsafe fn visit<S: Simd, const C: usize>(
        t: &[*const u8; C],
        k: S::Consts,
        f: &mut impl Sink<S, C>,
    ) {
        let d: [S::V; C] = lanes!(S::zero(); c => S::load_f16(t[c]));
        let m: [S::V; C] = lanes!(S::zero(); c => S::load_f16(t[c].add(32)));
        nibble_field_groups!(S, t, k, 64, 320, 0, 8, |i, q| f
            .take(i, &lanes!(S::zero(); c => S::fma(q[c], d[c], m[c]))));
    }
}

/// The first 320 bytes of a Q4_K or Q5_K tile-block: `d[16]`, `dmin[16]` (f16), then the
/// 8 sub-blocks' 6-bit scales and mins unpacked to bytes (`sc[8][16]`, `min[8][16]`).
pub(crate) fn pack_k4_scales(src: &[&[u8]; TILE], dst: &mut [u8]) {
    gather(src, 0, 2, dst, 0);
    gather(src, 2, 2, dst, 32);
    for s in 0..8 {
        for (j, b) in src.iter().enumerate() {
            let (sc, mn) = scale_min_k4(s, &b[4..16]);
            dst[64 + TILE * s + j] = sc;
            dst[192 + TILE * s + j] = mn;
        }
    }
}

/// Sub-block `s`'s scale `d × sc` and offset `(−dmin) × min` from the header
/// [`pack_k4_scales`] wrote (`d`, `nmin = −dmin` loaded once per tile-block).
///
/// # Safety
/// As [`Layout::visit`].
#[inline(always)]
unsafe fn k4_scales<S: Simd, const C: usize>(
    t: &[*const u8; C],
    s: usize,
    d: &[S::V; C],
    nmin: &[S::V; C],
) -> ([S::V; C], [S::V; C]) {
    (
        lanes!(S::zero(); c => S::mul(d[c], S::load_u8(t[c].add(64 + TILE * s)))),
        lanes!(S::zero(); c => S::mul(nmin[c], S::load_u8(t[c].add(192 + TILE * s)))),
    )
}

/// ggml's 6-bit scale and min of sub-block `j` from the 12 packed bytes.
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// `d[16]` f16 | `dmin[16]` f16 | `sc[8][16]` u8 | `min[8][16]` u8 | 128 nibble-pair units.
/// Sub-block `s` (inputs `32 s..32 s + 32`): `w = fma(q, d × sc, (−dmin) × min)`, exactly
/// ggml's `d sc q − dmin min`.
impl Layout for Q4K {
    const BLOCK: usize = 256;
    const BYTES: usize = 2368;

    fn pack(src: &[&[u8]; TILE], dst: &mut [u8]) {
        pack_k4_scales(src, dst);
        // Weight i: 64-weight chunk i / 64 holds 32 bytes; low nibbles are its first 32.
        let q = |j: usize, i: usize| {
            let (chunk, r) = (i / 64, i % 64);
            let byte = src[j][16 + 32 * chunk + r % 32];
            if r < 32 {
                byte & 0xF
            } else {
                byte >> 4
            }
        };
        pack_pairs(dst, 320, 128, q);
    }

    #[inline(always)]
    unsafe fn visit<S: Simd, const C: usize>(
        t: &[*const u8; C],
        k: S::Consts,
        f: &mut impl Sink<S, C>,
    ) {
        let d: [S::V; C] = lanes!(S::zero(); c => S::load_f16(t[c]));
        let nmin: [S::V; C] =
            lanes!(S::zero(); c => S::mul(S::load_f16(t[c].add(32)), S::splat(-1.0)));
        for s in 0..8 {
            let (d1, m1) = k4_scales::<S, C>(t, s, &d, &nmin);
            for u in 0..16 {
                let unit = 16 * s + u;
                let q: [(S::V, S::V); C] =
                    lanes!((S::zero(), S::zero()); c => S::nibbles(k, t[c].add(320 + TILE * unit)));
                f.take(
                    2 * unit,
                    &lanes!(S::zero(); c => S::fma(q[c].0, d1[c], m1[c])),
                );
                f.take(
                    2 * unit + 1,
                    &lanes!(S::zero(); c => S::fma(q[c].1, d1[c], m1[c])),
                );
            }
        }
    }
}

/// Q4_K's tile-block (`d`, `dmin`, unpacked scales and mins, 128 nibble-pair units) | 64
/// units of 2-bit fields `h + 2` ([`Simd::high6`] gives `16 h`). Sub-block `s`:
/// `w = fma(q, d × sc, (−dmin) × min)` with `q` in `0..32`; `q × d × sc` is exact (5 + 11 + 6
/// bits), so this is ggml's `d1 * q − m1` bit for bit.
impl Layout for Q5K {
    const BLOCK: usize = 256;
    const BYTES: usize = 3392;

    fn pack(src: &[&[u8]; TILE], dst: &mut [u8]) {
        pack_k4_scales(src, dst);
        // Weight i: 64-weight chunk i / 64 holds 32 bytes of `qs` (low nibbles its first
        // 32) and bits 2 chunk (first 32) and 2 chunk + 1 of the 32 bytes of `qh`.
        let split = |j: usize, i: usize| -> (u8, u8) {
            let (chunk, r) = (i / 64, i % 64);
            let (l, upper) = (r % 32, r >= 32);
            let byte = src[j][48 + 32 * chunk + l];
            let lo = if upper { byte >> 4 } else { byte & 0xF };
            let bit = 2 * chunk + usize::from(upper);
            (lo, (src[j][16 + l] >> bit) & 1)
        };
        pack_pairs(dst, 320, 128, |j, i| split(j, i).0);
        pack_fields(dst, 2368, 256, |j, i| split(j, i).1 + 2);
    }

    #[inline(always)]
    unsafe fn visit<S: Simd, const C: usize>(
        t: &[*const u8; C],
        k: S::Consts,
        f: &mut impl Sink<S, C>,
    ) {
        let d: [S::V; C] = lanes!(S::zero(); c => S::load_f16(t[c]));
        let nmin: [S::V; C] =
            lanes!(S::zero(); c => S::mul(S::load_f16(t[c].add(32)), S::splat(-1.0)));
        for s in 0..8 {
            let (d1, m1) = k4_scales::<S, C>(t, s, &d, &nmin);
            nibble_field_groups!(S, t, k, 320, 2368, 8 * s, 8, |i, q| f
                .take(i, &lanes!(S::zero(); c => S::fma(q[c], d1[c], m1[c]))));
        }
    }
}

/// `d[16]` f16 | `sc[16][16]` i8 | 128 nibble-pair units of the low 4 bits | 64 units of the
/// high 2 bits of 4 inputs (bits `2k..2k+2` = input `4v + k`). Sub-block `s` (inputs
/// `16 s..16 s + 16`): `w = (q − 32) × (d × sc)` with `q` in `0..64`.
impl Layout for Q6K {
    const BLOCK: usize = 256;
    const BYTES: usize = 3360;

    fn pack(src: &[&[u8]; TILE], dst: &mut [u8]) {
        gather(src, 208, 2, dst, 0);
        for s in 0..16 {
            for (j, b) in src.iter().enumerate() {
                dst[32 + TILE * s + j] = b[192 + s];
            }
        }
        // Weight i (ggml's order): half h = i / 128; quarter k and l within it.
        let split = |j: usize, i: usize| -> (u8, u8) {
            let (h, l) = (i / 128, i % 128);
            let (k, l) = (l / 32, l % 32);
            let ql = &src[j][64 * h..];
            let qh = src[j][128 + 32 * h + l];
            let lo = match k {
                0 => ql[l] & 0xF,
                1 => ql[l + 32] & 0xF,
                2 => ql[l] >> 4,
                _ => ql[l + 32] >> 4,
            };
            (lo, (qh >> (2 * k)) & 3)
        };
        pack_pairs(dst, 288, 128, |j, i| split(j, i).0);
        pack_fields(dst, 2336, 256, |j, i| split(j, i).1);
    }

    #[inline(always)]
    unsafe fn visit<S: Simd, const C: usize>(
        t: &[*const u8; C],
        k: S::Consts,
        f: &mut impl Sink<S, C>,
    ) {
        let d: [S::V; C] = lanes!(S::zero(); c => S::load_f16(t[c]));
        for s in 0..16 {
            let dsc: [S::V; C] =
                lanes!(S::zero(); c => S::mul(d[c], S::load_i8(t[c].add(32 + TILE * s))));
            nibble_field_groups!(S, t, k, 288, 2336, 4 * s, 4, |i, q| f
                .take(i, &lanes!(S::zero(); c => S::mul(q[c], dsc[c]))));
        }
    }
}
