//! The quantized element types: a group of [`GROUP`] values as small integers and `f16`
//! scales, quantized and dequantized as ggml's `q8_0` and `q4_1` blocks are (the same
//! fields in the same order, so a group's bytes are ggml's block's).
//!
//! Dequantization is exact or one rounding: `q × d` (an 8- or 4-bit integer times an
//! 11-bit significand) is exact in `f32`, and `q × d + m` rounds once (computed as one fused
//! multiply-add, which equals ggml's `q * d + m` because the product is exact). Every
//! reader (the portable loop, the AVX2 one, the attention kernel's loads) therefore widens a
//! stored group to the same `f32`s.

use half::f16;

/// The largest finite half: stored halves and scales saturate there.
pub(crate) const F16_MAX: f32 = 65504.0;

/// Values in a quantized group.
pub const GROUP: usize = 32;

/// 32 values as `q × d`: `q` in `-127..=127`, `d = max|x| / 127` as `f16` (ggml's `q8_0`).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq)]
pub struct Q8Group {
    pub d: f16,
    pub q: [i8; GROUP],
}

// SAFETY: `repr(C)`, an `f16` (2 bytes, align 2) then 32 bytes: 34 bytes, no padding, and
// every bit pattern of each field is a valid value.
unsafe impl bytemuck::Zeroable for Q8Group {}
unsafe impl bytemuck::Pod for Q8Group {}

/// 32 values as `q × d + m`: `q` in `0..16` (value `j`'s nibble: the low one of byte `j`
/// for `j < 16`, the high one of byte `j − 16` after), `d = (max − min) / 15` and `m = min`
/// as `f16` (ggml's `q4_1`).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq)]
pub struct Q4Group {
    pub d: f16,
    pub m: f16,
    pub q: [u8; GROUP / 2],
}

// SAFETY: `repr(C)`, two `f16`s then 16 bytes: 20 bytes, align 2, no padding, every bit
// pattern valid.
unsafe impl bytemuck::Zeroable for Q4Group {}
unsafe impl bytemuck::Pod for Q4Group {}

/// `x` as a stored `f16` scale: saturated like a stored half (an infinite or NaN scale
/// would turn every value of the group into one).
fn scale(x: f32) -> f16 {
    f16::from_f32(if x.is_nan() {
        0.0
    } else {
        x.clamp(-F16_MAX, F16_MAX)
    })
}

impl Q8Group {
    /// ggml's `quantize_row_q8_0_ref` for one group.
    pub fn quantize(x: &[f32]) -> Q8Group {
        debug_assert_eq!(x.len(), GROUP);
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut g = Q8Group {
            d: scale(d),
            q: [0; GROUP],
        };
        for (q, &v) in g.q.iter_mut().zip(x) {
            // `as` saturates (and takes NaN to 0); `round` is `roundf`, half away from zero.
            *q = (v * id).round() as i8;
        }
        g
    }

    /// Value `j`.
    #[inline(always)]
    pub fn value(&self, j: usize) -> f32 {
        f32::from(self.q[j]) * self.d.to_f32()
    }
}

impl Q4Group {
    /// ggml's `quantize_row_q4_1_ref` for one group.
    pub fn quantize(x: &[f32]) -> Q4Group {
        debug_assert_eq!(x.len(), GROUP);
        let (min, max) = x
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
                (lo.min(v), hi.max(v))
            });
        let (min, max) = if min > max { (0.0, 0.0) } else { (min, max) };
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut g = Q4Group {
            d: scale(d),
            m: scale(min),
            q: [0; GROUP / 2],
        };
        // `as u8` saturates (negative and NaN to 0), then at most 15: ggml's
        // `MIN(15, (int8_t)(x + 0.5f))` for the values it defines.
        let nib = |v: f32| (((v - min) * id + 0.5) as u8).min(15);
        for j in 0..GROUP / 2 {
            g.q[j] = nib(x[j]) | (nib(x[j + GROUP / 2]) << 4);
        }
        g
    }

    /// The 4-bit integer of value `j`.
    #[inline(always)]
    pub fn nibble(&self, j: usize) -> u8 {
        if j < GROUP / 2 {
            self.q[j] & 0xF
        } else {
            self.q[j - GROUP / 2] >> 4
        }
    }

    /// Value `j`.
    #[inline(always)]
    pub fn value(&self, j: usize) -> f32 {
        f32::from(self.nibble(j)).mul_add(self.d.to_f32(), self.m.to_f32())
    }
}

/// `h` widened to `f32` (exactly) in eight lanes, by `vcvtph2ps` in the caller's code: the
/// `half` crate's conversion is a call that checks the CPU each time, which cost the
/// attention kernel most of its time over quantized rows.
///
/// # Safety
/// F16C is enabled in the caller.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn splat_half(h: f16) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    _mm256_cvtph_ps(_mm_set1_epi16(h.to_bits() as i16))
}

