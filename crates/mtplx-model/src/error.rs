//! [`ModelError`]: the one error type of the model crate, with the file, tensor or
//! position that went wrong.

use std::path::PathBuf;

use thiserror::Error;

use crate::chat::ChatTemplateError;
use crate::tokenizer::TokenizerError;

/// Everything that can go wrong in mtplx-model.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a GGUF file or a Hugging Face model folder: {reason}")]
    NotAModel { path: PathBuf, reason: String },
    #[error("{path}: malformed GGUF: {reason}")]
    BadGguf { path: PathBuf, reason: String },
    #[error("{path}: malformed safetensors: {reason}")]
    BadSafetensors { path: PathBuf, reason: String },
    #[error("{path}: unsupported architecture `{arch}` (supported: llama, qwen2, qwen3)")]
    UnsupportedArchitecture { path: PathBuf, arch: String },
    #[error("{path}: tensor `{tensor}` has unsupported type {dtype}")]
    UnsupportedDType {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },
    #[error("{path}: missing tensor `{tensor}`")]
    MissingTensor { path: PathBuf, tensor: String },
    #[error("{path}: tensor `{tensor}` has shape {got:?}, expected {expected:?}")]
    TensorShape {
        path: PathBuf,
        tensor: String,
        got: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("{path}: bad config: {reason}")]
    BadConfig { path: PathBuf, reason: String },
    #[error("{path}: tensor `{tensor}`: {reason}")]
    BadTensor {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("empty input: a forward pass needs at least one token")]
    EmptyInput,
    #[error("context full: {len} positions plus {new} new exceed the context window of {max}")]
    ContextFull { len: usize, new: usize, max: usize },
    #[error("hybrid model: {reason}")]
    Hybrid { reason: String },
    #[error("no recurrent checkpoint at or below position {position}")]
    NoCheckpoint { position: usize },
    #[error("KV cache: {0}")]
    Kv(#[from] mtplx_kv::KvError),
    #[error("weight kernel: {0}")]
    Kernel(#[from] crate::kernels::QuantMatrixError),
    /// The tensor library under the loaders (its own error, as text: the library is this
    /// crate's business, not its callers').
    #[error("tensor backend: {0}")]
    Backend(BackendError),
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    #[error("chat template: {0}")]
    ChatTemplate(#[from] ChatTemplateError),
    #[error("model store: {0}")]
    Store(String),
    /// The accelerator backend (`cuda`): no device, a driver or NVRTC failure, an
    /// unsupported model shape, or a cache that does not live on the device.
    #[error("device: {0}")]
    Device(String),
}

/// An error of the tensor library the loaders use, kept opaque so no caller depends on it.
#[derive(Debug)]
pub struct BackendError(Box<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

impl From<candle_core::Error> for ModelError {
    fn from(e: candle_core::Error) -> Self {
        ModelError::Backend(BackendError(Box::new(e)))
    }
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
