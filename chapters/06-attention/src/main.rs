//! Chapter 6: attention.
//!
//! Everything chapter 5 does (embedding, layer 0's norm, q/k/v with RoPE), then causal
//! grouped-query attention over the prompt, the output projection, and the residual
//! connection: the whole attention sublayer of layer 0.

mod check;
mod checkpoint;
mod config;
mod gpu;
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
use gpu::Gpu;
use llama_reference::{LayerCache, Matrix};
use tokenizer::{STOP_TOKENS, StreamDecoder, Tokenizer};
use weights::Weights;

/// The longest sequence this engine handles: prompt and generated tokens together.
const MAX_CONTEXT: usize = 2048;

// ANCHOR: cli
#[derive(Parser)]
#[command(
    version,
    about = "Chapter 6: layer 0's attention sublayer (causal GQA, o_proj, residual) over the prompt",
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
    /// Also print chapters 1-5's output: tensor table, tokens, rows, RoPE frequencies and rotations.
    #[arg(long)]
    verbose: bool,
    /// A system prompt to put before the user's prompt.
    #[arg(long, value_name = "TEXT")]
    system: Option<String>,
    /// The user's prompt.
    #[arg(required_unless_present = "header")]
    prompt: Option<String>,
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
    let ids = tokenizer.encode_prompt(cli.system.as_deref(), prompt)?;
    if ids.len() > MAX_CONTEXT {
        bail!("the prompt is {} tokens in the chat format; the context holds {MAX_CONTEXT}", ids.len());
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
    let hidden_states = ops::embed(&gpu, &weights, &config, &ids)?;
    let rows = check::to_f32(&stream.clone_dtoh(&hidden_states)?);
    let normed = ops::rms_norm(&gpu, &hidden_states, &weights.layers[0].input_layernorm, &config)?;
    let normed_rows = check::to_f32(&stream.clone_dtoh(&normed)?);
    if cli.verbose {
        show_rows("embedding rows, gathered on the GPU", &tokenizer, &ids, &rows, config.hidden_size)?;
        show_rows("layer 0 input_layernorm, on the GPU", &tokenizer, &ids, &normed_rows, config.hidden_size)?;
    }

    let layer = &weights.layers[0];
    let positions: Vec<u32> = (0..ids.len() as u32).collect();
    let positions_on_gpu = stream.clone_htod(&positions)?;
    let inv_freq = stream.clone_htod(&rope::inverse_frequencies(&config))?;
    if cli.verbose {
        rope::print_frequency_table(&config);
    }
    let mut q = ops::linear(&gpu, &normed, &layer.q_proj, config.hidden_size)?;
    let mut k = ops::linear(&gpu, &normed, &layer.k_proj, config.hidden_size)?;
    let v = ops::linear(&gpu, &normed, &layer.v_proj, config.hidden_size)?;
    let q_before_rope = check::to_f32(&stream.clone_dtoh(&q)?);
    ops::rope(&gpu, &mut q, &positions_on_gpu, &inv_freq, config.num_attention_heads, &config)?;
    ops::rope(&gpu, &mut k, &positions_on_gpu, &inv_freq, config.num_key_value_heads, &config)?;
    let (q_rows, k_rows, v_rows) = (
        check::to_f32(&stream.clone_dtoh(&q)?),
        check::to_f32(&stream.clone_dtoh(&k)?),
        check::to_f32(&stream.clone_dtoh(&v)?),
    );
    if cli.verbose {
        show_rotation(&q_before_rope, &q_rows, &config);
    }

    // ANCHOR: attention_sublayer
    let attended = ops::attention_prefill(&gpu, &q, &k, &v, &config)?;
    // The residual stream starts as the embeddings; the sublayer adds its output to it.
    let mut residual = stream.clone_dtod(&hidden_states)?;
    ops::linear_add(&gpu, &attended, &layer.o_proj, config.num_attention_heads * config.head_dim, &mut residual)?;
    // ANCHOR_END: attention_sublayer
    let attended_rows = check::to_f32(&stream.clone_dtoh(&attended)?);
    let output_rows = check::to_f32(&stream.clone_dtoh(&residual)?);
    show_attention_update(&tokenizer, &ids, &rows, &output_rows, config.hidden_size)?;
    if cli.check {
        let reference = llama_reference::Model::load(&cli.model).context("loading the CPU reference model")?;
        let mut checks = check::Checks::default();
        let expected = reference.embed(&ids)?;
        let what = format!("embedding rows of {} prompt tokens ({} values)", ids.len(), rows.len());
        checks.compare(&what, &rows, &expected.data, 0.0);
        // From here on each step is checked on the GPU's own input, so that its line
        // measures that step alone.
        let reference_layer = &reference.layers[0];
        let embedded = Matrix::from_vec(ids.len(), config.hidden_size, rows.clone());
        let expected_normed =
            llama_reference::model::rms_norm(&embedded, &reference_layer.input_layernorm, config.rms_norm_eps);
        checks.compare("layer 0 input_layernorm", &normed_rows, &expected_normed.data, 1e-2);
        let positions: Vec<usize> = (0..ids.len()).collect();
        let normed_on_gpu = Matrix::from_vec(ids.len(), config.hidden_size, normed_rows.clone());
        let (q_ref, k_ref, v_ref) =
            reference_layer.project_qkv(&reference.config, &reference.inv_freq, &normed_on_gpu, &positions);
        checks.compare("layer 0 q after RoPE", &q_rows, &q_ref.data, 1e-2);
        checks.compare("layer 0 k after RoPE", &k_rows, &k_ref.data, 1e-2);
        checks.compare("layer 0 v", &v_rows, &v_ref.data, 1e-2);
        // ANCHOR: check_attention
        let q_dim = config.num_attention_heads * config.head_dim;
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

// ANCHOR: show_attention_update
/// For each token: how large its row is before the sublayer, and how much attention
/// changed it (root mean squares), with the first values after.
fn show_attention_update(
    tokenizer: &Tokenizer,
    ids: &[u32],
    before: &[f32],
    after: &[f32],
    hidden: usize,
) -> Result<()> {
    let rms = |values: &[f32]| (values.iter().map(|v| v * v).sum::<f32>() / values.len() as f32).sqrt();
    println!();
    println!("layer 0 attention sublayer: {} tokens, each attending to itself and the tokens before it", ids.len());
    println!("{:>8} {:<22} {:>8} {:>8}  first values after", "id", "token", "rms(x)", "rms(Δ)");
    for ((&id, x), y) in ids.iter().zip(before.chunks_exact(hidden)).zip(after.chunks_exact(hidden)) {
        let piece = show_piece(tokenizer.token_bytes(id)?);
        let change: Vec<f32> = y.iter().zip(x).map(|(a, b)| a - b).collect();
        let first: Vec<String> = y[..4].iter().map(|v| format!("{v:>8.4}")).collect();
        println!("{id:>8} {piece:<22} {:>8.4} {:>8.4}  [{} ...]", rms(x), rms(&change), first.join(" "));
    }
    Ok(())
}
// ANCHOR_END: show_attention_update

// ANCHOR: show_rotation
/// Query head 0's first pair, (q[0], q[32]), for each position, before and after RoPE:
/// the pair turns by one radian per position (pair 0's frequency is 1) and keeps its length.
fn show_rotation(before: &[f32], after: &[f32], config: &Config) {
    let (q_dim, half) = (config.num_attention_heads * config.head_dim, config.head_dim / 2);
    println!();
    println!("query head 0, pair 0 (q[0], q[{half}]) by position: before RoPE -> after RoPE   |length|");
    for (position, (b, a)) in before.chunks_exact(q_dim).zip(after.chunks_exact(q_dim)).enumerate() {
        let length = |x: f32, y: f32| (x * x + y * y).sqrt();
        println!(
            "{position:>4}  ({:>8.4}, {:>8.4}) -> ({:>8.4}, {:>8.4})   {:.4} -> {:.4}",
            b[0],
            b[half],
            a[0],
            a[half],
            length(b[0], b[half]),
            length(a[0], a[half])
        );
    }
}
// ANCHOR_END: show_rotation

/// Each token with the first and last few values of its row.
fn show_rows(title: &str, tokenizer: &Tokenizer, ids: &[u32], rows: &[f32], hidden: usize) -> Result<()> {
    println!();
    println!("{title}: {} tokens x {hidden} values", ids.len());
    for (&id, row) in ids.iter().zip(rows.chunks_exact(hidden)) {
        let piece = show_piece(tokenizer.token_bytes(id)?);
        let values = |vals: &[f32]| vals.iter().map(|v| format!("{v:>8.4}")).collect::<Vec<_>>().join(" ");
        println!("{id:>8} {piece:<22} [{} ... {}]", values(&row[..4]), values(&row[hidden - 2..]));
    }
    Ok(())
}

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
