//! Cutting text into the pieces that byte-pair merging works on.
//!
//! Two steps, both as Meta's `Tokenizer.encode` does them:
//!
//! 1. [`split_like_meta`]: cut very long inputs into chunks. Meta added this
//!    to keep tiktoken from crashing, but it changes ids too, because nothing
//!    is ever merged across a cut. We cut at the same places so that our ids
//!    match Meta's on every input.
//! 2. [`PRETOKENIZER_PATTERN`]: a regex that splits each chunk into words,
//!    numbers, punctuation and whitespace. Merges never cross piece
//!    boundaries either.

// ANCHOR: pattern
/// Meta's pre-tokenizer pattern, character for character. Its alternatives,
/// tried in order at each position:
///
/// * `(?i:'s|'t|'re|'ve|'m|'ll|'d)`: English contraction endings, any case;
/// * `[^\r\n\p{L}\p{N}]?\p{L}+`: a word, with at most one leading non-letter
///   (typically the space before it);
/// * `\p{N}{1,3}`: numbers, in groups of at most three digits;
/// * ` ?[^\s\p{L}\p{N}]+[\r\n]*`: punctuation, with an optional leading
///   space and any newlines right after it;
/// * `\s*[\r\n]+`: whitespace ending in newlines;
/// * `\s+(?!\S)`: whitespace, but leaving the last space for the word after
///   it (that lookahead is why we need `fancy-regex`);
/// * `\s+`: any remaining whitespace.
pub(crate) const PRETOKENIZER_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
// ANCHOR_END: pattern

// ANCHOR: split_like_meta
/// Meta encodes at most this many characters (not bytes) at a time.
const MAX_CHUNK_CHARS: usize = 400_000;

/// Meta cuts any run of whitespace, or of non-whitespace, longer than this.
const MAX_RUN_CHARS: usize = 25_000;

/// Cuts `text` where Meta's `Tokenizer.encode` does: into chunks of
/// 400,000 characters, then each chunk wherever a run of whitespace or
/// non-whitespace characters grows past 25,000. The empty text has no chunks.
pub(crate) fn split_like_meta(text: &str) -> Vec<&str> {
    split_every_n_chars(text, MAX_CHUNK_CHARS)
        .into_iter()
        .flat_map(|chunk| split_long_runs(chunk, MAX_RUN_CHARS))
        .collect()
}
// ANCHOR_END: split_like_meta

fn split_every_n_chars(text: &str, n: usize) -> Vec<&str> {
    let mut cuts: Vec<usize> = text.char_indices().map(|(i, _)| i).step_by(n).collect();
    cuts.push(text.len());
    cuts.windows(2).map(|w| &text[w[0]..w[1]]).collect()
}

// ANCHOR: split_long_runs
/// Meta's `_split_whitespaces_or_nonwhitespaces`: walk the characters,
/// counting the length of the current run of whitespace (or of
/// non-whitespace); when a run reaches `max_run + 1` characters, cut before
/// that character and count the run from 1 again.
///
/// Note that a cut ends a chunk, not a run: the chunk reaches back to the
/// previous cut and may hold many shorter runs.
fn split_long_runs(text: &str, max_run: usize) -> Vec<&str> {
    let mut chunks = Vec::new();
    let mut chunk_start = 0;
    // The first character continues a "run" of its own kind, so it counts as 1 in the
    // `else` branch below.
    let mut run_len = 0;
    let mut run_is_space = text.chars().next().is_some_and(is_python_space);
    for (i, c) in text.char_indices() {
        if is_python_space(c) != run_is_space {
            run_is_space = !run_is_space;
            run_len = 1;
        } else {
            run_len += 1;
            if run_len > max_run {
                chunks.push(&text[chunk_start..i]);
                chunk_start = i;
                run_len = 1;
            }
        }
    }
    chunks.push(&text[chunk_start..]);
    chunks
}
// ANCHOR_END: split_long_runs

// ANCHOR: is_python_space
/// Python's `str.isspace`, which Meta's splitting uses. It is Rust's
/// Unicode whitespace plus the four ASCII separator controls U+001C..U+001F,
/// which Python counts as whitespace and Unicode does not.
fn is_python_space(c: char) -> bool {
    c.is_whitespace() || matches!(c, '\u{1c}'..='\u{1f}')
}
// ANCHOR_END: is_python_space

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_one_chunk() {
        assert_eq!(split_like_meta("hello  world\n"), ["hello  world\n"]);
        assert!(split_like_meta("").is_empty());
    }

    #[test]
    fn chunks_are_counted_in_characters_not_bytes() {
        assert_eq!(split_every_n_chars("ééééé", 2), ["éé", "éé", "é"]);
        assert_eq!(split_every_n_chars("abcd", 2), ["ab", "cd"]);
    }

    #[test]
    fn a_run_longer_than_the_limit_is_cut() {
        assert_eq!(split_long_runs("abc", 3), ["abc"]);
        assert_eq!(split_long_runs("abcd", 3), ["abc", "d"]);
        assert_eq!(split_long_runs("abcdefg", 3), ["abc", "def", "g"]);
        assert_eq!(split_long_runs("     ", 2), ["  ", "  ", " "]);
    }

    #[test]
    fn a_cut_keeps_the_shorter_runs_before_it() {
        assert_eq!(split_long_runs("ab cdef", 3), ["ab cde", "f"]);
        assert_eq!(split_long_runs("a b c d", 1), ["a b c d"]);
    }

    #[test]
    fn separator_controls_count_as_whitespace() {
        assert!(is_python_space('\u{1c}'));
        assert!(is_python_space('\u{85}'));
        assert!(!is_python_space('\u{200b}'));
        assert_eq!(split_long_runs("ab\u{1c}cd", 2), ["ab\u{1c}cd"]);
    }
}
