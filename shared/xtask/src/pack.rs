//! `cargo x pack`: everything a GPU session needs, built here and packed small enough to
//! travel to the GPU machine (which has no Rust and no network).
//!
//! It builds the release binaries, takes Meta's tokenizer and the current commit, and packs
//! them with `tar` and gzip into `.device/pack.tar.gz` (git-ignored once `.device/` is in
//! `.git/info/exclude`). On the GPU machine, in the repository's copy:
//!
//! ```text
//! tar xzf .device/pack.tar.gz -C .device && .device/bin/xtask gpu-check --bin-dir .device/bin --tokenizer .device/tokenizer.model
//! ```

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

use crate::{fetch_tokenizer, paths};

/// What the device tool carries at most, with room to spare for the repository itself.
const LIMIT_BYTES: u64 = 48 * 1024 * 1024;

pub fn run() -> Result<()> {
    let root = paths::root()?;
    let status = Command::new(env!("CARGO"))
        .args(["build", "--release", "--workspace", "--quiet"])
        .current_dir(&root)
        .status()
        .context("cannot run cargo build")?;
    ensure!(status.success(), "the release build failed");
    fetch_tokenizer::run(fetch_tokenizer::Args::default_location())?;

    let staging = root.join(".device/pack");
    if staging.exists() {
        std::fs::remove_dir_all(&staging)?;
    }
    std::fs::create_dir_all(staging.join("bin"))?;
    let mut binaries = vec!["xtask".to_string(), "bench".to_string()];
    binaries.extend(paths::chapters()?.iter().map(|(folder, _)| paths::package_name(folder)));
    for name in &binaries {
        let built = root.join("target/release").join(name);
        std::fs::copy(&built, staging.join("bin").join(name))
            .with_context(|| format!("cannot copy {} (did the build make it?)", built.display()))?;
    }
    std::fs::copy(paths::default_tokenizer()?, staging.join("tokenizer.model"))?;
    std::fs::write(staging.join("COMMIT"), format!("{}\n", commit(&root)?))?;

    let archive = root.join(".device/pack.tar.gz");
    let status = Command::new("tar")
        .arg("czf")
        .arg(&archive)
        .arg("-C")
        .arg(&staging)
        .args(["bin", "tokenizer.model", "COMMIT"])
        .status()
        .context("cannot run tar")?;
    ensure!(status.success(), "tar failed");
    std::fs::remove_dir_all(&staging)?;
    let size = std::fs::metadata(&archive)?.len();
    if size > LIMIT_BYTES {
        bail!(
            "{} is {} MiB, more than the {} MiB the device tool should carry",
            archive.display(),
            size >> 20,
            LIMIT_BYTES >> 20
        );
    }
    println!(
        "pack: {} binaries, the tokenizer and commit {} in {} ({:.1} MiB)",
        binaries.len(),
        commit(&root)?,
        archive.display(),
        size as f64 / (1024.0 * 1024.0)
    );
    Ok(())
}

/// The current commit, marked `-dirty` when the working tree has uncommitted changes
/// (the device copy has no git history to ask).
fn commit(root: &Path) -> Result<String> {
    let git = |args: &[&str]| -> Result<String> {
        let output = Command::new("git").args(args).current_dir(root).output().context("cannot run git")?;
        ensure!(output.status.success(), "git {} failed", args.join(" "));
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "HEAD"])?;
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"])?.is_empty();
    Ok(if dirty { format!("{head}-dirty") } else { head })
}
