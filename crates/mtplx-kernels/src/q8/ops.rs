//! The integer operations of the 8-bit kernels, on top of [`Simd`]'s 16 `f32` lanes: a
//! 16-lane vector of `i32` (one output row per lane, as everywhere in this crate) and a
//! 64-byte weight operand (four consecutive inputs of each of the 16 rows, lane `j` holding
//! bytes `4j..4j + 4`).
//!
//! Every operation is exact integer arithmetic, so each implementation gives the same
//! numbers: AVX-512 VNNI (`vpdpbusd`), AVX2 (`vpmaddubsw` + `vpmaddwd`, with operands kept
//! small enough that the 16-bit pair sums never saturate) and the portable arrays.

use crate::simd::Simd;

/// 8-bit dot products and 32-bit lane arithmetic. `unsafe` as [`Simd`]'s operations are.
pub(crate) trait Dot: Simd {
    /// 16 lanes of `i32`.
    type I: Copy;
    /// 64 bytes: 16 lanes of 4 bytes.
    type W: Copy;

    unsafe fn izero() -> Self::I;
    unsafe fn isplat(x: i32) -> Self::I;
    unsafe fn iadd(a: Self::I, b: Self::I) -> Self::I;
    /// `a × b` per lane (low 32 bits; the kernels' values never overflow).
    unsafe fn imul(a: Self::I, b: Self::I) -> Self::I;
    /// 16 `u8` as `i32`.
    unsafe fn load_u8_i(p: *const u8) -> Self::I;
    /// 16 `i8` as `i32`.
    unsafe fn load_i8_i(p: *const u8) -> Self::I;
    /// Each lane as `f32`, rounded to nearest even.
    unsafe fn to_f32(a: Self::I) -> Self::V;

    unsafe fn load_w(p: *const u8) -> Self::W;
    /// The low nibble of each byte.
    unsafe fn lo4(w: Self::W) -> Self::W;
    /// The high nibble of each byte.
    unsafe fn hi4(w: Self::W) -> Self::W;
    /// `w | 16` in the bytes whose bit is set in the 64-bit little-endian mask at `bits`
    /// (bit `i` for byte `i`).
    unsafe fn or_bit4(w: Self::W, bits: *const u8) -> Self::W;
    /// `w | (((h >> 2 f) & 3) << 4)` per byte: 2-bit field `f` of `h` as bits 4-5.
    unsafe fn or_field(w: Self::W, h: Self::W, f: u32) -> Self::W;
    /// `acc + Σ_k w[4j + k] × x[k]` per lane `j`: `w` unsigned below 64, `x` the four
    /// signed bytes of `x4` (little-endian).
    unsafe fn dot_u(acc: Self::I, w: Self::W, x4: i32) -> Self::I;
    /// As [`Self::dot_u`] with `w` signed (`-128..128`) and `x` in `-127..=127`.
    unsafe fn dot_s(acc: Self::I, w: Self::W, x4: i32) -> Self::I;
}

pub(crate) mod portable {
    use crate::q8::ops::Dot;
    use crate::simd::scalar::Scalar;

    type I = [i32; 16];
    type W = [u8; 64];

    #[inline(always)]
    fn xs(x4: i32) -> [i32; 4] {
        x4.to_le_bytes().map(|b| i32::from(b as i8))
    }

    impl Dot for Scalar {
        type I = I;
        type W = W;

        #[inline(always)]
        unsafe fn izero() -> I {
            [0; 16]
        }

        #[inline(always)]
        unsafe fn isplat(x: i32) -> I {
            [x; 16]
        }

        #[inline(always)]
        unsafe fn iadd(a: I, b: I) -> I {
            std::array::from_fn(|j| a[j].wrapping_add(b[j]))
        }

        #[inline(always)]
        unsafe fn imul(a: I, b: I) -> I {
            std::array::from_fn(|j| a[j].wrapping_mul(b[j]))
        }

        #[inline(always)]
        unsafe fn load_u8_i(p: *const u8) -> I {
            std::array::from_fn(|j| i32::from(*p.add(j)))
        }

        #[inline(always)]
        unsafe fn load_i8_i(p: *const u8) -> I {
            std::array::from_fn(|j| i32::from(*p.add(j) as i8))
        }

        #[inline(always)]
        unsafe fn to_f32(a: I) -> [f32; 16] {
            a.map(|v| v as f32)
        }

        #[inline(always)]
        unsafe fn load_w(p: *const u8) -> W {
            *p.cast::<W>()
        }

        #[inline(always)]
        unsafe fn lo4(w: W) -> W {
            w.map(|b| b & 0xF)
        }

        #[inline(always)]
        unsafe fn hi4(w: W) -> W {
            w.map(|b| b >> 4)
        }

