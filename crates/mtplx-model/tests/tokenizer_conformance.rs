//! The tokenizer agrees with the references: llama.cpp's ids for SmolLM2's GGUF
//! (`tests/fixtures/tokenizer/smollm2.json`), and the `tokenizers` crate's decoding for the
//! tiny Hugging Face fixtures (`tests/fixtures/tiny/<arch>/`).

use mtplx_model::tokenizer::{Special, SpecialText};
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{ensure, Context, Result};
use candle_core::quantized::gguf_file;
use mtplx_model::store::{ModelStore, DEFAULT_MODEL};
use mtplx_model::tokenizer::Tokenizer;
use proptest::prelude::*;
use serde::Deserialize;

/// The default model: `$MTPLX_TEST_MODEL`, else the store's copy. CI fetches it first, so
/// a missing file is a failure, not a skip.
fn model_path() -> PathBuf {
    let path = std::env::var_os("MTPLX_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| ModelStore::from_env().path_of(&DEFAULT_MODEL));
    assert!(
        path.is_file(),
        "test model {} is missing: fetch SmolLM2-135M-Instruct.Q4_1.gguf there or set MTPLX_TEST_MODEL",
        path.display()
    );
    path
}

fn smollm2() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = model_path();
        let mut reader = BufReader::new(File::open(&path).expect("open the test model"));
        let content = gguf_file::Content::read(&mut reader).expect("read GGUF metadata");
        Tokenizer::from_gguf(&content).expect("build the tokenizer from GGUF metadata")
    })
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

