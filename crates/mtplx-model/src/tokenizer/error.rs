//! [`TokenizerError`]: why a tokenizer could not be built or used.

use std::path::PathBuf;

use thiserror::Error;

/// The ways building or using a [`Tokenizer`](super::Tokenizer) can fail.
#[derive(Debug, Error)]
pub enum TokenizerError {
    /// `tokenizer.ggml.model` names a vocabulary kind mtplx does not implement.
    #[error("unsupported GGUF tokenizer model `{model}` (supported: gpt2)")]
    UnsupportedModel { model: String },
    /// `tokenizer.ggml.pre` names a pre-tokenizer mtplx does not implement.
    #[error("unknown GGUF pre-tokenizer `{pre}`")]
    UnknownPreTokenizer { pre: String },
    #[error("GGUF metadata `{key}` is missing")]
    MissingMetadata { key: &'static str },
    #[error("GGUF metadata `{key}` is not {expected}")]
    BadMetadata {
        key: &'static str,
        expected: &'static str,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("tokenizer_config.json: {0}")]
    Config(#[source] serde_json::Error),
    /// The `tokenizers` crate refused to build or load the tokenizer.
    #[error("building the tokenizer: {0}")]
    Build(#[source] tokenizers::Error),
    #[error("encoding: {0}")]
    Encode(#[source] tokenizers::Error),
    /// Writing GGUF metadata needs the `tokenizer.ggml.pre` name, which only a tokenizer
    /// read from a GGUF file has.
    #[error("this tokenizer was not read from a GGUF file: it has no GGUF pre-tokenizer name")]
    NoGgufPreTokenizer,
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    UnknownId { id: u32, vocab: usize },
}
