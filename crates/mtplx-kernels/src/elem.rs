//! The element types K/V rows are stored in ([`KvDtype`], [`KvElem`]): `f32`, IEEE half
//! (`f16`), bfloat16 (`bf16`), and groups of 32 values quantized to 8 bits ([`Q8Group`],
//! ggml's `q8_0`) or 4 bits ([`Q4Group`], ggml's `q4_1`).
//!
//! A value is rounded once, when a row is stored ([`KvElem::narrow`]: round to nearest
//! even for the float types, `f16` saturating at ±65504 instead of overflowing to infinity,
//! so an outlier can never turn a softmax into NaN; a quantized group computes its scale
//! from the group's own values, so a row's stored form depends on that row alone), and
//! widened exactly wherever it is read ([`KvElem::widen`]: a quantized value is `q × d`
//! or `q × d + m` in one rounding, which every reader computes alike): every reader sees
//! the same `f32` values, so attention over stored rows gives the same bits on every path
//! that reads them, and the same bits as attention over `f32` rows holding those values.
//!
//! Rows are stored as whole elements: a quantized row of `n` values is `n / 32` groups, so
//! a cache of a quantized type needs rows (and heads) of a multiple of 32 values
//! ([`KvDtype::group`]).

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
    /// Groups of 32 values as 8-bit integers times one `f16` scale ([`Q8Group`]): 34 bytes
    /// per 32 values.
    Q8,
    /// Groups of 32 values as 4-bit integers times a scale plus an offset, both `f16`
    /// ([`Q4Group`]): 20 bytes per 32 values.
    Q4,
}

impl KvDtype {
    pub const ALL: [KvDtype; 5] = [
        KvDtype::F32,
        KvDtype::F16,
        KvDtype::Bf16,
        KvDtype::Q8,
        KvDtype::Q4,
    ];

    /// Values one stored element holds: 1 for the float types, a group's 32 for the
    /// quantized ones. Rows and heads of a cache hold a multiple of it.
    pub fn group(self) -> usize {
        match self {
            KvDtype::F32 | KvDtype::F16 | KvDtype::Bf16 => 1,
            KvDtype::Q8 | KvDtype::Q4 => GROUP,
        }
    }

