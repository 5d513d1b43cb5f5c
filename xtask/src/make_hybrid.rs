//! `cargo xtask make-hybrid --out DIR`: writes a small deterministic Qwen3-Next checkpoint
//! (seeded weights, the published `config.json` keys and tensor names, as a user's own
//! folder has them), since no package ships a hybrid model small enough for tests. With
//! `--format gguf --out FILE` it writes the same weights as one GGUF file under llama.cpp's
//! `qwen35` names instead (`mtplx_model::hybrid::gguf`).
//!
//! With the weights it writes the tokenizer and chat template of a GGUF file
//! (`tokenizer.json`, `tokenizer_config.json` beside them, or the GGUF file's own
//! `tokenizer.ggml.*` metadata; by default the default model's), so the output is a whole
//! model. Its shape: the default model's vocabulary size (49,152 ids), a
//! context of 8,192 positions, 8 layers (three gated delta nets then one gated attention
//! layer, twice), partial rotary over a quarter of each attention head as Qwen3-Next has.
//! The weights are `HybridWeights::random(seed)`: loading the folder gives back their bits
//! (`crates/mtplx-model/tests/hybrid_hf.rs`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use mtplx_model::hybrid::{synthetic, HybridConfig};
use mtplx_model::source::GgufSource;
use mtplx_model::tokenizer::Tokenizer;

/// What to write.
#[derive(Debug, Clone, clap::Args)]
pub struct MakeHybridArgs {
    /// What to write: the folder (created if missing) for `--format hf`, the file itself
    /// (for example `hybrid.gguf`; its folder is created if missing) for `--format gguf`.
    #[arg(long)]
    pub out: PathBuf,
    /// `hf` (a folder: config.json, model.safetensors, the tokenizer files) or `gguf` (one
    /// file: llama.cpp's `qwen35` architecture, f32 tensors, the tokenizer in its metadata).
    #[arg(long, default_value = "hf")]
    pub format: String,
    /// The weights' seed: the same seed writes the same bytes.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// The tests' tiny shape instead (`HybridConfig::tiny`: vocabulary 256, hidden 64), as
    /// `tools/reference/transformers_qwen3_next.py` takes it to transformers.
    #[arg(long)]
    pub tiny: bool,
    /// The GGUF file whose tokenizer and chat template to write beside the weights (by
    /// default the default model, fetched if missing).
    #[arg(long)]
    pub tokenizer_from: Option<PathBuf>,
}

/// The checkpoint's shape.
pub use mtplx_model::hybrid::synthetic::config;

pub fn run(args: &MakeHybridArgs, tokenizer: Option<&Path>) -> Result<()> {
    let gguf = match args.format.as_str() {
        "hf" => false,
        "gguf" => true,
        other => bail!("--format {other}: `hf` or `gguf`"),
    };
    let c = if args.tiny {
        HybridConfig::tiny()
    } else {
        config()
    };
    let tokenizer = match tokenizer {
        Some(gguf) => Some(Tokenizer::from_gguf(GgufSource::open(gguf)?.content())?),
        None => None,
    };
    if gguf {
        synthetic::write_gguf(&args.out, &c, args.seed, tokenizer.as_ref())?;
    } else {
        synthetic::write(&args.out, &c, args.seed, tokenizer.as_ref())?;
    }
    println!(
        "wrote a Qwen3-Next checkpoint ({}, seed {}, {} layers, vocabulary {}, context {}) to {}",
        if gguf { "GGUF qwen35" } else { "Hugging Face" },
        args.seed,
        c.num_layers,
        c.vocab_size,
        c.context_length,
        args.out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mtplx_model::hybrid::{gguf, hf, HybridModel, HybridWeights};
    use mtplx_model::LanguageModel as _;

    #[test]
    fn writes_a_folder_the_loader_reads_back_with_the_same_bits() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("hybrid");
        let args = |out: &Path| MakeHybridArgs {
            out: out.to_path_buf(),
            format: "hf".into(),
            seed: 3,
            tiny: false,
            tokenizer_from: None,
        };
        // The default model, when the tests have it (`cargo xtask test` sets this).
        let model = std::env::var_os("MTPLX_TEST_MODEL").map(PathBuf::from);
        run(&args(&out), model.as_deref()).unwrap();
        let (c, w) = hf::load(&out).unwrap();
        assert_eq!(c.context_length, 8192);
        assert_eq!(c.rotary_dim(), 8);
        assert_eq!(w, HybridWeights::random(&config(), 3));
        // Deterministic: the same seed writes the same bytes.
        let again = dir.path().join("again");
        run(&args(&again), None).unwrap();
        for f in ["config.json", "model.safetensors"] {
            assert_eq!(
                std::fs::read(out.join(f)).unwrap(),
                std::fs::read(again.join(f)).unwrap(),
                "{f}"
            );
        }
        if let Some(model) = &model {
            let t = Tokenizer::from_file(
                &out.join("tokenizer.json"),
                Some(&out.join("tokenizer_config.json")),
            )
            .unwrap();
            let want = Tokenizer::from_gguf(GgufSource::open(model).unwrap().content()).unwrap();
            assert_eq!(t.vocab_size(), want.vocab_size());
            assert_eq!(t.chat_template(), want.chat_template());
            assert_eq!(t.stop_ids(), want.stop_ids());
        }
        let bad = MakeHybridArgs {
            format: "onnx".into(),
            ..args(&out)
        };
        assert!(run(&bad, None).is_err());
    }

    #[test]
    fn writes_a_gguf_file_the_loader_reads_back_with_the_same_model() {
        let dir = tempfile::tempdir().unwrap();
        let args = |out: PathBuf| MakeHybridArgs {
            out,
            format: "gguf".into(),
            seed: 3,
            tiny: false,
            tokenizer_from: None,
        };
        let file = dir.path().join("sub").join("hybrid.gguf");
        let model = std::env::var_os("MTPLX_TEST_MODEL").map(PathBuf::from);
        run(&args(file.clone()), model.as_deref()).unwrap();
        let (c, w) = gguf::load(&file).unwrap();
        assert_eq!(c, config());
        let want = HybridWeights::random(&config(), 3);
        // The same model: every weight but A_log bit for bit, and A_log's decay rate.
        assert_eq!(w.embed, want.embed);
        assert_eq!(w.lm_head, want.lm_head);
        let logits = |c: HybridConfig, w: &HybridWeights| {
            let m = HybridModel::new(c, w).unwrap();
            let mut seq = m.new_sequence(&mtplx_kv::CacheFactory::paged());
            m.forward(&[1, 2, 3, 500, 7], &mut seq, mtplx_model::Want::All)
                .unwrap()
                .logits
        };
        assert_eq!(logits(c, &w), logits(config(), &want));
        let again = dir.path().join("again.gguf");
        run(&args(again.clone()), model.as_deref()).unwrap();
        assert_eq!(
            std::fs::read(&file).unwrap(),
            std::fs::read(&again).unwrap()
        );
        if let Some(model) = &model {
            let b = mtplx_model::Bundle::load(&file, mtplx_model::WeightFormat::Native).unwrap();
            let want = Tokenizer::from_gguf(GgufSource::open(model).unwrap().content()).unwrap();
            assert_eq!(b.tokenizer.vocab_size(), want.vocab_size());
            assert_eq!(b.tokenizer.chat_template(), want.chat_template());
            assert_eq!(b.tokenizer.stop_ids(), want.stop_ids());
            assert!(b.template.is_some());
        }
    }
}
