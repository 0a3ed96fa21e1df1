//! What git knows about the work tree, and the files in it.
//!
//! The tooling asks git which files a chapter has instead of walking its folder, so that it
//! sees exactly the project's files: tracked ones, plus new ones not committed yet (a file
//! being written counts before its first commit), but never build output or anything else
//! `.gitignore` names. A stray `target/` or editor backup inside a chapter would otherwise
//! show up in its diff, its drift check and what `cargo x propagate` carries.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};

/// The files under `dir`, relative to it and sorted: tracked ones and untracked ones that are
/// not ignored. A tracked file deleted from the work tree is gone from the chapter, so it is left out.
pub fn listed_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let listing = git(dir, &["ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "."])?;
    let mut files: Vec<PathBuf> = paths_in(&listing)?.into_iter().filter(|file| dir.join(file).is_file()).collect();
    // An unmerged file is listed once per conflict stage.
    files.dedup();
    Ok(files)
}

/// The files under `dir`, relative to it and sorted, whose work-tree state differs from `HEAD`:
/// tracked files edited, deleted or newly added, and untracked files that are not ignored.
pub fn changed_since_head(dir: &Path) -> Result<Vec<PathBuf>> {
    let tracked = git(dir, &["diff", "HEAD", "--name-only", "--no-renames", "--relative", "-z", "--", "."])?;
    let untracked = git(dir, &["ls-files", "--others", "--exclude-standard", "-z", "--", "."])?;
    let mut files = paths_in(&tracked)?;
    files.extend(paths_in(&untracked)?);
    files.sort();
    files.dedup();
    Ok(files)
}

/// The contents of `file` (relative to `dir`) at `HEAD`, or `None` where `HEAD` has no such file.
pub fn at_head(dir: &Path, file: &Path) -> Result<Option<Vec<u8>>> {
    let object = format!("HEAD:./{}", file.display());
    let exists = Command::new("git").arg("-C").arg(dir).args(["cat-file", "-e", &object]).output()?.status.success();
    if !exists {
        return Ok(None);
    }
    Ok(Some(git(dir, &["cat-file", "blob", &object])?))
}

/// The contents of `file` (relative to `dir`) in the work tree, or `None` where there is no such file.
pub fn in_work_tree(dir: &Path, file: &Path) -> Result<Option<Vec<u8>>> {
    let path = dir.join(file);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err).with_context(|| format!("reading {}", path.display())),
    }
}

/// Runs `git -C dir ARGS…` and returns what it printed.
fn git(dir: &Path, args: &[&str]) -> Result<Vec<u8>> {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .with_context(|| format!("cannot run git in {}", dir.display()))?;
    ensure!(
        output.status.success(),
        "git {} in {} failed: {}",
        args.join(" "),
        dir.display(),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(output.stdout)
}

/// The paths in git's NUL-separated (`-z`) output, sorted.
fn paths_in(listing: &[u8]) -> Result<Vec<PathBuf>> {
    let mut paths = Vec::new();
    for path in listing.split(|&byte| byte == 0).filter(|path| !path.is_empty()) {
        let path = std::str::from_utf8(path).context("git listed a path that is not UTF-8")?;
        paths.push(PathBuf::from(path));
    }
    paths.sort();
    Ok(paths)
}

/// Test support: a fresh repository in `dir`, and commits of everything in it.
#[cfg(test)]
pub mod testing {
    use std::path::Path;

    pub fn init(dir: &Path) {
        super::git(dir, &["init", "--quiet"]).unwrap();
    }

    pub fn commit_all(dir: &Path) {
        super::git(dir, &["add", "--all"]).unwrap();
        let identity = ["-c", "user.name=xtask", "-c", "user.email=xtask@example.com", "-c", "commit.gpgsign=false"];
        let commit = ["commit", "--quiet", "--allow-empty", "-m", "test"];
        super::git(dir, &[&identity[..], &commit[..]].concat()).unwrap();
    }

    /// Writes `text` to `dir/file`, making folders as needed.
    pub fn write(dir: &Path, file: &str, text: &str) {
        let path = dir.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::testing::{commit_all, init, write};
    use super::*;

    fn paths(names: &[&str]) -> Vec<PathBuf> {
        names.iter().map(PathBuf::from).collect()
    }

    #[test]
    fn lists_tracked_and_new_files_but_not_ignored_or_deleted_ones() {
        let repo = tempfile::tempdir().unwrap();
        init(repo.path());
        write(repo.path(), ".gitignore", "target/\n");
        write(repo.path(), "ch/src/main.rs", "fn main() {}\n");
        write(repo.path(), "ch/src/gone.rs", "\n");
        write(repo.path(), "other/file.rs", "\n");
        commit_all(repo.path());
        write(repo.path(), "ch/src/new.rs", "\n");
        write(repo.path(), "ch/target/debug/out", "build output\n");
        std::fs::remove_file(repo.path().join("ch/src/gone.rs")).unwrap();

        let files = listed_files(&repo.path().join("ch")).unwrap();
        assert_eq!(files, paths(&["src/main.rs", "src/new.rs"]));
    }

    #[test]
    fn finds_what_changed_since_head_and_reads_head() {
        let repo = tempfile::tempdir().unwrap();
        init(repo.path());
        write(repo.path(), "ch/a.rs", "a\n");
        write(repo.path(), "ch/b.rs", "b\n");
        write(repo.path(), "ch/c.rs", "c\n");
        write(repo.path(), "elsewhere.rs", "x\n");
        commit_all(repo.path());
        write(repo.path(), "ch/a.rs", "a, edited\n");
        std::fs::remove_file(repo.path().join("ch/b.rs")).unwrap();
        write(repo.path(), "ch/sub/new.rs", "new\n");
        write(repo.path(), "elsewhere.rs", "edited too, but outside\n");

        let dir = repo.path().join("ch");
        assert_eq!(changed_since_head(&dir).unwrap(), paths(&["a.rs", "b.rs", "sub/new.rs"]));
        assert_eq!(at_head(&dir, Path::new("a.rs")).unwrap().as_deref(), Some(&b"a\n"[..]));
        assert_eq!(at_head(&dir, Path::new("b.rs")).unwrap().as_deref(), Some(&b"b\n"[..]));
        assert_eq!(at_head(&dir, Path::new("sub/new.rs")).unwrap(), None);
    }
}
