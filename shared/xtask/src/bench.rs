//! `cargo x bench`: how fast the chapters are, beside Hugging Face transformers and the
//! hardware's limits, all measured in one session on one GPU.
//!
//! A run writes the workloads once (`bench workloads`: token ids and budgets, so every
//! system runs the same requests), then runs each part, each writing one JSON file into
//! `--out-dir`:
//!
//! - `ceilings`: the GPU's streaming read bandwidth and cuBLAS's bf16 GEMM rate (`bench ceilings`);
//! - `chapters`: every chapter the `bench` binary knows, from 8 on (`bench chapter`);
//! - `profile`: Nsight Compute's time of every kernel of a few decode steps (`bench profile` under `ncu`);
//! - `graph`: one decode step's matrix products as cuBLAS calls in a CUDA graph (`hf_bench.py --mode graph`);
//! - `eager` and `compiled`: transformers' `generate()` as most people call it, and with a
//!   static cache, which makes it compile the model with torch.compile; `compiled` runs
//!   under `--compile-cap-s` and keeps what it finished.
//!
//! Then the report (also alone, `--report DIR`) merges the files into `bench.json` with the
//! GPU, driver, commit, date and seed, prints the table and writes it as `bench.md`, and
//! draws the plots `bench-throughput.svg` and `bench-decode-step.svg` (the table and the
//! plots of any report: `--plot FILE`, beside it). A part that cannot run (no ncu, no torch)
//! is left out with a note; our own parts failing fails the run.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use llama_reference::synth::SynthConfig;

use crate::bench_report::{self, Meta};
use crate::{gpu_check, paths};

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PartName {
    Ceilings,
    Chapters,
    Profile,
    Graph,
    Eager,
    Compiled,
}

impl PartName {
    const ALL: [PartName; 6] = [
        PartName::Ceilings,
        PartName::Chapters,
        PartName::Profile,
        PartName::Graph,
        PartName::Eager,
        PartName::Compiled,
    ];
}

