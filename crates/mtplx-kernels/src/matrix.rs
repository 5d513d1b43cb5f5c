//! [`QuantMatrix`]: a `[rows, cols]` weight kept in its file format, and its product.

use std::fmt;
use std::ops::Range;

use crate::format::{QuantFormat, TILE};
use crate::isa::{kernel, Isa, Kernel};
use crate::kernel::Job;
use crate::layout::{self, Layout, Sink};
use crate::pool::Pool;
use crate::q8::{self, Activations, Job8};
use crate::simd::scalar::Scalar;

/// Why a weight cannot become a [`QuantMatrix`].
#[derive(Debug, thiserror::Error)]
pub enum QuantMatrixError {
    #[error(
        "weight type {0} has no kernel (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)"
    )]
    UnsupportedType(String),
    #[error("a {format:?} matrix needs columns in whole blocks of {block}, got {cols}")]
    Columns {
        format: QuantFormat,
        cols: usize,
        block: usize,
    },
    #[error("a {rows}×{cols} {format:?} matrix is {expected} bytes, got {got}")]
    Length {
        format: QuantFormat,
        rows: usize,
        cols: usize,
        expected: usize,
        got: usize,
    },
    #[error("a weight matrix has 2 dimensions, got shape {0:?}")]
    Rank(Vec<usize>),
    #[error("cannot concatenate part {part}: {reason}")]
    Concat { part: usize, reason: &'static str },
    /// The weights could not be read from where they were loaded.
    #[error("reading the weights: {0}")]
    Source(String),
}

/// 64-byte aligned storage.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A weight matrix `W` of shape `[rows, cols]` kept in its file's format, repacked into
/// tiles of 16 rows so that one vector holds one weight of 16 rows. Computes `y = x Wᵀ`;
/// the [crate docs](crate) state the layout and the numerics contract.
#[derive(Clone)]
pub struct QuantMatrix {
    format: QuantFormat,
    activations: Activations,
    rows: usize,
    cols: usize,
    tiles: usize,
    tile_stride: usize,
    data: Vec<Line>,
}

impl fmt::Debug for QuantMatrix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QuantMatrix")
            .field("format", &self.format)
            .field("activations", &self.activations)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish_non_exhaustive()
    }
}

