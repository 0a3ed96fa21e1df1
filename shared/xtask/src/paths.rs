//! Where things live in the repository, and the tools the project installs for itself.

use std::path::{Path, PathBuf};

/// The repository root: the nearest folder above the current one whose `Cargo.toml` is the
/// workspace's, else where this crate was built (`shared/xtask/../..`). Looking from the
/// current folder lets a copied xtask binary work in a checkout elsewhere (the GPU machine).
pub fn root() -> PathBuf {
    let from_cwd = std::env::current_dir().ok().and_then(|cwd| {
        cwd.ancestors()
            .find(|dir| std::fs::read_to_string(dir.join("Cargo.toml")).is_ok_and(|t| t.contains("[workspace]")))
            .map(Path::to_path_buf)
    });
    from_cwd.unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

/// Git-ignored folder for what `cargo x test` installs: tools, CUDA headers and libraries.
pub fn cache() -> PathBuf {
    root().join(".cache")
}

/// Where `cargo x fetch-tokenizer` puts Meta's `tokenizer.model`; chapters look here last.
pub fn default_tokenizer() -> PathBuf {
    root().join("models/tokenizer.model")
}

/// The chapter crates, in order: `(folder name, path)`, e.g. `("01-weights", …/chapters/01-weights)`.
pub fn chapters() -> anyhow::Result<Vec<(String, PathBuf)>> {
    let mut chapters = Vec::new();
    for entry in std::fs::read_dir(root().join("chapters"))? {
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
