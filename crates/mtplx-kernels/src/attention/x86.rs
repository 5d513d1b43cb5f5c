//! The AVX2 (+F16C) key-block transpose of the attention kernel: exact copies of the
//! widened values, as the scalar loop makes them, 8 × 8 at a time in registers.

use std::arch::x86_64::*;

/// Keys in a block: the kernel's `ATTN_BLOCK` (its key rows arrive as an array of this
/// length, so the two cannot disagree and compile).
const BLOCK: usize = 16;
use super::block::{EXP_LN2_HI, EXP_LN2_LO, EXP_MAGIC, EXP_POLY};
use crate::elem::groups::{q4_load8, q8_load8};
use crate::elem::{KvDtype, KvElem, Q4Group, Q8Group, GROUP};

/// The rows of one key block for one KV head: where key `j`'s `head_dim` values start.
pub(super) trait BlockRows<E> {
    /// # Safety
    /// `j < BLOCK`; the pointer is valid for the head's `head_dim` values.
    unsafe fn row(&self, j: usize) -> *const E;
}

impl<E> BlockRows<E> for [&[E]; BLOCK] {
    #[inline(always)]
    unsafe fn row(&self, j: usize) -> *const E {
        self.get_unchecked(j).as_ptr()
    }
}

/// A block inside one stored run: key `j`'s values start `j × stride` elements after `base`
/// (no slice per key to build and check).
#[derive(Clone, Copy)]
pub(super) struct Strided<E> {
    pub base: *const E,
    pub stride: usize,
}

impl<E> BlockRows<E> for Strided<E> {
    #[inline(always)]
    unsafe fn row(&self, j: usize) -> *const E {
        self.base.add(j * self.stride)
    }
}

/// Values `d..d + 8` of the row (or head) whose elements start at `row`, widened (`d` a
/// multiple of 8, so a quantized group holds all eight).
///
/// # Safety
/// AVX2, FMA and F16C are enabled in the caller; values `d .. d + 8` are in the row.
#[inline(always)]
unsafe fn load8<E: KvElem>(row: *const E, d: usize) -> __m256 {
    match E::DTYPE {
        KvDtype::F32 => _mm256_loadu_ps(row.add(d) as *const f32),
        KvDtype::F16 => _mm256_cvtph_ps(_mm_loadu_si128(row.add(d) as *const __m128i)),
        KvDtype::Bf16 => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
            _mm_loadu_si128(row.add(d) as *const __m128i),
        ))),
        KvDtype::Q8 => q8_load8((row as *const Q8Group).add(d / GROUP), d % GROUP),
        KvDtype::Q4 => q4_load8((row as *const Q4Group).add(d / GROUP), d % GROUP),
    }
}

/// Dimensions `d0..d0 + 8` of keys `j0..j0 + 8`, transposed: vector `i` holds dimension
/// `d0 + i` of the eight keys, exact copies of the widened values.
///
/// # Safety
/// AVX2 and F16C are enabled in the caller; `d0 + 8 <= rows[j].len()` for those keys.
#[inline(always)]
unsafe fn transpose8<E: KvElem, B: BlockRows<E>>(rows: &B, j0: usize, d0: usize) -> [__m256; 8] {
    // A loop, not `array::from_fn`: an outlined closure loses the caller's target features,
    // and its loads (a quantized group's unpacking) become calls.
    let mut r = [_mm256_setzero_ps(); 8];
    for (i, r) in r.iter_mut().enumerate() {
        *r = load8(rows.row(j0 + i), d0);
    }
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
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
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
        for d0 in (0..hd / 8).map(|c| c * 8) {
            for (i, c) in transpose8(rows, j0, d0).into_iter().enumerate() {
                _mm256_storeu_ps(out.add((d0 + i) * BLOCK + j0), c);
            }
        }
    }
}

/// The portable `scores` of `R` query heads against the block's 16 keys, without the
/// transposed tile: each 8 × 8 piece of the block is transposed in registers and used at
/// once (a decode step's query heads go through a block once, so storing the tile and
/// reading it back is all overhead). The same operations: per key, one fused
/// multiply-add chain in dimension order from zero, then × `scale`.
///
/// # Safety
/// AVX2, FMA and F16C are enabled in the caller; every row holds `hd` (a multiple of 8)
/// values and every query `hd`.
#[inline(always)]
pub(super) unsafe fn scores_fused<E: KvElem, B: BlockRows<E>, const R: usize>(
    rows: &B,
    hd: usize,
    qs: &[&[f32]; R],
    scale: f32,
) -> [[f32; BLOCK]; R] {
    debug_assert!(qs.iter().all(|q| q.len() >= hd));
    let mut out = [[0f32; BLOCK]; R];
    for j0 in [0, 8] {
        let mut s = [_mm256_setzero_ps(); R];
        for d0 in (0..hd / 8).map(|c| c * 8) {
            let cols = transpose8(rows, j0, d0);
            for (i, col) in cols.iter().enumerate() {
                for r in 0..R {
                    let x = _mm256_set1_ps(*qs[r].get_unchecked(d0 + i));
                    s[r] = _mm256_fmadd_ps(x, *col, s[r]);
                }
            }
        }
        let scale = _mm256_set1_ps(scale);
        for r in 0..R {
            _mm256_storeu_ps(out[r].as_mut_ptr().add(j0), _mm256_mul_ps(s[r], scale));
        }
    }
    out
}

