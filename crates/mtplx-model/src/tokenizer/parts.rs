//! [`Parts`]: what each tokenizer source (GGUF metadata, `tokenizer.json`) supplies, and
//! the Hugging Face tokenizer type they build.

use super::pieces::TokenPieces;

pub(super) type HfTokenizer = tokenizers::Tokenizer;

/// What each source (GGUF, `tokenizer.json`) supplies; `Tokenizer::assemble` derives
/// the rest.
pub(super) struct Parts {
    pub(super) hf: HfTokenizer,
    pub(super) pieces: TokenPieces,
    pub(super) bos: Option<u32>,
    pub(super) eos: Option<u32>,
    pub(super) pad: Option<u32>,
    /// Stop ids named by the source beyond EOS (GGUF `eot_token_id`, `eom_token_id`).
    pub(super) extra_stop: Vec<u32>,
    pub(super) chat_template: Option<String>,
    pub(super) add_bos: bool,
    /// The `tokenizer.ggml.pre` name the pre-tokenizer was built from (GGUF sources only;
    /// `default` when the file had none), so the tokenizer can be written back to a GGUF.
    pub(super) gguf_pre: Option<String>,
}

/// What a tokenizer writes back as GGUF metadata (`gguf::metadata`), borrowed from it.
pub(super) struct GgufParts<'a> {
    pub(super) hf: &'a HfTokenizer,
    pub(super) pieces: &'a TokenPieces,
    pub(super) bos: Option<u32>,
    pub(super) eos: Option<u32>,
    pub(super) pad: Option<u32>,
    pub(super) extra_stop: &'a [u32],
    pub(super) chat_template: Option<&'a str>,
    pub(super) add_bos: bool,
    /// The `tokenizer.ggml.pre` name.
    pub(super) pre: &'a str,
}