#[derive(clap::Args)]
pub struct Args {
    /// Folder of the `bench` binary [default: target/release].
    #[arg(long, value_name = "DIR")]
    bin_dir: Option<PathBuf>,
    /// The synthetic checkpoint's shape, written into WORK_DIR-CONFIG: 1b, 3b or 8b.
    #[arg(long, default_value = "1b", value_name = "1b|3b|8b")]
    config: String,
    /// A real checkpoint instead of a synthetic one (it runs exactly as fast).
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// Seed of the synthetic weights and of the workloads.
    #[arg(long, default_value_t = 20261201)]
    seed: u64,
    #[arg(long, default_value = "/tmp/bench", value_name = "DIR")]
    work_dir: PathBuf,
    /// Where each part's JSON, the logs and the report go.
    #[arg(long, default_value = "bench-out", value_name = "DIR")]
    out_dir: PathBuf,
    /// Run only these parts (repeatable) [default: all].
    #[arg(long, value_enum, value_name = "PART")]
    only: Vec<PartName>,
    /// Timed runs of each of our figures, after a warm-up (transformers: 3).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Seconds the compiled transformers part may take (compiling is slow); what it
    /// finished by then is kept.
    #[arg(long, default_value_t = 300, value_name = "S")]
    compile_cap_s: u64,
    /// The commit the binaries were built from [default: BIN_DIR/../COMMIT, as `cargo x
    /// pack` writes it, else git].
    #[arg(long)]
    commit: Option<String>,
    /// Only merge the parts already in DIR into a report (no GPU needed).
    #[arg(long, value_name = "DIR", conflicts_with = "plot")]
    report: Option<PathBuf>,
    /// Only draw the slot timeline that a chapter's `--timeline FILE` wrote (chapter 9 on), as FILE's name with .svg.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["report", "plot"])]
    timeline: Option<PathBuf>,
    /// Only write the table (NAME.md) and the plots (NAME-*.svg) of a report NAME.json beside it.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<()> {
    if let Some(file) = &args.timeline {
        return bench_report::draw_timeline(file);
    }
    if let Some(file) = &args.plot {
        return bench_report::write_outputs(&bench_report::read(file)?, file);
    }
    if let Some(dir) = &args.report {
        return bench_report::report(dir);
    }
    // SAFETY: only tries to load libcuda; nothing is called through it.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        bail!("no NVIDIA driver found (libcuda.so cannot be loaded): bench needs a machine with an NVIDIA GPU");
    }
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => paths::root()?.join("target/release"),
    };
    let bench = bin_dir.join("bench");
    ensure!(bench.exists(), "no bench binary in {} (cargo build --release -p bench)", bin_dir.display());
    std::fs::create_dir_all(&args.out_dir)?;
    let out = std::path::absolute(&args.out_dir)?;

    let (model, source) = match &args.model {
        Some(dir) => (dir.clone(), dir.display().to_string()),
        None => {
            let shape = SynthConfig::parse(&args.config)?;
            ensure!(
                matches!(shape, SynthConfig::OneB | SynthConfig::ThreeB | SynthConfig::EightB),
                "--config takes 1b, 3b or 8b"
            );
            let dir = PathBuf::from(format!("{}-{}", args.work_dir.display(), args.config));
            let model = if dir.join("config.json").exists() {
                println!("bench: reusing the synthetic checkpoint in {}", dir.display());
                dir
            } else {
                gpu_check::synthetic_model(shape, None, &dir, args.seed)?
            };
            (model, format!("synthetic {}, seed {}", args.config, args.seed))
        }
    };
    let meta = Meta::now(commit(&args, &bin_dir)?, driver_version(), args.config.clone(), source, args.seed);
    meta.write(&out)?;
    let workloads = out.join("workloads.json");
    run_logged(Command::new(&bench).args(["workloads", "--seed", &args.seed.to_string(), "--out"]).arg(&workloads))?;

    let chosen = |part: PartName| args.only.is_empty() || args.only.contains(&part);
    for part in PartName::ALL.into_iter().filter(|&p| chosen(p)) {
        let started = Instant::now();
        match part {
            PartName::Ceilings => {
                run_logged(Command::new(&bench).arg("ceilings").arg("--out").arg(out.join("ceilings.json")))?
            }
            PartName::Chapters => {
                for chapter in benched_chapters()? {
                    let json = out.join(format!("{chapter}.json"));
                    run_logged(
                        Command::new(&bench)
                            .args(["chapter", "--chapter", &chapter, "--runs", &args.runs.to_string()])
                            .arg("--model")
                            .arg(&model)
                            .arg("--workloads")
                            .arg(&workloads)
                            .arg("--out")
                            .arg(json),
                    )?;
                }
            }
            // A profile is an explanation, not a figure: without it the report still stands.
            PartName::Profile => {
                if let Err(error) = profile(&bench, &model, &workloads, &out) {
                    println!("bench: profile FAILED, left out of the report: {error:#}");
                }
            }
            PartName::Graph => transformers(&model, &workloads, &out, "graph", None)?,
            PartName::Eager => transformers(&model, &workloads, &out, "eager", None)?,
            PartName::Compiled => {
                transformers(&model, &workloads, &out, "compiled", Some(Duration::from_secs(args.compile_cap_s)))?
            }
        }
        println!("bench: part {} done in {:.0} s", part_name(part), started.elapsed().as_secs_f64());
    }
    bench_report::report(&out)
}

fn part_name(part: PartName) -> &'static str {
    match part {
        PartName::Ceilings => "ceilings",
        PartName::Chapters => "chapters",
        PartName::Profile => "profile",
        PartName::Graph => "graph",
        PartName::Eager => "eager",
        PartName::Compiled => "compiled",
    }
}

/// The chapters the `bench` binary measures: every one from 8 on that exists.
pub fn benched_chapters() -> Result<Vec<String>> {
    let chapters = paths::chapters()?;
    Ok(chapters
        .iter()
        .filter(|(folder, _)| folder.as_str() >= "08")
        .map(|(folder, _)| paths::package_name(folder))
        .collect())
}

/// Decode steps Nsight Compute times, kernel by kernel.
const PROFILE_STEPS: usize = 4;

