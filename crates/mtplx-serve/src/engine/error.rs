//! Why a generation failed inside the engine.

/// A failure of the model or of speculation; the client sees its message.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] mtplx_model::ModelError),
    #[error(transparent)]
    Spec(#[from] mtplx_spec::SpecError),
    #[error(transparent)]
    Tokenizer(#[from] mtplx_model::tokenizer::TokenizerError),
}
