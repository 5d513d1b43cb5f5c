//! [`DeviceMatrix`]: a weight on the device in its file's own blocks, part by part.

use cudarc::driver::CudaSlice;

use super::source::WeightCode;
use crate::error::{ModelError, Result};
use crate::kernels::Activations;
use crate::weights::{FileData, FilePart, Linear};

/// Bytes after a weight part's last row on the device, that the kernels' aligned loads may
/// read (and never use).
const PART_PADDING: usize = 16;

/// What a weight's upload needs of a device: its bytes and values copied over (the
/// device implements it, so this module depends on no more of it).
pub(crate) trait Upload {
    fn upload_bytes(&self, bytes: &[u8]) -> Result<CudaSlice<u8>>;
    fn upload_values(&self, values: &[f32]) -> Result<CudaSlice<f32>>;
}

/// A weight matrix on the device: `[rows, cols]` as parts of consecutive rows (Q, K and V
/// side by side may each have their own format), each in its file's own blocks, with the
/// bias of all its rows.
pub(crate) struct DeviceMatrix {
    pub(crate) parts: Vec<DevicePart>,
    /// What its products do with their activations ([`Activations::Q8`]: the parts of a
    /// format the 8-bit kernels take round them, see `q8.rs`).
    pub(crate) activations: Activations,
    pub(crate) bias: Option<CudaSlice<f32>>,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
}

/// Rows of a [`DeviceMatrix`] in one format.
pub(crate) struct DevicePart {
    pub(crate) code: WeightCode,
    pub(crate) blocks: CudaSlice<u8>,
    pub(crate) rows: usize,
    pub(crate) row_bytes: usize,
}

impl DeviceMatrix {
    /// A dense `f32` matrix (row-major `[rows, cols]`).
    pub(crate) fn upload(
        dev: &dyn Upload,
        w: &[f32],
        bias: Option<&[f32]>,
        rows: usize,
        cols: usize,
    ) -> Result<Self> {
        let part = FilePart {
            rows,
            cols,
            data: FileData::Values(w.to_vec()),
        };
        Self::from_parts(dev, vec![part], bias)
    }

    /// The weight as the file stores it, part by part ([`Linear::file_parts`]), its
    /// products taking `activations`.
    pub(crate) fn from_linear(
        dev: &dyn Upload,
        l: &Linear,
        activations: Activations,
    ) -> Result<Self> {
        let mut m = Self::from_parts(dev, l.file_parts()?, l.bias().as_deref())?;
        m.activations = activations;
        Ok(m)
    }

    pub(crate) fn from_parts(
        dev: &dyn Upload,
        parts: Vec<FilePart>,
        bias: Option<&[f32]>,
    ) -> Result<Self> {
        let cols = parts.first().map_or(0, |p| p.cols);
        let rows: usize = parts.iter().map(|p| p.rows).sum();
        if cols == 0 || !cols.is_multiple_of(32) || parts.iter().any(|p| p.cols != cols) {
            return Err(ModelError::Device(format!(
                "a {rows} × {cols} weight: the CUDA backend needs one width, a multiple of 32"
            )));
        }
        if bias.is_some_and(|b| b.len() != rows) {
            return Err(ModelError::Device(format!(
                "a {rows}-row weight given a bias of {} values",
                bias.map_or(0, <[f32]>::len)
            )));
        }
        // Consecutive parts of one format become one (Q, K and V of a file that keeps
        // them alike: one launch, not three).
        let mut merged: Vec<(WeightCode, Vec<u8>, usize)> = Vec::with_capacity(parts.len());
        for p in parts {
            let (code, bytes) = match p.data {
                FileData::Blocks { format, bytes } => (WeightCode::of(format), bytes),
                FileData::Values(v) => (
                    WeightCode::F32,
                    v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                ),
            };
            if p.rows == 0 || !bytes.len().is_multiple_of(p.rows) {
                return Err(ModelError::Device(format!(
                    "a {} × {cols} weight part of {} bytes",
                    p.rows,
                    bytes.len()
                )));
            }
            match merged.last_mut() {
                Some((c, b, r)) if *c == code => {
                    b.extend_from_slice(&bytes);
                    *r += p.rows;
                }
                _ => merged.push((code, bytes, p.rows)),
            }
        }
        let mut out = Vec::with_capacity(merged.len());
        for (code, mut bytes, rows) in merged {
            let row_bytes = bytes.len() / rows;
            // The kernels read 2-byte aligned blocks as aligned 32-bit words, so a block's
            // last word may reach up to 3 bytes past it (`words_at` in the source).
            bytes.extend_from_slice(&[0; PART_PADDING]);
            out.push(DevicePart {
                code,
                row_bytes,
                blocks: dev.upload_bytes(&bytes)?,
                rows,
            });
        }
        Ok(DeviceMatrix {
            parts: out,
            activations: Activations::F32,
            bias: bias.map(|b| dev.upload_values(b)).transpose()?,
            rows,
            cols,
        })
    }

    /// Bytes the weights take on the device.
    pub(crate) fn bytes(&self) -> usize {
        self.parts
            .iter()
            .map(|p| p.rows * p.row_bytes)
            .sum::<usize>()
            + self.bias.as_ref().map_or(0, |_| 4 * self.rows)
    }
}
