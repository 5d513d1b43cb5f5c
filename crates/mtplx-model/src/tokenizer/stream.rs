//! Incremental detokenizing for streamed responses.

use super::special::SpecialText;
use std::sync::Arc;

use super::pieces::{strip_start, TokenPieces};
use super::TokenizerError;

/// Turns ids into text one at a time.
///
/// Byte-level BPE can split one multi-byte char across tokens, so a token alone is not
/// always text. The decoder holds back an unfinished UTF-8 sequence until the token that
/// completes it arrives; an invalid sequence becomes U+FFFD exactly where
/// [`String::from_utf8_lossy`] would put it. The pieces it returns, followed by
/// [`finish`](Self::finish), concatenate to [`Tokenizer::decode`](super::Tokenizer::decode)
/// of the same ids.
///
/// Made by [`Tokenizer::stream_decoder`](super::Tokenizer::stream_decoder); it shares the
/// tokenizer's piece table, so it can outlive the borrow.
#[derive(Debug, Clone)]
pub struct StreamDecoder {
    pieces: Arc<TokenPieces>,
    special: SpecialText,
    /// Bytes of an unfinished UTF-8 sequence (at most 3).
    pending: Vec<u8>,
    /// Leading spaces still to drop (SentencePiece vocabularies).
    strip: usize,
}

impl StreamDecoder {
    pub(crate) fn new(pieces: Arc<TokenPieces>, special: SpecialText) -> Self {
        let strip = pieces.strip_leading_spaces();
        StreamDecoder {
            pieces,
            special,
            pending: Vec::new(),
            strip,
        }
    }

    /// Feeds one id; returns the text it completes, or `None` when it completes none yet
    /// (it ends inside a multi-byte char, or it is a skipped special token).
    pub fn push(&mut self, id: u32) -> Result<Option<String>, TokenizerError> {
        let bytes = self.pieces.get(id).ok_or(TokenizerError::UnknownId {
            id,
            vocab: self.pieces.len(),
        })?;
        if self.special == SpecialText::Skip && self.pieces.is_special(id) {
            return Ok(None);
        }
        let skip = strip_start(bytes, &mut self.strip);
        self.pending.extend_from_slice(&bytes[skip..]);
        let text = take_complete(&mut self.pending);
        Ok((!text.is_empty()).then_some(text))
    }

    /// Ends the stream: an unfinished sequence still held becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

/// Takes the longest prefix of `buf` whose decoding cannot change when more bytes follow,
/// decoded lossily; leaves an unfinished trailing sequence in `buf`.
fn take_complete(buf: &mut Vec<u8>) -> String {
    let mut out = String::new();
    let mut rest: &[u8] = buf;
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                rest = &[];
                break;
            }
            Err(e) => {
                let (valid, after) = rest.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(valid).expect("checked by valid_up_to"));
                match e.error_len() {
                    Some(n) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        rest = &after[n..];
                    }
                    None => {
                        rest = after;
                        break;
                    }
                }
            }
        }
    }
    let keep = rest.len();
    buf.drain(..buf.len() - keep);
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::pieces::Piece;
    use super::*;

    /// A table of all 256 single bytes, a 3-byte token, and a special token.
    fn table(strip: usize) -> Arc<TokenPieces> {
        let mut pieces: Vec<Piece> = (0..=255u8)
            .map(|b| Piece {
                bytes: vec![b],
                special: false,
            })
            .collect();
        pieces.push(Piece {
            bytes: "€".as_bytes().to_vec(),
            special: false,
        });
        pieces.push(Piece {
            bytes: b"<|x|>".to_vec(),
            special: true,
        });
        Arc::new(TokenPieces::new(pieces, strip))
    }

    fn stream_all(table: &Arc<TokenPieces>, ids: &[u32], special: SpecialText) -> String {
        let mut decoder = StreamDecoder::new(table.clone(), special);
        let mut out = String::new();
        for &id in ids {
            if let Some(piece) = decoder.push(id).unwrap() {
                out.push_str(&piece);
            }
        }
        out + &decoder.finish()
    }

    #[test]
    fn holds_a_split_char_until_complete() {
        let table = table(0);
        let mut decoder = StreamDecoder::new(table, SpecialText::Keep);
        let [a, b, c] = [0xE2u32, 0x82, 0xAC]; // "€"
        assert_eq!(decoder.push(a).unwrap(), None);
        assert_eq!(decoder.push(b).unwrap(), None);
        assert_eq!(decoder.push(c).unwrap().as_deref(), Some("€"));
        assert_eq!(decoder.finish(), "");
    }

    #[test]
    fn invalid_bytes_become_replacement_chars_where_lossy_puts_them() {
        let table = table(0);
        let mut decoder = StreamDecoder::new(table, SpecialText::Keep);
        assert_eq!(decoder.push(0xE2).unwrap(), None);
        // 'A' cannot continue the sequence: one U+FFFD for E2, then 'A'.
        assert_eq!(
            decoder.push(u32::from(b'A')).unwrap().as_deref(),
            Some("\u{FFFD}A")
        );
        assert_eq!(decoder.push(0xF0).unwrap(), None);
        assert_eq!(decoder.finish(), "\u{FFFD}");
    }

    #[test]
    fn special_tokens_are_skipped_only_when_asked() {
        let table = table(0);
        let special = 257;
        assert_eq!(
            stream_all(&table, &[special, 104], SpecialText::Keep),
            "<|x|>h"
        );
        assert_eq!(stream_all(&table, &[special, 104], SpecialText::Skip), "h");
    }

    #[test]
    fn leading_space_is_stripped_once() {
        let table = table(1);
        let space = u32::from(b' ');
        assert_eq!(
            stream_all(&table, &[space, space, 104], SpecialText::Keep),
            " h"
        );
    }

    #[test]
    fn unknown_id_is_an_error() {
        let mut decoder = StreamDecoder::new(table(0), SpecialText::Keep);
        assert!(matches!(
            decoder.push(9999),
            Err(TokenizerError::UnknownId { id: 9999, .. })
        ));
    }

    proptest! {
        #[test]
        fn streamed_text_equals_decoded_text(
            ids in prop::collection::vec(0u32..258, 0..64),
            skip in any::<bool>(),
            strip in 0usize..2,
        ) {
            let table = table(strip);
            let special = if skip { SpecialText::Skip } else { SpecialText::Keep };
            prop_assert_eq!(stream_all(&table, &ids, special), table.decode(&ids, special).unwrap());
        }

        #[test]
        fn pieces_are_released_as_soon_as_they_are_complete(s in "\\PC{0,16}") {
            // Feeding a valid string byte by byte leaves nothing for finish().
            let table = table(0);
            let mut decoder = StreamDecoder::new(table, SpecialText::Keep);
            let mut out = String::new();
            for b in s.bytes() {
                if let Some(p) = decoder.push(u32::from(b)).unwrap() {
                    out.push_str(&p);
                }
            }
            prop_assert_eq!(decoder.finish(), "");
            prop_assert_eq!(out, s);
        }
    }
}