        #[inline(always)]
        unsafe fn or_bit4(w: W, bits: *const u8) -> W {
            let m = u64::from_le_bytes(*bits.cast::<[u8; 8]>());
            std::array::from_fn(|i| w[i] | (((m >> i) & 1) as u8) << 4)
        }

        #[inline(always)]
        unsafe fn or_field(w: W, h: W, f: u32) -> W {
            std::array::from_fn(|i| w[i] | ((h[i] >> (2 * f)) & 3) << 4)
        }

        #[inline(always)]
        unsafe fn dot_u(acc: I, w: W, x4: i32) -> I {
            let x = xs(x4);
            std::array::from_fn(|j| (0..4).fold(acc[j], |s, k| s + i32::from(w[4 * j + k]) * x[k]))
        }

        #[inline(always)]
        unsafe fn dot_s(acc: I, w: W, x4: i32) -> I {
            let x = xs(x4);
            std::array::from_fn(|j| {
                (0..4).fold(acc[j], |s, k| s + i32::from(w[4 * j + k] as i8) * x[k])
            })
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    use crate::q8::ops::Dot;
    use crate::simd::x86::{Avx2, Avx512};

    /// Needs AVX-512 BW and VNNI besides F (the entry point enables them).
    impl Dot for Avx512 {
        type I = __m512i;
        type W = __m512i;

        #[inline(always)]
        unsafe fn izero() -> __m512i {
            _mm512_setzero_si512()
        }

        #[inline(always)]
        unsafe fn isplat(x: i32) -> __m512i {
            _mm512_set1_epi32(x)
        }

        #[inline(always)]
        unsafe fn iadd(a: __m512i, b: __m512i) -> __m512i {
            _mm512_add_epi32(a, b)
        }

        #[inline(always)]
        unsafe fn imul(a: __m512i, b: __m512i) -> __m512i {
            _mm512_mullo_epi32(a, b)
        }

        #[inline(always)]
        unsafe fn load_u8_i(p: *const u8) -> __m512i {
            _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast()))
        }

