//! `cargo xtask make-shaped --out FILE`: a GGUF file with a published model's shape
//! (`--shape llama3-8b`, or `tiny` for tests) and seeded random weights, in `--quant q4_0`
//! or `q4_k_m` as llama.cpp quantizes that shape (`mtplx_model::shaped`), with the
//! tokenizer of a GGUF file (by default the default model's): issue 19's 8B-shaped model
//! for speed benchmarks.

use std::path::PathBuf;

use anyhow::{bail, Result};
use mtplx_model::shaped::{write_gguf, Quant, Shape};

/// What to write.
#[derive(Debug, Clone, clap::Args)]
pub struct MakeShapedArgs {
    /// The file to write (its folder is created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// `llama3-8b`, `smollm2-135m` (the default model's) or `tiny`.
    #[arg(long, default_value = "llama3-8b")]
    pub shape: String,
    /// `q4_0`, `q4_k_m` or `q4_1` (the default model's: Q4_1, the tied embedding Q8_0).
    #[arg(long, default_value = "q4_k_m")]
    pub quant: String,
    /// The weights' seed: the same arguments write the same bytes.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// The GGUF file whose tokenizer and chat template to take (by default the default
    /// model, fetched if missing).
    #[arg(long)]
    pub tokenizer_from: Option<PathBuf>,
    /// The context window the file declares, instead of the shape's own (e.g. 32,768 for
    /// a 32K-token benchmark on the 8,192-token Llama-3-8B shape: speed needs no trained
    /// long-context weights).
    #[arg(long)]
    pub context: Option<usize>,
}

/// The shape of a `--shape` name.
fn shape(name: &str) -> Result<Shape> {
    Ok(match name {
        "llama3-8b" => Shape::LLAMA3_8B,
        "smollm2-135m" => Shape::SMOLLM2_135M,
        "tiny" => Shape::TINY,
        other => bail!("--shape {other}: `llama3-8b`, `smollm2-135m` or `tiny`"),
    })
}

/// The quantization of a `--quant` name.
fn quant(name: &str) -> Result<Quant> {
    Ok(match name {
        "q4_0" => Quant::Q4_0,
        "q4_k_m" => Quant::Q4KM,
        "q4_1" => Quant::Q4_1,
        other => bail!("--quant {other}: `q4_0`, `q4_k_m` or `q4_1`"),
    })
}

pub fn run(args: &MakeShapedArgs, tokenizer: &std::path::Path) -> Result<()> {
    let (mut s, q) = (shape(&args.shape)?, quant(&args.quant)?);
    if let Some(context) = args.context {
        if context == 0 || context > u32::MAX as usize {
            bail!("--context {context}: between 1 and {}", u32::MAX);
        }
        s.context = context;
    }
    write_gguf(&args.out, s, q, args.seed, tokenizer)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny file of each quantization: the loader reads it as a model of its shape with
    /// the padded vocabulary, it generates, and the same arguments write the same bytes
    /// (`mtplx_model::shaped`'s tests check its tensor types); `--context` sets the window
    /// the loader reads.
    #[test]
    fn writes_a_file_the_loader_runs() {
        // The tokenizer comes from the default model, which `cargo xtask test` provides.
        let Some(model) = std::env::var_os("MTPLX_TEST_MODEL").map(PathBuf::from) else {
            eprintln!("MTPLX_TEST_MODEL not set: run through `cargo xtask test`");
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        for (quant, context) in [("q4_0", None), ("q4_k_m", Some(32_768))] {
            let args = |out: PathBuf| MakeShapedArgs {
                out,
                shape: "tiny".into(),
                quant: quant.into(),
                seed: 5,
                tokenizer_from: None,
                context,
            };
            let file = dir.path().join("sub").join(format!("{quant}.gguf"));
            run(&args(file.clone()), &model).unwrap();
            let again = dir.path().join(format!("again-{quant}.gguf"));
            run(&args(again.clone()), &model).unwrap();
            assert_eq!(
                std::fs::read(&file).unwrap(),
                std::fs::read(&again).unwrap()
            );

            let shape = Shape::TINY;
            let b = mtplx_model::Bundle::load(&file, mtplx_model::WeightFormat::Native).unwrap();
            assert_eq!(b.tokenizer.vocab_size(), shape.vocab);
            assert_eq!(
                b.model.dims().context_length,
                context.unwrap_or(shape.context)
            );
            let mut seq = b.model.new_sequence(&mtplx_kv::CacheFactory::paged());
            let prompt = b
                .tokenizer
                .encode("fn main() {", mtplx_model::tokenizer::Special::Parse)
                .unwrap();
            let out =
                mtplx_model::generate_greedy(&*b.model, &mut seq, &prompt, 4, &[], 64).unwrap();
            assert_eq!(out.len(), 4);
            assert!(out.iter().all(|&t| (t as usize) < shape.vocab));
        }
    }
}
