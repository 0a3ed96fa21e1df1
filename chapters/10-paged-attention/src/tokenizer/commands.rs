//! The tokenizer's own command line (`encode`, `decode`, `chat`), finding `tokenizer.model`,
//! and showing a prompt token by token.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Subcommand;

use super::{StreamDecoder, Tokenizer};

// ANCHOR: commands
#[derive(Subcommand)]
pub enum Command {
    /// Read UTF-8 text from stdin, print its token ids on one line (no <|begin_of_text|>).
    /// `echo` adds a newline, which is encoded too: use `printf` or `echo -n`.
    Encode,
    /// Read whitespace-separated token ids from stdin, write the text.
    Decode,
    /// Print the token ids of PROMPT in the chat format, ready for the model to answer.
    Chat {
        /// A system prompt to put before the user's prompt.
        #[arg(long, value_name = "TEXT")]
        system: Option<String>,
        /// The user's prompt.
        prompt: String,
    },
}
// ANCHOR_END: commands

impl Command {
    /// The subcommand as typed.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Encode => "encode",
            Command::Decode => "decode",
            Command::Chat { .. } => "chat",
        }
    }
}

/// The subcommands use only `--model` and `--tokenizer`; anything else given with one of
/// them (`given`: each argument's name and whether it was there) would be silently dropped,
/// so it is refused, naming the subcommand.
pub fn refuse_ignored(command: &Command, given: &[(&str, bool)]) -> Result<()> {
    let Some((argument, _)) = given.iter().find(|(_, present)| *present) else {
        return Ok(());
    };
    let name = command.name();
    let hint = match command {
        Command::Chat { .. } => "; write `chat --system TEXT PROMPT`".to_string(),
        Command::Encode | Command::Decode => format!("; `{name}` reads its input from stdin"),
    };
    bail!("{argument} before `{name}` would be ignored: only --model and --tokenizer apply to a subcommand{hint}")
}

// ANCHOR: show_prompt
/// The chat-formatted prompt as ids, each beside the text it stands for, the round trip,
/// and the tokens that will end generation (`config.json`'s `eos_token_id`).
pub fn show_prompt(tokenizer: &Tokenizer, system: Option<&str>, prompt: &str, stop_tokens: &[u32]) -> Result<()> {
    let ids = tokenizer.encode_prompt(system, prompt)?;
    println!();
    println!("prompt  {prompt:?} in the chat format: {} token ids", ids.len());
    for &id in &ids {
        println!("{id:>8}  {}", show_piece(tokenizer.token_bytes(id)?));
    }
    // Decode the way a generator prints: one id at a time, holding back split characters.
    let mut streamed = String::new();
    let mut decoder = StreamDecoder::new(tokenizer);
    for &id in &ids {
        streamed.push_str(&decoder.push(id)?);
    }
    streamed.push_str(&decoder.finish());
    println!("decoded {streamed:?}");
    // The user's words must come back unchanged.
    let user_ids = tokenizer.encode(prompt)?;
    if tokenizer.decode(&user_ids)? != prompt {
        bail!("round trip failed: decode(encode(prompt)) differs from the prompt");
    }
    let count = match user_ids.len() {
        1 => "1 id".to_string(),
        n => format!("{n} ids"),
    };
    println!("round trip: decode(encode(prompt)) == prompt ({count} for the prompt alone)");
    let stops: Vec<String> = stop_tokens
        .iter()
        .map(|&id| Ok(format!("{id} {}", String::from_utf8_lossy(tokenizer.token_bytes(id)?))))
        .collect::<Result<_>>()?;
    println!("generation will stop at any of: {}", stops.join(", "));
    Ok(())
}
// ANCHOR_END: show_prompt

/// A token's bytes for display: a quoted string, or escaped bytes when the token holds
/// only part of a UTF-8 character (an emoji's 4 bytes are often split over 2 tokens).
pub fn show_piece(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => format!("{text:?}"),
        Err(_) => format!("b\"{}\"", bytes.escape_ascii()),
    }
}

