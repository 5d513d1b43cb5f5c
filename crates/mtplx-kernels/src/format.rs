//! The weight formats a [`QuantMatrix`](super::QuantMatrix) holds: their GGUF block geometry
//! and the byte size of one packed tile-block.

/// Output rows per tile: the lanes of one 16-wide vector, one output row per lane.
pub const TILE: usize = 16;

/// A weight format. The quantized ones keep the file's blocks bit for bit (rearranged, not
/// requantized); the dense ones are plain numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum QuantFormat {
    F32,
    F16,
    BF16,
    /// 32 weights: f16 `d`, 16 bytes of nibbles; `w = (q - 8) d`.
    Q4_0,
    /// 32 weights: f16 `d`, f16 `m`, 16 bytes of nibbles; `w = q d + m`.
    Q4_1,
    /// 32 weights: f16 `d`, 32 high bits, 16 bytes of nibbles; `w = (q - 16) d`.
    Q5_0,
    /// 32 weights: f16 `d`, f16 `m`, 32 high bits, 16 bytes of nibbles; `w = q d + m`.
    Q5_1,
    /// 32 weights: f16 `d`, 32 `i8`; `w = q d`.
    Q8_0,
    /// 256 weights in 8 sub-blocks of 32 with 6-bit scales and mins.
    Q4K,
    /// Q4_K with a fifth bit per weight.
    Q5K,
    /// 256 weights of 6 bits in 16 sub-blocks of 16 with `i8` scales.
    Q6K,
}

impl QuantFormat {
    /// Every supported format.
    pub const ALL: [QuantFormat; 11] = [
        QuantFormat::F32,
        QuantFormat::F16,
        QuantFormat::BF16,
        QuantFormat::Q4_0,
        QuantFormat::Q4_1,
        QuantFormat::Q5_0,
        QuantFormat::Q5_1,
        QuantFormat::Q8_0,
        QuantFormat::Q4K,
        QuantFormat::Q5K,
        QuantFormat::Q6K,
    ];

    /// Weights per GGUF block (1 for the dense formats).
    pub fn block_len(self) -> usize {
        match self {
            QuantFormat::F32 | QuantFormat::F16 | QuantFormat::BF16 => 1,
            QuantFormat::Q4_0
            | QuantFormat::Q4_1
            | QuantFormat::Q5_0
            | QuantFormat::Q5_1
            | QuantFormat::Q8_0 => 32,
            QuantFormat::Q4K | QuantFormat::Q5K | QuantFormat::Q6K => 256,
        }
    }

    /// Bytes per GGUF block.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantFormat::F32 => 4,
            QuantFormat::F16 | QuantFormat::BF16 => 2,
            QuantFormat::Q4_0 => 18,
            QuantFormat::Q4_1 => 20,
            QuantFormat::Q5_0 => 22,
            QuantFormat::Q5_1 => 24,
            QuantFormat::Q8_0 => 34,
            QuantFormat::Q4K => 144,
            QuantFormat::Q5K => 176,
            QuantFormat::Q6K => 210,
        }
    }

    /// Bytes of one packed tile-block: [`TILE`] rows × [`block_len`](Self::block_len) inputs.
    /// Equal to `TILE × block_bytes` except where the layout unpacks a field: Q4_K's and
    /// Q5_K's 6-bit scales to bytes (+2.8%, +0.9%), and the 5-bit formats' high bits to
    /// 2-bit fields (Q5_0 +18%, Q5_1 +17%, Q5_K +20% with its scales; see `layout.rs`).
    pub fn tile_block_bytes(self) -> usize {
        match self {
            QuantFormat::Q4K => 2368,
            QuantFormat::Q5_0 => 416,
            QuantFormat::Q5_1 => 448,
            QuantFormat::Q5K => 3392,
            f => TILE * f.block_bytes(),
        }
    }
}
