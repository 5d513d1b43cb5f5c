//! A tokenizer from a Hugging Face `tokenizer.json`, with the BOS/EOS tokens and chat
//! template from `tokenizer_config.json`.

use serde::Deserialize;
use serde_json::Value as Json;

use super::error::TokenizerError;
use super::parts::{HfTokenizer, Parts};
use super::pieces::{byte_level_bytes, Piece, TokenPieces};

/// The fields of `tokenizer_config.json` mtplx reads.
#[derive(Debug, Default, Deserialize)]
struct TokenizerConfig {
    #[serde(default)]
    bos_token: Option<TokenSpec>,
    #[serde(default)]
    eos_token: Option<TokenSpec>,
    #[serde(default)]
    pad_token: Option<TokenSpec>,
    #[serde(default)]
    add_bos_token: Option<bool>,
    #[serde(default)]
    chat_template: Option<TemplateSpec>,
}

/// A special token, written as its text or as an added-token object.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum TokenSpec {
    Text(String),
    Added { content: String },
}

impl TokenSpec {
    fn text(&self) -> &str {
        match self {
            TokenSpec::Text(s) | TokenSpec::Added { content: s } => s,
        }
    }
}

/// One template, or several by name (the one named "default" is the chat template).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum TemplateSpec {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Debug, Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

impl TemplateSpec {
    fn into_default(self) -> Option<String> {
        match self {
            TemplateSpec::One(t) => Some(t),
            TemplateSpec::Named(list) => {
                let at = list.iter().position(|t| t.name == "default").unwrap_or(0);
                list.into_iter().nth(at).map(|t| t.template)
            }
        }
    }
}

/// How the `tokenizer.json` decoder turns tokens into text, as far as mtplx needs to know
/// to give every token its own bytes.
#[derive(Debug, Clone, PartialEq)]
enum DecoderKind {
    /// GPT-2's byte alphabet.
    ByteLevel,
    /// SentencePiece style: `replacement` stands for a space, `<0xHH>` tokens for raw bytes
    /// when `byte_fallback`, and up to `strip` leading spaces of the text are dropped.
    Spm {
        replacement: char,
        byte_fallback: bool,
        strip: usize,
    },
    /// Anything else: each token is decoded on its own.
    PerToken,
}

impl DecoderKind {
    fn of(decoder: &Json) -> Self {
        match decoder["type"].as_str() {
            Some("ByteLevel") => DecoderKind::ByteLevel,
            Some("Metaspace") => metaspace(decoder).unwrap_or(DecoderKind::PerToken),
            Some("Sequence") => sequence(&decoder["decoders"]).unwrap_or(DecoderKind::PerToken),
            _ => DecoderKind::PerToken,
        }
    }
}

fn metaspace(d: &Json) -> Option<DecoderKind> {
    let replacement = single_char(&d["replacement"])?;
    let prepends = match d["prepend_scheme"].as_str() {
        Some(scheme) => scheme != "never",
        None => d["add_prefix_space"].as_bool().unwrap_or(true),
    };
    Some(DecoderKind::Spm {
        replacement,
        byte_fallback: false,
        strip: usize::from(prepends),
    })
}

/// `[Replace(▁ → " "), ByteFallback, Fuse, Strip(" ", n, 0)]` and its subsets.
fn sequence(decoders: &Json) -> Option<DecoderKind> {
    let steps = decoders.as_array()?;
    if let [only] = steps.as_slice() {
        return Some(DecoderKind::of(only));
    }
    let mut replacement = None;
    let mut byte_fallback = false;
    let mut strip = 0;
    for step in steps {
        match step["type"].as_str()? {
            "Replace" if step["content"] == " " => {
                replacement = Some(single_char(&step["pattern"]["String"])?)
            }
            "ByteFallback" => byte_fallback = true,
            "Fuse" => {}
            "Strip" if step["content"] == " " && step["stop"] == 0 => {
                strip = usize::try_from(step["start"].as_u64()?).ok()?
            }
            _ => return None,
        }
    }
    Some(DecoderKind::Spm {
        replacement: replacement?,
        byte_fallback,
        strip,
    })
}

