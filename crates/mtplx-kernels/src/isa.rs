//! Instruction sets, detected at run time, and the kernel entry point of each: the only
//! functions with `#[target_feature]`, so everything they call inlines with those features.

use std::ops::Range;
use std::sync::OnceLock;

use crate::format::QuantFormat;
use crate::kernel::{run, Job};
use crate::layout::{self, Layout};
#[cfg(target_arch = "aarch64")]
use crate::simd::neon::Neon;
use crate::simd::scalar::Scalar;
#[cfg(target_arch = "x86_64")]
use crate::simd::x86::{Avx2, Avx512};

/// The instruction set a kernel runs on. All give bit-identical results (fused multiply-add
/// everywhere); they differ in speed only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Plain Rust; `f32::mul_add` for the fused multiply-add.
    Portable,
    /// x86-64 with AVX2, FMA and F16C.
    Avx2,
    /// x86-64 with AVX-512F (and FMA, F16C).
    Avx512,
    /// aarch64 NEON.
    Neon,
}

impl Isa {
    /// The fastest instruction set this CPU has (detected once).
    pub fn detect() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            *Isa::available()
                .last()
                .expect("the portable kernels always run")
        })
    }

    /// Every instruction set this CPU runs, slowest first.
    pub fn available() -> Vec<Isa> {
        [Isa::Portable, Isa::Avx2, Isa::Avx512, Isa::Neon]
            .into_iter()
            .filter(|i| i.runs_here())
            .collect()
    }

    /// Whether this CPU has the instruction set.
    pub fn runs_here(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Isa::Avx2.runs_here() && is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
}

/// A kernel: the product over a range of output tiles.
pub(crate) type Kernel = unsafe fn(&Job, Range<usize>);

unsafe fn portable<L: Layout>(job: &Job, tiles: Range<usize>) {
    run::<Scalar, L>(job, tiles)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2<L: Layout>(job: &Job, tiles: Range<usize>) {
    run::<Avx2, L>(job, tiles)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn avx512<L: Layout>(job: &Job, tiles: Range<usize>) {
    run::<Avx512, L>(job, tiles)
}

#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
unsafe fn neon<L: Layout>(job: &Job, tiles: Range<usize>) {
    run::<Neon, L>(job, tiles)
}

/// The kernel for `format` on `isa`, or `None` if this CPU lacks `isa`.
pub(crate) fn kernel(isa: Isa, format: QuantFormat) -> Option<Kernel> {
    macro_rules! by_format {
        ($entry:ident) => {
            match format {
                QuantFormat::F32 => $entry::<layout::F32> as Kernel,
                QuantFormat::F16 => $entry::<layout::F16>,
                QuantFormat::BF16 => $entry::<layout::BF16>,
                QuantFormat::Q4_0 => $entry::<layout::Q4_0>,
                QuantFormat::Q4_1 => $entry::<layout::Q4_1>,
                QuantFormat::Q5_0 => $entry::<layout::Q5_0>,
                QuantFormat::Q5_1 => $entry::<layout::Q5_1>,
                QuantFormat::Q8_0 => $entry::<layout::Q8_0>,
                QuantFormat::Q4K => $entry::<layout::Q4K>,
                QuantFormat::Q5K => $entry::<layout::Q5K>,
                QuantFormat::Q6K => $entry::<layout::Q6K>,
            }
        };
    }
    if !isa.runs_here() {
        return None;
    }
    Some(match isa {
        Isa::Portable => by_format!(portable),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => by_format!(avx2),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => by_format!(avx512),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => by_format!(neon),
        #[allow(unreachable_patterns)]
        _ => return None,
    })
}
