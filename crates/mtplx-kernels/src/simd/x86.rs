//! AVX-512F and AVX2+FMA+F16C implementations. The functions are `#[inline(always)]` without
//! `#[target_feature]`: they are only called from the kernel entry points in
//! [`super::super::isa`], which enable the features, so the intrinsics inline there.

use std::arch::x86_64::*;

use super::Simd;

/// One `__m512`.
#[derive(Clone, Copy)]
pub(crate) struct Avx512;

impl Simd for Avx512 {
    type V = __m512;
    /// (nibble table `[0, 1, …, 15]`, the same − 8, 2-bit table `[16 (i & 3) − 32]`),
    /// indexed by `vpermps`, which reads the low 4 bits of each index lane.
    type Consts = (__m512, __m512, __m512);
    const WIDE: bool = true;

    #[inline(always)]
    unsafe fn consts() -> Self::Consts {
        (
            _mm512_setr_ps(
                0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0,
                15.0,
            ),
            _mm512_setr_ps(
                -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0,
                7.0,
            ),
            _mm512_setr_ps(
                -32.0, -16.0, 0.0, 16.0, -32.0, -16.0, 0.0, 16.0, -32.0, -16.0, 0.0, 16.0, -32.0,
                -16.0, 0.0, 16.0,
            ),
        )
    }

    #[inline(always)]
    unsafe fn zero() -> __m512 {
        _mm512_setzero_ps()
    }

    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        _mm512_set1_ps(x)
    }

    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }

    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }

    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }

    #[inline(always)]
    unsafe fn load_f32(p: *const u8) -> __m512 {
        _mm512_loadu_ps(p.cast())
    }

    #[inline(always)]
    unsafe fn load_f16(p: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
    }

    #[inline(always)]
    unsafe fn load_bf16(p: *const u8) -> __m512 {
        let w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(w))
    }

    #[inline(always)]
    unsafe fn load_u8(p: *const u8) -> __m512 {
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast())))
    }

    #[inline(always)]
    unsafe fn load_i8(p: *const u8) -> __m512 {
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast())))
    }

    #[inline(always)]
    unsafe fn nibbles(k: Self::Consts, p: *const u8) -> (__m512, __m512) {
        let raw = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast()));
        (
            _mm512_permutexvar_ps(raw, k.0),
            _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(raw), k.0),
        )
    }

    #[inline(always)]
    unsafe fn nibbles_m8(k: Self::Consts, p: *const u8) -> (__m512, __m512) {
        let raw = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast()));
        (
            _mm512_permutexvar_ps(raw, k.1),
            _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(raw), k.1),
        )
    }

    #[inline(always)]
    unsafe fn high6(k: Self::Consts, p: *const u8) -> [__m512; 4] {
        let raw = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast()));
        [
            _mm512_permutexvar_ps(raw, k.2),
            _mm512_permutexvar_ps(_mm512_srli_epi32::<2>(raw), k.2),
            _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(raw), k.2),
            _mm512_permutexvar_ps(_mm512_srli_epi32::<6>(raw), k.2),
        ]
    }

    #[inline(always)]
    unsafe fn store(v: __m512, p: *mut f32) {
        _mm512_storeu_ps(p, v)
    }
}

/// Two `__m256`: lanes 0-7 and 8-15. Written out, not mapped with closures (see
/// [`Sink`](super::super::layout::Sink)).
#[derive(Clone, Copy)]
pub(crate) struct Avx2;

type P = [__m256; 2];

/// 8 bfloat16 at `p` as `f32`.
#[inline(always)]
unsafe fn bf16x8(p: *const u8) -> __m256 {
    let w = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w))
}

/// `(v & 0x30) − 32` as `f32`.
#[inline(always)]
unsafe fn high_m32(v: __m256i) -> __m256 {
    let (mask, off) = (_mm256_set1_epi32(0x30), _mm256_set1_epi32(32));
    _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(v, mask), off))
}

/// 16 `i8` lanes as `f32`.
#[inline(always)]
unsafe fn i8x16(q: __m128i) -> P {
    [
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(q, q))),
    ]
}

/// 8 bytes at `p` zero-extended to 8 `i32`.
#[inline(always)]
unsafe fn u8x8(p: *const u8) -> __m256i {
    _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast()))
}

impl Simd for Avx2 {
    type V = P;
    type Consts = ();
    const WIDE: bool = false;

    #[inline(always)]
    unsafe fn consts() {}

    #[inline(always)]
    unsafe fn zero() -> P {
        [_mm256_setzero_ps(); 2]
    }

    #[inline(always)]
    unsafe fn splat(x: f32) -> P {
        [_mm256_set1_ps(x); 2]
    }

    #[inline(always)]
    unsafe fn fma(a: P, b: P, c: P) -> P {
        [
            _mm256_fmadd_ps(a[0], b[0], c[0]),
            _mm256_fmadd_ps(a[1], b[1], c[1]),
        ]
    }

