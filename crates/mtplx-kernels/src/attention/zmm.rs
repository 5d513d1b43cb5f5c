//! A whole key block folded in registers on AVX-512 (F, BW, VL) for K/V stored in 16 bits
//! (f16, bf16): the same operations as [`super::x86::block_fused`], in the same order, on
//! sixteen keys to a vector.
//!
//! A key's score is one fused multiply-add chain in dimension order, so the keys go in the
//! lanes and the block is turned on its side. Here that is done on the stored 16-bit
//! values: eight dimensions of the sixteen keys are four 512-bit vectors (the keys' 16-byte
//! pieces put in place as they load), eight two-source word permutes (`vpermt2w`) and
//! eight widening conversions, where the 256-bit code spends 48 shuffles and 16
//! conversions on the same values. The value rows are widened sixteen lanes at a time, once
//! for four query heads, whose accumulators stay in registers through the block.
//!
//! Measured (`attend_decode`, 6,500 positions, f16, 2 threads, 2-core Zen 4, against the
//! 256-bit code): a decode step 16.1-16.8 -> 12.4-12.6 ms (SmolLM2, three query heads to
//! a KV head) and 11.3-11.9 -> 9.3-9.5 ms (Qwen2.5-0.5B, seven); a 512-query prefill
//! chunk 1.96-2.08 -> 1.88 s and 2.41-2.44 -> 2.30 s.

use std::arch::x86_64::*;

use super::block::{EXP_LN2_HI, EXP_LN2_LO, EXP_MAGIC, EXP_POLY};
use super::x86::{exp8, Ahead, BlockRows, Softmax};
use crate::elem::{KvDtype, KvElem};

/// Keys in a block (the kernel's `ATTN_BLOCK`).
const BLOCK: usize = 16;

/// Whether this path takes the element type and head dimension: 16-bit elements, heads of
/// whole 16-value vectors.
pub(super) fn takes<E: KvElem>(hd: usize) -> bool {
    matches!(E::DTYPE, KvDtype::F16 | KvDtype::Bf16) && hd.is_multiple_of(16)
}

/// Sixteen stored 16-bit values widened to `f32`, exactly.
///
/// # Safety
/// AVX-512F (and F16C's conversion, which AVX-512F has at this width) in the caller; `E`
/// is a 16-bit type.
#[inline(always)]
unsafe fn widen16<E: KvElem>(x: __m256i) -> __m512 {
    match E::DTYPE {
        KvDtype::F16 => _mm512_cvtph_ps(x),
        _ => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(x))),
    }
}

/// The word indices of a permute stage (see [`columns`]), worked out at compile time.
///
/// Stage one (`second == false`), from four keys' eight dimensions in each source (keys
/// `0..4`, then `4..8` at words 32 and up): word `i` is dimension `i / 8 + from` of key
/// `i % 8`, eight keys' four dimensions, dimension-major. Stage two, from eight keys' four
/// dimensions in each source (keys `0..8`, then `8..16`): word `i` is dimension
/// `i / 16 + from` of key `i % 16`, sixteen keys' two dimensions.
const fn stage(second: bool, from: usize) -> [i16; 32] {
    let mut out = [0i16; 32];
    let mut i = 0;
    while i < 32 {
        out[i] = if !second {
            let (d, k) = (i / 8 + from, i % 8);
            (if k < 4 {
                k * 8 + d
            } else {
                32 + (k - 4) * 8 + d
            }) as i16
        } else {
            let (d, k) = (i / 16 + from, i % 16);
            (if k < 8 { d * 8 + k } else { 32 + d * 8 + k - 8 }) as i16
        };
        i += 1;
    }
    out
}

/// The four index vectors: stage one's dimensions `0..4` and `4..8`, stage two's first two
/// and last two.
const STEPS: [[i16; 32]; 4] = [
    stage(false, 0),
    stage(false, 4),
    stage(true, 0),
    stage(true, 2),
];

/// [`STEPS`] in registers.
struct Steps {
    lo: __m512i,
    hi: __m512i,
    first: __m512i,
    last: __m512i,
}

impl Steps {
    #[inline(always)]
    unsafe fn new() -> Steps {
        let load = |x: &[i16; 32]| _mm512_loadu_si512(x.as_ptr() as *const _);
        Steps {
            lo: load(&STEPS[0]),
            hi: load(&STEPS[1]),
            first: load(&STEPS[2]),
            last: load(&STEPS[3]),
        }
    }
}

