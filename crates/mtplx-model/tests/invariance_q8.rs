//! `WeightFormat::NativeQ8` (8-bit activations for the Q8_0, Q5_0, Q4_0, Q4_1, Q4_K and Q6_K
//! products) on a K-quant model: the default for such files, and batch-invariant as the `f32` path
//! is. A prompt's logits are the same bits whichever way it arrived (prefill chunks of any size, a
//! prefix then single steps), a verify block's rows are the steps' bits, and the numbers are not
//! those of `f32` activations (the products really take the 8-bit path).
//!
//! The model is `mtplx_model::shaped`'s tiny Q4_K_M file (Q4_K, Q6_K for `attn_v`,
//! `ffn_down` in the layers llama.cpp's rule picks, and the output), seeded random weights
//! with the default model's tokenizer (`MTPLX_TEST_MODEL`, which `cargo xtask test` sets).

use std::path::{Path, PathBuf};

use mtplx_kv::{CacheFactory, Sequence};
use mtplx_model::shaped::{write_gguf, Quant, Shape};
use mtplx_model::{prefill, Bundle, ForwardOutput, LanguageModel, Model, Want, WeightFormat};

fn tokenizer_source() -> Option<PathBuf> {
    let p = std::env::var_os("MTPLX_TEST_MODEL").map(PathBuf::from);
    if p.is_none() {
        eprintln!("MTPLX_TEST_MODEL not set: run through `cargo xtask test`");
    }
    p
}

fn tiny(dir: &Path, quant: Quant, tokenizer: &Path) -> PathBuf {
    let file = dir.join(format!("tiny-{quant:?}.gguf"));
    write_gguf(&file, Shape::TINY, quant, 5, tokenizer).unwrap();
    file
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn prompt() -> Vec<u32> {
    (0..300u32).map(|i| (i * 7919 + 13) % 49_000).collect()
}

#[test]
fn k_quant_files_default_to_8_bit_activations() {
    let Some(tok) = tokenizer_source() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let km = tiny(dir.path(), Quant::Q4KM, &tok);
    let q40 = tiny(dir.path(), Quant::Q4_0, &tok);
    assert_eq!(Bundle::default_format(&km).unwrap(), WeightFormat::NativeQ8);
    assert_eq!(Bundle::default_format(&q40).unwrap(), WeightFormat::Native);
    // The default model: Q4_1 layers and a Q8_0 table, no K-quant.
    assert_eq!(Bundle::default_format(&tok).unwrap(), WeightFormat::Native);
}

#[test]
fn eight_bit_logits_do_not_depend_on_how_the_prompt_arrived() {
    let Some(tok) = tokenizer_source() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = tiny(dir.path(), Quant::Q4KM, &tok);
    let model = Model::load(&file, WeightFormat::NativeQ8).unwrap();
    assert!(model.is_batch_invariant());
    let shape = model.state_shape();
    let ids = prompt();

    let mut reference: Option<Vec<u32>> = None;
    for chunk in [512, 64, 7, 1] {
        let mut cache = Sequence::new(&CacheFactory::contiguous(), &shape);
        let out = prefill(&model, &ids, &mut cache, chunk).unwrap();
        let got = bits(out.last_logits());
        match &reference {
            None => reference = Some(got),
            Some(want) => assert!(&got == want, "chunks of {chunk}: other bits"),
        }
    }
    let want = reference.unwrap();

    // A prefix in chunks, then single steps, in the paged layout.
    let mut cache = Sequence::new(&CacheFactory::paged(), &shape);
    prefill(&model, &ids[..280], &mut cache, 128).unwrap();
    let mut out = ForwardOutput::default();
    for t in &ids[280..] {
        model
            .forward_into(&[*t], &mut cache, Want::Last, &mut out)
            .unwrap();
    }
    assert!(
        bits(out.last_logits()) == want,
        "prefix then steps: other bits"
    );

    // A verify block's rows are the steps' bits.
    let mut a = Sequence::new(&CacheFactory::contiguous(), &shape);
    prefill(&model, &ids[..295], &mut a, 64).unwrap();
    let block = model.forward(&ids[295..], &mut a, Want::All).unwrap();
    let mut b = Sequence::new(&CacheFactory::contiguous(), &shape);
    prefill(&model, &ids[..295], &mut b, 295).unwrap();
    for (r, t) in ids[295..].iter().enumerate() {
        let one = model.forward(&[*t], &mut b, Want::Last).unwrap();
        assert!(
            bits(block.logits_row(r)) == bits(one.last_logits()),
            "row {r}"
        );
    }

    // Not the f32 path's numbers, and a different reuse key.
    let f32_model = Model::load(&file, WeightFormat::Native).unwrap();
    let mut c = Sequence::new(&CacheFactory::contiguous(), &shape);
    let f = prefill(&f32_model, &ids, &mut c, 512).unwrap();
    assert!(
        bits(f.last_logits()) != want,
        "8-bit activations gave the f32 path's bits"
    );
    assert_ne!(model.numerics(), f32_model.numerics());
}
