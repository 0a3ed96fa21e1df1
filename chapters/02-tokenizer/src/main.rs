//! Chapter 2's command line: everything chapter 1 does (weights to the GPU), then the
//! prompt in Llama 3.2's chat format as token ids, each beside its piece of text, and the
//! round trip back to text. Subcommands `encode`, `decode` and `chat` expose the tokenizer
//! on its own.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;

use ch02_tokenizer::checkpoint::{self, Checkpoint};
use ch02_tokenizer::config::Config;
use ch02_tokenizer::gpu;
use ch02_tokenizer::tokenizer::Tokenizer;
use ch02_tokenizer::tokenizer::commands::{self, Command};
use ch02_tokenizer::weights::{self, Weights};

// ANCHOR: cli
#[derive(Parser)]
#[command(
    version,
    about = "Chapter 2: the Llama 3 tokenizer, on its own (subcommands) or after loading the weights",
    subcommand_negates_reqs = true,
    override_usage = "ch02-tokenizer [OPTIONS] <PROMPT>\n       ch02-tokenizer [--model DIR] [--tokenizer PATH] <COMMAND>"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Model directory holding config.json and model.safetensors (or its shards and their index).
    #[arg(long, global = true, value_name = "DIR", default_value_os_t = checkpoint::default_model_dir())]
    model: PathBuf,
    /// Meta's tokenizer.model [default: in the model directory, then the repository's models/tokenizer.model].
    #[arg(long, global = true, env = "LLAMA_TOKENIZER", value_name = "PATH")]
    tokenizer: Option<PathBuf>,
    /// Print each safetensors file's 8-byte header length and its raw JSON header, then stop.
    #[arg(long)]
    header: bool,
    /// Stop after validating the files (no GPU needed).
    #[arg(long)]
    no_gpu: bool,
    /// After uploading, read samples of every tensor back and compare them with the file.
    #[arg(long, conflicts_with = "no_gpu")]
    check: bool,
    /// Also print the tensor table.
    #[arg(long)]
    verbose: bool,
    /// A system prompt to put before the user's prompt.
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// The user's prompt.
    #[arg(required_unless_present = "header")]
    prompt: Option<String>,
}
// ANCHOR_END: cli

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

// ANCHOR: run
fn run(cli: Cli) -> Result<()> {
    if let Some(command) = &cli.command {
        commands::refuse_ignored(
            command,
            &[
                ("PROMPT", cli.prompt.is_some()),
                ("--system", cli.system.is_some()),
                ("--header", cli.header),
                ("--no-gpu", cli.no_gpu),
                ("--check", cli.check),
                ("--verbose", cli.verbose),
            ],
        )?;
        let tokenizer = Tokenizer::from_file(commands::tokenizer_file(cli.tokenizer.as_deref(), &cli.model)?)?;
        return commands::run_command(&tokenizer, command);
    }
    if let Some(prompt) = &cli.prompt {
        commands::require_prompt(prompt)?;
    }
    let model_files = checkpoint::model_files(&cli.model)?;
    if cli.header {
        return checkpoint::print_header(&model_files);
    }
    let config = Config::from_file(&cli.model.join("config.json"))?;
    let checkpoint = Checkpoint::open(&model_files, &config)?;
    println!("model   {}", cli.model.display());
    println!("config  {}", config.summary());
    println!("        {}", config.constants());
    println!("{}", checkpoint.describe());
    if !checkpoint.ignored.is_empty() {
        println!("note    ignoring tensors a Llama model does not use: {}", checkpoint.ignored.join(", "));
    }
    if cli.verbose {
        println!();
        checkpoint::print_table(&checkpoint, &config);
    }
    let tokenizer = Tokenizer::from_file(commands::tokenizer_file(cli.tokenizer.as_deref(), &cli.model)?)?;
    let prompt = cli.prompt.as_deref().unwrap_or_default();
    if cli.no_gpu {
        return commands::show_prompt(&tokenizer, cli.system.as_deref(), prompt, &config.eos_token_id);
    }

    let ctx = gpu::open_gpu()?;
    let stream = ctx.default_stream();
    println!();
    println!("GPU     {}", gpu::describe(&ctx)?);
    let start = Instant::now();
    let weights = Weights::upload(&stream, &checkpoint, &config)?;
    let seconds = start.elapsed().as_secs_f64();
    let bytes: usize = checkpoint.tensors.iter().map(|t| t.bytes.len()).sum();
    println!(
        "upload  {:.2} GB in {:.3} s: {:.2} GB/s (allocate and copy, file to GPU through the page cache)",
        bytes as f64 / 1e9,
        seconds,
        bytes as f64 / 1e9 / seconds
    );
    if cli.check {
        weights::check_upload(&stream, &checkpoint, &weights)?;
    }
    commands::show_prompt(&tokenizer, cli.system.as_deref(), prompt, &config.eos_token_id)
}
// ANCHOR_END: run