fn single_char(v: &Json) -> Option<char> {
    let mut chars = v.as_str()?.chars();
    let c = chars.next()?;
    chars.next().is_none().then_some(c)
}

/// `<0xHH>`, a SentencePiece byte token.
fn byte_token(token: &str) -> Option<u8> {
    let hex = token.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok())?
}

pub(super) fn parts(tokenizer_json: &[u8], config: Option<&[u8]>) -> Result<Parts, TokenizerError> {
    let mut hf = HfTokenizer::from_bytes(tokenizer_json).map_err(TokenizerError::Build)?;
    // mtplx decides lengths itself: a truncation or padding setting must not cut prompts.
    hf.with_truncation(None).map_err(TokenizerError::Build)?;
    hf.with_padding(None);
    let config: TokenizerConfig = match config {
        Some(bytes) => serde_json::from_slice(bytes).map_err(TokenizerError::Config)?,
        None => TokenizerConfig::default(),
    };

    let kind = hf
        .get_decoder()
        .and_then(|d| serde_json::to_value(d).ok())
        .map_or(DecoderKind::PerToken, |d| DecoderKind::of(&d));
    let pieces = pieces(&hf, &kind);

    let id_of = |spec: &Option<TokenSpec>| spec.as_ref().and_then(|s| hf.token_to_id(s.text()));
    let bos = id_of(&config.bos_token);
    let probe_adds_bos = || {
        let ids = hf.encode_fast("", true).map(|e| e.get_ids().to_vec());
        bos.is_some() && ids.is_ok_and(|ids| ids.first().copied() == bos)
    };
    Ok(Parts {
        bos,
        eos: id_of(&config.eos_token),
        pad: id_of(&config.pad_token),
        extra_stop: Vec::new(),
        add_bos: config.add_bos_token.unwrap_or_else(probe_adds_bos),
        chat_template: config.chat_template.and_then(TemplateSpec::into_default),
        pieces,
        hf,
        gguf_pre: None,
    })
}

