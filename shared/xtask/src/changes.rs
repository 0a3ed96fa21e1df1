//! Which files each chapter changes: what it declares, what actually differs, and
//! `cargo x changes`, which prints the actual lists.
//!
//! A chapter is a full copy of the one before it (DESIGN.md, "Chapters are full copies"), so a
//! file it does not teach must stay byte for byte the previous chapter's. To make that
//! checkable, each chapter after the first names the files it changes in its `Cargo.toml`:
//!
//! ```toml
//! [package.metadata.chapter]
//! # Files added, changed or removed relative to the previous chapter (paths relative to this crate).
//! changes = ["src/model.rs", "src/main.rs", "tests/cli.rs"]
//! ```
//!
//! `cargo x check` compares the list with the files that actually differ: a difference not
//! declared is drift (a fix that reached one chapter but not the next, or a drive-by edit), and
//! a declared file that does not differ is a stale list. `Cargo.toml` itself always differs
//! (the package name at least), so it is never listed. `cargo x changes` prints each chapter's
//! actual list in the form above, for pasting into a `Cargo.toml` once the diff is what the
//! chapter should teach.

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result};
use serde::Deserialize;

use crate::{git, paths};

/// The one file every chapter changes, left out of the lists.
pub const MANIFEST: &str = "Cargo.toml";

/// Lists that fit on one line of this width are printed on one line, longer ones one file a line.
const WIDEST_LIST_LINE: usize = 120;

pub fn run() -> Result<()> {
    let chapters = paths::chapters()?;
    for pair in chapters.windows(2) {
        let ((_, old_dir), (new_name, new_dir)) = (&pair[0], &pair[1]);
        println!("# chapters/{new_name}/{MANIFEST}\n{}", metadata_table(&actual(old_dir, new_dir)?));
    }
    Ok(())
}

/// The files, relative to the chapter folders, that were added, changed or removed going from
/// `old_dir` to `new_dir`, compared byte for byte; [`MANIFEST`] is left out.
pub fn actual(old_dir: &Path, new_dir: &Path) -> Result<BTreeSet<String>> {
    let files: BTreeSet<_> = git::listed_files(old_dir)?.into_iter().chain(git::listed_files(new_dir)?).collect();
    let mut changed = BTreeSet::new();
    for file in files.into_iter().filter(|file| file != Path::new(MANIFEST)) {
        if git::in_work_tree(old_dir, &file)? != git::in_work_tree(new_dir, &file)? {
            changed.insert(file.display().to_string());
        }
    }
    Ok(changed)
}

/// The `changes` list in `dir/Cargo.toml`, or `None` when it has no `[package.metadata.chapter]` table.
pub fn declared(dir: &Path) -> Result<Option<BTreeSet<String>>> {
    #[derive(Deserialize)]
    struct Manifest {
        package: Package,
    }
    #[derive(Deserialize)]
    struct Package {
        #[serde(default)]
        metadata: Metadata,
    }
    #[derive(Deserialize, Default)]
    struct Metadata {
        chapter: Option<Chapter>,
    }
    #[derive(Deserialize)]
    struct Chapter {
        changes: BTreeSet<String>,
    }

    let path = dir.join(MANIFEST);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let manifest: Manifest = toml::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
    Ok(manifest.package.metadata.chapter.map(|chapter| chapter.changes))
}

/// The `[package.metadata.chapter]` table declaring `files`, as it belongs in a `Cargo.toml`.
fn metadata_table(files: &BTreeSet<String>) -> String {
    let quoted: Vec<String> = files.iter().map(|file| format!("{file:?}")).collect();
    let one_line = format!("changes = [{}]", quoted.join(", "));
    let list = if one_line.len() <= WIDEST_LIST_LINE {
        one_line
    } else {
        format!("changes = [\n{}]", quoted.iter().map(|file| format!("    {file},\n")).collect::<String>())
    };
    format!(
        "[package.metadata.chapter]\n\
         # Files added, changed or removed relative to the previous chapter (paths relative to this crate).\n\
         {list}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::git::testing::{init, write};

    #[test]
    fn finds_added_changed_and_removed_files_but_not_the_manifest() {
        let repo = tempfile::tempdir().unwrap();
        init(repo.path());
        let (old, new) = (repo.path().join("01-a"), repo.path().join("02-b"));
        write(&old, "Cargo.toml", "[package]\nname = \"ch01-a\"\n");
        write(&new, "Cargo.toml", "[package]\nname = \"ch02-b\"\n");
        for dir in [&old, &new] {
            write(dir, "src/same.rs", "same\n");
        }
        write(&old, "src/main.rs", "fn main() {}\n");
        write(&new, "src/main.rs", "fn main() { run() }\n");
        write(&old, "src/removed.rs", "\n");
        write(&new, "src/tokenizer/added.rs", "\n");

        let changed: Vec<String> = actual(&old, &new).unwrap().into_iter().collect();
        assert_eq!(changed, ["src/main.rs", "src/removed.rs", "src/tokenizer/added.rs"]);
    }

    #[test]
    fn reads_the_declared_changes() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "Cargo.toml", "[package]\nname = \"ch01-a\"\n");
        assert_eq!(declared(dir.path()).unwrap(), None);

        let table = metadata_table(&["src/main.rs".to_string(), "tests/cli.rs".to_string()].into());
        write(dir.path(), "Cargo.toml", &format!("[package]\nname = \"ch02-b\"\n\n{table}\n[dependencies]\n"));
        let listed: Vec<String> = declared(dir.path()).unwrap().unwrap().into_iter().collect();
        assert_eq!(listed, ["src/main.rs", "tests/cli.rs"]);

        write(dir.path(), "Cargo.toml", "[package]\nname = \"ch02-b\"\n[package.metadata.chapter]\nchanges = \"x\"\n");
        assert!(declared(dir.path()).is_err());
    }

    #[test]
    fn prints_short_lists_on_one_line_and_long_ones_a_file_a_line() {
        let short = metadata_table(&["src/main.rs".to_string()].into());
        assert!(short.ends_with("\nchanges = [\"src/main.rs\"]\n"), "{short}");
        let many: BTreeSet<String> = (0..10).map(|i| format!("src/module_{i}.rs")).collect();
        let long = metadata_table(&many);
        assert!(long.contains("\nchanges = [\n    \"src/module_0.rs\",\n"), "{long}");
        assert!(long.ends_with("    \"src/module_9.rs\",\n]\n"), "{long}");
        let parsed: toml::Table = toml::from_str(&long).unwrap();
        assert_eq!(parsed["package"]["metadata"]["chapter"]["changes"].as_array().unwrap().len(), 10);
    }
}
