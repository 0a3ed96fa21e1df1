//! Malformed tokenizer files give clear errors, never panics.

use crate::tokenizer::Tokenizer;
use std::path::PathBuf;

use proptest::prelude::*;
use proptest::test_runner::RngSeed;

use super::tokenizer_path;

/// Writes `contents` to `{name}.model` in a fresh folder, deleted when the returned handle drops.
fn write_model(name: &str, contents: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("{name}.model"));
    std::fs::write(&path, contents).unwrap();
    (dir, path)
}

/// Loads `contents` and returns the error message, which must exist.
fn load_error(name: &str, contents: &[u8]) -> String {
    let (_dir, path) = write_model(name, contents);
    match Tokenizer::from_file(&path) {
        Ok(_) => panic!("{name}: loading succeeded"),
        Err(error) => format!("{error:#}"),
    }
}

fn assert_error_ends_with(name: &str, contents: &[u8], expected_end: &str) {
    let message = load_error(name, contents);
    assert!(message.ends_with(expected_end), "{name}: got {message:?}, expected it to end with {expected_end:?}");
}

/// The real file's lines, without their newlines.
fn real_lines() -> Vec<String> {
    let path = tokenizer_path();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("cannot read {}: {e}; set LLAMA_TOKENIZER to Meta's tokenizer.model", path.display())
    });
    text.lines().map(String::from).collect()
}

fn join_lines(lines: &[String]) -> Vec<u8> {
    (lines.join("\n") + "\n").into_bytes()
}

#[test]
fn line_without_a_space() {
    assert_error_ends_with(
        "no_space",
        b"IQ== 0\nIg==1\n",
        "no_space.model line 2: expected `<base64 token> <rank>`, found \"Ig==1\"",
    );
}

#[test]
fn bad_base64() {
    let message = load_error("bad_base64", b"IQ== 0\nIg== 1\n!!!! 2\n");
    assert!(message.contains("bad_base64.model line 3: bad base64 token \"!!!!\": "), "{message}");
}

#[test]
fn bad_rank() {
    assert_error_ends_with(
        "bad_rank",
        b"IQ== 0\nIg== one\n",
        "bad_rank.model line 2: bad rank \"one\": invalid digit found in string",
    );
}

#[test]
fn rank_out_of_order() {
    assert_error_ends_with("out_of_order", b"IQ== 0\nIg== 99\n", "out_of_order.model line 2: rank 99 expected 1");
}

#[test]
fn duplicate_rank() {
    assert_error_ends_with(
        "duplicate_rank",
        b"IQ== 0\nIg== 1\nIw== 1\n",
        "duplicate_rank.model line 3: rank 1 already used on line 2",
    );
}

#[test]
fn duplicate_token() {
    assert_error_ends_with(
        "duplicate_token",
        b"IQ== 0\nIg== 1\nIQ== 2\n",
        "duplicate_token.model line 3: same token as line 1",
    );
}

#[test]
fn empty_line() {
    assert_error_ends_with(
        "empty_line",
        b"IQ== 0\n\nIg== 2\n",
        "empty_line.model line 2: expected `<base64 token> <rank>`, found \"\"",
    );
}

#[test]
fn truncated_file() {
    let lines = real_lines();
    assert_error_ends_with(
        "truncated",
        &join_lines(&lines[..lines.len() - 1]),
        "truncated.model: 127999 tokens, expected 128000",
    );
}

#[test]
fn one_line_too_many() {
    let mut lines = real_lines();
    lines.push("AAAAAAAAAAAA 128000".to_string());
    assert_error_ends_with("too_long", &join_lines(&lines), "too_long.model: 128001 tokens, expected 128000");
}

#[test]
fn a_byte_without_its_own_token() {
    let mut lines = real_lines();
    let line_of_ff = lines.iter().position(|line| line.starts_with("/w== ")).unwrap();
    // Replace the token for byte 0xFF by a token not in the file.
    lines[line_of_ff] = format!("//////// {line_of_ff}");
    assert_error_ends_with(
        "missing_byte",
        &join_lines(&lines),
        "missing_byte.model: no token for the single byte 0xff",
    );
}

#[test]
fn missing_file() {
    let message = Tokenizer::from_file("/nonexistent/tokenizer.model").err().unwrap().to_string();
    assert!(message.starts_with("cannot read /nonexistent/tokenizer.model: "), "{message}");
}

#[test]
fn the_real_file_loads() {
    let tokenizer = super::tokenizer();
    assert_eq!(tokenizer.token_id(b"Hello"), Some(9906));
    assert_eq!(tokenizer.token_bytes(9906).unwrap(), b"Hello");
    assert_eq!(tokenizer.token_bytes(128_009).unwrap(), b"<|eot_id|>");
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        rng_seed: RngSeed::Fixed(3),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// Garbage is an error, not a panic.
    #[test]
    fn random_bytes_are_rejected(contents in prop::collection::vec(any::<u8>(), 0..200)) {
        let (_dir, path) = write_model("random_bytes", &contents);
        prop_assert!(Tokenizer::from_file(&path).is_err());
    }
}