        #[inline(always)]
        unsafe fn load_i8_i(p: *const u8) -> __m512i {
            _mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast()))
        }

        #[inline(always)]
        unsafe fn to_f32(a: __m512i) -> __m512 {
            _mm512_cvtepi32_ps(a)
        }

        #[inline(always)]
        unsafe fn load_w(p: *const u8) -> __m512i {
            _mm512_loadu_si512(p.cast())
        }

        #[inline(always)]
        unsafe fn lo4(w: __m512i) -> __m512i {
            _mm512_and_si512(w, _mm512_set1_epi8(0xF))
        }

        #[inline(always)]
        unsafe fn hi4(w: __m512i) -> __m512i {
            _mm512_and_si512(_mm512_srli_epi16::<4>(w), _mm512_set1_epi8(0xF))
        }

        #[inline(always)]
        unsafe fn or_bit4(w: __m512i, bits: *const u8) -> __m512i {
            let m: __mmask64 = u64::from_le_bytes(*bits.cast::<[u8; 8]>());
            _mm512_or_si512(w, _mm512_maskz_mov_epi8(m, _mm512_set1_epi8(16)))
        }

        #[inline(always)]
        unsafe fn or_field(w: __m512i, h: __m512i, f: u32) -> __m512i {
            // ((h >> 2f) & 3) << 4 == (h << (4 − 2f)) & 0x30 for f ≤ 2, (h >> 2) & 0x30 for 3;
            // 16-bit shifts are fine: the mask drops what crosses a byte.
            let s = match f {
                0 => _mm512_slli_epi16::<4>(h),
                1 => _mm512_slli_epi16::<2>(h),
                2 => h,
                _ => _mm512_srli_epi16::<2>(h),
            };
            _mm512_or_si512(w, _mm512_and_si512(s, _mm512_set1_epi8(0x30)))
        }

        #[inline(always)]
        unsafe fn dot_u(acc: __m512i, w: __m512i, x4: i32) -> __m512i {
            _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(x4))
        }

        #[inline(always)]
        unsafe fn dot_s(acc: __m512i, w: __m512i, x4: i32) -> __m512i {
            // |w| × (x with w's sign): `vpdpbusd` takes its first operand unsigned; |−128|
            // is 128 as a `u8`, which is right.
            let neg = _mm512_movepi8_mask(w);
            let x = _mm512_set1_epi32(x4);
            let sx = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
            _mm512_dpbusd_epi32(acc, _mm512_abs_epi8(w), sx)
        }
    }

    /// Two `__m256i` halves: lanes 0-7 and 8-15.
    impl Dot for Avx2 {
        type I = [__m256i; 2];
        type W = [__m256i; 2];

        #[inline(always)]
        unsafe fn izero() -> Self::I {
            [_mm256_setzero_si256(); 2]
        }

        #[inline(always)]
        unsafe fn isplat(x: i32) -> Self::I {
            [_mm256_set1_epi32(x); 2]
        }

        #[inline(always)]
        unsafe fn iadd(a: Self::I, b: Self::I) -> Self::I {
            [_mm256_add_epi32(a[0], b[0]), _mm256_add_epi32(a[1], b[1])]
        }

        #[inline(always)]
        unsafe fn imul(a: Self::I, b: Self::I) -> Self::I {
            [
                _mm256_mullo_epi32(a[0], b[0]),
                _mm256_mullo_epi32(a[1], b[1]),
            ]
        }

        #[inline(always)]
        unsafe fn load_u8_i(p: *const u8) -> Self::I {
            [
                _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast())),
                _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8).cast())),
            ]
        }

        #[inline(always)]
        unsafe fn load_i8_i(p: *const u8) -> Self::I {
            [
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast())),
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(8).cast())),
            ]
        }

        #[inline(always)]
        unsafe fn to_f32(a: Self::I) -> Self::V {
            [_mm256_cvtepi32_ps(a[0]), _mm256_cvtepi32_ps(a[1])]
        }

        #[inline(always)]
        unsafe fn load_w(p: *const u8) -> Self::W {
            [
                _mm256_loadu_si256(p.cast()),
                _mm256_loadu_si256(p.add(32).cast()),
            ]
        }

        #[inline(always)]
        unsafe fn lo4(w: Self::W) -> Self::W {
            let m = _mm256_set1_epi8(0xF);
            [_mm256_and_si256(w[0], m), _mm256_and_si256(w[1], m)]
        }

        #[inline(always)]
        unsafe fn hi4(w: Self::W) -> Self::W {
            let m = _mm256_set1_epi8(0xF);
            [
                _mm256_and_si256(_mm256_srli_epi16::<4>(w[0]), m),
                _mm256_and_si256(_mm256_srli_epi16::<4>(w[1]), m),
            ]
        }

        #[inline(always)]
        unsafe fn or_bit4(w: Self::W, bits: *const u8) -> Self::W {
            // Each byte takes the mask byte that holds its bit, then tests that bit. (Macros,
            // not closures: an outlined closure would lose the entry's target features.)
            let spread_idx = _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                3, 3, 3, 3,
            );
            let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
            let sixteen = _mm256_set1_epi8(16);
            macro_rules! half {
                ($h:expr) => {{
                    let m = _mm256_set1_epi32(bits.add(4 * $h).cast::<i32>().read_unaligned());
                    let spread = _mm256_shuffle_epi8(m, spread_idx);
                    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
                    _mm256_or_si256(w[$h], _mm256_and_si256(set, sixteen))
                }};
            }
            [half!(0), half!(1)]
        }

        #[inline(always)]
        unsafe fn or_field(w: Self::W, h: Self::W, f: u32) -> Self::W {
            let m = _mm256_set1_epi8(0x30);
            let s = match f {
                0 => [_mm256_slli_epi16::<4>(h[0]), _mm256_slli_epi16::<4>(h[1])],
                1 => [_mm256_slli_epi16::<2>(h[0]), _mm256_slli_epi16::<2>(h[1])],
                2 => h,
                _ => [_mm256_srli_epi16::<2>(h[0]), _mm256_srli_epi16::<2>(h[1])],
            };
            [
                _mm256_or_si256(w[0], _mm256_and_si256(s[0], m)),
                _mm256_or_si256(w[1], _mm256_and_si256(s[1], m)),
            ]
        }

        #[inline(always)]
        unsafe fn dot_u(acc: Self::I, w: Self::W, x4: i32) -> Self::I {
            // Pair sums of u8 × i8 fit in i16 here: w < 64 and |x| ≤ 127 (2 × 63 × 127).
            let x = _mm256_set1_epi32(x4);
            let one = _mm256_set1_epi16(1);
            let d0 = _mm256_madd_epi16(_mm256_maddubs_epi16(w[0], x), one);
            let d1 = _mm256_madd_epi16(_mm256_maddubs_epi16(w[1], x), one);
            [_mm256_add_epi32(acc[0], d0), _mm256_add_epi32(acc[1], d1)]
        }

        #[inline(always)]
        unsafe fn dot_s(acc: Self::I, w: Self::W, x4: i32) -> Self::I {
            // |w| × (x with w's sign): pair sums at most 2 × 128 × 127, within i16.
            let x = _mm256_set1_epi32(x4);
            let one = _mm256_set1_epi16(1);
            let p0 = _mm256_maddubs_epi16(_mm256_sign_epi8(w[0], w[0]), _mm256_sign_epi8(x, w[0]));
            let p1 = _mm256_maddubs_epi16(_mm256_sign_epi8(w[1], w[1]), _mm256_sign_epi8(x, w[1]));
            [
                _mm256_add_epi32(acc[0], _mm256_madd_epi16(p0, one)),
                _mm256_add_epi32(acc[1], _mm256_madd_epi16(p1, one)),
            ]
        }
    }
}