/// [`scores_fused`] for the first `take` (1 to `G`, at most 4) of `qs`, laid out as the
/// portable `scores` returns them (the rows past `take` are zero and unused).
///
/// # Safety
/// As [`scores_fused`].
#[inline(always)]
pub(super) unsafe fn scores_fused_group<E: KvElem, const G: usize>(
    rows: &[&[E]; BLOCK],
    hd: usize,
    qs: &[&[f32]; G],
    take: usize,
    scale: f32,
) -> [[f32; BLOCK]; G] {
    debug_assert!((1..=G.min(4)).contains(&take));
    let mut out = [[0f32; BLOCK]; G];
    match take {
        1 => out[..1].copy_from_slice(&scores_fused(rows, hd, &[qs[0]], scale)),
        2 => out[..2].copy_from_slice(&scores_fused(rows, hd, &[qs[0], qs[1]], scale)),
        3 => out[..3].copy_from_slice(&scores_fused(rows, hd, &[qs[0], qs[1], qs[2]], scale)),
        _ => out[..4].copy_from_slice(&scores_fused(
            rows,
            hd,
            &[qs[0], qs[1], qs[2], qs[3]],
            scale,
        )),
    }
    out
}

/// The kernel's `exp` on eight lanes: the same operations in the same order (a clamp, fused
/// multiply-adds, the exponent built from the rounded `t`, zero below −87), so each lane
/// holds the bits the scalar `exp` gives for it, NaN included.
///
/// # Safety
/// AVX2 and FMA are enabled in the caller.
#[inline(always)]
pub(super) unsafe fn exp8(x: __m256) -> __m256 {
    let set = _mm256_set1_ps;
    // `x.clamp(-87, 88)`: `maxps`/`minps` return their second operand when one is NaN, so
    // a NaN passes through, as it does the scalar clamp.
    let xc = _mm256_min_ps(set(88.0), _mm256_max_ps(set(-87.0), x));
    let t = _mm256_fmadd_ps(xc, set(std::f32::consts::LOG2_E), set(EXP_MAGIC));
    let n = _mm256_sub_ps(t, set(EXP_MAGIC));
    let r = _mm256_fmadd_ps(n, set(-EXP_LN2_HI), xc);
    let r = _mm256_fmadd_ps(n, set(-EXP_LN2_LO), r);
    let mut p = set(EXP_POLY[0]);
    for c in &EXP_POLY[1..] {
        p = _mm256_fmadd_ps(p, r, set(*c));
    }
    let k = _mm256_sub_epi32(
        _mm256_castps_si256(t),
        _mm256_set1_epi32(EXP_MAGIC.to_bits() as i32),
    );
    let scale = _mm256_slli_epi32::<23>(_mm256_add_epi32(k, _mm256_set1_epi32(127)));
    let below = _mm256_cmp_ps::<_CMP_LT_OQ>(x, set(-87.0));
    _mm256_andnot_ps(below, _mm256_mul_ps(p, _mm256_castsi256_ps(scale)))
}

/// The largest of the 16 lanes of `a` and `b` (exact: a maximum is the same whatever the
/// order it is taken in).
#[inline(always)]
pub(super) unsafe fn max16(a: __m256, b: __m256) -> f32 {
    let m = _mm256_max_ps(a, b);
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<0b01>(m, m));
    _mm_cvtss_f32(m)
}

/// One query head's online-softmax state (the portable kernel's `State`, by field).
#[derive(Clone, Copy)]
pub(super) struct Softmax {
    pub m: f32,
    pub l: f32,
}

/// The next key block's rows of the KV head being folded, asked for from memory a row or
/// two at a time while the values are folded, so the requests go out spread over the
/// block's work instead of in one burst before it (see `item`'s prefetch). A hint only: no
/// result depends on it.
#[derive(Clone, Copy)]
pub(super) struct Ahead {
    k: *const u8,
    v: *const u8,
    /// Bytes from one row to the next.
    stride: usize,
    /// Cache lines of a row's slice of this head (0: nothing to ask for).
    lines: usize,
}

impl Ahead {
    /// Nothing ahead (the block is the last whole one). (A KV head with more than eight
    /// query heads folds a block in several groups, each asking again: the same lines,
    /// already on their way.)
    pub(super) const NONE: Ahead = Ahead {
        k: std::ptr::null(),
        v: std::ptr::null(),
        stride: 0,
        lines: 0,
    };

    /// The block whose rows start at `k` and `v`, `stride` elements apart, `len` elements
    /// of each row (the head's slice) to ask for.
    pub(super) fn rows<E>(k: &[E], v: &[E], stride: usize, len: usize) -> Ahead {
        let size = std::mem::size_of::<E>();
        Ahead {
            k: k.as_ptr() as *const u8,
            v: v.as_ptr() as *const u8,
            stride: stride * size,
            lines: (len * size).div_ceil(64),
        }
    }

