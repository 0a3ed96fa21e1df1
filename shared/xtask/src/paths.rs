//! Where things live in the repository, and the tools the project installs for itself.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

/// The checkout we work on: the nearest folder at or above the current one that holds both
/// `chapters/` and `models/` (the chapters find their default paths the same way). Run
/// anywhere else, `cargo x` refuses rather than quietly working on some other checkout.
pub fn root() -> Result<PathBuf> {
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    match cwd.ancestors().find(|dir| dir.join("chapters").is_dir() && dir.join("models").is_dir()) {
        Some(root) => Ok(root.to_path_buf()),
        None => bail!(
            "{} is not inside a checkout of Inference from Scratch (no folder at or above it holds \
             chapters/ and models/); run cargo x from the repository",
            cwd.display()
        ),
    }
}

/// Git-ignored folder for what `cargo x test` installs: tools, CUDA headers and libraries.
pub fn cache() -> Result<PathBuf> {
    Ok(root()?.join(".cache"))
}

/// Where `cargo x fetch-tokenizer` puts Meta's `tokenizer.model`; chapters look here last.
pub fn default_tokenizer() -> Result<PathBuf> {
    Ok(root()?.join("models/tokenizer.model"))
}

/// The chapter crates, in order: `(folder name, path)`, e.g. `("01-weights", …/chapters/01-weights)`.
pub fn chapters() -> Result<Vec<(String, PathBuf)>> {
    let mut chapters = Vec::new();
    for entry in std::fs::read_dir(root()?.join("chapters"))? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            chapters.push((entry.file_name().to_string_lossy().into_owned(), entry.path()));
        }
    }
    chapters.sort();
    Ok(chapters)
}

/// `01-weights` → `ch01-weights`: a chapter's package and binary name.
pub fn package_name(folder: &str) -> String {
    format!("ch{folder}")
}
