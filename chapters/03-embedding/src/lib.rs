//! Chapter 3: the GPU computes something.
//!
//! The library holds the chapter's code; `main.rs` is its command line. Chapters 1 and 2's
//! loading and tokenizer, our CUDA kernels compiled by NVRTC, and the first of them: the
//! embedding lookup, run by the [`model::Model`] that owns the weights and the buffers.

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
