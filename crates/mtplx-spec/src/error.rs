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
