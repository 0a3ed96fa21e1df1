//! Greedy generation, the simple way: to choose each new token, run the whole sequence
//! (prompt and every token so far) through the model again and take the most likely next
//! token. Token n costs a forward pass over n positions, so the total work grows with the
//! square of the length. Chapter 8 removes that waste.

use std::time::Instant;

use anyhow::{Result, ensure};
use cudarc::driver::CudaSlice;

use crate::config::Config;
use crate::gpu::Gpu;
use crate::tokenizer::STOP_TOKENS;
use crate::weights::Weights;
use crate::{MAX_CONTEXT, model, ops};

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The model produced an end token (end of text, end of message, end of turn).
    EndToken(u32),
    /// The requested number of new tokens was reached.
    Budget,
    /// The sequence filled the context.
    Context,
}

/// The outcome of one generation.
pub struct Generation {
    /// The generated ids, including the stop token when one ended generation.
    pub tokens: Vec<u32>,
    pub stop: Stop,
    pub seconds: f64,
}

// ANCHOR: generate
/// Generates up to `max_new_tokens` after `prompt`, calling `emit` with each new token
/// (stop tokens are not emitted).
pub fn generate(
    gpu: &Gpu,
    weights: &Weights,
    config: &Config,
    inv_freq: &CudaSlice<f32>,
    prompt: &[u32],
    max_new_tokens: usize,
    mut emit: impl FnMut(u32) -> Result<()>,
) -> Result<Generation> {
    let start = Instant::now();
    let mut sequence = prompt.to_vec();
    let mut tokens = Vec::new();
    let stop = loop {
        if tokens.len() == max_new_tokens {
            break Stop::Budget;
        }
        if sequence.len() == MAX_CONTEXT {
            break Stop::Context;
        }
        let logits = model::forward(gpu, weights, config, inv_freq, &sequence)?;
        let next = ops::argmax(gpu, &logits, config.vocab_size)?;
        let next = gpu.stream.clone_dtoh(&next)?[0]; // waits for the GPU
        ensure!((next as usize) < config.vocab_size, "the logits contain NaN: the forward pass went wrong");
        tokens.push(next);
        if STOP_TOKENS.contains(&next) {
            break Stop::EndToken(next);
        }
        emit(next)?;
        sequence.push(next);
    };
    Ok(Generation { tokens, stop, seconds: start.elapsed().as_secs_f64() })
}
// ANCHOR_END: generate
