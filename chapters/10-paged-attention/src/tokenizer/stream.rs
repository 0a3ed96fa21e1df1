//! Decoding ids one at a time, as a model generates them.

use anyhow::Result;

use super::Tokenizer;

// ANCHOR: stream_decoder
/// Turns a stream of token ids into text pieces that are safe to print.
///
/// A character such as "😀" (4 UTF-8 bytes) may be split over several
/// tokens. Decoding each token on its own would print U+FFFD garbage for the
/// halves, so the decoder holds back an incomplete character until its last
/// byte arrives.
///
/// The pieces returned by [`push`](Self::push), followed by what
/// [`finish`](Self::finish) returns, always add up to
/// [`Tokenizer::decode`] of all the ids.
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    /// Bytes received but not yet returned: the start of a character.
    pending: Vec<u8>,
}
// ANCHOR_END: stream_decoder

impl<'t> StreamDecoder<'t> {
    pub fn new(tokenizer: &'t Tokenizer) -> Self {
        Self { tokenizer, pending: Vec::new() }
    }

    // ANCHOR: stream_push
    /// Adds one token and returns the text that is now complete, which may
    /// be empty. Bytes that can never become valid UTF-8 are returned as
    /// U+FFFD right away, as [`Tokenizer::decode`] would.
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.pending.extend_from_slice(self.tokenizer.token_bytes(id)?);
        let complete = self.pending.len() - unfinished_char_len(&self.pending);
        let text = String::from_utf8_lossy(&self.pending[..complete]).into_owned();
        self.pending.drain(..complete);
        Ok(text)
    }
    // ANCHOR_END: stream_push

    // ANCHOR: stream_finish
    /// Ends the stream, returning U+FFFD if it stopped in the middle of a
    /// character and an empty string otherwise.
    pub fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }
    // ANCHOR_END: stream_finish
}

// ANCHOR: unfinished_char_len
/// The number of bytes at the end of `bytes` that begin a character but do
/// not finish it yet; 0 if `bytes` ends on a character boundary or with
/// bytes that are invalid whatever follows.
fn unfinished_char_len(bytes: &[u8]) -> usize {
    let mut rest = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(_) => return 0,
            Err(error) => match error.error_len() {
                // The input ended in the middle of a character.
                None => return rest.len() - error.valid_up_to(),
                // Invalid bytes: skip them and look further.
                Some(invalid_len) => rest = &rest[error.valid_up_to() + invalid_len..],
            },
        }
    }
}
// ANCHOR_END: unfinished_char_len

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unfinished_characters_are_measured_at_the_end_only() {
        let smile = "😀".as_bytes();
        assert_eq!(unfinished_char_len(b"abc"), 0);
        assert_eq!(unfinished_char_len(&smile[..1]), 1);
        assert_eq!(unfinished_char_len(&smile[..3]), 3);
        assert_eq!(unfinished_char_len(&[b"a", &smile[..2]].concat()), 2);
        // A lone continuation byte can never be completed.
        assert_eq!(unfinished_char_len(&smile[1..]), 0);
        // Invalid bytes earlier do not hide an unfinished character later.
        assert_eq!(unfinished_char_len(&[&[0xff][..], &smile[..2]].concat()), 2);
    }
}
