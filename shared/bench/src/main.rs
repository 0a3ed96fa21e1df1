//! `bench`: the GPU side of `cargo x bench`. Each subcommand measures one part and writes
//! it as JSON (see `record.rs`); `cargo x bench` runs them, runs transformers' script on
//! the same workloads, and merges everything into one table.

mod ceilings;
mod ch08;
mod ch09;
mod ch10;
mod facts;
mod figures;
mod memory;
mod profiler;
mod record;
mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};
use cudarc::driver::CudaContext;

use record::Part;
use workload::Workloads;

/// The chapters this binary measures.
const CHAPTERS: [&str; 3] = [ch08::SYSTEM, ch09::SYSTEM, ch10::SYSTEM];

#[derive(Parser)]
#[command(version, about = "Measures the chapters and the GPU's ceilings; writes JSON for `cargo x bench`")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write the workloads every system runs (token ids and budgets) as JSON.
    Workloads {
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long)]
        out: PathBuf,
    },
    /// Measure the GPU's streaming read bandwidth and cuBLAS's bf16 GEMM rate.
    Ceilings {
        #[arg(long)]
        out: PathBuf,
    },
    /// Measure one chapter: load, single-sequence decode, prefill, throughput, memory.
    Chapter {
        #[arg(long, value_name = "NAME")]
        chapter: String,
        #[arg(long, value_name = "DIR")]
        model: PathBuf,
        #[arg(long, value_name = "FILE")]
        workloads: PathBuf,
        /// Timed runs of each figure, after one warm-up.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        #[arg(long)]
        out: PathBuf,
    },
    /// Run `steps` decode steps between cuProfilerStart and cuProfilerStop, for ncu.
    Profile {
        #[arg(long, value_name = "NAME")]
        chapter: String,
        #[arg(long, value_name = "DIR")]
        model: PathBuf,
        #[arg(long, value_name = "FILE")]
        workloads: PathBuf,
        #[arg(long, default_value_t = 4)]
        steps: usize,
        /// Sequences decoded together (chapter 9 on).
        #[arg(long, default_value_t = 1)]
        batch: usize,
    },
}

fn main() -> ExitCode {
    match run(Cli::parse().command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Workloads { seed, out } => {
            let text = serde_json::to_string(&Workloads::generate(seed))?;
            std::fs::write(&out, text)?;
            println!("bench: workloads of seed {seed} in {}", out.display());
        }
        Command::Ceilings { out } => {
            let ctx = open_gpu()?;
            let mut part = Part::new("ceilings");
            describe_gpu(&ctx, &mut part)?;
            ceilings::measure(&ctx, &mut part)?;
            part.write(&out)?;
        }
        Command::Chapter { chapter, model, workloads, runs, out } => {
            let workloads = Workloads::read(&workloads)?;
            let ctx = open_gpu()?;
            let mut part = Part::new(&chapter);
            describe_gpu(&ctx, &mut part)?;
            part.note("model", model.display().to_string());
            match chapter.as_str() {
                ch08::SYSTEM => ch08::measure(&ctx, &model, &workloads, runs, &mut part)?,
                ch09::SYSTEM => ch09::measure(&ctx, &model, &workloads, runs, &mut part)?,
                ch10::SYSTEM => ch10::measure(&ctx, &model, &workloads, runs, &mut part)?,
                other => bail!("no benchmark for chapter {other:?} (known: {})", CHAPTERS.join(", ")),
            }
            part.write(&out)?;
        }
        Command::Profile { chapter, model, workloads, steps, batch } => {
            let workloads = Workloads::read(&workloads)?;
            let ctx = open_gpu()?;
            match chapter.as_str() {
                ch08::SYSTEM if batch == 1 => ch08::profile(&ctx, &model, &workloads, steps)?,
                ch08::SYSTEM => bail!("chapter 8 decodes one sequence at a time: --batch 1 only"),
                ch09::SYSTEM => ch09::profile(&ctx, &model, &workloads, steps, batch)?,
                ch10::SYSTEM => ch10::profile(&ctx, &model, &workloads, steps, batch)?,
                other => bail!("no benchmark for chapter {other:?} (known: {})", CHAPTERS.join(", ")),
            }
        }
    }
    Ok(())
}

fn open_gpu() -> Result<Arc<CudaContext>> {
    ch08_kv_cache::gpu::open_gpu()
}

/// The GPU, its memory and the driver, in the part's environment.
fn describe_gpu(ctx: &Arc<CudaContext>, part: &mut Part) -> Result<()> {
    let mut version = 0;
    // SAFETY: writes one int.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) }.result()?;
    let (major, minor) = ctx.compute_capability()?;
    part.note("gpu", ctx.name()?);
    part.note("gpu_memory_bytes", ctx.total_mem()?);
    part.note("compute_capability", format!("{major}.{minor}"));
    part.note("cuda_driver_api", format!("{}.{}", version / 1000, (version % 1000) / 10));
    Ok(())
}
