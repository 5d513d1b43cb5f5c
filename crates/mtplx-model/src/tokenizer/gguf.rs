//! A byte-level BPE tokenizer built from GGUF metadata, matching llama.cpp's
//! (`llama_vocab::impl::load` and `llm_tokenizer_bpe` in `src/llama-vocab.cpp`).

use std::collections::HashMap;

use candle_core::quantized::gguf_file::{Content, Value};
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::AddedToken;

use super::error::TokenizerError;
use super::parts::{GgufParts, HfTokenizer, Parts};
use super::pieces::{byte_level_bytes, Piece, TokenPieces};
use super::pretokenizer::PreTokenizerKind;

const MODEL: &str = "tokenizer.ggml.model";
const PRE: &str = "tokenizer.ggml.pre";
const TOKENS: &str = "tokenizer.ggml.tokens";
const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const MERGES: &str = "tokenizer.ggml.merges";
const BOS: &str = "tokenizer.ggml.bos_token_id";
const EOS: &str = "tokenizer.ggml.eos_token_id";
const EOT: &str = "tokenizer.ggml.eot_token_id";
const EOM: &str = "tokenizer.ggml.eom_token_id";
const PAD: &str = "tokenizer.ggml.padding_token_id";
const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const CHAT_TEMPLATE: &str = "tokenizer.chat_template";

/// `tokenizer.ggml.token_type`: what a token is (llama.cpp's `llama_token_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokenType {
    Normal,
    Unknown,
    /// Markup such as `<|im_start|>`: matched in text only when special tokens are allowed,
    /// left out when decoding with [`SpecialText::Skip`](super::SpecialText::Skip).
    Control,
    /// Added vocabulary: always matched in text, always decoded.
    UserDefined,
    Unused,
    Byte,
    Undefined,
}

impl TokenType {
    fn from_code(code: i64) -> Self {
        match code {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }

    /// The bytes llama.cpp's `token_to_piece` gives for a BPE token of this type.
    fn piece(self, text: &str) -> Piece {
        let (bytes, special) = match self {
            TokenType::Normal => (byte_level_bytes(text), false),
            TokenType::Control | TokenType::Unknown => (text.as_bytes().to_vec(), true),
            TokenType::UserDefined => (text.as_bytes().to_vec(), false),
            TokenType::Unused | TokenType::Byte | TokenType::Undefined => (Vec::new(), false),
        };
        Piece { bytes, special }
    }
}

pub(super) fn parts(content: &Content) -> Result<Parts, TokenizerError> {
    let md = &content.metadata;
    let model = string(md, MODEL)?.ok_or(TokenizerError::MissingMetadata { key: MODEL })?;
    if model != "gpt2" {
        return Err(TokenizerError::UnsupportedModel {
            model: model.to_owned(),
        });
    }
    // llama.cpp falls back to its default chain (with a warning) when `pre` is missing.
    let pre_name = string(md, PRE)?.unwrap_or("default");
    let pre = PreTokenizerKind::from_gguf_name(pre_name)?;

    let tokens = strings(md, TOKENS)?.ok_or(TokenizerError::MissingMetadata { key: TOKENS })?;
    let types = match ints(md, TOKEN_TYPE)? {
        Some(codes) if codes.len() != tokens.len() => {
            return Err(TokenizerError::BadMetadata {
                key: TOKEN_TYPE,
                expected: "one type per token",
            })
        }
        Some(codes) => codes.into_iter().map(TokenType::from_code).collect(),
        None => vec![TokenType::Normal; tokens.len()],
    };
    let merges = strings(md, MERGES)?.ok_or(TokenizerError::MissingMetadata { key: MERGES })?;

    // Later duplicates win, as in llama.cpp's `token_to_id`.
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(id, t)| ((*t).to_owned(), id as u32))
        .collect();
    let merges = merge_pairs(&merges, &vocab);
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(pre.ignore_merges(pre_name))
        .build()
        .map_err(TokenizerError::Build)?;

    let mut hf = HfTokenizer::new(bpe);
    hf.with_pre_tokenizer(Some(pre.build()?));
    hf.with_decoder(Some(ByteLevel::default()));
    let added = |want: &dyn Fn(TokenType) -> bool, special: bool| {
        tokens
            .iter()
            .zip(&types)
            .filter(|(t, ty)| want(**ty) && !t.is_empty())
            .map(|(t, _)| AddedToken::from(*t, special))
            .collect::<Vec<_>>()
    };
    hf.add_special_tokens(added(
        &|ty| matches!(ty, TokenType::Control | TokenType::Unknown),
        true,
    ))
    .map_err(TokenizerError::Build)?;
    hf.add_tokens(added(&|ty| ty == TokenType::UserDefined, false))
        .map_err(TokenizerError::Build)?;