impl QuantMatrix {
    /// From GGUF tensor bytes: `rows` rows of `cols / block_len` blocks each; its products
    /// use the activations as they are ([`Activations::F32`]).
    pub fn from_gguf_bytes(
        format: QuantFormat,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<Self, QuantMatrixError> {
        Self::from_gguf_bytes_with(format, bytes, rows, cols, Activations::F32)
    }

    /// [`from_gguf_bytes`](Self::from_gguf_bytes) for products with `activations` (which
    /// falls back to [`Activations::F32`] for a format without 8-bit kernels: see
    /// [`Activations::for_format`] and [`activations`](Self::activations)).
    pub fn from_gguf_bytes_with(
        format: QuantFormat,
        bytes: &[u8],
        rows: usize,
        cols: usize,
        activations: Activations,
    ) -> Result<Self, QuantMatrixError> {
        let activations = activations.for_format(format);
        let block = format.block_len();
        if cols == 0 || !cols.is_multiple_of(block) {
            return Err(QuantMatrixError::Columns {
                format,
                cols,
                block,
            });
        }
        let blocks = cols / block;
        let row_bytes = blocks * format.block_bytes();
        if bytes.len() != rows * row_bytes {
            return Err(QuantMatrixError::Length {
                format,
                rows,
                cols,
                expected: rows * row_bytes,
                got: bytes.len(),
            });
        }
        let tiles = rows.div_ceil(TILE);
        let tbb = match activations {
            Activations::F32 => format.tile_block_bytes(),
            Activations::Q8 => q8::pack::tile_block_bytes(format).expect("checked by for_format"),
        };
        let tile_stride = blocks * tbb;
        let mut data = vec![Line([0; 64]); (tiles * tile_stride).div_ceil(64)];
        // SAFETY: `Line` is plain bytes; the slice covers exactly the vector's allocation.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(data.as_mut_ptr().cast::<u8>(), data.len() * 64)
        };
        let zero = [0u8; 256];
        let pack: fn(&[&[u8]; TILE], &mut [u8]) = match format {
            QuantFormat::F32 => layout::F32::pack,
            QuantFormat::F16 => layout::F16::pack,
            QuantFormat::BF16 => layout::BF16::pack,
            QuantFormat::Q4_0 => layout::Q4_0::pack,
            QuantFormat::Q4_1 => layout::Q4_1::pack,
            QuantFormat::Q5_0 => layout::Q5_0::pack,
            QuantFormat::Q5_1 => layout::Q5_1::pack,
            QuantFormat::Q8_0 => layout::Q8_0::pack,
            QuantFormat::Q4K => layout::Q4K::pack,
            QuantFormat::Q5K => layout::Q5K::pack,
            QuantFormat::Q6K => layout::Q6K::pack,
        };
        let bb = format.block_bytes();
        for t in 0..tiles {
            for b in 0..blocks {
                // Rows past the end (the last tile's padding) are all-zero blocks: weight 0.
                let src: [&[u8]; TILE] = std::array::from_fn(|j| {
                    let o = t * TILE + j;
                    if o < rows {
                        &bytes[o * row_bytes + b * bb..o * row_bytes + (b + 1) * bb]
                    } else {
                        &zero[..bb]
                    }
                });
                let at = t * tile_stride + b * tbb;
                match activations {
                    Activations::F32 => pack(&src, &mut dst[at..at + tbb]),
                    Activations::Q8 => q8::pack::pack(format, &src, &mut dst[at..at + tbb]),
                }
            }
        }
        Ok(QuantMatrix {
            format,
            activations,
            rows,
            cols,
            tiles,
            tile_stride,
            data,
        })
    }

    /// A dense `f32` matrix (row-major `[rows, cols]`), run by the same kernels: the product
    /// is bit-identical to that of a quantized matrix holding the same weights.
    pub fn from_f32(w: &[f32], rows: usize, cols: usize) -> Result<Self, QuantMatrixError> {
        let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        QuantMatrix::from_gguf_bytes(QuantFormat::F32, &bytes, rows, cols)
    }

    /// The matrices' rows one after the other (fusing Q, K and V, or gate and up, into one
    /// product: one dispatch, one pass over `x`). Each output is bit-identical to the
    /// separate product's. All must share the format and the column count, and every part
    /// but the last must have a multiple of [`TILE`] rows.
    pub fn concat_rows(parts: &[QuantMatrix]) -> Result<Self, QuantMatrixError> {
        let err = |part, reason| Err(QuantMatrixError::Concat { part, reason });
        let Some(first) = parts.first() else {
            return err(0, "no matrices");
        };
        for (i, p) in parts.iter().enumerate() {
            if (p.format, p.activations, p.cols) != (first.format, first.activations, first.cols) {
                return err(
                    i,
                    "its format, activations or column count differs from part 0's",
                );
            }
            if i + 1 < parts.len() && !p.rows.is_multiple_of(TILE) {
                return err(
                    i,
                    "only the last part may have rows that are not a multiple of 16",
                );
            }
        }
        let tiles: usize = parts.iter().map(|p| p.tiles).sum();
        let bytes = tiles * first.tile_stride;
        let mut data = vec![Line([0; 64]); bytes.div_ceil(64)];
        // SAFETY: as in `from_gguf_bytes`.
        let dst = unsafe {
            std::slice::from_raw_parts_mut(data.as_mut_ptr().cast::<u8>(), data.len() * 64)
        };
        let mut at = 0;
        for p in parts {
            let n = p.size_in_bytes();
            // SAFETY: `p.data` holds at least `size_in_bytes` bytes.
            let src = unsafe { std::slice::from_raw_parts(p.bytes(), n) };
            dst[at..at + n].copy_from_slice(src);
            at += n;
        }
        Ok(QuantMatrix {
            format: first.format,
            activations: first.activations,
            rows: parts.iter().map(|p| p.rows).sum(),
            cols: first.cols,
            tiles,
            tile_stride: first.tile_stride,
            data,
        })
    }

    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// What its products do with their activations.
    pub fn activations(&self) -> Activations {
        self.activations
    }

