//! The portable implementation: arrays and [`f32::mul_add`] (correctly rounded; slow on CPUs
//! without FMA, where it is a library call).

use super::Simd;

#[derive(Clone, Copy)]
pub(crate) struct Scalar;

type V = [f32; 16];

#[inline(always)]
fn map(f: impl Fn(usize) -> f32) -> V {
    std::array::from_fn(f)
}

impl Simd for Scalar {
    type V = V;
    type Consts = ();
    const WIDE: bool = false;

    #[inline(always)]
    unsafe fn consts() {}

    #[inline(always)]
    unsafe fn zero() -> V {
        [0.0; 16]
    }

    #[inline(always)]
    unsafe fn splat(x: f32) -> V {
        [x; 16]
    }

    #[inline(always)]
    unsafe fn fma(a: V, b: V, c: V) -> V {
        map(|i| a[i].mul_add(b[i], c[i]))
    }

    #[inline(always)]
    unsafe fn mul(a: V, b: V) -> V {
        map(|i| a[i] * b[i])
    }

    #[inline(always)]
    unsafe fn add(a: V, b: V) -> V {
        map(|i| a[i] + b[i])
    }

    #[inline(always)]
    unsafe fn load_f32(p: *const u8) -> V {
        map(|i| f32::from_le_bytes(p.add(4 * i).cast::<[u8; 4]>().read()))
    }

    #[inline(always)]
    unsafe fn load_f16(p: *const u8) -> V {
        map(|i| half::f16::from_le_bytes(p.add(2 * i).cast::<[u8; 2]>().read()).to_f32())
    }

    #[inline(always)]
    unsafe fn load_bf16(p: *const u8) -> V {
        map(|i| half::bf16::from_le_bytes(p.add(2 * i).cast::<[u8; 2]>().read()).to_f32())
    }

    #[inline(always)]
    unsafe fn load_u8(p: *const u8) -> V {
        map(|i| f32::from(*p.add(i)))
    }

    #[inline(always)]
    unsafe fn load_i8(p: *const u8) -> V {
        map(|i| f32::from(*p.add(i) as i8))
    }

    #[inline(always)]
    unsafe fn nibbles(_: (), p: *const u8) -> (V, V) {
        (
            map(|i| f32::from(*p.add(i) & 0xF)),
            map(|i| f32::from(*p.add(i) >> 4)),
        )
    }

    #[inline(always)]
    unsafe fn nibbles_m8(_: (), p: *const u8) -> (V, V) {
        (
            map(|i| f32::from((*p.add(i) & 0xF) as i8 - 8)),
            map(|i| f32::from((*p.add(i) >> 4) as i8 - 8)),
        )
    }

    #[inline(always)]
    unsafe fn high6(_: (), p: *const u8) -> [V; 4] {
        std::array::from_fn(|k| map(|i| f32::from((((*p.add(i) >> (2 * k)) & 3) << 4) as i8 - 32)))
    }

    #[inline(always)]
    unsafe fn store(v: V, p: *mut f32) {
        p.cast::<V>().write_unaligned(v)
    }
}
