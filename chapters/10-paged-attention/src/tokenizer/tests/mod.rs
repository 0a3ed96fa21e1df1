//! The tokenizer against Meta's reference: golden ids from `llama_models` (see
//! `shared/fixtures/tokenizer/make_tokenizer_golden.py`), round trips, streaming, errors.

// The golden corpus and the property tests are the tokenizer's full proof; they run in
// chapter 2's package, whose `tokenizer-suite` feature is on by default. Later chapters carry
// the same files but run only the quick tests below (`--features tokenizer-suite` runs all).
mod decode;
#[cfg(feature = "tokenizer-suite")]
mod golden;
mod load_errors;
#[cfg(feature = "tokenizer-suite")]
mod roundtrip;
mod stream;

use std::path::PathBuf;
use std::sync::OnceLock;

use super::Tokenizer;

/// `$LLAMA_TOKENIZER`, or else `models/tokenizer.model`, where `cargo x fetch-tokenizer` puts it.
pub fn tokenizer_path() -> PathBuf {
    match std::env::var_os("LLAMA_TOKENIZER") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tokenizer.model"),
    }
}

#[cfg(feature = "tokenizer-suite")]
/// Where the golden fixtures live (shared by every chapter from this one on).
pub fn fixture_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/tokenizer").join(name)
}

/// The real tokenizer, loaded once. Panics (failing the test) if the file is
/// missing: these tests must never pass by skipping.
pub fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let path = tokenizer_path();
        Tokenizer::from_file(&path).unwrap_or_else(|error| {
            panic!(
                "{error:#}\nThese tests need Meta's Llama 3 tokenizer.model: run `cargo x fetch-tokenizer` \
                 (or set LLAMA_TOKENIZER to its path)."
            )
        })
    })
}
