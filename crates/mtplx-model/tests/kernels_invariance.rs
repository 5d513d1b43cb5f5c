//! The numerics contract of issue 9 for the matrix kernels: a row's result is the same bits
//! whether it is computed alone (decode), in a verify block, or inside a prefill chunk of any
//! size; on any number of threads; on any instruction set.

mod kernels_common;

use kernels_common::*;
use mtplx_model::kernels::{Isa, Pool, QuantFormat, QuantMatrix};
use proptest::prelude::*;

const BATCHES: [usize; 5] = [1, 2, 5, 7, 64];

/// `x` (`total` rows) in consecutive batches of `n` rows, each batch one product.
fn batched(m: &QuantMatrix, pool: &Pool, isa: Isa, x: &[f32], total: usize, n: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; total * m.rows()];
    let mut r = 0;
    while r < total {
        let k = n.min(total - r);
        m.matmul_with(
            pool,
            isa,
            &x[r * m.cols()..(r + k) * m.cols()],
            k,
            &mut y[r * m.rows()..(r + k) * m.rows()],
        );
        r += k;
    }
    y
}

fn check(format: QuantFormat, rows: usize, cols: usize, total: usize, seed: u64) {
    let mut rng = Rng(seed);
    let bytes = random_gguf(&mut rng, format, rows, cols);
    let m = mtplx_model::kernels::from_qtensor(&qtensor(format, &bytes, rows, cols)).unwrap();
    let x = rng.vec(total * cols, -3.0, 3.0);
    let pools: Vec<Pool> = (1..=4).map(Pool::new).collect();
    let alone = batched(&m, &pools[0], Isa::detect(), &x, total, 1);
    for isa in Isa::available() {
        for pool in &pools {
            for n in BATCHES {
                // The portable kernels call libm's fmaf per lane: sample them.
                if isa == Isa::Portable && (pool.threads() == 2 || n == 2 || n == 5) {
                    continue;
                }
                let y = batched(&m, pool, isa, &x, total, n);
                assert_bits_eq(
                    &y,
                    &alone,
                    &format!(
                        "{format:?} {rows}×{cols}, batches of {n} on {} threads, {isa:?}",
                        pool.threads()
                    ),
                );
            }
        }
    }
}

/// The default model's projection shapes (SmolLM2-135M: hidden 576, 3 KV heads of 64, FFN
/// 1536) in its formats, 70 rows of `x` so batches of 64 leave a remainder.
#[test]
fn default_model_shapes_give_the_same_bits_at_every_batch_size() {
    for (format, rows, cols) in [
        (QuantFormat::Q4_1, 576, 576),
        (QuantFormat::Q4_1, 192, 576),
        (QuantFormat::Q4_1, 1536, 576),
        (QuantFormat::Q4_1, 576, 1536),
        (QuantFormat::Q8_0, 1000, 576),
    ] {
        check(format, rows, cols, 70, rows as u64 ^ cols as u64);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn every_format_gives_the_same_bits_at_every_batch_size(
        format in prop::sample::select(QuantFormat::ALL.to_vec()),
        rows in 1usize..90,
        blocks in 1usize..3,
        total in 1usize..70,
        seed in any::<u64>(),
    ) {
        let cols = blocks * if format.block_len() == 1 { 48 } else { format.block_len() };
        check(format, rows, cols, total, seed);
    }
}
