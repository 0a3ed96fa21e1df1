//! `cargo x book-dedent`: an mdBook preprocessor that takes the common indentation off every
//! Rust and C++ code block. mdBook's `{{#include file:anchor}}` keeps a method's indentation
//! inside its `impl`, so without this every included method would start four spaces in.
//!
//! mdBook runs it (see `book/book.toml`) after `links` has expanded the includes: first as
//! `book-dedent supports RENDERER`, then with `[context, book]` as JSON on stdin, expecting
//! the book back as JSON on stdout.

use std::io::Read;

use anyhow::{Context, Result};
use serde_json::Value;

/// Fence languages whose blocks are dedented. Diffs and program output keep their columns.
const DEDENTED: [&str; 2] = ["rust", "cpp"];

pub fn run(args: &[String]) -> Result<()> {
    if args.first().is_some_and(|a| a == "supports") {
        return Ok(()); // Every renderer: the change is to the Markdown.
    }
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).context("reading mdBook's input")?;
    let [_context, mut book]: [Value; 2] =
        serde_json::from_str(&input).context("mdBook's input is not [context, book]")?;
    dedent_chapters(&mut book);
    serde_json::to_writer(std::io::stdout(), &book)?;
    Ok(())
}

/// Every chapter's `content`, wherever it sits in the book's tree.
fn dedent_chapters(value: &mut Value) {
    match value {
        Value::Object(map) => {
            if map.contains_key("sub_items")
                && let Some(Value::String(content)) = map.get_mut("content")
            {
                *content = dedent_code_blocks(content);
            }
            map.values_mut().for_each(dedent_chapters);
        }
        Value::Array(items) => items.iter_mut().for_each(dedent_chapters),
        _ => {}
    }
}

/// The Markdown with each ```rust or ```cpp block's common leading spaces removed.
pub fn dedent_code_blocks(markdown: &str) -> String {
    let mut out = String::with_capacity(markdown.len());
    let mut lines = markdown.split_inclusive('\n');
    while let Some(line) = lines.next() {
        out.push_str(line);
        let Some((fence, language)) = opening_fence(line) else { continue };
        let mut block = Vec::new();
        let mut closing = None;
        for inner in lines.by_ref() {
            if inner.trim_end().starts_with(&fence) && inner.trim().chars().all(|c| c == '`') {
                closing = Some(inner);
                break;
            }
            block.push(inner);
        }
        let language = language.split(',').next().unwrap_or("");
        if DEDENTED.contains(&language) {
            out.push_str(&remove_common_indent(&block));
        } else {
            block.iter().for_each(|l| out.push_str(l));
        }
        out.push_str(closing.unwrap_or(""));
    }
    out
}

/// A line opening a fenced block at column 0: the fence (three or more backticks) and the
/// language after it.
fn opening_fence(line: &str) -> Option<(String, String)> {
    let fence: String = line.chars().take_while(|&c| c == '`').collect();
    (fence.len() >= 3).then(|| (fence.clone(), line[fence.len()..].trim().to_string()))
}

fn remove_common_indent(block: &[&str]) -> String {
    let indent = |l: &&str| l.len() - l.trim_start_matches(' ').len();
    let common = block.iter().filter(|l| !l.trim().is_empty()).map(indent).min().unwrap_or(0);
    block.iter().map(|l| if l.trim().is_empty() { l.trim_start_matches(' ') } else { &l[common..] }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_come_out_flush_left_and_other_blocks_keep_their_columns() {
        let page = "text\n```rust\n    /// doc\n    pub fn f() {\n\n        g();\n    }\n```\n\
                    ```diff\n  context\n  more\n```\n```text\n    output\n```\n````cpp\n  x;\n````\n";
        let expected = "text\n```rust\n/// doc\npub fn f() {\n\n    g();\n}\n```\n\
                        ```diff\n  context\n  more\n```\n```text\n    output\n```\n````cpp\nx;\n````\n";
        assert_eq!(dedent_code_blocks(page), expected);
    }

    #[test]
    fn finds_chapters_anywhere_in_the_book() {
        let mut book: Value = serde_json::json!({"items": [{"Chapter": {"name": "a",
            "content": "```rust\n  a();\n```\n", "sub_items": [{"Chapter": {"name": "b",
            "content": "```cpp\n    b;\n```\n", "sub_items": []}}]}}, "Separator"]});
        dedent_chapters(&mut book);
        assert_eq!(book["items"][0]["Chapter"]["content"], "```rust\na();\n```\n");
        assert_eq!(book["items"][0]["Chapter"]["sub_items"][0]["Chapter"]["content"], "```cpp\nb;\n```\n");
    }
}
