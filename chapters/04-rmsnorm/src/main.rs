//! Chapter 4: RMSNorm.
//!
//! Everything chapter 3 does (token ids → embedding rows on the GPU), then layer 0's
//! `input_layernorm`: each row scaled to a root mean square of 1, then by a learned weight.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Parser;

use ch04_rmsnorm::checkpoint::{self, Checkpoint};
use ch04_rmsnorm::config::Config;
use ch04_rmsnorm::gpu::{self, Gpu};
use ch04_rmsnorm::model::Model;
use ch04_rmsnorm::tokenizer::Tokenizer;
use ch04_rmsnorm::tokenizer::commands::{self, Command};
use ch04_rmsnorm::weights::{self, Weights};
use ch04_rmsnorm::{check, show};
use llama_reference::Matrix;

// ANCHOR: cli
#[derive(Parser)]
#[command(
    version,
    about = "Chapter 4: RMSNorm on the GPU (layer 0's input_layernorm of the prompt's embeddings)",
    subcommand_negates_reqs = true,
    override_usage = "ch04-rmsnorm [OPTIONS] <PROMPT>\n       ch04-rmsnorm [--model DIR] [--tokenizer PATH] <COMMAND>"
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
    /// Also print the tensor table and every prompt token (chapters 1 and 2's output).
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
    if cli.verbose {
        commands::show_prompt(&tokenizer, cli.system.as_deref(), prompt, &config.eos_token_id)?;
    }

    // ANCHOR: gpu_work
    let start = Instant::now();
    let mut gpu = Gpu::new(&ctx, stream.clone())?;
    gpu.poison_outputs = cli.check;
    println!("kernels compiled by NVRTC for {} in {:.0} ms", gpu.arch, start.elapsed().as_secs_f64() * 1e3);
    let ids = tokenizer.encode_prompt(cli.system.as_deref(), prompt)?;
    let mut model = Model::new(gpu, weights, config, ids.len())?;
    model.embed(&ids)?;
    let rows = model.read(&model.act.x)?;
    model.input_norm(0)?;
    let normed_rows = model.read(&model.act.normed)?;
    let hidden = model.config.hidden_size;
    show::show_rows("layer 0 input_layernorm, on the GPU", &tokenizer, &ids, &normed_rows, hidden)?;
    if cli.check {
        let reference = llama_reference::Model::load(&cli.model).context("loading the CPU reference model")?;
        let mut checks = check::Checks::default();
        let expected = reference.embed(&ids)?;
        let what = format!("embedding rows of {} prompt tokens ({} values)", ids.len(), rows.len());
        checks.compare(&what, &rows, &expected.data, 0.0);
        // From here on each step is checked on the GPU's own input, so that its line
        // measures that step alone.
        let reference_layer = &reference.layers[0];
        let embedded = Matrix::from_vec(ids.len(), hidden, rows.clone());
        let eps = model.config.rms_norm_eps;
        let expected_normed = llama_reference::model::rms_norm(&embedded, &reference_layer.input_layernorm, eps);
        checks.compare("layer 0 input_layernorm", &normed_rows, &expected_normed.data, 1e-2);
        checks.finish()?;
    }
    // ANCHOR_END: gpu_work
    Ok(())
}
// ANCHOR_END: run
