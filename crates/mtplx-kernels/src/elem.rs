//! The element types K/V rows are stored in ([`KvDtype`], [`KvElem`]): `f32`, IEEE half
//! (`f16`) and bfloat16 (`bf16`).
//!
//! A value is rounded once, when a row is stored ([`KvElem::from_f32`]: round to nearest
//! even; `f16` saturates at ±65504 instead of overflowing to infinity, so an outlier can
//! never turn a softmax into NaN), and widened exactly wherever it is read
//! ([`KvElem::widen`]): every reader sees the same `f32` values, so attention over stored
//! 16-bit rows gives the same bits on every path that reads them, and the same bits as
//! attention over `f32` rows holding the rounded values.

use std::fmt;
use std::str::FromStr;

/// The element type a cache stores K/V rows in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvDtype {
    /// 4 bytes: the values the model computed, unrounded.
    #[default]
    F32,
    /// IEEE 754 half precision: 11-bit significand, range ±65504 (saturated).
    F16,
    /// bfloat16: `f32`'s range, 8-bit significand.
    Bf16,
}

impl KvDtype {
    pub const ALL: [KvDtype; 3] = [KvDtype::F32, KvDtype::F16, KvDtype::Bf16];

    /// Bytes per value.
    pub fn size(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::Bf16 => 2,
        }
    }

    /// The name flags and logs use: `f32`, `f16`, `bf16`.
    pub fn as_str(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not one of [`KvDtype::as_str`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown K/V element type {0:?} (expected f32, f16 or bf16)")]
pub struct UnknownDtype(pub String);

impl FromStr for KvDtype {
    type Err = UnknownDtype;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KvDtype::ALL
            .into_iter()
            .find(|d| d.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownDtype(s.to_string()))
    }
}

/// An element type K/V rows can be stored in.
///
/// `bytemuck::Pod`: a cache lends its storage as bytes ([`bytemuck::cast_slice_mut`]), which
/// is how an SSD restore reads rows straight into it.
pub trait KvElem: bytemuck::Pod + Default + Send + Sync + fmt::Debug + 'static {
    const DTYPE: KvDtype;

    /// The stored value for `x`: the one rounding a value goes through.
    fn from_f32(x: f32) -> Self;

    /// The value, exactly.
    fn to_f32(self) -> f32;

    /// `dst[i] = src[i].to_f32()`, on the instructions this CPU has.
    #[inline]
    fn widen(src: &[Self], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }

    /// [`KvElem::widen`] for a caller compiled with AVX2 and F16C.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn widen_f16c(src: &[Self], dst: &mut [f32]) {
        Self::widen(src, dst)
    }

    /// The rows themselves, when they already are `f32` (no copy needed to read them).
    #[inline(always)]
    fn as_f32(rows: &[Self]) -> Option<&[f32]> {
        let _ = rows;
        None
    }
}

impl KvElem for f32 {
    const DTYPE: KvDtype = KvDtype::F32;

    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    #[inline]
    fn widen(src: &[Self], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }

    #[inline(always)]
    fn as_f32(rows: &[Self]) -> Option<&[f32]> {
        Some(rows)
    }
}

/// The largest finite half.
const F16_MAX: f32 = 65504.0;

impl KvElem for half::f16 {
    const DTYPE: KvDtype = KvDtype::F16;

    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        // `clamp` keeps NaN a NaN.
        half::f16::from_f32(x.clamp(-F16_MAX, F16_MAX))
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }

    #[inline]
    fn widen(src: &[Self], dst: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if has_f16c() {
            // SAFETY: checked just above.
            return unsafe { widen_f16_detected(src, dst) };
        }
        for (d, s) in dst.iter_mut().zip(src) {
            *d = s.to_f32();
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn widen_f16c(src: &[Self], dst: &mut [f32]) {
        widen_f16_f16c(src, dst)
    }
}

impl KvElem for half::bf16 {
    const DTYPE: KvDtype = KvDtype::Bf16;

    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        // A bf16 is the top half of an f32: a shift, which vectorises.
        f32::from_bits((self.to_bits() as u32) << 16)
    }
}

