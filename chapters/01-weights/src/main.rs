//! Chapter 1's command line: read, validate and upload the weights, and say what it loaded
//! and how fast.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;
use clap::Parser;

use ch01_weights::checkpoint::{self, Checkpoint};
use ch01_weights::config::Config;
use ch01_weights::gpu;
use ch01_weights::weights::{self, Weights};

// ANCHOR: cli
#[derive(Parser)]
#[command(version, about = "Chapter 1: read, validate and upload Llama 3.2 1B weights to the GPU")]
struct Cli {
    /// Model directory holding config.json and model.safetensors (or its shards and their index).
    #[arg(long, value_name = "DIR", default_value_os_t = checkpoint::default_model_dir())]
    model: PathBuf,
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
    if cli.no_gpu {
        return Ok(());
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
    Ok(())
}
// ANCHOR_END: run
