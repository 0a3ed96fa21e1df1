//! `llama-reference`: run the CPU reference model from the command line.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use llama_reference::Model;

#[derive(Parser)]
#[command(about = "The CPU f32 reference Llama 3 model: greedy ids or top logits for a prompt given as token ids")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Greedy decoding: prints the generated ids on one line (stops after an EOS from config.json).
    Greedy {
        /// Model directory with config.json and model.safetensors.
        #[arg(long)]
        model: PathBuf,
        /// Prompt token ids, separated by spaces, e.g. "128000 9906 11".
        #[arg(long)]
        prompt_ids: String,
        #[arg(long, default_value_t = 16)]
        max_new_tokens: usize,
    },
    /// Prints the last position's 10 largest logits as `id logit` lines.
    Logits {
        #[arg(long)]
        model: PathBuf,
        #[arg(long)]
        prompt_ids: String,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Greedy { model, prompt_ids, max_new_tokens } => {
            let prompt = parse_ids(&prompt_ids)?;
            let model = load(&model)?;
            let stops = model.config.eos_token_ids.clone();
            let generated = model.greedy(&prompt, max_new_tokens, &stops)?;
            println!("{}", join(&generated));
        }
        Command::Logits { model, prompt_ids } => {
            let prompt = parse_ids(&prompt_ids)?;
            let logits = load(&model)?.last_logits(&prompt)?;
            let mut ranked: Vec<(usize, f32)> = logits.into_iter().enumerate().collect();
            ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
            for (id, logit) in ranked.into_iter().take(10) {
                println!("{id} {logit:.6}");
            }
        }
    }
    Ok(())
}

fn load(dir: &std::path::Path) -> Result<Model> {
    Model::load(dir).with_context(|| format!("cannot load the model in {}", dir.display()))
}

fn parse_ids(text: &str) -> Result<Vec<u32>> {
    let ids = text
        .split_whitespace()
        .map(|word| word.parse::<u32>().with_context(|| format!("{word:?} is not a token id")))
        .collect::<Result<Vec<_>>>()?;
    anyhow::ensure!(!ids.is_empty(), "the prompt has no token ids");
    Ok(ids)
}

fn join(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
}
