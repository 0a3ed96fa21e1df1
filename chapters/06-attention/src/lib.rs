//! Chapter 6: attention.
//!
//! The library holds the chapter's code; `main.rs` is its command line. Chapter 5's steps,
//! then causal grouped-query attention over the prompt, the output projection and the
//! residual connection: layer 0's whole attention sublayer.

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
