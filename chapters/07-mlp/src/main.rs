//! Chapter 7: the first generated text.
//!
//! The MLP sublayer completes the decoder layer; sixteen of them, the final norm and the
//! LM head make the whole model. Greedy generation picks the most likely next token on
//! the GPU, again and again, recomputing the whole sequence each time.

mod check;
mod checkpoint;
mod config;
mod generate;
mod gpu;
mod model;
mod ops;
mod rope;
mod tokenizer;
mod weights;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use cudarc::driver::CudaContext;

use checkpoint::Checkpoint;
use config::Config;
use cudarc::driver::CudaSlice;
use generate::{Generation, Stop};
use gpu::Gpu;
use half::bf16;
use llama_reference::{LayerCache, Matrix};
use tokenizer::{STOP_TOKENS, StreamDecoder, Tokenizer};
use weights::Weights;

/// The most tokens this engine processes for one sequence, prompt and generated tokens
/// together ([`generate::context_limit`] applies it).
pub const MAX_CONTEXT: usize = 2048;

// ANCHOR: cli
#[derive(Parser)]
#[command(
    version,
    about = "Chapter 7: the whole model on the GPU and greedy generation (recomputing the sequence for each token)",
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Model directory holding config.json and model.safetensors.
    #[arg(long, global = true, default_value = "models/llama-3.2-1b-instruct")]
    model: PathBuf,
    /// Meta's tokenizer.model [default: in the model directory, then models/tokenizer.model].
    #[arg(long, global = true, env = "LLAMA_TOKENIZER", value_name = "PATH")]
    tokenizer: Option<PathBuf>,
    /// Print model.safetensors' 8-byte header length and its raw JSON header, then stop.
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
    #[arg(default_value_t = 128)]
    max_new_tokens: usize,
}

#[derive(Subcommand)]
enum Command {
    /// Read UTF-8 text from stdin, print its token ids on one line (no <|begin_of_text|>).
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
        if cli.prompt.is_some() || cli.system.is_some() {
            bail!("a PROMPT or --system before the subcommand would be ignored (write `chat --system TEXT PROMPT`)");
        }
        let tokenizer = Tokenizer::from_file(tokenizer_file(cli.tokenizer.as_deref(), &cli.model)?)?;
        return run_tokenizer_command(&tokenizer, command);
    }
    let model_file = model_file(&cli.model)?;
    if cli.header {
        return print_header(&model_file);
    }
    let config = Config::from_file(&cli.model.join("config.json"))?;
    let checkpoint = Checkpoint::open(&model_file, &config)?;
    println!("model   {}", cli.model.display());
    println!("config  {}", config.summary());
    println!("        {}", config.constants());
    println!(
        "file    {} bytes: 8-byte length, {} bytes of JSON header, {} tensors, all BF16",
        checkpoint.file_len(),
        checkpoint.header_len,
        checkpoint.tensors.len()
    );
    if !checkpoint.ignored.is_empty() {
        println!("note    ignoring tensors a Llama model does not use: {}", checkpoint.ignored.join(", "));
    }
    if cli.verbose {
        println!();
        print_table(&checkpoint, &config);
    }
    let tokenizer = Tokenizer::from_file(tokenizer_file(cli.tokenizer.as_deref(), &cli.model)?)?;
    let prompt = cli.prompt.as_deref().unwrap_or_default();
    if prompt.trim().is_empty() {
        bail!("the prompt is empty: give the model something to answer");
    }
    let ids = tokenizer.encode_prompt(cli.system.as_deref(), prompt)?;
    let context = generate::context_limit(&config);
    if ids.len() > context {
        bail!("the prompt is {} tokens in the chat format; the context holds {context}", ids.len());
    }
    if cli.no_gpu {
        return show_prompt(&tokenizer, cli.system.as_deref(), prompt);
    }

    let ctx = open_gpu()?;
    let stream = ctx.default_stream();
    let (free, total) = ctx.mem_get_info()?;
    println!();
    println!("GPU     {} ({:.1} GiB free of {:.1} GiB)", ctx.name()?, gib(free), gib(total));
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
        let checked = weights::check_against_file(&stream, &checkpoint, &weights)?;
        let mut checks = check::Checks::default();
        checks.record(
            &format!(
                "{} tensors' start, middle and end ({} bytes) read back from the GPU vs the file",
                checked.tensors, checked.bytes
            ),
            &checked.summary(),
            "0 differing values",
            checked.differing == 0,
        );
        checks.finish()?;
    }
    if cli.verbose {
        show_prompt(&tokenizer, cli.system.as_deref(), prompt)?;
    }

    // ANCHOR: gpu_work
    let start = Instant::now();
    let gpu = Gpu::new(&ctx, stream.clone())?;
    println!("kernels compiled by NVRTC for {} in {:.0} ms", gpu.arch, start.elapsed().as_secs_f64() * 1e3);
    let inv_freq = stream.clone_htod(&rope::inverse_frequencies(&config))?;
    if cli.verbose {
        rope::print_frequency_table(&config);
    }

    println!();
    println!("prompt  {} tokens in the chat format; up to {} new tokens", ids.len(), cli.max_new_tokens);
    println!();
    let mut decoder = StreamDecoder::new(&tokenizer);
    let mut stdout = std::io::stdout();
    let (max_new, keep_logits) = (cli.max_new_tokens, cli.check);
    let generation = generate::generate(&gpu, &weights, &config, &inv_freq, &ids, max_new, keep_logits, |id| {
        // Print each piece as soon as it is complete text, like a chat window.
        write!(stdout, "{}", decoder.push(id)?)?;
        Ok(stdout.flush()?)
    })?;
    println!("{}", decoder.finish());
    println!();
    print_summary(&generation, ids.len(), context);
    if cli.check {
        check_against_reference(&cli.model, &gpu, &weights, &config, &inv_freq, &ids, &generation)?;
    }
    // ANCHOR_END: gpu_work
    Ok(())
}
// ANCHOR_END: run

