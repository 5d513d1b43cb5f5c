//! One 16-lane vector of `f32`, whatever the instruction set: a `__m512` (AVX-512), two
//! `__m256` (AVX2), four `float32x4_t` (NEON) or an array (portable).
//!
//! Every operation is exact or correctly rounded per lane (`fma` is fused everywhere, the
//! portable one through [`f32::mul_add`]), so each implementation gives the same bits.

#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
pub(crate) mod scalar;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

/// Operations on a 16-lane `f32` vector. All `unsafe`: callers guarantee that the pointers
/// are valid for the bytes read or written, and (for the SIMD implementations) that the CPU
/// has the instruction set.
pub(crate) trait Simd {
    type V: Copy;
    /// Lookup tables built once per kernel call.
    type Consts: Copy;
    /// Whether the register file holds 16 accumulators plus temporaries (selects the
    /// row/tile blocking; numerics do not depend on it).
    const WIDE: bool;

    unsafe fn consts() -> Self::Consts;
    unsafe fn zero() -> Self::V;
    unsafe fn splat(x: f32) -> Self::V;
    /// `a × b + c`, rounded once.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// 16 `f32`.
    unsafe fn load_f32(p: *const u8) -> Self::V;
    /// 16 little-endian IEEE half floats.
    unsafe fn load_f16(p: *const u8) -> Self::V;
    /// 16 little-endian bfloat16.
    unsafe fn load_bf16(p: *const u8) -> Self::V;
    /// 16 `u8` as `f32`.
    unsafe fn load_u8(p: *const u8) -> Self::V;
    /// 16 `i8` as `f32`.
    unsafe fn load_i8(p: *const u8) -> Self::V;
    /// 16 bytes: (low nibbles, high nibbles) as `f32` in `0..16`.
    unsafe fn nibbles(k: Self::Consts, p: *const u8) -> (Self::V, Self::V);
    /// 16 bytes: (low nibbles − 8, high nibbles − 8) as `f32` in `-8..8`.
    unsafe fn nibbles_m8(k: Self::Consts, p: *const u8) -> (Self::V, Self::V);
    /// 16 bytes: the four 2-bit fields `c` of each byte (bits 0-1, 2-3, 4-5, 6-7) as
    /// `16 c − 32`, `f32` in `{-32, -16, 0, 16}`.
    unsafe fn high6(k: Self::Consts, p: *const u8) -> [Self::V; 4];
    /// The four inputs of a group of a nibble + 2-bit-field format (the 5-bit formats and
    /// Q6_K): `lo + (16 c − 32)`, `lo` the nibbles of the pair units at `n01` (inputs 0, 1)
    /// and `n23` (inputs 2, 3), `c` the fields of the unit at `h` (see [`Self::high6`]). Whole
    /// numbers in `-32..32`, so every way of computing them gives the same `f32`s.
    #[inline(always)]
    unsafe fn nibble_fields(
        k: Self::Consts,
        n01: *const u8,
        n23: *const u8,
        h: *const u8,
    ) -> [Self::V; 4] {
        let (lo0, lo1) = Self::nibbles(k, n01);
        let (lo2, lo3) = Self::nibbles(k, n23);
        let hi = Self::high6(k, h);
        [
            Self::add(lo0, hi[0]),
            Self::add(lo1, hi[1]),
            Self::add(lo2, hi[2]),
            Self::add(lo3, hi[3]),
        ]
    }
    unsafe fn store(v: Self::V, p: *mut f32);
}
