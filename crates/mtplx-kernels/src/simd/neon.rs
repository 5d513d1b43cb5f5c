//! NEON implementation (aarch64, where NEON is always present). Compile-checked only on the
//! project's machines. Half floats convert through `half` (Rust's `float16x4_t` intrinsics
//! are unstable), so F16 weights are slower here than on x86.

use std::arch::aarch64::*;

use super::Simd;

/// Four `float32x4_t`: lanes 0-3, 4-7, 8-11, 12-15.
#[derive(Clone, Copy)]
pub(crate) struct Neon;

type Q = [float32x4_t; 4];

#[inline(always)]
unsafe fn quad(f: impl Fn(usize) -> float32x4_t) -> Q {
    [f(0), f(1), f(2), f(3)]
}

/// 16 bytes widened to four `uint32x4_t`.
#[inline(always)]
unsafe fn widen(b: uint8x16_t) -> [uint32x4_t; 4] {
    let lo = vmovl_u8(vget_low_u8(b));
    let hi = vmovl_u8(vget_high_u8(b));
    [
        vmovl_u16(vget_low_u16(lo)),
        vmovl_u16(vget_high_u16(lo)),
        vmovl_u16(vget_low_u16(hi)),
        vmovl_u16(vget_high_u16(hi)),
    ]
}

#[inline(always)]
unsafe fn bytes_to_f32(b: uint8x16_t) -> Q {
    let w = widen(b);
    quad(|i| vcvtq_f32_u32(w[i]))
}

impl Simd for Neon {
    type V = Q;
    type Consts = ();
    const WIDE: bool = false;

    #[inline(always)]
    unsafe fn consts() {}

    #[inline(always)]
    unsafe fn zero() -> Q {
        [vdupq_n_f32(0.0); 4]
    }

    #[inline(always)]
    unsafe fn splat(x: f32) -> Q {
        [vdupq_n_f32(x); 4]
    }

    #[inline(always)]
    unsafe fn fma(a: Q, b: Q, c: Q) -> Q {
        quad(|i| vfmaq_f32(c[i], a[i], b[i]))
    }

    #[inline(always)]
    unsafe fn mul(a: Q, b: Q) -> Q {
        quad(|i| vmulq_f32(a[i], b[i]))
    }

    #[inline(always)]
    unsafe fn add(a: Q, b: Q) -> Q {
        quad(|i| vaddq_f32(a[i], b[i]))
    }

    #[inline(always)]
    unsafe fn load_f32(p: *const u8) -> Q {
        quad(|i| vld1q_f32(p.add(16 * i).cast()))
    }

    #[inline(always)]
    unsafe fn load_f16(p: *const u8) -> Q {
        let v: [f32; 16] = std::array::from_fn(|i| {
            half::f16::from_le_bytes(p.add(2 * i).cast::<[u8; 2]>().read()).to_f32()
        });
        quad(|i| vld1q_f32(v.as_ptr().add(4 * i)))
    }

    #[inline(always)]
    unsafe fn load_bf16(p: *const u8) -> Q {
        quad(|i| {
            let h = vld1_u16(p.add(8 * i).cast());
            vreinterpretq_f32_u32(vshlq_n_u32::<16>(vmovl_u16(h)))
        })
    }

    #[inline(always)]
    unsafe fn load_u8(p: *const u8) -> Q {
        bytes_to_f32(vld1q_u8(p))
    }

    #[inline(always)]
    unsafe fn load_i8(p: *const u8) -> Q {
        let b = vld1q_s8(p.cast());
        let lo = vmovl_s8(vget_low_s8(b));
        let hi = vmovl_s8(vget_high_s8(b));
        let w = [
            vmovl_s16(vget_low_s16(lo)),
            vmovl_s16(vget_high_s16(lo)),
            vmovl_s16(vget_low_s16(hi)),
            vmovl_s16(vget_high_s16(hi)),
        ];
        quad(|i| vcvtq_f32_s32(w[i]))
    }

    #[inline(always)]
    unsafe fn nibbles(_: (), p: *const u8) -> (Q, Q) {
        let b = vld1q_u8(p);
        (
            bytes_to_f32(vandq_u8(b, vdupq_n_u8(0xF))),
            bytes_to_f32(vshrq_n_u8::<4>(b)),
        )
    }

    #[inline(always)]
    unsafe fn nibbles_m8(_: (), p: *const u8) -> (Q, Q) {
        let (lo, hi) = Self::nibbles((), p);
        let m8 = vdupq_n_f32(-8.0);
        (
            quad(|i| vaddq_f32(lo[i], m8)),
            quad(|i| vaddq_f32(hi[i], m8)),
        )
    }

    #[inline(always)]
    unsafe fn high6(_: (), p: *const u8) -> [Q; 4] {
        let b = vld1q_u8(p);
        let m = vdupq_n_u8(0x30);
        let m32 = vdupq_n_f32(-32.0);
        let f = |v: uint8x16_t| {
            let q = bytes_to_f32(vandq_u8(v, m));
            quad(|i| vaddq_f32(q[i], m32))
        };
        [
            f(vshlq_n_u8::<4>(b)),
            f(vshlq_n_u8::<2>(b)),
            f(b),
            f(vshrq_n_u8::<2>(b)),
        ]
    }

    #[inline(always)]
    unsafe fn store(v: Q, p: *mut f32) {
        for (i, q) in v.iter().enumerate() {
            vst1q_f32(p.add(4 * i), *q);
        }
    }
}
