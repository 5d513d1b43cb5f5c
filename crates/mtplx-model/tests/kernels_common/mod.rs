//! Shared by the `kernels_*` tests: random GGUF weights, and the kernels' definition written
//! the slow way.
#![allow(dead_code)]

use std::borrow::Cow;

use candle_core::quantized::{QStorage, QTensor};
use candle_core::Device;
use mtplx_model::kernels::{Isa, Pool, QuantFormat, QuantMatrix};

/// SplitMix64: deterministic, no dependencies.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }

    /// A finite scale: mostly moderate magnitudes of either sign, sometimes zero or tiny.
    pub fn scale(&mut self) -> f32 {
        match self.next_u64() % 16 {
            0 => 0.0,
            1 => self.uniform(-1.0, 1.0) * 1e-6,
            _ => self.uniform(-1.0, 1.0) * 2f32.powi((self.next_u64() % 12) as i32 - 9),
        }
    }

    pub fn vec(&mut self, len: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..len).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// Byte ranges of the f16 fields of one GGUF block of `format` (kept finite in tests: NaN
/// payloads are not part of the contract).
fn f16_fields(format: QuantFormat) -> &'static [usize] {
    match format {
        QuantFormat::F16 => &[0],
        QuantFormat::Q4_0 | QuantFormat::Q5_0 | QuantFormat::Q8_0 => &[0],
        QuantFormat::Q4_1 | QuantFormat::Q5_1 | QuantFormat::Q4K | QuantFormat::Q5K => &[0, 2],
        QuantFormat::Q6K => &[208],
        QuantFormat::F32 | QuantFormat::BF16 => &[],
    }
}

/// `rows × cols` weights of `format` with uniformly random bits everywhere except the
/// floating-point fields, which hold random finite values.
pub fn random_gguf(rng: &mut Rng, format: QuantFormat, rows: usize, cols: usize) -> Vec<u8> {
    let blocks = rows * cols / format.block_len();
    let bb = format.block_bytes();
    let mut bytes: Vec<u8> = (0..blocks * bb).map(|_| rng.next_u64() as u8).collect();
    for b in bytes.chunks_exact_mut(bb) {
        match format {
            QuantFormat::F32 => b.copy_from_slice(&rng.uniform(-1.0, 1.0).to_le_bytes()),
            QuantFormat::BF16 => {
                b.copy_from_slice(&half::bf16::from_f32(rng.uniform(-1.0, 1.0)).to_le_bytes())
            }
            _ => {
                for &at in f16_fields(format) {
                    let v = half::f16::from_f32(rng.scale());
                    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
    bytes
}

/// The same bytes as a candle `QTensor` of shape `[rows, cols]`.
pub fn qtensor(format: QuantFormat, bytes: &[u8], rows: usize, cols: usize) -> QTensor {
    let storage = QStorage::from_data(
        Cow::Borrowed(bytes),
        &Device::Cpu,
        mtplx_model::kernels::ggml_dtype(format),
    )
    .unwrap();
    QTensor::new(storage, (rows, cols)).unwrap()
}

/// candle's dequantization, row-major.
pub fn dequantize(q: &QTensor) -> Vec<f32> {
    q.dequantize(&Device::Cpu)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

/// The contract, written the slow way: each output one fused multiply-add chain in input
/// order, from +0.
pub fn reference(w: &[f32], x: &[f32], n: usize, rows: usize, cols: usize) -> Vec<f32> {
    let mut y = vec![0f32; n * rows];
    for r in 0..n {
        for o in 0..rows {
            let (wr, xr) = (&w[o * cols..(o + 1) * cols], &x[r * cols..(r + 1) * cols]);
            y[r * rows + o] = wr
                .iter()
                .zip(xr)
                .fold(0f32, |acc, (a, b)| a.mul_add(*b, acc));
        }
    }
    y
}

/// Exact products summed in `f64`, and the bound on an `f32` chain's error:
/// `cols × 2⁻²⁴ × Σ|w x|` (a sequential sum of `cols` terms rounds at most `cols` times).
pub fn reference_f64(w: &[f32], x: &[f32], n: usize, rows: usize, cols: usize) -> Vec<(f64, f64)> {
    let mut y = Vec::with_capacity(n * rows);
    for r in 0..n {
        for o in 0..rows {
            let (wr, xr) = (&w[o * cols..(o + 1) * cols], &x[r * cols..(r + 1) * cols]);
            let (s, a) = wr.iter().zip(xr).fold((0f64, 0f64), |(s, a), (p, q)| {
                let t = f64::from(*p) * f64::from(*q);
                (s + t, a + t.abs())
            });
            y.push((s, cols as f64 * a * 2f64.powi(-24) + 1e-30));
        }
    }
    y
}

/// Bitwise equality of two `f32` slices, reporting the first difference.
pub fn assert_bits_eq(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: element {i}: {} != {} (bits {:08x} vs {:08x})",
            got[i],
            want[i],
            got[i].to_bits(),
            want[i].to_bits()
        );
    }
}

/// Every row of `m` dequantizes to `w` (row-major), bit for bit: the packed weights are
/// candle's.
pub fn assert_rows_are(m: &QuantMatrix, w: &[f32], what: &str) {
    let cols = m.cols();
    let mut row = vec![0f32; cols];
    for o in 0..m.rows() {
        m.dequantize_row(o, &mut row);
        assert_bits_eq(
            &row,
            &w[o * cols..(o + 1) * cols],
            &format!("{what} row {o}"),
        );
    }
}

/// `m × x` (`n` rows of `x`) on every instruction set this CPU has equals `want`, bit for bit.
pub fn assert_every_isa_gives(m: &QuantMatrix, pool: &Pool, x: &[f32], n: usize, want: &[f32]) {
    let (rows, cols) = (m.rows(), m.cols());
    for isa in Isa::available() {
        let mut y = vec![f32::NAN; n * rows];
        m.matmul_with(pool, isa, x, n, &mut y);
        assert_bits_eq(
            &y,
            want,
            &format!("{:?} {rows}×{cols} n={n} on {isa:?}", m.format()),
        );
    }
}
