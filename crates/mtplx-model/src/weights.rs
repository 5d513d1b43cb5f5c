//! Weights as the graph sees them: linear maps that may stay quantized.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

use crate::error::{ModelError, Result};
use crate::kernels::{self, Activations, QuantFormat, QuantMatrix, QuantMatrixError};

/// How a model's projection weights are kept in memory and multiplied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum WeightFormat {
    /// Kept in the file's own blocks (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K, F16, BF16, F32; dense
    /// checkpoints as F32) and multiplied by mtplx's kernels ([`crate::kernels`]): the
    /// fastest path, and batch-invariant (a row's result never depends on the rows computed
    /// with it). The embedding is looked up from the same quantized table. The default.
    #[default]
    Native,
    /// As [`WeightFormat::Native`], with the activations of the Q8_0, Q5_0, Q4_0, Q4_1, Q4_K and
    /// Q6_K products rounded to 8 bits per block and multiplied with the weights' integers exactly,
    /// as llama.cpp's CPU backend does (`mtplx_kernels::Activations::Q8`): still batch-invariant,
    /// other numbers. What [`WeightFormat::for_gguf`] picks for K-quant files.
    NativeQ8,
    /// Dequantised to `f32` at load; products through candle's f32 GEMM. The exact path the
    /// golden tests pin token for token.
    F32,
    /// Kept in the file's quantized blocks; products through candle's quantized matmul
    /// (activations quantized to Q8 per block).
    Quantized,
}

