//! The AVX2 (+F16C) key-block transpose of the attention kernel: exact copies of the
//! widened values, as the scalar loop makes them, 8 × 8 at a time in registers.

use std::arch::x86_64::*;

/// Keys in a block: the kernel's `ATTN_BLOCK` (its key rows arrive as an array of this
/// length, so the two cannot disagree and compile).
const BLOCK: usize = 16;
use crate::elem::{KvDtype, KvElem};

/// 8 values of `row` from `d`, widened.
///
/// # Safety
/// AVX2 and F16C are enabled in the caller; `d + 8 <= row.len()`.
#[inline(always)]
unsafe fn load8<E: KvElem>(row: &[E], d: usize) -> __m256 {
    debug_assert!(d + 8 <= row.len());
    let p = row.as_ptr().add(d);
    match E::DTYPE {
        KvDtype::F32 => _mm256_loadu_ps(p as *const f32),
        KvDtype::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
        KvDtype::Bf16 => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
            _mm_loadu_si128(p as *const __m128i),
        ))),
    }
}

/// `kt[d * 16 + j] = rows[j][d]` for the 16 keys and `hd` (a multiple of 8) dimensions.
///
/// # Safety
/// AVX2 and F16C are enabled in the caller; every row holds `hd` values; `kt` holds
/// `hd * 16`.
#[inline(always)]
pub(super) unsafe fn transpose_block<E: KvElem>(rows: &[&[E]; BLOCK], hd: usize, kt: &mut [f32]) {
    debug_assert!(kt.len() >= hd * BLOCK);
    let out = kt.as_mut_ptr();
    for j0 in [0, 8] {
        for d0 in (0..hd).step_by(8) {
            let r: [__m256; 8] = std::array::from_fn(|i| load8(rows[j0 + i], d0));
            let t0 = _mm256_unpacklo_ps(r[0], r[1]);
            let t1 = _mm256_unpackhi_ps(r[0], r[1]);
            let t2 = _mm256_unpacklo_ps(r[2], r[3]);
            let t3 = _mm256_unpackhi_ps(r[2], r[3]);
            let t4 = _mm256_unpacklo_ps(r[4], r[5]);
            let t5 = _mm256_unpackhi_ps(r[4], r[5]);
            let t6 = _mm256_unpacklo_ps(r[6], r[7]);
            let t7 = _mm256_unpackhi_ps(r[6], r[7]);
            let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            let cols = [
                _mm256_permute2f128_ps::<0x20>(s0, s4),
                _mm256_permute2f128_ps::<0x20>(s1, s5),
                _mm256_permute2f128_ps::<0x20>(s2, s6),
                _mm256_permute2f128_ps::<0x20>(s3, s7),
                _mm256_permute2f128_ps::<0x31>(s0, s4),
                _mm256_permute2f128_ps::<0x31>(s1, s5),
                _mm256_permute2f128_ps::<0x31>(s2, s6),
                _mm256_permute2f128_ps::<0x31>(s3, s7),
            ];
            for (i, c) in cols.into_iter().enumerate() {
                _mm256_storeu_ps(out.add((d0 + i) * BLOCK + j0), c);
            }
        }
    }
}