    /// Bytes of one stored element ([`KvDtype::group`] values).
    pub fn element_bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::Q8 => std::mem::size_of::<Q8Group>(),
            KvDtype::Q4 => std::mem::size_of::<Q4Group>(),
        }
    }

    /// Bytes `values` values take when stored: a whole number of elements.
    ///
    /// # Panics
    /// If `values` is not a multiple of [`KvDtype::group`].
    pub fn bytes(self, values: usize) -> usize {
        assert!(
            values.is_multiple_of(self.group()),
            "{values} values are not whole groups of {self}"
        );
        values / self.group() * self.element_bytes()
    }

    /// Whether values are stored as integers with a group scale (`q8`, `q4`).
    pub fn is_quantized(self) -> bool {
        self.group() > 1
    }

    /// The name flags and logs use: `f32`, `f16`, `bf16`, `q8`, `q4`.
    pub fn as_str(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::Q8 => "q8",
            KvDtype::Q4 => "q4",
        }
    }

    /// The stored bytes of `values` (a whole number of groups), rounded as a cache of this
    /// type rounds a row it is given.
    pub fn encode(self, values: &[f32]) -> Vec<u8> {
        fn enc<E: KvElem>(values: &[f32]) -> Vec<u8> {
            let mut out = vec![E::default(); values.len() / E::GROUP];
            E::narrow(values, &mut out);
            bytemuck::cast_slice(&out).to_vec()
        }
        assert!(values.len().is_multiple_of(self.group()), "whole groups");
        match self {
            KvDtype::F32 => enc::<f32>(values),
            KvDtype::F16 => enc::<half::f16>(values),
            KvDtype::Bf16 => enc::<half::bf16>(values),
            KvDtype::Q8 => enc::<Q8Group>(values),
            KvDtype::Q4 => enc::<Q4Group>(values),
        }
    }

    /// The values stored `bytes` hold, widened exactly; `None` if `bytes` is not a whole
    /// number of elements.
    pub fn decode(self, bytes: &[u8]) -> Option<Vec<f32>> {
        fn dec<E: KvElem>(bytes: &[u8]) -> Option<Vec<f32>> {
            let size = std::mem::size_of::<E>();
            if !bytes.len().is_multiple_of(size) {
                return None;
            }
            // The bytes may not be aligned for `E`: read each element by value.
            let elems: Vec<E> = bytes
                .chunks_exact(size)
                .map(bytemuck::pod_read_unaligned)
                .collect();
            let mut out = vec![0f32; elems.len() * E::GROUP];
            E::widen(&elems, &mut out);
            Some(out)
        }
        match self {
            KvDtype::F32 => dec::<f32>(bytes),
            KvDtype::F16 => dec::<half::f16>(bytes),
            KvDtype::Bf16 => dec::<half::bf16>(bytes),
            KvDtype::Q8 => dec::<Q8Group>(bytes),
            KvDtype::Q4 => dec::<Q4Group>(bytes),
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
#[error("unknown K/V element type {0:?} (expected f32, f16, bf16, q8 or q4)")]
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

/// The stored types are this crate's (the attention kernel is compiled here once for each:
/// [`crate::attention::attend_with`]).
mod sealed {
    pub trait Sealed {}
}
impl sealed::Sealed for f32 {}
impl sealed::Sealed for half::f16 {}
impl sealed::Sealed for half::bf16 {}
impl sealed::Sealed for Q8Group {}
impl sealed::Sealed for Q4Group {}

/// An element type K/V rows can be stored in: one value ([`FloatElem`]) or a quantized
/// group of [`KvElem::GROUP`] values; only this crate's five types.
///
/// `bytemuck::Pod`: a cache lends its storage as bytes ([`bytemuck::cast_slice_mut`]), which
/// is how an SSD restore reads rows straight into it.
pub trait KvElem:
    sealed::Sealed + bytemuck::Pod + Default + Send + Sync + fmt::Debug + 'static
{
    const DTYPE: KvDtype;
    /// Values one element holds.
    const GROUP: usize = 1;

    /// `dst` holds `src` (`dst.len() × GROUP` values) as stored: the one rounding a value
    /// goes through.
    fn narrow(src: &[f32], dst: &mut [Self]);

    /// `dst[..src.len() × GROUP]` = the values `src` holds, exactly, on the instructions
    /// this CPU has.
    fn widen(src: &[Self], dst: &mut [f32]);

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

/// An element type that holds one value.
pub trait FloatElem: KvElem {
    /// The stored value for `x`: the one rounding a value goes through.
    fn from_f32(x: f32) -> Self;

    /// The value, exactly.
    fn to_f32(self) -> f32;
}

/// Narrowing one value at a time, for the float types.
#[inline]
fn narrow_each<E: FloatElem>(src: &[f32], dst: &mut [E]) {
    debug_assert_eq!(src.len(), dst.len());
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = E::from_f32(s);
    }
}

impl KvElem for f32 {
    const DTYPE: KvDtype = KvDtype::F32;

    #[inline]
    fn narrow(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src);
    }

    #[inline]
    fn widen(src: &[Self], dst: &mut [f32]) {
        dst[..src.len()].copy_from_slice(src);
    }

    #[inline(always)]
    fn as_f32(rows: &[Self]) -> Option<&[f32]> {
        Some(rows)
    }
}

impl FloatElem for f32 {
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl KvElem for half::f16 {
    const DTYPE: KvDtype = KvDtype::F16;

    #[inline]
    fn narrow(src: &[f32], dst: &mut [Self]) {
        narrow_each(src, dst)
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

impl FloatElem for half::f16 {
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        // `clamp` keeps NaN a NaN.
        half::f16::from_f32(x.clamp(-F16_MAX, F16_MAX))
    }

    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
}

impl KvElem for half::bf16 {
    const DTYPE: KvDtype = KvDtype::Bf16;

    #[inline]
    fn narrow(src: &[f32], dst: &mut [Self]) {
        narrow_each(src, dst)
    }

    #[inline]
    fn widen(src: &[Self], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = FloatElem::to_f32(*s);
        }
    }
}

impl FloatElem for half::bf16 {
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

pub(crate) mod groups;
use groups::F16_MAX;
use groups::{narrow_groups, widen_groups_portable, Group};
#[cfg(target_arch = "x86_64")]
use groups::{widen_groups_avx2, widen_groups_detected};

/// The values of quantized groups, on the instructions this CPU has.
#[inline]
fn widen_groups<G: Group>(src: &[G], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_f16c() && is_x86_feature_detected!("fma") {
        // SAFETY: checked just above.
        return unsafe { widen_groups_detected(src, dst) };
    }
    widen_groups_portable(src, dst)
}
pub use groups::{Q4Group, Q8Group, GROUP};

/// A quantized group type as a [`KvElem`]: narrowed and widened group by group.
macro_rules! group_elem {
    ($group:ty, $dtype:expr) => {
        impl KvElem for $group {
            const DTYPE: KvDtype = $dtype;
            const GROUP: usize = GROUP;

            fn narrow(src: &[f32], dst: &mut [Self]) {
                narrow_groups(src, dst)
            }

            #[inline]
            fn widen(src: &[Self], dst: &mut [f32]) {
                widen_groups(src, dst)
            }

            #[cfg(target_arch = "x86_64")]
            #[inline(always)]
            unsafe fn widen_f16c(src: &[Self], dst: &mut [f32]) {
                widen_groups_avx2(src, dst)
            }
        }
    };
}

group_elem!(Q8Group, KvDtype::Q8);
group_elem!(Q4Group, KvDtype::Q4);

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
        assert_eq!("Q8".parse::<KvDtype>(), Ok(KvDtype::Q8));
        assert!("q8_0".parse::<KvDtype>().is_err());
        assert_eq!(
            KvDtype::ALL.map(|d| d.bytes(64)),
            [256, 128, 128, 68, 40],
            "bytes of 64 values"
        );
        assert_eq!(KvDtype::ALL.map(KvDtype::group), [1, 1, 1, 32, 32]);
    }

    #[test]
    fn halves_round_to_nearest_even_and_saturate() {
        assert_eq!(
            f16::from_f32(1.0 + 1.0 / 2048.0).to_f32(),
            1.0,
            "tie to even"
        );
        assert_eq!(
            <f16 as FloatElem>::from_f32(1.0e6).to_f32(),
            65504.0,
            "saturated, not infinite"
        );
        assert_eq!(<f16 as FloatElem>::from_f32(-1.0e6).to_f32(), -65504.0);
        assert!(<f16 as FloatElem>::from_f32(f32::NAN).to_f32().is_nan());
        // bf16 keeps f32's range.
        assert_eq!(
            <bf16 as FloatElem>::from_f32(1.0e30).to_f32(),
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
            let h = <f16 as FloatElem>::from_f32(x);
            assert_eq!(<f16 as FloatElem>::from_f32(h.to_f32()), h);
            let b = <bf16 as FloatElem>::from_f32(x);
            assert_eq!(<bf16 as FloatElem>::from_f32(b.to_f32()), b);
        }
    }
}
