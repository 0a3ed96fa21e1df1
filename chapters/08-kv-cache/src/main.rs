//! Chapter 8: the KV cache.
//!
//! The same model and the same tokens as chapter 7, far sooner: the prompt runs once and
//! fills the cache, then each new token runs alone and reads the cached keys and values.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Result, bail};
use clap::Parser;

use ch08_kv_cache::checkpoint::{self, Checkpoint};
use ch08_kv_cache::config::Config;
use ch08_kv_cache::gpu::{self, Gpu};
use ch08_kv_cache::model::Model;
use ch08_kv_cache::tokenizer::commands::{self, Command};
use ch08_kv_cache::tokenizer::{StreamDecoder, Tokenizer};
use ch08_kv_cache::weights::{self, Weights};
use ch08_kv_cache::{check, generate, kv_cache, ops, rope};

// ANCHOR: cli
#[derive(Parser)]
#[command(
    version,
    about = "Chapter 8: greedy generation with a KV cache: the prompt once (prefill), then one token at a time (decode)",
    subcommand_negates_reqs = true,
    override_usage = "ch08-kv-cache [OPTIONS] <PROMPT> [MAX_NEW_TOKENS]\n       ch08-kv-cache [--model DIR] [--tokenizer PATH] <COMMAND>"
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
    /// The most positions a sequence may hold, prompt and generated tokens together: the
    /// KV cache's size [default: 2048, or less when the model or the kernels allow less].
    #[arg(long, value_name = "N")]
    max_context: Option<usize>,
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
    ops::check_decode_shape(&config)?;
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
    let context = generate::context_limit(&config, cli.max_context)?;
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
    // Buffers and the cache for the longest sequence generation can reach, allocated once.
    let (free, _) = ctx.mem_get_info()?;
    let cache_bytes = context * kv_cache::bytes_per_token(&config);
    if cache_bytes > free {
        bail!("a KV cache of {context} positions needs {cache_bytes} bytes; the GPU has {free} free");
    }
    let mut model = Model::new(gpu, weights, config, context)?;
    println!(
        "cache   {context} positions: {:.1} MiB of GPU memory, {} KiB per token",
        model.cache.bytes() as f64 / (1024.0 * 1024.0),
        kv_cache::bytes_per_token(&model.config) / 1024
    );

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