/// Eight values of a group from `j0` (a multiple of 8), widened: [`Q8Group::value`] lane by
/// lane (an exact product).
///
/// # Safety
/// AVX2 and F16C are enabled in the caller; `j0 + 8 <= GROUP`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn q8_load8(g: *const Q8Group, j0: usize) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let q = _mm_loadl_epi64((*g).q.as_ptr().add(j0) as *const __m128i);
    _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
        splat_half((*g).d),
    )
}

/// Eight values of a group from `j0` (a multiple of 8), widened: [`Q4Group::value`] lane by
/// lane (one fused multiply-add).
///
/// # Safety
/// AVX2, FMA and F16C are enabled in the caller; `j0 + 8 <= GROUP`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn q4_load8(g: *const Q4Group, j0: usize) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    // Values 0..16 are the low nibbles of bytes 0..16, values 16..32 the high ones.
    let bytes = _mm_loadl_epi64((*g).q.as_ptr().add(j0 % (GROUP / 2)) as *const __m128i);
    let wide = _mm256_cvtepu8_epi32(bytes);
    let q = if j0 < GROUP / 2 {
        _mm256_and_si256(wide, _mm256_set1_epi32(0xF))
    } else {
        _mm256_srli_epi32::<4>(wide)
    };
    _mm256_fmadd_ps(
        _mm256_cvtepi32_ps(q),
        splat_half((*g).d),
        splat_half((*g).m),
    )
}

/// What the two quantized element types share: a group of [`GROUP`] values, quantized from
/// those values alone and read back one value, or (x86) eight, at a time.
pub(crate) trait Group: Copy + Default {
    /// The group holding `x` ([`GROUP`] values).
    fn quantize(x: &[f32]) -> Self;
    /// Value `j`, exactly as every reader computes it.
    fn value(&self, j: usize) -> f32;
    /// Values `j0..j0 + 8` ([`q8_load8`], [`q4_load8`]).
    ///
    /// # Safety
    /// AVX2, FMA and F16C are enabled in the caller; `j0` is a multiple of 8 below [`GROUP`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(g: *const Self, j0: usize) -> std::arch::x86_64::__m256;
}

