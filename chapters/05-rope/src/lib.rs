//! Chapter 5: queries, keys and values, and where each token stands.
//!
//! The library holds the chapter's code; `main.rs` is its command line. Chapter 4's steps,
//! then the q, k, v projections as cuBLAS matrix products and rotary position embeddings
//! (RoPE) with Llama 3's frequency scaling.

pub mod check;
pub mod checkpoint;
pub mod config;
pub mod gpu;
pub mod index;
pub mod model;
pub mod ops;
pub mod rope;
pub mod show;
pub mod tokenizer;
pub mod weights;
