//! `cargo x propagate N [--dry-run]`: carry a fix made in chapter N into every later chapter.
//!
//! Chapters are full copies (DESIGN.md, "Chapters are full copies"), so a bug fixed in chapter
//! N is usually still there, often byte for byte, in every chapter after it, and must be fixed
//! there too. Make the fix in chapter N's folder without committing it, then run this. It takes
//! each file of chapter N whose work-tree state differs from git `HEAD` (edited, new or deleted)
//! and, for each later chapter in turn, that chapter's copy of the file:
//! - **copied**: the copy is what chapter N's file was at `HEAD`, so it becomes chapter N's new
//!   file (or is **removed**, if chapter N deleted it);
//! - **patched**: the copy differs, but chapter N's change applies to it as a patch whose
//!   context lines match exactly, though they may have moved;
//! - **the fix does not apply; carry it by hand**: the copy was left alone;
//! - **already carried**: the copy already is chapter N's new file, or already has chapter N's
//!   change (undoing it applies as a patch), as after an earlier run;
//! - **absent**: the chapter has no such file.
//!
//! Every later chapter is tried on its own: a chapter that rewrote the code in between does not
//! keep the fix from the chapters after it whose copy is still the old one. Later chapters are
//! compared as they are in the work tree, not at `HEAD`, so running this twice does no harm
//! and their own uncommitted edits are patched, never overwritten (edits an earlier run carried
//! into chapter N itself count as chapter N's, and show as already carried). Kernels live outside the
//! chapters and are fixed in place, so there is nothing to carry for them.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, ensure};

use crate::{git, paths};

#[derive(clap::Args)]
pub struct Args {
    /// The chapter whose uncommitted edits to carry forward: its number (`6`, `06`) or folder name.
    chapter: String,
    /// Say what would happen to each later chapter's copy, but change nothing.
    #[arg(long)]
    dry_run: bool,
}

pub fn run(args: Args) -> Result<()> {
    let chapters = paths::chapters()?;
    let from = chapters
        .iter()
        .position(|(name, _)| names_chapter(name, &args.chapter))
        .with_context(|| format!("no chapter {} in chapters/", args.chapter))?;
    if args.dry_run {
        println!("dry run: nothing is written");
    }
    let carried = propagate(&chapters[from..], args.dry_run)?;
    if carried.is_empty() {
        println!("chapters/{} has no uncommitted changes to carry", chapters[from].0);
    }
    for line in &carried {
        println!("{line}");
    }
    let by_hand = carried.iter().filter(|line| line.outcome == Outcome::NotApplicable).count();
    ensure!(by_hand == 0, "{by_hand} file(s) to carry by hand");
    Ok(())
}

/// Whether `arg` names the chapter in folder `name`: the whole name, or its number.
fn names_chapter(name: &str, arg: &str) -> bool {
    let number = |folder: &str| folder.split('-').next()?.parse::<u32>().ok();
    name == arg || arg.parse::<u32>().is_ok_and(|n| number(name) == Some(n))
}

/// What happened to one later chapter's copy of one file.
#[derive(Debug)]
struct Carried {
    chapter: String,
    file: PathBuf,
    outcome: Outcome,
}

impl fmt::Display for Carried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chapter {}: {}: {}", self.chapter, self.file.display(), self.outcome.describe())
    }
}

/// What becomes of a later chapter's copy of a file that chapter N changed.
#[derive(Debug, PartialEq)]
enum Outcome {
    /// It was chapter N's old file, so it becomes chapter N's new one (`None`: it is removed).
    Copied(Option<Vec<u8>>),
    /// Chapter N's change applied to it as a patch, giving this.
    Patched(Vec<u8>),
    AlreadyCarried,
    NotApplicable,
    Absent,
}

impl Outcome {
    fn describe(&self) -> &'static str {
        match self {
            Outcome::Copied(Some(_)) => "copied",
            Outcome::Copied(None) => "removed",
            Outcome::Patched(_) => "patched",
            Outcome::AlreadyCarried => "already carried",
            Outcome::NotApplicable => "the fix does not apply; carry it by hand",
            Outcome::Absent => "absent",
        }
    }
}

