//! The bytes each token id stands for.
//!
//! Decoding is defined over this table: the pieces of the ids, concatenated, read as UTF-8
//! with invalid sequences replaced (as [`String::from_utf8_lossy`] does). The same table
//! drives [`StreamDecoder`](super::StreamDecoder), so streamed text always equals the text
//! decoded at once.

use super::special::SpecialText;
use std::collections::HashMap;
use std::sync::OnceLock;

use super::TokenizerError;

/// Byte-level BPE spells each byte as one printable char (GPT-2's `bytes_to_unicode`):
/// printable Latin-1 bytes stand for themselves, the rest map to U+0100 and up in order.
pub(crate) fn char_of_byte(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(0x100 + rank).expect("U+0100..U+0143 are chars")
}

fn byte_of_char() -> &'static HashMap<char, u8> {
    static MAP: OnceLock<HashMap<char, u8>> = OnceLock::new();
    MAP.get_or_init(|| (0..=255u8).map(|b| (char_of_byte(b), b)).collect())
}

/// The bytes a byte-level token spells. A token with a char outside the byte alphabet (an
/// added token such as `<tool_call>` with a raw space, say) stands for its own UTF-8, as
/// the `tokenizers` ByteLevel decoder does.
pub(crate) fn byte_level_bytes(token: &str) -> Vec<u8> {
    let map = byte_of_char();
    token
        .chars()
        .map(|c| map.get(&c).copied())
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| token.as_bytes().to_vec())
}

/// One token's entry in the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Piece {
    pub bytes: Vec<u8>,
    /// Left out when decoding with [`SpecialText::Skip`].
    pub special: bool,
}

/// Bytes and special flags for every id, in one allocation.
#[derive(Debug)]
pub(crate) struct TokenPieces {
    bytes: Vec<u8>,
    /// `ends[id]` is where the piece of `id` ends in `bytes`; it starts at `ends[id - 1]`.
    ends: Vec<usize>,
    special: Vec<bool>,
    /// SentencePiece-style vocabularies spell a word's leading space into its first token;
    /// the decoder drops up to this many spaces from the very start of the text.
    strip_leading_spaces: usize,
}

impl TokenPieces {
    pub fn new(pieces: impl IntoIterator<Item = Piece>, strip_leading_spaces: usize) -> Self {
        let mut table = TokenPieces {
            bytes: Vec::new(),
            ends: Vec::new(),
            special: Vec::new(),
            strip_leading_spaces,
        };
        for piece in pieces {
            table.bytes.extend_from_slice(&piece.bytes);
            table.ends.push(table.bytes.len());
            table.special.push(piece.special);
        }
        table
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// The bytes of `id`, or `None` when `id` is outside the vocabulary.
    pub fn get(&self, id: u32) -> Option<&[u8]> {
        let id = usize::try_from(id).ok()?;
        let end = *self.ends.get(id)?;
        let start = if id == 0 { 0 } else { self.ends[id - 1] };
        Some(&self.bytes[start..end])
    }

    pub fn is_special(&self, id: u32) -> bool {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.special.get(i).copied())
            .unwrap_or(false)
    }

    pub fn strip_leading_spaces(&self) -> usize {
        self.strip_leading_spaces
    }

    /// The text of `ids`: their pieces concatenated (special ones left out with
    /// [`SpecialText::Skip`]), leading spaces stripped, read as lossy UTF-8.
    pub fn decode(&self, ids: &[u32], special: SpecialText) -> Result<String, TokenizerError> {
        let mut bytes = Vec::new();
        let mut strip = self.strip_leading_spaces;
        for &id in ids {
            let piece = self.get(id).ok_or(TokenizerError::UnknownId {
                id,
                vocab: self.len(),
            })?;
            if special == SpecialText::Skip && self.is_special(id) {
                continue;
            }
            let skip = strip_start(piece, &mut strip);
            bytes.extend_from_slice(&piece[skip..]);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// Drops up to `*budget` leading spaces of `bytes`, spending the budget on the first
/// non-empty input: after that nothing more is stripped.
pub(crate) fn strip_start(bytes: &[u8], budget: &mut usize) -> usize {
    if *budget == 0 || bytes.is_empty() {
        return 0;
    }
    let n = bytes
        .iter()
        .take(*budget)
        .take_while(|&&b| b == b' ')
        .count();
    *budget = 0;
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_covers_every_byte_once() {
        let map = byte_of_char();
        assert_eq!(map.len(), 256);
        let mut bytes: Vec<u8> = map.values().copied().collect();
        bytes.sort_unstable();
        bytes.dedup();
        assert_eq!(bytes.len(), 256);
        assert_eq!(map[&'Ġ'], b' ');
        assert_eq!(map[&'Ċ'], b'\n');
        assert_eq!(map[&'A'], b'A');
    }

    #[test]
    fn byte_level_tokens_map_to_their_bytes() {
        assert_eq!(byte_level_bytes("Ġhello"), b" hello");
        // "é" is C3 A9, spelled as the chars for 0xC3 and 0xA9.
        assert_eq!(byte_level_bytes("Ã©"), "é".as_bytes());
        // A raw space is outside the alphabet: the token is its own text.
        assert_eq!(byte_level_bytes("<a b>"), b"<a b>");
    }

    #[test]
    fn table_lookups() {
        let table = TokenPieces::new(
            [
                Piece {
                    bytes: b"ab".to_vec(),
                    special: false,
                },
                Piece {
                    bytes: Vec::new(),
                    special: false,
                },
                Piece {
                    bytes: b"<s>".to_vec(),
                    special: true,
                },
            ],
            0,
        );
        assert_eq!(table.len(), 3);
        assert_eq!(table.get(0), Some(&b"ab"[..]));
        assert_eq!(table.get(1), Some(&b""[..]));
        assert_eq!(table.get(2), Some(&b"<s>"[..]));
        assert_eq!(table.get(3), None);
        assert!(table.is_special(2) && !table.is_special(0) && !table.is_special(9));
    }

    #[test]
    fn strip_spends_budget_on_first_non_empty_input() {
        let mut budget = 1;
        assert_eq!(strip_start(b"", &mut budget), 0);
        assert_eq!(budget, 1);
        assert_eq!(strip_start(b"  x", &mut budget), 1);
        assert_eq!(strip_start(b" y", &mut budget), 0);
        let mut budget = 1;
        assert_eq!(strip_start(b"x", &mut budget), 0);
        assert_eq!(strip_start(b" y", &mut budget), 0);
    }
}
