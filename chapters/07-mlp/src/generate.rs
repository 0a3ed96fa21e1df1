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

// ANCHOR: context
/// The most tokens one sequence may have processed: our [`MAX_CONTEXT`], or less when the
/// model's `max_position_embeddings` or the attention kernel's shared memory says so.
///
/// The token predicted from a full context is still returned, without being processed,
/// so a prompt of P tokens can receive up to `context - P + 1` new tokens.
pub fn context_limit(config: &Config) -> usize {
    MAX_CONTEXT.min(config.max_position_embeddings).min(ops::ATTENTION_MAX_KEYS)
}
// ANCHOR_END: context

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The model produced an end token (end of text, end of message, end of turn).
    EndToken(u32),
    /// The requested number of new tokens was reached.
    Budget,
    /// The sequence filled the context: the last token was predicted from a full one.
    Context,
}

// ANCHOR: stop_reason
/// Why generation stops after a new token `last`, predicted from `processed` tokens, when
/// `generated` tokens have been produced; `None` to go on.
pub fn stop_reason(
    last: u32,
    generated: usize,
    max_new_tokens: usize,
    processed: usize,
    context: usize,
) -> Option<Stop> {
    if STOP_TOKENS.contains(&last) {
        Some(Stop::EndToken(last))
    } else if generated == max_new_tokens {
        Some(Stop::Budget)
    } else if processed == context {
        Some(Stop::Context)
    } else {
        None
    }
}
// ANCHOR_END: stop_reason

/// The outcome of one generation.
pub struct Generation {
    /// The generated ids, including the stop token when one ended generation.
    pub tokens: Vec<u32>,
    pub stop: Stop,
    pub seconds: f64,
    /// The fp32 logits each token was chosen from, when asked for (for `--check`).
    pub step_logits: Vec<Vec<f32>>,
}

// ANCHOR: generate
/// Generates up to `max_new_tokens` after `prompt`, calling `emit` with each new token
/// (stop tokens are not emitted). With `keep_logits`, also returns the logits of each step.
#[allow(clippy::too_many_arguments)]
pub fn generate(
    gpu: &Gpu,
    weights: &Weights,
    config: &Config,
    inv_freq: &CudaSlice<f32>,
    prompt: &[u32],
    max_new_tokens: usize,
    keep_logits: bool,
    mut emit: impl FnMut(u32) -> Result<()>,
) -> Result<Generation> {
    let start = Instant::now();
    let context = context_limit(config);
    ensure!(prompt.len() <= context, "the prompt is {} tokens; the context holds {context}", prompt.len());
    let mut sequence = prompt.to_vec();
    let mut tokens = Vec::new();
    let mut step_logits = Vec::new();
    if max_new_tokens == 0 {
        return Ok(Generation { tokens, stop: Stop::Budget, seconds: 0.0, step_logits });
    }
    let stop = loop {
        let logits = model::forward(gpu, weights, config, inv_freq, &sequence)?;
        if keep_logits {
            step_logits.push(gpu.stream.clone_dtoh(&logits)?);
        }
        let next = ops::argmax(gpu, &logits, config.vocab_size)?;
        let next = gpu.stream.clone_dtoh(&next)?[0]; // waits for the GPU
        ensure!((next as usize) < config.vocab_size, "the logits contain NaN: the forward pass went wrong");
        tokens.push(next);
        let stop = stop_reason(next, tokens.len(), max_new_tokens, sequence.len(), context);
        if !matches!(stop, Some(Stop::EndToken(_))) {
            emit(next)?;
        }
        if let Some(stop) = stop {
            break stop;
        }
        sequence.push(next);
    };
    Ok(Generation { tokens, stop, seconds: start.elapsed().as_secs_f64(), step_logits })
}
// ANCHOR_END: generate

#[cfg(test)]
mod tests {
    use super::*;

    const WORD: u32 = 1000;

    /// How many tokens a prompt of `prompt` tokens receives, by the stop rule alone.
    fn tokens_received(prompt: usize, max_new_tokens: usize, context: usize) -> usize {
        // The n-th new token is predicted from the prompt and the n - 1 tokens before it.
        (1..).find(|&n| stop_reason(WORD, n, max_new_tokens, prompt + n - 1, context).is_some()).unwrap()
    }

    #[test]
    fn a_full_context_still_returns_one_token() {
        assert_eq!(tokens_received(2048, 100, 2048), 1);
        assert_eq!(tokens_received(2047, 100, 2048), 2);
        assert_eq!(tokens_received(10, 5000, 2048), 2048 - 10 + 1);
        assert_eq!(stop_reason(WORD, 1, 100, 2048, 2048), Some(Stop::Context));
    }

    #[test]
    fn stop_tokens_come_first_then_the_budget() {
        assert_eq!(stop_reason(128_009, 3, 3, 2048, 2048), Some(Stop::EndToken(128_009)));
        assert_eq!(stop_reason(WORD, 3, 3, 2048, 2048), Some(Stop::Budget));
        assert_eq!(tokens_received(10, 5, 2048), 5);
        assert_eq!(stop_reason(WORD, 2, 3, 100, 2048), None);
    }
}
