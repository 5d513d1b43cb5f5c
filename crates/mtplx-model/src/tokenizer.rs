//! Text to token ids and back, from GGUF metadata or a Hugging Face `tokenizer.json`.
//!
//! Encoding runs the `tokenizers` crate; for GGUF files it is set up the way llama.cpp
//! reads the same metadata (same pre-tokenizer regexes, same special-token rules), so ids
//! match llama.cpp's. Decoding goes through a table of each token's bytes, which
//! [`StreamDecoder`] shares, so streamed text equals decoded text byte for byte.

mod error;
mod gguf;
mod hf;
mod parts;
mod pieces;
mod pretokenizer;
mod special;
mod stream;

use std::path::Path;
use std::sync::Arc;

use candle_core::quantized::gguf_file;

pub use error::TokenizerError;
pub use special::{Special, SpecialText};
pub use stream::StreamDecoder;

use parts::{HfTokenizer, Parts};
use pieces::TokenPieces;

/// Texts of the tokens that end a chat turn; any of them that is a special token of the
/// vocabulary stops generation (llama.cpp's end-of-generation list).
const END_OF_TURN: &[&str] = &[
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<end_of_turn>",
    "<|end|>",
    "<EOT>",
];

/// A tokenizer plus what a server needs around it: BOS/EOS, the ids that end generation,
/// the special tokens and the chat template.
pub struct Tokenizer {
    /// Special tokens written in the text become their ids.
    split: HfTokenizer,
    /// Special tokens written in the text are plain text.
    literal: HfTokenizer,
    pieces: Arc<TokenPieces>,
    bos: Option<u32>,
    eos: Option<u32>,
    pad: Option<u32>,
    stop: Vec<u32>,
    special: Vec<(u32, String)>,
    chat_template: Option<String>,
    add_bos: bool,
    /// The stop ids the source named beyond EOS (GGUF `eot_token_id`, `eom_token_id`).
    extra_stop: Vec<u32>,
    /// The GGUF pre-tokenizer name, when the tokenizer came from a GGUF file.
    gguf_pre: Option<String>,
}

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes (`tokenizer.ggml.*` metadata). Only
    /// byte-level BPE (`tokenizer.ggml.model = "gpt2"`) is supported.
    pub fn from_gguf(content: &gguf_file::Content) -> Result<Self, TokenizerError> {
        gguf::parts(content).map(Self::assemble)
    }

    /// Loads a Hugging Face `tokenizer.json`; BOS, EOS, padding, `add_bos_token` and the
    /// chat template come from `tokenizer_config.json` when given.
    pub fn from_file(
        tokenizer_json: &Path,
        tokenizer_config_json: Option<&Path>,
    ) -> Result<Self, TokenizerError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| TokenizerError::Io {
                path: path.to_path_buf(),
                source,
            })
        };
        let config = tokenizer_config_json.map(read).transpose()?;
        Self::from_json(&read(tokenizer_json)?, config.as_deref())
    }

    /// [`from_file`](Self::from_file) over bytes already read.
    pub fn from_json(
        tokenizer_json: &[u8],
        tokenizer_config_json: Option<&[u8]>,
    ) -> Result<Self, TokenizerError> {
        hf::parts(tokenizer_json, tokenizer_config_json).map(Self::assemble)
    }

    fn assemble(parts: Parts) -> Self {
        let Parts {
            hf,
            pieces,
            bos,
            eos,
            pad,
            extra_stop,
            chat_template,
            add_bos,
            gguf_pre,
        } = parts;
        let special: Vec<(u32, String)> = (0..pieces.len() as u32)
            .filter(|&id| pieces.is_special(id))
            .filter_map(|id| Some((id, hf.id_to_token(id)?)))
            .collect();
        let mut stop: Vec<u32> = eos
            .into_iter()
            .chain(extra_stop.iter().copied())
            .chain(
                special
                    .iter()
                    .filter(|(_, text)| END_OF_TURN.contains(&text.as_str()))
                    .map(|(id, _)| *id),
            )
            .collect();
        stop.sort_unstable();
        stop.dedup();
        let mut literal = hf.clone();
        literal.set_encode_special_tokens(true);
        Tokenizer {
            split: hf,
            literal,
            pieces: Arc::new(pieces),
            bos,
            eos,
            pad,
            stop,
            special,
            chat_template,
            add_bos,
            extra_stop,
            gguf_pre,
        }
    }

    /// The ids of `text`. With [`Special::Parse`], special tokens written in the text (such
    /// as `<|im_start|>`) become their ids; with [`Special::AsText`], they are tokenized as
    /// plain text. Never
    /// adds BOS: the chat template writes it, or the caller prepends [`bos_id`](Self::bos_id)
    /// when [`add_bos_token`](Self::add_bos_token) says so.
    pub fn encode(&self, text: &str, special: Special) -> Result<Vec<u32>, TokenizerError> {
        let tokenizer = match special {
            Special::Parse => &self.split,
            Special::AsText => &self.literal,
        };
        let encoding = tokenizer
            .encode_fast(text, false)
            .map_err(TokenizerError::Encode)?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`, special tokens left out or written as [`SpecialText`] says. Bytes
    /// that do not form UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32], special: SpecialText) -> Result<String, TokenizerError> {
        self.pieces.decode(ids, special)
    }

    /// A decoder for ids arriving one at a time; see [`StreamDecoder`].
    pub fn stream_decoder(&self, special: SpecialText) -> StreamDecoder {
        StreamDecoder::new(self.pieces.clone(), special)
    }

    /// Number of ids, added tokens included (one past the largest id).
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.split.token_to_id(token)
    }

    /// The vocabulary entry of `id` as stored (byte-level spelling, e.g. `Ġthe`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.split.id_to_token(id)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }

    /// The text of the BOS token, for the chat template's `bos_token`.
    pub fn bos_token(&self) -> Option<String> {
        self.bos.and_then(|id| self.id_to_token(id))
    }

    /// The text of the EOS token, for the chat template's `eos_token`.
    pub fn eos_token(&self) -> Option<String> {
        self.eos.and_then(|id| self.id_to_token(id))
    }

    /// Whether the model expects BOS before a plain (non-chat) prompt.
    pub fn add_bos_token(&self) -> bool {
        self.add_bos
    }

    /// The ids that end generation, sorted: EOS, and the end-of-turn special tokens the
    /// vocabulary has (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `<end_of_turn>`, ...).
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop
    }

    pub fn is_stop(&self, id: u32) -> bool {
        self.stop.binary_search(&id).is_ok()
    }

    /// This tokenizer as a Hugging Face folder has it: `tokenizer.json` and
    /// `tokenizer_config.json` (BOS, EOS, padding, `add_bos_token`, the chat template), so
    /// a model written as such a folder (`cargo xtask make-hybrid`) carries the tokenizer
    /// of the file it was made beside. [`Tokenizer::from_json`] reads them back.
    pub fn to_hf_json(&self) -> Result<(String, String), TokenizerError> {
        let tokenizer = self.split.to_string(true).map_err(TokenizerError::Build)?;
        let config = serde_json::json!({
            "bos_token": self.bos_token(),
            "eos_token": self.eos_token(),
            "pad_token": self.pad.and_then(|id| self.id_to_token(id)),
            "add_bos_token": self.add_bos,
            "chat_template": self.chat_template,
        });
        let config = serde_json::to_string_pretty(&config).expect("a JSON value prints");
        Ok((tokenizer, config))
    }

    /// This tokenizer as GGUF metadata (`tokenizer.ggml.*` and `tokenizer.chat_template`),
    /// so a GGUF file written by mtplx (`hybrid::gguf::save`) carries the tokenizer of the
    /// file it was made beside; [`Tokenizer::from_gguf`] reads it back. Only a tokenizer
    /// read from a GGUF file can be written: one from `tokenizer.json` has no GGUF
    /// pre-tokenizer name ([`TokenizerError::NoGgufPreTokenizer`]).
    pub fn to_gguf_metadata(&self) -> Result<Vec<(String, gguf_file::Value)>, TokenizerError> {
        let pre = self
            .gguf_pre
            .as_deref()
            .ok_or(TokenizerError::NoGgufPreTokenizer)?;
        gguf::metadata(parts::GgufParts {
            hf: &self.split,
            pieces: &self.pieces,
            bos: self.bos,
            eos: self.eos,
            pad: self.pad,
            extra_stop: &self.extra_stop,
            chat_template: self.chat_template.as_deref(),
            add_bos: self.add_bos,
            pre,
        })
    }

    /// Whether `id` is a special (control) token: left out by `decode(.., true)`.
    pub fn is_special(&self, id: u32) -> bool {
        self.pieces.is_special(id)
    }

    /// The special tokens, by id.
    pub fn special_tokens(&self) -> &[(u32, String)] {
        &self.special
    }

    /// The chat template source (`tokenizer.chat_template` or the config's), if any.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("stop", &self.stop)
            .field("special_tokens", &self.special.len())
            .field("chat_template", &self.chat_template.is_some())
            .finish_non_exhaustive()
    }
}
