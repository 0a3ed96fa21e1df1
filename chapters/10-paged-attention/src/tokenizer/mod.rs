//! Llama 3's tokenizer, written from scratch.
//!
//! A language model reads and writes token ids, not characters. Llama 3 has
//! 128,256 of them: 128,000 ordinary tokens, each standing for a short byte
//! string, and 256 special tokens that mark structure (start of text, end of
//! turn, headers of chat messages).
//!
//! Encoding text is byte-pair encoding (BPE), in two steps:
//!
//! 1. Pre-tokenize: a regex cuts the text into pieces — words with their
//!    leading space, numbers of up to three digits, runs of punctuation, runs
//!    of whitespace. Tokens never span two pieces.
//! 2. Merge: each piece starts as one part per UTF-8 byte (every byte value
//!    is a token, so any text can be encoded). Then, again and again, the two
//!    neighbouring parts whose concatenation is the lowest-ranked token are
//!    merged into that token. Low ranks were the most frequent pairs when the
//!    vocabulary was built, so common words end up as one token and rare
//!    strings as several. The parts left when nothing more merges are the
//!    tokens of the piece.
//!
//! Decoding is simple: look up each id's bytes and concatenate them. Since a
//! token may hold part of a multi-byte character, the bytes of a prefix of
//! the ids need not be valid UTF-8; [`StreamDecoder`] deals with that when
//! text is printed as it is generated.
//!
//! [`Tokenizer::encode_chat`] lays out a conversation in Llama 3's chat
//! format, the only place where special tokens are added.

mod bpe;
mod chat;
pub mod commands;
mod pretokenize;
mod special;
mod stream;
#[cfg(test)]
mod tests;

pub use stream::StreamDecoder;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use fancy_regex::Regex;

use bpe::MergeableRanks;
use pretokenize::{PRETOKENIZER_PATTERN, split_like_meta};
use special::{NUM_BASE_TOKENS, VOCAB_SIZE, special_token_names};

// ANCHOR: tokenizer_struct
/// Llama 3's tokenizer: 128,000 byte-pair tokens plus 256 special tokens.
pub struct Tokenizer {
    /// Bytes → id, for the ordinary tokens only, so that text can never
    /// produce a special token.
    ranks: MergeableRanks,
    /// Id → bytes, for all ids; a special token's bytes are its name.
    token_bytes: Vec<Vec<u8>>,
    pretokenizer: Regex,
}
// ANCHOR_END: tokenizer_struct

impl Tokenizer {
    // ANCHOR: from_file
    /// Loads Meta's `tokenizer.model`: 128,000 lines of `<base64 bytes> <rank>`,
    /// where the rank is the token id and equals the line index.
    ///
    /// Errors name the file and, where it applies, the line.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let file_name = path.as_ref().display().to_string();
        let contents = std::fs::read(path).map_err(|e| anyhow!("cannot read {file_name}: {e}"))?;
        let model = parse_model(&contents, &file_name)?;
        let ranks = MergeableRanks::new(model.by_bytes).map_err(|e| anyhow!("{file_name}: {e}"))?;
        let mut token_bytes = model.token_bytes;
        token_bytes.extend(special_token_names().into_iter().map(String::into_bytes));
        Ok(Self { ranks, token_bytes, pretokenizer: Regex::new(PRETOKENIZER_PATTERN)? })
    }
    // ANCHOR_END: from_file

    // ANCHOR: encode
    /// Encodes text to token ids, with no `<|begin_of_text|>` in front.
    ///
    /// Text that looks like a special token is encoded as ordinary text.
    /// Errors only if the regex engine gives up (fancy-regex has a backtracking limit);
    /// no input we have tried comes near it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        for chunk in split_like_meta(text) {
            for piece in self.pretokenizer.find_iter(chunk) {
                let piece = piece.context("pre-tokenizer regex failed")?;
                self.ranks.encode_piece(piece.as_str().as_bytes(), &mut ids);
            }
        }
        Ok(ids)
    }
    // ANCHOR_END: encode

    /// The id of the ordinary token with exactly these bytes, if there is one.
    #[cfg(test)]
    pub fn token_id(&self, bytes: &[u8]) -> Option<u32> {
        self.ranks.rank_of(bytes)
    }

    // ANCHOR: decode
    /// The bytes of one token; a special token gives its name.
    pub fn token_bytes(&self, id: u32) -> Result<&[u8]> {
        self.token_bytes
            .get(id as usize)
            .map(Vec::as_slice)
            .ok_or_else(|| anyhow!("unknown token id {id} (vocabulary size is {VOCAB_SIZE})"))
    }

    /// The concatenated bytes of the tokens. They need not be valid UTF-8:
    /// one character can be split across tokens.
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id)?);
        }
        Ok(bytes)
    }

    /// Decodes ids to text. Bytes that are not valid UTF-8 become U+FFFD, as
    /// in Meta's reference (`errors="replace"`).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        Ok(String::from_utf8_lossy(&self.decode_bytes(ids)?).into_owned())
    }
    // ANCHOR_END: decode
}

/// The ordinary tokens of `tokenizer.model`, indexed both ways.
struct ParsedModel {
    token_bytes: Vec<Vec<u8>>,
    by_bytes: HashMap<Vec<u8>, u32>,
}

// ANCHOR: parse_model
/// Parses every line, checking that line `i` (counting from 0) has rank `i`,
/// that no token appears twice and that there are exactly 128,000 lines.
/// `file_name` is only for error messages.
fn parse_model(contents: &[u8], file_name: &str) -> Result<ParsedModel> {
    let contents = contents.strip_suffix(b"\n").unwrap_or(contents);
    let mut token_bytes = Vec::with_capacity(NUM_BASE_TOKENS);
    let mut by_bytes = HashMap::with_capacity(NUM_BASE_TOKENS);
    for (expected_rank, line) in (0u32..).zip(contents.split(|&b| b == b'\n')) {
        let line_number = expected_rank + 1;
        let (bytes, rank) = parse_line(line).map_err(|e| anyhow!("{file_name} line {line_number}: {e:#}"))?;
        if rank < expected_rank {
            // Every earlier line had its own index as rank.
            bail!("{file_name} line {line_number}: rank {rank} already used on line {}", rank + 1);
        }
        if rank != expected_rank {
            bail!("{file_name} line {line_number}: rank {rank} expected {expected_rank}");
        }
        match by_bytes.entry(bytes.clone()) {
            Entry::Occupied(first) => bail!("{file_name} line {line_number}: same token as line {}", first.get() + 1),
            Entry::Vacant(slot) => slot.insert(rank),
        };
        token_bytes.push(bytes);
    }
    if token_bytes.len() != NUM_BASE_TOKENS {
        bail!("{file_name}: {} tokens, expected {NUM_BASE_TOKENS}", token_bytes.len());
    }
    Ok(ParsedModel { token_bytes, by_bytes })
}
// ANCHOR_END: parse_model

// ANCHOR: parse_line
/// Parses `<base64 bytes> <rank>`.
fn parse_line(line: &[u8]) -> Result<(Vec<u8>, u32)> {
    let line = std::str::from_utf8(line).context("not UTF-8")?;
    let (token, rank) =
        line.split_once(' ').ok_or_else(|| anyhow!("expected `<base64 token> <rank>`, found {line:?}"))?;
    let bytes = BASE64.decode(token).with_context(|| format!("bad base64 token {token:?}"))?;
    let rank = rank.parse().with_context(|| format!("bad rank {rank:?}"))?;
    Ok((bytes, rank))
}
// ANCHOR_END: parse_line
