//! Weights as the graph sees them: linear maps that may stay quantized.

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use crate::error::Result;

/// How a model's projection weights are kept in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WeightFormat {
    /// Dequantised to `f32` at load; products through candle's f32 GEMM. The exact path.
    #[default]
    F32,
    /// Kept in the file's quantized blocks; products through candle's quantized matmul
    /// (activations quantized to Q8 per block).
    Quantized,
}

impl WeightFormat {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "f32" => Some(WeightFormat::F32),
            "quantized" | "q" => Some(WeightFormat::Quantized),
            _ => None,
        }
    }
}

/// A weight as read from a checkpoint, before the graph decides how to keep it.
pub enum RawWeight {
    /// Quantized (or F16/F32) blocks from a GGUF file.
    Quant(QTensor),
    /// A dense `f32` tensor (safetensors, converted).
    Dense(Tensor),
}

impl RawWeight {
    pub fn dims(&self) -> Vec<usize> {
        match self {
            RawWeight::Quant(q) => q.shape().dims().to_vec(),
            RawWeight::Dense(t) => t.dims().to_vec(),
        }
    }

    /// The weight as a dense `f32` tensor.
    pub fn to_dense(&self) -> Result<Tensor> {
        Ok(match self {
            RawWeight::Quant(q) => q.dequantize(&Device::Cpu)?,
            RawWeight::Dense(t) => t.clone(),
        })
    }

    /// The weight as a flat `f32` vector (norms, biases).
    pub fn to_vec(&self) -> Result<Vec<f32>> {
        Ok(self.to_dense()?.flatten_all()?.to_vec1::<f32>()?)
    }
}

/// `y = x W^T (+ b)` for a weight `W` of shape `[out, in]`.
pub struct Linear {
    kind: LinearKind,
    bias: Option<Vec<f32>>,
    out_features: usize,
    in_features: usize,
}

enum LinearKind {
    Dense(Tensor),
    Quantized(QMatMul),
}

impl Linear {
    /// Builds the linear map in `format`. Weights that are not quantized in the file stay
    /// dense whatever the format.
    pub fn new(weight: RawWeight, format: WeightFormat) -> Result<Self> {
        let dims = weight.dims();
        let (out_features, in_features) = (dims[0], dims[1]);
        let kind = match (format, weight) {
            (WeightFormat::Quantized, RawWeight::Quant(q))
                if !matches!(q.dtype(), GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16) =>
            {
                LinearKind::Quantized(QMatMul::from_qtensor(q)?)
            }
            (_, w) => LinearKind::Dense(w.to_dense()?),
        };
        Ok(Linear {
            kind,
            bias: None,
            out_features,
            in_features,
        })
    }

    /// A dense map over an existing `[out, in]` tensor (shared, not copied).
    pub fn dense(weight: Tensor) -> Result<Self> {
        let (out_features, in_features) = weight.dims2()?;
        Ok(Linear {
            kind: LinearKind::Dense(weight),
            bias: None,
            out_features,
            in_features,
        })
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }

    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Whether the weight is held quantized.
    pub fn is_quantized(&self) -> bool {
        matches!(self.kind, LinearKind::Quantized(_))
    }

    /// Bytes of weight storage.
    pub fn weight_bytes(&self) -> usize {
        match &self.kind {
            LinearKind::Dense(t) => t.elem_count() * 4,
            LinearKind::Quantized(QMatMul::QTensor(q)) => q.storage_size_in_bytes(),
            LinearKind::Quantized(_) => self.out_features * self.in_features * 4,
        }
    }

    /// Applies the map to `n` rows of `x` (`[n, in]`), returning `[n, out]`.
    pub fn forward(&self, x: &[f32], n: usize) -> Result<Vec<f32>> {
        debug_assert_eq!(x.len(), n * self.in_features);
        let xt = Tensor::from_slice(x, (n, self.in_features), &Device::Cpu)?;
        let y = match &self.kind {
            LinearKind::Dense(w) => xt.matmul(&w.t()?)?,
            LinearKind::Quantized(q) => q.forward(&xt)?,
        };
        let mut y = y.flatten_all()?.to_vec1::<f32>()?;
        if let Some(b) = &self.bias {
            for row in y.chunks_exact_mut(self.out_features) {
                for (v, bb) in row.iter_mut().zip(b) {
                    *v += bb;
                }
            }
        }
        Ok(y)
    }
}

impl Linear {
    /// The same map with a bias added.
    pub fn with_bias(mut self, bias: Vec<f32>) -> Self {
        self.bias = Some(bias);
        self
    }
}