    /// Output features.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Input features.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of weight storage (the tiles, padding included).
    pub fn size_in_bytes(&self) -> usize {
        self.tiles * self.tile_stride
    }

    fn bytes(&self) -> *const u8 {
        self.data.as_ptr().cast()
    }

    /// `out[n, rows] = x[n, cols] · Wᵀ` on the [global pool](Pool::global) and the fastest
    /// instruction set. Allocates nothing.
    ///
    /// # Panics
    /// If `x` is not `n × cols` or `out` not `n × rows`.
    pub fn matmul(&self, x: &[f32], n: usize, out: &mut [f32]) {
        self.matmul_with(Pool::global(), Isa::detect(), x, n, out)
    }

    /// [`matmul`](Self::matmul) on `pool` with `isa`. The result is bit-identical for every
    /// pool size and instruction set.
    ///
    /// # Panics
    /// If the shapes are wrong, or `isa` does not run on this CPU.
    pub fn matmul_with(&self, pool: &Pool, isa: Isa, x: &[f32], n: usize, out: &mut [f32]) {
        assert_eq!(x.len(), n * self.cols, "x must be n × cols");
        assert_eq!(out.len(), n * self.rows, "out must be n × rows");
        if n == 0 {
            return;
        }
        if self.activations == Activations::Q8 {
            let kernel =
                q8::kernel(isa, self.format).unwrap_or_else(|| panic!("{isa:?} does not run here"));
            // SAFETY: as below.
            return unsafe { self.run_kernel8(pool, kernel, x, n, out) };
        }
        let kernel =
            kernel(isa, self.format).unwrap_or_else(|| panic!("{isa:?} does not run here"));
        // SAFETY: `kernel` is this matrix's format's, and runs on this CPU.
        unsafe { self.run_kernel(pool, kernel, x, n, out) }
    }

    /// Runs `kernel` over the product's tiles, split over `pool`'s threads.
    ///
    /// # Safety
    /// `kernel` reads this matrix's format and runs on this CPU; `x` is `n × cols` and `out`
    /// `n × rows` (checked by the callers).
    pub(super) unsafe fn run_kernel(
        &self,
        pool: &Pool,
        kernel: Kernel,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) {
        let job = Job {
            data: self.bytes(),
            tile_stride: self.tile_stride,
            rows: self.rows,
            cols: self.cols,
            x: x.as_ptr(),
            n,
            out: out.as_mut_ptr(),
        };
        // SAFETY: `job` points into `self`, `x` and `out`, which outlive the product; the
        // ranges are disjoint, so their output columns are too; the caller guarantees that
        // `kernel` fits the format and runs on this CPU.
        self.over_tiles(pool, n, &|range| unsafe { kernel(&job, range) });
    }

    /// [`run_kernel`](Self::run_kernel) for an [`Activations::Q8`] matrix: `x` rounded into
    /// the calling thread's buffer (by rows over `pool` when there are many), then the tiles
    /// split over `pool`.
    ///
    /// # Safety
    /// As `run_kernel`, for an 8-bit `kernel` of this matrix's format.
    unsafe fn run_kernel8(
        &self,
        pool: &Pool,
        kernel: q8::Kernel8,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) {
        // Q8_0's activations (32-input formats) keep f16 scales, Q8_K's (K-quants) f32.
        let xblock = self.format.block_len();
        q8::with_rounded(pool, x, self.cols, xblock, xblock == 32, |xq| {
            let job = Job8 {
                data: self.bytes(),
                tile_stride: self.tile_stride,
                rows: self.rows,
                cols: self.cols,
                n,
                qs: xq.qs.as_ptr(),
                d: xq.d.as_ptr(),
                s16: xq.s16.as_ptr(),
                out: out.as_mut_ptr(),
            };
            // SAFETY: as in `run_kernel`.
            self.over_tiles(pool, n, &|range| unsafe { kernel(&job, range) });
        })
    }