fn pieces(hf: &HfTokenizer, kind: &DecoderKind) -> TokenPieces {
    let added = hf.get_added_tokens_decoder();
    let n = hf
        .get_vocab(true)
        .values()
        .map(|&id| id as usize + 1)
        .max()
        .unwrap_or(0);
    let piece = |id: u32| -> Piece {
        let special = added.get(&id).is_some_and(|t| t.special);
        let Some(token) = hf.id_to_token(id) else {
            return Piece {
                bytes: Vec::new(),
                special,
            };
        };
        let bytes = match *kind {
            DecoderKind::ByteLevel => byte_level_bytes(&token),
            DecoderKind::Spm {
                replacement,
                byte_fallback,
                ..
            } => match byte_token(&token).filter(|_| byte_fallback) {
                Some(b) => vec![b],
                None => token.replace(replacement, " ").into_bytes(),
            },
            DecoderKind::PerToken => hf.decode(&[id], false).unwrap_or_default().into_bytes(),
        };
        Piece { bytes, special }
    };
    let strip = match *kind {
        DecoderKind::Spm { strip, .. } => strip,
        _ => 0,
    };
    TokenPieces::new((0..n as u32).map(piece), strip)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::tokenizer::special::SpecialText;

    #[test]
    fn decoder_kinds() {
        assert_eq!(
            DecoderKind::of(&json!({"type": "ByteLevel", "add_prefix_space": true})),
            DecoderKind::ByteLevel
        );
        let llama2 = json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]});
        assert_eq!(
            DecoderKind::of(&llama2),
            DecoderKind::Spm {
                replacement: '▁',
                byte_fallback: true,
                strip: 1
            }
        );
        let meta = json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never"});
        assert_eq!(
            DecoderKind::of(&meta),
            DecoderKind::Spm {
                replacement: '▁',
                byte_fallback: false,
                strip: 0
            }
        );
        assert_eq!(
            DecoderKind::of(&json!({"type": "WordPiece", "prefix": "##"})),
            DecoderKind::PerToken
        );
    }

    fn tokenizer_json(decoder: serde_json::Value, vocab: serde_json::Value) -> Vec<u8> {
        let json = json!({
            "version": "1.0",
            "truncation": {"direction": "Right", "max_length": 2, "strategy": "LongestFirst", "stride": 0},
            "padding": null,
            "added_tokens": [{"id": 1, "content": "<s>", "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null,
            "pre_tokenizer": null,
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}
            },
            "decoder": decoder,
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": true,
                      "ignore_merges": false, "vocab": vocab, "merges": []}
        });
        serde_json::to_vec(&json).unwrap()
    }

    fn spm_vocab() -> serde_json::Value {
        json!({"<unk>": 0, "<s>": 1, "▁Hello": 2, "▁world": 3, "<0x0A>": 4, "<0xE2>": 5,
               "<0x82>": 6, "<0xAC>": 7, "a": 8})
    }

    #[test]
    fn sentencepiece_pieces_decode_like_tokenizers() {
        let decoder = json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]});
        let bytes = tokenizer_json(decoder, spm_vocab());
        let parts = parts(&bytes, None).unwrap();
        let reference = HfTokenizer::from_bytes(&bytes).unwrap();
        for ids in [&[2, 3, 4][..], &[1, 2, 5, 6, 7, 3], &[3, 2], &[8, 2]] {
            for (special, skip) in [(SpecialText::Keep, false), (SpecialText::Skip, true)] {
                assert_eq!(
                    parts.pieces.decode(ids, special).unwrap(),
                    reference.decode(ids, skip).unwrap(),
                    "{ids:?} skip={skip}"
                );
            }
        }
        assert_eq!(
            parts
                .pieces
                .decode(&[2, 5, 6, 7], SpecialText::Keep)
                .unwrap(),
            "Hello€"
        );
    }

    #[test]
    fn truncation_is_off_and_bos_is_probed_from_the_post_processor() {
        let config = serde_json::to_vec(&json!({"bos_token": "<s>"})).unwrap();
        let bytes = tokenizer_json(json!(null), spm_vocab());
        let parts = parts(&bytes, Some(&config)).unwrap();
        let ids = parts.hf.encode_fast("aaaa", false).unwrap();
        assert_eq!(ids.get_ids(), [8, 8, 8, 8]);
        assert_eq!(parts.bos, Some(1));
        assert!(parts.add_bos);
        // No decoder: each token decodes on its own.
        assert_eq!(
            parts.pieces.decode(&[8, 2], SpecialText::Keep).unwrap(),
            "a▁Hello"
        );

        let config =
            serde_json::to_vec(&json!({"bos_token": "<s>", "add_bos_token": false})).unwrap();
        assert!(!super::parts(&bytes, Some(&config)).unwrap().add_bos);
    }

    #[test]
    fn byte_tokens() {
        assert_eq!(byte_token("<0x0A>"), Some(b'\n'));
        assert_eq!(byte_token("<0xE2>"), Some(0xE2));
        assert_eq!(byte_token("<0x0A0>"), None);
        assert_eq!(byte_token("<s>"), None);
    }

    #[test]
    fn config_token_and_template_shapes() {
        let c: TokenizerConfig = serde_json::from_value(json!({
            "bos_token": {"content": "<s>", "lstrip": false},
            "eos_token": "</s>",
            "pad_token": null,
            "chat_template": [
                {"name": "tool_use", "template": "T"},
                {"name": "default", "template": "D"}
            ],
            "model_max_length": 1000
        }))
        .unwrap();
        assert_eq!(c.bos_token.unwrap().text(), "<s>");
        assert_eq!(c.eos_token.unwrap().text(), "</s>");
        assert!(c.pad_token.is_none());
        assert_eq!(
            c.chat_template.unwrap().into_default().as_deref(),
            Some("D")
        );
    }
}
