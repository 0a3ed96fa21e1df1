//! `cargo x diffs`: each chapter's diff against the chapter before it, in two forms.
//! - `book/src/diffs/NN-slug.diff`: the whole unified diff, one file after another;
//! - `book/src/diffs/NN-slug.md`: the same diff laid out for the chapter's book page, one
//!   fenced block per file, with tests and long diffs folded (see [`markdown`]).
//!
//! These show each chapter's lesson, so they leave out build output (only files git lists
//! count, see [`git::listed_files`]) and the `ANCHOR` marker lines that only exist for the
//! book, and they show the kernel files (`kernels/*.cu`) a chapter newly includes as added files.

mod markdown;

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result};
use similar::{ChangeTag, TextDiff};

use crate::{git, paths};

/// Files above this size are summarised rather than diffed line by line.
const LARGEST_DIFFED_FILE: u64 = 200_000;

pub fn run() -> Result<()> {
    let dir = paths::root()?.join("book/src/diffs");
    std::fs::create_dir_all(&dir)?;
    for (file, text) in outputs()? {
        std::fs::write(dir.join(&file), text)?;
        println!("wrote book/src/diffs/{file}");
    }
    Ok(())
}

/// Everything `book/src/diffs/` should hold, as `(file name, contents)`: for each chapter after
/// the first, `NN-slug.diff` and `NN-slug.md`.
pub fn outputs() -> Result<Vec<(String, String)>> {
    let chapters = paths::chapters()?;
    let mut outputs = Vec::new();
    for pair in chapters.windows(2) {
        let ((old_name, old_dir), (new_name, new_dir)) = (&pair[0], &pair[1]);
        let files = chapter_diff(old_name, old_dir, new_name, new_dir)?;
        outputs.push((format!("{new_name}.diff"), files.iter().map(|file| file.text.as_str()).collect()));
        outputs.push((format!("{new_name}.md"), markdown::page(&files)));
    }
    Ok(outputs)
}

/// One file's part of a chapter diff.
pub struct FileDiff {
    /// Where the file is, as the reader knows it: `src/model.rs`, `kernels/rope.cu`.
    pub path: String,
    /// Its unified diff with `---`/`+++` headers, or a one-line note for a large or binary file.
    pub text: String,
    /// Lines added.
    pub added: usize,
    /// Lines removed.
    pub removed: usize,
}

fn chapter_diff(old_name: &str, old_dir: &Path, new_name: &str, new_dir: &Path) -> Result<Vec<FileDiff>> {
    let files: BTreeSet<_> = git::listed_files(old_dir)?.into_iter().chain(git::listed_files(new_dir)?).collect();
    let mut diffs = Vec::new();
    for file in files {
        let (old_path, new_path) = (old_dir.join(&file), new_dir.join(&file));
        let old_label = labelled(old_name, &file, old_path.exists());
        let new_label = labelled(new_name, &file, new_path.exists());
        let path = file.display().to_string();
        if is_large_or_binary(&old_path) || is_large_or_binary(&new_path) {
            if std::fs::read(&old_path).ok() != std::fs::read(&new_path).ok() {
                let text = format!("Large or binary files {old_label} and {new_label} differ\n");
                diffs.push(FileDiff { path, text, added: 0, removed: 0 });
            }
            continue;
        }
        let (old, new) = (without_anchors(&old_path)?, without_anchors(&new_path)?);
        if old != new {
            diffs.push(file_diff(path, (&old_label, &old), (&new_label, &new)));
        }
    }
    let kernels = paths::root()?.join("kernels");
    for kernel in included_kernels(new_dir)?.difference(&included_kernels(old_dir)?) {
        let path = format!("kernels/{kernel}");
        let text = without_anchors(&kernels.join(kernel))?;
        diffs.push(file_diff(path.clone(), ("/dev/null", ""), (&path, &text)));
    }
    Ok(diffs)
}

/// The diff of one file's text, each side given as `(header label, text)`.
fn file_diff(path: String, (old_label, old): (&str, &str), (new_label, new): (&str, &str)) -> FileDiff {
    let diff = TextDiff::from_lines(old, new);
    let count = |tag| diff.iter_all_changes().filter(|change| change.tag() == tag).count();
    FileDiff {
        text: diff.unified_diff().context_radius(3).header(old_label, new_label).to_string(),
        added: count(ChangeTag::Insert),
        removed: count(ChangeTag::Delete),
        path,
    }
}

/// The kernel files a chapter's code includes: the `NAME.cu` of every
/// `include_str!("…/kernels/NAME.cu")` in its sources.
fn included_kernels(dir: &Path) -> Result<BTreeSet<String>> {
    let mut kernels = BTreeSet::new();
    for file in git::listed_files(dir)?.into_iter().filter(|f| f.extension().is_some_and(|e| e == "rs")) {
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
    use crate::git::testing;

    #[test]
    fn finds_the_kernels_a_chapter_includes() {
        let dir = tempfile::tempdir().unwrap();
        testing::init(dir.path());
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
