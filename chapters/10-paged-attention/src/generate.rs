//! The rules of greedy generation that every request follows: how long a sequence may
//! grow (the context), how many tokens it may receive, and why it stops. Chapter 8 ran one
//! request with them; here `serve.rs` runs many at once, each stopping on its own.

use anyhow::{Result, ensure};

use crate::config::{Config, MAX_CONTEXT};
use crate::ops;

// ANCHOR: context
/// The most tokens one sequence may have processed: `--max-context` when given, else our
/// [`MAX_CONTEXT`] or less when the model's `max_position_embeddings` or the prefill
/// attention kernel's shared memory says so. A `--max-context` beyond those is refused.
///
/// The token predicted from a full context is still returned, without being processed,
/// so a prompt of P tokens can receive up to `context - P + 1` new tokens.
pub fn context_limit(config: &Config, requested: Option<usize>) -> Result<usize> {
    let Some(context) = requested else {
        return Ok(MAX_CONTEXT.min(config.max_position_embeddings).min(ops::ATTENTION_MAX_KEYS));
    };
    ensure!(context > 0, "--max-context 0 leaves no room for a prompt");
    ensure!(
        context <= config.max_position_embeddings,
        "--max-context {context} is beyond the model's max_position_embeddings ({})",
        config.max_position_embeddings
    );
    ensure!(
        context <= ops::ATTENTION_MAX_KEYS,
        "--max-context {context} is beyond the {} positions the prefill attention kernel scores in one block",
        ops::ATTENTION_MAX_KEYS
    );
    Ok(context)
}
// ANCHOR_END: context

/// The most new tokens a prompt of `prompt_tokens` can receive: the context fills after
/// `context - prompt_tokens` of them, and the one predicted from the full context is kept.
pub fn room_after(prompt_tokens: usize, context: usize) -> usize {
    context.saturating_sub(prompt_tokens) + 1
}

/// `MAX_NEW_TOKENS` from the command line: a whole number, 0 or more (without this, clap
/// would take `-5` for an unknown flag and suggest `-- -5`).
pub fn parse_max_new_tokens(text: &str) -> Result<usize, String> {
    match text.parse::<i64>() {
        Ok(n) if n < 0 => Err("a number of tokens cannot be negative".to_string()),
        Ok(n) => usize::try_from(n).map_err(|e| e.to_string()),
        Err(_) => Err("give how many tokens to generate, a whole number".to_string()),
    }
}

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
/// `generated` tokens have been produced; `None` to go on. `end_tokens` are `config.json`'s
/// `eos_token_id`.
pub fn stop_reason(
    last: u32,
    end_tokens: &[u32],
    generated: usize,
    max_new_tokens: usize,
    processed: usize,
    context: usize,
) -> Option<Stop> {
    if end_tokens.contains(&last) {
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

#[cfg(test)]
mod tests {
    use super::*;

    const WORD: u32 = 1000;

    #[test]
    fn max_new_tokens_is_a_whole_number_of_zero_or_more() {
        assert_eq!(parse_max_new_tokens("0"), Ok(0));
        assert_eq!(parse_max_new_tokens("32"), Ok(32));
        assert!(parse_max_new_tokens("-5").unwrap_err().contains("cannot be negative"));
        assert!(parse_max_new_tokens("ten").unwrap_err().contains("a whole number"));
    }

    #[test]
    fn room_after_the_prompt_matches_the_stop_rule() {
        for (prompt, context) in [(1, 1), (3, 10), (10, 10), (7, 4096)] {
            assert_eq!(tokens_received(prompt, usize::MAX, context), room_after(prompt, context));
        }
    }
    const END_TOKENS: [u32; 3] = crate::config::LLAMA3_EOS_TOKEN_IDS;

    /// How many tokens a prompt of `prompt` tokens receives, by the stop rule alone.
    fn tokens_received(prompt: usize, max_new_tokens: usize, context: usize) -> usize {
        // The n-th new token is predicted from the prompt and the n - 1 tokens before it.
        (1..).find(|&n| stop_reason(WORD, &END_TOKENS, n, max_new_tokens, prompt + n - 1, context).is_some()).unwrap()
    }

    #[test]
    fn a_full_context_still_returns_one_token() {
        assert_eq!(tokens_received(2048, 100, 2048), 1);
        assert_eq!(tokens_received(2047, 100, 2048), 2);
        assert_eq!(tokens_received(10, 5000, 2048), 2048 - 10 + 1);
        assert_eq!(stop_reason(WORD, &END_TOKENS, 1, 100, 2048, 2048), Some(Stop::Context));
    }

    #[test]
    fn stop_tokens_come_first_then_the_budget() {
        assert_eq!(stop_reason(128_009, &END_TOKENS, 3, 3, 2048, 2048), Some(Stop::EndToken(128_009)));
        assert_eq!(stop_reason(WORD, &END_TOKENS, 3, 3, 2048, 2048), Some(Stop::Budget));
        assert_eq!(tokens_received(10, 5, 2048), 5);
        assert_eq!(stop_reason(WORD, &END_TOKENS, 2, 3, 100, 2048), None);
    }
}
