//! Every supported GGUF weight type loads, and runs close to the F32 original, both
//! dequantised to f32 and kept quantized.

mod support;

use candle_core::quantized::GgmlDType;
use mtplx_kv::CacheFactory;
use mtplx_model::{LanguageModel, Model, Want, WeightFormat};

fn logits(path: &std::path::Path, format: WeightFormat) -> Vec<f32> {
    let model = Model::load(path, format).unwrap();
    let mut cache = model.new_sequence(&CacheFactory::contiguous());
    let prompt: Vec<u32> = (0..12).map(|i| (i * 37 % 300) as u32).collect();
    model
        .forward(&prompt, &mut cache, Want::Last)
        .unwrap()
        .logits
}

fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f32 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

#[test]
fn quant_types_track_the_f32_model() {
    let dir = tempfile::tempdir().unwrap();
    let f32_path = dir.path().join("f32.gguf");
    support::write(&f32_path, GgmlDType::F32, |_, _| {});
    let reference = logits(&f32_path, WeightFormat::F32);
    // Relative L2 error bounds on uniform random weights (the hardest case for 4-bit
    // formats): measured F16 4e-4, Q8_0 7e-3, Q6K 2.6e-2, Q4K/Q4_1/Q4_0 0.13-0.14. A wrong
    // dequantisation gives errors of order 1.
    for (dtype, bound) in [
        (GgmlDType::F16, 2e-3),
        (GgmlDType::Q8_0, 2e-2),
        (GgmlDType::Q6K, 6e-2),
        (GgmlDType::Q4K, 0.25),
        (GgmlDType::Q4_1, 0.25),
        (GgmlDType::Q4_0, 0.25),
    ] {
        let path = dir.path().join(format!("{dtype:?}.gguf"));
        support::write(&path, dtype, |_, _| {});
        let deq = logits(&path, WeightFormat::F32);
        let quant = logits(&path, WeightFormat::Quantized);
        let e = rel_err(&deq, &reference);
        eprintln!(
            "{dtype:?}: dequantised {e}, quantized-vs-dequantised {}",
            rel_err(&quant, &deq)
        );
        assert!(e < bound, "{dtype:?}: dequantised error {e} over {bound}");
        // Same weights, different product: quantized activations add a little error only.
        let e = rel_err(&quant, &deq);
        assert!(e < 0.04, "{dtype:?}: quantized-vs-dequantised error {e}");
    }
}
