//! `cargo x check`: the repository's own consistency rules.
//! - workspace members are exactly the crate folders on disk;
//! - each chapter after the first declares exactly the files it changes relative to the chapter
//!   before it, so that drift between the copies shows (see [`changes`]);
//! - every committed chapter diff, `.diff` and `.md`, equals what `cargo x diffs` writes now;
//! - every `{{#include file:anchor}}` in the book resolves to non-empty text
//!   (mdBook silently renders an empty block for a missing anchor);
//! - the built book (when built: `cargo x test` builds it, then checks it again) loads
//!   nothing over the network (see [`offline`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};

use crate::{changes, diffs, offline, paths};

pub fn run() -> Result<()> {
    let mut problems = Vec::new();
    problems.extend(workspace_members_match_folders()?);
    problems.extend(chapters_declare_their_changes(&paths::chapters()?)?);
    problems.extend(diffs_are_fresh()?);
    problems.extend(book_includes_resolve()?);
    problems.extend(built_book_is_offline()?);
    if !problems.is_empty() {
        for problem in &problems {
            eprintln!("check: {problem}");
        }
        bail!("{} problem(s) found", problems.len());
    }
    println!("check: workspace members, chapter changes, chapter diffs and book includes are consistent");
    Ok(())
}

/// The built book's remote loads, if it has been built (`book/book/`).
pub fn built_book_is_offline() -> Result<Vec<String>> {
    let built = paths::root()?.join("book/book");
    if !built.join("index.html").exists() {
        return Ok(Vec::new());
    }
    let loads = offline::remote_loads(&built)?;
    Ok(loads.into_iter().map(|load| format!("book/book/{load}: the book must work offline")).collect())
}

fn workspace_members_match_folders() -> Result<Vec<String>> {
    let root = paths::root()?;
    let output = Command::new(env!("CARGO"))
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(&root)
        .output()
        .context("running cargo metadata")?;
    ensure!(output.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&output.stderr));
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let members: BTreeSet<PathBuf> = metadata["packages"]
        .as_array()
        .context("cargo metadata has no packages")?
        .iter()
        .filter_map(|p| p["manifest_path"].as_str())
        .map(|manifest| Path::new(manifest).parent().unwrap().to_path_buf())
        .collect();

    let mut problems = Vec::new();
    let mut folders = BTreeSet::new();
    for (name, dir) in paths::chapters()? {
        let well_named = name.len() > 3 && name[..2].chars().all(|c| c.is_ascii_digit()) && &name[2..3] == "-";
        if !well_named {
            problems.push(format!("chapters/{name} is not named NN-slug"));
        }
        let manifest = dir.join("Cargo.toml");
        match std::fs::read_to_string(&manifest) {
            Ok(text) if !text.contains(&format!("name = \"{}\"", paths::package_name(&name))) => problems
                .push(format!("chapters/{name}/Cargo.toml must name its package {}", paths::package_name(&name))),
            Err(_) => problems.push(format!("chapters/{name} has no Cargo.toml")),
            Ok(_) => {}
        }
        folders.insert(dir.canonicalize()?);
    }
    for shared in ["shared/bench", "shared/reference", "shared/xtask"] {
        folders.insert(root.join(shared).canonicalize()?);
    }
    for missing in folders.difference(&members) {
        problems.push(format!("{} is not a workspace member", missing.display()));
    }
    for extra in members.difference(&folders) {
        problems.push(format!("workspace member {} is not a chapter or shared crate folder", extra.display()));
    }
    Ok(problems)
}