/// Dimensions `d0..d0 + 8` of the block's sixteen keys, transposed and widened: vector `i`
/// holds dimension `d0 + i` of keys `0..16`, exact copies of the stored values.
///
/// # Safety
/// AVX-512F and BW in the caller; `E` is a 16-bit type; every row holds `d0 + 8` values.
#[inline(always)]
unsafe fn columns<E: KvElem, B: BlockRows<E>>(rows: &B, d0: usize, st: &Steps) -> [__m512; 8] {
    let part = |j: usize| _mm_loadu_si128(rows.row(j).add(d0) as *const __m128i);
    // Four keys' eight dimensions to a vector.
    let four = |j: usize| {
        let x = _mm512_castsi128_si512(part(j));
        let x = _mm512_inserti32x4::<1>(x, part(j + 1));
        let x = _mm512_inserti32x4::<2>(x, part(j + 2));
        _mm512_inserti32x4::<3>(x, part(j + 3))
    };
    let (z0, z1, z2, z3) = (four(0), four(4), four(8), four(12));
    let a_lo = _mm512_permutex2var_epi16(z0, st.lo, z1);
    let a_hi = _mm512_permutex2var_epi16(z0, st.hi, z1);
    let b_lo = _mm512_permutex2var_epi16(z2, st.lo, z3);
    let b_hi = _mm512_permutex2var_epi16(z2, st.hi, z3);
    let pairs = [
        _mm512_permutex2var_epi16(a_lo, st.first, b_lo),
        _mm512_permutex2var_epi16(a_lo, st.last, b_lo),
        _mm512_permutex2var_epi16(a_hi, st.first, b_hi),
        _mm512_permutex2var_epi16(a_hi, st.last, b_hi),
    ];
    let mut out = [_mm512_setzero_ps(); 8];
    for (p, pair) in pairs.iter().enumerate() {
        out[2 * p] = widen16::<E>(_mm512_castsi512_si256(*pair));
        out[2 * p + 1] = widen16::<E>(_mm512_extracti64x4_epi64::<1>(*pair));
    }
    out
}

/// The kernel's `exp` on sixteen lanes: [`exp8`]'s operations, lane for lane.
///
/// # Safety
/// AVX-512F in the caller.
#[inline(always)]
pub(super) unsafe fn exp16(x: __m512) -> __m512 {
    let set = _mm512_set1_ps;
    // The same operand order as `exp8` (`maxps`/`minps` return the second operand when one
    // is NaN).
    let xc = _mm512_min_ps(set(88.0), _mm512_max_ps(set(-87.0), x));
    let t = _mm512_fmadd_ps(xc, set(std::f32::consts::LOG2_E), set(EXP_MAGIC));
    let n = _mm512_sub_ps(t, set(EXP_MAGIC));
    let r = _mm512_fmadd_ps(n, set(-EXP_LN2_HI), xc);
    let r = _mm512_fmadd_ps(n, set(-EXP_LN2_LO), r);
    let mut p = set(EXP_POLY[0]);
    for c in &EXP_POLY[1..] {
        p = _mm512_fmadd_ps(p, r, set(*c));
    }
    let k = _mm512_sub_epi32(
        _mm512_castps_si512(t),
        _mm512_set1_epi32(EXP_MAGIC.to_bits() as i32),
    );
    let scale = _mm512_slli_epi32::<23>(_mm512_add_epi32(k, _mm512_set1_epi32(127)));
    let below = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, set(-87.0));
    _mm512_maskz_mov_ps(!below, _mm512_mul_ps(p, _mm512_castsi512_ps(scale)))
}

/// The largest of the sixteen lanes, as [`super::x86`]'s `max16` takes it (the lower eight
/// against the upper eight, then halves): exact, and the same when a lane is NaN.
#[inline(always)]
unsafe fn max16(s: __m512) -> f32 {
    let (a, b) = (
        _mm512_castps512_ps256(s),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(s))),
    );
    super::x86::max16(a, b)
}

