//! `llama-reference`: the CPU reference for every chapter of *Inference from Scratch, in Rust*.
//!
//! A plain, readable f32 implementation of the Llama 3 family forward pass (embedding,
//! RMSNorm, RoPE with Llama 3 frequency scaling, causal grouped-query attention, SwiGLU
//! MLP, residuals, final norm, LM head, greedy decoding). Every step is a public function,
//! so a chapter's `--check` can compare its GPU output with exactly the step it teaches.
//! The reference itself is checked against Hugging Face transformers (`tests/golden.rs`).
//!
//! It also writes synthetic checkpoints ([`synth`]) with the real file layout.

pub mod checkpoint;
pub mod config;
pub mod model;
pub mod rope;
pub mod synth;
pub mod tensor;

pub use checkpoint::Checkpoint;
pub use config::LlamaConfig;
pub use model::{KvCache, Layer, LayerCache, Model};
pub use tensor::Matrix;