// ANCHOR: summary
/// One line of statistics: lengths, time, speed and why generation stopped.
fn print_summary(generation: &Generation, prompt_tokens: usize, context: usize) {
    let reason = match generation.stop {
        Stop::EndToken(id) => format!("stop token {id}"),
        Stop::Budget => "token budget reached".to_string(),
        Stop::Context => format!("context of {context} tokens full"),
    };
    println!("generated ids: {}", join_ids(&generation.tokens));
    let speed = match generation.tokens.len() {
        0 => String::new(),
        n => format!(": {:.1} tokens/s", n as f64 / generation.seconds),
    };
    println!(
        "prompt {prompt_tokens} tokens, generated {} tokens in {:.3} s{speed} (stopped: {reason})",
        generation.tokens.len(),
        generation.seconds
    );
}
// ANCHOR_END: summary

// ANCHOR: check_against_reference
/// Checks the embedding, then every sublayer on the GPU's own input to it, then, from the
/// tokens, the logits of the prompt's last position and of every generation step, and the
/// greedy tokens. Every limit comes from the arithmetic (see `check.rs`).
fn check_against_reference(
    model_dir: &Path,
    gpu: &Gpu,
    weights: &Weights,
    config: &Config,
    inv_freq: &CudaSlice<f32>,
    ids: &[u32],
    generation: &Generation,
) -> Result<()> {
    let reference = llama_reference::Model::load(model_dir).context("loading the CPU reference model")?;
    let mut checks = check::Checks::default();
    // The limits scale with the sizes the reference's stream takes on the whole sequence.
    let sequence = [ids, &generation.tokens].concat();
    let growth = check::Growth::measure(&reference, &sequence)?;

    // Chapter 3's check: the embedding rows are copies, exact.
    let mut x = ops::embed(gpu, weights, config, ids)?;
    let embedded = check::to_f32(&gpu.stream.clone_dtoh(&x)?);
    checks.compare(
        &format!("embedding rows of {} prompt tokens", ids.len()),
        &embedded,
        &reference.embed(ids)?.data,
        0.0,
    );

    check_sublayers(gpu, weights, config, inv_freq, &reference, &mut x, &mut checks)?;

    // From the tokens, as a user sees it: the bf16 rounding of all layers included.
    let logits_limit = growth.logits_limit(config.vocab_size);
    let logits = gpu.stream.clone_dtoh(&model::forward(gpu, weights, config, inv_freq, ids)?)?;
    let expected_logits = reference.last_logits(ids)?;
    checks.compare(
        "logits of the prompt's last position, all from the tokens",
        &logits,
        &expected_logits,
        logits_limit,
    );
    let generated = generation.tokens.len();
    if generated > 0 {
        let expected_steps = reference.step_logits(ids, &generation.tokens)?;
        let what = format!("logits of each of the {generated} generation steps, on the GPU's tokens");
        checks.compare_steps(&what, &generation.step_logits, &expected_steps, logits_limit);
        let what = format!("each of the {generated} greedy tokens, on the GPU's tokens before it");
        checks.compare_tokens(&what, &generation.tokens, &expected_steps, logits_limit);
    }
    checks.finish()
}

