//! The 256 special tokens that follow the 128,000 ordinary tokens.
//!
//! Special tokens never come out of [`Tokenizer::encode`](super::Tokenizer::encode):
//! text that merely looks like one, such as `"<|eot_id|>"`, is encoded as
//! ordinary characters. They enter a sequence only by id, through the chat
//! builder, and decode to their names.
//!
//! Names and order follow Meta's `llama_models/llama3/tokenizer.py`
//! (llama-models 0.3.0): twelve named tokens, then reserved ones numbered
//! from 2 upwards until the id space is full.

// ANCHOR: special_ids
/// Number of ordinary (byte-pair) tokens in `tokenizer.model`.
pub const NUM_BASE_TOKENS: usize = 128_000;
/// Number of special tokens after the ordinary ones.
pub const NUM_SPECIAL_TOKENS: usize = 256;
/// Total number of token ids: the model's embedding table has this many rows.
pub const VOCAB_SIZE: usize = NUM_BASE_TOKENS + NUM_SPECIAL_TOKENS;

pub const BEGIN_OF_TEXT: u32 = 128_000;
pub const START_HEADER_ID: u32 = 128_006;
pub const END_HEADER_ID: u32 = 128_007;
/// End of turn: the speaker is done. (The tokens that end generation, this one among them,
/// come from `config.json`'s `eos_token_id`.)
pub const EOT_ID: u32 = 128_009;
// ANCHOR_END: special_ids

// ANCHOR: special_names
/// The special tokens that have names of their own, starting at id 128,000.
const NAMED_SPECIAL_TOKENS: [&str; 12] = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
];

/// The names of all special tokens, in id order (the first is id 128,000).
pub fn special_token_names() -> Vec<String> {
    let num_reserved = NUM_SPECIAL_TOKENS - NAMED_SPECIAL_TOKENS.len();
    // Reserved numbering continues after reserved_special_token_1 above.
    let reserved = (0..num_reserved).map(|i| format!("<|reserved_special_token_{}|>", i + 2));
    NAMED_SPECIAL_TOKENS.iter().map(|name| name.to_string()).chain(reserved).collect()
}
// ANCHOR_END: special_names

#[cfg(test)]
mod tests {
    use super::*;

    fn name_of(id: u32) -> String {
        special_token_names()[id as usize - NUM_BASE_TOKENS].clone()
    }

    #[test]
    fn there_is_one_name_per_special_token() {
        assert_eq!(special_token_names().len(), NUM_SPECIAL_TOKENS);
        assert_eq!(VOCAB_SIZE, 128_256);
    }

    #[test]
    fn named_constants_point_at_their_names() {
        assert_eq!(name_of(BEGIN_OF_TEXT), "<|begin_of_text|>");
        assert_eq!(name_of(128_001), "<|end_of_text|>");
        assert_eq!(name_of(128_004), "<|finetune_right_pad_id|>");
        assert_eq!(name_of(128_005), "<|step_id|>");
        assert_eq!(name_of(START_HEADER_ID), "<|start_header_id|>");
        assert_eq!(name_of(END_HEADER_ID), "<|end_header_id|>");
        assert_eq!(name_of(128_008), "<|eom_id|>");
        assert_eq!(name_of(EOT_ID), "<|eot_id|>");
        assert_eq!(name_of(128_010), "<|python_tag|>");
        assert_eq!(name_of(128_011), "<|image|>");
    }

    #[test]
    fn reserved_tokens_fill_the_rest_in_order() {
        assert_eq!(name_of(128_002), "<|reserved_special_token_0|>");
        assert_eq!(name_of(128_012), "<|reserved_special_token_2|>");
        assert_eq!(name_of(128_255), "<|reserved_special_token_245|>");
    }
}
