//! Seeded inputs the model crate's benches and diagnostics share (`#[path]`-included):
//! weights from a multiplicative hash of each index (`seed` picks a different matrix) and
//! activations from a fixed pattern, the same numbers on every run.

use candle_core::{Device, Tensor};

/// A `rows × cols` `f32` matrix with values in [-0.1, 0.1).
pub fn weights(rows: usize, cols: usize, seed: u32) -> Tensor {
    let v: Vec<f32> = (0..rows * cols)
        .map(|i| {
            let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761);
            (h >> 8) as f32 / (1u32 << 24) as f32 * 0.2 - 0.1
        })
        .collect();
    Tensor::from_vec(v, (rows, cols), &Device::Cpu).unwrap()
}

/// `n` rows of `cols` activations in [-1, 1).
pub fn activations(n: usize, cols: usize) -> Vec<f32> {
    (0..n * cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect()
}
