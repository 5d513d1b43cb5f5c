//! The kernels on the default model's own tensors (SmolLM2-135M Q4_1, head Q8_0): every
//! 2-D tensor packs, dequantizes to candle's weights bit for bit, and its product equals the
//! sequential fused multiply-add reference bit for bit.

mod kernels_common;

use std::path::PathBuf;

use candle_core::quantized::gguf_file;
use candle_core::Device;
use kernels_common::*;
use mtplx_model::kernels::{Isa, Pool};

fn model_path() -> PathBuf {
    std::env::var_os("MTPLX_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            mtplx_model::store::ModelStore::from_env().path_of(&mtplx_model::store::DEFAULT_MODEL)
        })
}

#[test]
fn every_matrix_of_the_default_model_matches_candle_and_the_reference() {
    let path = model_path();
    assert!(
        path.exists(),
        "the default model is missing at {}: run `cargo xtask fetch-model`",
        path.display()
    );
    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let pool = Pool::new(2);
    let mut rng = Rng(2026);
    let mut matrices = 0;
    for name in names {
        let q = content.tensor(&mut file, name, &Device::Cpu).unwrap();
        if q.shape().rank() != 2 {
            continue;
        }
        let m = mtplx_model::kernels::from_qtensor(&q).unwrap();
        let (rows, cols) = (m.rows(), m.cols());
        let w = dequantize(&q);
        let mut row = vec![0f32; cols];
        for o in (0..rows).step_by(rows / 61 + 1) {
            m.dequantize_row(o, &mut row);
            assert_bits_eq(
                &row,
                &w[o * cols..(o + 1) * cols],
                &format!("{name} row {o}"),
            );
        }
        let n = 3;
        let x = rng.vec(n * cols, -1.5, 1.5);
        let want = reference(&w, &x, n, rows, cols);
        let mut y = vec![0f32; n * rows];
        m.matmul_with(&pool, Isa::detect(), &x, n, &mut y);
        assert_bits_eq(&y, &want, name);
        matrices += 1;
    }
    // 30 layers × 7 projections, and the embedding (the tied head).
    assert_eq!(matrices, 211);
}
