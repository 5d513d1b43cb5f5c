//! The pre-tokenizers GGUF files name in `tokenizer.ggml.pre`, transcribed from llama.cpp
//! (`llm_tokenizer_bpe` in `src/llama-vocab.cpp`): each is a chain of regex splits, every
//! match kept as its own word, followed by the byte-level mapping.

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

use super::TokenizerError;

/// GPT-2's word regex (what `ByteLevel { use_regex: true }` applies).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Qwen2's regex, with llama.cpp's spelled-out case-insensitive contractions.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Llama 3's regex: Qwen2's with numbers in runs of up to three digits.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A pre-tokenizer family of llama.cpp's BPE vocabularies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PreTokenizerKind {
    /// GPT-2's regex alone (`gpt-2`, `mpt`, `olmo`, `jais`, ...).
    Gpt2,
    /// Every digit its own word, then GPT-2's regex (`smollm`, `starcoder`, `refact`, ...).
    DigitsThenGpt2,
    /// Qwen2's regex (`qwen2`, `stablelm2`, `megrez`, `deepseek-r1-qwen`).
    Qwen2,
    /// Llama 3's regex (`llama3`, `llama-bpe`, `dbrx`, `smaug-bpe`, ...).
    Llama3,
    /// Falcon's punctuation, GPT-2 and three-digit splits (`falcon`).
    Falcon,
    /// llama.cpp's fallback chain (`default`, or no `tokenizer.ggml.pre`).
    Default,
}

impl PreTokenizerKind {
    /// The family llama.cpp uses for the `tokenizer.ggml.pre` value `name`.
    pub fn from_gguf_name(name: &str) -> Result<Self, TokenizerError> {
        use PreTokenizerKind::*;
        Ok(match name {
            "default" => Default,
            "gpt2" | "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "roberta-bpe" | "trillion" => {
                Gpt2
            }
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" => DigitsThenGpt2,
            "qwen2" | "stablelm2" | "megrez" | "deepseek-r1-qwen" => Qwen2,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "dbrx" | "smaug-bpe" => Llama3,
            "falcon" => Falcon,
            other => {
                return Err(TokenizerError::UnknownPreTokenizer {
                    pre: other.to_owned(),
                })
            }
        })
    }

    /// The regexes applied in turn before the byte-level step, each match its own word.
    fn regexes(self) -> &'static [&'static str] {
        match self {
            PreTokenizerKind::Gpt2 => &[],
            PreTokenizerKind::DigitsThenGpt2 => &[r"\p{N}"],
            PreTokenizerKind::Qwen2 => &[QWEN2],
            PreTokenizerKind::Llama3 => &[LLAMA3],
            PreTokenizerKind::Falcon => &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
            PreTokenizerKind::Default => {
                &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"]
            }
        }
    }

    /// Whether the byte-level step also splits with GPT-2's regex (after `regexes`).
    fn byte_level_regex(self) -> bool {
        matches!(
            self,
            PreTokenizerKind::Gpt2 | PreTokenizerKind::DigitsThenGpt2
        )
    }

    /// Llama 3 vocabularies take a word that is itself a token whole, without merging.
    pub fn ignore_merges(self, name: &str) -> bool {
        self == PreTokenizerKind::Llama3 && !matches!(name, "dbrx" | "smaug-bpe")
    }

    pub fn build(self) -> Result<PreTokenizerWrapper, TokenizerError> {
        let mut steps = self
            .regexes()
            .iter()
            .map(|re| {
                Split::new(
                    SplitPattern::Regex((*re).to_owned()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map(PreTokenizerWrapper::from)
                .map_err(TokenizerError::Build)
            })
            .collect::<Result<Vec<_>, _>>()?;
        steps.push(ByteLevel::new(false, false, self.byte_level_regex()).into());
        Ok(match steps.len() {
            1 => steps.pop().expect("one step"),
            _ => Sequence::new(steps).into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    use super::*;

    fn words(kind: PreTokenizerKind, text: &str) -> Vec<String> {
        let pre = kind.build().unwrap();
        let mut s = PreTokenizedString::from(text);
        pre.pre_tokenize(&mut s).unwrap();
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(w, _, _)| w.to_owned())
            .collect()
    }

    #[test]
    fn names_select_llama_cpp_families() {
        use PreTokenizerKind::*;
        for (name, kind) in [
            ("smollm", DigitsThenGpt2),
            ("gpt-2", Gpt2),
            ("gpt2", Gpt2),
            ("default", Default),
            ("qwen2", Qwen2),
            ("llama3", Llama3),
            ("llama-bpe", Llama3),
            ("falcon", Falcon),
        ] {
            assert_eq!(
                PreTokenizerKind::from_gguf_name(name).unwrap(),
                kind,
                "{name}"
            );
        }
        assert!(Llama3.ignore_merges("llama-bpe"));
        assert!(!Llama3.ignore_merges("dbrx"));
        assert!(!Qwen2.ignore_merges("qwen2"));
    }

    #[test]
    fn unknown_name_is_a_typed_error_naming_it() {
        let err = PreTokenizerKind::from_gguf_name("tekken").unwrap_err();
        assert!(matches!(&err, TokenizerError::UnknownPreTokenizer { pre } if pre == "tekken"));
        assert!(err.to_string().contains("tekken"));
    }

    #[test]
    fn smollm_splits_every_digit() {
        // Byte-level words: 'Ġ' is the space.
        assert_eq!(
            words(PreTokenizerKind::DigitsThenGpt2, "ab 123"),
            ["ab", "Ġ", "1", "2", "3"]
        );
        assert_eq!(words(PreTokenizerKind::Gpt2, "ab 123"), ["ab", "Ġ123"]);
    }

    #[test]
    fn llama3_groups_digits_by_three_and_qwen2_singly() {
        assert_eq!(words(PreTokenizerKind::Llama3, "12345"), ["123", "45"]);
        assert_eq!(
            words(PreTokenizerKind::Qwen2, "12345"),
            ["1", "2", "3", "4", "5"]
        );
    }

    #[test]
    fn qwen2_keeps_newlines_apart_and_contractions_case_insensitive() {
        assert_eq!(
            words(PreTokenizerKind::Qwen2, "I'M ok\n\nhi"),
            ["I", "'M", "Ġok", "ĊĊ", "hi"]
        );
        // GPT-2's contractions are lower-case only.
        assert_eq!(words(PreTokenizerKind::Gpt2, "I'M"), ["I", "'", "M"]);
        assert_eq!(words(PreTokenizerKind::Gpt2, "I'm"), ["I", "'m"]);
    }
}