    /// Runs `task` over the output tiles, split into disjoint ranges over `pool`'s threads
    /// ([`parts`](Self::parts) of them for `n` rows).
    fn over_tiles(&self, pool: &Pool, n: usize, task: &(dyn Fn(Range<usize>) + Sync)) {
        let parts = self.parts(pool, n);
        let tiles = self.tiles;
        pool.run(parts, &|p| task(tiles * p / parts..tiles * (p + 1) / parts));
    }

    /// How many threads a product should use: all of them, unless the work is so small that
    /// waking a thread costs more than it saves. A speed knob only: results do not depend on
    /// it.
    fn parts(&self, pool: &Pool, n: usize) -> usize {
        const MIN_BYTES_PER_PART: usize = 16 << 10;
        let work = self.size_in_bytes().saturating_mul(n.min(16));
        pool.threads()
            .min(self.tiles)
            .min(work / MIN_BYTES_PER_PART)
            .max(1)
    }

    /// All of `W`, dequantized, row-major `[rows, cols]` (what a backend that keeps its own
    /// copy uploads): [`QuantMatrix::dequantize_row`] for every row.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.rows * self.cols];
        for (r, row) in w.chunks_exact_mut(self.cols).enumerate() {
            self.dequantize_row(r, row);
        }
        w
    }

    /// Row `row` of `W`, dequantized (an embedding lookup): the exact weights the product
    /// uses.
    ///
    /// # Panics
    /// If `row >= rows` or `out.len() != cols`.
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        assert!(row < self.rows, "row {row} of {}", self.rows);
        assert_eq!(out.len(), self.cols);
        let (t, lane) = (row / TILE, row % TILE);
        let base = self.bytes().wrapping_add(t * self.tile_stride);
        if self.activations == Activations::Q8 {
            let tbb = self.tile_stride / (self.cols / self.format.block_len());
            let bl = self.format.block_len();
            for (b, chunk) in out.chunks_exact_mut(bl).enumerate() {
                // SAFETY: tile-block `b` of tile `t` lies inside `self.data`.
                let tb = unsafe { std::slice::from_raw_parts(base.add(b * tbb), tbb) };
                q8::pack::dequantize(self.format, tb, lane, chunk);
            }
            return;
        }
        struct Lane<'a> {
            out: &'a mut [f32],
            lane: usize,
        }
        impl Sink<Scalar, 1> for Lane<'_> {
            unsafe fn take(&mut self, i: usize, w: &[[f32; 16]; 1]) {
                self.out[i] = w[0][self.lane];
            }
        }
        macro_rules! rows_of {
            ($L:ty) => {{
                for (b, chunk) in out.chunks_exact_mut(<$L>::BLOCK).enumerate() {
                    let p = [base.wrapping_add(b * <$L>::BYTES)];
                    // SAFETY: `p` is tile-block `b` of tile `t`, inside `self.data`.
                    unsafe {
                        <$L>::visit::<Scalar, 1>(&p, (), &mut Lane { out: chunk, lane });
                    }
                }
            }};
        }
        match self.format {
            QuantFormat::F32 => rows_of!(layout::F32),
            QuantFormat::F16 => rows_of!(layout::F16),
            QuantFormat::BF16 => rows_of!(layout::BF16),
            QuantFormat::Q4_0 => rows_of!(layout::Q4_0),
            QuantFormat::Q4_1 => rows_of!(layout::Q4_1),
            QuantFormat::Q5_0 => rows_of!(layout::Q5_0),
            QuantFormat::Q5_1 => rows_of!(layout::Q5_1),
            QuantFormat::Q8_0 => rows_of!(layout::Q8_0),
            QuantFormat::Q4K => rows_of!(layout::Q4K),
            QuantFormat::Q5K => rows_of!(layout::Q5K),
            QuantFormat::Q6K => rows_of!(layout::Q6K),
        }
    }
}
