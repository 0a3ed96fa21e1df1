//! Decoding edge cases not covered by the golden fixtures.

use crate::tokenizer::special::{BEGIN_OF_TEXT, EOT_ID, VOCAB_SIZE};

use super::tokenizer;

#[test]
fn unknown_id_is_an_error_naming_it() {
    let ids = [9906, 200_000];
    let error = tokenizer().decode(&ids).unwrap_err();
    assert_eq!(error.to_string(), "unknown token id 200000 (vocabulary size is 128256)");
    assert!(tokenizer().decode_bytes(&[VOCAB_SIZE as u32]).is_err());
    assert!(tokenizer().decode(&[VOCAB_SIZE as u32 - 1]).is_ok());
}

#[test]
fn special_tokens_decode_to_their_names() {
    let ids = [BEGIN_OF_TEXT, 9906, EOT_ID];
    assert_eq!(tokenizer().decode(&ids).unwrap(), "<|begin_of_text|>Hello<|eot_id|>");
}

#[test]
fn decode_bytes_keeps_partial_characters() {
    // "😀" is F0 9F 98 80; its tokens split it somewhere.
    let ids = tokenizer().encode("😀").unwrap();
    assert_eq!(tokenizer().decode_bytes(&ids).unwrap(), "😀".as_bytes());
    let first = tokenizer().decode_bytes(&ids[..1]).unwrap();
    assert!("😀".as_bytes().starts_with(&first));
}

#[test]
fn empty_in_empty_out() {
    assert_eq!(tokenizer().encode("").unwrap(), Vec::<u32>::new());
    assert_eq!(tokenizer().decode(&[]).unwrap(), "");
}
