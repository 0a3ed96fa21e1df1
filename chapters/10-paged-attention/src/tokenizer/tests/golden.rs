//! Our ids against ids from Meta's reference code, produced by
//! `shared/fixtures/tokenizer/make_tokenizer_golden.py`.

use crate::tokenizer::chat::{Message, Role};
use serde::Deserialize;

use super::tokenizer;

#[derive(Deserialize)]
struct TextCase {
    text: String,
    ids: Vec<u32>,
}

/// A text too long to store: each piece repeated `repeat` times, concatenated.
#[derive(Deserialize)]
struct LongCase {
    description: String,
    parts: Vec<(String, usize)>,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct ChatCase {
    messages: Vec<FixtureMessage>,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct FixtureMessage {
    role: String,
    content: String,
}

#[derive(Deserialize)]
struct DecodeCase {
    ids: Vec<u32>,
    text: String,
}

fn load_fixture<T: for<'de> Deserialize<'de>>(name: &str) -> Vec<T> {
    let path = super::fixture_path(name);
    let json = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&json).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Checks every case, then fails on the first mismatch with both id lists,
/// saying how many cases failed in all.
fn assert_all_match(mismatches: Vec<String>, total: usize) {
    if let Some(first) = mismatches.first() {
        panic!("{} of {total} cases differ from Meta's ids; the first:\n{first}", mismatches.len());
    }
}

fn describe_mismatch(case: &str, expected: &[u32], actual: &[u32]) -> String {
    let first_difference =
        expected.iter().zip(actual).position(|(e, a)| e != a).unwrap_or(expected.len().min(actual.len()));
    let window = first_difference.saturating_sub(5)..first_difference + 20;
    let around = |ids: &[u32]| ids[window.start.min(ids.len())..window.end.min(ids.len())].to_vec();
    format!(
        "case: {case}\nfirst difference at id index {first_difference} \
         (lengths: Meta {}, ours {})\nMeta ids[{window:?}]: {:?}\nour  ids[{window:?}]: {:?}",
        expected.len(),
        actual.len(),
        around(expected),
        around(actual),
    )
}

#[test]
fn encoding_matches_meta() {
    let cases: Vec<TextCase> = load_fixture("tokenizer_golden.json");
    assert!(cases.len() > 150, "too few golden cases: {}", cases.len());
    let mut mismatches = Vec::new();
    for case in &cases {
        let ids = tokenizer().encode(&case.text).unwrap();
        if ids != case.ids {
            mismatches.push(describe_mismatch(&format!("text {:?}", case.text), &case.ids, &ids));
        }
    }
    assert_all_match(mismatches, cases.len());
}

#[test]
fn encoding_long_inputs_matches_meta() {
    let cases: Vec<LongCase> = load_fixture("tokenizer_golden_long.json");
    let mut mismatches = Vec::new();
    for case in &cases {
        let text: String = case.parts.iter().map(|(piece, repeat)| piece.repeat(*repeat)).collect();
        let ids = tokenizer().encode(&text).unwrap();
        if ids != case.ids {
            mismatches.push(describe_mismatch(&case.description, &case.ids, &ids));
        }
    }
    assert_all_match(mismatches, cases.len());
}

fn role_from_fixture(name: &str) -> Role {
    match name {
        "system" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        other => panic!("unknown role {other:?} in chat fixture"),
    }
}

#[test]
fn chat_format_matches_meta() {
    let cases: Vec<ChatCase> = load_fixture("chat_golden.json");
    let mut mismatches = Vec::new();
    for case in &cases {
        let messages: Vec<Message> =
            case.messages.iter().map(|m| Message::new(role_from_fixture(&m.role), m.content.as_str())).collect();
        let ids = tokenizer().encode_chat(&messages).unwrap();
        if ids != case.ids {
            mismatches.push(describe_mismatch(&format!("{messages:?}"), &case.ids, &ids));
        }
    }
    assert_all_match(mismatches, cases.len());
}

#[test]
fn prompt_convenience_matches_the_chat_format() {
    let tokenizer = tokenizer();
    let with_system = tokenizer.encode_prompt(Some("Be brief."), "Hi").unwrap();
    let messages = [Message::new(Role::System, "Be brief."), Message::new(Role::User, "Hi")];
    assert_eq!(with_system, tokenizer.encode_chat(&messages).unwrap());

    let without_system = tokenizer.encode_prompt(None, "Hi").unwrap();
    assert_eq!(without_system, tokenizer.encode_chat(&messages[1..]).unwrap());
}

/// Includes special tokens (decoded to their names) and byte sequences that
/// are not valid UTF-8, where Python's `errors="replace"` decides how many
/// U+FFFD to emit.
#[test]
fn decoding_matches_meta() {
    let cases: Vec<DecodeCase> = load_fixture("decode_golden.json");
    for case in &cases {
        assert_eq!(tokenizer().decode(&case.ids).unwrap(), case.text, "ids {:?}", case.ids);
    }
}