    #[inline(always)]
    unsafe fn mul(a: P, b: P) -> P {
        [_mm256_mul_ps(a[0], b[0]), _mm256_mul_ps(a[1], b[1])]
    }

    #[inline(always)]
    unsafe fn add(a: P, b: P) -> P {
        [_mm256_add_ps(a[0], b[0]), _mm256_add_ps(a[1], b[1])]
    }

    #[inline(always)]
    unsafe fn load_f32(p: *const u8) -> P {
        [_mm256_loadu_ps(p.cast()), _mm256_loadu_ps(p.add(32).cast())]
    }

    #[inline(always)]
    unsafe fn load_f16(p: *const u8) -> P {
        [
            _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
            _mm256_cvtph_ps(_mm_loadu_si128(p.add(16).cast())),
        ]
    }

    #[inline(always)]
    unsafe fn load_bf16(p: *const u8) -> P {
        [bf16x8(p), bf16x8(p.add(16))]
    }

    #[inline(always)]
    unsafe fn load_u8(p: *const u8) -> P {
        [
            _mm256_cvtepi32_ps(u8x8(p)),
            _mm256_cvtepi32_ps(u8x8(p.add(8))),
        ]
    }

    #[inline(always)]
    unsafe fn load_i8(p: *const u8) -> P {
        [
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast()))),
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(8).cast()))),
        ]
    }

    #[inline(always)]
    unsafe fn nibbles(_: (), p: *const u8) -> (P, P) {
        let mask = _mm256_set1_epi32(0xF);
        let raw = [u8x8(p), u8x8(p.add(8))];
        (
            [
                _mm256_cvtepi32_ps(_mm256_and_si256(raw[0], mask)),
                _mm256_cvtepi32_ps(_mm256_and_si256(raw[1], mask)),
            ],
            [
                _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(raw[0])),
                _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(raw[1])),
            ],
        )
    }

    #[inline(always)]
    unsafe fn nibbles_m8(_: (), p: *const u8) -> (P, P) {
        let (mask, eight) = (_mm256_set1_epi32(0xF), _mm256_set1_epi32(8));
        let raw = [u8x8(p), u8x8(p.add(8))];
        (
            [
                _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(raw[0], mask), eight)),
                _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(raw[1], mask), eight)),
            ],
            [
                _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32::<4>(raw[0]), eight)),
                _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32::<4>(raw[1]), eight)),
            ],
        )
    }

    #[inline(always)]
    unsafe fn high6(_: (), p: *const u8) -> [P; 4] {
        let raw = [u8x8(p), u8x8(p.add(8))];
        [
            [
                high_m32(_mm256_slli_epi32::<4>(raw[0])),
                high_m32(_mm256_slli_epi32::<4>(raw[1])),
            ],
            [
                high_m32(_mm256_slli_epi32::<2>(raw[0])),
                high_m32(_mm256_slli_epi32::<2>(raw[1])),
            ],
            [high_m32(raw[0]), high_m32(raw[1])],
            [
                high_m32(_mm256_srli_epi32::<2>(raw[0])),
                high_m32(_mm256_srli_epi32::<2>(raw[1])),
            ],
        ]
    }

    /// In bytes first (one 16-byte unit is the 16 lanes of an input), widened once: about
    /// a quarter fewer instructions than widening the nibbles and the fields apart and adding.
    #[inline(always)]
    unsafe fn nibble_fields(_: (), n01: *const u8, n23: *const u8, h: *const u8) -> [P; 4] {
        let (m4, m30, b32) = (_mm_set1_epi8(0x0F), _mm_set1_epi8(0x30), _mm_set1_epi8(32));
        let (a, b, f) = (
            _mm_loadu_si128(n01.cast()),
            _mm_loadu_si128(n23.cast()),
            _mm_loadu_si128(h.cast()),
        );
        // Shifts of 16-bit lanes: the bits crossing from the neighbouring byte are masked off.
        let lo = [
            _mm_and_si128(a, m4),
            _mm_and_si128(_mm_srli_epi16::<4>(a), m4),
            _mm_and_si128(b, m4),
            _mm_and_si128(_mm_srli_epi16::<4>(b), m4),
        ];
        let hi = [
            _mm_and_si128(_mm_slli_epi16::<4>(f), m30),
            _mm_and_si128(_mm_slli_epi16::<2>(f), m30),
            _mm_and_si128(f, m30),
            _mm_and_si128(_mm_srli_epi16::<2>(f), m30),
        ];
        [
            i8x16(_mm_sub_epi8(_mm_or_si128(lo[0], hi[0]), b32)),
            i8x16(_mm_sub_epi8(_mm_or_si128(lo[1], hi[1]), b32)),
            i8x16(_mm_sub_epi8(_mm_or_si128(lo[2], hi[2]), b32)),
            i8x16(_mm_sub_epi8(_mm_or_si128(lo[3], hi[3]), b32)),
        ]
    }

    #[inline(always)]
    unsafe fn store(v: P, p: *mut f32) {
        _mm256_storeu_ps(p, v[0]);
        _mm256_storeu_ps(p.add(8), v[1]);
    }
}
