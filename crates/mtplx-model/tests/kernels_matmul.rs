//! Every kernel (each format on each instruction set this CPU runs) against the contract
//! written the slow way: bit for bit against a sequential fused multiply-add chain over
//! candle's dequantized weights, and within the `f32` error bound of an `f64` reference.

mod kernels_common;

use kernels_common::*;
use mtplx_model::kernels::{Pool, QuantFormat, QuantMatrix};
use proptest::prelude::*;

fn format() -> impl Strategy<Value = QuantFormat> {
    prop::sample::select(QuantFormat::ALL.to_vec())
}

fn check(format: QuantFormat, rows: usize, blocks: usize, n: usize, seed: u64, pool: &Pool) {
    let mut rng = Rng(seed);
    let cols = blocks * format.block_len();
    let bytes = random_gguf(&mut rng, format, rows, cols);
    let q = qtensor(format, &bytes, rows, cols);
    let m = mtplx_model::kernels::from_qtensor(&q).unwrap();
    assert_eq!((m.rows(), m.cols(), m.format()), (rows, cols, format));
    let w = dequantize(&q);

    // The packed weights are candle's, bit for bit.
    assert_rows_are(&m, &w, &format!("{format:?}"));

    let x = rng.vec(n * cols, -2.0, 2.0);
    let want = reference(&w, &x, n, rows, cols);
    assert_every_isa_gives(&m, pool, &x, n, &want);
    for (i, (y, (exact, bound))) in want
        .iter()
        .zip(reference_f64(&w, &x, n, rows, cols))
        .enumerate()
    {
        let err = (f64::from(*y) - exact).abs();
        assert!(
            err <= bound,
            "{format:?} output {i}: {y} vs {exact}, error {err} > bound {bound}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Random shapes, including row counts that leave the last tile partly empty.
    #[test]
    fn kernels_equal_the_sequential_fma_reference(
        format in format(),
        rows in 1usize..70,
        blocks in 1usize..4,
        n in 1usize..20,
        threads in 1usize..4,
        seed in any::<u64>(),
    ) {
        // Dense formats have 1-input blocks: give them some width.
        let blocks = if format.block_len() == 1 { blocks * 37 } else { blocks };
        check(format, rows, blocks, n, seed, &Pool::new(threads));
    }
}

/// The default model's widths (576 and 1536 inputs) with the row counts that exercise every
/// row-blocking shape (16-row passes, an 8-row pass, a remainder), and products of enough
/// rows to run over dequantized panels (8 rows and up), more than one block of them (64).
#[test]
fn model_widths_and_every_row_blocking() {
    let pool = Pool::new(2);
    for format in QuantFormat::ALL {
        let (bl, wide) = (format.block_len(), format.block_len() == 256);
        let cols = if wide { 512 } else { 576 };
        for (rows, n) in [
            (40, 1),
            (48, 3),
            (33, 29),
            (16, 40),
            (20, 7),
            (40, 8),
            (17, 131),
        ] {
            check(
                format,
                rows,
                cols / bl,
                n,
                rows as u64 * 1000 + n as u64,
                &pool,
            );
        }
    }
}

#[test]
fn dense_f32_matrix_equals_the_quantized_one_bit_for_bit() {
    let mut rng = Rng(7);
    let (rows, cols, n) = (96, 576, 5);
    let bytes = random_gguf(&mut rng, QuantFormat::Q4_1, rows, cols);
    let q = mtplx_model::kernels::from_qtensor(&qtensor(QuantFormat::Q4_1, &bytes, rows, cols))
        .unwrap();
    let w = dequantize(&qtensor(QuantFormat::Q4_1, &bytes, rows, cols));
    let dense = QuantMatrix::from_f32(&w, rows, cols).unwrap();
    let x = rng.vec(n * cols, -1.0, 1.0);
    let (mut a, mut b) = (vec![0f32; n * rows], vec![0f32; n * rows]);
    q.matmul(&x, n, &mut a);
    dense.matmul(&x, n, &mut b);
    assert_bits_eq(&a, &b, "Q4_1 vs its dequantized f32 matrix");
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    use mtplx_model::kernels::QuantMatrixError as E;
    let r = QuantMatrix::from_gguf_bytes(QuantFormat::Q4_1, &[0; 20], 1, 16);
    assert!(
        matches!(
            r,
            Err(E::Columns {
                cols: 16,
                block: 32,
                ..
            })
        ),
        "{r:?}"
    );
    let r = QuantMatrix::from_gguf_bytes(QuantFormat::Q4_1, &[0; 39], 2, 32);
    assert!(
        matches!(
            r,
            Err(E::Length {
                expected: 40,
                got: 39,
                ..
            })
        ),
        "{r:?}"
    );
    let q = candle_core::quantized::QTensor::quantize(
        &candle_core::Tensor::zeros((2, 256), candle_core::DType::F32, &candle_core::Device::Cpu)
            .unwrap(),
        candle_core::quantized::GgmlDType::Q3K,
    )
    .unwrap();
    let r = mtplx_model::kernels::from_qtensor(&q);
    assert!(matches!(r, Err(E::UnsupportedType(_))), "{r:?}");
}

/// Q, K and V (or gate and up) fused into one matrix: the same bits as the separate
/// products, side by side.
#[test]
fn concatenated_rows_give_the_separate_products() {
    let mut rng = Rng(11);
    let cols = 576;
    let parts: Vec<(QuantMatrix, Vec<u8>, usize)> = [576usize, 192, 40]
        .iter()
        .map(|&rows| {
            let bytes = random_gguf(&mut rng, QuantFormat::Q4_1, rows, cols);
            let m = QuantMatrix::from_gguf_bytes(QuantFormat::Q4_1, &bytes, rows, cols).unwrap();
            (m, bytes, rows)
        })
        .collect();
    let n = 3;
    let x = rng.vec(n * cols, -1.0, 1.0);
    let separate: Vec<Vec<f32>> = parts
        .iter()
        .map(|(m, _, rows)| {
            let mut y = vec![0f32; n * rows];
            m.matmul(&x, n, &mut y);
            y
        })
        .collect();
    let fresh = |i: usize| {
        QuantMatrix::from_gguf_bytes(QuantFormat::Q4_1, &parts[i].1, parts[i].2, cols).unwrap()
    };
    let fused = QuantMatrix::concat_rows(&[fresh(0), fresh(1), fresh(2)]).unwrap();
    assert_eq!(fused.rows(), 576 + 192 + 40);
    let mut y = vec![0f32; n * fused.rows()];
    fused.matmul(&x, n, &mut y);
    for r in 0..n {
        let row = &y[r * fused.rows()..(r + 1) * fused.rows()];
        let mut at = 0;
        for (s, (_, _, rows)) in separate.iter().zip(&parts) {
            assert_bits_eq(
                &row[at..at + rows],
                &s[r * rows..(r + 1) * rows],
                "fused part",
            );
            at += rows;
        }
    }
    // A part that does not end on a tile boundary can only come last.
    let r = QuantMatrix::concat_rows(&[fresh(2), fresh(0)]);
    assert!(matches!(
        r,
        Err(mtplx_model::kernels::QuantMatrixError::Concat { part: 0, .. })
    ));
}
