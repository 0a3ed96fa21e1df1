//! Chapter 9: batching.
//!
//! The library holds the chapter's code; `main.rs` is its command line. Many requests run
//! at once: each has a slot of the KV cache, the scheduler decides which requests hold the
//! slots, and every decode step runs one token of every running sequence together, so that
//! one read of the weights serves them all.

pub mod check;
pub mod checkpoint;
pub mod config;
pub mod generate;
pub mod gpu;
pub mod index;
pub mod kv_cache;
pub mod model;
pub mod ops;
pub mod requests;
pub mod rope;
pub mod scheduler;
pub mod serve;
pub mod tokenizer;
pub mod weights;
