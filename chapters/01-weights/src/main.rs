//! Chapter 1: from a file of numbers to weights on the GPU.
//!
//! Reads `config.json`, maps and validates `model.safetensors`, copies every tensor to GPU
//! memory, and prints what it loaded and how fast.

mod check;
mod checkpoint;
mod config;
mod weights;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Parser;
use cudarc::driver::CudaContext;

use checkpoint::Checkpoint;
use config::Config;
use weights::Weights;

// ANCHOR: cli
#[derive(Parser)]
#[command(version, about = "Chapter 1: read, validate and upload Llama 3.2 1B weights to the GPU")]
struct Cli {
    /// Model directory holding config.json and model.safetensors.
    #[arg(long, default_value = "models/llama-3.2-1b-instruct")]
    model: PathBuf,
    /// Print model.safetensors' 8-byte header length and its raw JSON header, then stop.
    #[arg(long)]
    header: bool,
    /// Stop after validating the files (no GPU needed).
    #[arg(long)]
    no_gpu: bool,
    /// After uploading, read samples of every tensor back and compare them with the file.
    #[arg(long, conflicts_with = "no_gpu")]
    check: bool,
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
    println!();
    print_table(&checkpoint, &config);
    if cli.no_gpu {
        return Ok(());
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
    Ok(())
}
// ANCHOR_END: run

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