/// Each chapter after the first lists in its `Cargo.toml` exactly the files that differ from
/// the chapter before it: one problem per file differing undeclared, and per file declared but not differing.
fn chapters_declare_their_changes(chapters: &[(String, PathBuf)]) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for pair in chapters.windows(2) {
        let ((old_name, old_dir), (new_name, new_dir)) = (&pair[0], &pair[1]);
        let previous = old_name.split('-').next().unwrap_or(old_name);
        let declared = match changes::declared(new_dir) {
            Ok(Some(declared)) => declared,
            Ok(None) => {
                problems.push(format!(
                    "chapters/{new_name}/Cargo.toml has no [package.metadata.chapter] changes list: \
                     `cargo x changes` prints it"
                ));
                continue;
            }
            Err(err) => {
                problems.push(format!("{err:#}"));
                continue;
            }
        };
        let actual = changes::actual(old_dir, new_dir)?;
        for file in actual.difference(&declared) {
            problems.push(format!(
                "chapters/{new_name}/{file} differs from chapter {previous}'s copy but is not in \
                 [package.metadata.chapter] changes: declare it if this chapter teaches it; a fix belongs in the \
                 chapter that introduced the file, carried forward with `cargo x propagate`"
            ));
        }
        for file in declared.difference(&actual) {
            problems.push(if file == changes::MANIFEST {
                format!(
                    "chapters/{new_name}/Cargo.toml lists {file} in changes: it always differs, so it is never listed"
                )
            } else {
                format!("chapters/{new_name}/{file} is declared as changed but identical to chapter {previous}'s copy")
            });
        }
    }
    Ok(problems)
}

/// `book/src/diffs/` holds exactly what `cargo x diffs` writes now.
fn diffs_are_fresh() -> Result<Vec<String>> {
    diffs_folder_problems(&paths::root()?.join("book/src/diffs"), diffs::outputs()?)
}

/// How the diffs folder `dir` differs from holding exactly `expected`, `(file name, contents)`:
/// one problem per stale, missing or extra file.
fn diffs_folder_problems(dir: &Path, expected: Vec<(String, String)>) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let mut expected_files = BTreeSet::new();
    for (file, text) in expected {
        match std::fs::read_to_string(dir.join(&file)) {
            Ok(committed) if committed == text => {}
            Ok(_) => problems.push(format!("book/src/diffs/{file} is stale: run `cargo x diffs`")),
            Err(_) => problems.push(format!("book/src/diffs/{file} is missing: run `cargo x diffs`")),
        }
        expected_files.insert(file);
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries {
            let file = entry?.file_name().to_string_lossy().into_owned();
            if !expected_files.contains(&file) {
                problems.push(format!("book/src/diffs/{file} belongs to no chapter pair"));
            }
        }
    }
    problems.sort();
    Ok(problems)
}

fn book_includes_resolve() -> Result<Vec<String>> {
    let src = paths::root()?.join("book/src");
    let mut problems = Vec::new();
    for page in markdown_files(&src)? {
        let text = std::fs::read_to_string(&page)?;
        for include in includes(&text) {
            if let Err(problem) = resolve_include(page.parent().unwrap(), &include) {
                problems.push(format!("{}: {{{{#include {include}}}}}: {problem}", page.strip_prefix(&src)?.display()));
            }
        }
    }
    Ok(problems)
}

fn markdown_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            files.extend(markdown_files(&path)?);
        } else if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    Ok(files)
}

/// The arguments of every `{{#include …}}` directive in a page, except escaped ones
/// (`\{{#include …}}`, which mdBook shows as text).
fn includes(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{#include ") {
        let escaped = rest[..start].ends_with('\\');
        let after = &rest[start + "{{#include ".len()..];
        let Some(end) = after.find("}}") else { break };
        if !escaped {
            found.push(after[..end].trim().to_string());
        }
        rest = &after[end..];
    }
    found
}

