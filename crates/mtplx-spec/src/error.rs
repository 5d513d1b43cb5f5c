//! [`SpecError`]: the one error type of speculative decoding.

use thiserror::Error;

/// Everything that can go wrong in speculative decoding.
#[derive(Debug, Error)]
pub enum SpecError {
    #[error("model: {0}")]
    Model(#[from] mtplx_model::ModelError),
    #[error("draft: {0}")]
    Draft(String),
}

pub type Result<T, E = SpecError> = std::result::Result<T, E>;

/// A sequence that could not rewind is the model's state going wrong.
impl From<mtplx_kv::KvError> for SpecError {
    fn from(e: mtplx_kv::KvError) -> Self {
        SpecError::Model(e.into())
    }
}
