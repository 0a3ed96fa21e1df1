//! The streaming decoder against whole-sequence decoding.

use crate::tokenizer::StreamDecoder;
use crate::tokenizer::special::VOCAB_SIZE;
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

use super::tokenizer;

/// Decodes `ids` one at a time, returning each push's output and finish's.
fn stream(ids: &[u32]) -> (Vec<String>, String) {
    let mut decoder = StreamDecoder::new(tokenizer());
    let pieces = ids.iter().map(|&id| decoder.push(id).unwrap()).collect();
    (pieces, decoder.finish())
}

/// The ordinary token that stands for the single byte `b`.
fn byte_token(b: u8) -> u32 {
    tokenizer().token_id(&[b]).unwrap()
}

const MULTI_BYTE_TEXTS: [&str; 6] = [
    "😀😃😄 emoji 👨‍👩‍👧‍👦 and 🏳️‍🌈 and 🇺🇸🇯🇵",
    "我喜欢吃苹果和香蕉。日本語のテキストです。",
    "한국어 문장입니다. 안녕하세요!",
    "नमस्ते दुनिया สวัสดีชาวโลก",
    "café cafe\u{301} Ångström 👍🏽🧑🏿‍💻",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𓀀𓀁 🦀",
];

#[test]
fn streaming_valid_text_never_shows_replacement_characters() {
    for text in MULTI_BYTE_TEXTS {
        let ids = tokenizer().encode(text).unwrap();
        let (pieces, rest) = stream(&ids);
        for piece in &pieces {
            assert!(!piece.contains('\u{fffd}'), "{piece:?} while streaming {text:?}");
        }
        assert_eq!(pieces.concat() + &rest, text);
        assert_eq!(rest, "");
    }
}

/// Makes sure the test above is not trivially true: some of these texts do
/// have characters split across tokens, which a naive per-token decode
/// would turn into U+FFFD.
#[test]
fn some_tokens_hold_partial_characters() {
    let ids = tokenizer().encode(MULTI_BYTE_TEXTS[5]).unwrap();
    let naive: Vec<String> = ids.iter().map(|&id| tokenizer().decode(&[id]).unwrap()).collect();
    assert!(naive.iter().any(|piece| piece.contains('\u{fffd}')));
    let (pieces, _) = stream(&ids);
    assert!(pieces.iter().any(String::is_empty), "nothing was held back");
}

#[test]
fn a_dangling_partial_character_is_flushed_as_one_replacement() {
    // The first three of the four bytes of "😀", as one token each.
    let partial: Vec<u32> = "😀".as_bytes()[..3].iter().map(|&b| byte_token(b)).collect();
    let (pieces, rest) = stream(&partial);
    assert_eq!(pieces, ["", "", ""]);
    assert_eq!(rest, "\u{fffd}");
}

#[test]
fn unknown_ids_are_errors() {
    let mut decoder = StreamDecoder::new(tokenizer());
    let error = decoder.push(VOCAB_SIZE as u32).unwrap_err();
    assert_eq!(error.to_string(), "unknown token id 128256 (vocabulary size is 128256)");
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 300,
        rng_seed: RngSeed::Fixed(7),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// For any ids at all, valid UTF-8 or not, specials included, streaming
    /// adds up to the same text as decoding in one go.
    #[test]
    fn streaming_adds_up_to_decode(ids in prop::collection::vec(0..VOCAB_SIZE as u32, 0..40)) {
        let (pieces, rest) = stream(&ids);
        prop_assert_eq!(pieces.concat() + &rest, tokenizer().decode(&ids).unwrap());
    }

    /// Same, over ids for single bytes, where invalid and partial UTF-8 is
    /// the rule rather than the exception.
    #[test]
    fn streaming_single_bytes_adds_up_to_decode(bytes in prop::collection::vec(any::<u8>(), 0..40)) {
        let ids: Vec<u32> = bytes.iter().map(|&b| byte_token(b)).collect();
        let (pieces, rest) = stream(&ids);
        prop_assert_eq!(pieces.concat() + &rest, String::from_utf8_lossy(&bytes));
    }
}