#[derive(Debug, Deserialize)]
struct Reference {
    bos_token_id: u32,
    eos_token_id: u32,
    add_bos: bool,
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct Case {
    text: String,
    /// llama.cpp's ids with special tokens parsed.
    ids: Vec<u32>,
    /// llama.cpp's ids with special tokens as plain text, where they differ.
    ids_special_as_text: Option<Vec<u32>>,
    /// llama.cpp's detokenization of `ids`, special tokens rendered.
    decoded: String,
}

fn reference() -> Result<Reference> {
    let path = fixtures().join("tokenizer/smollm2.json");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let reference: Reference = serde_json::from_str(&text)?;
    ensure!(reference.cases.len() >= 40, "fixture has too few cases");
    Ok(reference)
}

/// Runs `check` on every case and reports all failures at once.
fn all_cases(check: impl Fn(&Case) -> Result<Option<String>>) -> Result<()> {
    let mut failures = Vec::new();
    for case in reference()?.cases {
        if let Some(failure) = check(&case)? {
            failures.push(format!("{:?}: {failure}", case.text));
        }
    }
    ensure!(
        failures.is_empty(),
        "{} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    Ok(())
}

#[test]
fn encodes_like_llama_cpp_with_special_tokens_parsed() -> Result<()> {
    let tok = smollm2();
    all_cases(|case| {
        let ids = tok.encode(&case.text, Special::Parse)?;
        Ok((ids != case.ids).then(|| format!("got {ids:?}, llama.cpp {:?}", case.ids)))
    })
}

#[test]
fn encodes_like_llama_cpp_with_special_tokens_as_text() -> Result<()> {
    let tok = smollm2();
    all_cases(|case| {
        let want = case.ids_special_as_text.as_ref().unwrap_or(&case.ids);
        let ids = tok.encode(&case.text, Special::AsText)?;
        Ok((&ids != want).then(|| format!("got {ids:?}, llama.cpp {want:?}")))
    })
}

#[test]
fn decodes_like_llama_cpp() -> Result<()> {
    let tok = smollm2();
    all_cases(|case| {
        let text = tok.decode(&case.ids, SpecialText::Keep)?;
        Ok((text != case.decoded).then(|| format!("got {text:?}, llama.cpp {:?}", case.decoded)))
    })
}

#[test]
fn streamed_text_equals_decoded_text_on_every_case() -> Result<()> {
    let tok = smollm2();
    all_cases(|case| {
        let mut stream = tok.stream_decoder(SpecialText::Keep);
        let mut text = String::new();
        for &id in &case.ids {
            text.extend(stream.push(id)?);
        }
        text.push_str(&stream.finish());
        Ok((text != case.decoded).then(|| format!("streamed {text:?}")))
    })
}

#[test]
fn special_ids_and_template_come_from_metadata() -> Result<()> {
    let tok = smollm2();
    let reference = reference()?;
    assert_eq!(tok.bos_id(), Some(reference.bos_token_id));
    assert_eq!(tok.eos_id(), Some(reference.eos_token_id));
    assert_eq!(tok.add_bos_token(), reference.add_bos);
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos_token().as_deref(), Some("<|im_start|>"));
    assert_eq!(tok.eos_token().as_deref(), Some("<|im_end|>"));
    // <|endoftext|> and <|im_end|> end generation; <|im_start|> does not.
    assert_eq!(tok.stop_ids(), [0, 2]);
    assert!(tok.is_special(1) && !tok.is_special(17));
    assert_eq!(tok.decode(&[1, 28120, 2], SpecialText::Skip)?, "hello");
    let template = tok.chat_template().context("SmolLM2 has a chat template")?;
    assert!(template.contains("<|im_start|>"), "{template}");
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_text_round_trips_and_streams(text in "\\PC{0,40}|[ \\n\\t<|>a-z0-9]{0,40}") {
        let tok = smollm2();
        let ids = tok.encode(&text, Special::AsText).unwrap();
        let decoded = tok.decode(&ids, SpecialText::Keep).unwrap();
        prop_assert_eq!(&decoded, &text);
        let mut stream = tok.stream_decoder(SpecialText::Keep);
        let mut streamed = String::new();
        for id in ids {
            streamed.extend(stream.push(id).unwrap());
        }
        streamed.push_str(&stream.finish());
        prop_assert_eq!(streamed, decoded);
    }

    #[test]
    fn streaming_arbitrary_ids_equals_decoding(
        ids in prop::collection::vec(0u32..49152, 0..48),
        skip_special in any::<bool>(),
    ) {
        let tok = smollm2();
        let special = if skip_special { SpecialText::Skip } else { SpecialText::Keep };
        let mut stream = tok.stream_decoder(special);
        let mut streamed = String::new();
        for &id in &ids {
            streamed.extend(stream.push(id).unwrap());
        }
        streamed.push_str(&stream.finish());
        prop_assert_eq!(streamed, tok.decode(&ids, special).unwrap());
    }
}

/// `tokenizer.json` fixtures: what `from_file` reads, and decoding that agrees with the
/// `tokenizers` crate's own decoder.
#[test]
fn hugging_face_fixtures_load_and_decode_like_tokenizers() -> Result<()> {
    let texts = [
        "Hello, world! 12345",
        "<|im_start|>user\nhi<|im_end|>\n",
        "  spaced\t\ttabs\n\nnewlines  ",
        "café 😀 日本",
    ];
    for arch in ["llama", "qwen2", "qwen3"] {
        let dir = fixtures().join("tiny").join(arch);
        let json = dir.join("tokenizer.json");
        let tok = Tokenizer::from_file(&json, Some(&dir.join("tokenizer_config.json")))
            .with_context(|| arch.to_owned())?;
        let reference = tokenizers::Tokenizer::from_file(&json).map_err(anyhow::Error::msg)?;

        assert_eq!(tok.eos_id(), Some(2), "{arch}");
        assert_eq!(tok.eos_token().as_deref(), Some("<|im_end|>"), "{arch}");
        assert_eq!(tok.pad_id(), Some(0), "{arch}");
        assert!(!tok.add_bos_token(), "{arch}");
        assert_eq!(tok.stop_ids(), [0, 2], "{arch}");
        assert!(tok.chat_template().is_some(), "{arch}");
        assert_eq!(tok.encode("<|im_start|>", Special::Parse)?, [1], "{arch}");
        assert_ne!(tok.encode("<|im_start|>", Special::AsText)?, [1], "{arch}");

        for text in texts {
            let ids = tok.encode(text, Special::Parse)?;
            let want = reference
                .encode(text, false)
                .map_err(anyhow::Error::msg)?
                .get_ids()
                .to_vec();
            assert_eq!(ids, want, "{arch} {text:?}");
            for (special, skip) in [(SpecialText::Keep, false), (SpecialText::Skip, true)] {
                let want = reference.decode(&ids, skip).map_err(anyhow::Error::msg)?;
                assert_eq!(
                    tok.decode(&ids, special)?,
                    want,
                    "{arch} {text:?} skip={skip}"
                );
            }
        }
    }
    // SmolLM-style config names BOS; Qwen's has none.
    let dir = fixtures().join("tiny/llama");
    let tok = Tokenizer::from_file(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
    )?;
    assert_eq!(tok.bos_id(), Some(1));
    Ok(())
}

#[test]
fn from_file_without_config_and_missing_file() -> Result<()> {
    let json = fixtures().join("tiny/qwen2/tokenizer.json");
    let tok = Tokenizer::from_file(&json, None)?;
    assert_eq!(tok.eos_id(), None);
    assert_eq!(tok.chat_template(), None);
    // No EOS named, but the vocabulary's end-of-turn tokens still stop generation.
    assert_eq!(tok.stop_ids(), [0, 2]);
    let missing = fixtures().join("tiny/qwen2/no-such.json");
    let err = Tokenizer::from_file(&missing, None).unwrap_err();
    assert!(err.to_string().contains("no-such.json"), "{err}");
    Ok(())
}

/// The default model's tokenizer written as a Hugging Face folder's files (what `cargo
/// xtask make-hybrid` puts beside its weights) reads back as the same tokenizer: the same
/// ids and text on every case, the same specials, stops, BOS/EOS and chat template.
#[test]
fn the_gguf_tokenizer_round_trips_through_hugging_face_files() -> Result<()> {
    let tok = smollm2();
    let (json, config) = tok.to_hf_json()?;
    let back = Tokenizer::from_json(json.as_bytes(), Some(config.as_bytes()))?;
    assert_eq!(back.vocab_size(), tok.vocab_size());
    assert_eq!(back.special_tokens(), tok.special_tokens());
    assert_eq!(back.stop_ids(), tok.stop_ids());
    assert_eq!((back.bos_id(), back.eos_id()), (tok.bos_id(), tok.eos_id()));
    assert_eq!(back.add_bos_token(), tok.add_bos_token());
    assert_eq!(back.chat_template(), tok.chat_template());
    assert!(back.chat_template().is_some());
    all_cases(|case| {
        for special in [Special::Parse, Special::AsText] {
            let (a, b) = (
                tok.encode(&case.text, special)?,
                back.encode(&case.text, special)?,
            );
            if a != b {
                return Ok(Some(format!("{special:?}: {a:?} read back as {b:?}")));
            }
        }
        for special in [SpecialText::Keep, SpecialText::Skip] {
            let (a, b) = (
                tok.decode(&case.ids, special)?,
                back.decode(&case.ids, special)?,
            );
            if a != b {
                return Ok(Some(format!("{special:?}: {a:?} read back as {b:?}")));
            }
        }
        Ok(None)
    })
}
