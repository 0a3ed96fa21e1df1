//! Llama 3's chat format, as Meta's `ChatFormat.encode_dialog_prompt` lays it
//! out:
//!
//! ```text
//! <|begin_of_text|>
//! <|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>
//! <|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>
//! <|start_header_id|>assistant<|end_header_id|>\n\n
//! ```
//!
//! (shown on several lines; there are no newlines between messages). The
//! final, open assistant header is where the model takes over.
//!
//! Two details matter for getting Meta's ids exactly:
//!
//! * The role, the `"\n\n"` after the header and the content are encoded
//!   separately, so no token spans two of them. Encoding the whole string
//!   at once would, for content starting with a newline, merge it into the
//!   `"\n\n"`.
//! * The content is encoded as given: Meta does not strip whitespace.

use anyhow::Result;

use super::Tokenizer;
use super::special::{BEGIN_OF_TEXT, END_HEADER_ID, EOT_ID, START_HEADER_ID};

/// Who is speaking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    /// The text between the header tokens.
    pub fn header_text(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self { role, content: content.into() }
    }
}

impl Tokenizer {
    // ANCHOR: encode_chat
    /// Encodes a conversation, ending with an open assistant header for the
    /// model to complete.
    pub fn encode_chat(&self, messages: &[Message]) -> Result<Vec<u32>> {
        let mut ids = vec![BEGIN_OF_TEXT];
        for message in messages {
            self.push_header(message.role, &mut ids)?;
            ids.extend(self.encode(&message.content)?);
            ids.push(EOT_ID);
        }
        self.push_header(Role::Assistant, &mut ids)?;
        Ok(ids)
    }
    // ANCHOR_END: encode_chat

    // ANCHOR: encode_prompt
    /// Encodes a single user prompt, after a system prompt if one is given.
    pub fn encode_prompt(&self, system: Option<&str>, user: &str) -> Result<Vec<u32>> {
        let system = system.map(|text| Message::new(Role::System, text));
        let user = Message::new(Role::User, user);
        let messages: Vec<Message> = system.into_iter().chain([user]).collect();
        self.encode_chat(&messages)
    }
    // ANCHOR_END: encode_prompt

    // ANCHOR: push_header
    /// `<|start_header_id|>{role}<|end_header_id|>\n\n`
    fn push_header(&self, role: Role, ids: &mut Vec<u32>) -> Result<()> {
        ids.push(START_HEADER_ID);
        ids.extend(self.encode(role.header_text())?);
        ids.push(END_HEADER_ID);
        ids.extend(self.encode("\n\n")?);
        Ok(())
    }
    // ANCHOR_END: push_header
}
