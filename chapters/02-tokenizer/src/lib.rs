//! Chapter 2: from text to token ids and back.
//!
//! The library holds the chapter's code; `main.rs` is its command line. Chapter 1's
//! loading, and Llama 3's tokenizer written from scratch.

pub mod check;
pub mod checkpoint;
pub mod config;
pub mod gpu;
pub mod index;
pub mod tokenizer;
pub mod weights;
