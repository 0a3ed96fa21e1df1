//! `cargo x diffs`: one unified diff per chapter against the chapter before it, written to
//! `book/src/diffs/NN-slug.diff`. These show each chapter's lesson, so they leave out
//! build output and the `ANCHOR` marker lines that only exist for the book, and they show
//! the kernel files (`kernels/*.cu`) a chapter newly includes as added files.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use similar::TextDiff;

use crate::paths;

/// Files above this size are summarised rather than diffed line by line.
const LARGEST_DIFFED_FILE: u64 = 200_000;

pub fn run() -> Result<()> {
    let dir = paths::root().join("book/src/diffs");
    std::fs::create_dir_all(&dir)?;
    for (name, text) in all()? {
        std::fs::write(dir.join(format!("{name}.diff")), text)?;
        println!("wrote book/src/diffs/{name}.diff");
    }
    Ok(())
}

/// Every chapter's diff against its predecessor: `(chapter folder name, diff text)`.
pub fn all() -> Result<Vec<(String, String)>> {
    let chapters = paths::chapters()?;
    chapters
        .windows(2)
        .map(|pair| {
            let ((old_name, old_dir), (new_name, new_dir)) = (&pair[0], &pair[1]);
            Ok((new_name.clone(), chapter_diff(old_name, old_dir, new_name, new_dir)?))
        })
        .collect()
}

fn chapter_diff(old_name: &str, old_dir: &Path, new_name: &str, new_dir: &Path) -> Result<String> {
    let files: BTreeSet<PathBuf> = source_files(old_dir)?.into_iter().chain(source_files(new_dir)?).collect();
    let mut out = String::new();
    for file in files {
        let (old_path, new_path) = (old_dir.join(&file), new_dir.join(&file));
        let old_label = labelled(old_name, &file, old_path.exists());
        let new_label = labelled(new_name, &file, new_path.exists());
        if is_large_or_binary(&old_path) || is_large_or_binary(&new_path) {
            if std::fs::read(&old_path).ok() != std::fs::read(&new_path).ok() {
                out.push_str(&format!("Large or binary files {old_label} and {new_label} differ\n"));
            }
            continue;
        }
        let (old, new) = (without_anchors(&old_path)?, without_anchors(&new_path)?);
        if old != new {
            let diff = TextDiff::from_lines(&old, &new);
            out.push_str(&diff.unified_diff().context_radius(3).header(&old_label, &new_label).to_string());
        }
    }
    let kernels = paths::root().join("kernels");
    for kernel in included_kernels(new_dir)?.difference(&included_kernels(old_dir)?) {
        let text = without_anchors(&kernels.join(kernel))?;
        let diff = TextDiff::from_lines("", &text);
        out.push_str(
            &diff.unified_diff().context_radius(3).header("/dev/null", &format!("kernels/{kernel}")).to_string(),
        );
    }
    Ok(out)
}

/// The kernel files a chapter's code includes: the `NAME.cu` of every
/// `include_str!("…/kernels/NAME.cu")` in its sources.
fn included_kernels(dir: &Path) -> Result<BTreeSet<String>> {
    let mut kernels = BTreeSet::new();
    for file in source_files(dir)?.into_iter().filter(|f| f.extension().is_some_and(|e| e == "rs")) {
        let text = std::fs::read_to_string(dir.join(&file))?;
        for include in text.split("include_str!(\"").skip(1) {
            let Some((path, _)) = include.split_once('"') else { continue };
            if let Some((_, name)) = path.rsplit_once("kernels/") {
                kernels.insert(name.to_string());
            }
        }
    }
    Ok(kernels)
}

fn labelled(chapter: &str, file: &Path, exists: bool) -> String {
    if exists { format!("{chapter}/{}", file.display()) } else { "/dev/null".to_string() }
}

/// Paths of every file under `dir`, relative to it, except build output.
fn source_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        for entry in std::fs::read_dir(dir.join(&relative)).with_context(|| format!("reading {}", dir.display()))? {
            let entry = entry?;
            let path = relative.join(entry.file_name());
            if entry.file_type()?.is_dir() {
                if entry.file_name() != "target" {
                    pending.push(path);
                }
            } else {
                files.push(path);
            }
        }
    }
    Ok(files)
}

fn is_large_or_binary(path: &Path) -> bool {
    match std::fs::read(path) {
        Ok(bytes) => bytes.len() as u64 > LARGEST_DIFFED_FILE || std::str::from_utf8(&bytes).is_err(),
        Err(_) => false,
    }
}

/// The file's text without lines that hold only an `ANCHOR:`/`ANCHOR_END:` marker.
fn without_anchors(path: &Path) -> Result<String> {
    if !path.exists() {
        return Ok(String::new());
    }
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text.lines().filter(|line| !is_anchor_line(line)).map(|line| format!("{line}\n")).collect())
}

pub fn is_anchor_line(line: &str) -> bool {
    let trimmed = line.trim_start();
    let marker = trimmed.trim_start_matches("//").trim_start_matches('#').trim_start_matches("<!--").trim();
    marker.starts_with("ANCHOR:") || marker.starts_with("ANCHOR_END:")
}

#[cfg(test)]
mod tests {
    use super::{included_kernels, is_anchor_line};

    #[test]
    fn finds_the_kernels_a_chapter_includes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("src")).unwrap();
        let source = "let a = include_str!(\"../../../kernels/rmsnorm.cu\");\nlet b = include_str!(\"notes.txt\");\n\
                      let c = compile(\"rope.cu\", include_str!(\"../../../kernels/rope.cu\"))?;\n";
        std::fs::write(dir.path().join("src/gpu.rs"), source).unwrap();
        std::fs::write(dir.path().join("src/notes.txt"), "include_str!(\"../kernels/not_rust.cu\")").unwrap();
        let found: Vec<String> = included_kernels(dir.path()).unwrap().into_iter().collect();
        assert_eq!(found, ["rmsnorm.cu", "rope.cu"]);
    }

    #[test]
    fn anchor_lines_are_recognised() {
        assert!(is_anchor_line("    // ANCHOR: upload"));
        assert!(is_anchor_line("// ANCHOR_END: upload"));
        assert!(is_anchor_line("# ANCHOR: toml"));
        assert!(!is_anchor_line("let anchor = 1; // ANCHOR: not alone"));
        assert!(!is_anchor_line("fn anchor() {}"));
    }
}
