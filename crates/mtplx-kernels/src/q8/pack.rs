//! The tile-block layouts of the 8-bit kernels. As in `layout.rs`, a tile is 16 output rows
//! and a tile-block one GGUF block of inputs; scales come first as 16-lane fields. The
//! weights follow as the kernels' 64-byte operands (see `ops.rs`): byte `4 j + k` of an
//! operand is row `j`'s weight at input `4 g + k` of group `g`.
//!
//! - nibble pairs: the operand pair `(2 p, 2 p + 1)` in 64 bytes, group `2 p` in the low
//!   nibbles and group `2 p + 1` in the high ones;
//! - a fifth bit (Q5_0): a little-endian `u64` per group, bit `4 j + k`;
//! - 2-bit fields (Q6_K's high bits): 64 bytes per four groups, group `4 v + f` in bits
//!   `2 f..2 f + 2`.
//!
//! Each format's weights are the integers of its GGUF block (unsigned, or `i8` for Q8_0),
//! unchanged, and [`dequantize`] turns them into ggml's `f32` values bit for bit.

use crate::format::{QuantFormat, TILE};
use crate::layout::{gather, high_bit, nib32, pack_k4_scales};

/// Bytes of one packed tile-block of `format`, if it has an 8-bit kernel.
pub(crate) fn tile_block_bytes(format: QuantFormat) -> Option<usize> {
    Some(match format {
        QuantFormat::Q8_0 => Q8_0_BYTES,
        QuantFormat::Q5_0 => Q5_0_BYTES,
        QuantFormat::Q4_0 => Q4_0_BYTES,
        QuantFormat::Q4_1 => Q4_1_BYTES,
        QuantFormat::Q4K => Q4K_BYTES,
        QuantFormat::Q6K => Q6K_BYTES,
        _ => return None,
    })
}

/// `d[16]` f16 | 8 operands of `i8` weights.
pub(crate) const Q8_0_BYTES: usize = 32 + 8 * 64;
/// `d[16]` f16 | 8 fifth-bit masks | 4 nibble-pair operands. `w = (q − 16) d`. The masks
/// come before the operands, so a product reads each tile-block in address order (with the
/// masks last, each block's first load reached 4-5 lines ahead and then went back: a Q5_0
/// product streamed 22-31 GB/s from memory on a Zen 5 where Q8_0 streamed 41).
pub(crate) const Q5_0_BYTES: usize = 32 + 8 * 8 + 4 * 64;
pub(crate) const Q5_0_HIGH: usize = 32;
pub(crate) const Q5_0_OPS: usize = 32 + 8 * 8;
/// `d[16]` f16 | 4 nibble-pair operands. `w = (q − 8) d`.
pub(crate) const Q4_0_BYTES: usize = 32 + 4 * 64;
/// `d[16]`, `m[16]` f16 | 4 nibble-pair operands. `w = q d + m`: the file's 320 bytes a
/// tile-block, rearranged.
pub(crate) const Q4_1_BYTES: usize = 64 + 4 * 64;
/// `d[16]`, `dmin[16]` f16 | `sc[8][16]` u8 | `min[8][16]` u8 | 32 nibble-pair operands.
pub(crate) const Q4K_BYTES: usize = 320 + 32 * 64;
/// `d[16]` f16 | `sc[16][16]` i8 | 32 nibble-pair operands of the low 4 bits | 16 operands of
/// 2-bit fields (the high bits). `w = (q − 32) d sc`, sub-blocks of 16 inputs.
pub(crate) const Q6K_BYTES: usize = 288 + 32 * 64 + 16 * 64;
pub(crate) const Q6K_HIGH: usize = 288 + 32 * 64;

/// Weight `i` of a GGUF block as its unsigned integer (Q8_0: the `i8`'s bits).
fn q(format: QuantFormat, b: &[u8], i: usize) -> u8 {
    match format {
        QuantFormat::Q8_0 => b[2 + i],
        QuantFormat::Q5_0 => nib32(&b[6..22], i) | high_bit(&b[2..6], i) << 4,
        QuantFormat::Q4_0 => nib32(&b[2..18], i),
        QuantFormat::Q4_1 => nib32(&b[4..20], i),
        QuantFormat::Q4K => {
            // 64-weight chunk i / 64 holds 32 bytes; low nibbles are its first 32.
            let (chunk, r) = (i / 64, i % 64);
            let byte = b[16 + 32 * chunk + r % 32];
            if r < 32 {
                byte & 0xF
            } else {
                byte >> 4
            }
        }
        QuantFormat::Q6K => {
            // ggml's order: half h = i / 128; quarter k and l within it.
            let (h, l) = (i / 128, i % 128);
            let (k, l) = (l / 32, l % 32);
            let ql = &b[64 * h..];
            let lo = match k {
                0 => ql[l] & 0xF,
                1 => ql[l + 32] & 0xF,
                2 => ql[l] >> 4,
                _ => ql[l + 32] >> 4,
            };
            lo | ((b[128 + 32 * h + l] >> (2 * k)) & 3) << 4
        }
        f => unreachable!("{f:?} has no 8-bit layout"),
    }
}

/// Packs nibble-pair operands of `q(j, i) & 15` for `pairs × 8` inputs at `at`.
fn pack_nibbles(dst: &mut [u8], at: usize, pairs: usize, q: impl Fn(usize, usize) -> u8) {
    for p in 0..pairs {
        for j in 0..TILE {
            for k in 0..4 {
                let (lo, hi) = (q(j, 8 * p + k) & 0xF, q(j, 8 * p + 4 + k) & 0xF);
                dst[at + 64 * p + 4 * j + k] = lo | hi << 4;
            }
        }
    }
}