    let pieces = TokenPieces::new(tokens.iter().zip(&types).map(|(t, ty)| ty.piece(t)), 0);
    let n = tokens.len();
    let extra_stop = [id(md, EOT, n)?, id(md, EOM, n)?].into_iter().flatten();
    Ok(Parts {
        hf,
        pieces,
        bos: id(md, BOS, n)?,
        eos: id(md, EOS, n)?,
        pad: id(md, PAD, n)?,
        extra_stop: extra_stop.collect(),
        chat_template: string(md, CHAT_TEMPLATE)?.map(str::to_owned),
        add_bos: flag(md, ADD_BOS)?.unwrap_or(matches!(
            pre_name,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3"
        )),
        gguf_pre: Some(pre_name.to_owned()),
    })
}

/// A tokenizer as the metadata [`parts`] reads back: the vocabulary in id order, each
/// token's type (control for special tokens, user-defined for the other added ones, normal
/// for the rest), the merges in rank order, the special ids, `add_bos`, the chat template
/// and the pre-tokenizer's name.
pub(super) fn metadata(tok: GgufParts<'_>) -> Result<Vec<(String, Value)>, TokenizerError> {
    let hf = tok.hf;
    let n = tok.pieces.len();
    let added = hf.get_added_tokens_decoder();
    let mut tokens = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    for id in 0..n as u32 {
        let (text, code) = match hf.id_to_token(id) {
            // A hole in the ids: a placeholder llama.cpp decodes to nothing.
            None => (format!("[PAD{id}]"), 5),
            Some(text) if tok.pieces.is_special(id) => (text, 3),
            Some(text) if added.get(&id).is_some_and(|t| !t.special) => (text, 4),
            Some(text) => (text, 1),
        };
        tokens.push(Value::String(text));
        types.push(Value::I32(code));
    }
    let bad = |expected| TokenizerError::BadMetadata {
        key: MERGES,
        expected,
    };
    let model = serde_json::to_value(hf.get_model()).map_err(|_| bad("serialisable"))?;
    let merges = model
        .get("merges")
        .and_then(|m| m.as_array())
        .ok_or(bad("present in the BPE model"))?
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Array(pair) => match pair.as_slice() {
                [l, r] => Some(format!("{} {}", l.as_str()?, r.as_str()?)),
                _ => None,
            },
            _ => None,
        })
        .map(|m| m.map(Value::String))
        .collect::<Option<Vec<_>>>()
        .ok_or(bad("pairs of tokens"))?;
    let mut md = vec![
        (MODEL.to_owned(), Value::String("gpt2".into())),
        (PRE.to_owned(), Value::String(tok.pre.into())),
        (TOKENS.to_owned(), Value::Array(tokens)),
        (TOKEN_TYPE.to_owned(), Value::Array(types)),
        (MERGES.to_owned(), Value::Array(merges)),
        (ADD_BOS.to_owned(), Value::Bool(tok.add_bos)),
    ];
    let ids = [(BOS, tok.bos), (EOS, tok.eos), (PAD, tok.pad)]
        .into_iter()
        .chain(
            [EOT, EOM]
                .into_iter()
                .zip(tok.extra_stop.iter().map(|&i| Some(i))),
        );
    for (key, id) in ids {
        if let Some(id) = id {
            md.push((key.to_owned(), Value::U32(id)));
        }
    }
    if let Some(t) = tok.chat_template {
        md.push((CHAT_TEMPLATE.to_owned(), Value::String(t.to_owned())));
    }
    Ok(md)
}

/// GGUF merges are "left right"; llama.cpp splits at the first space after the first
/// byte. Merges that name a token outside the vocabulary can never apply and are dropped
/// (the `tokenizers` builder would reject them).
fn merge_pairs(merges: &[&str], vocab: &Vocab) -> Vec<(String, String)> {
    merges
        .iter()
        .filter_map(|m| {
            let at = 1 + m.bytes().skip(1).position(|b| b == b' ')?;
            let (left, right) = (&m[..at], &m[at + 1..]);
            let known = vocab.contains_key(left)
                && vocab.contains_key(right)
                && vocab.contains_key(&format!("{left}{right}"));
            known.then(|| (left.to_owned(), right.to_owned()))
        })
        .collect()
}

fn string<'a>(
    md: &'a HashMap<String, Value>,
    key: &'static str,
) -> Result<Option<&'a str>, TokenizerError> {
    md.get(key)
        .map(|v| match v {
            Value::String(s) => Ok(s.as_str()),
            _ => Err(TokenizerError::BadMetadata {
                key,
                expected: "a string",
            }),
        })
        .transpose()
}

fn flag(md: &HashMap<String, Value>, key: &'static str) -> Result<Option<bool>, TokenizerError> {
    md.get(key)
        .map(|v| match v {
            Value::Bool(b) => Ok(*b),
            _ => Err(TokenizerError::BadMetadata {
                key,
                expected: "a bool",
            }),
        })
        .transpose()
}