/// Every kernel of a few decode steps of the latest chapter, timed by Nsight Compute
/// (serialised, so each kernel's time is its own), into `profile-CHAPTER.csv`.
fn profile(bench: &Path, model: &Path, workloads: &Path, out: &Path) -> Result<()> {
    let Some(ncu) = gpu_check::find_cuda_tool("ncu") else {
        println!(
            "bench: profile SKIPPED: ncu (Nsight Compute) not found on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin"
        );
        return Ok(());
    };
    let chapter = benched_chapters()?.pop().context("no chapter to profile")?;
    // From chapter 9 on, decode steps of 32 sequences too.
    let batches: &[usize] = if chapter.as_str() >= "ch09" { &[1, 32] } else { &[1] };
    for &batch in batches {
        let name = if batch == 1 { format!("profile-{chapter}") } else { format!("profile-{chapter}-batch-{batch}") };
        let csv = out.join(format!("{name}.csv"));
        // The GPU's clocks and caches are left as they are: no locking to base clocks, no
        // flush between kernels, so each kernel runs as it does in a real step.
        let mut command = Command::new(&ncu);
        command
            .args(["--profile-from-start", "off", "--clock-control", "none", "--cache-control", "none"])
            .args(["--metrics", "gpu__time_duration.sum", "--csv", "--print-units", "base"])
            .args(["--print-kernel-base", "function", "--log-file"])
            .arg(&csv)
            .arg(bench)
            .args(["profile", "--chapter", &chapter, "--steps", &PROFILE_STEPS.to_string()])
            .args(["--batch", &batch.to_string()])
            .arg("--model")
            .arg(model)
            .arg("--workloads")
            .arg(workloads);
        run_logged(&mut command)?;
        let kernels = bench_report::parse_ncu_csv(&std::fs::read_to_string(&csv)?)?;
        let profile = bench_report::Profile { system: chapter.clone(), steps: PROFILE_STEPS, batch, kernels };
        std::fs::write(out.join(format!("{name}.json")), serde_json::to_string_pretty(&profile)? + "\n")?;
        let count = profile.kernels.len();
        println!("bench: {count} kernels profiled over {PROFILE_STEPS} decode steps of {chapter}, batch {batch}");
    }
    Ok(())
}

/// `hf_bench.py` in one mode, writing `MODE.json` (`transformers-MODE.json` for generate's
/// modes); with a cap, stopped when it runs out, keeping what it wrote.
fn transformers(model: &Path, workloads: &Path, out: &Path, mode: &str, cap: Option<Duration>) -> Result<()> {
    let torch = Command::new("python3").args(["-c", "import torch, transformers"]).output();
    if !torch.is_ok_and(|o| o.status.success()) {
        println!("bench: {mode} SKIPPED: python3 with torch and transformers not found");
        return Ok(());
    }
    let name = if mode == "graph" { "torch-gemv-graph".to_string() } else { format!("transformers-{mode}") };
    let log = out.join(format!("{name}.log"));
    let script = paths::root()?.join("shared/bench/python/hf_bench.py");
    let mut command = Command::new("python3");
    command
        .arg(script)
        .arg("--model")
        .arg(model)
        .arg("--workloads")
        .arg(workloads)
        .args(["--mode", mode, "--out"])
        .arg(out.join(format!("{name}.json")))
        .stderr(std::fs::File::create(&log)?);
    println!("bench: {command:?} (its stderr in {})", log.display());
    let mut child = command.stdout(Stdio::inherit()).spawn().context("cannot start python3")?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            if !status.success() {
                println!("bench: {name} exited with {status}; what it measured is kept (see {})", log.display());
            }
            return Ok(());
        }
        if cap.is_some_and(|cap| started.elapsed() > cap) {
            child.kill()?;
            child.wait()?;
            println!(
                "bench: {name} stopped after {} s, its cap; what it measured is kept",
                started.elapsed().as_secs()
            );
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs a command with its output shown; a failure is an error.
fn run_logged(command: &mut Command) -> Result<()> {
    println!("bench: {command:?}");
    let status = command.status().with_context(|| format!("cannot run {command:?}"))?;
    ensure!(status.success(), "{command:?} failed with {status}");
    Ok(())
}

fn commit(args: &Args, bin_dir: &Path) -> Result<String> {
    if let Some(commit) = &args.commit {
        return Ok(commit.clone());
    }
    if let Ok(text) = std::fs::read_to_string(bin_dir.join("../COMMIT")) {
        return Ok(text.trim().to_string());
    }
    let output = Command::new("git").args(["rev-parse", "HEAD"]).current_dir(paths::root()?).output();
    match output {
        Ok(output) if output.status.success() => Ok(String::from_utf8_lossy(&output.stdout).trim().to_string()),
        _ => bail!("no commit known: pass --commit, or run from a git checkout or a `cargo x pack` folder"),
    }
}

/// The NVIDIA driver's version, as nvidia-smi reports it (the CUDA API version is in each part).
fn driver_version() -> String {
    let output = Command::new("nvidia-smi").args(["--query-gpu=driver_version", "--format=csv,noheader"]).output();
    match output {
        Ok(output) if output.status.success() => {
            String::from_utf8_lossy(&output.stdout).lines().next().unwrap_or("unknown").trim().to_string()
        }
        _ => "unknown (no nvidia-smi)".to_string(),
    }
}