impl WeightFormat {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "native" | "kernels" => Some(WeightFormat::Native),
            "native-q8" => Some(WeightFormat::NativeQ8),
            "f32" => Some(WeightFormat::F32),
            "quantized" | "q" => Some(WeightFormat::Quantized),
            _ => None,
        }
    }

    /// Whether mtplx's kernels run the products.
    pub fn is_native(self) -> bool {
        matches!(self, WeightFormat::Native | WeightFormat::NativeQ8)
    }

    /// The activations the kernels' products take in this format.
    pub fn activations(self) -> Activations {
        match self {
            WeightFormat::NativeQ8 => Activations::Q8,
            _ => Activations::F32,
        }
    }

    /// The default for a GGUF file of this `general.file_type`: [`WeightFormat::NativeQ8`]
    /// for llama.cpp's K-quant mixes (Q2_K to Q6_K: Q4_K_M and the like, whose users expect
    /// its CPU backend's arithmetic and speed), [`WeightFormat::Native`] otherwise (the
    /// legacy formats, dense weights, no file type) keep `f32` activations: on the default
    /// model's Q4_1 file 8-bit activations would be faster but move its logits by up to 1.9
    /// and change half the reference's greedy answers (`golden_smollm2.rs`), so there they
    /// are opt-in.
    pub fn for_gguf(file_type: Option<u32>) -> Self {
        // llama.cpp's LLAMA_FTYPE_MOSTLY_Q2_K (10) … Q6_K (18), and Q2_K_S (21).
        match file_type {
            Some(10..=18 | 21) => WeightFormat::NativeQ8,
            _ => WeightFormat::Native,
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
    /// Run by [`QuantMatrix`]; shared with the embedding when the head is tied.
    Kernel(Arc<QuantMatrix>),
    /// Several maps over the same input whose outputs sit side by side in each row (what
    /// [`Linear::concat`] builds when the parts cannot be fused into one matrix).
    Parts(Vec<Linear>),
}

impl Linear {
    /// Builds the linear map in `format`. With [`WeightFormat::F32`] or
    /// [`WeightFormat::Quantized`], weights that are not quantized in the file stay dense.
    pub fn new(weight: RawWeight, format: WeightFormat) -> Result<Self> {
        let dims = weight.dims();
        let &[out_features, in_features] = dims.as_slice() else {
            return Err(kernel_error(QuantMatrixError::Rank(dims)));
        };
        let kind = match (format, weight) {
            (f, RawWeight::Quant(q)) if f.is_native() => {
                match kernels::from_qtensor_with(&q, f.activations()) {
                    Ok(m) => LinearKind::Kernel(Arc::new(m)),
                    // A type without a kernel: dequantize it once and run it as f32.
                    Err(QuantMatrixError::UnsupportedType(_)) => {
                        let w = q
                            .dequantize(&Device::Cpu)?
                            .flatten_all()?
                            .to_vec1::<f32>()?;
                        LinearKind::Kernel(Arc::new(
                            QuantMatrix::from_f32(&w, out_features, in_features)
                                .map_err(kernel_error)?,
                        ))
                    }
                    Err(e) => return Err(kernel_error(e)),
                }
            }
            (f, RawWeight::Dense(t)) if f.is_native() => {
                let w = t.flatten_all()?.to_vec1::<f32>()?;
                LinearKind::Kernel(Arc::new(
                    QuantMatrix::from_f32(&w, out_features, in_features).map_err(kernel_error)?,
                ))
            }
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

    /// A map over row-major `[out, in]` `f32` weights, kept as `format` says (`Native`: run
    /// by the kernels; otherwise a dense candle tensor).
    pub fn from_f32(
        w: &[f32],
        out_features: usize,
        in_features: usize,
        format: WeightFormat,
    ) -> Result<Self> {
        let t = Tensor::from_slice(w, (out_features, in_features), &Device::Cpu)?;
        Linear::new(RawWeight::Dense(t), format)
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

    /// A map run by the kernels over a matrix shared with someone else (a tied embedding).
    pub(crate) fn shared(m: Arc<QuantMatrix>) -> Self {
        Linear {
            out_features: m.rows(),
            in_features: m.cols(),
            kind: LinearKind::Kernel(m),
            bias: None,
        }
    }

    /// Maps over the same input, their outputs side by side in each row (`[n, Σ out]`): Q, K
    /// and V, or gate and up. Kernel matrices of one format are fused into one matrix (one
    /// dispatch, one pass over the input; each output bit-identical to the separate
    /// product's); anything else runs part by part.
    ///
    /// # Panics
    /// If `parts` is empty or their input widths differ.
    pub fn concat(parts: Vec<Linear>) -> Result<Self> {
        assert!(!parts.is_empty(), "concatenating no maps");
        let in_features = parts[0].in_features;
        assert!(parts.iter().all(|p| p.in_features == in_features));
        let out_features = parts.iter().map(|p| p.out_features).sum();
        let bias = side_by_side_bias(&parts.iter().collect::<Vec<_>>());
        let matrices: Option<Vec<QuantMatrix>> = parts
            .iter()
            .map(|p| match &p.kind {
                LinearKind::Kernel(m) => Some((**m).clone()),
                _ => None,
            })
            .collect();
        if let Some(Ok(m)) = matrices.map(|ms| QuantMatrix::concat_rows(&ms)) {
            return Ok(Linear {
                kind: LinearKind::Kernel(Arc::new(m)),
                bias,
                out_features,
                in_features,
            });
        }
        Ok(Linear {
            kind: LinearKind::Parts(parts),
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

    /// Whether the weight is held quantized (in the file's blocks).
    pub fn is_quantized(&self) -> bool {
        match &self.kind {
            LinearKind::Dense(_) => false,
            LinearKind::Quantized(_) => true,
            LinearKind::Kernel(m) => m.format() != QuantFormat::F32,
            LinearKind::Parts(p) => p.iter().all(Linear::is_quantized),
        }
    }

    /// Whether the products are batch-invariant: a row's result does not depend on how many
    /// rows are computed with it (the kernels' guarantee; candle's GEMMs give none).
    pub fn is_batch_invariant(&self) -> bool {
        match &self.kind {
            LinearKind::Kernel(_) => true,
            LinearKind::Parts(p) => p.iter().all(Linear::is_batch_invariant),
            _ => false,
        }
    }

    /// Bytes of weight storage.
    pub fn weight_bytes(&self) -> usize {
        match &self.kind {
            LinearKind::Dense(t) => t.elem_count() * 4,
            LinearKind::Quantized(QMatMul::QTensor(q)) => q.storage_size_in_bytes(),
            LinearKind::Quantized(_) => self.out_features * self.in_features * 4,
            LinearKind::Kernel(m) => m.size_in_bytes(),
            LinearKind::Parts(p) => p.iter().map(Linear::weight_bytes).sum(),
        }
    }

    /// Applies the map to `n` rows of `x` (`[n, in]`), returning `[n, out]`.
    pub fn forward(&self, x: &[f32], n: usize) -> Result<Vec<f32>> {
        let mut y = vec![0f32; n * self.out_features];
        self.forward_into(x, n, &mut y)?;
        Ok(y)
    }

    /// Applies the map to `n` rows of `x` (`[n, in]`) into `out` (`[n, out]`). Allocates
    /// nothing for maps run by the kernels.
    ///
    /// # Panics
    /// If `x` is not `n × in` or `out` not `n × out`.
    pub fn forward_into(&self, x: &[f32], n: usize, out: &mut [f32]) -> Result<()> {
        assert_eq!(x.len(), n * self.in_features, "x must be n × in");
        assert_eq!(out.len(), n * self.out_features, "out must be n × out");
        match &self.kind {
            LinearKind::Kernel(m) => m.matmul(x, n, out),
            LinearKind::Parts(parts) => {
                let mut col = 0;
                for p in parts {
                    let y = p.forward(x, n)?;
                    for (o, r) in out
                        .chunks_exact_mut(self.out_features)
                        .zip(y.chunks_exact(p.out_features))
                    {
                        o[col..col + p.out_features].copy_from_slice(r);
                    }
                    col += p.out_features;
                }
            }
            LinearKind::Dense(_) | LinearKind::Quantized(_) => {
                let xt = Tensor::from_slice(x, (n, self.in_features), &Device::Cpu)?;
                let y = match &self.kind {
                    LinearKind::Dense(w) => xt.matmul(&w.t()?)?,
                    LinearKind::Quantized(q) => q.forward(&xt)?,
                    _ => unreachable!(),
                };
                out.copy_from_slice(&y.flatten_all()?.to_vec1::<f32>()?);
            }
        }
        if let Some(b) = &self.bias {
            for row in out.chunks_exact_mut(self.out_features) {
                for (v, bb) in row.iter_mut().zip(b) {
                    *v += bb;
                }
            }
        }
        Ok(())
    }
}

impl Linear {
    /// The weight as row-major `[out, in]` `f32` values, dequantized: what a backend that
    /// keeps its own copy of the weights uploads.
    pub fn dense_rows(&self) -> Result<Vec<f32>> {
        match &self.kind {
            LinearKind::Dense(t) => Ok(t.flatten_all()?.to_vec1::<f32>()?),
            LinearKind::Quantized(QMatMul::QTensor(q)) => Ok(q
                .dequantize(&Device::Cpu)?
                .flatten_all()?
                .to_vec1::<f32>()?),
            LinearKind::Quantized(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) => Ok(t
                .to_dtype(candle_core::DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?),
            LinearKind::Kernel(m) => Ok(m.dequantize()),
            LinearKind::Parts(parts) => {
                let mut w = Vec::with_capacity(self.out_features * self.in_features);
                for p in parts {
                    w.extend(p.dense_rows()?);
                }
                Ok(w)
            }
        }
    }

    /// The bias added to every output row, if any (for a concatenation, the parts' biases
    /// side by side, zeros where a part has none).
    pub fn bias(&self) -> Option<Vec<f32>> {
        match &self.kind {
            LinearKind::Parts(parts) => {
                side_by_side_bias(&parts.iter().collect::<Vec<_>>()).or_else(|| self.bias.clone())
            }
            _ => self.bias.clone(),
        }
    }
}

/// Consecutive output rows of a weight as its file stores them ([`Linear::file_parts`]).
pub struct FilePart {
    pub rows: usize,
    pub cols: usize,
    pub data: FileData,
}

/// A [`FilePart`]'s contents.
pub enum FileData {
    /// The file's own blocks, row after row, bit for bit (`rows × cols / block_len` blocks).
    Blocks { format: QuantFormat, bytes: Vec<u8> },
    /// Values, row-major `f32`: a type without a kernel format (dequantized), or a weight
    /// this map no longer holds in its file's layout (the native kernels' tiles).
    Values(Vec<f32>),
}

impl Linear {
    /// The weight part by part as the file stores it, for a backend that keeps its own copy
    /// in the file's blocks: a map built with [`WeightFormat::Quantized`] holds the file's
    /// blocks; dense weights, and the native kernels' repacked tiles, come as values.
    pub fn file_parts(&self) -> Result<Vec<FilePart>> {
        let (rows, cols) = (self.out_features, self.in_features);
        let values = |l: &Linear| -> Result<Vec<FilePart>> {
            Ok(vec![FilePart {
                rows,
                cols,
                data: FileData::Values(l.dense_rows()?),
            }])
        };
        match &self.kind {
            LinearKind::Quantized(QMatMul::QTensor(q)) => match kernels::format_of(q.dtype()) {
                Some(format) => Ok(vec![FilePart {
                    rows,
                    cols,
                    data: FileData::Blocks {
                        format,
                        bytes: q.data()?.into_owned(),
                    },
                }]),
                None => values(self),
            },
            LinearKind::Parts(parts) => {
                let mut out = Vec::new();
                for p in parts {
                    out.extend(p.file_parts()?);
                }
                Ok(out)
            }
            _ => values(self),
        }
    }
}

/// The biases of maps whose outputs sit side by side (Q, K and V), zeros where a map has
/// none; `None` when none has one.
pub(crate) fn side_by_side_bias(parts: &[&Linear]) -> Option<Vec<f32>> {
    let biases: Vec<Option<Vec<f32>>> = parts.iter().map(|p| p.bias()).collect();
    biases.iter().any(Option::is_some).then(|| {
        parts
            .iter()
            .zip(biases)
            .flat_map(|(p, b)| b.unwrap_or_else(|| vec![0.0; p.out_features]))
            .collect()
    })
}

fn kernel_error(e: QuantMatrixError) -> ModelError {
    ModelError::Kernel(e)
}
impl Linear {
    /// The same map with a bias added.
    pub fn with_bias(mut self, bias: Vec<f32>) -> Self {
        self.bias = Some(bias);
        self
    }
}
