//! Chapter 10: paged attention, the full engine.
//!
//! The library holds the chapter's code; `main.rs` is its command line. Many requests run
//! at once, as in chapter 9, but the KV cache is one pool of pages that every sequence
//! shares: a sequence holds only the pages its positions fill, found through its block
//! table, and the scheduler admits requests by the pages they may need.

pub mod check;
pub mod checkpoint;
pub mod config;
pub mod generate;
pub mod gpu;
pub mod index;
pub mod kv_cache;
pub mod model;
pub mod ops;
pub mod page_pool;
pub mod requests;
pub mod rope;
pub mod scheduler;
pub mod serve;
pub mod tokenizer;
pub mod weights;
