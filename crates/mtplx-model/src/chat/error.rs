//! [`ChatTemplateError`]: why a chat template did not compile or render.

use thiserror::Error;

/// The ways compiling or rendering a [`ChatTemplate`](super::ChatTemplate) can fail.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ChatTemplateError {
    /// The template source does not compile.
    #[error("syntax error: {message}")]
    Syntax { message: String },
    /// The template called `raise_exception(message)`: it rejects the conversation (roles
    /// out of order, an unsupported feature). The request is at fault, not the server.
    #[error("{message}")]
    Raised { message: String },
    /// Rendering failed for another reason.
    #[error("render error: {message}")]
    Render { message: String },
}
