//! Chapter 7: the first generated text.
//!
//! The MLP sublayer completes the decoder layer; sixteen of them, the final norm and the
//! LM head make the whole model. Greedy generation picks the most likely next token on
//! the GPU, again and again, recomputing the whole sequence each time.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Result, bail};
use clap::Parser;

use ch07_mlp::checkpoint::{self, Checkpoint};
use ch07_mlp::config::Config;
use ch07_mlp::gpu::{self, Gpu};
use ch07_mlp::model::Model;
use ch07_mlp::tokenizer::commands::{self, Command};
use ch07_mlp::tokenizer::{StreamDecoder, Tokenizer};
use ch07_mlp::weights::{self, Weights};
use ch07_mlp::{check, generate, ops, rope};

// ANCHOR: cli
#[derive(Parser)]
#[command(
    version,
    about = "Chapter 7: the whole model on the GPU and greedy generation (recomputing the sequence for each token)",
    subcommand_negates_reqs = true,
    override_usage = "ch07-mlp [OPTIONS] <PROMPT> [MAX_NEW_TOKENS]\n       ch07-mlp [--model DIR] [--tokenizer PATH] <COMMAND>"
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
    /// Compare the GPU's results with the file and the CPU reference; exit non-zero on a mismatch.
    #[arg(long, conflicts_with = "no_gpu")]
    check: bool,
    /// Also print the tensor table, the prompt's tokens and the RoPE frequency table.
    #[arg(long)]
    verbose: bool,
    /// A system prompt to put before the user's prompt.
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// The user's prompt.
    #[arg(required_unless_present = "header")]
    prompt: Option<String>,
    /// How many tokens to generate at most.
    #[arg(default_value_t = 128, allow_negative_numbers = true, value_parser = generate::parse_max_new_tokens)]
    max_new_tokens: usize,
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
    ops::check_attention_shape(&config)?;
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
    let ids = tokenizer.encode_prompt(cli.system.as_deref(), prompt)?;
    let context = generate::context_limit(&config);
    if ids.len() > context {
        bail!("the prompt is {} tokens in the chat format; the context holds {context}", ids.len());
    }
    let room = generate::room_after(ids.len(), context);
    if cli.max_new_tokens > room {
        println!(
            "note    MAX_NEW_TOKENS {} will be capped at {room}, {} fewer: a context of {context} tokens after a prompt of {}",
            cli.max_new_tokens,
            cli.max_new_tokens - room,
            ids.len()
        );
    }
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
    if cli.verbose {
        commands::show_prompt(&tokenizer, cli.system.as_deref(), prompt, &config.eos_token_id)?;
    }

    // ANCHOR: gpu_work
    let start = Instant::now();
    let mut gpu = Gpu::new(&ctx, stream.clone())?;
    gpu.poison_outputs = cli.check;
    println!("kernels compiled by NVRTC for {} in {:.0} ms", gpu.arch, start.elapsed().as_secs_f64() * 1e3);
    if cli.verbose {
        rope::print_frequency_table(&config);
    }
    // Buffers for the longest sequence generation can reach, allocated once.
    let mut model = Model::new(gpu, weights, config, context)?;

    println!();
    println!("prompt  {} tokens in the chat format; up to {} new tokens", ids.len(), cli.max_new_tokens.min(room));
    println!();
    let mut decoder = StreamDecoder::new(&tokenizer);
    let mut stdout = std::io::stdout();
    let generation = generate::generate(&mut model, &ids, cli.max_new_tokens, cli.check, |id| {
        // Print each piece as soon as it is complete text, like a chat window.
        write!(stdout, "{}", decoder.push(id)?)?;
        Ok(stdout.flush()?)
    })?;
    println!("{}", decoder.finish());
    println!();
    generation.print_summary(ids.len(), context);
    if cli.check {
        check::check_against_reference(&mut model, &cli.model, &ids, &generation)?;
    }
    // ANCHOR_END: gpu_work
    Ok(())
}
// ANCHOR_END: run
