//! Each instruction set's 8-bit operations against the portable ones, on random operands and
//! the edges (`i8::MIN` weights, `±127` activations, the largest unsigned weights).

use super::ops::Dot;
use crate::simd::scalar::Scalar;

/// Everything the kernels compute with `D`'s operations, read back through `f32` lanes
/// (exact: every value is below 2²⁴ in magnitude).
#[inline(always)]
unsafe fn exercise<D: Dot>(w: &[u8; 64], bits: &[u8; 8], h: &[u8; 64], x4: i32) -> Vec<f32> {
    let mut out = Vec::new();
    // A macro, not a closure: an outlined closure would lose the caller's target features.
    macro_rules! push {
        ($v:expr) => {{
            let mut a = [0f32; 16];
            D::store($v, a.as_mut_ptr());
            out.extend_from_slice(&a);
        }};
    }
    let wv = D::load_w(w.as_ptr());
    let hv = D::load_w(h.as_ptr());
    // Byte-wise results, each byte position read out with a unit activation.
    let lo = D::lo4(wv);
    let hi = D::hi4(wv);
    let b5 = D::or_bit4(lo, bits.as_ptr());
    let fields = [
        D::or_field(hi, hv, 0),
        D::or_field(hi, hv, 1),
        D::or_field(hi, hv, 2),
        D::or_field(hi, hv, 3),
    ];
    for k in 0..4 {
        let unit = 1i32 << (8 * k);
        for v in [lo, hi, b5, fields[0], fields[1], fields[2], fields[3]] {
            push!(D::to_f32(D::dot_u(D::izero(), v, unit)));
        }
    }
    let acc = D::isplat(-1000);
    push!(D::to_f32(D::dot_u(acc, b5, x4)));
    push!(D::to_f32(D::dot_u(acc, fields[3], x4)));
    push!(D::to_f32(D::dot_s(acc, wv, x4)));
    let a = D::load_u8_i(w.as_ptr());
    let b = D::load_i8_i(h.as_ptr());
    push!(D::to_f32(D::iadd(D::imul(a, b), D::isplat(7))));
    out
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 11
    }
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        std::array::from_fn(|_| self.next() as u8)
    }
}

/// Weights, fifth bits, 2-bit fields and four activations.
type Case = ([u8; 64], [u8; 8], [u8; 64], i32);

fn cases() -> Vec<Case> {
    let mut rng = Rng(9);
    let mut v: Vec<_> = (0..200)
        .map(|_| {
            // Activations in -127..=127, as the rounding gives.
            let x = std::array::from_fn::<i8, 4, _>(|_| ((rng.next() % 255) as i32 - 127) as i8);
            (
                rng.bytes(),
                rng.bytes(),
                rng.bytes(),
                i32::from_le_bytes(x.map(|b| b as u8)),
            )
        })
        .collect();
    for x in [[127i8; 4], [-127; 4], [127, -127, 1, 0]] {
        let x4 = i32::from_le_bytes(x.map(|b| b as u8));
        v.push(([0x80; 64], [0xFF; 8], [0xFF; 64], x4));
        v.push(([0xFF; 64], [0xFF; 8], [0xFF; 64], x4));
        v.push(([0x7F; 64], [0; 8], [0x55; 64], x4));
    }
    v
}

#[test]
fn every_instruction_set_gives_the_portable_results() {
    for (w, bits, h, x4) in cases() {
        // SAFETY: the portable operations run anywhere.
        let want = unsafe { exercise::<Scalar>(&w, &bits, &h, x4) };
        #[cfg(target_arch = "x86_64")]
        {
            use crate::simd::x86::{Avx2, Avx512};
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn avx2(w: &[u8; 64], b: &[u8; 8], h: &[u8; 64], x4: i32) -> Vec<f32> {
                exercise::<Avx2>(w, b, h, x4)
            }
            #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
            unsafe fn avx512(w: &[u8; 64], b: &[u8; 8], h: &[u8; 64], x4: i32) -> Vec<f32> {
                exercise::<Avx512>(w, b, h, x4)
            }
            if crate::Isa::Avx2.runs_here() {
                // SAFETY: checked just above.
                assert_eq!(unsafe { avx2(&w, &bits, &h, x4) }, want, "AVX2, x {x4:08x}");
            }
            if crate::Isa::Avx512.runs_here() && super::vnni() {
                // SAFETY: checked just above.
                assert_eq!(
                    unsafe { avx512(&w, &bits, &h, x4) },
                    want,
                    "AVX-512, x {x4:08x}"
                );
            }
        }
    }
}

/// The portable `dot_s` is the signed product, `i8::MIN` included.
#[test]
fn signed_dot_is_the_product() {
    let w = [0x80u8; 64];
    let x4 = i32::from_le_bytes([127u8, 0x81, 1, 0]);
    // SAFETY: portable.
    let got = unsafe { Scalar::dot_s(Scalar::izero(), Scalar::load_w(w.as_ptr()), x4) };
    // −128 × 127 − 128 × −127 − 128 × 1 − 128 × 0.
    assert_eq!(got, [-128; 16]);
}
