//! The decode step's products that make their own x from the row before them
//! (`matvec1n_F`, `matvec1s_F` in `kernels.cu`), loaded where the source has them; the
//! device launches them through `device/before.rs`.

use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, CudaModule};

use super::fault::device_error;
use super::source::WeightCode;
use crate::error::Result;

/// The fused products, one of each kind per weight format (by [`WeightCode`]).
pub(super) struct FusedKernels {
    pub(super) norm: Vec<CudaFunction>,
    pub(super) silu: Vec<CudaFunction>,
}

impl FusedKernels {
    /// The kernels, where the source has them and `MTPLX_CUDA_DECODE_FUSED` is not `0`,
    /// with their dynamic shared memory raised to `shared_limit` (as `matvec1_F`'s).
    pub(super) fn load(
        module: &Arc<CudaModule>,
        shared_limit: i32,
    ) -> Result<Option<FusedKernels>> {
        if module.load_function("matvec1n_0").is_err()
            || !super::switches::switched_on("MTPLX_CUDA_DECODE_FUSED")
        {
            return Ok(None);
        }
        let load = |name: String| -> Result<CudaFunction> {
            let func = module
                .load_function(&name)
                .map_err(|e| device_error(&format!("kernel {name}"), e))?;
            func.set_attribute(
                CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared_limit,
            )
            .map_err(|e| device_error("matvec shared memory", e))?;
            Ok(func)
        };
        Ok(Some(FusedKernels {
            norm: (0..WeightCode::COUNT)
                .map(|c| load(format!("matvec1n_{c}")))
                .collect::<Result<_>>()?,
            silu: (0..WeightCode::COUNT)
                .map(|c| load(format!("matvec1s_{c}")))
                .collect::<Result<_>>()?,
        }))
    }
}
