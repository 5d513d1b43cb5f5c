//! How special tokens are read when encoding ([`Special`]) and written when decoding
//! ([`SpecialText`]).

/// How [`Tokenizer::encode`](super::Tokenizer::encode) reads text that spells a special token (`<|im_start|>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    /// As the special token's id (a rendered chat template).
    Parse,
    /// As plain text (a user's message, a file).
    AsText,
}

/// What [`Tokenizer::decode`](super::Tokenizer::decode) and
/// [`Tokenizer::stream_decoder`](super::Tokenizer::stream_decoder) do with special tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecialText {
    /// Leave them out (what a client is shown).
    Skip,
    /// Write their text.
    Keep,
}