/// [`super::x86::block_fused`] for 16-bit K/V: the scores of the `R` query heads against
/// the block's sixteen keys (per key one fused multiply-add chain in dimension order from
/// zero, then × `scale`), then for each head the block's maximum, the rescale by
/// `exp(m − m')` when it grows, `p = exp(s − m')`, `l += p[j]` in key order and
/// `acc = fma(p[j], v[j], acc)` in key order.
///
/// # Safety
/// AVX-512F, BW and VL, FMA and F16C in the caller; [`takes`] holds for `E` and `hd`; every
/// key and value row and every query holds `hd` values; every `acc[r]` holds `hd`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn block_fused<E: KvElem, B: BlockRows<E>, const R: usize>(
    krows: &B,
    vrows: &B,
    hd: usize,
    qs: &[&[f32]; R],
    scale: f32,
    st: &mut [Softmax; R],
    acc: [*mut f32; R],
    ahead: Ahead,
) {
    match hd {
        64 => block_hd(krows, vrows, 64, qs, scale, st, acc, ahead),
        128 => block_hd(krows, vrows, 128, qs, scale, st, acc, ahead),
        _ => block_hd(krows, vrows, hd, qs, scale, st, acc, ahead),
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn block_hd<E: KvElem, B: BlockRows<E>, const R: usize>(
    krows: &B,
    vrows: &B,
    hd: usize,
    qs: &[&[f32]; R],
    scale: f32,
    st: &mut [Softmax; R],
    acc: [*mut f32; R],
    ahead: Ahead,
) {
    debug_assert!(takes::<E>(hd) && qs.iter().all(|q| q.len() >= hd));
    let steps = Steps::new();
    let mut s = [_mm512_setzero_ps(); R];
    for d0 in (0..hd / 8).map(|c| c * 8) {
        let cols = columns(krows, d0, &steps);
        for (i, col) in cols.iter().enumerate() {
            for r in 0..R {
                let x = _mm512_set1_ps(*qs[r].get_unchecked(d0 + i));
                s[r] = _mm512_fmadd_ps(x, *col, s[r]);
            }
        }
    }
    let mut p = [[0f32; BLOCK]; R];
    let mut c = [1f32; R];
    let mut rescale = [false; R];
    for r in 0..R {
        let sr = _mm512_mul_ps(s[r], _mm512_set1_ps(scale));
        // `st.m.max(bm)`: `f32::max` returns the other operand when one is NaN.
        let m_new = st[r].m.max(max16(sr));
        if m_new != st[r].m {
            c[r] = _mm256_cvtss_f32(exp8(_mm256_set1_ps(st[r].m - m_new)));
            st[r].l *= c[r];
            rescale[r] = true;
            st[r].m = m_new;
        }
        let pr = exp16(_mm512_sub_ps(sr, _mm512_set1_ps(st[r].m)));
        _mm512_storeu_ps(p[r].as_mut_ptr(), pr);
        for &pj in &p[r] {
            st[r].l += pj;
        }
    }
    // Four heads at a time (more would not stay in registers).
    if R <= 4 {
        values::<E, B, R>(vrows, hd, &p, c, rescale, acc, ahead);
    } else {
        for h0 in (0..R).step_by(4) {
            if R - h0 >= 4 {
                let pick = |h: usize| h0 + h;
                values::<E, B, 4>(
                    vrows,
                    hd,
                    &std::array::from_fn(|h| p[pick(h)]),
                    std::array::from_fn(|h| c[pick(h)]),
                    std::array::from_fn(|h| rescale[pick(h)]),
                    std::array::from_fn(|h| acc[pick(h)]),
                    if h0 == 0 { ahead } else { Ahead::NONE },
                );
            } else {
                for h in h0..R {
                    values::<E, B, 1>(
                        vrows,
                        hd,
                        &[p[h]],
                        [c[h]],
                        [rescale[h]],
                        [acc[h]],
                        Ahead::NONE,
                    );
                }
            }
        }
    }
}

/// `acc[r] = fma(p[r][j], v[j], acc[r])` for the block's keys in order (after
/// `acc[r] × c[r]` where `rescale[r]`), for `H` heads, four sixteen-lane chunks of every
/// head's accumulator in registers through the block's keys at a time.
///
/// # Safety
/// As [`block_fused`].
#[inline(always)]
unsafe fn values<E: KvElem, B: BlockRows<E>, const H: usize>(
    vrows: &B,
    hd: usize,
    p: &[[f32; BLOCK]; H],
    c: [f32; H],
    rescale: [bool; H],
    acc: [*mut f32; H],
    ahead: Ahead,
) {
    let chunks = hd / 16;
    for c0 in (0..chunks).step_by(4) {
        // The next block's rows during the first pass over the keys.
        let ahead = if c0 == 0 { ahead } else { Ahead::NONE };
        if chunks - c0 >= 4 {
            value_chunks::<E, B, H, 4>(vrows, c0, p, c, rescale, acc, ahead);
        } else {
            for ch in c0..chunks {
                let ahead = if ch == c0 { ahead } else { Ahead::NONE };
                value_chunks::<E, B, H, 1>(vrows, ch, p, c, rescale, acc, ahead);
            }
        }
    }
}

/// [`values`] for the `N` chunks from `c0`.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn value_chunks<E: KvElem, B: BlockRows<E>, const H: usize, const N: usize>(
    vrows: &B,
    c0: usize,
    p: &[[f32; BLOCK]; H],
    c: [f32; H],
    rescale: [bool; H],
    acc: [*mut f32; H],
    ahead: Ahead,
) {
    let mut a = [[_mm512_setzero_ps(); N]; H];
    for r in 0..H {
        for ch in 0..N {
            a[r][ch] = _mm512_loadu_ps(acc[r].add((c0 + ch) * 16));
            if rescale[r] {
                a[r][ch] = _mm512_mul_ps(a[r][ch], _mm512_set1_ps(c[r]));
            }
        }
    }
    for j in 0..BLOCK {
        ahead.row(j);
        let mut v = [_mm512_setzero_ps(); N];
        for ch in 0..N {
            let at = vrows.row(j).add((c0 + ch) * 16);
            v[ch] = widen16::<E>(_mm256_loadu_si256(at as *const __m256i));
        }
        for r in 0..H {
            let pj = _mm512_set1_ps(p[r][j]);
            for ch in 0..N {
                a[r][ch] = _mm512_fmadd_ps(pj, v[ch], a[r][ch]);
            }
        }
    }
    for r in 0..H {
        for ch in 0..N {
            _mm512_storeu_ps(acc[r].add((c0 + ch) * 16), a[r][ch]);
        }
    }
}
