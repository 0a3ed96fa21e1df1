//! `cargo x synth`: write a synthetic checkpoint.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use llama_reference::synth::{SynthConfig, write_checkpoint};

#[derive(clap::Args)]
pub struct Args {
    /// Which model: `1b` (Llama 3.2 1B Instruct's exact shapes), `tiny`, or `tiny-untied`.
    #[arg(long)]
    config: String,
    /// Seed of the pseudo-random weights; the same seed gives the same bytes.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Directory to write config.json and model.safetensors into (a relative path counts from
    /// the current directory, as for every path you give).
    #[arg(long)]
    out: PathBuf,
}

pub fn run(args: Args) -> Result<()> {
    let which = SynthConfig::parse(&args.config)?;
    let start = Instant::now();
    let summary = write_checkpoint(which, args.seed, &args.out)?;
    println!(
        "wrote {} ({} tensors, {:.2} GB, orbit length {}) in {:.1} s",
        std::path::absolute(&args.out)?.display(),
        summary.tensors,
        summary.bytes as f64 / 1e9,
        summary.orbit_length,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
