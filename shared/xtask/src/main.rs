//! `cargo x …`: the project's tooling. Nothing here is engine code.

mod synth;

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo x", about = "Project tooling for Inference from Scratch, in Rust")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a synthetic checkpoint (config.json + BF16 model.safetensors).
    Synth(synth::Args),
}

fn main() -> ExitCode {
    let result: Result<()> = match Cli::parse().command {
        Command::Synth(args) => synth::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