    /// Asks for rows `j` of the block's K and V.
    #[inline(always)]
    pub(super) unsafe fn row(self, j: usize) {
        for l in 0..self.lines {
            // SAFETY: a prefetch never faults or changes memory; `_mm_prefetch` is SSE.
            _mm_prefetch::<_MM_HINT_T0>(self.k.wrapping_add(j * self.stride + 64 * l) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(self.v.wrapping_add(j * self.stride + 64 * l) as *const i8);
        }
    }
}

/// Prefetches the elements `off..off + len` (the item's KV heads) of the first [`BLOCK`]
/// K and V rows (`row` elements each) of a run (fewer if the run is shorter), one hint per
/// cache line, all at once ([`Ahead`]'s requests, every row now). A hint only: no result
/// depends on it.
#[inline(always)]
pub(super) fn prefetch_rows<E: KvElem>(ks: &[E], vs: &[E], row: usize, off: usize, len: usize) {
    let ahead = Ahead::rows(&ks[off..], &vs[off..], row, len);
    for j in 0..(ks.len() / row).min(BLOCK) {
        // SAFETY: a prefetch never faults; rows `j` lie inside the run.
        unsafe { ahead.row(j) };
    }
}

/// [`block_fused_hd`] with the common head dimensions as constants, so that its loops over
/// the dimensions are counted at compile time (the same operations).
///
/// # Safety
/// As [`block_fused_hd`].
#[inline(always)]
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
        64 => block_fused_hd(krows, vrows, 64, qs, scale, st, acc, ahead),
        128 => block_fused_hd(krows, vrows, 128, qs, scale, st, acc, ahead),
        _ => block_fused_hd(krows, vrows, hd, qs, scale, st, acc, ahead),
    }
}

/// A whole key block (all 16 keys seen by every one of the `R` query heads) folded into
/// those query heads of one KV head, in registers: the portable `scores` and then `fold`
/// for each head, operation for operation (the block's maximum, the rescale by
/// `exp(m − m')` when it grows, `p = exp(s − m')`, the sum `l += p[j]` in key order, and
/// `acc = fma(p[j], v[j], acc)` in key order). The value rows are widened once for all `R`
/// heads, and no tile or widened block is stored.
///
/// # Safety
/// AVX2, FMA and F16C are enabled in the caller; every key and value row and every query
/// holds `hd` (a multiple of 8) values; every `acc[r]` holds `hd`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn block_fused_hd<E: KvElem, B: BlockRows<E>, const R: usize>(
    krows: &B,
    vrows: &B,
    hd: usize,
    qs: &[&[f32]; R],
    scale: f32,
    st: &mut [Softmax; R],
    acc: [*mut f32; R],
    ahead: Ahead,
) {
    let s = scores_fused(krows, hd, qs, scale);
    let mut p = [[0f32; BLOCK]; R];
    let mut c = [1f32; R];
    let mut rescale = [false; R];
    for r in 0..R {
        let (s0, s1) = (
            _mm256_loadu_ps(s[r].as_ptr()),
            _mm256_loadu_ps(s[r].as_ptr().add(8)),
        );
        // `st.m.max(bm)`: `f32::max` returns the other operand when one is NaN.
        let bm = max16(s0, s1);
        let m_new = st[r].m.max(bm);
        if m_new != st[r].m {
            c[r] = _mm256_cvtss_f32(exp8(_mm256_set1_ps(st[r].m - m_new)));
            st[r].l *= c[r];
            rescale[r] = true;
            st[r].m = m_new;
        }
        let m = _mm256_set1_ps(st[r].m);
        _mm256_storeu_ps(p[r].as_mut_ptr(), exp8(_mm256_sub_ps(s0, m)));
        _mm256_storeu_ps(p[r].as_mut_ptr().add(8), exp8(_mm256_sub_ps(s1, m)));
        for &pj in &p[r] {
            st[r].l += pj;
        }
    }
    let passes = hd / 8;
    for (pass, d0) in (0..passes).map(|i| (i, i * 8)) {
        // The next block's rows, spread over the passes (all sixteen by the last).
        for j in pass * BLOCK / passes..(pass + 1) * BLOCK / passes {
            ahead.row(j);
        }
        let mut a = [_mm256_setzero_ps(); R];
        for r in 0..R {
            a[r] = _mm256_loadu_ps(acc[r].add(d0));
            if rescale[r] {
                a[r] = _mm256_mul_ps(a[r], _mm256_set1_ps(c[r]));
            }
        }
        // `j` indexes the rows and every head's `p` alike.
        #[allow(clippy::needless_range_loop)]
        for j in 0..BLOCK {
            let v = load8(vrows.row(j), d0);
            for r in 0..R {
                a[r] = _mm256_fmadd_ps(_mm256_set1_ps(p[r][j]), v, a[r]);
            }
        }
        for r in 0..R {
            _mm256_storeu_ps(acc[r].add(d0), a[r]);
        }
    }
}
