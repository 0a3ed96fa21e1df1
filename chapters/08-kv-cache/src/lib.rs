//! Chapter 8: the KV cache.
//!
//! The library holds the chapter's code; `main.rs` is its command line. Each position's
//! keys and values are computed once and kept: the prompt runs once (the prefill), then
//! every new token runs alone (a decode step), attending to the cached ones.

pub mod check;
pub mod checkpoint;
pub mod config;
pub mod generate;
pub mod gpu;
pub mod index;
pub mod kv_cache;
pub mod model;
pub mod ops;
pub mod rope;
pub mod tokenizer;
pub mod weights;
