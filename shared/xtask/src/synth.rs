//! `cargo x synth`: write a synthetic checkpoint.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;
use llama_reference::synth::{SynthConfig, SynthOptions, write_checkpoint_with};

#[derive(clap::Args)]
pub struct Args {
    /// Which model: `1b` (Llama 3.2 1B Instruct's exact shapes, one file), `3b` (Llama 3.2 3B
    /// Instruct's, two shards), `8b` (Llama 3.1 8B Instruct's, four shards), `tiny`, or
    /// `tiny-untied`.
    #[arg(long)]
    config: String,
    /// Seed of the pseudo-random weights; the same seed gives the same bytes.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Directory to write config.json and the weights into (a relative path counts from the
    /// current directory, as for every path you give). Weight files already there are replaced.
    #[arg(long)]
    out: PathBuf,
    /// Write only the first N layers (same widths; at least 1, since layer 0 holds the planted
    /// circuit), for fast reference checks.
    #[arg(long, value_name = "N")]
    layers: Option<usize>,
    /// Split into shards of at most N MB (10^6 bytes) of tensor data, with an index file, to
    /// try sharded layouts on small models. Default: the real download's layout.
    #[arg(long, value_name = "N")]
    shard_mb: Option<u64>,
}

pub fn run(args: Args) -> Result<()> {
    let which = SynthConfig::parse(&args.config)?;
    let options =
        SynthOptions { layers: args.layers, shard_bytes: args.shard_mb.map(|mb| mb.saturating_mul(1_000_000)) };
    let start = Instant::now();
    let summary = write_checkpoint_with(which, args.seed, &args.out, &options)?;
    println!(
        "wrote {} ({}, {} tensors in {}, {:.2} GB, orbit length {}) in {:.1} s",
        std::path::absolute(&args.out)?.display(),
        counted(summary.layers, "layer"),
        summary.tensors,
        counted(summary.files, "file"),
        summary.bytes as f64 / 1e9,
        summary.orbit_length,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `1 file`, `4 files`.
fn counted(count: usize, noun: &str) -> String {
    if count == 1 { format!("1 {noun}") } else { format!("{count} {noun}s") }
}
