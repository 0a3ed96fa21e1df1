//! The book's form of a chapter diff, `book/src/diffs/NN-slug.md`, which the chapter's page
//! includes under "What changed".
//!
//! A chapter's whole diff can run to a thousand lines, most of them tests, and those bury the
//! few lines the chapter teaches. So each file gets its own fenced `diff` block, and two kinds
//! of file are folded into a `<details>` block that the reader opens when they want it: tests
//! (files under `tests/`, or under a `tests/` folder inside `src/`) and any file whose diff is
//! longer than [`LONGEST_OPEN_DIFF`] lines. The others are shown open under a bold line naming
//! the file: bold rather than a heading, so that the files do not crowd the page's heading
//! navigation in the sidebar.
//!
//! A diff is code, not Markdown, so nothing in it may end its block early or reach mdBook as a
//! directive: each fence is longer than any run of backticks in its diff, and `{{#…}}` is
//! escaped the way mdBook expects (`\{{#…}}`), since mdBook expands directives in included
//! files too.

use super::FileDiff;

/// Diffs longer than this, in lines, are folded even when they are not tests.
const LONGEST_OPEN_DIFF: usize = 80;

/// The Markdown for a chapter's diff: one section per file, in the order given.
pub fn page(files: &[FileDiff]) -> String {
    files.iter().map(section).collect::<Vec<_>>().join("\n")
}

fn section(file: &FileDiff) -> String {
    let counts = format!("+{} −{} lines", file.added, file.removed);
    let block = fenced_diff(&file.text);
    if is_folded(file) {
        // The blank lines let mdBook read the block between the HTML tags as Markdown.
        format!(
            "<details><summary><code>{}</code>: {counts}</summary>\n\n{block}\n</details>\n",
            escape_html(&file.path)
        )
    } else {
        format!("**`{}`**: {counts}\n\n{block}", file.path)
    }
}

fn is_folded(file: &FileDiff) -> bool {
    is_test(&file.path) || file.text.lines().count() > LONGEST_OPEN_DIFF
}

/// Whether a chapter-relative path is a test: under `tests/`, or under `src/**/tests/`.
fn is_test(path: &str) -> bool {
    let mut parts: Vec<&str> = path.split('/').collect();
    parts.pop();
    match parts.as_slice() {
        ["tests", ..] => true,
        ["src", folders @ ..] => folders.contains(&"tests"),
        _ => false,
    }
}

/// `diff` in a fenced `diff` block whose fence no backtick run inside it can close.
fn fenced_diff(diff: &str) -> String {
    let fence = "`".repeat(longest_backtick_run(diff).max(2) + 1);
    let mut body: String = diff.split_inclusive('\n').map(escape_directive).collect();
    if !body.ends_with('\n') {
        body.push('\n');
    }
    format!("{fence}diff\n{body}{fence}\n")
}

fn longest_backtick_run(text: &str) -> usize {
    text.split(|c| c != '`').map(str::len).max().unwrap_or(0)
}

/// The line with its first `{{#` escaped if mdBook would read a directive there. mdBook's
/// escape `\{{#…}}` reaches to the line's last `}}`, so one backslash covers the whole line.
fn escape_directive(line: &str) -> String {
    match line.find("{{#") {
        Some(at) if line[at..].contains("}}") => format!("{}\\{}", &line[..at], &line[at..]),
        _ => line.to_string(),
    }
}

fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, text: &str) -> FileDiff {
        FileDiff { path: path.to_string(), text: text.to_string(), added: 2, removed: 1 }
    }

    #[test]
    fn tests_and_long_diffs_fold_and_the_rest_stays_open() {
        let short = "--- a/x\n+++ b/x\n@@ -1 +1,2 @@\n-a\n+b\n+c\n";
        let long: String = std::iter::once("@@ -1,0 +1,90 @@\n").chain(["+line\n"; 90]).collect();
        let page = page(&[file("src/model.rs", short), file("tests/cli.rs", short), file("src/big.rs", &long)]);

        let open = format!("**`src/model.rs`**: +2 −1 lines\n\n```diff\n{short}```\n");
        assert!(page.starts_with(&open), "{page}");
        let folded = format!(
            "<details><summary><code>tests/cli.rs</code>: +2 −1 lines</summary>\n\n```diff\n{short}```\n\n</details>\n"
        );
        assert!(page.contains(&folded), "{page}");
        assert!(page.contains("<details><summary><code>src/big.rs</code>: +2 −1 lines</summary>\n\n```diff\n@@"));
    }

    #[test]
    fn knows_which_paths_are_tests() {
        assert!(is_test("tests/cli.rs"));
        assert!(is_test("tests/fixtures/a.json"));
        assert!(is_test("src/tokenizer/tests/golden.rs"));
        assert!(is_test("src/tests/mod.rs"));
        assert!(!is_test("src/tests.rs"));
        assert!(!is_test("tests.rs"));
        assert!(!is_test("kernels/tests/x.cu"));
        assert!(!is_test("src/model.rs"));
    }

    #[test]
    fn content_cannot_close_the_fence() {
        let diff = "@@ -1 +1 @@\n-/// ```\n+/// ````text\n";
        let block = fenced_diff(diff);
        assert_eq!(block, format!("`````diff\n{diff}`````\n"));
        assert_eq!(fenced_diff("no newline"), "```diff\nno newline\n```\n");
    }

    #[test]
    fn directives_in_content_are_escaped() {
        let diff = "+see {{#include a.rs}} and {{#include b.rs}}\n+only {{#open\n+no directive\n";
        let block = fenced_diff(diff);
        assert!(block.contains("+see \\{{#include a.rs}} and {{#include b.rs}}\n"), "{block}");
        assert!(block.contains("+only {{#open\n+no directive\n"), "{block}");
    }

    #[test]
    fn summary_paths_are_html_escaped() {
        assert!(section(&file("tests/a<b>&.rs", "+x\n")).contains("<code>tests/a&lt;b&gt;&amp;.rs</code>"));
    }
}
