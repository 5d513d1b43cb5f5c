//! The matrix kernels the model runs on (`mtplx-kernels`: batch-invariant products over the
//! file's own GGUF blocks, on the thread pool attention shares), and how a tensor candle
//! loaded becomes one of their matrices.

use candle_core::quantized::{GgmlDType, QTensor};

pub use mtplx_kernels::{
    Activations, Isa, Pool, QuantFormat, QuantMatrix, QuantMatrixError, DEFAULT_SPIN, TILE,
};

/// The kernel format of a GGUF tensor type, if there is a kernel for it.
pub fn format_of(dtype: GgmlDType) -> Option<QuantFormat> {
    Some(match dtype {
        GgmlDType::F32 => QuantFormat::F32,
        GgmlDType::F16 => QuantFormat::F16,
        GgmlDType::BF16 => QuantFormat::BF16,
        GgmlDType::Q4_0 => QuantFormat::Q4_0,
        GgmlDType::Q4_1 => QuantFormat::Q4_1,
        GgmlDType::Q5_0 => QuantFormat::Q5_0,
        GgmlDType::Q5_1 => QuantFormat::Q5_1,
        GgmlDType::Q8_0 => QuantFormat::Q8_0,
        GgmlDType::Q4K => QuantFormat::Q4K,
        GgmlDType::Q5K => QuantFormat::Q5K,
        GgmlDType::Q6K => QuantFormat::Q6K,
        _ => return None,
    })
}

/// The GGUF tensor type of a kernel format.
pub fn ggml_dtype(format: QuantFormat) -> GgmlDType {
    match format {
        QuantFormat::F32 => GgmlDType::F32,
        QuantFormat::F16 => GgmlDType::F16,
        QuantFormat::BF16 => GgmlDType::BF16,
        QuantFormat::Q4_0 => GgmlDType::Q4_0,
        QuantFormat::Q4_1 => GgmlDType::Q4_1,
        QuantFormat::Q5_0 => GgmlDType::Q5_0,
        QuantFormat::Q5_1 => GgmlDType::Q5_1,
        QuantFormat::Q8_0 => GgmlDType::Q8_0,
        QuantFormat::Q4K => GgmlDType::Q4K,
        QuantFormat::Q5K => GgmlDType::Q5K,
        QuantFormat::Q6K => GgmlDType::Q6K,
    }
}

/// A 2-D GGUF tensor as candle loaded it (`[rows, cols]`) as a kernel matrix in its own
/// blocks (`UnsupportedType` when its type has no kernel: the caller may dequantize it).
pub fn from_qtensor(q: &QTensor) -> Result<QuantMatrix, QuantMatrixError> {
    from_qtensor_with(q, Activations::F32)
}

/// [`from_qtensor`] for products with `activations` (see
/// [`QuantMatrix::from_gguf_bytes_with`]).
pub fn from_qtensor_with(
    q: &QTensor,
    activations: Activations,
) -> Result<QuantMatrix, QuantMatrixError> {
    let format = format_of(q.dtype())
        .ok_or_else(|| QuantMatrixError::UnsupportedType(format!("{:?}", q.dtype())))?;
    let dims = q.shape().dims();
    let &[rows, cols] = dims else {
        return Err(QuantMatrixError::Rank(dims.to_vec()));
    };
    let bytes = q
        .data()
        .map_err(|e| QuantMatrixError::Source(e.to_string()))?;
    QuantMatrix::from_gguf_bytes_with(format, &bytes, rows, cols, activations)
}
