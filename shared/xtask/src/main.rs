//! `cargo x …`: the project's tooling. Nothing here is engine code.

mod bench;
mod bench_report;
mod book;
mod changes;
mod check;
mod dedent;
mod diffs;
mod fetch_tokenizer;
mod git;
mod gpu_check;
mod nvrtc;
mod offline;
mod pack;
mod paths;
mod propagate;
mod svg;
mod synth;
mod test;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo x", version, about = "Project tooling for Inference from Scratch, in Rust")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what is missing, then run fmt, clippy, all tests, check, nvrtc and the book build.
    Test,
    /// Workspace members = folders; chapters declare their changes; diffs up to date; book includes resolve.
    Check,
    /// Write book/src/diffs/NN-slug.diff and NN-slug.md for each chapter against the previous one.
    Diffs,
    /// Print each chapter's actual changed files as the [package.metadata.chapter] table for its Cargo.toml.
    Changes,
    /// Carry chapter N's uncommitted edits into every later chapter (copied, patched, or reported).
    Propagate(propagate::Args),
    /// Compile every kernel in kernels/ with NVRTC (no GPU needed); fail on errors or warnings.
    Nvrtc,
    /// Get Meta's tokenizer.model from the PyPI package llama-models and check its sha256.
    FetchTokenizer(fetch_tokenizer::Args),
    /// Write a synthetic checkpoint (config.json + BF16 model.safetensors).
    Synth(synth::Args),
    /// Run every chapter's --check on a synthetic 1B checkpoint and print one table (needs a GPU).
    GpuCheck(gpu_check::Args),
    /// Measure the chapters, transformers and the GPU's limits in one session; one table, JSON and plots (needs a GPU).
    Bench(bench::Args),
    /// Build the book into book/book/ with the pinned mdBook and mdbook-katex (installed into .cache/ once).
    Book(book::Args),
    /// Build the release binaries and pack them, the tokenizer and the commit for a GPU machine.
    Pack,
    /// mdBook preprocessor (book/book.toml runs it): Rust and C++ blocks lose their common indentation.
    #[command(hide = true)]
    BookDedent {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> ExitCode {
    let result: Result<()> = match Cli::parse().command {
        Command::Test => test::run(),
        Command::Check => check::run(),
        Command::Diffs => diffs::run(),
        Command::Changes => changes::run(),
        Command::Propagate(args) => propagate::run(args),
        Command::Nvrtc => nvrtc::run(),
        Command::FetchTokenizer(args) => fetch_tokenizer::run(args),
        Command::Synth(args) => synth::run(args),
        Command::GpuCheck(args) => gpu_check::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Book(args) => book::run(args),
        Command::Pack => pack::run(),
        Command::BookDedent { args } => dedent::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