/// Whether this CPU converts halves in hardware (F16C, with AVX2).
#[cfg(target_arch = "x86_64")]
pub fn has_f16c() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c"))
}

/// [`widen_f16_f16c`] compiled for AVX2 and F16C.
///
/// # Safety
/// The CPU has AVX2 and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn widen_f16_detected(src: &[half::f16], dst: &mut [f32]) {
    widen_f16_f16c(src, dst)
}

/// `dst[i] = src[i]` widened, 8 at a time by `vcvtph2ps` (exact, like the scalar
/// conversion), the rest one by one. `#[inline(always)]` without `#[target_feature]`: it
/// inlines into callers compiled with AVX2 and F16C (the attention kernel's entry points).
///
/// # Safety
/// The CPU has AVX2 and F16C, and the caller is compiled with them.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn widen_f16_f16c(src: &[half::f16], dst: &mut [f32]) {
    use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: `i + 8 <= n` values are in bounds of both slices; unaligned load/store.
        let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    for j in i..n {
        dst[j] = src[j].to_f32();
    }
}

/// `dst[i] = E::from_f32(src[i])`.
#[inline]
pub fn narrow<E: KvElem>(src: &[f32], dst: &mut [E]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = E::from_f32(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[test]
    fn names_round_trip_and_unknown_ones_are_refused() {
        for d in KvDtype::ALL {
            assert_eq!(d.as_str().parse::<KvDtype>(), Ok(d));
            assert_eq!(d.to_string(), d.as_str());
        }
        assert_eq!("F16".parse::<KvDtype>(), Ok(KvDtype::F16));
        assert!("q8".parse::<KvDtype>().is_err());
        assert_eq!(
            KvDtype::ALL.map(KvDtype::size),
            [4, 2, 2],
            "bytes per value"
        );
    }

    #[test]
    fn halves_round_to_nearest_even_and_saturate() {
        assert_eq!(
            f16::from_f32(1.0 + 1.0 / 2048.0).to_f32(),
            1.0,
            "tie to even"
        );
        assert_eq!(
            <f16 as KvElem>::from_f32(1.0e6).to_f32(),
            65504.0,
            "saturated, not infinite"
        );
        assert_eq!(<f16 as KvElem>::from_f32(-1.0e6).to_f32(), -65504.0);
        assert!(<f16 as KvElem>::from_f32(f32::NAN).to_f32().is_nan());
        // bf16 keeps f32's range.
        assert_eq!(
            <bf16 as KvElem>::from_f32(1.0e30).to_f32(),
            bf16::from_f32(1.0e30).to_f32()
        );
    }

    /// Every widening path gives the scalar conversion's bits, for every half bit pattern.
    #[test]
    fn widening_is_exact_on_every_path() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut fast = vec![0f32; all.len() - 3]; // not a multiple of 8: the tail loop too
        <f16 as KvElem>::widen(&all[3..], &mut fast);
        for (h, w) in all[3..].iter().zip(&fast) {
            let s = h.to_f32();
            assert!(
                s.to_bits() == w.to_bits() || (s.is_nan() && w.is_nan()),
                "{h:?}"
            );
        }
        let bfs: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
        let mut out = vec![0f32; bfs.len()];
        <bf16 as KvElem>::widen(&bfs, &mut out);
        for (b, w) in bfs.iter().zip(&out) {
            let s = b.to_f32();
            assert!(
                s.to_bits() == w.to_bits() || (s.is_nan() && w.is_nan()),
                "{b:?}"
            );
        }
    }

    #[test]
    fn a_stored_value_widens_back_to_itself() {
        for x in [0.0f32, -0.0, 1.5, -3.25e-3, 1234.567, 7.0e-8] {
            let h = <f16 as KvElem>::from_f32(x);
            assert_eq!(<f16 as KvElem>::from_f32(h.to_f32()), h);
            let b = <bf16 as KvElem>::from_f32(x);
            assert_eq!(<bf16 as KvElem>::from_f32(b.to_f32()), b);
        }
    }
}