/// Each sublayer's change to the stream (its output projection's product, before the
/// residual add), on the GPU's own input to it, against the reference's change on that same
/// input: so each measurement is that sublayer's own error, not the drift of the ones
/// before. Then the residual add itself, against the roundings it allows. Reports the
/// sublayer nearest its limit.
fn check_sublayers(
    gpu: &Gpu,
    weights: &Weights,
    config: &Config,
    inv_freq: &CudaSlice<f32>,
    reference: &llama_reference::Model,
    x: &mut CudaSlice<bf16>,
    checks: &mut check::Checks,
) -> Result<()> {
    let rows = x.len() / config.hidden_size;
    let positions: Vec<usize> = (0..rows).collect();
    let positions_on_gpu = gpu.stream.clone_htod(&positions.iter().map(|&p| p as u32).collect::<Vec<u32>>())?;
    let read = |x: &CudaSlice<bf16>| -> Result<Vec<f32>> { Ok(check::to_f32(&gpu.stream.clone_dtoh(x)?)) };
    let q_dim = config.num_attention_heads * config.head_dim;
    // (how far toward its limit, which sublayer, error, limit) of the worst change, and the worst add.
    let mut worst_change: Option<(f32, String, check::Error, f32)> = None;
    let mut worst_add = (0.0f32, String::new());
    for (index, (layer, reference_layer)) in weights.layers.iter().zip(&reference.layers).enumerate() {
        for name in ["attention", "MLP"] {
            let input = x.clone();
            let mut change = gpu.stream.alloc_zeros::<bf16>(x.len())?;
            let input_rows = Matrix::from_vec(rows, config.hidden_size, read(&input)?);
            let (expected, roundings) = if name == "attention" {
                model::attention_sublayer(gpu, layer, config, inv_freq, &positions_on_gpu, x)?;
                let attended = model::attention(gpu, layer, config, inv_freq, &positions_on_gpu, &input)?;
                ops::linear_add(gpu, &attended, &layer.o_proj, q_dim, &mut change)?;
                let mut cache = LayerCache::default();
                let out = reference_layer.attention_block(
                    &reference.config,
                    &reference.inv_freq,
                    &input_rows,
                    &positions,
                    &mut cache,
                );
                (out, model::ATTENTION_ROUNDINGS)
            } else {
                model::mlp_sublayer(gpu, layer, config, x)?;
                let activation = model::mlp_activation(gpu, layer, config, &input)?;
                ops::linear_add(gpu, &activation, &layer.down_proj, config.intermediate_size, &mut change)?;
                (reference_layer.mlp_block(&reference.config, &input_rows), model::MLP_ROUNDINGS)
            };
            let (output, change) = (read(x)?, read(&change)?);
            let expected_change: Vec<f32> = expected.data.iter().zip(&input_rows.data).map(|(o, i)| o - i).collect();
            let error = check::measure(&change, &expected_change);
            let mut budget = check::RoundingBudget::default();
            budget.add(roundings, 1.0);
            let limit = budget.limit(change.len());
            let which = format!("layer {index}'s {name}");
            // NaN anywhere is worse than any finite error.
            let toward = if error.nan_count > 0 { f32::INFINITY } else { error.relative / limit };
            if worst_change.as_ref().is_none_or(|w| toward > w.0) {
                worst_change = Some((toward, which.clone(), error, limit));
            }
            let add = check::residual_add_error(&input_rows.data, &output, &change);
            if add >= worst_add.0 {
                worst_add = (add, which);
            }
        }
    }
    let sublayers = 2 * weights.layers.len();
    if let Some((_, which, error, limit)) = worst_change {
        let what = format!("each of the {sublayers} sublayers' change on its GPU input (nearest its limit - {which})");
        checks.record_error(&what, &error, limit);
    }
    let (add, which) = worst_add;
    let what = format!("each of the {sublayers} residual adds, output - input - change (worst - {which})");
    let measured = if add < 100.0 {
        format!("{add:.2} of what its roundings allow")
    } else {
        format!("{add:.1e} times what its roundings allow")
    };
    checks.record(&what, &measured, "1", add <= 1.0);
    Ok(())
}
// ANCHOR_END: check_against_reference

// ANCHOR: show_prompt
/// The chat-formatted prompt as ids, each beside the text it stands for, and the round trip.
fn show_prompt(tokenizer: &Tokenizer, system: Option<&str>, prompt: &str) -> Result<()> {
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
    println!("round trip: decode(encode(prompt)) == prompt ({} ids for the prompt alone)", user_ids.len());
    let stops: Vec<String> = STOP_TOKENS
        .iter()
        .map(|&id| Ok(format!("{id} {}", String::from_utf8_lossy(tokenizer.token_bytes(id)?))))
        .collect::<Result<_>>()?;
    println!("generation will stop at any of: {}", stops.join(", "));
    Ok(())
}
// ANCHOR_END: show_prompt

/// A token's bytes for display: a quoted string, or escaped bytes when the token holds
/// only part of a UTF-8 character (an emoji's 4 bytes are often split over 2 tokens).
fn show_piece(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => format!("{text:?}"),
        Err(_) => format!("b\"{}\"", bytes.escape_ascii()),
    }
}

