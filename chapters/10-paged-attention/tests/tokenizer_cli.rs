//! The tokenizer subcommands (`encode`, `decode`, `chat`) and the default run without a
//! GPU, as a user would run them.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use llama_reference::synth::{SynthConfig, write_checkpoint};

/// `$LLAMA_TOKENIZER`, or else `models/tokenizer.model`, where `cargo x fetch-tokenizer` puts it.
fn tokenizer_path() -> PathBuf {
    match std::env::var_os("LLAMA_TOKENIZER") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tokenizer.model"),
    }
}

fn binary() -> Command {
    Command::new(env!(concat!("CARGO_BIN_EXE_", env!("CARGO_PKG_NAME"))))
}

/// Runs the binary with `args` after `--tokenizer <real file>`, feeding `stdin`.
fn tok(args: &[&str], stdin: &[u8]) -> Output {
    let mut command = binary();
    command.arg("--tokenizer").arg(tokenizer_path()).args(args);
    run(command, stdin)
}

fn run(mut command: Command, stdin: &[u8]) -> Output {
    let mut child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // The binary may exit before reading stdin (on a bad argument); that is not our failure.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    child.wait_with_output().unwrap()
}

fn stdout(output: &Output) -> String {
    assert!(output.status.success(), "the binary failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// Checks that the binary failed with exactly one line `error: ...` containing
/// `expected`.
fn assert_fails_with(output: &Output, expected: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "stderr: {stderr}");
    assert!(stderr.starts_with("error: ") && stderr.contains(expected), "stderr: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "stderr: {stderr}");
    assert!(output.stdout.is_empty());
}

#[test]
fn encode_prints_ids_on_one_line() {
    let output = tok(&["encode"], b"Hello, world!");
    assert_eq!(stdout(&output), "9906 11 1917 0\n");
}

#[test]
fn encode_reads_all_of_stdin_including_newlines() {
    let text = "line one\nline two\n\n  indented 中文 😀\n";
    let printed = stdout(&tok(&["encode"], text.as_bytes()));
    assert_eq!(printed.lines().count(), 1, "{printed:?}");
    assert_eq!(stdout(&tok(&["decode"], printed.as_bytes())), text);
}

#[test]
fn encode_of_nothing_is_an_empty_line() {
    assert_eq!(stdout(&tok(&["encode"], b"")), "\n");
}

#[test]
fn encode_rejects_invalid_utf8() {
    assert_fails_with(&tok(&["encode"], b"abc\xff\xfe"), "stdin is not valid UTF-8");
}

#[test]
fn decode_writes_the_text() {
    let output = tok(&["decode"], b"9906 11\n 1917\t0\n");
    assert_eq!(stdout(&output), "Hello, world!");
}

#[test]
fn encode_then_decode_gives_back_the_input() {
    let text = "Ünïcödé\r\n\ttabs, 한국어 and 👨‍👩‍👧‍👦 ";
    let ids = stdout(&tok(&["encode"], text.as_bytes()));
    assert_eq!(stdout(&tok(&["decode"], ids.as_bytes())), text);
}

#[test]
fn decode_rejects_unknown_ids() {
    assert_fails_with(&tok(&["decode"], b"9906 128256"), "unknown token id 128256");
}

#[test]
fn decode_rejects_words_that_are_not_ids() {
    assert_fails_with(&tok(&["decode"], b"9906 -3"), "\"-3\" is not a token id");
    assert_fails_with(&tok(&["decode"], b"9906 99999999999"), "\"99999999999\" is not a token id");
}

#[test]
fn chat_prints_the_prompt_ids() {
    let ids = stdout(&tok(&["chat", "--system", "Be brief.", "What is Rust?"], b""));
    let expected = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\
                    <|start_header_id|>user<|end_header_id|>\n\nWhat is Rust?<|eot_id|>\
                    <|start_header_id|>assistant<|end_header_id|>\n\n";
    assert_eq!(stdout(&tok(&["decode"], ids.as_bytes())), expected);
}

#[test]
fn chat_without_system_prompt() {
    let output = tok(&["chat", "Hi"], b"");
    // <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>
    // <|start_header_id|>assistant<|end_header_id|>\n\n
    let expected = "128000 128006 882 128007 271 13347 128009 128006 78191 128007 271\n";
    assert_eq!(stdout(&output), expected);
}

#[test]
fn chat_refuses_a_blank_prompt() {
    assert_fails_with(&tok(&["chat", " "], b""), "the prompt is empty");
}

#[test]
fn missing_tokenizer_file_is_a_clear_error() {
    let mut command = binary();
    command.args(["--tokenizer", "/nonexistent/tokenizer.model", "encode"]);
    assert_fails_with(&run(command, b"hi"), "--tokenizer names /nonexistent/tokenizer.model, which is not a file");
}

#[test]
fn a_wrong_llama_tokenizer_variable_is_named() {
    let mut command = binary();
    command.env("LLAMA_TOKENIZER", "/nonexistent/from-env.model").arg("encode");
    assert_fails_with(&run(command, b"hi"), "LLAMA_TOKENIZER names /nonexistent/from-env.model, which is not a file");
}

#[test]
fn hugging_faces_tokenizer_json_points_to_tokenizer_model() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("tokenizer.json");
    std::fs::write(&json, "{}").unwrap();
    let mut command = binary();
    command.arg("--tokenizer").arg(&json).arg("encode");
    assert_fails_with(&run(command, b"hi"), "original/tokenizer.model");
}

#[test]
fn no_tokenizer_found_is_a_clear_error() {
    let empty = tempfile::tempdir().unwrap();
    let mut command = binary();
    command.current_dir(empty.path()).env_remove("LLAMA_TOKENIZER").args(["--model", ".", "encode"]);
    // Outside a checkout, the last place looked is models/ under the current folder.
    let last = empty.path().canonicalize().unwrap().join("models/tokenizer.model");
    assert_fails_with(&run(command, b"hi"), &format!("{}); run `cargo x fetch-tokenizer`", last.display()));
}

#[test]
fn the_repository_tokenizer_is_found_from_a_chapter_folder() {
    // A folder laid out like a checkout, with the tokenizer where fetch-tokenizer puts it.
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("chapters/07-mlp")).unwrap();
    std::fs::create_dir(root.path().join("models")).unwrap();
    std::fs::copy(tokenizer_path(), root.path().join("models/tokenizer.model")).unwrap();
    let mut command = binary();
    command.current_dir(root.path().join("chapters/07-mlp")).env_remove("LLAMA_TOKENIZER").arg("encode");
    assert_eq!(stdout(&run(command, b"Hello")), "9906\n");
}