fn strings<'a>(
    md: &'a HashMap<String, Value>,
    key: &'static str,
) -> Result<Option<Vec<&'a str>>, TokenizerError> {
    let bad = TokenizerError::BadMetadata {
        key,
        expected: "an array of strings",
    };
    let Some(value) = md.get(key) else {
        return Ok(None);
    };
    let Value::Array(items) = value else {
        return Err(bad);
    };
    items
        .iter()
        .map(|v| match v {
            Value::String(s) => Some(s.as_str()),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .map(Some)
        .ok_or(bad)
}

fn ints(
    md: &HashMap<String, Value>,
    key: &'static str,
) -> Result<Option<Vec<i64>>, TokenizerError> {
    let bad = TokenizerError::BadMetadata {
        key,
        expected: "an array of integers",
    };
    let Some(value) = md.get(key) else {
        return Ok(None);
    };
    let Value::Array(items) = value else {
        return Err(bad);
    };
    items
        .iter()
        .map(integer)
        .collect::<Option<Vec<_>>>()
        .map(Some)
        .ok_or(bad)
}

fn integer(v: &Value) -> Option<i64> {
    Some(match *v {
        Value::U8(x) => x.into(),
        Value::I8(x) => x.into(),
        Value::U16(x) => x.into(),
        Value::I16(x) => x.into(),
        Value::U32(x) => x.into(),
        Value::I32(x) => x.into(),
        Value::U64(x) => i64::try_from(x).ok()?,
        Value::I64(x) => x,
        _ => return None,
    })
}

/// A token id key. Like llama.cpp, an id outside the vocabulary counts as absent.
fn id(
    md: &HashMap<String, Value>,
    key: &'static str,
    vocab: usize,
) -> Result<Option<u32>, TokenizerError> {
    let Some(value) = md.get(key) else {
        return Ok(None);
    };
    let id = integer(value).ok_or(TokenizerError::BadMetadata {
        key,
        expected: "an integer",
    })?;
    Ok(u32::try_from(id).ok().filter(|&id| (id as usize) < vocab))
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::gguf_file::VersionedMagic;

    use super::super::pieces::char_of_byte;
    use super::super::special::{Special, SpecialText};
    use super::super::Tokenizer;
    use super::*;

    /// A tiny byte-level vocabulary: every byte char, a few merges, two control tokens.
    fn tiny(pre: &str) -> Content {
        let mut tokens: Vec<String> = vec!["<|endoftext|>".into(), "<|im_end|>".into()];
        let mut types = vec![3i32, 3];
        for c in (0u8..=255).map(char_of_byte) {
            tokens.push(c.to_string());
            types.push(1);
        }
        let merges = ["h e", "he l", "hel l", "hell o", "Ġ w", "1 2"];
        for m in merges {
            tokens.push(m.replace(' ', ""));
            types.push(1);
        }
        tokens.push("<tool>".into());
        types.push(4);
        let arr = |v: Vec<Value>| Value::Array(v);
        let metadata = HashMap::from([
            (MODEL.to_owned(), Value::String("gpt2".into())),
            (PRE.to_owned(), Value::String(pre.into())),
            (
                TOKENS.to_owned(),
                arr(tokens.into_iter().map(Value::String).collect()),
            ),
            (
                TOKEN_TYPE.to_owned(),
                arr(types.into_iter().map(Value::I32).collect()),
            ),
            (
                MERGES.to_owned(),
                arr(merges.iter().map(|m| Value::String((*m).into())).collect()),
            ),
            (EOS.to_owned(), Value::U32(1)),
            (PAD.to_owned(), Value::U32(1_000_000)),
            (CHAT_TEMPLATE.to_owned(), Value::String("{{ x }}".into())),
        ]);
        Content {
            magic: VersionedMagic::GgufV3,
            metadata,
            tensor_infos: HashMap::new(),
            tensor_data_offset: 0,
        }
    }

    fn set(content: &mut Content, key: &str, value: Value) {
        content.metadata.insert(key.to_owned(), value);
    }

    #[test]
    fn builds_a_working_tokenizer_from_metadata() {
        let tok = Tokenizer::from_gguf(&tiny("smollm")).unwrap();
        let ids = tok.encode("hello world", Special::AsText).unwrap();
        assert_eq!(
            ids.iter()
                .map(|&i| tok.id_to_token(i).unwrap())
                .collect::<Vec<_>>(),
            ["hello", "Ġw", "o", "r", "l", "d"]
        );
        assert_eq!(tok.decode(&ids, SpecialText::Keep).unwrap(), "hello world");
        assert_eq!(tok.eos_id(), Some(1));
        assert_eq!(tok.bos_id(), None);
        assert_eq!(tok.chat_template(), Some("{{ x }}"));
    }

    #[test]
    fn pre_tokenizer_follows_the_pre_key() {
        // smollm isolates digits, so the "12" merge cannot apply; gpt2 keeps the run.
        let tok = Tokenizer::from_gguf(&tiny("smollm")).unwrap();
        assert_eq!(tok.encode("12", Special::AsText).unwrap().len(), 2);
        let tok = Tokenizer::from_gguf(&tiny("gpt-2")).unwrap();
        assert_eq!(tok.encode("12", Special::AsText).unwrap().len(), 1);
    }

    #[test]
    fn control_tokens_parse_only_when_allowed_user_defined_always() {
        let tok = Tokenizer::from_gguf(&tiny("gpt2")).unwrap();
        assert_eq!(tok.encode("<|im_end|>", Special::Parse).unwrap(), [1]);
        assert!(tok.encode("<|im_end|>", Special::AsText).unwrap().len() > 1);
        let tool = tok.token_to_id("<tool>").unwrap();
        assert_eq!(tok.encode("<tool>", Special::AsText).unwrap(), [tool]);
        assert_eq!(tok.decode(&[1, tool], SpecialText::Skip).unwrap(), "<tool>");
        assert_eq!(
            tok.decode(&[1, tool], SpecialText::Keep).unwrap(),
            "<|im_end|><tool>"
        );
    }

    #[test]
    fn stop_ids_are_eos_and_end_of_turn_controls() {
        let tok = Tokenizer::from_gguf(&tiny("gpt2")).unwrap();
        assert_eq!(tok.stop_ids(), [0, 1]);
        assert!(tok.is_stop(0) && !tok.is_stop(2));
    }

    #[test]
    fn out_of_range_ids_count_as_absent() {
        let tok = Tokenizer::from_gguf(&tiny("gpt2")).unwrap();
        assert_eq!(tok.pad_id(), None);
    }

    #[test]
    fn unsupported_model_and_pre_are_typed_errors() {
        let mut c = tiny("gpt2");
        set(&mut c, MODEL, Value::String("llama".into()));
        assert!(matches!(
            Tokenizer::from_gguf(&c),
            Err(TokenizerError::UnsupportedModel { model }) if model == "llama"
        ));
        let c = tiny("no-such-pre");
        assert!(matches!(
            Tokenizer::from_gguf(&c),
            Err(TokenizerError::UnknownPreTokenizer { pre }) if pre == "no-such-pre"
        ));
    }

    #[test]
    fn malformed_metadata_is_a_typed_error() {
        let mut c = tiny("gpt2");
        c.metadata.remove(TOKENS);
        assert!(matches!(
            Tokenizer::from_gguf(&c),
            Err(TokenizerError::MissingMetadata { key: TOKENS })
        ));
        let mut c = tiny("gpt2");
        set(&mut c, TOKEN_TYPE, Value::Array(vec![Value::I32(1)]));
        assert!(matches!(
            Tokenizer::from_gguf(&c),
            Err(TokenizerError::BadMetadata {
                key: TOKEN_TYPE,
                ..
            })
        ));
        let mut c = tiny("gpt2");
        set(&mut c, EOS, Value::String("2".into()));
        assert!(matches!(
            Tokenizer::from_gguf(&c),
            Err(TokenizerError::BadMetadata { key: EOS, .. })
        ));
    }

    #[test]
    fn metadata_written_reads_back_to_the_same_tokenizer() {
        let tok = Tokenizer::from_gguf(&tiny("smollm")).unwrap();
        let mut c = tiny("gpt2");
        c.metadata = tok.to_gguf_metadata().unwrap().into_iter().collect();
        let back = Tokenizer::from_gguf(&c).unwrap();
        for text in ["hello world 12", "<|im_end|><tool>x"] {
            for special in [Special::AsText, Special::Parse] {
                assert_eq!(
                    back.encode(text, special).unwrap(),
                    tok.encode(text, special).unwrap()
                );
            }
        }
        assert_eq!(back.vocab_size(), tok.vocab_size());
        assert_eq!(back.stop_ids(), tok.stop_ids());
        assert_eq!(back.special_tokens(), tok.special_tokens());
        assert_eq!(back.chat_template(), tok.chat_template());
        assert_eq!(back.add_bos_token(), tok.add_bos_token());
    }

    #[test]
    fn merges_split_at_the_first_space_after_the_first_byte() {
        let vocab: Vocab = [" ", "a", " a", "b", "ab"]
            .iter()
            .enumerate()
            .map(|(i, t)| ((*t).to_owned(), i as u32))
            .collect();
        assert_eq!(
            merge_pairs(&["  a", "a b", "x y", "ab"], &vocab),
            [
                (" ".to_owned(), "a".to_owned()),
                ("a".to_owned(), "b".to_owned())
            ]
        );
    }
}