/// Packs the GGUF blocks of the tile's 16 rows (`src[j]` is row `j`'s) into `dst`.
pub(crate) fn pack(format: QuantFormat, src: &[&[u8]; TILE], dst: &mut [u8]) {
    let w = |j: usize, i: usize| q(format, src[j], i);
    match format {
        QuantFormat::Q8_0 => {
            gather(src, 0, 2, dst, 0);
            for g in 0..8 {
                for j in 0..TILE {
                    for k in 0..4 {
                        dst[32 + 64 * g + 4 * j + k] = w(j, 4 * g + k);
                    }
                }
            }
        }
        QuantFormat::Q5_0 => {
            gather(src, 0, 2, dst, 0);
            pack_nibbles(dst, Q5_0_OPS, 4, w);
            for g in 0..8 {
                let mut m = 0u64;
                for j in 0..TILE {
                    for k in 0..4 {
                        m |= u64::from(w(j, 4 * g + k) >> 4) << (4 * j + k);
                    }
                }
                dst[Q5_0_HIGH + 8 * g..Q5_0_HIGH + 8 * g + 8].copy_from_slice(&m.to_le_bytes());
            }
        }
        QuantFormat::Q4_0 => {
            gather(src, 0, 2, dst, 0);
            pack_nibbles(dst, 32, 4, w);
        }
        QuantFormat::Q4_1 => {
            gather(src, 0, 2, dst, 0);
            gather(src, 2, 2, dst, 32);
            pack_nibbles(dst, 64, 4, w);
        }
        QuantFormat::Q4K => {
            pack_k4_scales(src, dst);
            pack_nibbles(dst, 320, 32, w);
        }
        QuantFormat::Q6K => {
            gather(src, 208, 2, dst, 0);
            for s in 0..16 {
                for (j, b) in src.iter().enumerate() {
                    dst[32 + TILE * s + j] = b[192 + s];
                }
            }
            pack_nibbles(dst, 288, 32, w);
            for v in 0..16 {
                for j in 0..TILE {
                    for k in 0..4 {
                        dst[Q6K_HIGH + 64 * v + 4 * j + k] =
                            (0..4).fold(0, |a, f| a | (w(j, 16 * v + 4 * f + k) >> 4) << (2 * f));
                    }
                }
            }
        }
        f => unreachable!("{f:?} has no 8-bit layout"),
    }
}

fn f16_at(p: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([p[2 * i], p[2 * i + 1]]).to_f32()
}

/// Row `lane` of a packed tile-block, dequantized as ggml does (bit for bit: see
/// `layout.rs` for why each expression rounds where ggml's does).
pub(crate) fn dequantize(format: QuantFormat, t: &[u8], lane: usize, out: &mut [f32]) {
    let (j, at) = (lane, |i: usize| 4 * lane + (i % 4));
    // The integer of input `i` from nibble-pair operands at `base`.
    let nib = |base: usize, i: usize| {
        let (p, g) = (i / 8, (i / 4) % 2);
        let byte = t[base + 64 * p + at(i)];
        if g == 0 {
            byte & 0xF
        } else {
            byte >> 4
        }
    };
    match format {
        QuantFormat::Q8_0 => {
            let d = f16_at(t, j);
            for (i, o) in out.iter_mut().enumerate() {
                *o = f32::from(t[32 + 64 * (i / 4) + at(i)] as i8) * d;
            }
        }
        QuantFormat::Q5_0 => {
            let d = f16_at(t, j);
            for (i, o) in out.iter_mut().enumerate() {
                let m = u64::from_le_bytes(t[Q5_0_HIGH + 8 * (i / 4)..][..8].try_into().unwrap());
                let q = nib(Q5_0_OPS, i) | (((m >> at(i)) & 1) as u8) << 4;
                *o = (f32::from(q) - 16.0) * d;
            }
        }
        QuantFormat::Q4_0 => {
            let d = f16_at(t, j);
            for (i, o) in out.iter_mut().enumerate() {
                *o = (f32::from(nib(32, i)) - 8.0) * d;
            }
        }
        QuantFormat::Q4_1 => {
            let (d, m) = (f16_at(t, j), f16_at(&t[32..], j));
            for (i, o) in out.iter_mut().enumerate() {
                *o = f32::from(nib(64, i)).mul_add(d, m);
            }
        }
        QuantFormat::Q4K => {
            let (d, dmin) = (f16_at(t, j), f16_at(&t[32..], j));
            for (i, o) in out.iter_mut().enumerate() {
                let s = i / 32;
                let (sc, mn) = (t[64 + TILE * s + j], t[192 + TILE * s + j]);
                *o = f32::from(nib(320, i)).mul_add(d * f32::from(sc), -(dmin * f32::from(mn)));
            }
        }
        QuantFormat::Q6K => {
            let d = f16_at(t, j);
            for (i, o) in out.iter_mut().enumerate() {
                let sc = f32::from(t[32 + TILE * (i / 16) + j] as i8);
                let f = (i % 16) / 4;
                let hi = (t[Q6K_HIGH + 64 * (i / 16) + at(i)] >> (2 * f)) & 3;
                let q = nib(288, i) | hi << 4;
                *o = (f32::from(q) - 32.0) * (d * sc);
            }
        }
        f => unreachable!("{f:?} has no 8-bit layout"),
    }
}