// ANCHOR: tokenizer_commands
/// `encode`, `decode` and `chat`: the tokenizer without the model.
fn run_tokenizer_command(tokenizer: &Tokenizer, command: &Command) -> Result<()> {
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

fn join_ids(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
}

// ANCHOR: tokenizer_file
/// `--tokenizer`, else `tokenizer.model` or `original/tokenizer.model` in the model directory
/// (a Hugging Face download has the latter), else `models/tokenizer.model`
/// (where `cargo x fetch-tokenizer` puts it).
fn tokenizer_file(given: Option<&Path>, model_dir: &Path) -> Result<PathBuf> {
    if let Some(path) = given {
        return Ok(path.to_path_buf());
    }
    let candidates = [
        model_dir.join("tokenizer.model"),
        model_dir.join("original/tokenizer.model"),
        PathBuf::from("models/tokenizer.model"),
    ];
    match candidates.iter().find(|path| path.is_file()) {
        Some(path) => Ok(path.clone()),
        None => bail!(
            "no tokenizer.model found (looked for {}); run `cargo x fetch-tokenizer` or pass --tokenizer PATH",
            candidates.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        ),
    }
}
// ANCHOR_END: tokenizer_file

// ANCHOR: open_gpu
/// Opens GPU 0. cudarc loads the driver library at run time, so we check it is there
/// first: a machine without one gets an error message rather than a panic.
fn open_gpu() -> Result<Arc<CudaContext>> {
    // SAFETY: only tries to load libcuda; nothing is called through it.
    let driver_present = unsafe { cudarc::driver::sys::is_culib_present() };
    if !driver_present {
        bail!("no NVIDIA driver found (libcuda.so cannot be loaded); use --no-gpu to validate the files only");
    }
    CudaContext::new(0).context("cannot open GPU 0")
}
// ANCHOR_END: open_gpu

/// `DIR/model.safetensors`, with an error that says what to do when it is missing.
fn model_file(model_dir: &Path) -> Result<PathBuf> {
    if !model_dir.is_dir() {
        bail!(
            "model directory {} does not exist. Download the weights with\n  \
             huggingface-cli download meta-llama/Llama-3.2-1B-Instruct --local-dir models/llama-3.2-1b-instruct\n\
             or write a synthetic checkpoint with\n  \
             cargo x synth --config 1b --out models/synthetic-1b   (then pass --model models/synthetic-1b)",
            model_dir.display()
        );
    }
    let file = model_dir.join("model.safetensors");
    if !file.is_file() {
        bail!("{} not found (this engine reads a single model.safetensors file)", file.display());
    }
    Ok(file)
}

fn print_header(model_file: &Path) -> Result<()> {
    let file = checkpoint::map_file(model_file)?;
    let header = checkpoint::raw_header(&file).with_context(|| format!("{} is corrupt", model_file.display()))?;
    println!("header length (first 8 bytes, little-endian u64): {}", header.len());
    println!("{header}");
    Ok(())
}

// ANCHOR: table
/// The tensor table: the first layer in full, the other layers as one line.
fn print_table(checkpoint: &Checkpoint, config: &Config) {
    let mib = |bytes: usize| bytes as f64 / (1024.0 * 1024.0);
    let shape = |s: &[usize]| s.iter().map(usize::to_string).collect::<Vec<_>>().join(" x ");
    let is_later_layer = |name: &str| name.starts_with("model.layers.") && !name.starts_with("model.layers.0.");
    println!("{:<48} {:>14} {:>10}", "tensor", "shape", "MiB");
    for entry in &checkpoint.tensors {
        if is_later_layer(&entry.name) {
            continue;
        }
        println!("{:<48} {:>14} {:>10.3}", entry.name, shape(&entry.shape), mib(entry.bytes.len()));
        if entry.name == "model.layers.0.mlp.down_proj.weight" && config.num_hidden_layers > 1 {
            let later: usize =
                checkpoint.tensors.iter().filter(|t| is_later_layer(&t.name)).map(|t| t.bytes.len()).sum();
            let label = match config.num_hidden_layers - 1 {
                1 => "layer 1: the same 9 tensors".to_string(),
                last => format!("layers 1 to {last}: the same 9 tensors each"),
            };
            println!("{label:<48} {:>14} {:>10.3}", "", mib(later));
        }
    }
    let total_bytes: usize = checkpoint.tensors.iter().map(|t| t.bytes.len()).sum();
    let label = format!("total: {} tensors, {} parameters", checkpoint.tensors.len(), total_bytes / 2);
    println!("{label:<48} {:>14} {:>10.3}", "", mib(total_bytes));
}
// ANCHOR_END: table

fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0 * 1024.0)
}
