//! Chapter 4: RMSNorm, the first kernel that works on a whole row at once.
//!
//! The library holds the chapter's code; `main.rs` is its command line. Chapter 3's
//! embedding, then layer 0's `input_layernorm` with a block-wide reduction.

pub mod check;
pub mod checkpoint;
pub mod config;
pub mod gpu;
pub mod index;
pub mod model;
pub mod ops;
pub mod show;
pub mod tokenizer;
pub mod weights;
