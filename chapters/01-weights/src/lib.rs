//! Chapter 1: from a file of numbers to weights on the GPU.
//!
//! The library holds the chapter's code; `main.rs` is its command line. Reads
//! `config.json`, maps and validates `model.safetensors` (or its shards), and copies every
//! tensor to GPU memory.

pub mod check;
pub mod checkpoint;
pub mod config;
pub mod gpu;
pub mod index;
pub mod weights;