// ANCHOR: tokenizer_commands
/// `encode`, `decode` and `chat`: the tokenizer without the model.
pub fn run_command(tokenizer: &Tokenizer, command: &Command) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    match command {
        Command::Encode => {
            let text = String::from_utf8(read_stdin()?).context("stdin is not valid UTF-8")?;
            writeln!(stdout, "{}", join_ids(&tokenizer.encode(&text)?))?;
        }
        Command::Decode => {
            let input = String::from_utf8(read_stdin()?).context("stdin is not valid UTF-8")?;
            let ids = input
                .split_whitespace()
                .map(|word| word.parse().with_context(|| format!("{word:?} is not a token id")))
                .collect::<Result<Vec<u32>>>()?;
            stdout.write_all(tokenizer.decode(&ids)?.as_bytes())?;
        }
        Command::Chat { system, prompt } => {
            require_prompt(prompt)?;
            writeln!(stdout, "{}", join_ids(&tokenizer.encode_prompt(system.as_deref(), prompt)?))?;
        }
    }
    // Writing through `stdout` (not `println!`) makes a closed pipe an error, not a panic.
    Ok(stdout.flush()?)
}
// ANCHOR_END: tokenizer_commands

fn read_stdin() -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::io::stdin().read_to_end(&mut bytes).context("cannot read stdin")?;
    Ok(bytes)
}

pub fn join_ids(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
}

// ANCHOR: tokenizer_file
/// `--tokenizer` (or `$LLAMA_TOKENIZER`), else `tokenizer.model` or `original/tokenizer.model`
/// in the model directory (a Hugging Face download has the latter), else the repository's
/// `models/tokenizer.model` (where `cargo x fetch-tokenizer` puts it).
pub fn tokenizer_file(given: Option<&Path>, model_dir: &Path) -> Result<PathBuf> {
    if let Some(path) = given {
        return check_given_tokenizer(path);
    }
    let candidates = [
        model_dir.join("tokenizer.model"),
        model_dir.join("original/tokenizer.model"),
        crate::checkpoint::default_path("models/tokenizer.model"),
    ];
    match candidates.iter().find(|path| path.is_file()) {
        Some(path) => Ok(path.clone()),
        None => bail!(
            "no tokenizer.model found (looked for {}); run `cargo x fetch-tokenizer` or pass --tokenizer PATH",
            candidates.iter().map(|p| absolute(p).display().to_string()).collect::<Vec<_>>().join(", ")
        ),
    }
}
// ANCHOR_END: tokenizer_file

/// A tokenizer path the user gave: it must name Meta's `tokenizer.model`. A mistake is told
/// as coming from where the path came from: the flag, or the environment variable (clap
/// reads `$LLAMA_TOKENIZER` when the flag is absent).
fn check_given_tokenizer(path: &Path) -> Result<PathBuf> {
    let from_variable = std::env::var_os("LLAMA_TOKENIZER").is_some_and(|value| Path::new(&value) == path);
    let source = if from_variable { "LLAMA_TOKENIZER" } else { "--tokenizer" };
    if path.as_os_str().is_empty() {
        bail!("{source} is empty: give the path of Meta's tokenizer.model");
    }
    let shown = absolute(path);
    if path.file_name().is_some_and(|name| name == "tokenizer.json") {
        bail!(
            "{source} names {}, Hugging Face's tokenizer.json; this engine reads Meta's tokenizer.model \
             (a download has it in original/tokenizer.model)",
            shown.display()
        );
    }
    if !path.is_file() {
        bail!("{source} names {}, which is not a file", shown.display());
    }
    Ok(path.to_path_buf())
}

/// A path as messages show it: absolute, so a reader in another folder sees where we looked.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// A prompt must say something: an empty or blank one is refused before anything is loaded.
pub fn require_prompt(prompt: &str) -> Result<()> {
    if prompt.trim().is_empty() {
        bail!("the prompt is empty: give the model something to answer");
    }
    Ok(())
}
