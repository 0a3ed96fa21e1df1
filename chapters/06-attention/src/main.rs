//! Chapter 6: attention.
//!
//! Everything chapter 5 does (embedding, layer 0's norm, q/k/v with RoPE), then causal
//! grouped-query attention over the prompt, the output projection, and the residual
//! connection: the whole attention sublayer of layer 0.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;

use ch06_attention::checkpoint::{self, Checkpoint};
use ch06_attention::config::Config;
use ch06_attention::config::MAX_CONTEXT;
use ch06_attention::gpu::{self, Gpu};
use ch06_attention::model::Model;
use ch06_attention::tokenizer::Tokenizer;
use ch06_attention::tokenizer::commands::{self, Command};
use ch06_attention::weights::{self, Weights};
use ch06_attention::{check, ops, rope, show};
use llama_reference::{LayerCache, Matrix};

// ANCHOR: cli
#[derive(Parser)]
#[command(
    version,
    about = "Chapter 6: layer 0's attention sublayer (causal GQA, o_proj, residual) over the prompt",
    subcommand_negates_reqs = true,
    override_usage = "ch06-attention [OPTIONS] <PROMPT>\n       ch06-attention [--model DIR] [--tokenizer PATH] <COMMAND>"
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
    /// Also print chapters 1-5's output: tensor table, tokens, rows and RoPE frequencies.
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
    if ids.len() > MAX_CONTEXT {
        bail!("the prompt is {} tokens in the chat format; the context holds {MAX_CONTEXT}", ids.len());
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
    let mut model = Model::new(gpu, weights, config, ids.len())?;
    model.embed(&ids)?;
    let rows = model.read(&model.act.x)?;
    // ANCHOR: attention_sublayer
    model.attention_sublayer(0)?;
    // ANCHOR_END: attention_sublayer
    // Each step's result is still in its buffer.
    let act = &model.act;
    let (normed_rows, q_rows, k_rows, v_rows) =
        (model.read(&act.normed)?, model.read(&act.q)?, model.read(&act.k)?, model.read(&act.v)?);
    let (attended_rows, output_rows) = (model.read(&act.attended)?, model.read(&act.x)?);
    let hidden = model.config.hidden_size;
    if cli.verbose {
        show::show_rows("embedding rows, gathered on the GPU", &tokenizer, &ids, &rows, hidden)?;
        show::show_rows("layer 0 input_layernorm, on the GPU", &tokenizer, &ids, &normed_rows, hidden)?;
    }
    show::show_attention_update(&tokenizer, &ids, &rows, &output_rows, hidden)?;
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
        let expected_normed =
            llama_reference::model::rms_norm(&embedded, &reference_layer.input_layernorm, model.config.rms_norm_eps);
        checks.compare("layer 0 input_layernorm", &normed_rows, &expected_normed.data, 1e-2);
        let positions: Vec<usize> = (0..ids.len()).collect();
        let normed_on_gpu = Matrix::from_vec(ids.len(), hidden, normed_rows.clone());
        let (q_ref, k_ref, v_ref) =
            reference_layer.project_qkv(&reference.config, &reference.inv_freq, &normed_on_gpu, &positions);
        checks.compare("layer 0 q after RoPE", &q_rows, &q_ref.data, 1e-2);
        checks.compare("layer 0 k after RoPE", &k_rows, &k_ref.data, 1e-2);
        checks.compare("layer 0 v", &v_rows, &v_ref.data, 1e-2);
        // ANCHOR: check_attention
        let q_dim = model.config.num_attention_heads * model.config.head_dim;
        let q_on_gpu = Matrix::from_vec(ids.len(), q_dim, q_rows.clone());
        let kv_on_gpu = LayerCache { keys: k_rows.clone(), values: v_rows.clone() };
        let attended_ref =
            llama_reference::model::causal_attention(&reference.config, &q_on_gpu, &positions, &kv_on_gpu);
        checks.compare("layer 0 attention (before o_proj)", &attended_rows, &attended_ref.data, 1e-2);
        let attended_on_gpu = Matrix::from_vec(ids.len(), q_dim, attended_rows.clone());
        let output_ref = embedded.add(&llama_reference::tensor::linear(&attended_on_gpu, &reference_layer.o_proj));
        checks.compare("layer 0 o_proj + residual", &output_rows, &output_ref.data, 1e-2);
        // And the whole sublayer from the embeddings, the rounding of every step included.
        let mut cache = LayerCache::default();
        let sublayer_ref =
            reference_layer.attention_block(&reference.config, &reference.inv_freq, &embedded, &positions, &mut cache);
        checks.compare("layer 0 attention sublayer, all from the embeddings", &output_rows, &sublayer_ref.data, 1e-2);
        // ANCHOR_END: check_attention
        checks.finish()?;
    }
    // ANCHOR_END: gpu_work
    Ok(())
}
// ANCHOR_END: run