/// Carries the uncommitted edits of `chapters[0]` into `chapters[1..]`, in order, writing
/// nothing on a dry run; one [`Carried`] per later chapter and changed file.
fn propagate(chapters: &[(String, PathBuf)], dry_run: bool) -> Result<Vec<Carried>> {
    let (_, from_dir) = &chapters[0];
    let mut carried = Vec::new();
    for file in git::changed_since_head(from_dir)? {
        let before = git::at_head(from_dir, &file)?;
        let after = git::in_work_tree(from_dir, &file)?;
        if before == after {
            continue; // only its mode changed, or it was staged and then restored
        }
        for (chapter, dir) in &chapters[1..] {
            let outcome = carry(before.as_deref(), after.as_deref(), git::in_work_tree(dir, &file)?.as_deref());
            if !dry_run {
                write(&dir.join(&file), &outcome)?;
            }
            carried.push(Carried { chapter: chapter.clone(), file: file.clone(), outcome });
        }
    }
    Ok(carried)
}

/// What chapter N's change of a file, `before` → `after`, does to a later chapter's `copy`
/// (`None`: no such file).
fn carry(before: Option<&[u8]>, after: Option<&[u8]>, copy: Option<&[u8]>) -> Outcome {
    if copy.is_none() && before.is_some() {
        return Outcome::Absent;
    }
    if copy == after {
        return Outcome::AlreadyCarried;
    }
    if copy == before {
        return Outcome::Copied(after.map(<[u8]>::to_vec));
    }
    let (Some(before), Some(after), Some(copy)) = (before, after, copy) else {
        // A new or deleted file: there is no common text to patch.
        return Outcome::NotApplicable;
    };
    if let Ok(patched) = diffy::apply_bytes(copy, &diffy::create_patch_bytes(before, after)) {
        return Outcome::Patched(patched);
    }
    // A copy patched by an earlier run: the change undoes cleanly, so it is there.
    match diffy::apply_bytes(copy, &diffy::create_patch_bytes(after, before)) {
        Ok(_) => Outcome::AlreadyCarried,
        Err(_) => Outcome::NotApplicable,
    }
}