#[test]
fn arguments_a_subcommand_would_ignore_are_refused() {
    let cases: [(&[&str], &str); 6] = [
        (&["--no-gpu", "encode"], "--no-gpu before `encode` would be ignored"),
        (&["--check", "decode"], "--check before `decode` would be ignored"),
        (&["--header", "encode"], "--header before `encode` would be ignored"),
        (&["--verbose", "chat", "hi"], "--verbose before `chat` would be ignored"),
        (&["hi", "encode"], "PROMPT before `encode` would be ignored"),
        (&["--system", "Be brief.", "chat", "hi"], "write `chat --system TEXT PROMPT`"),
    ];
    for (args, expected) in cases {
        assert_fails_with(&tok(args, b"hi"), expected);
    }
}

#[test]
fn the_usage_lines_show_orders_the_parser_accepts() {
    let mut command = binary();
    command.arg("--help");
    let help = stdout(&run(command, b""));
    let name = env!("CARGO_PKG_NAME");
    assert!(help.contains(&format!("Usage: {name} [OPTIONS] <PROMPT>")), "{help}");
    assert!(help.contains(&format!("{name} [--model DIR] [--tokenizer PATH] <COMMAND>")), "{help}");
    // The second line, as written: global options, then the subcommand.
    let mut command = binary();
    command.args(["--model", "/nonexistent", "--tokenizer"]).arg(tokenizer_path()).arg("encode");
    assert_eq!(stdout(&run(command, b"Hello")), "9906\n");
}

#[test]
fn tokenizer_is_found_in_the_model_directory() {
    let model = tempfile::tempdir().unwrap();
    std::fs::create_dir(model.path().join("original")).unwrap();
    std::fs::copy(tokenizer_path(), model.path().join("original/tokenizer.model")).unwrap();
    let mut command = binary();
    command.current_dir(model.path()).env_remove("LLAMA_TOKENIZER").args(["--model", ".", "encode"]);
    assert_eq!(stdout(&run(command, b"Hello")), "9906\n");
}

#[test]
fn default_run_shows_chat_ids_and_round_trip() {
    let model = tempfile::tempdir().unwrap();
    write_checkpoint(SynthConfig::Tiny, 1, model.path()).unwrap();
    let output = tok(&["--model", model.path().to_str().unwrap(), "--no-gpu", "Hi there"], b"");
    let text = stdout(&output);
    assert!(text.contains("20 tensors, all BF16"), "{text}");
    assert!(text.contains("in the chat format: 12 token ids"), "{text}");
    assert!(text.contains("  128006  \"<|start_header_id|>\""), "{text}");
    assert!(text.contains("round trip: decode(encode(prompt)) == prompt (2 ids for the prompt alone)"), "{text}");
    assert!(text.contains("128009 <|eot_id|>"), "{text}");
}

#[test]
fn default_run_needs_a_prompt() {
    let output = tok(&["--no-gpu"], b"");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("<PROMPT>"));
}

#[test]
fn tokenizer_path_can_come_from_the_environment() {
    let mut command = binary();
    command.env("LLAMA_TOKENIZER", tokenizer_path()).arg("encode");
    assert_eq!(stdout(&run(command, b"Hello")), "9906\n");
}