/// Checks that `path[:anchor]` names an existing file and, with an anchor, non-empty text
/// between its `ANCHOR:` and `ANCHOR_END:` markers. (Line-range forms are checked for the file only.)
pub fn resolve_include(page_dir: &Path, include: &str) -> Result<String, String> {
    let (file, selector) = match include.split_once(':') {
        Some((file, selector)) => (file, Some(selector)),
        None => (include, None),
    };
    let path = page_dir.join(file);
    let text = std::fs::read_to_string(&path).map_err(|_| format!("{} does not exist", path.display()))?;
    let Some(anchor) = selector.filter(|s| !s.chars().next().is_some_and(|c| c.is_ascii_digit())) else {
        return Ok(text);
    };
    let mut inside = false;
    let mut body = String::new();
    let mut found = false;
    for line in text.lines() {
        let marker = line.trim_start().trim_start_matches("//").trim_start_matches('#').trim();
        if marker == format!("ANCHOR: {anchor}") {
            inside = true;
            found = true;
        } else if marker == format!("ANCHOR_END: {anchor}") {
            inside = false;
        } else if inside && !diffs::is_anchor_line(line) {
            body.push_str(line);
            body.push('\n');
        }
    }
    if !found {
        return Err(format!("anchor {anchor:?} not found in {file}"));
    }
    if body.trim().is_empty() {
        return Err(format!("anchor {anchor:?} in {file} is empty"));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_includes_and_resolves_anchors() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().to_path_buf();
        std::fs::write(
            dir.join("code.rs"),
            "a\n// ANCHOR: x\nfn x() {}\n// ANCHOR_END: x\n// ANCHOR: empty\n// ANCHOR_END: empty\n",
        )
        .unwrap();
        let page = "text {{#include code.rs:x}} more {{#include code.rs:missing}} {{#include code.rs:empty}}\n\
                    shown as text: \\{{#include code.rs:escaped}}";
        let found = includes(page);
        assert_eq!(found, vec!["code.rs:x", "code.rs:missing", "code.rs:empty"]);
        assert_eq!(resolve_include(&dir, "code.rs:x").unwrap(), "fn x() {}\n");
        assert!(resolve_include(&dir, "code.rs:missing").unwrap_err().contains("not found"));
        assert!(resolve_include(&dir, "code.rs:empty").unwrap_err().contains("empty"));
        assert!(resolve_include(&dir, "nope.rs").unwrap_err().contains("does not exist"));
        assert!(resolve_include(&dir, "code.rs:2:3").is_ok());
    }

    #[test]
    fn undeclared_and_unchanged_files_are_problems() {
        use crate::git::testing::{init, write};

        let repo = tempfile::tempdir().unwrap();
        init(repo.path());
        let chapters: Vec<(String, PathBuf)> =
            ["06-a", "07-b", "08-c"].iter().map(|name| (name.to_string(), repo.path().join(name))).collect();
        for (name, dir) in &chapters {
            write(dir, "src/config.rs", "same\n");
            write(dir, "src/main.rs", &format!("{name}\n"));
        }
        write(&chapters[0].1, "Cargo.toml", "[package]\nname = \"ch06-a\"\n");
        let table = "[package.metadata.chapter]\nchanges = [\"src/main.rs\", \"src/gone.rs\", \"Cargo.toml\"]\n";
        write(&chapters[1].1, "Cargo.toml", &format!("[package]\nname = \"ch07-b\"\n{table}"));
        write(&chapters[1].1, "src/config.rs", "drifted\n");
        write(&chapters[2].1, "Cargo.toml", "[package]\nname = \"ch08-c\"\n");

        let problems = chapters_declare_their_changes(&chapters).unwrap();
        assert_eq!(
            problems,
            [
                "chapters/07-b/src/config.rs differs from chapter 06's copy but is not in [package.metadata.chapter] \
                 changes: declare it if this chapter teaches it; a fix belongs in the chapter that introduced the \
                 file, carried forward with `cargo x propagate`",
                "chapters/07-b/Cargo.toml lists Cargo.toml in changes: it always differs, so it is never listed",
                "chapters/07-b/src/gone.rs is declared as changed but identical to chapter 06's copy",
                "chapters/08-c/Cargo.toml has no [package.metadata.chapter] changes list: `cargo x changes` prints it",
            ]
        );
    }

    #[test]
    fn stale_missing_and_extra_diff_files_are_problems() {
        let dir = tempfile::tempdir().unwrap();
        for (file, text) in [("02-b.diff", "fresh"), ("02-b.md", "old"), ("01-a.md", "orphan")] {
            std::fs::write(dir.path().join(file), text).unwrap();
        }
        let expected = ["02-b.diff", "02-b.md", "03-c.diff"].map(|file| (file.to_string(), "fresh".to_string()));
        assert_eq!(
            diffs_folder_problems(dir.path(), expected.to_vec()).unwrap(),
            [
                "book/src/diffs/01-a.md belongs to no chapter pair",
                "book/src/diffs/02-b.md is stale: run `cargo x diffs`",
                "book/src/diffs/03-c.diff is missing: run `cargo x diffs`",
            ]
        );
    }
}