/// Makes the copy at `path` what `outcome` says it becomes.
fn write(path: &Path, outcome: &Outcome) -> Result<()> {
    let written = match outcome {
        Outcome::Copied(Some(bytes)) | Outcome::Patched(bytes) => bytes,
        Outcome::Copied(None) => {
            return std::fs::remove_file(path).with_context(|| format!("removing {}", path.display()));
        }
        Outcome::AlreadyCarried | Outcome::NotApplicable | Outcome::Absent => return Ok(()),
    };
    std::fs::create_dir_all(path.parent().context("a chapter file has a folder")?)?;
    std::fs::write(path, written).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::git::testing::{commit_all, init, write as write_file};

    const OLD: &str = "fn a() {}\n\nfn b() {\n    let x = 1;\n    x + 1\n}\n\nfn c() {}\n";
    const FIXED: &str = "fn a() {}\n\nfn b() {\n    let x = 2;\n    x + 1\n}\n\nfn c() {}\n";

    fn outcome(before: Option<&str>, after: Option<&str>, copy: Option<&str>) -> Outcome {
        carry(before.map(str::as_bytes), after.map(str::as_bytes), copy.map(str::as_bytes))
    }

    #[test]
    fn decides_per_copy() {
        assert_eq!(outcome(Some(OLD), Some(FIXED), Some(OLD)), Outcome::Copied(Some(FIXED.into())));
        assert_eq!(outcome(Some(OLD), Some(FIXED), Some(FIXED)), Outcome::AlreadyCarried);
        assert_eq!(outcome(Some(OLD), Some(FIXED), None), Outcome::Absent);
        assert_eq!(outcome(Some(OLD), None, Some(OLD)), Outcome::Copied(None));
        assert_eq!(outcome(None, Some("new\n"), None), Outcome::Copied(Some("new\n".into())));
        assert_eq!(outcome(None, Some("new\n"), Some("other\n")), Outcome::NotApplicable);
        assert_eq!(outcome(Some(OLD), None, Some("other\n")), Outcome::NotApplicable);

        let moved = format!("use std::io;\n\n{OLD}fn d() {{}}\n");
        let patched = format!("use std::io;\n\n{FIXED}fn d() {{}}\n");
        assert_eq!(outcome(Some(OLD), Some(FIXED), Some(&moved)), Outcome::Patched(patched.clone().into()));
        assert_eq!(outcome(Some(OLD), Some(FIXED), Some(&patched)), Outcome::AlreadyCarried);
        let rewritten = OLD.replace("x + 1", "x * 3");
        assert_eq!(outcome(Some(OLD), Some(FIXED), Some(&rewritten)), Outcome::NotApplicable);
    }

    #[test]
    fn carries_uncommitted_edits_into_every_later_chapter() {
        let repo = tempfile::tempdir().unwrap();
        init(repo.path());
        let names = ["01-a", "02-b", "03-c", "04-d"];
        let chapters: Vec<(String, PathBuf)> =
            names.iter().map(|name| (name.to_string(), repo.path().join("chapters").join(name))).collect();
        let dir = |i: usize| &chapters[i].1;
        for (i, (name, dir)) in chapters.iter().enumerate() {
            write_file(dir, "Cargo.toml", &format!("[package]\nname = \"ch{name}\"\n"));
            write_file(dir, "src/ops.rs", OLD);
            if i < 3 {
                write_file(dir, "src/old.rs", "gone soon\n");
            }
        }
        write_file(dir(1), "src/ops.rs", &format!("{OLD}fn d() {{}}\n"));
        write_file(dir(2), "src/ops.rs", &OLD.replace("x + 1", "x * 3"));
        commit_all(repo.path());

        write_file(dir(0), "src/ops.rs", FIXED);
        write_file(dir(0), "src/new.rs", "new\n");
        std::fs::remove_file(dir(0).join("src/old.rs")).unwrap();

        let lines = |carried: Vec<Carried>| carried.iter().map(ToString::to_string).collect::<Vec<_>>();
        let expected = [
            "chapter 02-b: src/new.rs: copied",
            "chapter 03-c: src/new.rs: copied",
            "chapter 04-d: src/new.rs: copied",
            "chapter 02-b: src/old.rs: removed",
            "chapter 03-c: src/old.rs: removed",
            "chapter 04-d: src/old.rs: absent",
            "chapter 02-b: src/ops.rs: patched",
            "chapter 03-c: src/ops.rs: the fix does not apply; carry it by hand",
            "chapter 04-d: src/ops.rs: copied",
        ];
        assert_eq!(lines(propagate(&chapters, true).unwrap()), expected);
        assert!(!dir(1).join("src/new.rs").exists(), "a dry run writes nothing");

        assert_eq!(lines(propagate(&chapters, false).unwrap()), expected);
        let read = |i: usize, file: &str| std::fs::read_to_string(dir(i).join(file)).unwrap();
        assert_eq!(read(1, "src/ops.rs"), format!("{FIXED}fn d() {{}}\n"));
        assert_eq!(read(2, "src/ops.rs"), OLD.replace("x + 1", "x * 3"));
        assert_eq!(read(3, "src/ops.rs"), FIXED);
        assert_eq!(read(3, "src/new.rs"), "new\n");
        assert!(!dir(1).join("src/old.rs").exists() && !dir(2).join("src/old.rs").exists());

        let again = lines(propagate(&chapters, false).unwrap());
        assert_eq!(again[0], "chapter 02-b: src/new.rs: already carried");
        assert_eq!(again[3], "chapter 02-b: src/old.rs: absent");
        assert_eq!(again[6], "chapter 02-b: src/ops.rs: already carried");
        assert_eq!(again[7], "chapter 03-c: src/ops.rs: the fix does not apply; carry it by hand");
        assert_eq!(again[8], "chapter 04-d: src/ops.rs: already carried");
    }

    #[test]
    fn a_chapter_is_named_by_number_or_folder() {
        assert!(names_chapter("06-attention", "6"));
        assert!(names_chapter("06-attention", "06"));
        assert!(names_chapter("06-attention", "06-attention"));
        assert!(!names_chapter("06-attention", "7"));
        assert!(!names_chapter("06-attention", "attention"));
    }
}
