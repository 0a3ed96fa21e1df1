//! `cargo x test`: the one command that passes the project's tests on a fresh machine.
//!
//! It first installs what is missing (into the git-ignored `.cache/`): mdBook and
//! mdbook-katex, Meta's tokenizer, and libnvrtc plus the CUDA headers from PyPI. Then it
//! runs, in order: rustfmt, clippy, every crate's tests, `cargo x check`, `cargo x nvrtc`
//! and the book build. No GPU is needed; `cargo x gpu-check` covers the GPU.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, ensure};

use crate::{check, fetch_tokenizer, nvrtc, paths};

const MDBOOK: &str = "mdbook@0.5.4";
const MDBOOK_KATEX: &str = "mdbook-katex@0.10.0";
const PIP_CUDA: [&str; 2] = ["nvidia-cuda-nvrtc==13.0.*", "nvidia-cuda-runtime==13.0.*"];

pub fn run() -> Result<()> {
    let start = Instant::now();
    let mut times = Vec::new();
    let tools_bin = timed(&mut times, "install mdBook", install_book_tools)?;
    timed(&mut times, "fetch tokenizer", || fetch_tokenizer::run(fetch_tokenizer::Args::default_location()))?;
    timed(&mut times, "install CUDA headers", install_pip_cuda)?;

    timed(&mut times, "rustfmt", || step("rustfmt", cargo(&["fmt", "--all", "--check"])?))?;
    let clippy = cargo(&["clippy", "--workspace", "--all-targets", "--quiet", "--", "-D", "warnings"])?;
    timed(&mut times, "clippy", || step("clippy", clippy))?;
    // Before the tests: building them rebuilds target/debug/xtask (the workspace's features
    // differ from ours), and `nvrtc` may start this very binary again by its path.
    timed(&mut times, "nvrtc", || {
        println!("== nvrtc");
        nvrtc::run()
    })?;
    timed(&mut times, "tests", || step("tests", cargo(&["test", "--workspace", "--quiet"])?))?;
    timed(&mut times, "check", || {
        println!("== check");
        check::run()
    })?;
    let mdbook = mdbook_command(&tools_bin, "build")?;
    timed(&mut times, "book", || {
        step("book", mdbook)?;
        let remote = check::built_book_is_offline()?;
        for load in &remote {
            eprintln!("check: {load}");
        }
        ensure!(remote.is_empty(), "the built book loads {} thing(s) over the network", remote.len());
        Ok(())
    })?;
    println!("cargo x test: all passed in {:.0} s", start.elapsed().as_secs_f64());
    for (name, seconds) in &times {
        println!("  {name:<22} {seconds:>6.1} s");
    }
    Ok(())
}

/// Runs one step and notes its wall time, for the summary at the end.
fn timed<T>(times: &mut Vec<(&'static str, f64)>, name: &'static str, work: impl FnOnce() -> Result<T>) -> Result<T> {
    let start = Instant::now();
    let result = work();
    times.push((name, start.elapsed().as_secs_f64()));
    result
}

fn cargo(args: &[&str]) -> Result<Command> {
    let mut command = Command::new(env!("CARGO"));
    command.args(args).current_dir(paths::root()?);
    Ok(command)
}

fn step(name: &str, mut command: Command) -> Result<()> {
    println!("== {name}");
    let status = command.status().with_context(|| format!("cannot start {name}"))?;
    ensure!(status.success(), "{name} failed");
    Ok(())
}

/// `mdbook ACTION book` from the repository root, with the pinned tools first on `PATH`
/// (mdBook runs mdbook-katex and `cargo x book-dedent` as preprocessors).
pub fn mdbook_command(tools_bin: &std::path::Path, action: &str) -> Result<Command> {
    let mut mdbook = Command::new(tools_bin.join("mdbook"));
    mdbook.args([action, "book"]).current_dir(paths::root()?).env("PATH", path_with(tools_bin));
    Ok(mdbook)
}

/// `PATH` with `dir` in front.
fn path_with(dir: &std::path::Path) -> String {
    format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default())
}

/// mdBook 0.5 and mdbook-katex, built once into `.cache/tools/bin` (about 6 minutes on
/// two cores) so that the book always builds with the versions it was written for.
pub fn install_book_tools() -> Result<PathBuf> {
    let bin = paths::cache()?.join("tools/bin");
    let cached = bin.join("mdbook").exists() && bin.join("mdbook-katex").exists();
    if !cached {
        println!("== installing {MDBOOK} and {MDBOOK_KATEX} into {}", bin.display());
        let root = paths::cache()?.join("tools");
        step(
            "cargo install",
            cargo(&["install", "--locked", "--quiet", "--root", &root.to_string_lossy(), MDBOOK, MDBOOK_KATEX])?,
        )?;
    }
    Ok(bin)
}

/// libnvrtc and the CUDA headers, from the PyPI packages NVIDIA publishes, for `cargo x nvrtc`.
fn install_pip_cuda() -> Result<()> {
    let target = paths::cache()?.join("cuda");
    let installed = nvrtc::pip_cuda_dir()?;
    if installed.join("include/cuda_bf16.h").exists() && installed.join("lib/libnvrtc.so.13").exists() {
        return Ok(());
    }
    println!("== installing {} into {}", PIP_CUDA.join(" and "), target.display());
    let mut pip = Command::new(fetch_tokenizer::python());
    pip.args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target"])
        .arg(&target)
        .args(PIP_CUDA);
    step("pip install", pip)
}