impl Group for Q8Group {
    fn quantize(x: &[f32]) -> Self {
        Q8Group::quantize(x)
    }
    #[inline(always)]
    fn value(&self, j: usize) -> f32 {
        Q8Group::value(self, j)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(g: *const Self, j0: usize) -> std::arch::x86_64::__m256 {
        q8_load8(g, j0)
    }
}

impl Group for Q4Group {
    fn quantize(x: &[f32]) -> Self {
        Q4Group::quantize(x)
    }
    #[inline(always)]
    fn value(&self, j: usize) -> f32 {
        Q4Group::value(self, j)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(g: *const Self, j0: usize) -> std::arch::x86_64::__m256 {
        q4_load8(g, j0)
    }
}

/// `dst` holds `src` (`dst.len() × GROUP` values) as groups.
pub(crate) fn narrow_groups<G: Group>(src: &[f32], dst: &mut [G]) {
    debug_assert_eq!(src.len(), dst.len() * GROUP);
    for (g, x) in dst.iter_mut().zip(src.chunks_exact(GROUP)) {
        *g = G::quantize(x);
    }
}

/// `dst` = the values of `src`, one at a time.
pub(crate) fn widen_groups_portable<G: Group>(src: &[G], dst: &mut [f32]) {
    for (g, out) in src.iter().zip(dst.chunks_exact_mut(GROUP)) {
        for (j, o) in out.iter_mut().enumerate() {
            *o = g.value(j);
        }
    }
}

/// [`widen_groups_avx2`] compiled for AVX2, FMA and F16C.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn widen_groups_detected<G: Group>(src: &[G], dst: &mut [f32]) {
    widen_groups_avx2(src, dst)
}

/// `dst` = the values of `src`, 8 at a time. `#[inline(always)]` without
/// `#[target_feature]`: it inlines into callers compiled with AVX2, FMA and F16C.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C, and the caller is compiled with them.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn widen_groups_avx2<G: Group>(src: &[G], dst: &mut [f32]) {
    assert!(dst.len() >= src.len() * GROUP);
    for (i, g) in src.iter().enumerate() {
        for j0 in (0..GROUP).step_by(8) {
            let v = G::load8(g, j0);
            std::arch::x86_64::_mm256_storeu_ps(dst.as_mut_ptr().add(i * GROUP + j0), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elem::{KvDtype, KvElem};

    fn values(seed: u32) -> Vec<f32> {
        (0..4 * GROUP)
            .map(|i| ((i as f32 * 0.37 + seed as f32).sin() * 3.0) + (i % 5) as f32 * 0.25)
            .collect()
    }

    /// ggml's reference quantizers, written out from `ggml-quants.c` for one group.
    #[test]
    fn groups_quantize_as_ggml_does() {
        let x = values(1);
        for g in x.chunks_exact(GROUP) {
            let q8 = Q8Group::quantize(g);
            let amax = g.iter().map(|v| v.abs()).fold(0.0, f32::max);
            let d = amax / 127.0;
            assert_eq!(q8.d, f16::from_f32(d));
            for (j, &v) in g.iter().enumerate() {
                assert_eq!(q8.q[j], (v * (1.0 / d)).round() as i8, "q8 value {j}");
            }
            let q4 = Q4Group::quantize(g);
            let (lo, hi) = g
                .iter()
                .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
            let d = (hi - lo) / 15.0;
            assert_eq!((q4.d, q4.m), (f16::from_f32(d), f16::from_f32(lo)));
            for (j, &v) in g.iter().enumerate() {
                let want = (((v - lo) * (1.0 / d) + 0.5) as i8).min(15) as u8;
                assert_eq!(q4.nibble(j), want, "q4 value {j}");
                // Dequantized as ggml's `x0 * d + m`: the product is exact.
                let ggml = f32::from(want) * q4.d.to_f32() + q4.m.to_f32();
                assert_eq!(q4.value(j).to_bits(), ggml.to_bits());
            }
        }
        // A group of zeros, and one holding infinities or NaN, stay finite.
        for x in [[0.0; GROUP], [f32::INFINITY; GROUP], [f32::NAN; GROUP]] {
            let (q8, q4) = (Q8Group::quantize(&x), Q4Group::quantize(&x));
            assert!((0..GROUP).all(|j| q8.value(j).is_finite() && q4.value(j).is_finite()));
        }
    }

    /// Every widening path gives the scalar values' bits, and the error is within half a
    /// step of each group's grid.
    #[test]
    fn widening_is_exact_on_every_path_and_close_to_the_values() {
        fn check<E: KvElem>(
            x: &[f32],
            step: impl Fn(&E) -> f32,
            scalar: impl Fn(&E, usize) -> f32,
        ) {
            let mut stored = vec![E::default(); x.len() / GROUP];
            E::narrow(x, &mut stored);
            let mut fast = vec![0f32; x.len()];
            E::widen(&stored, &mut fast);
            for (i, g) in stored.iter().enumerate() {
                for j in 0..GROUP {
                    let want = scalar(g, j);
                    assert_eq!(
                        fast[i * GROUP + j].to_bits(),
                        want.to_bits(),
                        "{:?}",
                        E::DTYPE
                    );
                    // Half a step, plus the f16 rounding of the scale (and offset).
                    let err = (want - x[i * GROUP + j]).abs();
                    assert!(err <= step(g) * 0.5 + 0.02, "{:?} error {err}", E::DTYPE);
                }
            }
        }
        let x = values(7);
        check::<Q8Group>(&x, |g| g.d.to_f32(), Q8Group::value);
        check::<Q4Group>(&x, |g| g.d.to_f32(), Q4Group::value);
    }

    #[test]
    fn a_group_has_the_bytes_of_ggmls_block() {
        let g = Q8Group::quantize(&values(3)[..GROUP]);
        let bytes: &[u8] = bytemuck::bytes_of(&g);
        assert_eq!(bytes.len(), 34);
        assert_eq!(&bytes[..2], &g.d.to_le_bytes());
        assert_eq!(bytes[2 + 5] as i8, g.q[5]);
        let g = Q4Group::quantize(&values(3)[..GROUP]);
        let bytes: &[u8] = bytemuck::bytes_of(&g);
        assert_eq!(bytes.len(), 20);
        assert_eq!(
            (&bytes[..2], &bytes[2..4]),
            (&g.d.to_le_bytes()[..], &g.m.to_le_bytes()[..])
        );
        assert_eq!(bytes[4 + 3], g.q[3]);
    }

    #[test]
    fn encode_and_decode_round_trip_through_bytes_at_any_alignment() {
        let x = values(5);
        for dtype in KvDtype::ALL {
            let bytes = dtype.encode(&x);
            assert_eq!(bytes.len(), dtype.bytes(x.len()));
            let back = dtype.decode(&bytes).unwrap();
            // Stored again, the widened values give the same bytes.
            assert_eq!(dtype.encode(&back), bytes, "{dtype}");
            let mut shifted = vec![0u8];
            shifted.extend_from_slice(&bytes);
            assert_eq!(
                dtype.decode(&shifted[1..]).unwrap(),
                back,
                "{dtype} unaligned"
            );
            if dtype.is_quantized() {
                assert_eq!(dtype.decode(&bytes[1..]), None, "{dtype}: not whole groups");
            }
        }
    }
}
